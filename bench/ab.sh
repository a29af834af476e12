#!/usr/bin/env bash
# A/B of two builds of the benchmark suite, alternating: round i runs A then
# B (odd rounds B then A), each with --benchmark_repetitions, so that slow
# drifts of the machine (a VM's neighbours, thermal state) fall on both.
# Prints, per benchmark, the median time of A and of B over every repetition
# of every round and the ratio B/A (bench/ab.py).
#
#   bench/ab.sh OLD_qkv_bench NEW_qkv_bench [FILTER] [ROUNDS] [REPS]
#
# e.g. bench/ab.sh /tmp/old/build/bench/qkv_bench build/bench/qkv_bench \
#        'attention_f32/S[1-4].*workers:1' 3 3
# JSON of every run goes to ${AB_OUT:-/tmp/qkv-ab}.
set -euo pipefail
a=$1 b=$2
filter=${3:-'attention_f32/.*/workers:1'}
rounds=${4:-3}
reps=${5:-3}
out=${AB_OUT:-/tmp/qkv-ab}
mkdir -p "$out"
rm -f "$out"/a_*.json "$out"/b_*.json
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}
run() {  # which binary round
  "$2" --benchmark_filter="$filter" --benchmark_repetitions="$reps" \
    --benchmark_min_time=0.1 --benchmark_format=json \
    --benchmark_out="$out/$1_$3.json" --benchmark_out_format=json >/dev/null
}
for ((i = 0; i < rounds; ++i)); do
  if ((i % 2 == 0)); then run a "$a" "$i"; run b "$b" "$i";
  else run b "$b" "$i"; run a "$a" "$i"; fi
  echo "round $((i + 1))/$rounds done" >&2
done
PY=/usr/bin/python3
[[ -x "$PY" ]] || PY=python3
"$PY" "$(dirname "$0")/ab.py" "$out"
