"""qkv attention for PyTorch: a torch.autograd.Function, to train with.

    import torch
    import qkv.torch

    q = torch.randn(2, 4, 16, 32, requires_grad=True)   # [B, H, Lq, D]
    k = torch.randn(2, 2, 16, 32, requires_grad=True)   # [B, Hkv, Lk, D]
    v = torch.randn(2, 2, 16, 32, requires_grad=True)   # [B, Hkv, Lk, Dv]
    out = qkv.torch.attention(q, k, v, causal=True)     # qkv.attention
    out.square().sum().backward()                       # qkv.attention_backward
    q.grad, k.grad, v.grad

The forward pass calls qkv.attention(..., return_lse=True) and keeps q, k,
v, out and lse; the backward pass hands them with the incoming gradient to
qkv.attention_backward (qkv_attention_backward_f32 in libqkv), asking only
for the gradients autograd needs (ctx.needs_input_grad). Importing qkv
does not import torch; this module does (Debian: python3-torch).
"""

import sys

import torch
from torch.autograd.function import once_differentiable

_qkv = sys.modules[__package__]  # the qkv package (looked up at each call)

__all__ = ["attention"]


def _array(name, t):
    """A float32 CPU tensor as a numpy array (its memory when contiguous)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s must be a torch.Tensor, got %s" % (name, type(t).__name__))
    if t.device.type != "cpu":
        raise ValueError("%s is on %s: qkv runs on the CPU (pass %s.cpu())"
                         % (name, t.device, name))
    if t.dtype != torch.float32:
        raise TypeError("%s is %s: qkv.torch.attention computes in float32 (pass %s.float())"
                        % (name, t.dtype, name))
    return t.detach().contiguous().numpy()


def _constant(name, x):
    """An option (tensor, array, list or number) as what qkv.attention takes."""
    if not isinstance(x, torch.Tensor):
        return x
    if x.requires_grad:
        raise ValueError("%s requires grad, but qkv.torch.attention has no gradient for it "
                         "(it is a constant): pass %s.detach()" % (name, name))
    return x.detach().cpu().numpy()


class _Attention(torch.autograd.Function):
    """out = qkv.attention(q, k, v, **options); gradients in q, k and v."""

    @staticmethod
    def forward(ctx, q, k, v, options):
        out, lse = _qkv.attention(_array("q", q), _array("k", k), _array("v", v),
                                  return_lse=True, **options)
        out, lse = torch.from_numpy(out), torch.from_numpy(lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = options
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        wrt = "".join(n for n, need in zip("qkv", ctx.needs_input_grad[:3]) if need)
        if not wrt:
            return None, None, None, None
        grads = _qkv.attention_backward(
            q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), out.detach().numpy(),
            lse.detach().numpy(), _array("d_out", d_out), wrt=wrt, **ctx.options)
        return tuple(None if g is None else torch.from_numpy(g) for g in grads) + (None,)


def attention(q, k, v, *, scale=None, causal=False, valid_lens=None, bias=None, score="dot",
              window=None, alibi_slopes=None, softcap=None, sinks=None, q_pos=None,
              kv_start=None, backend=None):
    """softmax(a(q, k) + mask) v with libqkv, differentiable in q, k and v.

    q, k, v: float32 CPU tensors shaped as for qkv.attention ([Lq, D],
    [H, Lq, D] or [B, H, Lq, D]; k and v with Hkv kv heads dividing H, v
    with its own last dim Dv), any strides (non-contiguous ones are copied).
    Returns out, a float32 tensor of q's shape with the last dim Dv.

    The options are qkv.attention's, with the same meaning: scale (None:
    1/sqrt(D)), causal, valid_lens ([B] or [B, Lq]), bias (broadcasts to
    [B, H, Lq, Lk]; -inf hides a key), score "dot" or "gaussian" (the
    Nadaraya-Watson kernel -scale * |q - k|^2), window (left, right),
    alibi_slopes ([H]), softcap, sinks ([H]), q_pos and kv_start ([B]),
    backend. Tensors among them are read as constants: valid_lens, bias,
    alibi_slopes, sinks get no gradient, and one that requires grad raises
    ValueError. score="additive" has no backward pass: QkvUnsupported.

    Backward: qkv.attention_backward computes d_q, d_k, d_v (within 1e-3
    of the largest magnitude of each exact gradient), only those autograd
    needs; d_k and d_v sum over the query heads sharing a kv head. Not
    twice differentiable (double backward raises).
    """
    score_key = score.lower() if isinstance(score, str) else score
    if score_key == "additive":
        raise _qkv.QkvUnsupported(_qkv.QKV_ERR_UNSUPPORTED, "qkv.torch.attention",
                                  'score "additive" has no backward pass')
    if isinstance(scale, torch.Tensor):
        scale = float(scale)
    options = dict(scale=scale, causal=bool(causal), score=score, window=window,
                   softcap=softcap, backend=backend)
    for name, x in (("valid_lens", valid_lens), ("bias", bias), ("alibi_slopes", alibi_slopes),
                    ("sinks", sinks), ("q_pos", q_pos), ("kv_start", kv_start)):
        options[name] = _constant(name, x)
    return _Attention.apply(q, k, v, options)
