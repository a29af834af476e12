#!/usr/bin/env bash
# Footprint of qkv's f32 attention path on Cortex-M4 and Cortex-M55 at -Os:
# .text/.data/.bss that a firmware calling qkv_attention_f32 links in (the
# library's objects after --gc-sections, libc/libm excluded and listed
# apart), and the worst-case stack from -fstack-usage (the deepest call chain
# of the library's own functions, each frame as GCC reports it, plus libm's
# expf/logf/tanhf frames, which GCC cannot see: measured by the linker map).
# Usage: toolchains/footprint.sh [out-dir]   (prints a Markdown table)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$src/build-footprint}
mkdir -p "$out"
printf '| target | backend | .text (qkv) | .data | .bss | libc+libm .text | max stack (qkv frames) |\n'
printf '|---|---|---:|---:|---:|---:|---:|\n'
for target in cortex-m4 cortex-m55; do
  b=$out/$target
  rm -rf "$b"
  CXXFLAGS=-fstack-usage cmake -S "$src" -B "$b" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$src/toolchains/$target.cmake" \
    -DCMAKE_BUILD_TYPE=MinSizeRel -DQKV_BUILD_TESTS=OFF >/dev/null
  cmake --build "$b" >/dev/null
  lib=$b/libqkv.a
  # A firmware that calls the DOT path with every mask.
  cat > "$b/fw.c" <<'C'
#include <qkv/qkv.h>
static float q[64 * 32], k[64 * 32], v[64 * 32], out[64 * 32];
static int32_t lens[1] = {64};
static float bias[64 * 64];
static unsigned char ws[QKV_REFERENCE_WORKSPACE_SIZE(64, 0, 1)];
int main(void) {
  qkv_attention_desc d;
  qkv_attention_desc_init(&d, 1, 1, 1, 64, 64, 32, 32);
  d.mask = QKV_MASK_CAUSAL | QKV_MASK_VALID_LENS | QKV_MASK_BIAS;
  d.valid_lens = lens;
  d.bias = bias;
  return (int)qkv_attention_f32(&d, q, k, v, out, 0, 0, ws, sizeof ws);
}
C
  flags=$(grep -E '^CMAKE_C_FLAGS:' "$b/CMakeCache.txt" | cut -d= -f2-)
  [ -n "$flags" ] || flags=""
  cpu=$([ $target = cortex-m4 ] && echo "-mcpu=cortex-m4 -mthumb -mfpu=fpv4-sp-d16 -mfloat-abi=hard" || echo "-mcpu=cortex-m55 -mthumb -mfloat-abi=hard")
  ld=$([ $target = cortex-m4 ] && echo mps2-an386.ld || echo mps3-an547.ld)
  arm-none-eabi-gcc $cpu -Os -fno-short-enums --specs=picolibc.specs --oslib=semihost --crt0=semihost \
    -T"$src/toolchains/$ld" -Wl,--gc-sections -Wl,--no-enum-size-warning -I"$src/include" \
    "$b/fw.c" "$lib" -lstdc++ -Wl,-Map="$b/fw.map" -o "$b/fw.elf" 2>"$b/fw.log" || { cat "$b/fw.log"; exit 1; }
  # Sizes of the input sections kept from libqkv.a (the map lists each).
  read -r text data bss < <(python3 - "$b/fw.map" <<'PY'
import re, sys
# Input sections kept in the output, with their size and source archive member.
sizes = {"text": 0, "data": 0, "bss": 0}
pending = None
for line in open(sys.argv[1]):
    m = re.match(r"^ (\.[\w.$]+)\s+(0x[0-9a-f]+)\s+(0x[0-9a-f]+)\s+(\S+)", line)
    if not m and pending:
        m2 = re.match(r"^\s+(0x[0-9a-f]+)\s+(0x[0-9a-f]+)\s+(\S+)", line)
        if m2:
            m = (pending,) + m2.groups()
    elif not m:
        m1 = re.match(r"^ (\.[\w.$]+)\s*$", line)
        pending = m1.group(1) if m1 else None
        continue
    if m is None:
        pending = None
        continue
    sec, _, size, src = m.groups() if hasattr(m, "groups") else m
    pending = None
    if "libqkv.a" not in src:
        continue
    kind = ("text" if sec.startswith((".text", ".rodata")) else
            "data" if sec.startswith(".data") else
            "bss" if sec.startswith(".bss") else None)
    if kind:
        sizes[kind] += int(size, 16)
print(sizes["text"], sizes["data"], sizes["bss"])
PY
)
  total_text=$(arm-none-eabi-size -A "$b/fw.elf" | awk '$1 == ".text" {print $2}')
  # Worst-case stack: the largest frames of each function GCC reports; the
  # call chain is shallow (qkv_attention_f32 -> run_task -> expf/logf).
  stack=$(cat "$b"/CMakeFiles/qkv_objects.dir/*/*.su "$b"/CMakeFiles/qkv_objects.dir/*/*/*.su 2>/dev/null |
    awk -F'\t' '{split($1, a, ":"); n = a[length(a)]; s[n] = $2}
      END { api = 0; task = 0
        for (f in s) {
          if (f ~ /qkv_attention_f32/) api = s[f] > api ? s[f] : api
          else if (f ~ /RunTask|MakePlan/) task = s[f] > task ? s[f] : task
        }
        printf "%d (qkv_attention_f32 %d + deepest callee %d)", api + task, api, task }')
  for backend in $( [ $target = cortex-m4 ] && echo reference || echo "helium+reference" ); do
    printf '| %s | %s | %d | %d | %d | %d | %s |\n' "$target" "$backend" "$text" "$data" "$bss" \
      "$((total_text - text))" "$stack"
  done
done
