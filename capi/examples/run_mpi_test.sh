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
# mpirun flags: Open MPI's for one machine (capi/examples/mpi_flags.sh says
# which and why), plus --oversubscribe: 4 ranks on a 2-core machine, which
# Open MPI refuses without it. QKV_MPIRUN_FLAGS (split on spaces) adds
# flags, e.g. "--mca btl self,tcp".
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 QKV_SHARDED_SEARCH [MPIRUN]" >&2
  exit 2
fi
exe=$1
mpirun=${2:-mpirun}
# shellcheck source=capi/examples/mpi_flags.sh
source "$(dirname "$0")/mpi_flags.sh"
qkv_mpi_flags "$mpirun"
flags=("${QKV_MPI_FLAGS[@]}")
if [ "$QKV_OPENMPI" = 1 ]; then
  flags+=(--oversubscribe)
fi  # other MPIs (MPICH's hydra) oversubscribe without flags
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
