#!/usr/bin/env bash
# The ABI and allocation guards on the built libraries:
#  - libqkv.so exports exactly the symbols listed in capi/qkv.symbols, each
#    under the symbol version listed there (name@@QKV_x.y: the default, so
#    binaries linked now bind to it), under the SONAME libqkv.so.<major>;
#  - libqkv.a references no allocator, no exception machinery and no C++
#    runtime (it must link into C programs and allocation-free firmware).
# Usage: check_symbols.sh SHARED_LIB STATIC_LIB SYMBOL_LIST
set -euo pipefail
shared=$1 static=$2 list=$3
status=0
exported=$(nm -D --defined-only --with-symbol-versions "$shared" |
  awk '$2 ~ /^[TDBRVW]$/ {print $3}' | sort)
if ! diff <(sort "$list") <(echo "$exported"); then
  echo "FAIL: exported symbols or their versions differ from $list (< listed, > built)"
  status=1
fi
soname=$(readelf -d "$shared" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
if [ "$soname" != "libqkv.so.0" ]; then
  echo "FAIL: SONAME is '$soname', want libqkv.so.0"
  status=1
fi
bad=$(nm -u "$static" | awk '{print $2}' | sort -u |
  grep -E '^(malloc|calloc|realloc|free|aligned_alloc|posix_memalign|memalign|_Zn[wa]|_Zd[la]|__cxa_|_Unwind_|__gxx_personality|_ZSt|_ZNSt)' || true)
if [ -n "$bad" ]; then
  echo "FAIL: libqkv.a references: $bad"
  status=1
fi
[ $status -eq 0 ] && echo "symbols ok: $(echo "$exported" | wc -l) exported with versions ($(echo "$exported" | sed "s/.*@@//" | sort -u | tr "\n" " "| sed "s/ $//")), SONAME $soname, no allocator/exception/C++ runtime references"
exit $status
