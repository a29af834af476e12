#!/usr/bin/env bash
# A self-contained library: libqkv.a and libqkv.so need nothing at run time
# beyond libc and libm (no libhwy, no C++ runtime).
#  - libqkv.so's NEEDED entries are libc.so.6 and libm.so.6 only;
#  - no external C++ symbol: every C++ (_Z) or C++ runtime (__cxa_, __gxx_)
#    symbol libqkv.a or libqkv.so leaves undefined is defined by libqkv.a
#    itself (hwy::SupportedTargets() was the last one);
#  - a C program (below) linked with the C compiler against libqkv.a
#    (a) statically, -static, when libc.a exists: no NEEDED entry at all;
#    (b) dynamically: NEEDED libc.so.6, libm.so.6 and the loader only;
#    (c) against libqkv.so: the same plus libqkv.so.0;
#    each runs every backend this CPU has against the reference and exits 0;
#  - for consumers (BUILD_DIR given): qkv.pc's Cflags are -I only, neither
#    it nor the CMake package (qkvConfig.cmake, the exported targets) asks
#    for libhwy or Highway's defines;
#  - x86-64 Linux: the Highway targets chosen (qkv's own CPU detection) are
#    ones /proc/cpuinfo reports, and the AVX2 one is there when it could be.
# Registered for native Linux builds only (not cross, WASI, microcontroller
# or sanitizer builds: the sanitizers' runtimes are NEEDED by design).
# Usage: check_self_contained.sh CC "C_FLAGS" INCLUDE_DIR STATIC_LIB SHARED_LIB [BUILD_DIR]
set -euo pipefail
cc=$1 cflags=$2 include=$3 static=$4 shared=$5 build=${6:-}
read -r -a cflags <<<"$cflags"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
fail() {
  echo "FAIL: $*"
  status=1
}

# NEEDED entries of an ELF file, one a line (none for a static executable).
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
# Fails unless every NEEDED entry of $1 matches the regex $2.
only_needs() {
  local file=$1 allowed=$2 extra
  extra=$(needed "$file" | grep -Ev "^($allowed)\$" || true)
  if [ -n "$extra" ]; then
    fail "$(basename "$file") needs: $(echo "$extra" | tr '\n' ' ')"
  fi
  local list
  list=$(needed "$file" | tr '\n' ' ')
  echo "  $(basename "$file"): NEEDED ${list:-(none)}"
}
glibc='libc\.so\.6|libm\.so\.6|ld-linux[-a-z0-9_.]*\.so\.[0-9]+'

echo "== libqkv.so"
only_needs "$shared" 'libc\.so\.6|libm\.so\.6'

echo "== external C++ symbols"
defined=$(nm --defined-only "$static" 2>/dev/null | awk 'NF == 3 {print $3}' | sort -u)
for lib in "$static" "$shared"; do
  if [ "$lib" = "$shared" ]; then
    # (glibc's own __cxa_finalize, __cxa_atexit are not C++ runtime)
    undefined=$(nm -D --undefined-only "$lib" | awk '{print $NF}' | grep -v '@GLIBC_' || true)
  else
    undefined=$(nm -u "$lib" 2>/dev/null | awk 'NF == 2 {print $2}')
  fi
  external=$(comm -23 <(echo "$undefined" | grep -E '^(_Z|__cxa_|__gxx_)' | sort -u) <(echo "$defined") || true)
  if [ -n "$external" ]; then
    fail "$(basename "$lib") references C++ symbols it does not define:" \
      "$(echo "$external" | c++filt | tr '\n' ';')"
  else
    echo "  $(basename "$lib"): none"
  fi
done

if [ -n "$build" ]; then
  echo "== what consumers are told (qkv.pc, CMake package)"
  if command -v pkg-config >/dev/null; then
    pc_cflags=$(PKG_CONFIG_PATH="$build" pkg-config --cflags qkv)
    pc_libs=$(PKG_CONFIG_PATH="$build" pkg-config --static --libs qkv)
    for flag in $pc_cflags; do
      [[ $flag == -I* ]] || fail "pkg-config --cflags qkv has $flag"
    done
    if [[ $pc_libs == *hwy* ]]; then fail "pkg-config --static --libs qkv: $pc_libs"; fi
    echo "  pkg-config --cflags: $pc_cflags; --static --libs: $pc_libs"
  fi
  if grep -i 'hwy\|highway' "$build/qkv.pc"; then fail "qkv.pc mentions Highway"; fi
  for f in "$build/qkvConfig.cmake" "$build"/CMakeFiles/Export/*/qkvTargets*.cmake; do
    [ -f "$f" ] || continue
    if grep -nE 'hwy::|find_dependency\(hwy|HWY_' "$f"; then
      fail "$(basename "$f") asks for Highway"
    else
      echo "  $(basename "$f"): no hwy"
    fi
  done
fi

# The program: the four tokens of the README (numpy's answer), then a
# 2-head, 37 x 45, d 64 problem on every backend against the reference.
cat >"$tmp/prog.c" <<'EOF'
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <qkv/qkv.h>

enum { H = 2, Q = 37, K = 45, D = 64 };
static float q[H * Q * D], k[H * K * D], v[H * K * D];
static float ref[H * Q * D], out[H * Q * D];

static qkv_status run(const char *backend, float *o) {
  qkv_attention_desc desc;
  qkv_attention_desc_init(&desc, 1, H, H, Q, K, D, D);
  desc.backend = backend;
  size_t bytes = qkv_attention_workspace_size(&desc);
  void *workspace = bytes ? malloc(bytes) : NULL;
  qkv_status st =
      qkv_attention_f32(&desc, q, k, v, o, NULL, NULL, workspace, bytes);
  free(workspace);
  return st;
}

int main(void) {
  const float x[4][2] = {{0.9f, 0.1f}, {0.2f, 0.8f}, {0.1f, 0.9f}, {0.8f, 0.2f}};
  float o4[4][2];
  qkv_attention_desc desc;
  qkv_attention_desc_init(&desc, 1, 1, 1, 4, 4, 2, 2);
  size_t bytes = qkv_attention_workspace_size(&desc);
  void *workspace = bytes ? malloc(bytes) : NULL;
  qkv_status st = qkv_attention_f32(&desc, &x[0][0], &x[0][0], &x[0][0],
                                    &o4[0][0], NULL, NULL, workspace, bytes);
  free(workspace);
  if (st != QKV_OK || fabsf(o4[1][0] - 0.44735f) > 1e-4f ||
      fabsf(o4[1][1] - 0.55265f) > 1e-4f) {
    fprintf(stderr, "four tokens on %s: %s\n", qkv_backend(),
            qkv_status_string(st));
    return 1;
  }
  unsigned seed = 12345;
  for (size_t i = 0; i < sizeof q / sizeof q[0]; ++i) {
    seed = seed * 1103515245u + 12345u;
    q[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
  }
  for (size_t i = 0; i < sizeof k / sizeof k[0]; ++i) {
    seed = seed * 1103515245u + 12345u;
    k[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    seed = seed * 1103515245u + 12345u;
    v[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
  }
  if (run("reference", ref) != QKV_OK) {
    fprintf(stderr, "reference failed\n");
    return 1;
  }
  int bad = 0;
  for (size_t b = 0; b < qkv_backend_count(); ++b) {
    const char *name = qkv_backend_name(b);
    memset(out, 0, sizeof out);
    st = run(name, out);
    float err = 0.0f;
    for (size_t i = 0; i < sizeof out / sizeof out[0]; ++i) {
      float e = fabsf(out[i] - ref[i]);
      if (!(e <= err)) err = e; /* NaN too */
    }
    int ok = st == QKV_OK && err < 1e-4f;
    printf("backend %s %s (max |diff| %.2g)\n", name, ok ? "ok" : "WRONG",
           (double)err);
    bad |= !ok;
  }
  return bad;
}
EOF

# Builds $tmp/$1 from prog.c with the remaining arguments and runs it;
# returns non-zero if it does not link.
build_and_run() {
  local name=$1
  shift
  if ! "$cc" "${cflags[@]}" -std=c99 -Wall -Werror -I"$include" "$tmp/prog.c" \
    "$@" -o "$tmp/$name" >"$tmp/$name.log" 2>&1; then
    grep -o "undefined reference to .*" "$tmp/$name.log" | sort | uniq -c ||
      cat "$tmp/$name.log"
    fail "$name does not link"
    return 1
  fi
  if ! "$tmp/$name" >"$tmp/$name.out" 2>&1; then
    fail "$name did not compute (exit status non-zero)"
  fi
  sed 's/^/  /' "$tmp/$name.out"
}

libc_a=$("$cc" "${cflags[@]}" -print-file-name=libc.a)
if [ -f "$libc_a" ]; then
  echo "== (a) libqkv.a, -static"
  if build_and_run prog_static -static "$static" -lm; then
    only_needs "$tmp/prog_static" ''  # none at all
  fi
else
  echo "== (a) skipped: the C compiler has no libc.a (libc6-dev)"
fi

echo "== (b) libqkv.a, dynamic libc"
if build_and_run prog_dynamic "$static" -lm; then
  only_needs "$tmp/prog_dynamic" "$glibc"
fi

echo "== (c) libqkv.so"
if build_and_run prog_shared -L"$(dirname "$shared")" -lqkv -lm \
  -Wl,-rpath,"$(dirname "$shared")"; then
  only_needs "$tmp/prog_shared" "$glibc|libqkv\\.so\\.0"
fi

# The Highway targets picked at run time against the kernel's CPU flags.
out=$tmp/prog_dynamic.out
if [ "$(uname -m)" = x86_64 ] && [ -r /proc/cpuinfo ] && [ -f "$out" ] &&
  grep -q '^backend highway:' "$out"; then
  echo "== Highway targets against /proc/cpuinfo"
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  has() {
    local f
    for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done
  }
  supports() {
    case $1 in
      SSSE3) has sse sse2 pni ssse3 ;;
      SSE4) supports SSSE3 && has sse4_1 sse4_2 pclmulqdq aes ;;
      AVX2) supports SSE4 && has avx avx2 abm bmi1 bmi2 fma f16c ;;
      AVX3) supports AVX2 && has avx512f avx512vl avx512dq avx512bw ;;
      AVX3_DL) supports AVX3 && has avx512_vnni vpclmulqdq avx512vbmi \
        avx512_vbmi2 vaes avx512_vpopcntdq avx512_bitalg ;;
      EMU128 | SCALAR) true ;;
      *) return 1 ;;
    esac
  }
  targets=$(sed -n 's/^backend highway:\([A-Z0-9_]*\) .*/\1/p' "$out")
  for t in $targets; do
    supports "$t" || fail "highway:$t chosen, but /proc/cpuinfo lacks its features"
  done
  if supports AVX2 && ! grep -Eq '^(AVX2|AVX3|AVX3_DL)$' <<<"$targets"; then
    fail "/proc/cpuinfo has AVX2 (and FMA, BMI2, F16C, LZCNT), no highway:AVX2 or better chosen"
  fi
  echo "  highway targets: $(echo "$targets" | tr '\n' ' ')"
fi

[ $status -eq 0 ] && echo "self-contained: libqkv needs libc and libm only"
exit $status
