#!/usr/bin/env bash
# Runs the qkv benchmark suite and prints tables a person can read: the
# machine's limits measured in the same run (FMA peak of each SIMD target,
# streaming read), then every shape and sweep with GFLOP/s, GB/s, % of the
# limit that bounds it and the speedups over OpenBLAS and the reference, and
# the backward pass against the forward and an OpenBLAS backward.
#
#   bench/run.sh [BUILD_DIR] [extra benchmark flags...]
#
# BUILD_DIR (default: build) must already hold bench/qkv_bench, e.g. from
#   cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build
# Writes BUILD_DIR/bench/report.json (Google Benchmark JSON, every repetition
# and the aggregates), BUILD_DIR/bench/report.md (the tables below),
# BUILD_DIR/bench/kv_sweep.png and head_dim_sweep.png (GFLOP/s per
# implementation, peak as a line; needs Debian's python3-matplotlib) and
# BUILD_DIR/bench/console.txt (the benchmark's own console output); then
# bench/key_sweep.cc adds the path-boundary sweep and bench/mpi_scaling.sh
# the sharded-attention (MPI) section to report.md
# (also alone in BUILD_DIR/bench/mpi_scaling.md), and bench/torch_baseline.py
# PyTorch beside qkv (BUILD_DIR/bench/torch_baseline.md).
# Extra flags go to the benchmark, e.g. --benchmark_filter=S3_small (keep
# '^limits|' in the filter for the % of peak column). About 4-6 minutes on a
# quiet 2-core machine.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

BUILD=${1:-build}
shift || true
BIN="$BUILD/bench/qkv_bench"
OUT="$BUILD/bench"
if [[ ! -x "$BIN" ]]; then
  echo "run.sh: $BIN not found; build first (cmake --build $BUILD)" >&2
  exit 1
fi
# The system python, with Debian's matplotlib: the first python3 on PATH may
# be a bare pyenv build.
PY=/usr/bin/python3
[[ -x "$PY" ]] || PY=python3

# The OpenBLAS baseline runs on its fastest kernel set for this machine,
# measured here. Debian's OpenBLAS (0.3.21) does not recognize Sapphire
# Rapids or Zen 4/5 and falls back to slower kernels (Prescott: a fifth of
# the speed), and no fixed choice is best everywhere: on the Zen 5 VM
# Haswell's sgemm was 1.6x slower than SkylakeX's, on the Zen 4 VM (AVX-512
# on 256-bit units) SkylakeX's three-step was 4-10% slower than Haswell's.
# So each kernel set the CPU can run (SkylakeX with AVX-512, Haswell and Zen
# with AVX2 and FMA) times the three-step on S2 and S3 (a few seconds each)
# and the one with the smallest product of the two medians is the baseline
# (an OPENBLAS_CORETYPE from the environment is not used: some machines set
# Haswell for other programs' sake). QKV_OPENBLAS_CORETYPE=NAME skips the
# measurement and uses NAME. The OpenBLAS output is every qkv row's
# reference (the max err column), so a kernel set that computed wrong
# results would show there.
export OPENBLAS_NUM_THREADS=1  # the 2-worker baseline splits heads itself
QKV_OPENBLAS_PICK=""
if [[ -n "${QKV_OPENBLAS_CORETYPE:-}" ]]; then
  export OPENBLAS_CORETYPE=$QKV_OPENBLAS_CORETYPE
  QKV_OPENBLAS_PICK="$QKV_OPENBLAS_CORETYPE (QKV_OPENBLAS_CORETYPE)"
else
  CANDIDATES=()
  grep -qw avx512f /proc/cpuinfo 2>/dev/null && CANDIDATES+=(SkylakeX)
  if grep -qw avx2 /proc/cpuinfo 2>/dev/null && grep -qw fma /proc/cpuinfo 2>/dev/null; then
    CANDIDATES+=(Haswell Zen)
  fi
  if [[ -n "${OPENBLAS_CORETYPE:-}" ]]; then
    echo "note: OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE from the environment not used; the baseline's kernel set is measured"
  fi
  unset OPENBLAS_CORETYPE
  BEST="" BEST_SCORE="" TRIED=()
  for ct in "${CANDIDATES[@]}"; do
    # "SCORE TEXT": the product of the S2 and S3 medians (us^2) and the two
    # times for the report; nothing if the run failed.
    result=$(OPENBLAS_CORETYPE=$ct "$BIN" \
        --benchmark_filter='^attention_f32/(S2_prefill|S3_small)/openblas_3step/workers:1/' \
        --benchmark_min_time=0.1 --benchmark_repetitions=3 \
        --benchmark_report_aggregates_only=true --benchmark_format=json 2>/dev/null |
      "$PY" -c '
import json, sys
try:
    runs = json.load(sys.stdin)["benchmarks"]
except Exception:
    sys.exit(0)
us = {"ns": 1e-3, "us": 1.0, "ms": 1e3}
t = {b["name"].split("/")[1]: b["real_time"] * us[b["time_unit"]]
     for b in runs
     if b.get("aggregate_name") == "median" and not b.get("error_occurred")}
if len(t) == 2:
    print("%.6g S2 %.1f ms, S3 %.1f us" % (t["S2_prefill"] * t["S3_small"],
                                          t["S2_prefill"] / 1e3, t["S3_small"]))
' || true)
    if [[ -z "$result" ]]; then
      TRIED+=("$ct: failed")
      continue
    fi
    TRIED+=("$ct: ${result#* }")
    score=${result%% *}
    if [[ -z "$BEST" ]] || awk -v a="$score" -v b="$BEST_SCORE" 'BEGIN { exit !(a < b) }'; then
      BEST=$ct BEST_SCORE=$score
    fi
  done
  if [[ -n "$BEST" ]]; then
    export OPENBLAS_CORETYPE=$BEST
    QKV_OPENBLAS_PICK="$BEST, the fastest three-step of $(IFS=';'; echo "${TRIED[*]}" | sed 's/;/; /g')"
  fi
fi
export QKV_OPENBLAS_PICK

MODEL=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | sed 's/^[^:]*: *//' || true)
NPROC=$(nproc 2>/dev/null || echo '?')
echo "machine: ${MODEL:-unknown CPU}, ${NPROC} cores (nproc)"
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-} OPENBLAS_NUM_THREADS=$OPENBLAS_NUM_THREADS${QKV_OPENBLAS_PICK:+ (kernel set: $QKV_OPENBLAS_PICK)}"

# Two workers need both cores: anything else running (a build, the tests)
# shows up as poor 2-worker scaling and a large cv.
LOAD=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)
if awk -v l="$LOAD" 'BEGIN { exit !(l > 0.5) }'; then
  echo "warning: load average $LOAD: the machine is busy, expect noisy numbers (2 workers most)"
fi

FLAGS=(--benchmark_min_time=0.2 --benchmark_repetitions=5
       --benchmark_display_aggregates_only=true
       --benchmark_out="$OUT/report.json" --benchmark_out_format=json)
echo "running: $BIN ${FLAGS[*]} $*"
echo "(about 4-6 minutes; full console output in $OUT/console.txt; medians as they come:)"
start=$SECONDS
set +e
"$BIN" "${FLAGS[@]}" "$@" 2>&1 | tee "$OUT/console.txt" |
  grep --line-buffered -E '_median|ERROR|error|WARNING' | grep -v 'Library was built as DEBUG'
status=${PIPESTATUS[0]}
set -e
# (Filtered above: Debian's libbenchmark says it "was built as DEBUG". That
# is the harness's setup code; the timed loop is inline in benchmark.h and
# compiled with our flags.)
elapsed=$((SECONDS - start))
if [[ $status -ne 0 ]]; then
  echo "run.sh: qkv_bench exited with status $status" >&2
  exit "$status"
fi
echo "benchmark took ${elapsed}s"
echo

# The tables (machine limits first), report.md and the two plots.
"$PY" "$HERE/report.py" "$OUT/report.json" "$OUT" "$MODEL" "$NPROC" "$elapsed"

# Path boundaries (bench/key_sweep.cc, about a minute): the worst ratio
# t(n-1)/t(n) as decoding gains a key or prefill a query; appended to
# report.md.
SWEEP="$BUILD/bench/qkv_key_sweep"
if [[ -x "$SWEEP" ]]; then
  echo
  echo "running: $SWEEP (path boundaries, default backend)"
  { echo; echo "## Path boundaries: one more key or query (bench/key_sweep.cc)"; echo
    echo "A call's time t(n) over n = kv_len 1..128 (decoding) or q_len 1..32 (prefill over 256"
    echo "keys, causal), 1 worker; a ratio above 1 means one more made the call cheaper."; echo
    "$SWEEP"; } > "$OUT/key_sweep.md"
  cat "$OUT/key_sweep.md" >>"$OUT/report.md"
  tail -1 "$OUT/key_sweep.md"
fi

# Sharded attention over MPI ranks (bench/mpi_scaling.sh, about 15 s): its
# section is appended to report.md; without MPI it is one line saying why.
# A failure there is reported, not fatal: the tables above stand.
echo
rm -f "$OUT/mpi_scaling.md"
if ! bash "$HERE/mpi_scaling.sh" "$BUILD" "$OUT/mpi_scaling.md"; then
  echo "warning: bench/mpi_scaling.sh failed (see its section in report.md)" >&2
fi
if [[ -s "$OUT/mpi_scaling.md" ]]; then
  { echo; cat "$OUT/mpi_scaling.md"; } >>"$OUT/report.md"
  echo "appended $OUT/mpi_scaling.md to $OUT/report.md"
fi

# PyTorch beside qkv, both from Python (bench/torch_baseline.py, about 20 s):
# its section is appended to report.md; without torch it says it was skipped.
echo
if ! QKV_LIBRARY="$BUILD/libqkv.so.0" "$PY" "$HERE/torch_baseline.py" --out "$OUT/torch_baseline.md"; then
  echo "warning: bench/torch_baseline.py failed (see its section in report.md)" >&2
fi
if [[ -s "$OUT/torch_baseline.md" ]]; then
  { echo; cat "$OUT/torch_baseline.md"; } >>"$OUT/report.md"
  echo "appended $OUT/torch_baseline.md to $OUT/report.md"
fi
