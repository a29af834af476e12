"""d2l's masked softmax with valid lengths, qkv doing the softmax.

masked_softmax(X, valid_lens) turns scores X [batch, queries, keys] into
weights that are zero past each valid length. In qkv the scores come in as
a bias (scale 0 makes q . k contribute nothing, so s = X) and the valid
lengths as QKV_MASK_VALID_LENS, per sequence ([batch]) or per query
([batch, queries]); the values are the identity, so out = weights. These
are d2l's two examples on a 2 x 2 x 4 batch of uniform random scores.

Writes masked_softmax.png into the directory given on the command line.
"""

import os

import numpy as np

from _common import out_dir, qkv, wrote

rng = np.random.default_rng(0)
X = rng.random((2, 2, 4)).astype(np.float32)  # d2l: torch.rand(2, 2, 4)
batch, lq, lk = X.shape
zeros = np.zeros((batch, 1, lq, 1), np.float32)   # q: [B, H=1, Lq, D=1]
keys = np.zeros((batch, 1, lk, 1), np.float32)    # k: [B, 1, Lk, 1]
identity = np.broadcast_to(np.eye(lk, dtype=np.float32), (batch, 1, lk, lk))


def masked_softmax(X, valid_lens):
    out, w = qkv.attention(zeros, keys, identity, scale=0.0, bias=X[:, None],
                           valid_lens=valid_lens, return_weights=True)
    assert np.array_equal(out, w)
    return w[:, 0]


def reference(X, valid_lens):
    vl = np.asarray(valid_lens)
    vl = np.repeat(vl[:, None], lq, axis=1) if vl.ndim == 1 else vl
    e = np.where(np.arange(lk) < vl[..., None], np.exp(X.astype(np.float64)), 0.0)
    return e / e.sum(-1, keepdims=True)


cases = [[2, 3], [[1, 3], [2, 4]]]
panels, titles = [], []
for valid_lens in cases:
    w = masked_softmax(X, valid_lens)
    assert np.allclose(w, reference(X, valid_lens), atol=2e-5)
    print("masked_softmax(X, %s) =\n%s" % (valid_lens, np.round(w, 4)))
    for b in range(batch):
        panels.append(w[b])
        titles.append("batch %d, valid %s" % (b, valid_lens[b]))

path = os.path.join(out_dir(), "masked_softmax.png")
qkv.show_heatmaps(np.stack(panels)[None], xlabel="Keys", ylabel="Queries", titles=titles,
                  figsize=(11, 2.2), path=path)
wrote(path)
