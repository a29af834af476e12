#!/usr/bin/env bash
# The CTest mpi_sharded_search: runs qkv_sharded_search under mpirun at 1, 2
# and 4 ranks, every mask and both combine modes, each configuration twice
# with --check, and asserts that
#   - every run passes its check (merged result = one call over all docs),
#   - the two runs of a configuration print the same result-hash (bitwise
#     repeatable: a fixed rank count gives a fixed reduction tree),
#   - at 1 and 2 ranks reduce and gather give the same bits (a single merge,
#     and the merge is bitwise commutative),
#   - 2 worker threads per rank give the bits of 1 (qkv is deterministic for
#     any pool),
#   - a rank count above the document count works (empty shards).
# Usage: capi/examples/run_mpi_test.sh QKV_SHARDED_SEARCH [MPIRUN]
#
# mpirun flags, and why:
#   --oversubscribe   4 ranks on a 2-core machine: without it Open MPI refuses
#                     to start more ranks than slots (cores).
#   --allow-run-as-root  only when running as root (CI containers): Open MPI
#                     refuses root otherwise.
#   --mca pml ob1 --mca btl 'self,vader'   the ranks share one machine: talk
#                     through shared memory only, so no network transport
#                     (tcp, openib, ofi, UCX) probes the container's
#                     interfaces or devices and warns about them.
#   --mca btl_vader_single_copy_mechanism none   vader's default single-copy
#                     path (CMA, process_vm_readv) needs ptrace permission
#                     between the ranks, which containers often deny (the job
#                     then fails with "Read -1, expected ..."); the copy-in,
#                     copy-out path costs nothing at these message sizes.
# These are Open MPI's; with another mpirun none is added. QKV_MPIRUN_FLAGS
# (split on spaces) adds flags, e.g. "--mca btl self,tcp".
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 QKV_SHARDED_SEARCH [MPIRUN]" >&2
  exit 2
fi
exe=$1
mpirun=${2:-mpirun}
flags=()
version=$("$mpirun" --version 2>&1 || true)
if grep -Eqi 'Open ?MPI|OpenRTE|open-mpi' <<<"$version"; then
  flags=(--oversubscribe --mca pml ob1 --mca btl 'self,vader'
         --mca btl_vader_single_copy_mechanism none)
  if [ "$(id -u)" = 0 ]; then
    flags+=(--allow-run-as-root)
  fi
fi  # other MPIs (MPICH's hydra) oversubscribe and run as root without flags
# shellcheck disable=SC2206  # split on purpose
flags+=(${QKV_MPIRUN_FLAGS:-})

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
runs=0
start=$SECONDS

# run NP ARGS...: one checked run; sets $hash. A failure shows the output.
run() {
  local np=$1
  shift
  local cmd=("$mpirun" "${flags[@]}" -np "$np" "$exe" --check --reps 2 "$@")
  runs=$((runs + 1))
  if ! "${cmd[@]}" >"$tmp/out" 2>"$tmp/err"; then
    cat "$tmp/out" "$tmp/err" >&2
    echo "FAILED (exit status): ${cmd[*]}" >&2
    exit 1
  fi
  if ! grep -q '^check ok' "$tmp/out"; then
    cat "$tmp/out" "$tmp/err" >&2
    echo "FAILED (no 'check ok'): ${cmd[*]}" >&2
    exit 1
  fi
  hash=$(sed -n 's/^result-hash: //p' "$tmp/out")
  if [ -z "$hash" ]; then
    cat "$tmp/out" "$tmp/err" >&2
    echo "FAILED (no result-hash): ${cmd[*]}" >&2
    exit 1
  fi
  if [ -s "$tmp/err" ]; then  # not a failure, but the flags should keep it quiet
    echo "note: stderr of ${cmd[*]}:"
    sed 's/^/  | /' "$tmp/err"
  fi
}

# twice NP ARGS...: two runs, the same bits; sets $hash.
twice() {
  local first
  run "$@"
  first=$hash
  run "$@"
  if [ "$hash" != "$first" ]; then
    echo "FAILED: not repeatable: np $1 ${*:2}: $first then $hash" >&2
    exit 1
  fi
}

for np in 1 2 4; do
  for mask in none valid bias both; do
    twice "$np" --mask "$mask" --combine reduce
    reduce=$hash
    twice "$np" --mask "$mask" --combine gather
    gather=$hash
    relation="gather $([ "$reduce" = "$gather" ] && echo same || echo other) bits"
    if [ "$np" -le 2 ] && [ "$reduce" != "$gather" ]; then
      echo "FAILED: np $np mask $mask: reduce $reduce, gather $gather differ" >&2
      exit 1
    fi
    printf 'np %d  mask %-5s  result-hash %s  (%s)\n' "$np" "$mask" "$reduce" "$relation"
  done
done

# A pool of 2 workers per rank: the bits of 1 worker.
twice 2 --mask both --threads 1
one=$hash
twice 2 --mask both --threads 2
if [ "$hash" != "$one" ]; then
  echo "FAILED: --threads 2 gave $hash, --threads 1 $one" >&2
  exit 1
fi
echo "np 2  threads 2  result-hash $hash  (same as 1 thread)"

# More ranks than documents: 3 documents on 4 ranks, the last shard empty
# (it contributes out 0, lse -inf without calling qkv).
for combine in reduce gather; do
  twice 4 --docs 3 --queries 6 --mask both --combine "$combine"
  echo "np 4  docs 3  combine $combine  result-hash $hash"
done

echo "ok: $runs runs under $mpirun ${flags[*]} in $((SECONDS - start)) s"
