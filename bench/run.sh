#!/usr/bin/env bash
# Runs the qkv benchmark suite and prints a table a person can read.
#
#   bench/run.sh [BUILD_DIR] [extra benchmark flags...]
#
# BUILD_DIR (default: build) must already hold bench/qkv_bench, e.g. from
#   cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build
# Writes BUILD_DIR/bench/report.json (Google Benchmark JSON, every repetition
# and the aggregates), BUILD_DIR/bench/report.md (the table below) and
# BUILD_DIR/bench/console.txt (the benchmark's own console output).
# Extra flags go to the benchmark, e.g. --benchmark_filter=S3_small.
set -euo pipefail

BUILD=${1:-build}
shift || true
BIN="$BUILD/bench/qkv_bench"
OUT="$BUILD/bench"
if [[ ! -x "$BIN" ]]; then
  echo "run.sh: $BIN not found; build first (cmake --build $BUILD)" >&2
  exit 1
fi
# The system python: the first python3 on PATH may be a bare pyenv build.
PY=/usr/bin/python3
[[ -x "$PY" ]] || PY=python3

# Debian's OpenBLAS does not recognize Sapphire Rapids and falls back to a
# kernel at a fifth of the speed; SkylakeX is the right AVX-512 kernel set.
if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}
fi
export OPENBLAS_NUM_THREADS=1  # the 2-worker baseline splits heads itself

MODEL=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | sed 's/^[^:]*: *//' || true)
NPROC=$(nproc 2>/dev/null || echo '?')
echo "machine: ${MODEL:-unknown CPU}, ${NPROC} cores (nproc)"
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-} OPENBLAS_NUM_THREADS=$OPENBLAS_NUM_THREADS"

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
echo "(about 2 minutes; full console output in $OUT/console.txt; medians as they come:)"
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

"$PY" - "$OUT/report.json" "$OUT/report.md" "$MODEL" "$NPROC" "$elapsed" <<'PYEOF'
import json
import sys

report_path, md_path, model, nproc, elapsed = sys.argv[1:6]
with open(report_path) as f:
    report = json.load(f)
ctx = report.get("context", {})

TO_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def parse(run_name):
    # attention_f32/<shape>/<implementation>/workers:<n>[/iterations:..][/real_time]
    parts = run_name.split("/")
    if len(parts) < 4 or not parts[3].startswith("workers:"):
        return None
    return parts[1], parts[2], int(parts[3].split(":")[1])


rows, cv, errors, order = {}, {}, {}, []
for b in report.get("benchmarks", []):
    key = parse(b.get("run_name", b["name"]))
    if key is None:
        continue
    if key not in order:
        order.append(key)
    if b.get("error_occurred"):
        errors[key] = b.get("error_message", "error")
        continue
    if b.get("run_type") != "aggregate":
        continue
    if b.get("aggregate_name") == "median":
        rows[key] = b
    elif b.get("aggregate_name") == "cv":
        cv[key] = b.get("real_time", 0.0)  # a fraction


def time_us(b):
    return b["real_time"] * TO_US[b.get("time_unit", "ns")]


blas = {(s, w): time_us(b) for (s, i, w), b in rows.items() if i == "openblas_3step"}
ref = {s: time_us(b) for (s, i, w), b in rows.items() if i == "reference"}


def fmt_time(us):
    if us < 1:
        return "%.0f ns" % (us * 1e3)
    if us < 1e3:
        return "%.3g us" % us
    if us < 1e6:
        return "%.3g ms" % (us / 1e3)
    return "%.3g s" % (us / 1e6)


def fmt_rate(x):
    return "%.2f" % x if x < 10 else "%.1f" % x


def fmt_speedup(base, t):
    return "-" if base is None else "%.2fx" % (base / t)


header = ["shape", "implementation", "workers", "median time", "cv",
          "GFLOP/s", "GB/s", "Mpairs/s", "vs OpenBLAS 3-step", "vs reference",
          "max err"]
table = []
for key in order:
    shape, impl, workers = key
    if key in errors and key not in rows:
        table.append([shape, impl, str(workers), "ERROR: " + errors[key],
                      "", "", "", "", "", "", ""])
        continue
    if key not in rows:
        continue
    b = rows[key]
    t = time_us(b)
    err = b.get("max_err", -1.0)
    table.append([
        shape, impl, str(workers), fmt_time(t),
        "%.1f%%" % (100 * cv[key]) if key in cv else "",
        fmt_rate(b.get("flop", 0.0) / 1e9), fmt_rate(b.get("bytes", 0.0) / 1e9),
        fmt_rate(b.get("pairs", 0.0) / 1e6),
        "-" if impl == "openblas_3step"
        else fmt_speedup(blas.get((shape, workers)), t),
        "-" if impl == "reference" else fmt_speedup(ref.get(shape), t),
        "-" if impl == "openblas_3step" or err < 0 else "%.1e" % err,
    ])

widths = [max(len(r[i]) for r in table + [header]) for i in range(len(header))]
right = {2, 3, 4, 5, 6, 7, 8, 9, 10}


def line(cells):
    out = []
    for i, c in enumerate(cells):
        out.append(c.rjust(widths[i]) if i in right else c.ljust(widths[i]))
    return "| " + " | ".join(out) + " |"


sep = "|" + "|".join(("-" * (w + 1) + ":") if i in right else ("-" * (w + 2))
                     for i, w in enumerate(widths)) + "|"
lines = [
    "# qkv benchmark",
    "",
    "- machine: %s, %s cores (nproc); %s" % (model or "unknown CPU", nproc,
                                             ctx.get("date", "")),
    "- qkv %s, default backend %s; backends: %s" % (
        ctx.get("qkv_version", "?"), ctx.get("qkv_backend", "?"),
        ctx.get("qkv_backends", "?")),
    "- OpenBLAS: %s (core %s, OPENBLAS_CORETYPE=%s), 1 thread per worker" % (
        ctx.get("openblas_config", "?"), ctx.get("openblas_corename", "?"),
        ctx.get("openblas_coretype_env", "")),
    "- f32, medians of the repetitions (cv: their spread), wall-clock time; "
    "run took %ss" % elapsed,
    "- GFLOP/s: 4*batch*heads*q_len*kv_len*d per call (half with causal); "
    "for additive scores 3*hidden+2*d per (query, key) pair; "
    "Mpairs/s: (query, key) pairs scored per second; "
    "GB/s: q+k+v+out bytes per call",
    "- vs OpenBLAS 3-step: its median time / this one, same shape and same "
    "workers; vs reference: the single-threaded reference backend's time / "
    "this one",
    "- max err: max |out - OpenBLAS out| / max |v|, checked once outside the "
    "timing",
    "",
    line(header),
    sep,
] + [line(r) for r in table]
text = "\n".join(lines) + "\n"
sys.stdout.write(text)
with open(md_path, "w") as f:
    f.write(text)
print("\nwrote %s and %s" % (report_path, md_path))
PYEOF
