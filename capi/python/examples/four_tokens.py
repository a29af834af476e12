"""The seeds' scaled dot-product attention figure, qkv doing the attention.

Four 2-D token embeddings, identity projections (Q = K = V = embeddings),
softmax(Q K^T / sqrt(d_k)) V with d_k = 2. Four panels as in the seed:
the embeddings as arrows, the raw scores Q K^T, the attention weights (rows
sum to 1) and the contextualized vectors. qkv computes the weights and the
vectors; numpy only draws the scores panel and double-checks qkv.

Writes four_tokens.png into the directory given on the command line.
"""

import os

import matplotlib.pyplot as plt
import numpy as np

from _common import out_dir, qkv, wrote

tokens = ["Token-1", "Token-2", "Token-3", "Token-4"]
embeddings = np.array([[0.9, 0.1], [0.2, 0.8], [0.1, 0.9], [0.8, 0.2]], dtype=np.float32)
W_q = W_k = W_v = np.eye(2, dtype=np.float32)  # simplified: identity, not trained
Q, K, V = embeddings @ W_q, embeddings @ W_k, embeddings @ W_v
d_k = K.shape[1]

# qkv: weights = softmax(Q K^T / sqrt(d_k)), contextualized = weights V
contextualized, weights = qkv.attention(Q, K, V, scale=1 / np.sqrt(d_k), return_weights=True)
scores = Q.astype(np.float64) @ K.T.astype(np.float64)  # the seed's panel 2, before scaling

e = np.exp(scores / np.sqrt(d_k))
want = e / e.sum(axis=1, keepdims=True)
assert np.allclose(weights, want, atol=2e-5) and np.allclose(contextualized, want @ V, atol=5e-5)
print("qkv %s on %s" % (qkv.version(), qkv.backend()))
print("attention weights (rows: queries, columns: keys):\n", np.round(weights, 3))
print("contextualized vectors:\n", np.round(contextualized, 4))

colors = ["magenta", "cyan", "teal", "skyblue"]


def arrows(ax, vectors, what):
    for vec, color in zip(vectors, colors):
        ax.quiver(0, 0, vec[0], vec[1], angles="xy", scale_units="xy", scale=1, color=color)
    ax.set_xlim(0, np.max(vectors[:, 0]) + 0.1)
    ax.set_ylim(0, np.max(vectors[:, 1]) + 0.1)
    ax.set_xlabel("%s Dimension 1" % what, fontsize=12)
    ax.set_ylabel("%s Dimension 2" % what, fontsize=12)
    ax.set_aspect("equal", "box")


def heatmap(ax, matrix, fmt, label, title):
    """An annotated heatmap in the seed's seaborn style, with matplotlib."""
    im = ax.imshow(matrix, cmap="gray_r")
    cbar = ax.figure.colorbar(im, ax=ax)
    cbar.set_label(label)
    lo, hi = float(matrix.min()), float(matrix.max())
    for i in range(matrix.shape[0]):
        for j in range(matrix.shape[1]):
            dark = (matrix[i, j] - lo) > 0.5 * (hi - lo)  # gray_r: high is dark
            ax.text(j, i, format(matrix[i, j], fmt), ha="center", va="center",
                    color="white" if dark else "black", fontsize=11)
    ax.set_xticks(range(len(tokens)), tokens)
    ax.set_yticks(range(len(tokens)), tokens)
    ax.set_xlabel("Tokens (Key)", fontsize=12)
    ax.set_ylabel("Tokens (Query)", fontsize=12)
    ax.set_title(title, fontsize=14)


with plt.style.context("dark_background"):
    fig, axs = plt.subplots(2, 2, figsize=(12, 10))
    arrows(axs[0, 0], embeddings, "Embedding")
    axs[0, 0].set_title("Token Embeddings in 2D Space", fontsize=14)
    heatmap(axs[0, 1], scores, ".2f", "Attention Score (Before Scaling)", "Attention Scores")
    heatmap(axs[1, 0], weights, ".3f", "Attention Weight (Softmax)", "Attention Weights (Sum to 1)")
    arrows(axs[1, 1], contextualized, "Contextualized")
    axs[1, 1].set_title("Contextualized Vectors in 2D Space after Attention", fontsize=14)
    fig.legend(tokens, title="Tokens", loc="center left", bbox_to_anchor=(1, 0.5), fontsize=12)
    fig.tight_layout()
    path = os.path.join(out_dir(), "four_tokens.png")
    fig.savefig(path, dpi=80, bbox_inches="tight")
wrote(path)
