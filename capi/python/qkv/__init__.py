"""qkv for Python: attention through libqkv's C ABI, with ctypes and numpy.

    import numpy as np, qkv
    q = np.random.rand(2, 8, 16, 64).astype(np.float32)    # [B, H, Lq, D]
    k = v = np.random.rand(2, 2, 16, 64).astype(np.float32) # [B, Hkv, Lk, D]
    out, w = qkv.attention(q, k, v, causal=True, return_weights=True)
    out8 = qkv.attention(q, k, v, causal=True, kv_dtype="int8")  # an int8 K/V cache
    qkv.show_heatmaps(w[:, :2], xlabel="Keys", ylabel="Queries", path="w.png")
    out, lse = qkv.attention(q, k, v, causal=True, return_lse=True)
    d_q, d_k, d_v = qkv.attention_backward(q, k, v, out, lse, np.ones_like(out), causal=True)

qkv.attention_backward gives the gradients; qkv.torch.attention (import
qkv.torch: it needs PyTorch, `import qkv` alone does not) is attention as a
torch.autograd.Function, to train with.

No compiled extension: the package loads the shared library (libqkv.so.0)
with ctypes, mirrors qkv_attention_desc as a ctypes.Structure, and passes
numpy buffers. Where the library comes from, in order:

  1. $QKV_LIBRARY, a path to the library (if set, only that one is tried);
  2. next to this package and in the lib directories of the prefix it was
     installed into (`cmake --install`), then a `build/` directory of the
     source tree this package sits in;
  3. ctypes.util.find_library("qkv") and the system loader (libqkv.so.0 on
     LD_LIBRARY_PATH or in the ld.so cache).

If none loads, importing qkv raises ImportError listing every place tried.
`qkv.library_path` says which file was loaded.
"""

import ctypes
import ctypes.util
import math
import operator
import os
import sys
import sysconfig
import types

import numpy as np

__all__ = [
    "QkvError",
    "QkvInvalidArgument",
    "QkvUnsupported",
    "attention",
    "attention_backward",
    "backend",
    "backends",
    "library_path",
    "merge",
    "quantize_rows",
    "show_heatmaps",
    "version",
]

# The ABI this binding mirrors: qkv_attention_desc as of 0.2.
_ABI_MAJOR = 0
_ABI_MINOR = 3

QKV_OK = 0
QKV_ERR_INVALID_ARGUMENT = 1
QKV_ERR_WORKSPACE_TOO_SMALL = 2
QKV_ERR_UNSUPPORTED = 3

_SCORES = {"dot": 0, "gaussian": 1, "additive": 2}
_MASK_CAUSAL, _MASK_VALID_LENS, _MASK_BIAS = 1, 2, 4
_MASK_WINDOW, _MASK_KV_START = 8, 16
QKV_DTYPE_F32, QKV_DTYPE_F16, QKV_DTYPE_BF16, QKV_DTYPE_I8 = 0, 1, 2, 3
# kv_dtype names: (qkv_dtype, numpy dtype of the stored elements); bf16 is
# stored as np.uint16 holding the bfloat16 bits.
_QUANTIZED = {"f32": (QKV_DTYPE_F32, np.float32), "f16": (QKV_DTYPE_F16, np.float16),
              "bf16": (QKV_DTYPE_BF16, np.uint16), "int8": (QKV_DTYPE_I8, np.int8)}


# --------------------------------------------------------------------------
# Finding and loading the library
# --------------------------------------------------------------------------

def _library_names():
    if sys.platform == "darwin":
        return ["libqkv.0.dylib", "libqkv.dylib"]
    if sys.platform == "win32":
        return ["qkv.dll", "libqkv.dll"]
    return ["libqkv.so.0", "libqkv.so"]


def _search_dirs():
    """Directories that may hold the library, best first, without repeats."""
    here = os.path.dirname(os.path.abspath(__file__))
    dirs = [here]
    # `cmake --install` writes _install_paths.py with the library directory
    # relative to this package, so an installed (even relocated) prefix is
    # found exactly.
    try:
        from . import _install_paths  # generated at install time

        dirs.append(os.path.normpath(os.path.join(here, _install_paths.LIBDIR_FROM_PACKAGE)))
    except ImportError:
        pass
    parent = os.path.dirname(here)
    if os.path.basename(parent) in ("dist-packages", "site-packages"):
        # Installed some other way: PREFIX/LIBDIR/python3.X/dist-packages/qkv.
        libdir = os.path.dirname(parent)
        if os.path.basename(libdir).startswith("python"):
            libdir = os.path.dirname(libdir)
        prefix = os.path.dirname(libdir)
        if os.path.basename(prefix) == "lib":  # LIBDIR = lib/<multiarch>
            prefix = os.path.dirname(prefix)
        multiarch = sysconfig.get_config_var("MULTIARCH") or ""
        dirs += [libdir, os.path.join(prefix, "lib"), os.path.join(prefix, "lib64")]
        if multiarch:
            dirs.append(os.path.join(prefix, "lib", multiarch))
    else:
        # The source tree (capi/python/qkv): the README's build directory.
        repo = os.path.dirname(os.path.dirname(os.path.dirname(here)))
        if os.path.exists(os.path.join(repo, "include", "qkv", "qkv.h")):
            dirs.append(os.path.join(repo, "build"))
    seen, unique = set(), []
    for d in dirs:
        if d not in seen:
            seen.add(d)
            unique.append(d)
    return unique


def _load():
    tried = []

    def attempt(what):
        try:
            return ctypes.CDLL(what), what
        except OSError as exc:
            tried.append("%s (%s)" % (what, exc))
            return None, None

    env = os.environ.get("QKV_LIBRARY")
    if env:
        lib, path = attempt(env)
        if lib is None:
            raise ImportError(
                "qkv: QKV_LIBRARY is set but cannot be loaded: %s. Unset it to "
                "search the usual places, or point it at libqkv.so.0." % tried[0])
        return lib, path
    tried.append("$QKV_LIBRARY (not set)")
    names = _library_names()
    for d in _search_dirs():
        paths = [os.path.join(d, n) for n in names if os.path.exists(os.path.join(d, n))]
        if not paths:
            tried.append("%s/{%s} (no such file)" % (d, ",".join(names)))
        for path in paths:
            lib, path = attempt(path)
            if lib is not None:
                return lib, path
    found = ctypes.util.find_library("qkv")
    if found:
        lib, path = attempt(found)
        if lib is not None:
            return lib, path
    else:
        tried.append('ctypes.util.find_library("qkv") (found nothing)')
    lib, path = attempt(names[0])  # the system loader: LD_LIBRARY_PATH, ld.so.cache
    if lib is not None:
        return lib, path
    raise ImportError(
        "qkv: cannot find the qkv shared library (%s). Build it "
        "(cmake -S . -B build && cmake --build build) and set "
        "QKV_LIBRARY=/path/to/%s, or install qkv with cmake --install. "
        "Tried:\n  %s" % (names[0], names[0], "\n  ".join(tried)))


class _Strides(ctypes.Structure):
    """qkv_strides: of a [batch][head][token][dim] tensor, in elements."""

    _fields_ = [
        ("batch", ctypes.c_int64),
        ("head", ctypes.c_int64),
        ("token", ctypes.c_int64),
    ]


class _Desc(ctypes.Structure):
    """qkv_attention_desc (include/qkv/qkv.h), field for field."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("batch", ctypes.c_int64),
        ("q_heads", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),
        ("q_len", ctypes.c_int64),
        ("kv_len", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("value_dim", ctypes.c_int64),
        ("score", ctypes.c_int),  # enum qkv_score
        ("scale", ctypes.c_float),
        ("mask", ctypes.c_uint32),
        ("valid_lens", ctypes.c_void_p),  # const int32_t *
        ("valid_lens_per_query", ctypes.c_int32),
        ("bias", ctypes.c_void_p),  # const float *
        ("bias_batch_stride", ctypes.c_int64),
        ("bias_head_stride", ctypes.c_int64),
        ("additive_hidden", ctypes.c_int64),
        ("additive_w_q", ctypes.c_void_p),
        ("additive_w_k", ctypes.c_void_p),
        ("additive_w_v", ctypes.c_void_p),
        ("parallel_for", ctypes.c_void_p),
        ("parallel_ctx", ctypes.c_void_p),
        ("num_workers", ctypes.c_size_t),
        # added in 0.1 beyond the fixed contract
        ("backend", ctypes.c_char_p),
        # added in 0.2
        ("kv_dtype", ctypes.c_int32),  # enum qkv_dtype
        ("k_scales", ctypes.c_void_p),  # const float *
        ("v_scales", ctypes.c_void_p),
        ("q_strides", _Strides),
        ("k_strides", _Strides),
        ("v_strides", _Strides),
        ("out_strides", _Strides),
        ("k_scale_strides", _Strides),
        ("v_scale_strides", _Strides),
        ("window_left", ctypes.c_int64),
        ("window_right", ctypes.c_int64),
        ("alibi_slopes", ctypes.c_void_p),  # const float *
        ("softcap", ctypes.c_float),
        ("q_pos", ctypes.c_void_p),  # const int32_t *
        ("sinks", ctypes.c_void_p),  # const float *
        ("kv_start", ctypes.c_void_p),  # const int32_t *
    ]


_lib, library_path = _load()


def _bind(lib):
    lib.qkv_version.argtypes = []
    lib.qkv_version.restype = ctypes.c_uint32
    lib.qkv_backend.argtypes = []
    lib.qkv_backend.restype = ctypes.c_char_p
    lib.qkv_status_string.argtypes = [ctypes.c_int]
    lib.qkv_status_string.restype = ctypes.c_char_p
    lib.qkv_backend_count.argtypes = []
    lib.qkv_backend_count.restype = ctypes.c_size_t
    lib.qkv_backend_name.argtypes = [ctypes.c_size_t]
    lib.qkv_backend_name.restype = ctypes.c_char_p
    lib.qkv_attention_desc_init_sized.argtypes = ([ctypes.POINTER(_Desc), ctypes.c_size_t]
                                                  + [ctypes.c_int64] * 7)
    lib.qkv_attention_desc_init_sized.restype = None
    lib.qkv_attention_workspace_size.argtypes = [ctypes.POINTER(_Desc)]
    lib.qkv_attention_workspace_size.restype = ctypes.c_size_t
    lib.qkv_attention_f32.argtypes = [ctypes.POINTER(_Desc)] + [ctypes.c_void_p] * 7 + [ctypes.c_size_t]
    lib.qkv_attention_f32.restype = ctypes.c_int
    # Added in 0.2: the general entry and the sentence saying what is wrong.
    lib.qkv_attention.argtypes = [ctypes.POINTER(_Desc)] + [ctypes.c_void_p] * 7 + [ctypes.c_size_t]
    lib.qkv_attention.restype = ctypes.c_int
    lib.qkv_attention_explain.argtypes = ([ctypes.POINTER(_Desc)] + [ctypes.c_void_p] * 7
                                          + [ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t])
    lib.qkv_attention_explain.restype = ctypes.c_int
    # Added in 0.1 after the first builds: a library without it still loads,
    # and merge() says what is missing.
    if hasattr(lib, "qkv_attention_merge_f32"):
        lib.qkv_attention_merge_f32.argtypes = [ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 4
        lib.qkv_attention_merge_f32.restype = ctypes.c_int
    lib.qkv_quantize_rows.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                      ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                      ctypes.c_int64, ctypes.c_void_p]
    lib.qkv_quantize_rows.restype = ctypes.c_int
    # The backward pass (0.2): a library built before it still loads, and
    # attention_backward() says what is missing.
    if hasattr(lib, "qkv_attention_backward_f32"):
        lib.qkv_attention_backward_workspace_size.argtypes = [ctypes.POINTER(_Desc)]
        lib.qkv_attention_backward_workspace_size.restype = ctypes.c_size_t
        lib.qkv_attention_backward_f32.argtypes = ([ctypes.POINTER(_Desc)] + [ctypes.c_void_p] * 10
                                                   + [ctypes.c_size_t])
        lib.qkv_attention_backward_f32.restype = ctypes.c_int
        lib.qkv_attention_backward_explain.argtypes = ([ctypes.POINTER(_Desc)]
                                                       + [ctypes.c_void_p] * 10
                                                       + [ctypes.c_size_t, ctypes.c_char_p,
                                                          ctypes.c_size_t])
        lib.qkv_attention_backward_explain.restype = ctypes.c_int


try:
    _bind(_lib)
except AttributeError as _exc:  # an old or foreign library
    raise ImportError("qkv: %s does not export the qkv %d.%d API: %s"
                      % (library_path, _ABI_MAJOR, _ABI_MINOR, _exc))
if (_lib.qkv_version() >> 16) != _ABI_MAJOR or ((_lib.qkv_version() >> 8) & 255) < _ABI_MINOR:
    raise ImportError("qkv: %s is version %s; this binding needs %d.%d or a later %d.x"
                      % (library_path, "%d.%d.%d" % (
                          _lib.qkv_version() >> 16, (_lib.qkv_version() >> 8) & 255,
                          _lib.qkv_version() & 255), _ABI_MAJOR, _ABI_MINOR, _ABI_MAJOR))


# --------------------------------------------------------------------------
# Small queries
# --------------------------------------------------------------------------

def version():
    """Version of the loaded library, "MAJOR.MINOR.PATCH" (qkv_version())."""
    v = _lib.qkv_version()
    return "%d.%d.%d" % (v >> 16, (v >> 8) & 255, v & 255)


def backend():
    """The backend the library uses by default, e.g. "highway:AVX3"."""
    return _lib.qkv_backend().decode()


def backends():
    """Every backend this library has and this CPU runs, best first."""
    return [_lib.qkv_backend_name(i).decode() for i in range(_lib.qkv_backend_count())]


def status_string(status):
    """qkv_status_string(status)."""
    return _lib.qkv_status_string(int(status)).decode()


class QkvError(RuntimeError):
    """A call returned a status other than QKV_OK.

    `status` is the qkv_status value, `text` qkv_status_string's sentence
    and `detail` what qkv_attention_explain said (the field and its value),
    or None. The message is "context: detail: text (qkv_status N)".
    """

    def __init__(self, status, context="", detail=None):
        self.status = int(status)
        self.text = status_string(status)
        self.detail = detail or None
        msg = "%s (qkv_status %d)" % (self.text, self.status)
        if self.detail:
            msg = "%s: %s" % (self.detail, msg)
        super().__init__("%s: %s" % (context, msg) if context else msg)


class QkvInvalidArgument(QkvError, ValueError):
    """QKV_ERR_INVALID_ARGUMENT: a QkvError that is also a ValueError."""


class QkvUnsupported(QkvError, NotImplementedError):
    """QKV_ERR_UNSUPPORTED (a backend, score or kv_dtype this build or CPU
    does not serve): a QkvError that is also a NotImplementedError."""


def _status_error(status, context="", detail=None):
    cls = {QKV_ERR_INVALID_ARGUMENT: QkvInvalidArgument,
           QKV_ERR_UNSUPPORTED: QkvUnsupported}.get(int(status), QkvError)
    return cls(status, context, detail)


__version__ = version()


# --------------------------------------------------------------------------
# attention()
# --------------------------------------------------------------------------

def _as_f32(name, x):
    a = np.asarray(x)
    if a.dtype.kind not in "fiub":
        raise TypeError("%s must hold real numbers, got dtype %s" % (name, a.dtype))
    # float64, other dtypes and any strides (transposed, sliced, reversed)
    # become a dense float32 copy; dense float32 passes through.
    return np.ascontiguousarray(a, dtype=np.float32)


def _dense_f32(name, x):
    """x as dense float32, copied only if it is not that already; keeps 0-d."""
    a = np.asarray(x)
    if a.dtype.kind not in "fiub":
        raise TypeError("%s must hold real numbers, got dtype %s" % (name, a.dtype))
    return np.asarray(a, dtype=np.float32, order="C")


def _f32_copy(name, x):
    """A new dense float32 array with x's values (one copy, whatever x is)."""
    a = np.asarray(x)
    if a.dtype.kind not in "fiub":
        raise TypeError("%s must hold real numbers, got dtype %s" % (name, a.dtype))
    return np.array(a, dtype=np.float32, order="C", copy=True)


def _ptr(a):
    return None if a is None else a.ctypes.data


def _bias_layout(bias, batch, heads, lq, lk):
    """(array, batch_stride, head_stride) for bias broadcast to [B, H, Lq, Lk].

    The C API reads row i of a dense [Lq][Lk] block at
    bias + b*batch_stride + h*head_stride. Dims of size 1 become stride 0
    (no copy); a float32 array whose [Lq, Lk] block is dense is used in
    place with its own batch and head strides; anything else is materialized,
    only over the dims that really vary.
    """
    b = np.asarray(bias)
    if b.dtype.kind not in "fiub":
        raise TypeError("bias must hold real numbers, got dtype %s" % b.dtype)
    target = (batch, heads, lq, lk)
    if b.ndim > 4:
        raise ValueError("bias has %d dims; it must broadcast to [B, H, Lq, Lk] = %s"
                         % (b.ndim, list(target)))
    b = b.reshape((1,) * (4 - b.ndim) + b.shape)
    for axis, (have, want) in enumerate(zip(b.shape, target)):
        if have != want and have != 1:
            raise ValueError("bias shape %s does not broadcast to [B, H, Lq, Lk] = %s "
                             "(dim %d is %d, needs 1 or %d)"
                             % (list(np.shape(bias)), list(target), axis, have, want))
    item = 4
    if (b.dtype == np.float32 and b.shape[2:] == (lq, lk)
            and (lk == 1 or b.strides[3] == item)
            and (lq == 1 or b.strides[2] == lk * item)
            and all(s >= 0 and s % item == 0 for s in b.strides[:2])):
        bs = 0 if b.shape[0] == 1 else b.strides[0] // item
        hs = 0 if b.shape[1] == 1 else b.strides[1] // item
        # A view may start anywhere; the pointer is its first element.
        return b, bs, hs
    dense = np.ascontiguousarray(
        np.broadcast_to(b.astype(np.float32, copy=False), (b.shape[0], b.shape[1], lq, lk)))
    bs = 0 if dense.shape[0] == 1 else dense.strides[0] // item
    hs = 0 if dense.shape[1] == 1 else dense.strides[1] // item
    return dense, bs, hs


def _valid_lens(valid_lens, batch, lq, lk):
    a = np.asarray(valid_lens)
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or np.any(a != np.round(a)):
            raise ValueError("valid_lens must be whole numbers")
    elif a.dtype.kind not in "iub":
        raise TypeError("valid_lens must hold integers, got dtype %s" % a.dtype)
    if a.ndim == 0:
        a = np.full((batch,), a)
    if a.shape == (batch,):
        per_query = 0
    elif a.shape == (batch, lq):
        per_query = 1
    else:
        raise ValueError("valid_lens shape %s must be [B] = [%d] or [B, Lq] = [%d, %d]"
                         % (list(a.shape), batch, batch, lq))
    if a.size and (a.min() < 0 or a.max() > lk):
        raise ValueError("valid_lens must lie in [0, Lk] = [0, %d], got values in [%d, %d]"
                         % (lk, a.min(), a.max()))
    return np.ascontiguousarray(a, dtype=np.int32), per_query


def _real(name, x):
    a = np.asarray(x)
    if a.dtype.kind not in "fiub":
        raise TypeError("%s must hold real numbers, got dtype %s" % (name, a.dtype))
    return a


def _layout(a):
    """qkv_strides (batch, head, token) of a 4-D float32 array, in elements.

    (0, 0, 0) for a dense array (the C ABI's default), the array's own
    strides for a view the C ABI can address (last dim contiguous, the
    others non-negative multiples of 4 bytes), None for one it cannot (the
    caller then copies). The stride of a dim of size 1 is never used for an
    address; it becomes the span of the others so that it is neither 0 nor
    smaller than the last dim, whatever numpy put there.
    """
    if a.size == 0 or a.flags.c_contiguous:
        return (0, 0, 0)
    item = a.itemsize
    dim = a.shape[3]
    if not a.flags.aligned or (dim > 1 and a.strides[3] != item):
        return None
    outer = []
    for n, s in zip(a.shape[:3], a.strides[:3]):
        if n > 1 and (s < 0 or s % item):
            return None
        outer.append(s // item if n > 1 else None)
    span = dim + sum((n - 1) * s for n, s in zip(a.shape[:3], outer) if s is not None)
    strides = tuple(span if s is None else s for s in outer)
    # All three 0 would read as dense; a row stride inside a row overlaps
    # (the C ABI rejects both): copy those.
    if strides == (0, 0, 0) or any(0 < s < dim for s in strides):
        return None
    return strides


def _as_4d(a):
    """a viewed as [B, H, L, D]: leading dims of size 1, never a copy."""
    return a[(None,) * (4 - a.ndim)]


def _per_batch(name, x, batch):
    """[B] int32 from an int (every batch) or B integers that fit int32."""
    a = np.asarray(x)
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or np.any(a != np.round(a)):
            raise ValueError("%s must be whole numbers" % name)
    elif a.dtype.kind not in "iub":
        raise TypeError("%s must hold integers, got dtype %s" % (name, a.dtype))
    if a.ndim == 0:
        a = np.full((batch,), a)
    if a.shape != (batch,):
        raise ValueError("%s shape %s must be [B] = [%d]" % (name, list(a.shape), batch))
    if a.size and (a.min() < -2 ** 31 or a.max() > 2 ** 31 - 1):
        raise ValueError("%s must fit in int32, got values in [%d, %d]"
                         % (name, a.min(), a.max()))
    return np.ascontiguousarray(a, dtype=np.int32)


def _per_head(name, x, heads):
    """[H] float32 from a number (every head) or H numbers."""
    a = _real(name, x)
    if a.ndim == 0:
        a = np.full((heads,), a)
    if a.shape != (heads,):
        raise ValueError("%s shape %s must be [H] = [%d] (one per query head)"
                         % (name, list(a.shape), heads))
    return np.ascontiguousarray(a, dtype=np.float32)


def _window_side(name, x):
    if x is None:
        return -1
    try:
        return int(operator.index(x))
    except TypeError:
        raise TypeError("window %s must be an int or None, got %r" % (name, x)) from None


def _explain(args):
    """qkv_attention_explain's sentence for the arguments of a call."""
    message = ctypes.create_string_buffer(512)
    _lib.qkv_attention_explain(*args, message, len(message))
    return message.value.decode(errors="replace")


def _kv_operand(name, a, scales, kv_dtype):
    """k or v for a low-precision kv_dtype: (array of its elements, scales).

    An array of the stored type (np.float16 for "f16", np.uint16 bits for
    "bf16", np.int8 with its scales for "int8") is used as it is, views
    included; a float array is quantized with qkv_quantize_rows. The
    shapes are checked already; scales is None unless kv_dtype is "int8".
    """
    storage = _QUANTIZED[kv_dtype][1]
    if a.dtype == storage:
        if kv_dtype != "int8":
            return a, None
        if scales is None:
            raise ValueError('%s is int8 with kv_dtype="int8": pass %s_scales, the float '
                             "scale of each row (%s's shape without the last dim, %s), or "
                             "a float %s to have it quantized"
                             % (name, name, name, list(a.shape[:-1]), name))
        s = _real(name + "_scales", scales)
        if s.shape != a.shape[:-1]:
            raise ValueError("%s_scales is %s but %s is %s: one scale per row, %s's shape "
                             "without the last dim, %s" % (name, list(s.shape), name,
                                                            list(a.shape), name,
                                                            list(a.shape[:-1])))
        return a, (s if s.dtype == np.float32 else np.ascontiguousarray(s, dtype=np.float32))
    if a.dtype.kind != "f":
        raise TypeError("with kv_dtype=%r, %s must be %s (already quantized) or a float "
                        "array (quantized here), got dtype %s"
                        % (kv_dtype, name, {"f16": "float16", "bf16": "uint16 (bfloat16 bits)",
                                            "int8": "int8"}[kv_dtype], a.dtype))
    if scales is not None:
        raise ValueError('%s_scales given with a float %s (dtype %s): scales go with an int8 '
                         "%s; a float one is quantized here and gets its own"
                         % (name, name, a.dtype, name))
    return _quantize(np.ascontiguousarray(a, dtype=np.float32), kv_dtype,
                     '%s holds a non-finite value: kv_dtype="int8" needs finite values' % name)


def _describe(q, k, v, scale, causal, valid_lens, bias, score, additive, window,
              alibi_slopes, softcap, sinks, q_pos, kv_start, kv_dtype, k_scales, v_scales,
              backend):
    """The checks and the descriptor shared by attention() and attention_backward().

    Checks q, k, v and the options (ValueError, TypeError), converts and
    quantizes as attention()'s docstring says, and fills a _Desc with every
    field but out_strides (dense, all 0, until the caller sets it). Returns
    a namespace: desc; keep (the arrays the descriptor points into: hold it
    until the call returns); q (as converted), q4, k4, v4 (the 4-D arrays to
    pass); wide (a float64 input); batch, heads, kv_heads, lq, lk, d, dv;
    kv_dtype (the name, "f32" for None) and score (its lower-case name).
    """
    q, k, v = _real("q", q), _real("k", k), _real("v", v)
    wide = any(a.dtype == np.float64 for a in (q, k, v))
    if kv_dtype is None:
        kv_dtype = "f32"
    if not isinstance(kv_dtype, str) or kv_dtype not in _QUANTIZED:
        raise ValueError('kv_dtype must be None, "f32", "f16", "bf16" or "int8", got %r'
                         % (kv_dtype,))
    for name, scales in (("k_scales", k_scales), ("v_scales", v_scales)):
        if scales is not None and kv_dtype != "int8":
            raise ValueError('%s is only read with kv_dtype="int8" (one scale per row of an '
                             'int8 cache), not with kv_dtype=%r' % (name, kv_dtype))
    # float32 stays where it is; anything else becomes a dense float32 copy
    # (k and v of a low-precision kv_dtype: after the shape checks).
    q = q if q.dtype == np.float32 else np.ascontiguousarray(q, dtype=np.float32)
    if kv_dtype == "f32":
        k, v = (a if a.dtype == np.float32 else np.ascontiguousarray(a, dtype=np.float32)
                for a in (k, v))
    if q.ndim not in (2, 3, 4):
        raise ValueError("q must be [Lq, D], [H, Lq, D] or [B, H, Lq, D]; got %d dims %s"
                         % (q.ndim, list(q.shape)))
    for name, a in (("k", k), ("v", v)):
        if a.ndim != q.ndim:
            raise ValueError("%s has %d dims %s but q has %d %s: k and v need q's rank"
                             % (name, a.ndim, list(a.shape), q.ndim, list(q.shape)))
    q4, k4, v4 = _as_4d(q), _as_4d(k), _as_4d(v)
    batch, heads, lq, d = q4.shape
    _, kv_heads, lk, _ = k4.shape
    dv = v4.shape[3]
    if min(heads, kv_heads, d, dv, v4.shape[1]) < 1:
        raise ValueError("empty dimension: q %s, k %s, v %s (heads, D and Dv must be >= 1; "
                         "only B, Lq and Lk may be 0)" % (list(q.shape), list(k.shape),
                                                         list(v.shape)))
    if k4.shape[0] != batch or v4.shape[0] != batch:
        raise ValueError("batch mismatch: q has B=%d, k %d, v %d"
                         % (batch, k4.shape[0], v4.shape[0]))
    if v4.shape[1] != kv_heads:
        raise ValueError("kv heads mismatch: k has %d heads, v has %d" % (kv_heads, v4.shape[1]))
    if heads % kv_heads != 0:
        raise ValueError("q has %d heads, k and v %d: the kv heads must divide the q heads"
                         % (heads, kv_heads))
    if v4.shape[2] != lk:
        raise ValueError("k has Lk=%d keys but v has %d values" % (lk, v4.shape[2]))
    if k4.shape[3] != d:
        raise ValueError("head dim mismatch: q has D=%d, k has %d" % (d, k4.shape[3]))
    scale_arrays = []
    if kv_dtype != "f32":
        k, k_sc = _kv_operand("k", k, k_scales, kv_dtype)
        v, v_sc = _kv_operand("v", v, v_scales, kv_dtype)
        k4, v4 = _as_4d(k), _as_4d(v)
        if kv_dtype == "int8":
            scale_arrays = [("k", k_sc), ("v", v_sc)]

    score_key = score.lower() if isinstance(score, str) else score
    if score_key not in _SCORES:
        raise ValueError('score must be "dot", "gaussian" or "additive", got %r' % (score,))

    desc = _Desc()
    # The library's defaults for the fields of the struct this binding knows
    # (f32, dense, no window, no ALiBi, ...), and struct_size = its size.
    _lib.qkv_attention_desc_init_sized(ctypes.byref(desc), ctypes.sizeof(_Desc), batch, heads,
                                       kv_heads, lq, lk, d, dv)
    desc.score = _SCORES[score_key]
    desc.scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    desc.kv_dtype = _QUANTIZED[kv_dtype][0]
    keep = []  # arrays the descriptor points into, alive until the call returns
    tensors = []
    for name, a in (("q", q4), ("k", k4), ("v", v4)):
        strides = _layout(a)  # in elements: of kv_dtype for k and v
        if strides is None:
            a = np.ascontiguousarray(a)
            strides = (0, 0, 0)
        tensors.append(a)
        setattr(desc, name + "_strides", _Strides(*strides))
    q4, k4, v4 = tensors
    for name, sc in scale_arrays:
        # [..., Lk] float32 scales as a [B, Hkv, Lk, 1] tensor: their strides,
        # in floats, are the scale strides (a token-major cache's scales stay
        # token-major, in place).
        s4 = _as_4d(sc[..., None])
        strides = _layout(s4)
        if strides is None:
            s4 = np.ascontiguousarray(s4)
            strides = (0, 0, 0)
        keep.append(s4)
        setattr(desc, name + "_scales", _ptr(s4))
        setattr(desc, name + "_scale_strides", _Strides(*strides))
    if causal:
        desc.mask |= _MASK_CAUSAL
    if valid_lens is not None:
        vl, per_query = _valid_lens(valid_lens, batch, lq, lk)
        keep.append(vl)
        desc.mask |= _MASK_VALID_LENS
        desc.valid_lens = _ptr(vl)
        desc.valid_lens_per_query = per_query
    if bias is not None:
        b, bs, hs = _bias_layout(bias, batch, heads, lq, lk)
        keep.append(b)
        desc.mask |= _MASK_BIAS
        desc.bias = _ptr(b)
        desc.bias_batch_stride, desc.bias_head_stride = bs, hs
    if window is not None:
        try:
            left, right = window
        except (TypeError, ValueError):
            raise ValueError("window must be (left, right), got %r" % (window,)) from None
        desc.mask |= _MASK_WINDOW
        desc.window_left = _window_side("left", left)
        desc.window_right = _window_side("right", right)
    if kv_start is not None:
        ks = _per_batch("kv_start", kv_start, batch)
        keep.append(ks)
        desc.mask |= _MASK_KV_START
        desc.kv_start = _ptr(ks)
    if q_pos is not None:
        qp = _per_batch("q_pos", q_pos, batch)
        keep.append(qp)
        desc.q_pos = _ptr(qp)
    if alibi_slopes is not None:
        slopes = _per_head("alibi_slopes", alibi_slopes, heads)
        keep.append(slopes)
        desc.alibi_slopes = _ptr(slopes)
    if sinks is not None:
        sk = _per_head("sinks", sinks, heads)
        keep.append(sk)
        desc.sinks = _ptr(sk)
    if softcap is not None:
        desc.softcap = float(softcap)  # the library checks it: > 0, or 0 for off
    if score_key == "additive":
        if additive is None or len(additive) != 3:
            raise ValueError('score="additive" needs additive=(W_q, W_k, w_v)')
        w_q, w_k, w_v = (_as_f32(n, a) for n, a in zip(("W_q", "W_k", "w_v"), additive))
        hidden = w_v.shape[0] if w_v.ndim == 1 else -1
        if hidden < 1:
            raise ValueError("w_v must be [hidden] with hidden >= 1, got %s" % list(w_v.shape))
        for n, w in (("W_q", w_q), ("W_k", w_k)):
            if w.shape != (hidden, d):
                raise ValueError("%s must be [hidden, D] = [%d, %d], got %s"
                                 % (n, hidden, d, list(w.shape)))
        keep += [w_q, w_k, w_v]
        desc.additive_hidden = hidden
        desc.additive_w_q, desc.additive_w_k, desc.additive_w_v = _ptr(w_q), _ptr(w_k), _ptr(w_v)
    elif additive is not None:
        raise ValueError('additive=(W_q, W_k, w_v) is only used with score="additive", '
                         "not %r" % (score,))
    if backend is not None:
        name = backend.encode() if isinstance(backend, str) else bytes(backend)
        keep.append(name)
        desc.backend = name
    return types.SimpleNamespace(
        desc=desc, keep=keep, q=q, q4=q4, k4=k4, v4=v4, wide=wide, batch=batch, heads=heads,
        kv_heads=kv_heads, lq=lq, lk=lk, d=d, dv=dv, kv_dtype=kv_dtype, score=score_key)


def attention(q, k, v, *, scale=None, causal=False, valid_lens=None, bias=None,
              score="dot", additive=None, window=None, alibi_slopes=None, softcap=None,
              sinks=None, q_pos=None, kv_start=None, kv_dtype=None, k_scales=None,
              v_scales=None, out=None, return_weights=False, return_lse=False, backend=None):
    """softmax(a(q, k) + mask) v with libqkv (qkv_attention).

    q: [Lq, D], [H, Lq, D] or [B, H, Lq, D]; k: the same rank with Hkv kv
    heads ([Lk, D], [Hkv, Lk, D], [B, Hkv, Lk, D]) where Hkv divides H (query
    head h reads kv head h // (H // Hkv)); v: like k with its own last dim Dv.
    B, Lq and Lk may be 0 (Lk 0: every row sees no key).

    Layouts: float32 q, k and v are read where they lie, any numpy view
    whose last dim is contiguous and whose other strides are non-negative
    multiples of 4 bytes, passed to the library as its strides, not copied:
    a token-major cache [B, Lk, Hkv, D] as cache.transpose(0, 2, 1, 3), the
    first Lk rows of a cache with spare capacity, np.broadcast_to of one
    cache over the batch (stride 0). Other views are copied.

    dtypes: float32 q, k, v give float32 results; if any of them is
    float64 (numpy's dtype for it: Python floats and lists of them count),
    out, weights and lse are float64 but computed in float32: the inputs
    are converted, the accuracy is float32's. Other real dtypes are
    converted to float32 and give float32 results.

    Low-precision K/V caches: kv_dtype "f16", "bf16" or "int8" (None or
    "f32": float32) has the library read k and v in that element type; q,
    out, weights and lse stay float32. Each of k and v is either a float
    array, quantized here with qkv.quantize_rows (int8: one scale per row),
    or an array already in the stored type, read where it lies (any view
    as for float32 above, strides in its own elements): np.float16 for
    "f16", np.uint16 holding the bfloat16 bits for "bf16", np.int8 for
    "int8" with k_scales and v_scales, float [..., Lk] (k's and v's shapes
    without the last dim): element = scale * int8 value. Scale views are
    read in place too (cache_scales[:, :Lk].transpose(0, 2, 1) for the
    scales of a token-major cache [B, capacity, Hkv]). Quantizing here or
    passing qkv.quantize_rows' arrays gives the same bits. Accuracy: that
    of float32 attention over the dequantized k and v (the quantization
    error itself comes on top). int8 needs finite values to quantize; f16
    turns |x| >= 65520 into inf (inf keys make NaN scores).

    Position of query i of batch b: p = q_pos[b] + i, or Lk - Lq + i
    without q_pos. Masks (a key is visible iff every one given allows it):
    causal: key j visible iff j <= p (bottom-right aligned without q_pos).
    valid_lens: [B] or [B, Lq] integers in [0, Lk]: j < valid length (a
        scalar is taken for every batch).
    window: (left, right): p - left <= j <= p + right; a side that is
        negative or None is unbounded. None: no window. Mistral's 4096
        window is (4095, 0).
    kv_start: [B] integers in [0, Lk] (an int: every batch): j >= kv_start[b],
        the keys of a left-padded batch before it are hidden from every
        query and head.
    bias: anything that broadcasts to [B, H, Lq, Lk] (-inf hides a key);
        broadcast dims cost no copy when the [Lq, Lk] block is dense float32.
    q_pos: [B] int32 positions of each batch's first query (an int: every
        batch; negative and past Lk allowed). A ragged batch: valid_lens
        with q_pos = valid_lens - Lq.

    Scores: score "dot" (scale * q.k), "gaussian" (-scale * |q - k|^2) or
    "additive" (w_v . tanh(W_q q + W_k k)) with additive=(W_q, W_k, w_v),
    W_q and W_k [hidden, D], w_v [hidden]. scale: None means 1/sqrt(D);
    0 gives uniform weights; Nadaraya-Watson is "gaussian" with 0.5. Then:
    softcap: None or 0 off; c > 0 replaces the score s by c * tanh(s / c)
        (Gemma 2), before bias and ALiBi.
    alibi_slopes: [H] (a number: every head) adds -slope[h] * |p - j|.
    sinks: [H] (a number: every head), a logit in each softmax denominator
        that carries no value (gpt-oss): weights_j = exp(s_j) / (exp(sink)
        + sum of exp(s) over the visible keys); -inf: no sink for that head.

    out: None, or an array of the result's shape (q's with the last dim Dv)
        to write into and return. A float32 view the library can address
        (as for q above) is written in place and only its elements are
        touched (the gaps of a strided view stay as they were); anything
        else is filled from a temporary. It must not overlap q, k or v.
    backend: None for the default (qkv.backend()), or a name from
        qkv.backends() to force one.

    Returns out; with return_weights and/or return_lse a tuple (out,
    weights), (out, lse) or (out, weights, lse): weights shaped like q with
    the last dim Lk (0 for hidden keys), lse shaped like q without its last
    dim, the natural log of the sum of exp of each row's visible scores and
    its sink (-inf for a row that sees no key and has no sink, whose out
    and weights are 0). (out, lse) of calls over disjoint key sets combine
    with qkv.merge into the result over all their keys.

    Errors: a bad shape or dtype raises ValueError or TypeError naming it
    (also: int8 k or v without their scales, scales of the wrong shape or
    with any other kv_dtype, an integer k or v that is not kv_dtype's type);
    a status other than QKV_OK raises QkvError with the library's sentence
    naming the field and its value (qkv_attention_explain), e.g. "softcap
    (-1) is negative": QKV_ERR_INVALID_ARGUMENT as QkvInvalidArgument (also
    a ValueError), QKV_ERR_UNSUPPORTED as QkvUnsupported (also a
    NotImplementedError). Nothing is written to out then.
    """
    c = _describe(q, k, v, scale, causal, valid_lens, bias, score, additive, window,
                  alibi_slopes, softcap, sinks, q_pos, kv_start, kv_dtype, k_scales, v_scales,
                  backend)
    desc, keep, q, q4, k4, v4 = c.desc, c.keep, c.q, c.q4, c.k4, c.v4
    wide, lk, dv = c.wide, c.lk, c.dv
    result_dtype = np.float64 if wide else np.float32
    shape = q.shape[:-1] + (dv,)
    if out is None:
        result = np.empty(shape, dtype=result_dtype)
    else:
        if not isinstance(out, np.ndarray):
            raise TypeError("out must be a numpy array, got %s" % type(out).__name__)
        if out.shape != shape:
            raise ValueError("out is %s but the result is %s (q's shape with the last dim Dv)"
                             % (list(out.shape), list(shape)))
        if out.dtype.kind != "f":
            raise TypeError("out must be a float array, got dtype %s" % out.dtype)
        if not out.flags.writeable:
            raise ValueError("out is read-only")
        result = out
    # target: what the library writes, result itself when it can address it.
    target, out_strides = None, None
    if result.dtype == np.float32:
        out_strides = _layout(_as_4d(result))
        if out_strides is not None:
            target = result
    if target is None:
        target, out_strides = np.empty(shape, dtype=np.float32), (0, 0, 0)
    desc.out_strides = _Strides(*out_strides)
    weights = np.empty(q.shape[:-1] + (lk,), dtype=np.float32) if return_weights else None
    lse = np.empty(q.shape[:-1], dtype=np.float32) if return_lse else None
    nbytes = _lib.qkv_attention_workspace_size(ctypes.byref(desc))
    workspace = np.empty(nbytes, dtype=np.uint8) if nbytes else None
    args = (ctypes.byref(desc), _ptr(q4), _ptr(k4), _ptr(v4), _ptr(target), _ptr(weights),
            _ptr(lse), _ptr(workspace), nbytes)
    status = _lib.qkv_attention(*args)
    if status != QKV_OK:
        raise _status_error(status, "qkv_attention", _explain(args))
    del keep, args
    if target is not result:
        np.copyto(result, target)
    if wide:
        weights = None if weights is None else weights.astype(np.float64)
        lse = None if lse is None else lse.astype(np.float64)
    if not (return_weights or return_lse):
        return result
    return (result,) + ((weights,) if return_weights else ()) + ((lse,) if return_lse else ())


def attention_backward(q, k, v, out, lse, d_out, *, scale=None, causal=False, valid_lens=None,
                       bias=None, score="dot", additive=None, window=None, alibi_slopes=None,
                       softcap=None, sinks=None, q_pos=None, kv_start=None, kv_dtype=None,
                       k_scales=None, v_scales=None, backend=None, wrt="qkv"):
    """Gradients of attention() (qkv_attention_backward_f32): (d_q, d_k, d_v).

        out, lse = qkv.attention(q, k, v, causal=True, return_lse=True)
        d_out = ...                                    # dLoss/d(out), out's shape
        d_q, d_k, d_v = qkv.attention_backward(q, k, v, out, lse, d_out, causal=True)

    q, k, v and the options are those of the attention() call that gave out
    and lse (its return_lse=True result), with the same meaning and shapes:
    [Lq, D], [H, Lq, D] or [B, H, Lq, D] and the like for k and v. out and
    d_out are out's shape (q's with the last dim Dv), lse q's shape without
    the last dim. The library reuses out and lse instead of recomputing the
    forward pass: they must be what attention() returned for these inputs
    and options, or the gradients mean nothing.

    Returns float32 arrays d_q, d_k, d_v shaped like q, k and v, the
    derivatives of Loss with respect to them, new arrays, whatever the
    input dtypes (float64 included: all of it runs in float32). wrt names
    the ones to compute, any of "q", "k", "v" ("qkv": all, "kv": d_k and
    d_v); the others are returned as None and cost nothing. d_k and d_v
    sum over the query heads that share a kv head (GQA); keys that no query
    sees get 0, and a query that sees no key gets d_q 0. bias,
    alibi_slopes and sinks are constants: they get no gradient.

    Every score and mask of attention() but one: score "dot" and
    "gaussian" with causal, valid_lens, bias, window, kv_start, q_pos,
    alibi_slopes, softcap and sinks, GQA. score="additive" and any kv_dtype
    but None or "f32" raise QkvUnsupported (also a NotImplementedError):
    there is no backward pass for them. Inputs of any real dtype and any
    strides are made dense float32 copies (one each, as needed). Accuracy:
    each gradient within 1e-3 of the largest magnitude of the exact
    gradient of the attention the forward computed.

    Errors: a bad shape or dtype raises ValueError or TypeError naming it;
    a status other than QKV_OK raises QkvError as attention() does, with
    qkv_attention_backward_explain's sentence naming the field and its
    value. qkv.torch.attention wraps this pair as a torch.autograd.Function.
    """
    if not hasattr(_lib, "qkv_attention_backward_f32"):
        raise RuntimeError("qkv.attention_backward: %s does not export "
                           "qkv_attention_backward_f32; rebuild or reinstall libqkv"
                           % library_path)
    which = set(wrt)
    if not which <= set("qkv"):
        raise ValueError('wrt must name any of "q", "k" and "v" (e.g. "qkv", "kv"), got %r'
                         % (wrt,))
    if kv_dtype is not None and kv_dtype != "f32":
        if not isinstance(kv_dtype, str) or kv_dtype not in _QUANTIZED:
            raise ValueError('kv_dtype must be None, "f32", "f16", "bf16" or "int8", got %r'
                             % (kv_dtype,))
        raise _status_error(QKV_ERR_UNSUPPORTED, "qkv_attention_backward_f32",
                            "kv_dtype %r: the backward pass reads float32 k and v only"
                            % (kv_dtype,))
    q, k, v = _as_f32("q", q), _as_f32("k", k), _as_f32("v", v)
    c = _describe(q, k, v, scale, causal, valid_lens, bias, score, additive, window,
                  alibi_slopes, softcap, sinks, q_pos, kv_start, kv_dtype, k_scales, v_scales,
                  backend)
    out, lse, d_out = _as_f32("out", out), _as_f32("lse", lse), _as_f32("d_out", d_out)
    out_shape = q.shape[:-1] + (c.dv,)
    for name, a, want, what in (("out", out, out_shape, "q's shape with the last dim Dv"),
                                ("d_out", d_out, out_shape, "out's shape"),
                                ("lse", lse, q.shape[:-1], "q's shape without the last dim")):
        if a.shape != want:
            raise ValueError("%s is %s but must be %s, %s" % (name, list(a.shape), what,
                                                              list(want)))
    d_q = np.empty(q.shape, dtype=np.float32) if "q" in which else None
    d_k = np.empty(k.shape, dtype=np.float32) if "k" in which else None
    d_v = np.empty(v.shape, dtype=np.float32) if "v" in which else None
    desc = c.desc
    nbytes = _lib.qkv_attention_backward_workspace_size(ctypes.byref(desc))
    workspace = np.empty(nbytes, dtype=np.uint8) if nbytes else None
    args = (ctypes.byref(desc), _ptr(c.q4), _ptr(c.k4), _ptr(c.v4), _ptr(out), _ptr(lse),
            _ptr(d_out), _ptr(d_q), _ptr(d_k), _ptr(d_v), _ptr(workspace), nbytes)
    status = _lib.qkv_attention_backward_f32(*args)
    if status != QKV_OK:
        raise _status_error(status, "qkv_attention_backward_f32", _backward_explain(args))
    del args
    return d_q, d_k, d_v


def _backward_explain(args):
    """qkv_attention_backward_explain's sentence for the arguments of a call."""
    message = ctypes.create_string_buffer(512)
    _lib.qkv_attention_backward_explain(*args, message, len(message))
    return message.value.decode(errors="replace")


# --------------------------------------------------------------------------
# merge()
# --------------------------------------------------------------------------

def merge(out_a, lse_a, out_b, lse_b):
    """Combine two partial attention results: qkv_attention_merge_f32.

    (out_a, lse_a) and (out_b, lse_b) are attention results for the same
    queries over two disjoint sets of keys, e.g. qkv.attention(q, k_x, v_x,
    return_lse=True) for two shards x of the keys and values. Returns a new
    pair (out, lse), the result over the union of the keys (within
    qkv.attention's accuracy bound of one call over all of them):

        lse = log(exp(lse_a) + exp(lse_b))
        out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b

    out_a and out_b: [..., Dv], one shape; lse_a and lse_b: [...], their
    leading shape (what qkv.attention returns: out [B, H, Lq, Dv] with lse
    [B, H, Lq], or [Lq, Dv] with [Lq]). Any number of leading dims, also
    none (out [Dv], lse a scalar).

    Bitwise commutative: merge(a, b) and merge(b, a) have the same bits. A
    side with lse -inf (it saw no key) gives the other side's bits
    unchanged; both -inf give out 0 and lse -inf. Not associative in
    rounding: merging shards in a fixed order gives fixed bits.

    The inputs are not modified. Input of any real dtype and any strides is
    converted to dense float32 and merged in float32; out and lse are
    float32, or float64 when any of the four inputs is float64 (numpy's
    dtype for it: Python floats and lists of them count). A bad shape
    raises ValueError naming it; a status other than QKV_OK raises QkvError
    with qkv_status_string's text.
    """
    if not hasattr(_lib, "qkv_attention_merge_f32"):
        raise RuntimeError("qkv.merge: %s does not export qkv_attention_merge_f32; "
                           "rebuild or reinstall libqkv" % library_path)
    wide = any(np.asarray(x).dtype == np.float64 for x in (out_a, lse_a, out_b, lse_b))
    oa = _dense_f32("out_a", out_a)
    la = _dense_f32("lse_a", lse_a)
    # b is merged in place: always a fresh array, never the caller's.
    ob = _f32_copy("out_b", out_b)
    lb = _f32_copy("lse_b", lse_b)
    if oa.ndim < 1:
        raise ValueError("out_a must be [..., Dv] with at least one dim, got a scalar")
    if ob.shape != oa.shape:
        raise ValueError("out_a is %s but out_b is %s: the two outs need one shape [..., Dv]"
                         % (list(oa.shape), list(ob.shape)))
    lead = oa.shape[:-1]
    for name, a in (("lse_a", la), ("lse_b", lb)):
        if a.shape != lead:
            raise ValueError("%s is %s but the outs are %s: lse must be the outs' shape "
                             "without the last dim, %s" % (name, list(a.shape), list(oa.shape),
                                                           list(lead)))
    dv = oa.shape[-1]
    if dv < 1:
        raise ValueError("the outs %s have an empty last dim: Dv must be >= 1"
                         % list(oa.shape))
    rows = int(np.prod(lead, dtype=np.int64))
    status = _lib.qkv_attention_merge_f32(rows, dv, _ptr(oa), _ptr(la), _ptr(ob), _ptr(lb))
    if status != QKV_OK:
        raise _status_error(status, "qkv_attention_merge_f32")
    if wide:
        return ob.astype(np.float64), lb.astype(np.float64)
    return ob, lb


def quantize_rows(x, dtype):
    """Convert float rows to a K/V cache's element type: qkv_quantize_rows.

    x: [..., n] of any real dtype (converted to float32 first). dtype:
    "f32" (a copy), "f16" (np.float16, round to nearest even), "bf16"
    (np.uint16 holding bfloat16 bits, round to nearest even) or "int8".
    Returns (q, scales): q of x's shape in that type; scales None, or for
    "int8" float32 [...] (x's shape without the last dim) with
    scales = max|row| / 127 and q = nearest(row / scale) in [-127, 127], so
    that row ~ scale * q. Non-finite values with "int8" raise
    QkvInvalidArgument. These are the arrays qkv.attention(q, k, v,
    kv_dtype=dtype, k_scales=..., v_scales=...) reads as a K/V cache.
    """
    if not isinstance(dtype, str) or dtype not in _QUANTIZED:
        raise ValueError("dtype must be one of %s, got %r" % (sorted(_QUANTIZED), dtype))
    src = _dense_f32("x", x)
    if src.ndim < 1:
        raise ValueError("x must be [..., n] with at least one dim, got a scalar")
    return _quantize(src, dtype, "int8 needs finite values")


def _quantize(src, dtype, int8_detail):
    """qkv_quantize_rows over the rows of a dense float32 array: (q, scales)."""
    code, out_type = _QUANTIZED[dtype]
    n = src.shape[-1]
    rows = int(np.prod(src.shape[:-1], dtype=np.int64))
    q = np.empty(src.shape, dtype=out_type)
    scales = np.empty(src.shape[:-1], dtype=np.float32) if dtype == "int8" else None
    status = _lib.qkv_quantize_rows(code, rows, n, _ptr(src) if src.size else None, 0,
                                    _ptr(q) if q.size else None, 0,
                                    _ptr(scales) if scales is not None else None)
    if status != QKV_OK:
        raise _status_error(status, "qkv_quantize_rows",
                            int8_detail if dtype == "int8" else None)
    return q, scales


# --------------------------------------------------------------------------
# show_heatmaps()
# --------------------------------------------------------------------------

def show_heatmaps(matrices, xlabel, ylabel, titles=None, figsize=(2.5, 2.5), cmap="Reds",
                  path=None):
    """Heatmaps of attention weights, the d2l diagnostic (queries x keys).

    matrices: [rows, cols, Lq, Lk] (also [cols, Lq, Lk] for one row, or
    [Lq, Lk]); a grid of rows x cols panels sharing their axes, one colorbar
    for all on a common color scale, xlabel under the bottom row, ylabel on
    the left column, titles[j] over column j. With path, the figure is saved
    there (PNG, SVG, PDF by the extension) with the Agg renderer, no display
    needed; without it, pyplot shows it. Returns the matplotlib Figure.
    """
    m = np.asarray(matrices, dtype=np.float64)
    if m.ndim == 2:
        m = m[None, None]
    elif m.ndim == 3:
        m = m[None]
    if m.ndim != 4:
        raise ValueError("matrices must be [rows, cols, Lq, Lk], got %d dims" % np.ndim(matrices))
    num_rows, num_cols = m.shape[:2]
    if titles is not None and len(titles) < num_cols:
        raise ValueError("titles has %d entries for %d columns" % (len(titles), num_cols))
    finite = m[np.isfinite(m)]
    vmin = float(finite.min()) if finite.size else 0.0
    vmax = float(finite.max()) if finite.size else 1.0
    if path is None:
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=figsize)
    else:
        # A bare Figure draws with Agg (or the SVG/PDF backends by extension)
        # and leaves pyplot's global state and the display alone.
        from matplotlib.figure import Figure

        fig = Figure(figsize=figsize)
    axes = fig.subplots(num_rows, num_cols, sharex=True, sharey=True, squeeze=False)
    from matplotlib.ticker import MaxNLocator

    pcm = None
    for i, (row_axes, row_matrices) in enumerate(zip(axes, m)):
        for j, (ax, matrix) in enumerate(zip(row_axes, row_matrices)):
            pcm = ax.imshow(matrix, cmap=cmap, vmin=vmin, vmax=vmax)
            ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))  # rows and
            ax.yaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))  # columns
            if i == num_rows - 1:
                ax.set_xlabel(xlabel)
            if j == 0:
                ax.set_ylabel(ylabel)
            if titles:
                ax.set_title(titles[j])
    fig.colorbar(pcm, ax=axes.ravel().tolist(), shrink=0.6)
    if path is None:
        import matplotlib.pyplot as plt

        plt.show()
    else:
        fig.savefig(os.fspath(path), dpi=150, bbox_inches="tight")
    return fig
