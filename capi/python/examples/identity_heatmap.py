"""The seeds' sanity check: identity attention, each query picks its key.

d2l draws show_heatmaps(eye(10).reshape(1, 1, 10, 10), 'Keys', 'Queries').
Here qkv computes those weights: ten one-hot queries and keys (q = k = I)
with a sharp dot-product score (scale 40) make softmax a database lookup,
so the weights are the identity and out[i] is value i. The same queries at
smaller scales walk the seeds' limit cases down to average pooling
(scale 0: uniform weights 1/10).

Writes identity_heatmap.png and attention_limits.png into the directory
given on the command line (default: the current one).
"""

import os

import numpy as np

from _common import out_dir, qkv, wrote

d = out_dir()
eye = np.eye(10, dtype=np.float32)
values = np.arange(10, dtype=np.float32)[:, None]  # the "names" stored at each key

out, weights = qkv.attention(eye, eye, values, scale=40.0, return_weights=True)
print("qkv %s on %s" % (qkv.version(), qkv.backend()))
print("lookup: out =", np.round(out[:, 0], 6))
assert np.allclose(weights, np.eye(10), atol=1e-6), "not the identity"
assert np.allclose(out[:, 0], values[:, 0], atol=1e-5), "lookup missed"
path = os.path.join(d, "identity_heatmap.png")
qkv.show_heatmaps(weights.reshape(1, 1, 10, 10), xlabel="Keys", ylabel="Queries", path=path)
wrote(path)

scales = [40.0, 2.0, 0.0]
limits = np.stack([qkv.attention(eye, eye, values, scale=s, return_weights=True)[1]
                   for s in scales])
assert np.allclose(limits[-1], 0.1, atol=1e-6), "scale 0 is not average pooling"
path = os.path.join(d, "attention_limits.png")
qkv.show_heatmaps(limits[None], xlabel="Keys", ylabel="Queries",
                  titles=["scale %g: lookup" % scales[0], "scale %g" % scales[1],
                          "scale 0: average"],
                  figsize=(7.5, 2.5), path=path)
wrote(path)
