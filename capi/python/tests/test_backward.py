"""Tests of the backward pass: qkv.attention_backward and qkv.torch.attention.

The gradients of libqkv (qkv_attention_backward_f32) against two float64
oracles written here from the semantics of qkv.h: the textbook formulas of
the softmax's backward pass in numpy (always), and PyTorch's own autograd
through a plain float64 attention written in torch (when torch imports;
the two oracles are checked against each other too). The contract: each
gradient within 1e-3 of the largest magnitude of the exact one.

Run with Debian's python3 (python3-numpy; python3-torch for the torch
parts, skipped without it), the package from the source tree and the
library from a build:

    cd capi/python/tests
    QKV_LIBRARY=../../../build/libqkv.so.0 PYTHONPATH=.. /usr/bin/python3 -m unittest -v test_backward

(CTest runs it as python_backward.)
"""

import math
import os
import subprocess
import sys
import unittest

import numpy as np

import qkv
from test_qkv import reference  # the float64 forward pass of the binding's tests

try:
    import torch

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

if HAVE_TORCH:
    import qkv.torch  # noqa: F401  (qkv.torch.attention)

    torch.set_num_threads(1)

# The contract: max |got - exact| <= GRAD_TOL * max |exact|, per gradient;
# ABS_TOL for gradients that are (close to) zero everywhere.
GRAD_TOL = 1e-3
ABS_TOL = 1e-6


def as4(a):
    a = np.asarray(a, dtype=np.float64)
    return a.reshape((1,) * (4 - a.ndim) + a.shape)


# --------------------------------------------------------------------------
# Oracle 1: numpy, the softmax's backward pass by hand
# --------------------------------------------------------------------------

def raw_scores(q4, k4, score, scale):
    """a(q, k) before softcap, bias and ALiBi: [B, H, Lq, Lk] (k per q head)."""
    if score == "dot":
        return scale * np.einsum("bhid,bhjd->bhij", q4, k4)
    diff = q4[:, :, :, None, :] - k4[:, :, None, :, :]
    return -scale * np.sum(diff * diff, axis=-1)


def analytic_grads(q, k, v, d_out, **opts):
    """(d_q, d_k, d_v) in float64, shaped like q, k, v.

    With P the weights (test_qkv.reference) and dO = d_out:
      dV = P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(dO * out))
    (sinks and hidden keys only shape P), then through softcap
    c tanh(s / c): times 1 - tanh(s / c)^2, then through the score:
    dot: dQ = scale dS K, dK = scale dS^T Q; gaussian s = -scale |q - k|^2:
    dQ_i = -2 scale sum_j dS_ij (q_i - k_j), dK_j = 2 scale sum_i dS_ij (q_i - k_j).
    GQA: K and V repeated per query head, dK and dV summed over the group.
    """
    score = opts.get("score", "dot")
    out, w = reference(q, k, v, **opts)
    q4, k4, v4 = as4(q), as4(k), as4(v)
    p, o, do = as4(w), as4(out), as4(d_out)
    b, h, lq, d = q4.shape
    hkv, lk, dv = k4.shape[1], k4.shape[2], v4.shape[3]
    g = h // hkv
    ke, ve = np.repeat(k4, g, axis=1), np.repeat(v4, g, axis=1)
    scale = opts.get("scale")
    scale = float(np.float32(1.0 / math.sqrt(d) if scale is None else scale))
    d_v = np.einsum("bhij,bhic->bhjc", p, do)
    d_p = np.einsum("bhic,bhjc->bhij", do, ve)
    ds = p * (d_p - np.sum(do * o, axis=-1, keepdims=True))
    if opts.get("softcap"):
        c = float(np.float32(opts["softcap"]))
        ds = ds * (1.0 - np.tanh(raw_scores(q4, ke, score, scale) / c) ** 2)
    if score == "dot":
        d_q = scale * np.einsum("bhij,bhjd->bhid", ds, ke)
        d_k = scale * np.einsum("bhij,bhid->bhjd", ds, q4)
    else:
        d_q = -2.0 * scale * (q4 * ds.sum(-1)[..., None] - np.einsum("bhij,bhjd->bhid", ds, ke))
        d_k = 2.0 * scale * (np.einsum("bhij,bhid->bhjd", ds, q4) - ds.sum(-2)[..., None] * ke)
    d_k = d_k.reshape(b, hkv, g, lk, d).sum(axis=2)
    d_v = d_v.reshape(b, hkv, g, lk, dv).sum(axis=2)
    return (d_q.reshape(np.shape(q)), d_k.reshape(np.shape(k)), d_v.reshape(np.shape(v)))


# --------------------------------------------------------------------------
# Oracle 2: torch autograd through a plain float64 attention
# --------------------------------------------------------------------------

def torch_attention(q, k, v, scale=None, causal=False, valid_lens=None, bias=None, score="dot",
                    window=None, alibi_slopes=None, softcap=None, sinks=None, q_pos=None,
                    kv_start=None):
    """Attention in torch (any float dtype), differentiable by autograd.

    q, k, v: tensors [Lq, D], [H, Lq, D] or [B, H, Lq, D] (k, v with Hkv
    heads). The options as numpy-compatible values, with qkv.attention's
    meaning. Returns (out, lse) shaped like q with the last dim Dv, and q
    without it.
    """
    shape = q.shape
    q4, k4, v4 = (t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)) for t in (q, k, v))
    b, h, lq, d = q4.shape
    hkv, lk = k4.shape[1], k4.shape[2]
    k4 = k4.repeat_interleave(h // hkv, dim=1)  # query head i reads kv head i // group
    v4 = v4.repeat_interleave(h // hkv, dim=1)
    f64 = dict(dtype=q.dtype)
    scale = float(np.float32(1.0 / math.sqrt(d) if scale is None else scale))
    if score == "dot":
        s = scale * (q4 @ k4.transpose(-1, -2))
    else:
        s = -scale * ((q4[:, :, :, None, :] - k4[:, :, None, :, :]) ** 2).sum(-1)
    if softcap:
        c = float(np.float32(softcap))
        s = c * torch.tanh(s / c)
    first = (torch.full((b,), lk - lq, dtype=torch.int64) if q_pos is None
             else torch.as_tensor(np.broadcast_to(np.asarray(q_pos, dtype=np.int64), (b,)).copy()))
    pos = (first[:, None] + torch.arange(lq)[None, :])[:, None, :, None]  # [b, 1, lq, 1]
    key = torch.arange(lk)[None, None, None, :]
    visible = torch.ones((b, h, lq, lk), dtype=torch.bool)
    if causal:
        visible &= key <= pos
    if valid_lens is not None:
        vl = torch.as_tensor(np.asarray(valid_lens, dtype=np.int64))
        if vl.dim() == 0:
            vl = vl.expand(b)
        vl = vl[:, None, None, None] if vl.dim() == 1 else vl[:, None, :, None]
        visible &= key < vl
    if window is not None:
        left, right = window
        if left is not None and left >= 0:
            visible &= key >= pos - left
        if right is not None and right >= 0:
            visible &= key <= pos + right
    if kv_start is not None:
        ks = torch.as_tensor(np.broadcast_to(np.asarray(kv_start, dtype=np.int64), (b,)).copy())
        visible &= key >= ks[:, None, None, None]
    if bias is not None:
        full = torch.as_tensor(np.asarray(bias, dtype=np.float32).astype(np.float64))
        full = full.reshape((1,) * (4 - full.dim()) + tuple(full.shape)).expand(b, h, lq, lk)
        visible &= full != -math.inf
        s = s + torch.where(torch.isfinite(full), full, torch.zeros((), **f64)).to(q.dtype)
    if alibi_slopes is not None:
        slopes = torch.as_tensor(np.broadcast_to(np.float32(alibi_slopes), (h,)).astype(np.float64))
        s = s - slopes.to(q.dtype)[None, :, None, None] * (pos - key).abs().to(q.dtype)
    s = torch.where(visible, s, torch.full((), -math.inf, **f64))
    sink = torch.full((h,), -math.inf, **f64)
    if sinks is not None:
        sink = torch.as_tensor(np.broadcast_to(np.float32(sinks), (h,)).astype(np.float64))
    logits = torch.cat([s, sink.to(q.dtype)[None, :, None, None].expand(b, h, lq, 1)], dim=-1)
    m = logits.max(dim=-1, keepdim=True).values.detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros((), **f64))
    e = torch.exp(logits - m)  # hidden keys and absent sinks: exp(-inf) = 0
    den = e.sum(dim=-1, keepdim=True)
    w = e[..., :lk] / torch.where(den > 0, den, torch.ones((), **f64))
    out = w @ v4
    lse = torch.where(den > 0, m + torch.log(den), torch.full((), -math.inf, **f64))
    return out.reshape(tuple(shape[:-1]) + (v4.shape[-1],)), lse.reshape(tuple(shape[:-1]))


def autograd_grads(q, k, v, d_out, **opts):
    """(d_q, d_k, d_v) in float64 by torch autograd, shaped like q, k, v."""
    ts = [torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True) for a in (q, k, v)]
    out, _ = torch_attention(*ts, **opts)
    out.backward(torch.tensor(np.asarray(d_out, dtype=np.float64)))
    return tuple(t.grad.numpy() for t in ts)


# --------------------------------------------------------------------------
# The cases: every score, mask and variant, GQA, odd sizes
# --------------------------------------------------------------------------

def make_case(seed, dims, scale_q=1.0, **opts):
    """Inputs for one case: dims (B, H, Hkv, Lq, Lk, D, Dv); B None: 3-D
    [H, Lq, D]; B and H None: 2-D [Lq, D]. Callable options are made from
    the rng and the dims."""
    rng = np.random.default_rng(seed)
    b, h, hkv, lq, lk, d, dv = dims
    lead_q = tuple(x for x in (b, h) if x is not None)
    lead_k = tuple(x for x in (b, hkv) if x is not None)
    q = (scale_q * rng.standard_normal(lead_q + (lq, d))).astype(np.float32)
    k = rng.standard_normal(lead_k + (lk, d)).astype(np.float32)
    v = rng.standard_normal(lead_k + (lk, dv)).astype(np.float32)
    d_out = rng.standard_normal(lead_q + (lq, dv)).astype(np.float32)
    opts = {n: (x(rng) if callable(x) else x) for n, x in opts.items()}
    return q, k, v, d_out, opts


def hiding_bias(shape, fraction=0.2):
    """A bias of normal values with about `fraction` of them -inf."""
    def make(rng):
        bias = rng.standard_normal(shape).astype(np.float32)
        bias[rng.random(shape) < fraction] = -np.inf
        return bias
    return make


SLOPES = [0.5, 0.25, 0.125, 0.0625]

CASES = [
    # name, seed, dims (B, H, Hkv, Lq, Lk, D, Dv), options
    ("dot 2-D", 1, (None, None, None, 7, 16, 16, 7), {}),
    ("dot 3-D", 2, (None, 2, 2, 16, 7, 33, 16), {}),
    ("sizes 1", 3, (1, 1, 1, 1, 1, 1, 1), {}),
    ("sizes 1 causal", 4, (1, 1, 1, 1, 1, 1, 1), dict(causal=True)),
    ("GQA 4/2", 5, (2, 4, 2, 33, 65, 16, 7), {}),
    ("MQA 4/1 causal", 6, (2, 4, 1, 16, 16, 16, 16), dict(causal=True)),
    ("large 65", 7, (1, 2, 1, 65, 65, 65, 33), dict(causal=True)),
    ("causal Lq < Lk", 8, (2, 2, 1, 7, 33, 16, 16), dict(causal=True)),
    ("causal Lq > Lk (rows that see nothing)", 9, (1, 2, 2, 33, 16, 7, 7), dict(causal=True)),
    ("scale 0 (uniform)", 10, (1, 2, 1, 7, 16, 16, 7), dict(scale=0.0)),
    ("scale 2", 11, (1, 2, 1, 16, 33, 7, 7), dict(scale=2.0)),
    ("valid_lens [B] with 0", 12, (3, 2, 1, 7, 16, 16, 7), dict(valid_lens=[16, 0, 5])),
    ("valid_lens [B, Lq]", 13, (2, 2, 2, 7, 16, 7, 16),
     dict(valid_lens=lambda rng: rng.integers(0, 17, (2, 7)))),
    ("bias [Lq, Lk] with -inf", 14, (2, 4, 2, 16, 33, 16, 16), dict(bias=hiding_bias((16, 33)))),
    ("bias [B, H, Lq, Lk]", 15, (2, 2, 1, 7, 16, 16, 7), dict(bias=hiding_bias((2, 2, 7, 16)))),
    ("bias [B, 1, 1, Lk] hiding everything in a batch", 16, (2, 2, 2, 7, 16, 7, 7),
     dict(bias=np.concatenate([np.zeros((1, 1, 1, 16)), np.full((1, 1, 1, 16), -np.inf)]))),
    ("window (3, 2)", 17, (2, 2, 1, 16, 33, 16, 7), dict(window=(3, 2))),
    ("window (4, None) causal", 18, (1, 4, 2, 33, 33, 7, 7), dict(window=(4, None), causal=True)),
    ("window (0, 0)", 19, (1, 2, 1, 16, 16, 16, 7), dict(window=(0, 0))),
    ("alibi causal", 20, (2, 4, 2, 16, 33, 16, 16), dict(alibi_slopes=SLOPES, causal=True)),
    ("alibi q_pos", 21, (2, 4, 4, 7, 33, 16, 7), dict(alibi_slopes=SLOPES, q_pos=[-3, 40])),
    ("softcap", 22, (2, 2, 1, 16, 33, 16, 16), dict(softcap=2.0, scale=1.0)),
    ("sinks", 23, (2, 4, 2, 16, 16, 16, 7), dict(sinks=[0.5, -1.0, 2.0, -np.inf])),
    ("sinks with rows that see nothing", 24, (2, 2, 1, 7, 16, 7, 7),
     dict(sinks=[1.0, -np.inf], valid_lens=[0, 9])),
    ("q_pos causal (negative, past Lk)", 25, (3, 2, 1, 7, 16, 16, 16),
     dict(q_pos=[-4, 3, 20], causal=True)),
    ("kv_start", 26, (3, 2, 2, 16, 33, 7, 16), dict(kv_start=[0, 12, 33])),
    ("gaussian 1-D (Nadaraya-Watson)", 27, (None, None, None, 50, 49, 1, 1), dict(score="gaussian",
                                                                             scale=0.5)),
    ("gaussian GQA causal", 28, (2, 4, 2, 16, 33, 7, 16), dict(score="gaussian", causal=True)),
    ("gaussian softcap alibi sinks", 29, (2, 2, 1, 16, 16, 16, 7),
     dict(score="gaussian", softcap=3.0, alibi_slopes=[0.3, 0.1], sinks=[0.0, 1.0])),
    ("gaussian valid_lens bias window", 30, (2, 2, 2, 33, 65, 16, 7),
     dict(score="gaussian", scale=0.1, valid_lens=[65, 40], bias=hiding_bias((33, 65), 0.1),
          window=(8, 8))),
    ("dot: every variant", 31, (2, 4, 2, 16, 33, 16, 16),
     dict(causal=True, valid_lens=lambda rng: rng.integers(0, 34, (2, 16)),
          bias=hiding_bias((2, 1, 16, 33), 0.1), window=(20, None), alibi_slopes=SLOPES,
          softcap=5.0, sinks=[0.0, -np.inf, 1.0, 3.0], q_pos=[10, 17], kv_start=[2, 0])),
    ("gaussian: every variant", 32, (2, 4, 1, 33, 65, 7, 16),
     dict(score="gaussian", scale=0.2, causal=True, valid_lens=[60, 65],
          bias=hiding_bias((33, 65), 0.1), window=(30, 2), alibi_slopes=SLOPES, softcap=4.0,
          sinks=[1.0, -np.inf, 0.0, 2.0], q_pos=[30, 20], kv_start=[1, 5])),
]


class GradCase(unittest.TestCase):
    def assertGradClose(self, got, want, what):
        want = np.asarray(want, dtype=np.float64)
        self.assertEqual(got.shape, want.shape, what)
        self.assertTrue(np.all(np.isfinite(got)), "%s: not finite" % what)
        bound = GRAD_TOL * float(np.max(np.abs(want), initial=0.0)) + ABS_TOL
        err = float(np.max(np.abs(got - want), initial=0.0))
        self.assertLessEqual(err, bound, "%s: off by %g (bound %g)" % (what, err, bound))

    def forward(self, q, k, v, opts):
        out, lse = qkv.attention(q, k, v, return_lse=True, **opts)
        self.assertEqual(out.dtype, np.float32)
        return out, lse


# --------------------------------------------------------------------------
# qkv.attention_backward (numpy)
# --------------------------------------------------------------------------

class AttentionBackward(GradCase):
    def test_cases(self):
        """Every case against the numpy oracle (and torch autograd if present)."""
        for name, seed, dims, options in CASES:
            with self.subTest(name):
                q, k, v, d_out, opts = make_case(seed, dims, **options)
                out, lse = self.forward(q, k, v, opts)
                got = qkv.attention_backward(q, k, v, out, lse, d_out, **opts)
                want = analytic_grads(q, k, v, d_out, **opts)
                for n, g, w, x in zip("qkv", got, want, (q, k, v)):
                    self.assertEqual(g.dtype, np.float32)
                    self.assertEqual(g.shape, x.shape)
                    self.assertGradClose(g, w, "%s: d_%s" % (name, n))
                if HAVE_TORCH:
                    for n, g, w in zip("qkv", got, autograd_grads(q, k, v, d_out, **opts)):
                        self.assertGradClose(g, w, "%s: d_%s (torch autograd)" % (name, n))

    def test_every_backend(self):
        """Each engine of this build and CPU (backend=) within the bound."""
        names = ("GQA 4/2", "softcap", "dot: every variant", "gaussian: every variant")
        for backend in qkv.backends():
            for name, seed, dims, options in (c for c in CASES if c[0] in names):
                with self.subTest(backend=backend, case=name):
                    q, k, v, d_out, opts = make_case(seed, dims, backend=backend, **options)
                    out, lse = self.forward(q, k, v, opts)
                    got = qkv.attention_backward(q, k, v, out, lse, d_out, **opts)
                    del opts["backend"]
                    want = analytic_grads(q, k, v, d_out, **opts)
                    for n, g, w in zip("qkv", got, want):
                        self.assertGradClose(g, w, "%s on %s: d_%s" % (name, backend, n))

    def test_hidden_keys_and_rows_get_zero(self):
        # Batch 1 sees no key (valid length 0), keys >= 5 of batch 0 are seen
        # by nobody: their d_k and d_v are 0, and so is d_q of batch 1.
        q, k, v, d_out, opts = make_case(40, (2, 2, 1, 7, 16, 16, 7), valid_lens=[5, 0])
        out, lse = self.forward(q, k, v, opts)
        d_q, d_k, d_v = qkv.attention_backward(q, k, v, out, lse, d_out, **opts)
        self.assertTrue(np.all(d_q[1] == 0))
        self.assertTrue(np.all(d_k[0, :, 5:] == 0) and np.all(d_v[0, :, 5:] == 0))
        self.assertTrue(np.all(d_k[1] == 0) and np.all(d_v[1] == 0))
        self.assertTrue(np.any(d_k[0, :, :5] != 0) and np.any(d_v[0, :, :5] != 0))

    def test_wrt_skips(self):
        q, k, v, d_out, opts = make_case(41, (2, 4, 2, 16, 33, 16, 7), causal=True)
        out, lse = self.forward(q, k, v, opts)
        full = qkv.attention_backward(q, k, v, out, lse, d_out, **opts)
        for wrt in ("q", "k", "v", "qv", "kv", "", ("k", "q")):
            with self.subTest(wrt=wrt):
                got = qkv.attention_backward(q, k, v, out, lse, d_out, wrt=wrt, **opts)
                for n, g, f in zip("qkv", got, full):
                    if n in wrt:
                        np.testing.assert_array_equal(g, f)
                    else:
                        self.assertIsNone(g)

    def test_deterministic(self):
        q, k, v, d_out, opts = make_case(42, (2, 4, 2, 33, 65, 16, 16), causal=True, sinks=0.5)
        out, lse = self.forward(q, k, v, opts)
        a = qkv.attention_backward(q, k, v, out, lse, d_out, **opts)
        b = qkv.attention_backward(q, k, v, out, lse, d_out, **opts)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)

    def test_layouts_and_dtypes(self):
        """Views, float64 and lists are copied to dense float32: same result."""
        q, k, v, d_out, opts = make_case(43, (2, 2, 1, 16, 33, 16, 7), window=(5, 5))
        out, lse = self.forward(q, k, v, opts)
        want = qkv.attention_backward(q, k, v, out, lse, d_out, **opts)
        # token-major storage viewed as [B, H, L, D]; reversed rows of a copy
        qt = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
        kt = np.ascontiguousarray(k[:, :, ::-1])[:, :, ::-1]
        got = qkv.attention_backward(qt, kt, v.astype(np.float64), out.astype(np.float64),
                                     lse.tolist(), np.asfortranarray(d_out), **opts)
        for g, w in zip(got, want):
            self.assertEqual(g.dtype, np.float32)
            np.testing.assert_array_equal(g, w)
        # the float64 results of a float64 forward call
        out64, lse64 = qkv.attention(q.astype(np.float64), k, v, return_lse=True, **opts)
        self.assertEqual(out64.dtype, np.float64)
        got = qkv.attention_backward(q, k, v, out64, lse64, d_out, **opts)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)

    def test_empty(self):
        """B, Lq or Lk 0: gradients of the right shapes, all 0."""
        for dims in ((0, 2, 1, 7, 16, 8, 4), (2, 2, 1, 0, 16, 8, 4), (2, 2, 1, 7, 0, 8, 4)):
            with self.subTest(dims=dims):
                q, k, v, d_out, opts = make_case(44, dims, causal=True)
                out, lse = self.forward(q, k, v, opts)
                got = qkv.attention_backward(q, k, v, out, lse, d_out, **opts)
                for g, x in zip(got, (q, k, v)):
                    self.assertEqual(g.shape, x.shape)
                    self.assertTrue(np.all(g == 0))

    def test_unsupported(self):
        q, k, v, d_out, _ = make_case(45, (1, 2, 1, 7, 16, 8, 8))
        out, lse = qkv.attention(q, k, v, return_lse=True)
        hidden = 5
        rng = np.random.default_rng(0)
        additive = (rng.standard_normal((hidden, 8)), rng.standard_normal((hidden, 8)),
                    rng.standard_normal(hidden))
        with self.assertRaises(qkv.QkvUnsupported) as cm:
            qkv.attention_backward(q, k, v, out, lse, d_out, score="additive", additive=additive)
        self.assertIsInstance(cm.exception, NotImplementedError)
        self.assertEqual(cm.exception.status, qkv.QKV_ERR_UNSUPPORTED)
        self.assertIn("backward pass", str(cm.exception))
        for dtype in ("f16", "bf16", "int8"):
            with self.subTest(kv_dtype=dtype):
                with self.assertRaises(qkv.QkvUnsupported) as cm:
                    qkv.attention_backward(q, k, v, out, lse, d_out, kv_dtype=dtype)
                self.assertIn(dtype, str(cm.exception))
        # f32 by name is the default
        got = qkv.attention_backward(q, k, v, out, lse, d_out, kv_dtype="f32")
        want = qkv.attention_backward(q, k, v, out, lse, d_out)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)

    def test_bad_arguments(self):
        q, k, v, d_out, _ = make_case(46, (1, 2, 1, 7, 16, 8, 4))
        out, lse = qkv.attention(q, k, v, return_lse=True)
        bad = [
            (dict(out=out[..., :3]), ValueError, "out"),
            (dict(d_out=d_out[:, :, :6]), ValueError, "d_out"),
            (dict(lse=lse[..., None]), ValueError, "lse"),
            (dict(v=v[:, :, :15]), ValueError, "values"),
            (dict(wrt="qx"), ValueError, "wrt"),
            (dict(kv_dtype="f64"), ValueError, "kv_dtype"),
            (dict(score="cosine"), ValueError, "score"),
        ]
        base = dict(q=q, k=k, v=v, out=out, lse=lse, d_out=d_out)
        for change, exc, word in bad:
            with self.subTest(change=sorted(change)):
                kw = dict(base, **change)
                args = [kw.pop(n) for n in ("q", "k", "v", "out", "lse", "d_out")]
                with self.assertRaises(exc) as cm:
                    qkv.attention_backward(*args, **kw)
                self.assertIn(word, str(cm.exception))
        # what the forward call refuses, the backward call refuses, saying why
        with self.assertRaises(qkv.QkvInvalidArgument) as cm:
            qkv.attention_backward(q, k, v, out, lse, d_out, softcap=-1.0)
        self.assertIn("softcap", str(cm.exception))
        with self.assertRaises(qkv.QkvInvalidArgument):
            qkv.attention_backward(q, k, v, out, lse, d_out, sinks=np.nan)

    def test_import_qkv_does_not_import_torch(self):
        code = "import sys, qkv; assert 'torch' not in sys.modules, 'torch imported'"
        subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


# --------------------------------------------------------------------------
# The oracles against each other
# --------------------------------------------------------------------------

@unittest.skipUnless(HAVE_TORCH, "torch not importable (apt-get install python3-torch)")
class Oracles(GradCase):
    def test_oracles_agree(self):
        """numpy by hand == torch autograd, and both forwards == qkv.attention."""
        for name, seed, dims, options in CASES:
            with self.subTest(name):
                q, k, v, d_out, opts = make_case(seed, dims, **options)
                a = analytic_grads(q, k, v, d_out, **opts)
                b = autograd_grads(q, k, v, d_out, **opts)
                for n, x, y in zip("qkv", a, b):
                    bound = 1e-9 * float(np.max(np.abs(y), initial=0.0)) + 1e-12
                    self.assertLessEqual(float(np.max(np.abs(x - y), initial=0.0)), bound,
                                         "%s: d_%s" % (name, n))
                out, lse = self.forward(q, k, v, opts)
                t_out, t_lse = torch_attention(*(torch.tensor(x, dtype=torch.float64)
                                                 for x in (q, k, v)), **opts)
                vmax = max(float(np.max(np.abs(v), initial=0.0)), 1e-30)
                self.assertLessEqual(float(np.max(np.abs(out - t_out.numpy()), initial=0.0)),
                                     5e-5 * vmax, name)
                t_lse = t_lse.numpy()
                np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(t_lse), name)
                fin = np.isfinite(t_lse)
                np.testing.assert_allclose(lse[fin], t_lse[fin], rtol=2e-5, atol=2e-5,
                                           err_msg=name)


# --------------------------------------------------------------------------
# qkv.torch.attention (autograd.Function)
# --------------------------------------------------------------------------

@unittest.skipUnless(HAVE_TORCH, "torch not importable (apt-get install python3-torch)")
class TorchFunction(GradCase):
    def test_gradients_match_float64_autograd(self):
        """out.backward(d_out) through qkv.torch.attention vs float64 autograd."""
        for name, seed, dims, options in CASES:
            with self.subTest(name):
                q, k, v, d_out, opts = make_case(seed, dims, **options)
                ts = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
                out = qkv.torch.attention(*ts, **opts)
                self.assertEqual(out.dtype, torch.float32)
                self.assertTrue(out.requires_grad)
                out.backward(torch.tensor(d_out))
                want = autograd_grads(q, k, v, d_out, **opts)
                for n, t, w in zip("qkv", ts, want):
                    self.assertEqual(t.grad.shape, t.shape)
                    self.assertGradClose(t.grad.numpy(), w, "%s: d_%s" % (name, n))
                t_out, _ = torch_attention(*(torch.tensor(x, dtype=torch.float64)
                                             for x in (q, k, v)), **opts)
                vmax = max(float(np.max(np.abs(v), initial=0.0)), 1e-30)
                self.assertLessEqual(float((out.detach().double() - t_out).abs().max()) if
                                     out.numel() else 0.0, 5e-5 * vmax, name)

    def test_options_as_tensors(self):
        q, k, v, d_out, opts = make_case(50, (2, 4, 2, 16, 33, 16, 7), causal=True,
                                         valid_lens=[30, 20], bias=hiding_bias((16, 33)),
                                         alibi_slopes=SLOPES, sinks=[0.0, 1.0, -1.0, 2.0])
        topts = dict(opts)
        for n in ("valid_lens", "bias", "alibi_slopes", "sinks"):
            topts[n] = torch.tensor(np.asarray(opts[n]))
        ts = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
        qkv.torch.attention(*ts, **topts).backward(torch.tensor(d_out))
        for n, t, w in zip("qkv", ts, autograd_grads(q, k, v, d_out, **opts)):
            self.assertGradClose(t.grad.numpy(), w, "d_" + n)

    def test_needs_input_grad_skips(self):
        """Only the gradients autograd needs are asked for (wrt)."""
        q, k, v, d_out, opts = make_case(51, (2, 4, 2, 16, 16, 16, 7), causal=True)
        want = autograd_grads(q, k, v, d_out, **opts)
        calls = []
        real = qkv.attention_backward

        def recording(*args, **kwargs):
            calls.append(kwargs["wrt"])
            return real(*args, **kwargs)

        qkv.attention_backward = recording
        try:
            for need in ("q", "k", "v", "kv", "qv", "qkv"):
                with self.subTest(need=need):
                    del calls[:]
                    ts = [torch.tensor(x, requires_grad=(n in need)) for n, x in zip("qkv",
                                                                                     (q, k, v))]
                    qkv.torch.attention(*ts, **opts).backward(torch.tensor(d_out))
                    self.assertEqual(calls, [need])
                    for n, t, w in zip("qkv", ts, want):
                        if n in need:
                            self.assertGradClose(t.grad.numpy(), w, "d_" + n)
                        else:
                            self.assertIsNone(t.grad)
            # nothing requires grad: no graph, no backward call
            del calls[:]
            out = qkv.torch.attention(*(torch.tensor(x) for x in (q, k, v)), **opts)
            self.assertFalse(out.requires_grad)
            with torch.no_grad():
                out = qkv.torch.attention(*(torch.tensor(x, requires_grad=True)
                                            for x in (q, k, v)), **opts)
            self.assertFalse(out.requires_grad)
            self.assertEqual(calls, [])
        finally:
            qkv.attention_backward = real

    def test_non_contiguous_and_composed(self):
        """Views in, a grad that is not contiguous (from sum), other ops around."""
        rng = np.random.default_rng(52)
        x = torch.tensor(rng.standard_normal((2, 16, 4, 8)).astype(np.float32),
                         requires_grad=True)  # [B, L, H, D]: token-major
        w = torch.tensor(rng.standard_normal((8, 8)).astype(np.float32), requires_grad=True)

        def loss(x, w, attend):
            q = (x @ w).transpose(1, 2)  # [B, H, L, D], not contiguous
            k = x.transpose(1, 2)[:, ::2]  # 2 kv heads: a strided view
            v = torch.tanh(x).transpose(1, 2)[:, 1::2]
            return attend(q, k, v).sum() + 0.5 * attend(q, k, v)[:, :, -1].square().sum()

        l_qkv = loss(x, w, lambda q, k, v: qkv.torch.attention(q, k, v, causal=True))
        gx, gw = torch.autograd.grad(l_qkv, (x, w))
        x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        l_ref = loss(x64, w64, lambda q, k, v: torch_attention(q, k, v, causal=True)[0])
        rx, rw = torch.autograd.grad(l_ref, (x64, w64))
        self.assertAlmostEqual(float(l_qkv), float(l_ref), delta=1e-4 * abs(float(l_ref)))
        # the error through the chain stays at the level of the contract
        self.assertGradClose(gx.numpy(), rx.numpy(), "d_x")
        self.assertGradClose(gw.numpy(), rw.numpy(), "d_w")

    def test_training_steps_follow_torch(self):
        """A few SGD steps: the same parameters as with float64 torch attention."""
        rng = np.random.default_rng(53)
        data = rng.standard_normal((4, 12, 8))
        target = rng.standard_normal((4, 2, 12, 8))
        w0 = rng.standard_normal((3, 8, 16)) * 0.3

        def train(attend, dtype):
            w = torch.tensor(w0, dtype=dtype, requires_grad=True)
            opt = torch.optim.SGD([w], lr=0.05)
            xs, ys = torch.tensor(data, dtype=dtype), torch.tensor(target, dtype=dtype)
            losses = []
            for _ in range(10):
                opt.zero_grad()
                q, k, v = ((xs @ w[i]).reshape(4, 12, 2, 8).transpose(1, 2) for i in range(3))
                loss = (attend(q, k, v) - ys).square().mean()
                loss.backward()
                opt.step()
                losses.append(float(loss))
            return w.detach().double().numpy(), losses

        opts = dict(causal=True, window=(4, 0), sinks=[0.0, 1.0])
        w_qkv, l_qkv = train(lambda q, k, v: qkv.torch.attention(q, k, v, **opts), torch.float32)
        w_ref, l_ref = train(lambda q, k, v: torch_attention(q, k, v, **opts)[0], torch.float64)
        np.testing.assert_allclose(l_qkv, l_ref, rtol=1e-4)
        np.testing.assert_allclose(w_qkv, w_ref, atol=1e-4)
        self.assertLess(l_qkv[-1], l_qkv[0])

    def test_errors(self):
        q, k, v, _, _ = make_case(54, (1, 2, 1, 7, 16, 8, 8))
        tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
        with self.assertRaises(qkv.QkvUnsupported):
            qkv.torch.attention(tq, tk, tv, score="additive")
        with self.assertRaises(TypeError):
            qkv.torch.attention(tq.double(), tk, tv)
        with self.assertRaises(TypeError):
            qkv.torch.attention(q, tk, tv)  # numpy, not a tensor
        bias = torch.zeros(7, 16, requires_grad=True)
        with self.assertRaisesRegex(ValueError, "bias"):
            qkv.torch.attention(tq, tk, tv, bias=bias)
        out = qkv.torch.attention(tq, tk, tv, bias=bias.detach())  # as a constant: fine
        out.sum().backward()
        self.assertIsNone(bias.grad)
        # not twice differentiable
        out = qkv.torch.attention(tq, tk, tv)
        (g,) = torch.autograd.grad(out.sum(), tq, create_graph=True)
        with self.assertRaises(RuntimeError):
            g.sum().backward()
        # in-place change of the saved output is caught by autograd
        out = qkv.torch.attention(tq, tk, tv)
        out.add_(1.0)
        with self.assertRaises(RuntimeError):
            out.sum().backward()


if __name__ == "__main__":
    unittest.main()
