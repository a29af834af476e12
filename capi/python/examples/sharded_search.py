"""A sharded differentiable search engine: attention per shard, qkv.merge.

Attention is a soft database lookup: a query is compared with every
document's key, the scores become weights by softmax, and the answer is the
weighted mean of the documents' values. Here the database holds N = 400
documents whose keys are positions x_i in [0, 8) (a 1-D embedding) and
whose values are noisy samples y_i = 2 sin(x_i) + x_i^0.8 + noise, scored
with the Gaussian kernel (Nadaraya-Watson regression, sigma = 0.25): the
answer to a query x is a smooth estimate of the function at x.

The database is too big for one machine (pretend): it is split by key range
into S = 4 shards of 100 documents. Each shard answers every query on its
own, one qkv.attention call with return_lse=True, giving its own answer and
lse = log(sum of exp of its scores). qkv.merge combines the shards' answers,
in shard order, into exactly the answer over all the documents: each shard
counts with the weight exp(lse_shard - lse_merged). That is checked against
one call over the whole database and a float64 numpy computation.

Writes sharded_search.png into the directory given on the command line:
  left:   the attention weights over the documents for four queries, as one
          call over all documents computes them (line) and as rebuilt from
          each shard's own weights times exp(lse_shard - lse_merged) (dots,
          one color per shard); the shard boundaries dashed;
  middle: each shard's share of the answer, exp(lse_shard - lse_merged),
          against the query: they add up to 1;
  right:  the merged answer beside one call's and each shard's answer on
          its own (which knows nothing outside its range).
"""

import os

import matplotlib.pyplot as plt
import numpy as np

from _common import out_dir, qkv, wrote


def f(x):
    return 2 * np.sin(x) + x ** 0.8


rng = np.random.default_rng(7)
n_docs, n_shards, sigma = 400, 4, 0.25
scale = 1 / (2 * sigma ** 2)
keys = np.sort(rng.random(n_docs) * 8).astype(np.float32)  # one key per document, sorted
values = (f(keys) + rng.normal(0.0, 0.5, n_docs)).astype(np.float32)
bounds = np.linspace(0, n_docs, n_shards + 1).astype(int)  # shard s: documents [b_s, b_s+1)
edges = [(keys[b - 1] + keys[b]) / 2 for b in bounds[1:-1]]  # the boundaries in key space

# The queries: a grid for the curves, and four to show weights for (two of
# them near a shard boundary, where two shards share the answer).
grid = np.linspace(0, 8, 321, dtype=np.float32)
shown = np.array([1.0, edges[0], 4.9, edges[2] + 0.15], dtype=np.float32)
queries = np.concatenate([grid, shown])[:, None]  # [Lq, D=1]
lq = len(queries)
print("qkv %s on %s: %d documents in %d shards, %d queries"
      % (qkv.version(), qkv.backend(), n_docs, n_shards, lq))

# Each shard: one call over its own documents, with its weights and lse.
shards = []
for s in range(n_shards):
    lo, hi = bounds[s], bounds[s + 1]
    out, w, lse = qkv.attention(queries, keys[lo:hi, None], values[lo:hi, None],
                                score="gaussian", scale=scale, return_weights=True,
                                return_lse=True)
    shards.append((out, w, lse))  # [Lq, 1], [Lq, hi - lo], [Lq]

# Combine them in shard order.
out, lse = shards[0][0], shards[0][2]
for s in range(1, n_shards):
    out, lse = qkv.merge(out, lse, shards[s][0], shards[s][2])

# One call over the whole database, and float64 numpy, for comparison.
one_out, one_w, one_lse = qkv.attention(queries, keys[:, None], values[:, None],
                                        score="gaussian", scale=scale, return_weights=True,
                                        return_lse=True)
scores = -scale * (queries.astype(np.float64) - keys[None, :].astype(np.float64)) ** 2
top = scores.max(axis=1, keepdims=True)
exact_lse = top[:, 0] + np.log(np.exp(scores - top).sum(axis=1))
exact_w = np.exp(scores - exact_lse[:, None])
exact_out = exact_w @ values.astype(np.float64)

# The global weights rebuilt from the shards: shard s's weights times its
# share exp(lse_s - lse_merged).
share = np.stack([np.exp(sh[2].astype(np.float64) - lse) for sh in shards])  # [S, Lq]
rebuilt = np.concatenate([sh[1] * share[s][:, None] for s, sh in enumerate(shards)], axis=1)

vmax = float(np.abs(values).max())
d_out = float(np.abs(out[:, 0] - one_out[:, 0]).max())
d_exact = float(np.abs(out[:, 0] - exact_out).max())
d_lse = float(np.abs(lse - one_lse).max())
d_w = float(np.abs(rebuilt - one_w).max())
print("merged vs one call: max |out diff| %.3g (bound 5e-5 * max|v| = %.3g), "
      "max |lse diff| %.3g, max |weight diff| %.3g" % (d_out, 5e-5 * vmax, d_lse, d_w))
print("merged vs float64 numpy: max |out diff| %.3g, max |lse diff| %.3g"
      % (d_exact, float(np.abs(lse - exact_lse).max())))
assert d_out <= 5e-5 * vmax and d_exact <= 5e-5 * vmax
assert d_lse <= 2e-5 * max(1.0, float(np.abs(one_lse).max()))
assert d_w <= 4e-5 and float(np.abs(rebuilt - exact_w).max()) <= 4e-5
assert np.allclose(share.sum(axis=0), 1.0, atol=1e-5)
for x, row in zip(shown, share[:, len(grid):].T):
    print("query x = %.2f: shard shares %s" % (x, " ".join("%.3f" % p for p in row)))

# ---------------------------------------------------------------- picture
colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
fig, axes = plt.subplots(1, 3, figsize=(16, 3.8), gridspec_kw={"width_ratios": [1.4, 1, 1]})

ax = axes[0]
idx = np.arange(n_docs)
for j, x in enumerate(shown):
    row = len(grid) + j
    ax.plot(idx, one_w[row], "k-", lw=0.8, label="one call" if j == 0 else None)
    for s in range(n_shards):
        lo, hi = bounds[s], bounds[s + 1]
        seen = rebuilt[row, lo:hi] > 1e-4
        ax.plot(idx[lo:hi][seen], rebuilt[row, lo:hi][seen], "o", ms=2.5, color=colors[s],
                label=("shard %d, rescaled" % s) if j == 0 else None)
    peak = int(np.argmax(one_w[row]))
    ax.annotate("x = %.2f" % x, (peak, one_w[row, peak]), textcoords="offset points",
                xytext=(0, 4), ha="center", fontsize=8)
for b in bounds[1:-1]:
    ax.axvline(b - 0.5, color="gray", ls="--", lw=0.8)
ax.set_xlim(0, n_docs)
ax.set_ylim(0, 1.45 * float(one_w[len(grid):].max()))
ax.set_xlabel("Documents (sorted by key)")
ax.set_ylabel("Attention weight")
ax.set_title("Weights of four queries")
ax.legend(fontsize=7, loc="upper center", ncol=3)

ax = axes[1]
for s in range(n_shards):
    ax.plot(grid, share[s, :len(grid)], color=colors[s], label="shard %d" % s)
    ax.fill_between(grid, share[s, :len(grid)], color=colors[s], alpha=0.15)
ax.plot(grid, share[:, :len(grid)].sum(axis=0), "k:", lw=1, label="sum")
for e in edges:
    ax.axvline(e, color="gray", ls="--", lw=0.8)
ax.set_xlim(0, 8)
ax.set_ylim(0, 1.3)
ax.set_yticks(np.linspace(0, 1, 6))
ax.set_xlabel("Query x")
ax.set_ylabel("exp(lse_shard - lse_merged)")
ax.set_title("Each shard's share of the answer")
ax.legend(fontsize=7, loc="upper center", ncol=3)

ax = axes[2]
for s in range(n_shards):
    lo, hi = bounds[s], bounds[s + 1]
    ax.plot(keys[lo:hi], values[lo:hi], "o", ms=2, alpha=0.4, color=colors[s])
    ax.plot(grid, shards[s][0][:len(grid), 0], "-", lw=0.8, alpha=0.6, color=colors[s],
            label="shard %d alone" % s)
ax.plot(grid, out[:len(grid), 0], "k-", lw=1.6, label="merged shards")
ax.plot(grid, one_out[:len(grid), 0], "y--", lw=1.2, label="one call")
ax.plot(grid, f(grid), "m:", lw=1.2, label="y = 2 sin x + x^0.8")
for e in edges:
    ax.axvline(e, color="gray", ls="--", lw=0.8)
ax.set_xlim(0, 8)
ax.set_xlabel("Query x")
ax.set_ylim(-1, 10.5)
ax.set_ylabel("Answer")
ax.set_title("Nadaraya-Watson answers, sigma = %s" % sigma)
ax.legend(fontsize=7, loc="upper left", ncol=2)

path = os.path.join(out_dir(), "sharded_search.png")
fig.savefig(path, dpi=100, bbox_inches="tight")
wrote(path)
