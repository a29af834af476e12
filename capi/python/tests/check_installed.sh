#!/usr/bin/env bash
# cmake --install into a temporary prefix, then `import qkv` from that prefix
# with no QKV_LIBRARY and no LD_LIBRARY_PATH: the installed package must load
# the installed libqkv, also after the prefix is moved elsewhere.
# Usage: check_installed.sh BUILD_DIR PYTHON PYTHON_INSTALL_DIR
set -euo pipefail
build=$1
python=$2
pydir=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
case $pydir in /*) pkgdir=$pydir ;; *) pkgdir=$tmp/prefix/$pydir ;; esac
test -f "$pkgdir/qkv/__init__.py"
test -f "$pkgdir/qkv/_install_paths.py"
! find "$pkgdir/qkv" -name '__pycache__' | grep -q .

check() {  # $1: the prefix the library must come from
  (cd "$tmp" && env -u QKV_LIBRARY -u LD_LIBRARY_PATH PYTHONPATH="$2" \
    "$python" - "$1" <<'PY'
import os, sys
import numpy as np
import qkv
prefix = os.path.realpath(sys.argv[1])
lib = os.path.realpath(qkv.library_path)
assert lib.startswith(prefix + os.sep), "loaded %s, not from %s" % (lib, prefix)
x = np.array([[0.9, 0.1], [0.2, 0.8], [0.1, 0.9], [0.8, 0.2]], dtype=np.float32)
out = qkv.attention(x, x, x)
assert abs(out[1, 0] - 0.44735) < 1e-4 and abs(out[1, 1] - 0.55265) < 1e-4, out
print("import qkv %s (%s) from %s: ok" % (qkv.version(), qkv.backend(), qkv.library_path))
PY
  )
}
echo "== installed package: $pkgdir"
check "$tmp/prefix" "$pkgdir"
echo "== the same prefix, moved"
mv "$tmp/prefix" "$tmp/moved"
check "$tmp/moved" "${pkgdir/$tmp\/prefix/$tmp/moved}"

case $pydir in
  /*) ;;
  *) if "$python" -c "import site, sys; sys.exit(0 if any(p in site.getsitepackages() for p in ('/usr/local/$pydir', '/usr/$pydir')) else 1)"; then
       echo "note: $pydir is on $python's default path under /usr and /usr/local"
     else
       echo "note: $pydir is not on $python's default path: set PYTHONPATH=PREFIX/$pydir"
     fi ;;
esac
echo "python install check passed"
