#!/usr/bin/env python3
"""PyTorch beside qkv on the suite's shapes, both called from Python.

    /usr/bin/python3 bench/torch_baseline.py [--rounds N] [--quick] [--out OUT_MD]

What a Python user would otherwise pick: Debian's PyTorch (python3-torch,
1.13, CPU; its matrix products go to OpenBLAS, so OPENBLAS_CORETYPE
applies as for the suite's OpenBLAS rows). Two torch implementations:

  torch matmul   the attention a torch 1.13 user writes: torch.matmul of q
                 and k^T times the scale, masked_fill of the causal mask
                 (precomputed), torch.softmax, torch.matmul with v
  torch sdpa     torch 1.13's own entry, F._scaled_dot_product_attention
                 (is_causal for a causal shape)

GQA is given to torch without copying K and V: q's heads of one group are
stacked as rows of its kv head ([B, Hkv, group * Lq, D]), which is exact for
the non-causal decode shapes it is used on (every row sees every key).
qkv runs through its Python binding (qkv.attention with out= given, so the
binding's per-call work is in the figure as it is in a user's), on its
default backend, one worker; torch with torch.set_num_threads(1).

Timing: ROUNDS rounds; each round runs the three implementations in turn
(the order rotates every round), each one untimed call and then calls until
20 ms have passed (at least 3), and keeps that implementation's mean per
call. The table gives the median over the rounds and, for each torch
implementation, the median over the rounds of its time over qkv's in the
same round. Every output is checked against a float64 numpy oracle first
(max |out - exact| / max |v|).

Writes a markdown section to OUT_MD (default: print only); without torch
the section says it was skipped and the script exits 0. bench/run.sh calls
it and appends the section to report.md. About 20 s on a 2-core machine
(--quick: a few rounds of the small shapes, for the CTest).
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "capi", "python"))

import qkv  # noqa: E402

# name, q_heads, kv_heads, q_len, kv_len, head_dim, causal: the suite's shapes
# (bench/README.md "Benchmarks and shapes"), batch 1, value_dim = head_dim.
SHAPES = [
    ("S1_decode", 32, 32, 1, 4096, 128, False),
    ("S1_gqa8_decode", 64, 8, 1, 4096, 128, False),
    ("S2_prefill", 8, 8, 1024, 1024, 64, True),
    ("S3_small", 4, 4, 128, 128, 64, False),
]
QUICK = ("S3_small", "S1_gqa8_decode")


def section(lines, out_md):
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if out_md:
        with open(out_md, "w") as f:
            f.write(text)


def exact(q, k, v, causal):
    """Attention in float64, written out from the definition."""
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k64 = np.repeat(k64, group, axis=1)
    v64 = np.repeat(v64, group, axis=1)
    s = q64 @ k64.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    if causal:
        lq, lk = s.shape[-2:]
        hidden = np.arange(lk)[None, :] > (lk - lq + np.arange(lq))[:, None]
        s = np.where(hidden, -np.inf, s)
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return p @ v64


def implementations(torch, q, k, v, causal):
    """name -> a function of no arguments that computes the attention."""
    import torch.nn.functional as F

    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    group = h // hkv
    scale = 1.0 / np.sqrt(d)
    qt, kt, vt = (torch.from_numpy(x) for x in (q, k, v))
    # GQA: a group's query heads as rows of their kv head (no K/V copy).
    qg = qt.reshape(b, hkv, group * lq, d)
    mask = None
    if causal:
        mask = torch.ones(lq, lk, dtype=torch.bool).triu(lk - lq + 1)
    out = np.empty((b, h, lq, v.shape[-1]), dtype=np.float32)

    def run_qkv():
        return qkv.attention(q, k, v, causal=causal, out=out)

    def run_matmul():
        s = torch.matmul(qg, kt.transpose(-2, -1)) * scale
        if mask is not None:
            s = s.masked_fill(mask, float("-inf"))
        return torch.matmul(torch.softmax(s, dim=-1), vt).reshape(b, h, lq, -1)

    def run_sdpa():
        o, _ = F._scaled_dot_product_attention(qg, kt, vt, is_causal=causal)
        return o.reshape(b, h, lq, -1)

    impls = {"qkv": run_qkv, "torch matmul": run_matmul}
    if hasattr(F, "_scaled_dot_product_attention"):
        impls["torch sdpa"] = run_sdpa
    return impls


def time_round(fn, min_seconds):
    fn()
    n, start = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - start
        if n >= 3 and elapsed >= min_seconds:
            return elapsed / n


def fmt_time(seconds):
    if seconds >= 1e-3:
        return "%.2f ms" % (seconds * 1e3)
    return "%.1f us" % (seconds * 1e6)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--min-seconds", type=float, default=0.02)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    title = "## PyTorch beside qkv, from Python"
    # One thread: OpenBLAS's own threads (torch's matrix products) would
    # otherwise spin beside torch's and qkv's.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch
    except ImportError as e:
        section([title, "", "Skipped: torch does not import (%s; apt-get install "
                 "python3-torch)." % e], args.out)
        return 0
    torch.set_num_threads(1)
    rounds = 3 if args.quick else args.rounds
    shapes = [s for s in SHAPES if not args.quick or s[0] in QUICK]
    rng = np.random.default_rng(7)
    rows, bad = [], []
    for name, h, hkv, lq, lk, d, causal in shapes:
        q = rng.standard_normal((1, h, lq, d), dtype=np.float32)
        k = rng.standard_normal((1, hkv, lk, d), dtype=np.float32)
        v = rng.standard_normal((1, hkv, lk, d), dtype=np.float32)
        ref = exact(q, k, v, causal)
        impls = implementations(torch, q, k, v, causal)
        errors = {}
        for impl, fn in impls.items():
            got = fn()
            got = got.numpy() if hasattr(got, "numpy") else got
            errors[impl] = float(np.abs(got - ref).max() / np.abs(v).max())
            if not errors[impl] < 1e-4:
                bad.append("%s %s: max err %.3g" % (name, impl, errors[impl]))
        names = list(impls)
        times = {n: [] for n in names}
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for impl in order:
                times[impl].append(time_round(impls[impl], args.min_seconds))
        for impl in names:
            ratio = "-"
            if impl != "qkv":
                ratio = "%.2fx" % statistics.median(
                    t / q_ for t, q_ in zip(times[impl], times["qkv"]))
            rows.append("| %s | %s | %s | %s | %.1e |" % (
                name, impl, fmt_time(statistics.median(times[impl])), ratio, errors[impl]))
        print("torch_baseline: %s done" % name, file=sys.stderr)
    lines = [
        title, "",
        "Both from Python, one thread: qkv through its binding (`qkv.attention`, "
        "backend %s), Debian's PyTorch %s (`torch.set_num_threads(1)`, "
        "OPENBLAS_CORETYPE=%s). Medians of %d interleaved rounds; \"torch / qkv\": "
        "the median of the per-round ratios (above 1: qkv is faster). "
        "`bench/torch_baseline.py` says how each is called." % (
            qkv.backend(), torch.__version__,
            os.environ.get("OPENBLAS_CORETYPE", "(auto)"), rounds),
        "",
        "| shape | implementation | time | torch / qkv | max err |",
        "|---|---|---:|---:|---:|",
    ] + rows
    if bad:
        lines += ["", "ERROR: outputs off the float64 oracle: " + "; ".join(bad)]
    section(lines, args.out)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
