"""A small transformer learns to reverse sequences, qkv doing its attention.

Sequences of 8 tokens from a vocabulary of 10; the target at position i is
the input token at position 7 - i. The model: token and learned position
embeddings (d_model 64), two pre-norm encoder layers (4 heads of 16, a
feed-forward layer of 128), a linear read-out per position; Adam, batches
of 64, cross-entropy.

Two copies of the model, with the same initial weights and the same
batches, train side by side: one calls qkv.torch.attention (libqkv's
forward and backward passes), the other a plain torch attention,
softmax(q k^T / sqrt(d)) v. The first gradients must agree to float32
rounding, and the loss curves stay together: float rounding differences
grow slowly through training, so they are compared loosely (mean loss of
each logging window within 0.001 + 5%). Both reach a high token accuracy on
fresh sequences.

Usage: transformer_reverse.py [--quick] [OUT_DIR]. --quick trains for a few
seconds (CTest); the full run takes well under a minute on 2 cores and
writes transformer_reverse.png (both loss curves) and
transformer_reverse_weights.png (the trained model's attention weights for
one sequence, per layer and head) into OUT_DIR. Needs
PyTorch (Debian: python3-torch).
"""

import copy
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

quick = "--quick" in sys.argv[1:]
if quick:
    sys.argv.remove("--quick")
from _common import out_dir, qkv, wrote  # noqa: E402
import qkv.torch  # noqa: E402

torch.set_num_threads(1)  # the same arithmetic on every machine, and fair timings

VOCAB, LENGTH = 10, 8
D_MODEL, HEADS, FFN, LAYERS = 64, 4, 128, 2
BATCH = 64
STEPS = 100 if quick else 600
LOG_EVERY = 20 if quick else 25


def qkv_attention(q, k, v):
    return qkv.torch.attention(q, k, v)


def torch_attention(q, k, v):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


class SelfAttention(nn.Module):
    def __init__(self, attend):
        super().__init__()
        self.attend = attend
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.out = nn.Linear(D_MODEL, D_MODEL)

    def forward(self, x):  # [B, L, d_model]
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, HEADS, D_MODEL // HEADS).permute(2, 0, 3, 1, 4)
        y = self.attend(q, k, v)  # [B, H, L, d_head]
        return self.out(y.transpose(1, 2).reshape(b, n, D_MODEL))


class Layer(nn.Module):
    def __init__(self, attend):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.attention = SelfAttention(attend)
        self.ffn = nn.Sequential(nn.Linear(D_MODEL, FFN), nn.ReLU(), nn.Linear(FFN, D_MODEL))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class Reverser(nn.Module):
    def __init__(self, attend):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.position = nn.Parameter(torch.randn(LENGTH, D_MODEL))
        self.layers = nn.ModuleList(Layer(attend) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens):  # [B, L] -> logits [B, L, vocab]
        x = self.embed(tokens) + self.position
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))

    def use(self, attend):
        for layer in self.layers:
            layer.attention.attend = attend
        return self


def batch(rng, size):
    x = torch.from_numpy(rng.integers(0, VOCAB, (size, LENGTH)))
    return x, x.flip(1)


def loss_of(model, x, y):
    return F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))


def accuracy(model, x, y):
    with torch.no_grad():
        return float((model(x).argmax(-1) == y).float().mean())


print("qkv %s on %s, torch %s; %s run: %d steps"
      % (qkv.version(), qkv.backend(), torch.__version__, "quick" if quick else "full", STEPS))
torch.manual_seed(0)
models = {"qkv": Reverser(qkv_attention)}
models["torch"] = copy.deepcopy(models["qkv"]).use(torch_attention)
optimizers = {n: torch.optim.Adam(m.parameters(), lr=2e-3) for n, m in models.items()}

# The first gradients: qkv's backward pass against torch autograd, parameter
# by parameter, within float32 rounding of the largest element.
rng = np.random.default_rng(1)
x, y = batch(rng, BATCH)
grads = {}
for name, model in models.items():
    model.zero_grad()
    loss_of(model, x, y).backward()
    grads[name] = [p.grad.clone() for p in model.parameters()]
worst = max(float((a - b).abs().max() / (b.abs().max() + 1e-12))
            for a, b in zip(grads["qkv"], grads["torch"]))
print("first step: largest gradient difference %.2e (relative to the largest element)" % worst)
assert worst < 1e-3, worst

rng = np.random.default_rng(2)
curves = {n: [] for n in models}
window = {n: [] for n in models}
seconds = {n: 0.0 for n in models}
for step in range(1, STEPS + 1):
    x, y = batch(rng, BATCH)
    for name, model in models.items():
        start = time.perf_counter()
        optimizers[name].zero_grad()
        loss = loss_of(model, x, y)
        loss.backward()
        optimizers[name].step()
        seconds[name] += time.perf_counter() - start
        window[name].append(float(loss))
    if step % LOG_EVERY == 0:
        for name in models:
            curves[name].append(float(np.mean(window[name])))
            window[name] = []
        a, b = curves["qkv"][-1], curves["torch"][-1]
        print("step %4d  loss qkv %.5f  torch %.5f" % (step, a, b))
        assert abs(a - b) <= 1e-3 + 0.05 * max(a, b), "the loss curves part: %g vs %g" % (a, b)

x, y = batch(np.random.default_rng(3), 1000)
acc = {n: accuracy(m, x, y) for n, m in models.items()}
print("final loss: qkv %.5f, torch %.5f" % (curves["qkv"][-1], curves["torch"][-1]))
print("token accuracy on 1000 fresh sequences: qkv %.1f%%, torch %.1f%%"
      % (100 * acc["qkv"], 100 * acc["torch"]))
print("training time: qkv %.1f s, torch %.1f s" % (seconds["qkv"], seconds["torch"]))
assert curves["qkv"][-1] < 0.5 * curves["qkv"][0], "qkv's model did not learn"
assert acc["qkv"] > 0.9 and acc["torch"] > 0.9, acc
if not quick:

    import matplotlib.pyplot as plt

    steps = [LOG_EVERY * (i + 1) for i in range(len(curves["qkv"]))]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(steps, curves["qkv"], label="qkv.torch.attention (acc. %.1f%%)" % (100 * acc["qkv"]))
    ax.plot(steps, curves["torch"], "--",
            label="plain torch attention (acc. %.1f%%)" % (100 * acc["torch"]))
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_title("Reversing 8 tokens: 2 layers, 4 heads")
    ax.legend()
    path = os.path.join(out_dir(), "transformer_reverse.png")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    wrote(path)

    # What the trained model attends to: the weights of each layer and head
    # for one sequence (qkv.attention's return_weights), queries x keys.
    weights = []

    def recording(q, k, v):
        out, w = qkv.attention(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(),
                               return_weights=True)
        weights.append(w[0])
        return torch.from_numpy(out)

    with torch.no_grad():
        models["qkv"].use(recording)(x[:1])
    path = os.path.join(out_dir(), "transformer_reverse_weights.png")
    # rows: layers 1 and 2; the anti-diagonal is the reversal
    qkv.show_heatmaps(np.stack(weights), xlabel="Keys", ylabel="Queries",
                      titles=["head %d" % (h + 1) for h in range(HEADS)], figsize=(9, 4.5),
                      path=path)
    wrote(path)
