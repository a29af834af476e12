#!/usr/bin/env bash
# Weak and strong scaling of the sharded search (capi/examples/sharded_search.c)
# over 1, 2 and 4 MPI ranks, written as a markdown section.
#
#   bench/mpi_scaling.sh BUILD_DIR OUT_MD
#
# Needs BUILD_DIR/capi/examples/qkv_sharded_search (built when CMake finds MPI:
# apt-get install openmpi-bin libopenmpi-dev) and mpirun; without either,
# OUT_MD gets one line saying why and the script exits 0. bench/run.sh calls
# it and appends OUT_MD to report.md. About 15 s on a 2-core machine.
#
# Every run: 64 queries, head_dim = value_dim = 64, one thread per rank, no
# mask, MPI_Reduce with the merge as a non-commutative user op; 20 timed
# repetitions after a warm-up, medians. Weak scaling keeps 65536 documents
# per rank (the total grows with the ranks), strong scaling keeps 131072 in
# total. One more row: 1 rank with a pool of 2 threads, the same work as
# 2 ranks with 1 each. The columns:
#   ms/batch   rank 0's time from a barrier to the merged result
#   local      the slowest rank's qkv_attention_f32 call
#   merge fn   the most time any rank spent inside the MPI_Op (the merges)
#   rest       the remainder: packing, messages, waiting for the slowest rank
#   efficiency weak: t(1 rank) / t(p); strong: t(1 rank) / (p * t(p))
set -uo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 BUILD_DIR OUT_MD" >&2
  exit 2
fi
build=$1
md=$2
exe=$build/capi/examples/qkv_sharded_search
REPS=${QKV_MPI_REPS:-20}
PER_RANK=65536
TOTAL=131072
COMMON=(--queries 64 --dim 64 --value-dim 64 --reps "$REPS")

skip() {  # skip REASON: one line in OUT_MD instead of the table
  printf '## Sharded attention (MPI)\n\nSkipped: %s.\n' "$1" >"$md"
  echo "mpi_scaling: skipped: $1"
  exit 0
}
[ -x "$exe" ] || skip "$exe was not built (CMake did not find MPI; apt-get install openmpi-bin libopenmpi-dev)"
mpirun=$(command -v mpirun || true)
[ -n "$mpirun" ] || skip "mpirun not found (apt-get install openmpi-bin)"

# Open MPI's flags for one machine (capi/examples/mpi_flags.sh); other MPIs
# get none of them, nor the binding flags below.
# shellcheck source=capi/examples/mpi_flags.sh
source "$(dirname "$0")/../capi/examples/mpi_flags.sh"
qkv_mpi_flags "$mpirun"
openmpi=$QKV_OPENMPI
base=("${QKV_MPI_FLAGS[@]}")
version=$("$mpirun" --version 2>&1 || true)
cores=$(nproc 2>/dev/null || echo 1)
model=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1)
per_socket=$(lscpu 2>/dev/null | sed -n 's/^Core(s) per socket: *//p' | head -n 1)
sockets=$(lscpu 2>/dev/null | sed -n 's/^Socket(s): *//p' | head -n 1)
tpc=$(lscpu 2>/dev/null | sed -n 's/^Thread(s) per core: *//p' | head -n 1)

# Ranks need idle cores: note a busy machine (as run.sh does).
load=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)
busy=""
if awk -v l="$load" 'BEGIN { exit !(l > 0.5) }'; then
  busy="- warning: load average $load at the start: the machine was busy, expect noisy numbers"
  echo "mpi_scaling: warning: load average $load: the machine is busy, expect noisy numbers"
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
rows=()
declare -A t1

# measure KIND RANKS THREADS DOCS: one mpirun; appends a table row.
measure() {
  local kind=$1 np=$2 threads=$3 docs=$4 bind
  # Up to one rank per core: each bound to its core (Open MPI's default
  # there); more ranks, or threads, than that: unbound, the kernel shares
  # the cores (--oversubscribe lets Open MPI start more ranks than cores).
  if [ "$openmpi" = 0 ]; then
    bind=()
  elif [ $((np * threads)) -le "$cores" ] && [ "$threads" = 1 ]; then
    bind=(--bind-to core)
  else
    bind=(--oversubscribe --bind-to none)
  fi
  local cmd=("$mpirun" "${base[@]}" "${bind[@]}" -np "$np" "$exe" --docs "$docs"
             --threads "$threads" "${COMMON[@]}")
  echo "mpi_scaling: ${cmd[*]}"
  local status=0
  "${cmd[@]}" >"$log" 2>&1 || status=$?
  if [ "$status" -ne 0 ]; then
    cat "$log" >&2
    # shellcheck disable=SC2016  # the backquotes are markdown
    printf '## Sharded attention (MPI)\n\nFailed: `%s` (exit status %s).\n' \
      "${cmd[*]}" "$status" >"$md"
    exit 1
  fi
  local line ms local_pct merge_pct rest_pct eff
  line=$(grep '^timing:' "$log")
  ms=$(sed -E 's/.* median_ms=([^ ]+).*/\1/' <<<"$line")
  local_pct=$(sed -E 's/.* local_pct=([^ ]+).*/\1/' <<<"$line")
  merge_pct=$(sed -E 's/.* merge_pct=([^ ]+).*/\1/' <<<"$line")
  rest_pct=$(sed -E 's/.* rest_pct=([^ ]+).*/\1/' <<<"$line")
  if [ "$np" = 1 ] && [ "$threads" = 1 ]; then t1[$kind]=$ms; fi
  # Work per batch: weak grows with the ranks, strong does not; a thread
  # row counts as many workers as threads.
  local workers=$((np * threads))
  if [ "$kind" = weak ]; then
    eff=$(awk -v a="${t1[$kind]}" -v b="$ms" 'BEGIN { printf "%.2f", a / b }')
  else
    eff=$(awk -v a="${t1[$kind]}" -v b="$ms" -v p="$workers" 'BEGIN { printf "%.2f", a / (p * b) }')
  fi
  ms=$(awk -v t="$ms" 'BEGIN { printf "%.2f", t }')
  rows+=("| $kind | $np | $threads | $docs | $((docs / np)) | $ms | $local_pct | $merge_pct | $rest_pct | $eff |")
}

start=$SECONDS
for np in 1 2 4; do measure weak "$np" 1 $((PER_RANK * np)); done
for np in 1 2 4; do measure strong "$np" 1 "$TOTAL"; done
measure strong 1 2 "$TOTAL"
elapsed=$((SECONDS - start))

{
  echo "## Sharded attention (MPI)"
  echo
  echo "- machine: ${model:-unknown CPU}, $cores CPUs (${sockets:-?} socket(s) x ${per_socket:-?} cores, ${tpc:-?} thread(s) per core); $(head -n 1 <<<"$version")"
  echo "- \`mpirun -np P qkv_sharded_search --docs N ${COMMON[*]}\` (no mask, MPI_Reduce with the merge as a user op; $REPS repetitions, medians; the runs took ${elapsed}s)"
  echo "- ms/batch: rank 0's time from a barrier to the merged result of 64 queries; local: the slowest rank's qkv_attention_f32 call; merge fn: the most time a rank spent inside the MPI_Op; rest: packing, messages and waiting"
  echo "- efficiency: weak t(1) / t(P), strong t(1) / (workers x t(P))"
  [ -n "$busy" ] && echo "$busy"
  echo "- ranks beyond the $cores cores share them (--oversubscribe, unbound): 4 ranks here measure the reduction's overhead on a busy machine, not a speedup"
  echo
  echo "| scaling | ranks | threads/rank | docs total | docs/rank | ms/batch | % local attention | % merge fn | % rest of reduction | efficiency |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  printf '%s\n' "${rows[@]}"
  echo
} >"$md"
cat "$md"
