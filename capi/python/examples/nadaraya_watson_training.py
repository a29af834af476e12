"""Parametric Nadaraya-Watson regression (d2l), trained through qkv's backward pass.

The data of nadaraya_watson.py: 50 training inputs x_i uniform in [0, 5),
sorted, targets y_i = 2 sin(x_i) + x_i^0.8 + noise (sd 0.5); test inputs
0, 0.1, ..., 4.9. d2l's parametric model has one learned width w:

    f(x) = sum_i softmax_i(-((x - x_i) w)^2 / 2) y_i

which is attention with the Gaussian score -scale |q - k|^2 (score="gaussian",
scale = 1/2) over queries w x and keys w x_i. As in d2l it is trained on the
training set itself, each training input querying the other 49 (a -inf bias
on the diagonal hides the query's own point), with SGD (lr 0.5) on the sum
of squared errors; qkv.torch.attention does the forward pass and
qkv.attention_backward the gradient that reaches w through both q and k.
The first gradient is checked against plain torch autograd.

Writes nadaraya_watson_training.png (the loss per epoch; the learned fit,
the non-parametric one with w = 1 and the truth) into the directory given on
the command line. Needs PyTorch (Debian: python3-torch).
"""

import os

import matplotlib.pyplot as plt
import numpy as np
import torch

from _common import out_dir, qkv, wrote
import qkv.torch  # noqa: E402  (after _common: qkv from the source tree)

torch.set_num_threads(1)


def f(x):
    return 2 * np.sin(x) + x ** 0.8


rng = np.random.default_rng(42)  # the data of nadaraya_watson.py
n = 50
x_train = np.sort(rng.random(n) * 5).astype(np.float32)
y_train = (f(x_train) + rng.normal(0.0, 0.5, n)).astype(np.float32)
x_test = np.arange(0, 5, 0.1, dtype=np.float32)
y_test = f(x_test)

xs, ys = torch.from_numpy(x_train)[:, None], torch.from_numpy(y_train)[:, None]  # [n, 1]
leave_one_out = torch.zeros(n, n).fill_diagonal_(-float("inf"))  # query i skips key i


def predict(w, queries, keys, values, bias=None):
    """[Lq, 1] queries, [Lk, 1] keys and values: f at the queries, [Lq, 1]."""
    return qkv.torch.attention(w * queries, w * keys, values, score="gaussian", scale=0.5,
                               bias=bias)


def predict_torch(w, queries, keys, values, bias):
    """The same in plain torch (d2l's formula), for the gradient check."""
    scores = -((queries - keys.T) * w) ** 2 / 2 + bias
    return torch.softmax(scores, dim=1) @ values


torch.manual_seed(0)
w = torch.rand(1, requires_grad=True)  # d2l: torch.rand((1,))
w_check = w.detach().clone().requires_grad_()
trainer = torch.optim.SGD([w], lr=0.5)
print("qkv %s on %s, torch %s" % (qkv.version(), qkv.backend(), torch.__version__))
losses = []
for epoch in range(10):
    trainer.zero_grad()
    loss = ((predict(w, xs, xs, ys, leave_one_out) - ys) ** 2).sum()
    loss.backward()
    if epoch == 0:  # the gradient of w against plain torch autograd
        ((predict_torch(w_check, xs, xs, ys, leave_one_out) - ys) ** 2).sum().backward()
        print("epoch 1: d loss / d w = %.6f (plain torch: %.6f)" % (w.grad, w_check.grad))
        assert abs(float(w.grad - w_check.grad)) <= 1e-3 * abs(float(w_check.grad)) + 1e-4
    trainer.step()
    losses.append(float(loss))
    print("epoch %d, loss %.6f, w %.4f" % (epoch + 1, losses[-1], float(w)))
assert losses[-1] < losses[0]

with torch.no_grad():
    fit = predict(w, torch.from_numpy(x_test)[:, None], xs, ys)[:, 0].numpy()
    plain = predict(torch.ones(1), torch.from_numpy(x_test)[:, None], xs, ys)[:, 0].numpy()
mse_fit = float(np.mean((fit - y_test) ** 2))
mse_plain = float(np.mean((plain - y_test) ** 2))
print("final w %.4f, training loss %.4f" % (float(w), losses[-1]))
print("MSE against the truth: learned w %.4f, non-parametric (w = 1) %.4f"
      % (mse_fit, mse_plain))

d = out_dir()
fig, (ax_loss, ax_fit) = plt.subplots(1, 2, figsize=(10, 3.5))
ax_loss.plot(range(1, len(losses) + 1), losses, "o-")
ax_loss.set_xlabel("epoch")
ax_loss.set_ylabel("loss (sum of squared errors)")
ax_loss.set_yscale("log")
ax_loss.set_title("SGD through qkv.attention_backward")
ax_fit.plot(x_test, y_test, "m--", label="truth")
ax_fit.plot(x_test, fit, label="learned w = %.2f" % float(w))
ax_fit.plot(x_test, plain, ":", label="non-parametric (w = 1)")
ax_fit.plot(x_train, y_train, "o", alpha=0.5, label="training data")
ax_fit.set_xlabel("x")
ax_fit.set_ylabel("y")
ax_fit.legend(fontsize=8)
path = os.path.join(d, "nadaraya_watson_training.png")
fig.savefig(path, dpi=100, bbox_inches="tight")
wrote(path)
