"""Shared by the examples: the output directory and the qkv import.

Each example takes the output directory as its only argument (default: the
current directory). Run from a source tree with the library built:

    QKV_LIBRARY=build/libqkv.so.0 PYTHONPATH=capi/python \
        /usr/bin/python3 capi/python/examples/four_tokens.py OUT_DIR
"""

import importlib.util
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display

HERE = os.path.dirname(os.path.abspath(__file__))
if importlib.util.find_spec("qkv") is None:  # not on PYTHONPATH: the one beside
    sys.path.insert(0, os.path.dirname(HERE))
import qkv  # noqa: E402,F401


def out_dir():
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(d, exist_ok=True)
    return d


def wrote(path):
    print("wrote %s (%d bytes)" % (path, os.path.getsize(path)))
    return path
