#!/usr/bin/env bash
# Installs qkv from a build tree into a temporary prefix and builds the
# consumer three ways against it: pkg-config (shared), pkg-config (static)
# and find_package(qkv CONFIG). Usage: check_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
here=$2/tests/install
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
pc=$(find "$prefix" -name qkv.pc)
libdir=$(dirname "$(dirname "$pc")")
export PKG_CONFIG_PATH=$(dirname "$pc")
test -f "$prefix/include/qkv/qkv.h"
test -f "$libdir/libqkv.a"
test -L "$libdir/libqkv.so.0"
test -f "$libdir/cmake/qkv/qkvConfig.cmake"

echo "== pkg-config, shared"
cc -std=c99 -Wall -Werror "$here/consumer.c" $(pkg-config --cflags --libs qkv) -lm \
  -Wl,-rpath,"$libdir" -o "$tmp/c_shared"
"$tmp/c_shared"
readelf -d "$tmp/c_shared" | grep -q 'libqkv.so.0'

echo "== pkg-config, static"
cc -std=c99 -Wall -Werror "$here/consumer.c" $(pkg-config --cflags qkv) "$libdir/libqkv.a" \
  $(pkg-config --static --libs qkv | sed 's/-lqkv//') -o "$tmp/c_static"
"$tmp/c_static"
! readelf -d "$tmp/c_static" | grep -q 'libqkv.so'

echo "== find_package(qkv CONFIG)"
cmake -S "$here" -B "$tmp/cm" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/cm" >/dev/null
LD_LIBRARY_PATH="$libdir" "$tmp/cm/consumer_shared"
"$tmp/cm/consumer_static"
echo "install check passed"
