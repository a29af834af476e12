#!/usr/bin/env bash
# ISA safety of the static library: no function may be defined by more than
# one object of libqkv.a. The SIMD engines compile the same sources with
# different instruction-set flags (one object per xsimd architecture, one
# pass per Highway target); an inline function with external linkage would
# then exist in several objects, each compiled for its own ISA, and the
# linker would keep whichever comes first: a program could get the AVX-512
# copy and die with SIGILL on an AVX2 machine. Shared headers therefore give
# their helpers internal linkage (src/semantics.h) and per-target code lives
# in per-target namespaces.
# Usage: check_single_definition.sh STATIC_LIB
set -euo pipefail
lib=$1
# Defined text symbols (T), weak ones (W, V) and unique globals (u), per
# object; a symbol counted in two or more objects is multiply defined.
dups=$(nm -A --defined-only "$lib" |
  awk '$(NF-1) ~ /^[TWVu]$/ { n = split($1, a, ":"); print a[n - 1], $NF }' |
  sort -u | awk '{ c[$2]++; o[$2] = o[$2] " " $1 }
                 END { for (s in c) if (c[s] > 1) print s ":" o[s] }')
if [ -n "$dups" ]; then
  echo "FAIL: functions defined by more than one object of $lib:"
  echo "$dups" | while IFS=: read -r sym objs; do
    echo "  $(echo "$sym" | c++filt) in$objs"
  done
  exit 1
fi
echo "single definition ok: $(nm -A --defined-only "$lib" | awk '$(NF-1) ~ /^[TWVu]$/' | wc -l) functions, each in one object"
