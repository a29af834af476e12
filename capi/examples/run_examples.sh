#!/usr/bin/env bash
# Runs every C and Python example of a build and writes their pictures into
# OUT_DIR (created if missing), then lists what it wrote.
# Usage: capi/examples/run_examples.sh BUILD_DIR OUT_DIR
# The Python examples use Debian's /usr/bin/python3 with python3-numpy and
# python3-matplotlib (override with QKV_PYTHON), the training examples also
# python3-torch; without them they are skipped with a note and the C
# examples still run.
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 BUILD_DIR OUT_DIR" >&2
  exit 2
fi
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
python=${QKV_PYTHON:-/usr/bin/python3}

# Each example's output goes to OUT_DIR/<name>.txt; a failing example stops
# the script with its output shown.
run() {  # run LOG COMMAND...
  local log=$1
  shift
  echo "== ${*#$src/}"
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    echo "FAILED: $*" >&2
    exit 1
  fi
}

bin=$build/capi/examples
for exe in four_tokens nadaraya_watson nadaraya_watson_train kv_cache_decode \
    llama_decode chunked_context; do
  run "$out/$exe.txt" "$bin/qkv_$exe"
  tail -n 1 "$out/$exe.txt"
done
run "$out/heatmap.txt" "$bin/qkv_heatmap" "$out/heatmap"
grep '^wrote' "$out/heatmap.txt"

lib=$build/libqkv.so.0
if [ ! -e "$lib" ]; then
  lib=$(find "$build" -maxdepth 2 -name 'libqkv.so.0' | head -n 1)
fi
if [ -x "$python" ] && "$python" -c 'import numpy, matplotlib' 2>/dev/null; then
  for ex in identity_heatmap four_tokens masked_softmax nadaraya_watson sharded_search; do
    run "$out/$ex.py.txt" env QKV_LIBRARY="$lib" PYTHONPATH="$src/capi/python" \
      PYTHONDONTWRITEBYTECODE=1 MPLBACKEND=Agg "$python" "$src/capi/python/examples/$ex.py" "$out"
    grep '^wrote' "$out/$ex.py.txt"
  done
  # Training through qkv's backward pass: the full runs (transformer_reverse
  # under a minute on 2 cores).
  if "$python" -c 'import torch' 2>/dev/null; then
    for ex in nadaraya_watson_training transformer_reverse; do
      run "$out/$ex.py.txt" env QKV_LIBRARY="$lib" PYTHONPATH="$src/capi/python" \
        PYTHONDONTWRITEBYTECODE=1 MPLBACKEND=Agg "$python" "$src/capi/python/examples/$ex.py" "$out"
      grep -E '^(final|token accuracy|wrote)' "$out/$ex.py.txt"
    done
  else
    echo "note: $python has no torch (apt-get install python3-torch): training examples skipped"
  fi
else
  echo "note: $python with numpy and matplotlib not found" \
       "(apt-get install python3-numpy python3-matplotlib): Python examples skipped"
fi

echo "== pictures in $out"
find "$out" -maxdepth 1 -type f \( -name '*.png' -o -name '*.svg' -o -name '*.pgm' \) \
  -printf '%p\t%s bytes\n' | sort
