#!/usr/bin/env bash
# CTest's check that the benchmark and its report still work together (not a
# timing: nothing here looks at speed). Runs a few of qkv_bench's benchmarks
# briefly, one of each kind the report reads (a limit, a shape on every
# backend and OpenBLAS, a paired scaling, a variant against the plain
# call, the backward pass's rows and its paired rounds), then report.py on
# the JSON, and
# checks that every table came out.
#   bench/smoke.sh QKV_BENCH OUT_DIR
set -euo pipefail
BIN=$1
OUT=$2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$OUT"
PY=/usr/bin/python3
[[ -x "$PY" ]] || PY=python3
export OPENBLAS_NUM_THREADS=1
FILTER='^(limits/fma_peak/[^/]*/threads:1/|attention_f32/S4_toy/|scaling/S3_small/|vs_plain/S3_small/padded_cache/|backward_f32/S3_small/|backward_paired/S3_small/)'
"$BIN" --benchmark_filter="$FILTER" \
  --benchmark_min_time=0.01 --benchmark_repetitions=2 \
  --benchmark_out="$OUT/report.json" --benchmark_out_format=json \
  > "$OUT/console.txt"
"$PY" "$HERE/report.py" "$OUT/report.json" "$OUT" smoke 1 0 > "$OUT/report.txt"
fail=0
for want in '## Machine limits' 'FMA peak' \
            '## Two workers against one, paired in time' '| S3_small ' \
            '## S1-S4 and the other score kinds' '| S4_toy ' 'reference' \
            '## Variants and layouts against the plain call' 'K, V in a cache of' \
            '## Backward (qkv_attention_backward_f32)' \
            '### Against the forward and the OpenBLAS backward' \
            '### Every backward row'; do
  if ! grep -qF -- "$want" "$OUT/report.md"; then
    echo "smoke: '$want' missing from $OUT/report.md" >&2
    fail=1
  fi
done
if grep -q 'ERROR' "$OUT/report.md"; then
  echo "smoke: a benchmark reported an error:" >&2
  grep 'ERROR' "$OUT/report.md" >&2
  fail=1
fi
[[ $fail == 0 ]] && echo "smoke: report.md has every table"
exit $fail
