#!/usr/bin/env bash
# Footprint of qkv's attention on Cortex-M4 and Cortex-M55 at -Os:
# .text/.data/.bss that a firmware calling the attention links in (the
# library's objects after --gc-sections, libc/libm excluded and listed
# apart), and the worst-case stack: the deepest call chain from the entry
# the firmware calls, each of the library's frames as GCC reports it
# (-fcallgraph-info=su: frame sizes and call edges), indirect calls resolved
# to the engine callbacks (the functions the Engine tables point at), and
# the libc/libm/libgcc functions called (expf, logf, tanhf, getenv, strcmp,
# ...) measured from their prologues in the linked firmware (push, vpush,
# sub sp), with their own callees.
# Each target is built twice: with f32 K/V only, as microcontroller builds
# default to (QKV_LOW_PRECISION_KV=OFF), and with F16, BF16 and I8 K/V
# (QKV_LOW_PRECISION_KV=ON), measured with the same f32 firmware and with
# one that calls qkv_attention on an I8 cache.
# Usage: toolchains/footprint.sh [out-dir]   (prints a Markdown table)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$src/build-footprint}
mkdir -p "$out"
printf '| target | backend | K/V types | firmware | .text (qkv) | .data | .bss | libc+libm .text | worst-case stack (bytes: call chain) |\n'
printf '|---|---|---|---|---:|---:|---:|---:|---:|\n'
for target in cortex-m4 cortex-m55; do
for types in f32 all; do
  low=$([ $types = all ] && echo ON || echo OFF)
  b=$out/$target$([ $types = all ] && echo -kv-types || true)
  rm -rf "$b"
  CXXFLAGS=-fcallgraph-info=su cmake -S "$src" -B "$b" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$src/toolchains/$target.cmake" \
    -DCMAKE_BUILD_TYPE=MinSizeRel -DQKV_BUILD_TESTS=OFF -DQKV_LOW_PRECISION_KV=$low >/dev/null
  cmake --build "$b" >/dev/null
  lib=$b/libqkv.a
  # A firmware that calls the DOT path with every mask on f32 K and V
  # (fw.c), and one that does so on an I8 cache (fw_i8.c).
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
  cat > "$b/fw_i8.c" <<'C'
#include <qkv/qkv.h>
static float q[64 * 32], out[64 * 32], k_scales[64], v_scales[64];
static int8_t k[64 * 32], v[64 * 32];
static int32_t lens[1] = {64};
static float bias[64 * 64];
static unsigned char ws[QKV_REFERENCE_WORKSPACE_SIZE(64, 0, 1)];
int main(void) {
  qkv_attention_desc d;
  qkv_attention_desc_init(&d, 1, 1, 1, 64, 64, 32, 32);
  d.mask = QKV_MASK_CAUSAL | QKV_MASK_VALID_LENS | QKV_MASK_BIAS;
  d.valid_lens = lens;
  d.bias = bias;
  d.kv_dtype = QKV_DTYPE_I8;
  d.k_scales = k_scales;
  d.v_scales = v_scales;
  return (int)qkv_attention(&d, q, k, v, out, 0, 0, ws, sizeof ws);
}
C
  for fw in fw $([ $types = all ] && echo fw_i8 || true); do
  entry=$([ $fw = fw ] && echo qkv_attention_f32 || echo qkv_attention)
  flags=$(grep -E '^CMAKE_C_FLAGS:' "$b/CMakeCache.txt" | cut -d= -f2-)
  [ -n "$flags" ] || flags=""
  cpu=$([ $target = cortex-m4 ] && echo "-mcpu=cortex-m4 -mthumb -mfpu=fpv4-sp-d16 -mfloat-abi=hard" || echo "-mcpu=cortex-m55 -mthumb -mfloat-abi=hard")
  ld=$([ $target = cortex-m4 ] && echo mps2-an386.ld || echo mps3-an547.ld)
  arm-none-eabi-gcc $cpu -Os -fno-short-enums --specs=picolibc.specs --oslib=semihost --crt0=semihost \
    -T"$src/toolchains/$ld" -Wl,--gc-sections -Wl,--no-enum-size-warning -I"$src/include" \
    "$b/$fw.c" "$lib" -lstdc++ -Wl,-Map="$b/$fw.map" -o "$b/$fw.elf" 2>"$b/$fw.log" || { cat "$b/$fw.log"; exit 1; }
  # Sizes of the input sections kept from libqkv.a (the map lists each).
  read -r text data bss < <(python3 - "$b/$fw.map" <<'PY'
import re, sys
# Input sections kept in the output (the memory map, not the discarded
# ones listed before it), with their size and source archive member.
sizes = {"text": 0, "data": 0, "bss": 0}
pending = None
kept = False  # past the list of discarded input sections
for line in open(sys.argv[1]):
    if not kept:
        kept = line.startswith("Linker script and memory map")
        continue
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
  total_text=$(arm-none-eabi-size -A "$b/$fw.elf" | awk '$1 == ".text" {print $2}')
  # Worst-case stack over the call graph (see the top of this file).
  arm-none-eabi-objdump -d --no-show-raw-insn "$b/$fw.elf" > "$b/$fw.dis"
  stack=$(python3 - "$b" "$fw" "$entry" <<'PY'
import glob, re, subprocess, sys
b, fw, entry = sys.argv[1:4]
frame, calls = {}, {}
for ci in glob.glob(b + "/CMakeFiles/qkv_objects.dir/**/*.ci", recursive=True):
    for line in open(ci):
        m = re.match(r'node: \{ title: "([^"]+)" label: "[^\\]*\\n[^\\]*\\n(\d+) bytes', line)
        if m:
            frame[m.group(1)] = int(m.group(2))
            continue
        m = re.match(r'edge: \{ sourcename: "([^"]+)" targetname: "([^"]+)"', line)
        if m:
            calls.setdefault(m.group(1), set()).add(m.group(2))
# Indirect calls go to the engine callbacks: the functions the engine
# tables (kReferenceEngine, kHeliumEngine in .rodata) point at.
targets = set()
for obj in glob.glob(b + "/CMakeFiles/qkv_objects.dir/src/**/*.obj", recursive=True):
    out = subprocess.run(["arm-none-eabi-objdump", "-r", obj],
                         capture_output=True, text=True).stdout
    for sec in re.split(r"RELOCATION RECORDS FOR ", out):
        if re.match(r"\[\.rodata\._ZN3qkv\d+k\w+EngineE\]", sec):
            targets |= set(re.findall(r"R_ARM_ABS32\s+(_Z\S+)", sec))
# Frames of the linked functions GCC did not compile here (libc, libm,
# libgcc): from their prologues in the firmware's disassembly.
dis = open(b + "/" + fw + ".dis").read()
funcs = dict(re.findall(r"\n[0-9a-f]+ <([^>]+)>:\n(.*?)(?=\n\n|\Z)", dis, re.S))
def regcount(lst, wide):
    n = 0
    for r in lst.split(","):
        r = r.strip()
        if "-" in r:
            lo, hi = r.split("-")
            n += int(hi.strip()[1:]) - int(lo.strip()[1:]) + 1
        elif r:
            n += 1
    return n * (8 if wide else 4)
def prologue(name, seen=()):
    body = funcs.get(name)
    if body is None or name in seen:
        return 0
    size = 0
    for ins in body.splitlines()[:12]:
        m = re.search(r"\b(?:push(?:\.w)?|stmdb(?:\.w)?\s+sp!,)\s*\{([^}]*)\}", ins)
        if m:
            size += regcount(m.group(1), False)
        m = re.search(r"\bvpush(?:\.\d+)?\s*\{([^}]*)\}", ins)
        if m:
            size += regcount(m.group(1), m.group(1).strip().startswith("d"))
        m = re.search(r"\bsub(?:\.w|w)?\s+sp,\s*(?:sp,\s*)?#(\d+)", ins)
        if m:
            size += int(m.group(1))
    callees = set(re.findall(r"\bbl\s+[0-9a-f]+ <([^>+]+)>", body)) - {name}
    return size + max([prologue(c, seen + (name,)) for c in callees] or [0])
def worst(f, seen=()):
    if f in seen:
        return 0, []
    if f not in frame:
        return prologue(f), [f]
    best, path = 0, []
    # Only the boundary's task loop (and the Helium engine's hand-over of
    # additive scores) calls run_task; other indirect calls reach the small
    # callbacks (supports, num_tasks, workspace sizes).
    runs = f == entry or re.search(r"RunOneTask|RunTask", f) is not None
    indirect = [t for t in targets if runs or "RunTask" not in t]
    for c in calls.get(f, ()):
        for t in (indirect if c == "__indirect_call" else [c]):
            s, p = worst(t, seen + (f,))
            if s > best:
                best, path = s, p
    return frame[f] + best, [f] + path
total, path = worst(entry)
def short(p):
    n = subprocess.run(["arm-none-eabi-c++filt", p], capture_output=True, text=True).stdout.strip()
    n = n.replace("qkv::(anonymous namespace)::", "").replace("qkv::", "")
    if ":_Z" in p:  # a file-local function: "file:mangled name"
        n = subprocess.run(["arm-none-eabi-c++filt", p.split(":")[-1]], capture_output=True,
                           text=True).stdout.strip()
        n = n.replace("qkv::(anonymous namespace)::", "").replace("qkv::", "")
    return re.sub(r"\(.*", "", n)
print("%d (%s)" % (total, " > ".join("%s %d" % (short(p), frame.get(p, prologue(p))) for p in path)))
PY
)
  backend=$([ $target = cortex-m4 ] && echo reference || echo "helium+reference")
  printf '| %s | %s | %s | %s | %d | %d | %d | %d | %s |\n' "$target" "$backend" \
    "$([ $types = all ] && echo "f32, f16, bf16, i8" || echo f32)" \
    "$([ $fw = fw ] && echo "f32 ($entry)" || echo "i8 ($entry)")" "$text" "$data" "$bss" \
    "$((total_text - text))" "$stack"
  done
done
done
