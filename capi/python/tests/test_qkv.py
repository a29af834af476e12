"""Tests of the qkv Python binding against a float64 numpy reference.

Run with Debian's python3 (python3-numpy, python3-matplotlib), the package
from the source tree and the library from a build:

    cd capi/python/tests
    QKV_LIBRARY=../../../build/libqkv.so.0 PYTHONPATH=.. /usr/bin/python3 -m unittest -v test_qkv

(CTest runs it as python_binding.)
"""

import ctypes
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

import qkv

try:
    import matplotlib  # noqa: F401

    HAVE_MATPLOTLIB = True
except ImportError:
    HAVE_MATPLOTLIB = False

PACKAGE_DIR = os.path.dirname(os.path.abspath(qkv.__file__))
INCLUDE_DIR = os.path.normpath(os.path.join(PACKAGE_DIR, "..", "..", "..", "include"))

# The contract's accuracy: out within 5e-5 * max|v|, weights within 2e-5.
OUT_TOL = 5e-5
WEIGHTS_TOL = 2e-5
# lse (log of the sum of exp of the scores): relative to max(1, |lse|).
LSE_TOL = 2e-5


def as4(a):
    a = np.asarray(a, dtype=np.float64)
    return a.reshape((1,) * (4 - a.ndim) + a.shape)


def reference(q, k, v, scale=None, causal=False, valid_lens=None, bias=None, score="dot",
              additive=None, window=None, alibi_slopes=None, softcap=None, sinks=None,
              q_pos=None, kv_start=None, with_lse=False):
    """Attention in float64, written from the README's and qkv.h's semantics.

    Returns (out, weights), or (out, weights, lse) with with_lse: lse is
    log(exp(sink) + sum_j exp(s_j)) over each row's visible keys, -inf if
    it has none and no sink. The per-head and scalar parameters are rounded
    to float32 first, as the library receives them.
    """
    shape = np.shape(q)
    q, k, v = as4(q), as4(k), as4(v)
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    group = h // hkv
    k = np.repeat(k, group, axis=1)  # query head i reads kv head i // group
    v = np.repeat(v, group, axis=1)
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    scale = float(np.float32(scale))
    if score == "dot":
        s = scale * np.einsum("bhid,bhjd->bhij", q, k)
    elif score == "gaussian":
        diff = q[:, :, :, None, :] - k[:, :, None, :, :]
        s = -scale * np.sum(diff * diff, axis=-1)
    else:
        w_q, w_k, w_v = (np.asarray(a, dtype=np.float64) for a in additive)
        qp = q @ w_q.T
        kp = k @ w_k.T
        s = np.tanh(qp[:, :, :, None, :] + kp[:, :, None, :, :]) @ w_v
    s = s.reshape(b, h, lq, lk)
    if softcap:
        c = float(np.float32(softcap))
        s = c * np.tanh(s / c)
    # positions: p[b, i] = q_pos[b] + i, or lk - lq + i
    first = (np.full(b, lk - lq) if q_pos is None
             else np.broadcast_to(np.asarray(q_pos, dtype=np.int64), (b,)))
    pos = (first[:, None] + np.arange(lq)[None, :])[:, None, :, None]  # [b, 1, lq, 1]
    key = np.arange(lk)[None, None, None, :]
    visible = np.ones((b, h, lq, lk), dtype=bool)
    if causal:
        visible &= key <= pos
    if valid_lens is not None:
        vl = np.asarray(valid_lens)
        if vl.ndim == 0:
            vl = np.full((b,), vl)
        if vl.ndim == 1:
            vl = np.repeat(vl[:, None], lq, axis=1)
        visible &= key < vl[:, None, :, None]
    if window is not None:
        left, right = window
        if left is not None and left >= 0:
            visible &= key >= pos - left
        if right is not None and right >= 0:
            visible &= key <= pos + right
    if kv_start is not None:
        ks = np.broadcast_to(np.asarray(kv_start), (b,))
        visible &= key >= ks[:, None, None, None]
    if bias is not None:
        full = np.broadcast_to(as4(bias), s.shape)
        visible &= full != -np.inf
        s = s + np.where(np.isfinite(full), full, 0.0)
    if alibi_slopes is not None:
        slopes = np.broadcast_to(np.float32(alibi_slopes).astype(np.float64), (h,))
        s = s - slopes[None, :, None, None] * np.abs(pos - key)
    sink = np.full(h, -np.inf)
    if sinks is not None:
        sink = np.broadcast_to(np.float32(sinks).astype(np.float64), (h,))
    sink = np.broadcast_to(sink[None, :, None, None], (b, h, lq, 1))
    s = np.where(visible, s, -np.inf)
    m = np.maximum(np.max(s, axis=-1, keepdims=True, initial=-np.inf), sink)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(visible, np.exp(s - m), 0.0)
    den = e.sum(axis=-1, keepdims=True) + np.exp(sink - m)
    w = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
    out = w @ v
    result = (out.reshape(shape[:-1] + (v.shape[-1],)), w.reshape(shape[:-1] + (lk,)))
    if with_lse:
        with np.errstate(divide="ignore"):  # log(0) = -inf for a row that sees nothing
            lse = np.where(den[..., 0] > 0, m[..., 0] + np.log(den[..., 0]), -np.inf)
        result += (lse.reshape(shape[:-1]),)
    return result


class Case(unittest.TestCase):
    rng = np.random.default_rng(20240601)

    def randn(self, *shape):
        return self.rng.standard_normal(shape).astype(np.float32)

    def assertLseClose(self, lse, want, what):
        want = np.asarray(want, dtype=np.float64)
        self.assertTrue(np.array_equal(np.isneginf(lse), np.isneginf(want)),
                        "%s: -inf rows differ" % what)
        fin = np.isfinite(want)
        self.assertTrue(np.all(np.isfinite(lse[fin])), what)
        err = np.abs(lse[fin] - want[fin]) / np.maximum(1.0, np.abs(want[fin]))
        self.assertLessEqual(float(err.max(initial=0.0)), LSE_TOL,
                             "%s: lse off by %g (relative)" % (what, float(err.max(initial=0.0))))

    def assertOutClose(self, out, want, v, what="out"):
        vmax = max(float(np.max(np.abs(v), initial=0.0)), 1e-30)
        err = float(np.max(np.abs(out - want), initial=0.0))
        self.assertLessEqual(err, OUT_TOL * vmax, "%s off by %g (max|v| %g)" % (what, err, vmax))

    def check(self, q, k, v, backend=None, **kw):
        """qkv.attention against reference(): out, weights and lse; returns (out, weights)."""
        out, w, lse = qkv.attention(q, k, v, return_weights=True, return_lse=True,
                                    backend=backend, **kw)
        self.assertAgrees((out, w, lse), reference(q, k, v, with_lse=True, **kw), v)
        return out, w

    def assertAgrees(self, got, want, v):
        """(out, weights, lse) of qkv.attention against reference()'s, v the values."""
        out, w, lse = got
        want_out, want_w, want_lse = want
        self.assertEqual((out.dtype, w.dtype, lse.dtype), (np.float32,) * 3)
        self.assertEqual(out.shape, want_out.shape)
        self.assertEqual(w.shape, want_w.shape)
        self.assertEqual(lse.shape, want_lse.shape)
        self.assertTrue(np.all(np.isfinite(out)) and np.all(np.isfinite(w)))
        err_w = float(np.max(np.abs(w - want_w), initial=0.0))
        self.assertLessEqual(err_w, WEIGHTS_TOL, "weights off by %g" % err_w)
        self.assertOutClose(out, want_out, v)
        self.assertLseClose(lse, want_lse, "lse")


class TestInfo(Case):
    def test_version_and_backends(self):
        self.assertRegex(qkv.version(), r"^0\.\d+\.\d+$")
        self.assertEqual(qkv.__version__, qkv.version())
        names = qkv.backends()
        self.assertGreaterEqual(len(names), 1)
        self.assertIn("reference", names)
        self.assertEqual(qkv.backend(), names[0])
        self.assertTrue(os.path.exists(qkv.library_path))

    def test_status_strings(self):
        self.assertEqual(qkv.status_string(0), "ok")
        for s in (1, 2, 3, 99):
            self.assertTrue(qkv.status_string(s))

    def test_struct_mirrors_the_header(self):
        """ctypes' layout of qkv_attention_desc equals a C compiler's."""
        cc = shutil.which("cc") or shutil.which("gcc")
        header = os.path.join(INCLUDE_DIR, "qkv", "qkv.h")
        if not cc or not os.path.exists(header):
            self.skipTest("no C compiler or no include/qkv/qkv.h next to the package")
        fields = [name for name, _ in qkv._Desc._fields_]
        src = ["#include <stddef.h>", "#include <stdio.h>", "#include <qkv/qkv.h>",
               "int main(void) {",
               '  printf("%zu\\n", sizeof(qkv_attention_desc));']
        src += ['  printf("%%zu\\n", offsetof(qkv_attention_desc, %s));' % f for f in fields]
        src += ["  return 0;", "}"]
        with tempfile.TemporaryDirectory() as tmp:
            c = os.path.join(tmp, "layout.c")
            exe = os.path.join(tmp, "layout")
            with open(c, "w") as f:
                f.write("\n".join(src) + "\n")
            subprocess.run([cc, "-std=c99", "-I", INCLUDE_DIR, c, "-o", exe], check=True)
            got = [int(x) for x in subprocess.run([exe], check=True, capture_output=True,
                                                   text=True).stdout.split()]
        # A header that grew past the binding is fine (the binding is then an
        # older caller, its struct_size a prefix); the mirrored fields must sit
        # where the compiler puts them.
        self.assertGreaterEqual(got[0], ctypes.sizeof(qkv._Desc), "sizeof(qkv_attention_desc)")
        for name, off in zip(fields, got[1:]):
            self.assertEqual(off, getattr(qkv._Desc, name).offset, "offsetof(%s)" % name)
        # every 0.2 field is mirrored, and so is qkv_strides
        for name in ("kv_dtype", "q_strides", "out_strides", "v_scale_strides", "window_left",
                     "alibi_slopes", "softcap", "q_pos", "sinks", "kv_start"):
            self.assertIn(name, fields)
        self.assertEqual(ctypes.sizeof(qkv._Strides), 24)
        self.assertEqual([n for n, _ in qkv._Strides._fields_], ["batch", "head", "token"])

    def test_sized_initializer_writes_the_bindings_struct(self):
        # The binding's descriptor comes from qkv_attention_desc_init_sized with
        # its own ctypes size: exactly that many bytes written, defaults set.
        size = ctypes.sizeof(qkv._Desc)
        buf = (ctypes.c_ubyte * (size + 32))(*([0xA5] * (size + 32)))
        desc = qkv._Desc.from_buffer(buf)
        qkv._lib.qkv_attention_desc_init_sized(ctypes.byref(desc), size, 1, 4, 2, 3, 5, 16, 8)
        self.assertEqual(desc.struct_size, size)
        self.assertEqual((desc.q_heads, desc.kv_heads, desc.head_dim, desc.value_dim), (4, 2, 16, 8))
        self.assertAlmostEqual(desc.scale, 0.25)
        self.assertEqual(list(buf[size:]), [0xA5] * 32)


class TestAgainstNumpy(Case):
    def random_case(self, score):
        b = int(self.rng.integers(1, 4))
        hkv = int(self.rng.integers(1, 4))
        h = hkv * int(self.rng.integers(1, 4))
        lq = int(self.rng.integers(1, 21))
        lk = int(self.rng.integers(1, 41))
        d = int(self.rng.integers(1, 71))
        dv = int(self.rng.integers(1, 41))
        q, k, v = self.randn(b, h, lq, d), self.randn(b, hkv, lk, d), self.randn(b, hkv, lk, dv)
        kw = {"score": score}
        if score == "gaussian":
            kw["scale"] = float(self.rng.uniform(0.05, 1.0))
        elif score == "additive":
            hidden = int(self.rng.integers(1, 17))
            kw["additive"] = (self.randn(hidden, d), self.randn(hidden, d), self.randn(hidden))
        elif self.rng.random() < 0.3:
            kw["scale"] = float(self.rng.uniform(0.0, 1.0))
        if self.rng.random() < 0.5:
            kw["causal"] = True
        r = self.rng.random()
        if r < 0.25:
            kw["valid_lens"] = self.rng.integers(0, lk + 1, size=b)
        elif r < 0.5:
            kw["valid_lens"] = self.rng.integers(0, lk + 1, size=(b, lq))
        if self.rng.random() < 0.4:
            shape = [b, h, lq, lk]
            for axis in range(4):
                if self.rng.random() < 0.4:
                    shape[axis] = 1
            bias = self.randn(*shape)
            bias[self.rng.random(bias.shape) < 0.1] = -np.inf
            kw["bias"] = bias
        return q, k, v, kw

    def test_random_shapes_every_backend_every_score(self):
        for backend in qkv.backends():
            for score in ("dot", "gaussian", "additive"):
                for n in range(12):
                    q, k, v, kw = self.random_case(score)
                    desc = {key: (val if np.ndim(val) == 0 else np.shape(val))
                            for key, val in kw.items() if key not in ("additive", "score")}
                    with self.subTest(backend=backend, score=score, n=n, q=q.shape, k=k.shape,
                                      v=v.shape, **{k_: str(v_) for k_, v_ in desc.items()}):
                        try:
                            self.check(q, k, v, backend=backend, **kw)
                        except qkv.QkvError as e:
                            # A backend may decline a score kind, never DOT.
                            self.assertEqual(e.status, qkv.QKV_ERR_UNSUPPORTED)
                            self.assertNotEqual(score, "dot")

    def test_every_mask_alone_and_combined(self):
        b, h, hkv, lq, lk, d = 2, 4, 2, 5, 9, 16
        q, k, v = self.randn(b, h, lq, d), self.randn(b, hkv, lk, d), self.randn(b, hkv, lk, d)
        bias = self.randn(b, h, lq, lk)
        masks = {
            "none": {},
            "causal": {"causal": True},
            "valid_lens": {"valid_lens": [3, 9]},
            "valid_lens_per_query": {"valid_lens": [[0, 1, 2, 3, 4], [9, 8, 7, 6, 5]]},
            "valid_lens_scalar": {"valid_lens": 4},
            "bias": {"bias": bias},
            "causal+valid_lens": {"causal": True, "valid_lens": [2, 7]},
            "causal+bias": {"causal": True, "bias": bias},
            "all": {"causal": True, "valid_lens": [[1, 2, 3, 4, 5], [6, 7, 8, 9, 9]],
                    "bias": bias},
        }
        for backend in qkv.backends():
            for name, kw in masks.items():
                with self.subTest(backend=backend, mask=name):
                    self.check(q, k, v, backend=backend, **kw)

    def test_causal_is_bottom_right_aligned(self):
        q, k, v = self.randn(3, 8), self.randn(7, 8), self.randn(7, 4)
        _, w = self.check(q, k, v, causal=True)
        # query i sees keys 0 .. i + 4
        for i in range(3):
            self.assertTrue(np.all(w[i, i + 5:] == 0))
            self.assertTrue(np.all(w[i, :i + 5] > 0))

    def test_rows_that_see_nothing_are_zero(self):
        q, k, v = self.randn(2, 1, 3, 4), self.randn(2, 1, 5, 4), self.randn(2, 1, 5, 4)
        out, w = self.check(q, k, v, valid_lens=[0, 5])
        self.assertTrue(np.all(out[0] == 0) and np.all(w[0] == 0))
        bias = np.zeros((3, 5), np.float32)
        bias[1] = -np.inf
        out, w = self.check(q, k, v, bias=bias)
        self.assertTrue(np.all(out[:, :, 1] == 0) and np.all(w[:, :, 1] == 0))

    def test_gqa_and_mqa(self):
        for hkv in (1, 2, 4, 8):
            q = self.randn(2, 8, 6, 32)
            k, v = self.randn(2, hkv, 11, 32), self.randn(2, hkv, 11, 24)
            with self.subTest(kv_heads=hkv):
                out, _ = self.check(q, k, v, causal=True)
                # the same as repeating each kv head over its group of query heads
                rep = 8 // hkv
                full = qkv.attention(q, np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1),
                                     causal=True, backend="reference")
                np.testing.assert_allclose(out, full, atol=OUT_TOL * np.abs(v).max())

    def test_ranks_and_output_shapes(self):
        q, k, v = self.randn(5, 8), self.randn(7, 8), self.randn(7, 3)
        out = qkv.attention(q, k, v)
        self.assertEqual(out.shape, (5, 3))
        out, w = self.check(q, k, v)
        self.assertEqual(w.shape, (5, 7))
        q, k, v = self.randn(4, 5, 8), self.randn(2, 7, 8), self.randn(2, 7, 3)
        out, w = self.check(q, k, v, causal=True)
        self.assertEqual((out.shape, w.shape), ((4, 5, 3), (4, 5, 7)))
        out3 = qkv.attention(q, k, v, causal=True)
        out4 = qkv.attention(q[None], k[None], v[None], causal=True)
        np.testing.assert_array_equal(out3, out4[0])

    def test_every_score_kind(self):
        q, k, v = self.randn(2, 4, 6, 8), self.randn(2, 2, 10, 8), self.randn(2, 2, 10, 5)
        self.check(q, k, v, score="dot")
        self.check(q, k, v, score="gaussian", scale=0.5)
        add = (self.randn(7, 8), self.randn(7, 8), self.randn(7))
        self.check(q, k, v, score="additive", additive=add)
        self.check(q, k, v, score="additive", additive=add, causal=True, valid_lens=[4, 10])

    def test_scale(self):
        q, k, v = self.randn(4, 16), self.randn(6, 16), self.randn(6, 2)
        a = qkv.attention(q, k, v)
        b = qkv.attention(q, k, v, scale=0.25)  # 1/sqrt(16)
        np.testing.assert_array_equal(a, b)
        out, w = self.check(q, k, v, scale=0.0)  # average pooling
        np.testing.assert_allclose(w, np.full((4, 6), 1 / 6), atol=WEIGHTS_TOL)
        self.check(q * 100, k * 100, v, scale=1.0)  # saturated logits: no overflow

    def test_nadaraya_watson_is_the_gaussian_score(self):
        x_train = np.sort(self.rng.uniform(0, 5, 50)).astype(np.float32)
        y_train = (2 * np.sin(x_train) + x_train ** 0.8).astype(np.float32)
        x_test = np.arange(0, 5, 0.1, dtype=np.float32)
        y_hat, w = qkv.attention(x_test[:, None], x_train[:, None], y_train[:, None],
                                 score="gaussian", scale=0.5, return_weights=True)
        diff = x_test[:, None].astype(np.float64) - x_train[None, :]
        want = np.exp(-diff ** 2 / 2)
        want /= want.sum(1, keepdims=True)
        np.testing.assert_allclose(w, want, atol=WEIGHTS_TOL)
        np.testing.assert_allclose(y_hat[:, 0], want @ y_train, atol=OUT_TOL * y_train.max())


class TestConversion(Case):
    def test_float64_and_strided_input_are_converted(self):
        q, k, v = self.randn(2, 3, 6, 8), self.randn(2, 1, 9, 8), self.randn(2, 1, 9, 4)
        base = qkv.attention(q, k, v, causal=True)
        out = qkv.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                            causal=True)
        self.assertEqual(out.dtype, np.float64)  # float64 in, float64 out, computed in float32
        np.testing.assert_array_equal(out, base)
        qt = np.ascontiguousarray(np.swapaxes(q, 2, 3)).swapaxes(2, 3)  # a transposed view
        self.assertFalse(qt.flags.c_contiguous)
        wide = np.zeros((2, 1, 9, 12), np.float32)
        wide[..., ::3] = v  # every third column: a strided view
        np.testing.assert_array_equal(qkv.attention(qt, k[:, :, ::-1][:, :, ::-1], wide[..., ::3],
                                                    causal=True), base)
        ints = qkv.attention(np.ones((2, 4), np.int64), np.ones((3, 4), np.int32),
                             np.arange(6).reshape(3, 2))
        np.testing.assert_allclose(ints, [[2, 3], [2, 3]], atol=1e-5)

    def test_lists_are_accepted(self):
        x = [[0.9, 0.1], [0.2, 0.8], [0.1, 0.9], [0.8, 0.2]]
        out = qkv.attention(x, x, x)
        np.testing.assert_allclose(out[1], [0.44735, 0.55265], atol=1e-4)

    def test_bias_broadcasting(self):
        b, h, lq, lk = 2, 3, 4, 5
        q, k, v = self.randn(b, h, lq, 8), self.randn(b, h, lk, 8), self.randn(b, h, lk, 8)
        shapes = [(lk,), (lq, lk), (1, lq, lk), (h, lq, lk), (b, 1, lq, lk), (1, h, lq, lk),
                  (b, h, lq, lk), (b, h, 1, lk), (b, 1, lq, 1), (1, 1, 1, 1), ()]
        for shape in shapes:
            with self.subTest(bias=shape):
                self.check(q, k, v, bias=self.randn(*shape))
        full = self.randn(b, h, lq, lk)
        with self.subTest(bias="float64"):
            self.check(q, k, v, bias=full.astype(np.float64))
        with self.subTest(bias="transposed view"):
            self.check(q, k, v, bias=np.swapaxes(np.ascontiguousarray(np.swapaxes(full, 2, 3)), 2, 3))
        with self.subTest(bias="batch-major view"):
            self.check(q, k, v, bias=np.ascontiguousarray(np.swapaxes(full, 0, 1)).swapaxes(0, 1))
        with self.subTest(bias="broadcast_to"):
            self.check(q, k, v, bias=np.broadcast_to(full[:1], full.shape))

    def test_bias_broadcast_dims_are_not_copied(self):
        b, h, lq, lk = 2, 3, 4, 5
        cases = {
            (lq, lk): (0, 0),
            (1, h, lq, lk): (0, lq * lk),
            (b, 1, lq, lk): (lq * lk, 0),
            (b, h, lq, lk): (h * lq * lk, lq * lk),
        }
        for shape, strides in cases.items():
            bias = self.randn(*shape)
            arr, bs, hs = qkv._bias_layout(bias, b, h, lq, lk)
            self.assertTrue(np.shares_memory(arr, bias), shape)
            self.assertEqual((bs, hs), strides, shape)
        # the batch-major view of a [H, B, Lq, Lk] array: used in place
        hb = self.randn(h, b, lq, lk)
        arr, bs, hs = qkv._bias_layout(hb.swapaxes(0, 1), b, h, lq, lk)
        self.assertTrue(np.shares_memory(arr, hb))
        self.assertEqual((bs, hs), (lq * lk, b * lq * lk))
        # a per-key bias has to be materialized, over [Lq, Lk] only
        arr, bs, hs = qkv._bias_layout(self.randn(lk), b, h, lq, lk)
        self.assertEqual((arr.shape, bs, hs), ((1, 1, lq, lk), 0, 0))


class Recorder:
    """The real library, but qkv_attention records what it was handed:
    the descriptor's strides and the data pointers."""

    def __init__(self, real):
        self.real = real
        self.calls = []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def qkv_attention(self, desc_ref, q, k, v, out, weights, lse, ws, nbytes):
        desc = desc_ref._obj
        self.calls.append({
            "q": q, "k": k, "v": v, "out": out,
            "q_strides": strides_of(desc.q_strides), "k_strides": strides_of(desc.k_strides),
            "v_strides": strides_of(desc.v_strides), "out_strides": strides_of(desc.out_strides),
            "mask": desc.mask, "kv_dtype": desc.kv_dtype,
            "k_scales": desc.k_scales, "v_scales": desc.v_scales,
            "k_scale_strides": strides_of(desc.k_scale_strides),
            "v_scale_strides": strides_of(desc.v_scale_strides),
        })
        return self.real.qkv_attention(desc_ref, q, k, v, out, weights, lse, ws, nbytes)


def strides_of(s):
    return (s.batch, s.head, s.token)


def recorded(fn):
    """Runs fn() with qkv's library wrapped in a Recorder; returns (fn(), calls)."""
    real = qkv._lib
    rec = Recorder(real)
    qkv._lib = rec
    try:
        result = fn()
    finally:
        qkv._lib = real
    return result, rec.calls


class TestVariants(Case):
    """window, kv_start, q_pos, softcap, ALiBi and sinks against reference()."""

    def test_window(self):
        b, h, hkv, lq, lk, d = 2, 4, 2, 9, 70, 16
        q, k, v = self.randn(b, h, lq, d), self.randn(b, hkv, lk, d), self.randn(b, hkv, lk, 8)
        windows = [(0, 0), (3, 0), (0, 3), (5, 5), (None, 2), (2, None), (-1, 4), (-1, -1),
                   (4095, 0), (0, -1), (40, 40), (1, 1)]
        for backend in qkv.backends():
            for window in windows:
                for extra in ({}, {"causal": True}, {"q_pos": [0, 30]}, {"q_pos": 65},
                              {"causal": True, "q_pos": [-4, 75]}):
                    with self.subTest(backend=backend, window=window, **extra):
                        self.check(q, k, v, backend=backend, window=window, **extra)

    def test_window_of_width_one_is_a_lookup(self):
        # window (0, 0) and positions 0..Lq-1: query i sees key i only, weight 1
        q, k, v = self.randn(6, 8), self.randn(10, 8), self.randn(10, 3)
        out, w = self.check(q, k, v, window=(0, 0), q_pos=0)
        np.testing.assert_allclose(w, np.eye(6, 10), atol=WEIGHTS_TOL)
        np.testing.assert_allclose(out, v[:6], atol=OUT_TOL * np.abs(v).max())

    def test_q_pos(self):
        b, h, lq, lk = 3, 2, 5, 12
        q, k, v = self.randn(b, h, lq, 8), self.randn(b, h, lk, 8), self.randn(b, h, lk, 4)
        for backend in qkv.backends():
            for q_pos in ([0, 3, 7], [-10, -3, -1], [12, 20, 30], 4, [-6, 0, 11]):
                for extra in ({"causal": True}, {"window": (2, 1)},
                              {"alibi_slopes": [0.5, 0.25]}, {}):
                    with self.subTest(backend=backend, q_pos=q_pos, **extra):
                        self.check(q, k, v, backend=backend, q_pos=q_pos, **extra)
            # the ends of int32 (ALiBi aside: float32 cannot tell |p - j| ~ 2^31 apart)
            for q_pos in ([2 ** 31 - lq, -2 ** 31, 11], [-2 ** 31, 2 ** 31 - lq, 0]):
                for extra in ({"causal": True}, {"window": (2, 1)}, {"window": (-1, 3)},
                              {"window": (3, -1)}, {}):
                    with self.subTest(backend=backend, q_pos=q_pos, **extra):
                        self.check(q, k, v, backend=backend, q_pos=q_pos, **extra)

    def test_ragged_batch_is_valid_lens_and_q_pos(self):
        # sequences of 10 and 6 tokens, the last 4 of each are the queries
        lq, lens = 4, [10, 6]
        q, k, v = self.randn(2, 2, lq, 8), self.randn(2, 2, 10, 8), self.randn(2, 2, 10, 5)
        lens_arr = np.array(lens)
        for backend in qkv.backends():
            with self.subTest(backend=backend):
                out, w = self.check(q, k, v, backend=backend, causal=True, valid_lens=lens,
                                    q_pos=lens_arr - lq)
                for bi, n in enumerate(lens):
                    alone = qkv.attention(q[bi], k[bi, :, :n], v[bi, :, :n], causal=True,
                                          backend=backend)
                    self.assertOutClose(out[bi], alone, v, "batch %d against its own call" % bi)
                # sequence 1 sees none of its future tokens
                self.assertTrue(np.all(w[1, :, 0, 3:] == 0))

    def test_kv_start(self):
        b, h, hkv, lq, lk = 3, 4, 1, 5, 23
        q, k, v = self.randn(b, h, lq, 16), self.randn(b, hkv, lk, 16), self.randn(b, hkv, lk, 6)
        for backend in qkv.backends():
            for kv_start in ([0, 7, 22], [23, 0, 1], 5, [0, 0, 0]):
                for extra in ({}, {"causal": True}, {"valid_lens": [20, 23, 9]},
                              {"window": (3, 0), "causal": True}):
                    with self.subTest(backend=backend, kv_start=kv_start, **extra):
                        out, w = self.check(q, k, v, backend=backend, kv_start=kv_start, **extra)
                        starts = np.broadcast_to(kv_start, (b,))
                        for bi in range(b):
                            self.assertTrue(np.all(w[bi, ..., :starts[bi]] == 0))

    def test_left_padding_equals_the_unpadded_call(self):
        lq, lk, pads = 3, 16, [0, 5, 11]
        q, k, v = self.randn(3, 2, lq, 8), self.randn(3, 2, lk, 8), self.randn(3, 2, lk, 4)
        out = qkv.attention(q, k, v, causal=True, kv_start=pads)
        for bi, pad in enumerate(pads):
            alone = qkv.attention(q[bi], k[bi, :, pad:], v[bi, :, pad:], causal=True)
            self.assertOutClose(out[bi], alone, v, "batch %d against its unpadded call" % bi)

    def test_softcap(self):
        q, k, v = self.randn(2, 4, 6, 32), self.randn(2, 2, 40, 32), self.randn(2, 2, 40, 8)
        for backend in qkv.backends():
            for softcap in (0.0, 0.5, 5.0, 30.0, 1e4):
                with self.subTest(backend=backend, softcap=softcap):
                    self.check(q, k, v, backend=backend, softcap=softcap)
                if 0 < softcap <= 30:
                    with self.subTest(backend=backend, softcap=softcap, logits="huge"):
                        # scores of order 1e4 squashed into (-cap, cap): no overflow. (An
                        # uncapped or 1e4 cap would leave float32 rounding of 1e4-sized
                        # scores, ~1e-3, in the weights: not a fair test.)
                        self.check(q * 100, k * 100, v, backend=backend, softcap=softcap,
                                   scale=1.0, causal=True)
        out = qkv.attention(q, k, v, softcap=None)
        self.assertEqual(bits(out), bits(qkv.attention(q, k, v, softcap=0)))

    def test_alibi(self):
        h = 8
        q, k, v = self.randn(2, h, 7, 16), self.randn(2, 2, 33, 16), self.randn(2, 2, 33, 8)
        geometric = 2.0 ** (-8.0 * np.arange(1, h + 1) / h)  # the ALiBi paper's slopes
        for backend in qkv.backends():
            for slopes in (geometric, self.rng.uniform(-1, 1, h), 0.0, 0.125):
                for extra in ({}, {"causal": True}, {"q_pos": [-5, 40]}, {"window": (4, 4)}):
                    with self.subTest(backend=backend, slopes=np.ndim(slopes), **extra):
                        self.check(q, k, v, backend=backend, alibi_slopes=slopes, **extra)

    def test_sinks(self):
        q, k, v = self.randn(2, 4, 5, 16), self.randn(2, 2, 12, 16), self.randn(2, 2, 12, 8)
        for backend in qkv.backends():
            for sinks in ([50.0, -50.0, -np.inf, 0.3], [0.0] * 4, -np.inf, 2.5):
                for extra in ({}, {"causal": True}, {"valid_lens": [0, 7]},
                              {"valid_lens": [[0, 1, 2, 0, 12], [12] * 5]}):
                    with self.subTest(backend=backend, sinks=str(sinks), **extra):
                        out, w = self.check(q, k, v, backend=backend, sinks=sinks, **extra)
                        if np.ndim(sinks) and sinks[0] == 50.0:
                            # a sink of +50 takes (nearly) all the weight
                            self.assertTrue(np.all(w[:, 0].sum(-1) < 1e-10))
        # a row that sees no key: out 0, weights 0, lse the sink
        out, w, lse = qkv.attention(q, k, v, sinks=[50.0, -50.0, -np.inf, 0.3], valid_lens=[0, 12],
                                    return_weights=True, return_lse=True)
        self.assertTrue(np.all(out[0] == 0) and np.all(w[0] == 0))
        np.testing.assert_array_equal(lse[0], np.repeat(np.float32([50, -50, -np.inf, 0.3]),
                                                        5).reshape(4, 5))

    def test_kv_len_zero_and_empty_batches(self):
        q = self.randn(2, 4, 3, 8)
        k, v = np.zeros((2, 2, 0, 8), np.float32), np.zeros((2, 2, 0, 5), np.float32)
        out, w, lse = qkv.attention(q, k, v, return_weights=True, return_lse=True)
        self.assertEqual((out.shape, w.shape, lse.shape), ((2, 4, 3, 5), (2, 4, 3, 0), (2, 4, 3)))
        self.assertTrue(np.all(out == 0) and np.all(lse == -np.inf))
        sinks = [1.0, -2.0, -np.inf, 3.0]
        out, lse = qkv.attention(q, k, v, sinks=sinks, causal=True, return_lse=True)
        self.assertTrue(np.all(out == 0))
        np.testing.assert_array_equal(lse, np.broadcast_to(np.float32(sinks)[None, :, None],
                                                           (2, 4, 3)))
        # batch 0 and q_len 0: nothing to compute
        out = qkv.attention(np.zeros((0, 4, 3, 8)), np.zeros((0, 2, 6, 8)), np.zeros((0, 2, 6, 5)))
        self.assertEqual(out.shape, (0, 4, 3, 5))
        out, lse = qkv.attention(self.randn(2, 4, 0, 8), self.randn(2, 2, 6, 8),
                                 self.randn(2, 2, 6, 5), return_lse=True)
        self.assertEqual((out.shape, lse.shape), ((2, 4, 0, 5), (2, 4, 0)))

    def test_everything_combined(self):
        for backend in qkv.backends():
            for score in ("dot", "gaussian", "additive"):
                for n in range(8):
                    b = int(self.rng.integers(1, 4))
                    hkv = int(self.rng.integers(1, 3))
                    h = hkv * int(self.rng.integers(1, 4))
                    lq, lk = int(self.rng.integers(1, 12)), int(self.rng.integers(1, 70))
                    d, dv = int(self.rng.integers(1, 40)), int(self.rng.integers(1, 20))
                    q, k = self.randn(b, h, lq, d), self.randn(b, hkv, lk, d)
                    v = self.randn(b, hkv, lk, dv)
                    kw = {"score": score, "causal": bool(self.rng.random() < 0.5),
                          "window": (int(self.rng.integers(-1, lk)), int(self.rng.integers(-1, 4))),
                          "alibi_slopes": self.rng.uniform(0, 0.5, h),
                          "softcap": float(self.rng.choice([0.0, 2.0, 20.0])),
                          "sinks": self.rng.uniform(-3, 3, h),
                          "q_pos": self.rng.integers(-3, lk + 3, b),
                          "kv_start": self.rng.integers(0, lk + 1, b),
                          "valid_lens": self.rng.integers(0, lk + 1, (b, lq))}
                    bias = self.randn(1, h, lq, lk)
                    bias[self.rng.random(bias.shape) < 0.1] = -np.inf
                    kw["bias"] = bias
                    if score == "gaussian":
                        kw["scale"] = 0.2
                    elif score == "additive":
                        kw["additive"] = (self.randn(5, d), self.randn(5, d), self.randn(5))
                    with self.subTest(backend=backend, score=score, n=n, q=q.shape, k=k.shape):
                        try:
                            self.check(q, k, v, backend=backend, **kw)
                        except qkv.QkvError as e:
                            # A backend may decline a score kind, never DOT.
                            self.assertEqual(e.status, qkv.QKV_ERR_UNSUPPORTED)
                            self.assertNotEqual(score, "dot")

    def test_quantize_rows(self):
        rng = np.random.default_rng(11)
        x = rng.standard_normal((3, 5, 17)).astype(np.float32) * np.float32(300)
        x[0, 0, :3] = [65519.0, 65520.0, 1e-7]
        # f16: numpy's own conversion rounds to nearest even too
        q, s = qkv.quantize_rows(x, "f16")
        self.assertIsNone(s)
        self.assertEqual(q.dtype, np.float16)
        with np.errstate(over="ignore"):  # 65520 becomes inf, as it should
            want16 = x.astype(np.float16)
        np.testing.assert_array_equal(q.view(np.uint16), want16.view(np.uint16))
        # bf16: the nearer of the two truncations, in double
        q, _ = qkv.quantize_rows(x[..., ::2], "bf16")  # a strided view
        xs = np.ascontiguousarray(x[..., ::2])
        lo = (xs.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32).astype(np.float64)
        hi = ((xs.view(np.uint32) & np.uint32(0xFFFF0000)) + np.uint32(0x10000)).view(
            np.float32).astype(np.float64)
        a = xs.astype(np.float64)
        pick_hi = np.abs(hi - a) < np.abs(a - lo)
        tie = np.abs(hi - a) == np.abs(a - lo)
        odd = ((xs.view(np.uint32) >> 16) & 1).astype(bool)
        want = (xs.view(np.uint32) >> 16) + (pick_hi | (tie & odd))
        np.testing.assert_array_equal(q, want.astype(np.uint16))
        # int8: per row scale = max|x| / 127, q = nearest(x / scale)
        x[1, 2] = 0.0
        q, s = qkv.quantize_rows(x.astype(np.float64), "int8")
        self.assertEqual(q.dtype, np.int8)
        self.assertEqual(s.shape, (3, 5))
        want_s = (np.abs(x).max(axis=-1) / np.float32(127)).astype(np.float32)
        np.testing.assert_array_equal(s, want_s)
        safe = np.where(want_s > 0, want_s, 1)[..., None]
        want_q = np.clip(np.rint(x / safe), -127, 127) * (want_s[..., None] > 0)
        np.testing.assert_array_equal(q, want_q.astype(np.int8))
        self.assertEqual(np.abs(q[1, 2]).max(), 0)
        np.testing.assert_array_equal(np.abs(q).max(axis=-1)[s > 0], 127)
        # f32 is a copy; bad input raises, naming the call
        q, _ = qkv.quantize_rows(x, "f32")
        np.testing.assert_array_equal(q, x)
        x[2, 4, 16] = np.nan
        with self.assertRaises(qkv.QkvInvalidArgument):
            qkv.quantize_rows(x, "int8")
        with self.assertRaises(ValueError):
            qkv.quantize_rows(x, "fp8")

    def test_merge_of_shards_with_sinks_and_windows(self):
        # the sink goes into one shard only; windows and ALiBi are positions,
        # so each shard keeps the whole sequence's q_pos and kv_start
        q, k, v = self.randn(2, 2, 4, 8), self.randn(2, 2, 20, 8), self.randn(2, 2, 20, 3)
        kw = {"window": (6, 0), "alibi_slopes": [0.3, 0.1], "causal": True}
        want_out, _, want_lse = reference(q, k, v, sinks=[1.0, -1.0], with_lse=True, **kw)
        cut = 11
        # keys [cut, 20) with their true positions: queries at 16..19, keys at cut + j
        a = qkv.attention(q, k[:, :, :cut], v[:, :, :cut], return_lse=True, q_pos=16,
                          sinks=[1.0, -1.0], **kw)
        b = qkv.attention(q, k[:, :, cut:], v[:, :, cut:], return_lse=True, q_pos=16 - cut, **kw)
        out, lse = qkv.merge(*a, *b)
        self.assertOutClose(out, want_out, v, "merged out")
        self.assertLseClose(lse, want_lse, "merged lse")


class TestLayouts(Case):
    """Strided numpy views passed as qkv_strides, not copied, and out=."""

    def test_token_major_cache_with_spare_capacity(self):
        b, h, hkv, lq, cap, lk, d, dv = 2, 8, 2, 3, 32, 19, 16, 12
        q_tm = self.randn(b, lq, h, d)  # token-major [B, Lq, H, D]
        k_cache = self.randn(b, cap, hkv, d)  # [B, capacity, Hkv, D], Lk rows filled
        v_cache = self.randn(b, cap, hkv, dv)
        q = q_tm.transpose(0, 2, 1, 3)
        k = k_cache[:, :lk].transpose(0, 2, 1, 3)
        v = v_cache[:, :lk].transpose(0, 2, 1, 3)
        kw = {"causal": True, "window": (7, 0), "sinks": self.rng.uniform(-1, 1, h)}
        for backend in qkv.backends():
            with self.subTest(backend=backend):
                (out, w), calls = recorded(lambda: self.check(q, k, v, backend=backend, **kw))
                c = calls[0]
                # no copies: the library reads the caller's memory with its strides
                self.assertEqual((c["q"], c["k"], c["v"]),
                                 (q_tm.ctypes.data, k_cache.ctypes.data, v_cache.ctypes.data))
                self.assertEqual(c["q_strides"], (lq * h * d, d, h * d))
                self.assertEqual(c["k_strides"], (cap * hkv * d, d, hkv * d))
                self.assertEqual(c["v_strides"], (cap * hkv * dv, dv, hkv * dv))
                self.assertEqual(c["out_strides"], (0, 0, 0))  # a fresh dense out
                dense = qkv.attention(*(np.ascontiguousarray(x) for x in (q, k, v)),
                                      backend=backend, **kw)
                self.assertOutClose(out, dense, v, "strided against dense")

    def test_head_major_capacity_and_batch_broadcast(self):
        b, h, lq, cap, lk, d = 3, 2, 4, 40, 25, 8
        q = self.randn(b, h, lq, d)
        k_cache, v_cache = self.randn(b, h, cap, d), self.randn(b, h, cap, d)
        k, v = k_cache[:, :, :lk], v_cache[:, :, :lk]  # [B, H, capacity, D], Lk used
        out, calls = recorded(lambda: self.check(q, k, v, causal=True))
        self.assertEqual(calls[0]["k"], k_cache.ctypes.data)
        self.assertEqual(calls[0]["k_strides"], (h * cap * d, cap * d, d))
        self.assertEqual(calls[0]["q_strides"], (0, 0, 0))  # dense q: the default
        # one cache shared by the whole batch: batch stride 0
        k1, v1 = self.randn(1, h, lk, d), self.randn(1, h, lk, d)
        kb, vb = np.broadcast_to(k1, (b, h, lk, d)), np.broadcast_to(v1, (b, h, lk, d))
        out, calls = recorded(lambda: self.check(q, kb, vb, causal=True))
        self.assertEqual(calls[0]["k"], k1.ctypes.data)
        self.assertEqual(calls[0]["k_strides"], (0, lk * d, d))
        # a cache slice at an offset (its rows [5, 5 + Lk)): the pointer is the view's first element
        k, v = k_cache[:, :, 5:5 + lk], v_cache[:, :, 5:5 + lk]
        out, calls = recorded(lambda: self.check(q, k, v, causal=True))
        self.assertEqual(calls[0]["k"], k.ctypes.data)
        self.assertEqual(calls[0]["k"] - k_cache.ctypes.data, 5 * d * 4)

    def test_rank_2_and_3_views(self):
        cache = self.randn(30, 4, 8)  # [capacity, H, D]
        q = self.randn(4, 5, 8)
        k = cache[:17].transpose(1, 0, 2)  # [H, Lk, D]
        out, calls = recorded(lambda: self.check(q, k, k, causal=True))
        self.assertEqual(calls[0]["k"], cache.ctypes.data)
        self.assertEqual(calls[0]["k_strides"][1:], (8, 32))
        q2, k2 = q[1], cache[:17, 2]  # [Lq, D] and one head's rows [Lk, D]
        out, calls = recorded(lambda: self.check(q2, k2, k2))
        self.assertEqual(calls[0]["k"], k2.ctypes.data)
        self.assertEqual(calls[0]["k_strides"][2], 32)

    def test_views_the_library_cannot_address_are_copied(self):
        q, k, v = self.randn(2, 2, 3, 8), self.randn(2, 2, 9, 8), self.randn(2, 2, 9, 4)
        base = qkv.attention(q, k, v)
        wide = np.zeros((2, 2, 9, 16), np.float32)
        wide[..., ::2] = k
        cases = {
            "reversed keys": (q, k[:, :, ::-1], v[:, :, ::-1]),  # negative token stride
            "every other column": (q, wide[..., ::2], v),  # last dim not contiguous
            "reversed heads": (q[:, ::-1], k[:, ::-1], v[:, ::-1]),
        }
        for name, (qq, kk, vv) in cases.items():
            with self.subTest(case=name):
                out, calls = recorded(lambda: qkv.attention(qq, kk, vv))
                c = calls[0]
                for x, p in ((qq, c["q"]), (kk, c["k"]), (vv, c["v"])):
                    if not x.flags.c_contiguous:
                        self.assertNotIn(p, (x.ctypes.data, x.base.ctypes.data))
                want = base[:, ::-1] if name == "reversed heads" else base
                self.assertOutClose(out, want, v, name)
        # rows that overlap (a token stride smaller than D) are copied too
        flat = self.randn(40)
        rolling = np.lib.stride_tricks.as_strided(flat, (1, 1, 10, 8), (0, 0, 4, 4))
        self.check(rolling, rolling, rolling)

    def test_out_written_in_place_gaps_untouched(self):
        b, h, hkv, lq, lk, d, dv = 2, 4, 2, 5, 11, 8, 6
        q, k, v = self.randn(b, h, lq, d), self.randn(b, hkv, lk, d), self.randn(b, hkv, lk, dv)
        want = qkv.attention(q, k, v, causal=True, alibi_slopes=0.1)
        sentinel = np.float32(-12345.5)
        # token-major [B, capacity, H, Dv + 2]: the result goes to rows 2..2+Lq, columns :Dv
        buf = np.full((b, 9, h, dv + 2), sentinel, np.float32)
        view = buf[:, 2:2 + lq, :, :dv].transpose(0, 2, 1, 3)
        got, calls = recorded(lambda: qkv.attention(q, k, v, causal=True, alibi_slopes=0.1,
                                                    out=view))
        self.assertIs(got, view)
        self.assertEqual(calls[0]["out"], view.ctypes.data)  # written in place
        self.assertEqual(calls[0]["out_strides"], (9 * h * (dv + 2), dv + 2, h * (dv + 2)))
        self.assertOutClose(view, want, v, "out= view")
        mask = np.ones(buf.shape, bool)
        mask[:, 2:2 + lq, :, :dv] = False
        self.assertTrue(np.all(buf[mask] == sentinel), "a gap of out= was written")
        # with weights and lse, rank 2, and a dense out
        dense = np.empty((b, h, lq, dv), np.float32)
        got, w, lse = qkv.attention(q, k, v, causal=True, alibi_slopes=0.1, out=dense,
                                    return_weights=True, return_lse=True)
        self.assertIs(got, dense)
        self.assertEqual(bits(dense), bits(qkv.attention(q, k, v, causal=True, alibi_slopes=0.1)))
        row = np.full((lq, 2 * dv), sentinel, np.float32)
        qkv.attention(q[0, 0], k[0, 0], v[0, 0], out=row[:, ::2][:, :dv])  # not addressable:
        self.assertOutClose(row[:, ::2], qkv.attention(q[0, 0], k[0, 0], v[0, 0]), v)  # via a copy
        self.assertTrue(np.all(row[:, 1::2] == sentinel))

    def test_out_float64_and_bad_out(self):
        q, k, v = self.randn(3, 4), self.randn(5, 4), self.randn(5, 2)
        out64 = np.zeros((3, 2), np.float64)
        got = qkv.attention(q, k, v, out=out64)
        self.assertIs(got, out64)
        np.testing.assert_array_equal(out64, qkv.attention(q, k, v))
        with self.assertRaises(ValueError):
            qkv.attention(q, k, v, out=np.zeros((3, 3), np.float32))
        with self.assertRaises(TypeError):
            qkv.attention(q, k, v, out=np.zeros((3, 2), np.int32))
        with self.assertRaises(ValueError):
            qkv.attention(q, k, v, out=np.broadcast_to(np.float32(0), (3, 2)))  # read-only

    def test_float64_in_float64_out(self):
        q, k, v = self.randn(2, 4, 5, 8), self.randn(2, 2, 9, 8), self.randn(2, 2, 9, 3)
        kw = {"causal": True, "sinks": [0.5, -1.0, 2.0, -np.inf], "window": (3, 1)}
        base = qkv.attention(q, k, v, return_weights=True, return_lse=True, **kw)
        for wide in ((q, k, v), (q.astype(np.float64), k, v), (q, k, v.astype(np.float64))):
            got = qkv.attention(*wide, return_weights=True, return_lse=True, **kw)
            want = np.float64 if any(x.dtype == np.float64 for x in wide) else np.float32
            self.assertEqual([x.dtype for x in got], [want] * 3)
            # computed in float32: the float32 results, widened
            for x, y in zip(got, base):
                np.testing.assert_array_equal(x, y.astype(want))
        # lists of Python floats are float64 to numpy
        self.assertEqual(qkv.attention(q[0, 0].tolist(), k[0, 0], v[0, 0]).dtype, np.float64)
        self.assertEqual(qkv.attention(q.astype(np.float16), k, v).dtype, np.float32)


KV_DTYPES = ("f16", "bf16", "int8")
# What the gaps of a cache hold, so that reading one shows: NaN in f16 and bf16;
# int8 has none: -128 (outside the quantizer's [-127, 127]), and its rows' scales NaN.
KV_NAN = {"f16": np.float16(np.nan), "bf16": np.uint16(0x7FC0), "int8": np.int8(-128)}


def dequantize(a, kv_dtype, scales=None):
    """The values a K/V cache of kv_dtype holds, in float64, written from
    qkv.h: f16 is IEEE binary16, bf16 the top 16 bits of a float32, int8
    scale * q with one scale per row."""
    a = np.asarray(a)
    if kv_dtype == "f16":
        assert a.dtype == np.float16
        return a.astype(np.float64)
    if kv_dtype == "bf16":
        assert a.dtype == np.uint16
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    assert kv_dtype == "int8" and a.dtype == np.int8
    return np.asarray(scales, dtype=np.float64)[..., None] * a.astype(np.float64)


class TestLowPrecisionKv(Case):
    """kv_dtype "f16", "bf16" and "int8" against reference() over the
    dequantized K and V, on every backend."""

    def check_kv(self, q, k, v, kv_dtype, k_scales=None, v_scales=None, backend=None, **kw):
        """qkv.attention over a cache of kv_dtype (k and v in its stored type)
        against float64 attention over their values; returns (out, w, lse)."""
        got = qkv.attention(q, k, v, kv_dtype=kv_dtype, k_scales=k_scales, v_scales=v_scales,
                            return_weights=True, return_lse=True, backend=backend, **kw)
        kd, vd = dequantize(k, kv_dtype, k_scales), dequantize(v, kv_dtype, v_scales)
        self.assertTrue(np.all(np.isfinite(kd)) and np.all(np.isfinite(vd)))
        self.assertAgrees(got, reference(q, kd, vd, with_lse=True, **kw), vd)
        return got

    def cache(self, x, kv_dtype):
        """(stored, scales) of float x: qkv.quantize_rows (tested alone in
        TestVariants.test_quantize_rows against numpy)."""
        return qkv.quantize_rows(x, kv_dtype)

    def random_rows(self, *shape):
        """Normal values, each row scaled by 10^U(-2, 1): int8 rows of very
        different scales."""
        return self.randn(*shape) * np.float32(10.0) ** self.rng.uniform(
            -2, 1, shape[:-1] + (1,)).astype(np.float32)

    def test_every_dtype_every_backend(self):
        for backend in qkv.backends():
            for kv_dtype in KV_DTYPES:
                for n in range(5):
                    b, hkv = int(self.rng.integers(1, 3)), int(self.rng.integers(1, 3))
                    h = hkv * int(self.rng.integers(1, 4))
                    lq, lk = int(self.rng.integers(1, 9)), int(self.rng.integers(1, 70))
                    d, dv = int(self.rng.integers(1, 70)), int(self.rng.integers(1, 40))
                    q = self.randn(b, h, lq, d)
                    k, ks = self.cache(self.random_rows(b, hkv, lk, d), kv_dtype)
                    v, vs = self.cache(self.random_rows(b, hkv, lk, dv), kv_dtype)
                    kw = [{}, {"causal": True}, {"valid_lens": self.rng.integers(0, lk + 1, b)},
                          {"causal": True, "window": (5, 0), "sinks": self.rng.uniform(-2, 2, h)},
                          {"score": "gaussian", "scale": 0.1, "causal": True}][n]
                    with self.subTest(backend=backend, kv_dtype=kv_dtype, q=q.shape, k=k.shape,
                                      v=v.shape, **{k_: str(v_) for k_, v_ in kw.items()}):
                        try:
                            self.check_kv(q, k, v, kv_dtype, ks, vs, backend=backend, **kw)
                        except qkv.QkvError as e:
                            # A backend may decline a score kind, never DOT.
                            self.assertEqual(e.status, qkv.QKV_ERR_UNSUPPORTED)
                            self.assertNotEqual(kw.get("score", "dot"), "dot")

    def test_gqa_causal_and_ranks(self):
        for backend in qkv.backends():
            for kv_dtype in KV_DTYPES:
                for hkv in (1, 2, 8):
                    q = self.randn(2, 8, 5, 32)
                    k, ks = self.cache(self.randn(2, hkv, 13, 32), kv_dtype)
                    v, vs = self.cache(self.randn(2, hkv, 13, 24), kv_dtype)
                    with self.subTest(backend=backend, kv_dtype=kv_dtype, kv_heads=hkv):
                        out, _, _ = self.check_kv(q, k, v, kv_dtype, ks, vs, backend=backend,
                                                  causal=True)
                        # the last kv head alone, rank 3, scales [1, Lk]: its group's
                        # query heads get the same bits
                        g, j = 8 // hkv, hkv - 1
                        part = qkv.attention(q[1, j * g:], k[1, j:], v[1, j:], causal=True,
                                             kv_dtype=kv_dtype, backend=backend,
                                             k_scales=None if ks is None else ks[1, j:],
                                             v_scales=None if vs is None else vs[1, j:])
                        self.assertEqual(bits(part), bits(out[1, j * g:]))
                with self.subTest(backend=backend, kv_dtype=kv_dtype, rank=2):
                    k, ks = self.cache(self.randn(9, 8), kv_dtype)  # scales [Lk]
                    v, vs = self.cache(self.randn(9, 3), kv_dtype)
                    self.check_kv(self.randn(4, 8), k, v, kv_dtype, ks, vs, backend=backend,
                                  causal=True)

    def test_quantizing_here_equals_passing_quantized_arrays(self):
        q = self.randn(2, 4, 3, 24)
        k, v = self.random_rows(2, 2, 17, 24), self.random_rows(2, 2, 17, 8)
        for backend in qkv.backends():
            for kv_dtype in KV_DTYPES:
                with self.subTest(backend=backend, kv_dtype=kv_dtype):
                    kq, ks = qkv.quantize_rows(k, kv_dtype)
                    vq, vs = qkv.quantize_rows(v, kv_dtype)
                    kw = {"causal": True, "backend": backend, "kv_dtype": kv_dtype,
                          "return_lse": True}
                    want = qkv.attention(q, kq, vq, k_scales=ks, v_scales=vs, **kw)
                    self.assertEqual(bits(*qkv.attention(q, k, v, **kw)), bits(*want))
                    # one of each; float64 in: float64 results, the same values
                    self.assertEqual(bits(*qkv.attention(q, kq, v, k_scales=ks, **kw)),
                                     bits(*want))
                    self.assertEqual(bits(*qkv.attention(q, k, vq, v_scales=vs, **kw)),
                                     bits(*want))
                    wide = qkv.attention(q, k.astype(np.float64), v, **kw)
                    self.assertEqual([x.dtype for x in wide], [np.float64] * 2)
                    self.assertEqual(bits(*(x.astype(np.float32) for x in wide)), bits(*want))
                    # float64 scales are converted
                    if ks is not None:
                        self.assertEqual(bits(*qkv.attention(q, kq, vq, k_scales=ks.astype(float),
                                                             v_scales=vs.tolist(), **kw)),
                                         bits(*want))
        # "f32" is the default, and what None means
        self.assertEqual(bits(qkv.attention(q, k, v, kv_dtype="f32")),
                         bits(qkv.attention(q, k, v)))
        # f16 from numpy's own conversion (round to nearest even)
        with self.subTest(kv_dtype="f16", via="numpy astype"):
            self.assertEqual(bits(qkv.attention(q, k.astype(np.float16), v.astype(np.float16),
                                                kv_dtype="f16")),
                             bits(qkv.attention(q, k, v, kv_dtype="f16")))

    def test_cache_views_with_gaps_are_read_in_place(self):
        """A token-major [B, capacity, Hkv, D + pad] cache, its first Lk rows
        and D columns used, its scales [B, capacity, Hkv] token-major too;
        everything outside holds NaN (int8: -128 with NaN scales), so a read
        of a gap shows."""
        b, h, hkv, lq, cap, lk, d, dv, pad = 2, 8, 2, 3, 32, 19, 16, 12, 3
        q = self.randn(b, h, lq, d)
        for kv_dtype in KV_DTYPES:
            stored = {}
            for name, dim in (("k", d), ("v", dv)):
                x, s = self.cache(self.random_rows(b, cap, hkv, dim), kv_dtype)
                full = np.full((b, cap, hkv, dim + pad), KV_NAN[kv_dtype])
                full[:, :lk, :, :dim] = x[:, :lk]
                scales = None
                if s is not None:
                    scales = np.full((b, cap, hkv), np.nan, np.float32)
                    scales[:, :lk] = s[:, :lk]
                stored[name] = (full, scales, dim)
            (kc, ksc, _), (vc, vsc, _) = stored["k"], stored["v"]
            k = kc[:, :lk, :, :d].transpose(0, 2, 1, 3)
            v = vc[:, :lk, :, :dv].transpose(0, 2, 1, 3)
            ks = None if ksc is None else ksc[:, :lk].transpose(0, 2, 1)
            vs = None if vsc is None else vsc[:, :lk].transpose(0, 2, 1)
            for backend in qkv.backends():
                with self.subTest(backend=backend, kv_dtype=kv_dtype, layout="token-major"):
                    got, calls = recorded(lambda: self.check_kv(
                        q, k, v, kv_dtype, ks, vs, backend=backend, causal=True))
                    c = calls[0]
                    self.assertEqual(c["kv_dtype"], {"f16": 1, "bf16": 2, "int8": 3}[kv_dtype])
                    # no copies: strides in elements of kv_dtype, scales in floats
                    self.assertEqual((c["k"], c["v"]), (kc.ctypes.data, vc.ctypes.data))
                    self.assertEqual(c["k_strides"], (cap * hkv * (d + pad), d + pad,
                                                      hkv * (d + pad)))
                    self.assertEqual(c["v_strides"], (cap * hkv * (dv + pad), dv + pad,
                                                      hkv * (dv + pad)))
                    if kv_dtype == "int8":
                        self.assertEqual((c["k_scales"], c["v_scales"]),
                                         (ksc.ctypes.data, vsc.ctypes.data))
                        self.assertEqual(c["k_scale_strides"], (cap * hkv, 1, hkv))
                        self.assertEqual(c["v_scale_strides"], (cap * hkv, 1, hkv))
                    else:
                        self.assertEqual((c["k_scales"], c["v_scales"]), (None, None))
                    dense = qkv.attention(q, np.ascontiguousarray(k), np.ascontiguousarray(v),
                                          kv_dtype=kv_dtype, causal=True, backend=backend,
                                          k_scales=None if ks is None else ks.copy(),
                                          v_scales=None if vs is None else vs.copy())
                    self.assertOutClose(got[0], dense, dequantize(v, kv_dtype, vs),
                                        "strided against dense")
            # head-major [B, Hkv, capacity, D], keys [5, 5 + Lk) of it, dense
            # scales; and one cache shared by the whole batch (stride 0)
            kh, vh = kc.transpose(0, 2, 1, 3).copy(), vc.transpose(0, 2, 1, 3).copy()
            ksh = None if ksc is None else ksc.transpose(0, 2, 1).copy()
            vsh = None if vsc is None else vsc.transpose(0, 2, 1).copy()
            lo = 5
            kh[:, :, lo:lo + lk], vh[:, :, lo:lo + lk] = kh[:, :, :lk].copy(), vh[:, :, :lk].copy()
            kh[:, :, :lo], vh[:, :, :lo] = KV_NAN[kv_dtype], KV_NAN[kv_dtype]
            if ksh is not None:
                ksh[:, :, lo:lo + lk] = ksh[:, :, :lk].copy()
                vsh[:, :, lo:lo + lk] = vsh[:, :, :lk].copy()
                ksh[:, :, :lo] = vsh[:, :, :lo] = np.nan
            sl = slice(lo, lo + lk)
            one = {"k": kh[:1, :, sl, :d], "v": vh[:1, :, sl, :dv],
                   "ks": None if ksh is None else ksh[:1, :, sl],
                   "vs": None if vsh is None else vsh[:1, :, sl]}
            for backend in qkv.backends():
                with self.subTest(backend=backend, kv_dtype=kv_dtype, layout="head-major"):
                    got, calls = recorded(lambda: self.check_kv(
                        q, kh[:, :, sl, :d], vh[:, :, sl, :dv], kv_dtype,
                        None if ksh is None else np.ascontiguousarray(ksh[:, :, sl]),
                        None if vsh is None else vsh[:, :, sl], backend=backend, causal=True))
                    self.assertEqual(calls[0]["k"], kh[:, :, sl].ctypes.data)
                    self.assertEqual(calls[0]["k_strides"], (hkv * cap * (d + pad), cap * (d + pad),
                                                             d + pad))
                    if ksh is not None:
                        self.assertEqual(calls[0]["k_scale_strides"], (0, 0, 0))  # dense copy
                        self.assertEqual(calls[0]["v_scale_strides"], (hkv * cap, cap, 1))
                with self.subTest(backend=backend, kv_dtype=kv_dtype, layout="batch broadcast"):
                    bc = {key: None if x is None else np.broadcast_to(x, (b,) + x.shape[1:])
                          for key, x in one.items()}
                    got, calls = recorded(lambda: self.check_kv(
                        q, bc["k"], bc["v"], kv_dtype, bc["ks"], bc["vs"], backend=backend))
                    self.assertEqual(calls[0]["k_strides"][0], 0)
                    if ksh is not None:
                        self.assertEqual(calls[0]["k_scale_strides"][0], 0)

    def test_int8_zero_rows_and_outliers(self):
        b, h, hkv, lq, lk, d, dv = 2, 4, 2, 4, 23, 16, 8
        q = self.randn(b, h, lq, d)
        k, v = self.randn(b, hkv, lk, d), self.randn(b, hkv, lk, dv)
        k[0, 1, 3] = 0.0  # all-zero rows: scale 0, q 0, score 0
        v[1, 0, 7] = 0.0
        k[:, :, 10] *= np.float32(1e-3)  # small rows next to large ones
        v[:, :, 11] *= np.float32(1e3)
        k[1, 0, 5, 2] = 60.0  # one outlier: the rest of its row gets a few steps of 60/127
        v[0, 1, 9, 4] = -500.0
        kq, ks = qkv.quantize_rows(k, "int8")
        vq, vs = qkv.quantize_rows(v, "int8")
        self.assertEqual((ks[0, 1, 3], vs[1, 0, 7]), (0.0, 0.0))
        self.assertEqual(kq[1, 0, 5, 2], 127)
        self.assertLessEqual(int(np.abs(np.delete(kq[1, 0, 5], 2).astype(int)).max()), 10)
        # a scale of 0 makes a row 0 whatever its int8 values (x = 0 * q)
        kq2, vq2 = kq.copy(), vq.copy()
        kq2[0, 1, 3], vq2[1, 0, 7] = 100, -77
        for backend in qkv.backends():
            for kw in ({}, {"causal": True}, {"valid_lens": [[23, 4, 12, 1], [0, 23, 11, 10]]}):
                with self.subTest(backend=backend, **{k_: str(v_) for k_, v_ in kw.items()}):
                    out, w, _ = self.check_kv(q, kq, vq, "int8", ks, vs, backend=backend, **kw)
                    out2, w2, _ = self.check_kv(q, kq2, vq2, "int8", ks, vs, backend=backend,
                                                **kw)
                    self.assertEqual(bits(out, w), bits(out2, w2))
        # every row zero: uniform weights, out 0
        z, zs = qkv.quantize_rows(np.zeros((1, 2, 6, 4), np.float32), "int8")
        self.assertTrue(np.all(zs == 0))
        out, w = qkv.attention(self.randn(1, 2, 3, 4), z, z, kv_dtype="int8", k_scales=zs,
                               v_scales=zs, return_weights=True)
        self.assertTrue(np.all(out == 0))
        np.testing.assert_allclose(w, np.full((1, 2, 3, 6), 1 / 6), atol=WEIGHTS_TOL)

    def test_f16_subnormals_and_the_edge_of_its_range(self):
        q = self.randn(2, 2, 3, 8)
        tiny = np.float16(2.0 ** -14)  # the smallest normal f16; below it, subnormals
        # keys and values that are all subnormal: a flush to 0 would show in
        # the weights (scale 1e4 makes their scores O(1)) and in out (max|v|
        # subnormal, so the bound is tiny too)
        k = (self.rng.uniform(-0.98, 0.98, (2, 1, 11, 8)) * tiny).astype(np.float16)
        v = (self.rng.uniform(-0.98, 0.98, (2, 1, 11, 5)) * tiny).astype(np.float16)
        k[0, 0, 0, 0] = v[0, 0, 0, 0] = np.float16(2.0 ** -24)  # the smallest subnormal
        v[1, 0, 3, :] = -(tiny - np.float16(2.0 ** -24))  # the largest subnormal
        self.assertTrue(np.all(np.abs(k) < tiny) and np.all(np.abs(v) < tiny))
        self.assertGreater(np.count_nonzero(k), 100)
        # the quantizer makes the same subnormals from float32
        self.assertEqual(bits(qkv.quantize_rows(k.astype(np.float32), "f16")[0]), bits(k))
        # values at the top of f16's range (65504; 65520 and up become inf:
        # not here, an inf key would make NaN scores)
        big = v.astype(np.float32) * np.float32(65504 / 2.0 ** -14)
        big[0, 0, 1, 1] = 65504.0
        vbig = qkv.quantize_rows(big, "f16")[0]
        self.assertTrue(np.all(np.isfinite(vbig.astype(np.float32))))
        for backend in qkv.backends():
            with self.subTest(backend=backend, values="subnormal"):
                self.check_kv(q, k, v, "f16", backend=backend, scale=1e4)
            with self.subTest(backend=backend, values="65504"):
                self.check_kv(q, k, vbig, "f16", backend=backend, scale=1e4, causal=True)
            with self.subTest(backend=backend, kv_dtype="bf16", values="wide range"):
                # bf16 has float32's range: values of 1e30 and keys of 1e-30
                kb, _ = qkv.quantize_rows(self.randn(2, 1, 11, 8) * np.float32(1e-30), "bf16")
                vb, _ = qkv.quantize_rows(self.randn(2, 1, 11, 5) * np.float32(1e30), "bf16")
                self.check_kv(q, kb, vb, "bf16", backend=backend, scale=1e30)

    def test_no_keys(self):
        q = self.randn(2, 4, 3, 8)
        for kv_dtype in KV_DTYPES:
            k, ks = qkv.quantize_rows(np.zeros((2, 2, 0, 8), np.float32), kv_dtype)
            v, vs = qkv.quantize_rows(np.zeros((2, 2, 0, 5), np.float32), kv_dtype)
            with self.subTest(kv_dtype=kv_dtype):
                out, lse = qkv.attention(q, k, v, kv_dtype=kv_dtype, k_scales=ks, v_scales=vs,
                                         return_lse=True)
                self.assertTrue(np.all(out == 0) and np.all(lse == -np.inf))
                out = qkv.attention(q, np.zeros((2, 2, 0, 8)), np.zeros((2, 2, 0, 5)),
                                    kv_dtype=kv_dtype)
                self.assertTrue(np.all(out == 0))

    def test_bad_inputs(self):
        q = self.randn(2, 4, 3, 8)
        kf, vf = self.randn(2, 2, 6, 8), self.randn(2, 2, 6, 5)
        k8, ks = qkv.quantize_rows(kf, "int8")
        v8, vs = qkv.quantize_rows(vf, "int8")
        k16, v16 = kf.astype(np.float16), vf.astype(np.float16)
        sentinel = np.float32(3.5)

        def expect(exc, words, k, v, **kw):
            out = np.full((2, 4, 3, 5), sentinel, np.float32)
            with self.assertRaises(exc) as cm:
                qkv.attention(q, k, v, out=out, **kw)
            for word in words:
                self.assertIn(word, str(cm.exception))
            self.assertTrue(np.all(out == sentinel), "out written on error")

        # int8 without its scales: named
        expect(ValueError, ["k_scales", "[2, 2, 6]"], k8, v8, kv_dtype="int8", v_scales=vs)
        expect(ValueError, ["v_scales"], k8, v8, kv_dtype="int8", k_scales=ks)
        expect(ValueError, ["v_scales"], kf, v8, kv_dtype="int8")
        # scales of the wrong shape
        expect(ValueError, ["k_scales is [2, 2]", "[2, 2, 6]"], k8, v8, kv_dtype="int8",
               k_scales=ks[..., 0], v_scales=vs)
        expect(ValueError, ["v_scales is [2, 2, 6, 1]"], k8, v8, kv_dtype="int8",
               k_scales=ks, v_scales=vs[..., None])
        expect(ValueError, ["k_scales is [2, 1, 6]"], k8, v8, kv_dtype="int8",
               k_scales=ks[:, :1], v_scales=vs)  # no broadcasting of scales
        # scales where nothing reads them
        expect(ValueError, ["k_scales", "int8"], k16, v16, kv_dtype="f16", k_scales=ks)
        expect(ValueError, ["v_scales", "int8"], kf, vf, v_scales=vs)
        expect(ValueError, ["k_scales", "float"], kf, v8, kv_dtype="int8", k_scales=ks,
               v_scales=vs)
        # arrays of the wrong type for kv_dtype
        expect(TypeError, ["kv_dtype='f16'", "int8", "float16"], k8, v16, kv_dtype="f16")
        expect(TypeError, ["kv_dtype='int8'", "uint16"], k8, v16.view(np.uint16),
               kv_dtype="int8", k_scales=ks)
        expect(TypeError, ["kv_dtype='bf16'", "int8"], k8, v8, kv_dtype="bf16")
        expect(TypeError, ["int32", "int8"], kf.astype(np.int32), v8, kv_dtype="int8",
               v_scales=vs)
        expect(ValueError, ["kv_dtype must be"], kf, vf, kv_dtype="fp8")
        expect(ValueError, ["kv_dtype must be"], kf, vf, kv_dtype=np.float16)
        # quantizing non-finite values to int8: named
        bad = kf.copy()
        bad[1, 1, 2, 3] = np.inf
        expect(qkv.QkvInvalidArgument, ["k holds a non-finite value", "qkv_quantize_rows"],
               bad, vf, kv_dtype="int8")
        # shapes are checked before anything is quantized
        expect(ValueError, ["Lk=6", "5 values"], kf, vf[:, :, :5], kv_dtype="int8")

    def test_the_library_names_missing_scales(self):
        """The C boundary itself: QKV_DTYPE_I8 with NULL k_scales or v_scales
        is QKV_ERR_INVALID_ARGUMENT, and qkv_attention_explain names it."""
        q, out = self.randn(1, 2, 3, 8), np.zeros((1, 2, 3, 8), np.float32)
        k8, ks = qkv.quantize_rows(self.randn(1, 1, 5, 8), "int8")
        for backend in [None] + qkv.backends():
            for missing in ("k_scales", "v_scales"):
                with self.subTest(backend=backend, missing=missing):
                    desc = qkv._Desc()
                    desc.struct_size = ctypes.sizeof(desc)
                    desc.batch, desc.q_heads, desc.kv_heads = 1, 2, 1
                    desc.q_len, desc.kv_len, desc.head_dim, desc.value_dim = 3, 5, 8, 8
                    desc.scale = 0.25
                    desc.kv_dtype = qkv.QKV_DTYPE_I8
                    name = None if backend is None else backend.encode()
                    desc.backend = name
                    setattr(desc, "k_scales" if missing == "v_scales" else "v_scales",
                            ks.ctypes.data)
                    nbytes = qkv._lib.qkv_attention_workspace_size(ctypes.byref(desc))
                    ws = np.empty(max(nbytes, 1), np.uint8)
                    args = (ctypes.byref(desc), q.ctypes.data, k8.ctypes.data, k8.ctypes.data,
                            out.ctypes.data, None, None, ws.ctypes.data, nbytes)
                    self.assertEqual(qkv._lib.qkv_attention(*args), qkv.QKV_ERR_INVALID_ARGUMENT)
                    self.assertIn(missing, qkv._explain(args))
                    self.assertTrue(np.all(out == 0))


class TestErrors(Case):
    def assertValueError(self, words, *args, **kw):
        with self.assertRaises(ValueError) as cm:
            qkv.attention(*args, **kw)
        for word in words:
            self.assertIn(word, str(cm.exception))

    def test_bad_shapes_raise_value_error_naming_the_problem(self):
        r = self.randn
        self.assertValueError(["q must be"], r(8), r(8), r(8))
        self.assertValueError(["q must be"], r(1, 1, 1, 2, 8), r(1, 1, 1, 2, 8), r(1, 1, 1, 2, 8))
        self.assertValueError(["k has 3 dims", "rank"], r(2, 8), r(1, 2, 8), r(2, 8))
        self.assertValueError(["v has 2 dims"], r(1, 2, 8), r(1, 2, 8), r(2, 8))
        self.assertValueError(["batch mismatch"], r(2, 1, 3, 8), r(1, 1, 3, 8), r(1, 1, 3, 8))
        self.assertValueError(["kv heads must divide"], r(1, 4, 3, 8), r(1, 3, 3, 8), r(1, 3, 3, 8))
        self.assertValueError(["kv heads mismatch"], r(1, 4, 3, 8), r(1, 2, 3, 8), r(1, 1, 3, 8))
        self.assertValueError(["Lk=5", "4 values"], r(3, 8), r(5, 8), r(4, 8))
        self.assertValueError(["head dim", "D=8"], r(3, 8), r(5, 7), r(5, 8))
        self.assertValueError(["empty"], r(3, 0), r(5, 0), r(5, 8))
        self.assertValueError(["empty"], r(0, 3, 8), r(0, 5, 8), r(0, 5, 8))
        self.assertValueError(["empty"], r(3, 8), r(5, 8), r(5, 0))
        q, k, v = r(2, 1, 3, 8), r(2, 1, 5, 8), r(2, 1, 5, 8)
        self.assertValueError(["valid_lens shape"], q, k, v, valid_lens=[1, 2, 3])
        self.assertValueError(["valid_lens shape"], q, k, v, valid_lens=[[1, 2], [3, 4]])
        self.assertValueError(["valid_lens must lie in [0, Lk]"], q, k, v, valid_lens=[1, 6])
        self.assertValueError(["valid_lens must lie"], q, k, v, valid_lens=[-1, 2])
        self.assertValueError(["whole numbers"], q, k, v, valid_lens=[1.5, 2])
        self.assertValueError(["bias shape", "broadcast"], q, k, v, bias=r(4, 5))
        self.assertValueError(["bias shape", "dim 0"], q, k, v, bias=r(3, 1, 3, 5))
        self.assertValueError(["bias has 5 dims"], q, k, v, bias=r(1, 2, 1, 3, 5))
        self.assertValueError(["score must be"], q, k, v, score="cosine")
        self.assertValueError(["needs additive"], q, k, v, score="additive")
        self.assertValueError(["W_k must be [hidden, D]"], q, k, v, score="additive",
                              additive=(r(4, 8), r(4, 7), r(4)))
        self.assertValueError(["w_v must be [hidden]"], q, k, v, score="additive",
                              additive=(r(4, 8), r(4, 8), r(4, 1)))
        self.assertValueError(["only used with"], q, k, v, additive=(r(4, 8), r(4, 8), r(4)))
        with self.assertRaises(TypeError):
            qkv.attention(np.array([["a"]]), r(1, 1), r(1, 1))

    def test_non_ok_status_raises_with_the_status_string(self):
        x = self.randn(4, 2)
        with self.assertRaises(qkv.QkvError) as cm:
            qkv.attention(x, x, x, backend="no-such-backend")
        self.assertEqual(cm.exception.status, qkv.QKV_ERR_UNSUPPORTED)
        self.assertIn(qkv.status_string(qkv.QKV_ERR_UNSUPPORTED), str(cm.exception))
        self.assertIn("no-such-backend", str(cm.exception))
        self.assertIsInstance(cm.exception, RuntimeError)
        self.assertIsInstance(cm.exception, NotImplementedError)
        with self.assertRaises(qkv.QkvError) as cm:
            qkv.attention(x, x, x, scale=float("nan"))
        self.assertEqual(cm.exception.status, qkv.QKV_ERR_INVALID_ARGUMENT)
        self.assertIn(qkv.status_string(qkv.QKV_ERR_INVALID_ARGUMENT), str(cm.exception))
        self.assertIsInstance(cm.exception, ValueError)
        self.assertIn("scale", str(cm.exception))

    def test_the_message_names_the_field(self):
        """QKV_ERR_INVALID_ARGUMENT: a ValueError with qkv_attention_explain's
        sentence, naming the field; nothing written to out."""
        b, h, lq, lk = 2, 2, 3, 6
        q, k, v = self.randn(b, h, lq, 8), self.randn(b, h, lk, 8), self.randn(b, h, lk, 4)
        cases = [
            ("softcap", {"softcap": -1.0}),
            ("softcap", {"softcap": float("nan")}),
            ("softcap", {"softcap": float("inf")}),
            ("alibi_slopes", {"alibi_slopes": [0.5, float("inf")]}),
            ("alibi_slopes", {"alibi_slopes": [float("nan"), 0.5]}),
            ("sinks", {"sinks": [0.0, float("nan")]}),
            ("sinks", {"sinks": [float("inf"), 0.0]}),
            ("kv_start", {"kv_start": [0, lk + 1]}),
            ("kv_start", {"kv_start": [-1, 0]}),
        ]
        sentinel = np.float32(7.25)
        for backend in qkv.backends():
            for field, kw in cases:
                with self.subTest(backend=backend, **{k_: str(v_) for k_, v_ in kw.items()}):
                    out = np.full((b, h, lq, 4), sentinel, np.float32)
                    with self.assertRaises(ValueError) as cm:
                        qkv.attention(q, k, v, out=out, backend=backend, **kw)
                    e = cm.exception
                    self.assertIsInstance(e, qkv.QkvError)
                    self.assertIsInstance(e, qkv.QkvInvalidArgument)
                    self.assertEqual(e.status, qkv.QKV_ERR_INVALID_ARGUMENT)
                    self.assertIn(field, str(e))
                    self.assertIn(field, e.detail)
                    self.assertIn("qkv_attention", str(e))
                    self.assertTrue(np.all(out == sentinel), "out written on error")
        # out overlapping an input: the library says so, nothing written
        buf = self.randn(b, h, lq, 8)
        keep = buf.copy()
        with self.assertRaises(qkv.QkvInvalidArgument) as cm:
            qkv.attention(buf, k, v, out=buf[..., :4])
        self.assertIn("out", cm.exception.detail)
        self.assertEqual(bits(buf), bits(keep))
        # caught in Python before the call: shapes and types
        self.assertValueError(["kv_start shape", "[B] = [2]"], q, k, v, kv_start=[0, 1, 2])
        self.assertValueError(["q_pos shape"], q, k, v, q_pos=[[0, 1]])
        self.assertValueError(["q_pos must fit in int32"], q, k, v, q_pos=[0, 2 ** 31])
        self.assertValueError(["whole numbers"], q, k, v, q_pos=[0.5, 1])
        self.assertValueError(["sinks shape", "[H] = [2]"], q, k, v, sinks=[0.0, 1.0, 2.0])
        self.assertValueError(["alibi_slopes shape"], q, k, v, alibi_slopes=np.zeros((2, 1)))
        self.assertValueError(["window must be (left, right)"], q, k, v, window=3)
        self.assertValueError(["window must be (left, right)"], q, k, v, window=(1, 2, 3))
        with self.assertRaises(TypeError):
            qkv.attention(q, k, v, window=(1.5, 0))
        with self.assertRaises(TypeError):
            qkv.attention(q, k, v, kv_start=["a", "b"])


def shard_kw(kw, lo, hi):
    """The masks of one call over all keys, restricted to keys [lo, hi)."""
    part = {}
    for key, val in kw.items():
        if key == "valid_lens":
            part[key] = np.clip(np.asarray(val) - lo, 0, hi - lo)
        elif key == "bias":
            b = np.asarray(val)
            part[key] = b if b.ndim == 0 or b.shape[-1] == 1 else b[..., lo:hi]
        else:
            part[key] = val
    return part


def fold(parts):
    """merge((out, lse) of shard 0, shard 1, ...) in shard order."""
    out, lse = parts[0]
    for o, l in parts[1:]:
        out, lse = qkv.merge(out, lse, o, l)
    return out, lse


def bits(*arrays):
    return b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)


class TestMerge(Case):
    """qkv.merge of per-shard (out, lse) against one call and float64 numpy."""

    def shards(self, q, k, v, bounds, backend=None, **kw):
        """qkv.attention over the keys [bounds[i], bounds[i + 1]): [(out, lse)]."""
        parts = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            parts.append(qkv.attention(q, k[..., lo:hi, :], v[..., lo:hi, :], return_lse=True,
                                       backend=backend, **shard_kw(kw, lo, hi)))
        return parts

    def check_merged(self, q, k, v, bounds, backend=None, **kw):
        parts = self.shards(q, k, v, bounds, backend=backend, **kw)
        out, lse = fold(parts)
        full_out, full_lse = qkv.attention(q, k, v, return_lse=True, backend=backend, **kw)
        want_out, _, want_lse = reference(q, k, v, with_lse=True, **kw)
        self.assertEqual((out.dtype, lse.dtype), (np.float32, np.float32))
        self.assertEqual(out.shape, full_out.shape)
        self.assertEqual(lse.shape, full_lse.shape)
        self.assertEqual(lse.shape, np.shape(q)[:-1])
        vmax = max(float(np.max(np.abs(v))), 1e-30)
        for name, want in (("one call", full_out), ("float64 numpy", want_out)):
            err = float(np.max(np.abs(out - want)))
            self.assertLessEqual(err, OUT_TOL * vmax, "merged out vs %s off by %g (max|v| %g)"
                                 % (name, err, vmax))
        self.assertLseClose(lse, want_lse, "merged lse vs float64 numpy")
        self.assertLseClose(lse, full_lse, "merged lse vs one call")
        return parts, (out, lse)

    def test_attention_returns_lse(self):
        b, h, hkv, lq, lk, d = 2, 4, 2, 5, 9, 16
        q, k, v = self.randn(b, h, lq, d), self.randn(b, hkv, lk, d), self.randn(b, hkv, lk, 3)
        bias = self.randn(b, h, lq, lk)
        bias[0, 1, 2] = -np.inf
        masks = [{}, {"causal": True}, {"valid_lens": [0, 7]}, {"bias": bias},
                 {"score": "gaussian", "scale": 0.3, "valid_lens": [[0, 1, 2, 3, 4], [9] * 5]}]
        for backend in qkv.backends():
            for kw in masks:
                with self.subTest(backend=backend, mask=sorted(kw)):
                    out, w = qkv.attention(q, k, v, return_weights=True, backend=backend, **kw)
                    out2, lse = qkv.attention(q, k, v, return_lse=True, backend=backend, **kw)
                    out3, w3, lse3 = qkv.attention(q, k, v, return_weights=True, return_lse=True,
                                                   backend=backend, **kw)
                    self.assertEqual(bits(out, w), bits(out2, w3))
                    self.assertEqual(bits(out, lse), bits(out3, lse3))
                    self.assertEqual((lse.dtype, lse.shape), (np.float32, (b, h, lq)))
                    _, _, want = reference(q, k, v, with_lse=True, **kw)
                    self.assertLseClose(lse, want, "lse")
        # rank 2: lse [Lq]; a row that sees nothing: -inf
        lse = qkv.attention(q[0, 0], k[0, 0], v[0, 0], valid_lens=0, return_lse=True)[1]
        self.assertEqual(lse.shape, (lq,))
        self.assertTrue(np.all(lse == -np.inf))

    def test_weights_of_a_known_merge(self):
        # lse log 3 against log 1: the sides weigh 3/4 and 1/4, lse log 4
        a, b = np.array([[4.0, 8.0]], np.float32), np.array([[-4.0, 0.0]], np.float32)
        out, lse = qkv.merge(a, np.log([3.0]), b, np.log([1.0]))
        np.testing.assert_allclose(out, [[2.0, 6.0]], rtol=1e-6)
        np.testing.assert_allclose(lse, [math.log(4.0)], rtol=1e-6)
        out, lse = qkv.merge(a, [5.0], b, [5.0])  # equal lse: the mean, lse + log 2
        np.testing.assert_array_equal(out, [[0.0, 4.0]])
        np.testing.assert_allclose(lse, [5.0 + math.log(2.0)], rtol=1e-6)

    def test_two_halves_equal_all_keys(self):
        for backend in qkv.backends():
            for n in range(10):
                b, hkv = int(self.rng.integers(1, 3)), int(self.rng.integers(1, 3))
                h = hkv * int(self.rng.integers(1, 3))
                lq, lk = int(self.rng.integers(1, 13)), int(self.rng.integers(2, 40))
                d, dv = int(self.rng.integers(1, 40)), int(self.rng.integers(1, 20))
                cut = int(self.rng.integers(1, lk))
                q, k = self.randn(b, h, lq, d), self.randn(b, hkv, lk, d)
                v = self.randn(b, hkv, lk, dv) * float(self.rng.uniform(0.1, 10))
                kw = {"score": "gaussian", "scale": 0.1} if n % 3 == 2 else {}
                with self.subTest(backend=backend, n=n, q=q.shape, k=k.shape, cut=cut, **kw):
                    self.check_merged(q, k, v, [0, cut, lk], backend=backend, **kw)

    def test_gqa_and_mqa_halves(self):
        for hkv in (1, 2, 4, 8):
            q = self.randn(2, 8, 6, 32)
            k, v = self.randn(2, hkv, 21, 32), self.randn(2, hkv, 21, 24)
            with self.subTest(kv_heads=hkv):
                self.check_merged(q, k, v, [0, 10, 21])

    def test_many_shards_in_order(self):
        q, k, v = self.randn(2, 4, 7, 16), self.randn(2, 2, 37, 16), self.randn(2, 2, 37, 8)
        bias = self.randn(2, 4, 7, 37)
        bias[self.rng.random(bias.shape) < 0.2] = -np.inf
        for bounds in ([0, 1, 37], [0, 36, 37], [0, 5, 6, 20, 30, 37], list(range(38))):
            for kw in ({}, {"valid_lens": [[3, 9, 0, 37, 21, 1, 6], [37] * 7]}, {"bias": bias}):
                with self.subTest(bounds=bounds, mask=sorted(kw)):
                    self.check_merged(q, k, v, bounds, **kw)

    def test_a_side_that_sees_nothing_leaves_the_other_unchanged(self):
        q, k, v = self.randn(2, 3, 4, 8), self.randn(2, 3, 10, 8), self.randn(2, 3, 10, 5)
        # valid lengths 3 and 9 over halves of 5 keys: batch 0 sees nothing of the
        # second half, batch 1 something of both
        (a, b), _ = self.check_merged(q, k, v, [0, 5, 10], valid_lens=[3, 9])
        self.assertTrue(np.all(b[1][0] == -np.inf) and np.all(b[0][0] == 0))
        self.assertTrue(np.all(np.isfinite(b[1][1])))
        for x, y in ((a, b), (b, a)):
            out, lse = qkv.merge(x[0], x[1], y[0], y[1])
            self.assertEqual(bits(out[0], lse[0]), bits(a[0][0], a[1][0]))
            self.assertNotEqual(bits(out[1]), bits(a[0][1]))
        # bias: query rows 1 and 3 of every head see nothing in the first half
        bias = self.randn(1, 1, 4, 10)
        bias[0, 0, [1, 3], :5] = -np.inf
        (a, b), _ = self.check_merged(q, k, v, [0, 5, 10], bias=bias)
        self.assertTrue(np.all(a[1][:, :, [1, 3]] == -np.inf))
        for x, y in ((a, b), (b, a)):
            out, lse = qkv.merge(x[0], x[1], y[0], y[1])
            self.assertEqual(bits(out[:, :, [1, 3]], lse[:, :, [1, 3]]),
                             bits(b[0][:, :, [1, 3]], b[1][:, :, [1, 3]]))
        # made-up rows: any finite side against -inf comes back bit for bit
        out_a, lse_a = self.randn(6, 7) * 1e3, self.randn(6) * 50
        out_b, lse_b = self.randn(6, 7), np.full(6, -np.inf, np.float32)
        for got in (qkv.merge(out_a, lse_a, out_b, lse_b), qkv.merge(out_b, lse_b, out_a, lse_a)):
            self.assertEqual(bits(*got), bits(out_a, lse_a))

    def test_both_sides_empty(self):
        q, k, v = self.randn(2, 1, 3, 4), self.randn(2, 1, 6, 4), self.randn(2, 1, 6, 2)
        _, (out, lse) = self.check_merged(q, k, v, [0, 2, 6], valid_lens=[0, 4])
        self.assertTrue(np.all(out[0] == 0) and np.all(lse[0] == -np.inf))
        self.assertTrue(np.all(np.isfinite(lse[1])))
        # whatever the outs hold: zeros and -inf
        ninf = np.full((3, 2), -np.inf, np.float32)
        out, lse = qkv.merge(self.randn(3, 2, 5), ninf, self.randn(3, 2, 5), ninf)
        self.assertEqual(bits(out, lse), bits(np.zeros((3, 2, 5), np.float32), ninf))

    def test_bitwise_commutative(self):
        rows, dv = 4000, 9
        out_a, out_b = self.randn(rows, dv), self.randn(rows, dv) * 100
        lse_a = self.randn(rows) * 10
        lse_b = lse_a + self.randn(rows) * np.float32(3)
        lse_b[::7] = lse_a[::7]  # ties
        lse_b[::11] = lse_a[::11] + np.float32(100)  # one side negligible
        lse_a[::13] = -np.inf
        lse_b[::17] = -np.inf
        ab, ba = qkv.merge(out_a, lse_a, out_b, lse_b), qkv.merge(out_b, lse_b, out_a, lse_a)
        self.assertEqual(bits(*ab), bits(*ba))
        # and from attention: two halves of real keys
        q, k, v = self.randn(2, 4, 9, 16), self.randn(2, 2, 30, 16), self.randn(2, 2, 30, 8)
        (a, b), _ = self.check_merged(q, k, v, [0, 13, 30])
        self.assertEqual(bits(*qkv.merge(*a, *b)), bits(*qkv.merge(*b, *a)))
        # merging a result with itself: the same out, lse + log 2
        out, lse = qkv.merge(*a, *a)
        np.testing.assert_allclose(out, a[0], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(lse, a[1] + math.log(2.0), rtol=1e-6, atol=1e-6)

    def test_float64_and_strided_inputs_are_converted(self):
        out_a, out_b = self.randn(3, 4, 6), self.randn(3, 4, 6)
        lse_a, lse_b = self.randn(3, 4), self.randn(3, 4)
        base = qkv.merge(out_a, lse_a, out_b, lse_b)
        # float64 in, float64 out (merged in float32): the float32 bits, widened
        got = qkv.merge(out_a.astype(np.float64), lse_a.astype(np.float64),
                        out_b.astype(np.float64), lse_b.astype(np.float64))
        self.assertEqual((got[0].dtype, got[1].dtype), (np.float64, np.float64))
        self.assertEqual(bits(*got), bits(base[0].astype(np.float64), base[1].astype(np.float64)))
        got = qkv.merge(out_a, lse_a.astype(np.float64), out_b, lse_b)  # any of the four
        self.assertEqual((got[0].dtype, got[1].dtype), (np.float64, np.float64))
        self.assertEqual(bits(got[0].astype(np.float32), got[1].astype(np.float32)), bits(*base))
        wide = np.zeros((3, 4, 12), np.float32)
        wide[..., ::2] = out_b
        t = np.ascontiguousarray(out_a.transpose(2, 0, 1)).transpose(1, 2, 0)
        self.assertFalse(t.flags.c_contiguous or wide[..., ::2].flags.c_contiguous)
        got = qkv.merge(t, np.asfortranarray(lse_a), wide[..., ::2],
                        np.array(lse_b.tolist(), np.float32))
        self.assertEqual(bits(*got), bits(*base))
        # a list of Python floats is float64 to numpy, and so is the result
        got = qkv.merge(t, lse_a, out_b, lse_b.tolist())
        self.assertEqual(got[1].dtype, np.float64)
        self.assertEqual(bits(got[0].astype(np.float32), got[1].astype(np.float32)), bits(*base))

    def test_inputs_are_not_modified(self):
        q, k, v = self.randn(2, 4, 5, 8), self.randn(2, 2, 12, 8), self.randn(2, 2, 12, 3)
        a, b = self.shards(q, k, v, [0, 4, 12], valid_lens=[2, 12])
        before = [x.copy() for x in a + b]
        out, lse = qkv.merge(*a, *b)
        for x, y in zip(a + b, before):
            self.assertEqual(bits(x), bits(y))
        for x in a + b:
            self.assertFalse(np.shares_memory(out, x) or np.shares_memory(lse, x))
        # one result passed as both sides
        out, lse = qkv.merge(a[0], a[1], a[0], a[1])
        self.assertEqual(bits(*a), bits(*before[:2]))
        # float64 input
        o64, l64 = b[0].astype(np.float64), b[1].astype(np.float64)
        keep = bits(o64, l64)
        qkv.merge(o64, l64, o64, l64)
        self.assertEqual(bits(o64, l64), keep)

    def test_any_leading_shape(self):
        dv = 3
        for lead in ((), (5,), (2, 5), (2, 3, 5), (2, 3, 4, 5), (0,), (2, 0, 3)):
            with self.subTest(lead=lead):
                out_a, out_b = self.randn(*lead, dv), self.randn(*lead, dv)
                lse_a = self.randn(*lead).reshape(lead)
                lse_b = self.randn(*lead).reshape(lead)
                out, lse = qkv.merge(out_a, lse_a, out_b, lse_b)
                self.assertEqual((out.shape, lse.shape), (lead + (dv,), lead))
                flat = qkv.merge(out_a.reshape(-1, dv), lse_a.reshape(-1),
                                 out_b.reshape(-1, dv), lse_b.reshape(-1))
                self.assertEqual(bits(out, lse), bits(*flat))
        # Python scalars and lists for a single row
        out, lse = qkv.merge([1.0, 3.0], 0.0, [3.0, 5.0], 0.0)
        np.testing.assert_array_equal(out, [2.0, 4.0])
        self.assertAlmostEqual(float(lse), math.log(2.0), places=6)

    def test_bad_shapes_raise_value_error_naming_the_problem(self):
        r = self.randn

        def expect(words, *args):
            with self.assertRaises(ValueError) as cm:
                qkv.merge(*args)
            for word in words:
                self.assertIn(word, str(cm.exception))

        expect(["out_a is [2, 3, 4]", "out_b is [2, 3, 5]"], r(2, 3, 4), r(2, 3), r(2, 3, 5), r(2, 3))
        expect(["out_a is [2, 4]", "out_b is [1, 2, 4]"], r(2, 4), r(2), r(1, 2, 4), r(1, 2))
        expect(["lse_a is [3, 2]", "[2, 3]"], r(2, 3, 4), r(3, 2), r(2, 3, 4), r(2, 3))
        expect(["lse_b is [2, 3, 4]"], r(2, 3, 4), r(2, 3), r(2, 3, 4), r(2, 3, 4))
        expect(["lse_a is [2, 3, 1]"], r(2, 3, 4), r(2, 3, 1), r(2, 3, 4), r(2, 3))
        expect(["lse_b is [1]", "[]"], r(4), 0.0, r(4), r(1))
        expect(["scalar"], 1.0, 0.0, 1.0, 0.0)
        expect(["empty last dim"], r(2, 0), r(2), r(2, 0), r(2))
        with self.assertRaises(TypeError):
            qkv.merge(np.array([["a"]]), r(1), r(1, 1), r(1))
        with self.assertRaises(TypeError):
            qkv.merge(r(1, 1), r(1), r(1, 1), np.array(["x"]))

    def test_non_ok_status_raises_with_the_status_string(self):
        class Lib:  # the real library, but merge reports a status
            def __init__(self, real, status):
                self.real, self.status = real, status

            def __getattr__(self, name):
                return getattr(self.real, name)

            def qkv_attention_merge_f32(self, *args):
                return self.status

        real = qkv._lib
        qkv._lib = Lib(real, qkv.QKV_ERR_INVALID_ARGUMENT)
        try:
            with self.assertRaises(qkv.QkvError) as cm:
                qkv.merge(self.randn(2, 3), self.randn(2), self.randn(2, 3), self.randn(2))
        finally:
            qkv._lib = real
        self.assertEqual(cm.exception.status, qkv.QKV_ERR_INVALID_ARGUMENT)
        self.assertIn("qkv_attention_merge_f32", str(cm.exception))
        self.assertIn(qkv.status_string(qkv.QKV_ERR_INVALID_ARGUMENT), str(cm.exception))
        # the C function itself: what the binding's checks keep it from seeing
        f = qkv._lib.qkv_attention_merge_f32
        x = np.zeros(4, np.float32)
        p = x.ctypes.data
        self.assertEqual(f(-1, 1, p, p, p, p), qkv.QKV_ERR_INVALID_ARGUMENT)
        self.assertEqual(f(1, 0, p, p, p, p), qkv.QKV_ERR_INVALID_ARGUMENT)
        self.assertEqual(f(1, 1, None, p, p, p), qkv.QKV_ERR_INVALID_ARGUMENT)
        self.assertEqual(f(0, 1, None, None, None, None), qkv.QKV_OK)


class TestLibraryLookup(unittest.TestCase):
    def run_python(self, code, env_update, cwd):
        env = {k: v for k, v in os.environ.items()
               if k not in ("QKV_LIBRARY", "LD_LIBRARY_PATH", "PYTHONPATH")}
        env.update(env_update)
        return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd,
                              capture_output=True, text=True)

    def test_lookup_order_and_error(self):
        with tempfile.TemporaryDirectory() as tmp:
            pkg = os.path.join(tmp, "qkv")
            shutil.copytree(PACKAGE_DIR, pkg, ignore=shutil.ignore_patterns("__pycache__"))
            env = {"PYTHONPATH": tmp, "PYTHONDONTWRITEBYTECODE": "1"}
            # nothing anywhere: ImportError listing the places tried
            r = self.run_python("import qkv", env, tmp)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("ImportError", r.stderr)
            self.assertIn("Tried:", r.stderr)
            self.assertIn(os.path.join(pkg, "{libqkv.so.0"), r.stderr)
            self.assertIn("QKV_LIBRARY", r.stderr)
            # QKV_LIBRARY naming a missing file: an error, no fallback
            r = self.run_python("import qkv", dict(env, QKV_LIBRARY=os.path.join(tmp, "nope.so")), tmp)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("QKV_LIBRARY is set but cannot be loaded", r.stderr)
            # the library next to the package
            os.symlink(os.path.realpath(qkv.library_path), os.path.join(pkg, "libqkv.so.0"))
            r = self.run_python("import qkv; print(qkv.library_path)", env, tmp)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.strip(), os.path.join(pkg, "libqkv.so.0"))
            # the system loader (LD_LIBRARY_PATH)
            os.remove(os.path.join(pkg, "libqkv.so.0"))
            libdir = os.path.dirname(os.path.realpath(qkv.library_path))
            r = self.run_python("import qkv; print(qkv.backend())",
                                dict(env, LD_LIBRARY_PATH=libdir), tmp)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.strip(), qkv.backend())


@unittest.skipUnless(HAVE_MATPLOTLIB, "matplotlib is not installed (python3-matplotlib)")
class TestHeatmaps(Case):
    def test_png_and_svg(self):
        w = qkv.attention(self.randn(2, 3, 6, 8), self.randn(2, 3, 9, 8), self.randn(2, 3, 9, 8),
                          causal=True, return_weights=True)[1]
        with tempfile.TemporaryDirectory() as tmp:
            png = os.path.join(tmp, "w.png")
            fig = qkv.show_heatmaps(w, xlabel="Keys", ylabel="Queries",
                                    titles=["head 0", "head 1", "head 2"], figsize=(7, 4), path=png)
            with open(png, "rb") as f:
                data = f.read()
            self.assertGreater(len(data), 1000)
            self.assertEqual(data[:8], b"\x89PNG\r\n\x1a\n")
            svg = os.path.join(tmp, "w.svg")
            qkv.show_heatmaps(np.eye(10).reshape(1, 1, 10, 10), xlabel="Keys", ylabel="Queries",
                              path=svg)
            with open(svg) as f:
                text = f.read()
            self.assertIn("<svg", text)
            self.assertGreater(len(text), 1000)
        # the layout: 2 x 3 panels plus one colorbar, labels on the outer edges
        axes = fig.axes
        self.assertEqual(len(axes), 2 * 3 + 1)
        panels = axes[:6]
        self.assertEqual([a.get_xlabel() for a in panels], [""] * 3 + ["Keys"] * 3)
        self.assertEqual([a.get_ylabel() for a in panels], ["Queries", "", ""] * 2)
        self.assertEqual([a.get_title() for a in panels], ["head 0", "head 1", "head 2"] * 2)
        # one color scale for every panel
        self.assertEqual({a.images[0].get_clim() for a in panels}, {(0.0, float(w.max()))})

    def test_bad_matrices(self):
        with self.assertRaises(ValueError):
            qkv.show_heatmaps(np.zeros((1, 1, 1, 2, 2)), "x", "y", path="unused.png")
        with self.assertRaises(ValueError):
            qkv.show_heatmaps(np.zeros((1, 3, 2, 2)), "x", "y", titles=["a"], path="unused.png")


if __name__ == "__main__":
    unittest.main()
