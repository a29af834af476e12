#!/usr/bin/env bash
# Instructions per (query, key) pair of the aarch64 backends, counted under
# QEMU, against the minimum the vector width allows; fails when a count
# exceeds its ceiling in bench/arm_icount.expected (no regression).
#
#   bench/arm_icount.sh BUILD_AARCH64 [OUT_MD]
#
# BUILD_AARCH64: an aarch64-linux-gnu build tree (toolchains/aarch64-linux-gnu.cmake)
# with its qkv_icount_calls target built. Needs qemu-aarch64 (qemu-user)
# and a host C compiler, which builds bench/qemu_insn_count.c (a TCG plugin
# that counts executed instructions exactly) into the build tree.
#
# Shapes (bench/icount_calls.c): s2 = 4 heads, 256 x 256 causal, d 64 (the
# tile path, S2-like); s1 = 8 heads, 1 x 2048, d 128 (the row path, S1-like).
# A count is (instructions of 2 calls - instructions of 0 calls) / 2 / pairs,
# so start-up and set-up are not in it. The minimum is the multiply-adds
# alone: (head_dim + value_dim) / lanes per pair (one FMA per lane-full of
# q.k and of p v), lanes = 4 for NEON, vector bits / 32 for SVE.
# CPUs: -cpu cortex-a72 (NEON) and -cpu max at SVE vectors of 128, 256 and
# 512 bits. The same build counts the same on every run in one environment;
# another (its size moves the heap and stack, and glibc's alignment paths
# with them) moved counts by up to 0.2 per pair, well inside the 2% ceilings.
# About 1 minute.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${1:?usage: $0 BUILD_AARCH64 [OUT_MD]}
md=${2:-}
exe=$build/qkv_icount_calls
[ -x "$exe" ] || { echo "arm_icount: $exe not built" >&2; exit 2; }
plugin=$build/qemu_insn_count.so
cc -shared -fPIC -O2 -Wall -Wextra -o "$plugin" "$here/qemu_insn_count.c"
expected=$here/arm_icount.expected
qemu=(qemu-aarch64 -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib
      -plugin "$plugin" -d plugin)
log=$(mktemp)
trap 'rm -f "$log"' EXIT

count() {  # count CPU BACKEND SHAPE CALLS -> "pairs instructions"
  local pairs
  pairs=$("${qemu[@]}" -D "$log" -cpu "$1" "$exe" "$2" "$3" "$4")
  echo "$pairs $(sed -n 's/^insns: //p' "$log")"
}

# cpu label, qemu -cpu, lanes of f32, backends
configs=(
  "NEON|cortex-a72|4|highway:NEON xsimd:neon64"
  "SVE 128|max,sve-default-vector-length=16|4|highway:SVE highway:SVE2"
  "SVE 256|max,sve-default-vector-length=32|8|highway:SVE highway:SVE2"
  "SVE 512|max,sve-default-vector-length=64|16|highway:SVE highway:SVE2"
)
rows=() failed=0
for c in "${configs[@]}"; do
  IFS='|' read -r label cpu lanes backends <<<"$c"
  for backend in $backends; do
    for shape in s2 s1; do
      d=64; [ "$shape" = s1 ] && d=128
      read -r pairs zero <<<"$(count "$cpu" "$backend" "$shape" 0)"
      read -r _ two <<<"$(count "$cpu" "$backend" "$shape" 2)"
      per=$(awk -v a="$two" -v b="$zero" -v p="$pairs" 'BEGIN { printf "%.1f", (a - b) / 2 / p }')
      min=$(awk -v d="$d" -v n="$lanes" 'BEGIN { printf "%g", 2 * d / n }')
      ratio=$(awk -v x="$per" -v m="$min" 'BEGIN { printf "%.2f", x / m }')
      key="$label $backend $shape"
      ceiling=$(awk -v k="$key" -F'\t' '$1 == k { print $2 }' "$expected" 2>/dev/null || true)
      verdict="no ceiling"
      if [ -n "$ceiling" ]; then
        if awk -v x="$per" -v c="$ceiling" 'BEGIN { exit !(x <= c) }'; then
          verdict="<= $ceiling"
        else
          verdict="**over $ceiling**"
          failed=1
        fi
      fi
      rows+=("| $label | $backend | $shape | $per | $min | ${ratio}x | $verdict |")
      printf 'arm_icount: %-8s %-14s %s %8s per pair (minimum %s, %sx) %s\n' \
        "$label" "$backend" "$shape" "$per" "$min" "$ratio" "$verdict"
    done
  done
done
{
  echo "## aarch64 instructions per (query, key) pair (QEMU)"
  echo
  echo "\`bash bench/arm_icount.sh BUILD_AARCH64\`: s2 = 4 heads, 256 x 256 causal, d 64 (tile path);"
  echo "s1 = 8 heads, 1 x 2048, d 128 (row path); one worker, f32. Minimum: (d + dv) / lanes."
  echo
  echo "| CPU | backend | shape | instructions per pair | minimum | ratio | ceiling |"
  echo "|---|---|---|---:|---:|---:|---|"
  printf '%s\n' "${rows[@]}"
} >"${md:-/dev/null}"
if [ $failed -ne 0 ]; then
  echo "arm_icount: a count is over its ceiling in $expected (a regression; if intended," \
       "lower or raise the ceiling there and say why in the commit)" >&2
fi
exit $failed
