"""Nadaraya-Watson kernel regression (d2l), qkv doing the attention pooling.

50 training inputs x_i uniform in [0, 5), sorted, targets
y_i = 2 sin(x_i) + x_i^0.8 + noise (sd 0.5). The prediction at a query x is
f(x) = sum_i softmax_i(-(x - x_i)^2 / (2 sigma^2)) y_i: attention with the
Gaussian score (score="gaussian", scale = 1 / (2 sigma^2)), queries = test
inputs, keys = training inputs, values = training targets. As in d2l, four
kernel widths sigma: narrow kernels chase the noise, wide ones smooth it out.

Writes nadaraya_watson.png (the fits) and nadaraya_watson_weights.png (the
attention weights, test inputs x training inputs) into the directory given
on the command line.
"""

import os

import matplotlib.pyplot as plt
import numpy as np

from _common import out_dir, qkv, wrote


def f(x):
    return 2 * np.sin(x) + x ** 0.8


rng = np.random.default_rng(42)
n = 50
x_train = np.sort(rng.random(n) * 5).astype(np.float32)
y_train = (f(x_train) + rng.normal(0.0, 0.5, n)).astype(np.float32)
x_val = np.arange(0, 5, 0.1, dtype=np.float32)
y_val = f(x_val)

sigmas = [0.1, 0.2, 0.5, 1.0]
fits, weights = [], []
print("qkv %s on %s" % (qkv.version(), qkv.backend()))
for sigma in sigmas:
    # [Lq, D=1] queries, [Lk, 1] keys, [Lk, Dv=1] values
    y_hat, w = qkv.attention(x_val[:, None], x_train[:, None], y_train[:, None],
                             score="gaussian", scale=1 / (2 * sigma ** 2), return_weights=True)
    k = np.exp(-(x_val[:, None].astype(np.float64) - x_train[None, :]) ** 2 / (2 * sigma ** 2))
    k /= k.sum(1, keepdims=True)
    assert np.allclose(w, k, atol=2e-5) and np.allclose(y_hat[:, 0], k @ y_train, atol=1e-3)
    fits.append(y_hat[:, 0])
    weights.append(w)
    print("sigma %.1f: MSE against the truth %.4f" % (sigma, np.mean((y_hat[:, 0] - y_val) ** 2)))
mse_mean = np.mean((y_train.mean() - y_val) ** 2)
print("average pooling (sigma -> infinity): MSE %.4f" % mse_mean)
assert np.mean((fits[2] - y_val) ** 2) < 0.5 * mse_mean

d = out_dir()
fig, axes = plt.subplots(1, 4, sharey=True, figsize=(12, 3))
for ax, sigma, y_hat in zip(axes, sigmas, fits):
    ax.plot(x_val, y_hat)
    ax.plot(x_val, y_val, "m--")
    ax.plot(x_train, y_train, "o", alpha=0.5)
    ax.set_xlabel("sigma = %s" % sigma)
    ax.legend(["y_hat", "y"])
axes[0].set_ylabel("y")
path = os.path.join(d, "nadaraya_watson.png")
fig.savefig(path, dpi=100, bbox_inches="tight")
wrote(path)

path = os.path.join(d, "nadaraya_watson_weights.png")
qkv.show_heatmaps(np.stack(weights)[None], xlabel="Sorted training inputs",
                  ylabel="Sorted testing inputs",
                  titles=["sigma = %s" % s for s in sigmas], figsize=(12, 3.2), path=path)
wrote(path)
