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


def as4(a):
    a = np.asarray(a, dtype=np.float64)
    return a.reshape((1,) * (4 - a.ndim) + a.shape)


def reference(q, k, v, scale=None, causal=False, valid_lens=None, bias=None, score="dot",
              additive=None):
    """Attention in float64, written from the README's semantics."""
    shape = np.shape(q)
    q, k, v = as4(q), as4(k), as4(v)
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    group = h // hkv
    k = np.repeat(k, group, axis=1)  # query head i reads kv head i // group
    v = np.repeat(v, group, axis=1)
    if scale is None:
        scale = 1.0 / math.sqrt(d)
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
    visible = np.ones((b, h, lq, lk), dtype=bool)
    i = np.arange(lq)[:, None]
    j = np.arange(lk)[None, :]
    if causal:
        visible &= j <= i + lk - lq
    if valid_lens is not None:
        vl = np.asarray(valid_lens)
        if vl.ndim == 0:
            vl = np.full((b,), vl)
        if vl.ndim == 1:
            vl = np.repeat(vl[:, None], lq, axis=1)
        visible &= j[None, None] < vl[:, None, :, None]
    if bias is not None:
        s = s + np.broadcast_to(as4(bias), s.shape)
        visible &= np.isfinite(s)
    s = np.where(visible, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(visible, np.exp(s - m), 0.0)
    den = e.sum(axis=-1, keepdims=True)
    w = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
    out = w @ v
    return (out.reshape(shape[:-1] + (v.shape[-1],)),
            w.reshape(shape[:-1] + (lk,)))


class Case(unittest.TestCase):
    rng = np.random.default_rng(20240601)

    def randn(self, *shape):
        return self.rng.standard_normal(shape).astype(np.float32)

    def check(self, q, k, v, backend=None, **kw):
        out, w = qkv.attention(q, k, v, return_weights=True, backend=backend, **kw)
        want_out, want_w = reference(q, k, v, **kw)
        self.assertEqual(out.dtype, np.float32)
        self.assertEqual(out.shape, want_out.shape)
        self.assertEqual(w.shape, want_w.shape)
        self.assertTrue(np.all(np.isfinite(out)) and np.all(np.isfinite(w)))
        vmax = max(float(np.max(np.abs(v))), 1e-30)
        err_w = float(np.max(np.abs(w - want_w)))
        err_out = float(np.max(np.abs(out - want_out)))
        self.assertLessEqual(err_w, WEIGHTS_TOL, "weights off by %g" % err_w)
        self.assertLessEqual(err_out, OUT_TOL * vmax, "out off by %g (max|v| %g)" % (err_out, vmax))
        return out, w


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
        self.assertValueError(["empty"], r(0, 8), r(5, 8), r(5, 8))
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
        self.assertIsInstance(cm.exception, RuntimeError)
        with self.assertRaises(qkv.QkvError) as cm:
            qkv.attention(x, x, x, scale=float("nan"))
        self.assertEqual(cm.exception.status, qkv.QKV_ERR_INVALID_ARGUMENT)
        self.assertIn(qkv.status_string(qkv.QKV_ERR_INVALID_ARGUMENT), str(cm.exception))


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
