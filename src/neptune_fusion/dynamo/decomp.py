"""The decomposition table: which composite ops reach the rule table as primitives.

Translating primitives (``amax``, ``sub``, ``exp``, ``sum``, ``div``, ``bmm``) rather than
``aten._softmax`` as one node means any chain built of them is translated, whoever wrote
it. torch's own decompositions give softmax and log-softmax in that form; log-sum-exp,
variance, layer norm and ``scaled_dot_product_attention`` get small ones here, because
torch's guard an infinite maximum inside the exponential (two passes), go through
``prims.var`` (one node for a two-reduction chain) or pick a fused attention kernel per
device; ``nll_loss`` becomes a gather, so cross-entropy is one chain; ``max``/``min``
over a dimension become ``amax``/``amin`` (with ``argmax``/``argmin`` for the indices).
"""

from __future__ import annotations

import math

import torch
from torch._decomp import get_decompositions

aten = torch.ops.aten


def _dims(x, dim):
    if dim is None:
        return list(range(x.dim()))
    return [d % x.dim() for d in ([dim] if isinstance(dim, int) else dim)]


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    dims = _dims(x, dim)
    n = math.prod(x.shape[d] for d in dims)
    mean = x.mean(dims, keepdim=True)
    dev = x - mean
    var = (dev * dev).sum(dims, keepdim=keepdim) / max(0, n - (1 if correction is None
                                                              else correction))
    return var, (mean if keepdim else mean.squeeze(dims))


def _var(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction=correction, keepdim=keepdim)[0]


def _std(x, dim=None, *, correction=None, keepdim=False):
    return torch.sqrt(_var(x, dim, correction=correction, keepdim=keepdim))


def _logsumexp(x, dim, keepdim=False):
    """log-sum-exp with the infinite-maximum guard in the epilogue only: torch's own
    decomposition subtracts ``where(|max| == inf, 0, max)`` inside the exponential, a
    producer inside a condition, which no repair breaks (two passes); here a row whose
    maximum is infinite (all -inf, or a +inf) gives that maximum, as torch.logsumexp does."""
    dims = _dims(x, dim)
    m = x.amax(dims, keepdim=True)
    s = torch.exp(x - m).sum(dims, keepdim=True)
    out = torch.where(m.abs() == float("inf"), m, m + torch.log(s))
    return out if keepdim else out.squeeze(dims)


def _nll_loss_forward(x, target, weight, reduction, ignore_index):
    """``nll_loss`` of 2-d log-probabilities (cross-entropy's second half) as a gather:
    with the log-softmax before it, one chain per row -- its maximum and sum, then the
    target's log-probability -- so the full ``(N, V)`` log-softmax is never written (it
    was the fused chain's output, read again by the loss). Ignored targets read class 0
    (a valid index in any PyTorch) and weigh nothing. Returns ``(output, total_weight)``
    as the op does; other ranks use torch's own decomposition."""
    if x.dim() != 2 or target.dim() != 1:
        return NotImplemented
    keep = target != ignore_index
    safe = torch.where(keep, target, torch.zeros_like(target))
    picked = x.gather(1, safe.unsqueeze(1)).squeeze(1)
    w = torch.ones_like(picked) if weight is None else weight.gather(0, safe)
    w = torch.where(keep, w, torch.zeros_like(w))
    loss = torch.where(keep, -picked * w, torch.zeros_like(picked))
    if reduction == 0:   # none
        return loss, x.new_zeros(())
    total = w.sum(0)
    return (loss.sum(0) / total if reduction == 1 else loss.sum(0)), total


def _max_dim(x, dim, keepdim=False):
    """``x.max(dim)``: the values as ``amax`` (a reduction the rule table has) and the
    indices as ``argmax``, dead code when unused (gpt-oss subtracts
    ``logits.max(-1, keepdim=True).values`` before its softmax)."""
    return x.amax(dim, keepdim), x.argmax(dim, keepdim)


def _min_dim(x, dim, keepdim=False):
    return x.amin(dim, keepdim), x.argmin(dim, keepdim)


def _layer_norm(x, normalized_shape, weight, bias, eps):
    """Over several trailing dimensions the statistics are over one merged dimension
    (the rule table reduces over one axis), the weight and bias flattened alike, and the
    result reshaped back at the end: a view the backend can leave outside the kernel
    (partition.without_views). ``mean`` and ``rstd`` keep their shapes."""
    k = len(normalized_shape)
    if k > 1:
        lead = x.shape[:x.dim() - k]
        out, mean, rstd = _layer_norm(
            x.reshape(*lead, -1), [math.prod(normalized_shape)],
            None if weight is None else weight.reshape(-1),
            None if bias is None else bias.reshape(-1), eps)
        keep = (*lead, *([1] * k))
        return out.reshape(x.shape), mean.reshape(keep), rstd.reshape(keep)
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    var, mean = _var_mean(x.float() if x.dtype in (torch.float16, torch.bfloat16) else x,
                          dims, correction=0, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out.to(x.dtype), mean, rstd


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    if dropout_p:
        return NotImplemented
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(g, dim=-3)
        v = v.repeat_interleave(g, dim=-3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool,
                          device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if attn_mask is None:
        return torch.softmax(s.float(), dim=-1).to(v.dtype) @ v
    s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool \
        else s + attn_mask
    out = torch.softmax(s.float(), dim=-1).to(v.dtype) @ v
    # a row whose every key is masked gives 0, as SDPA does (the softmax alone: NaN)
    empty = s.amax(dim=-1, keepdim=True) == float("-inf")
    return out.masked_fill(empty, 0.0)


def swap_sdpa(gm) -> None:
    """Replace ``scaled_dot_product_attention`` in a Dynamo graph by :func:`_sdpa` (its
    math: matmul, mask, softmax, matmul), before AOTAutograd picks a fused attention
    kernel per device that no decomposition opens. Calls with dropout stay."""
    import torch.nn.functional as F
    targets = {F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in targets and \
                not node.kwargs.get("dropout_p") and not (len(node.args) > 4 and node.args[4]):
            node.target, changed = _sdpa, True
    if changed:
        gm.recompile()


def decompositions() -> dict:
    """The table handed to AOTAutograd."""
    table = get_decompositions([aten._softmax, aten._log_softmax, aten._safe_softmax,
                                aten.linalg_vector_norm])
    table[aten.logsumexp.default] = _logsumexp
    table[aten.var.correction] = _var
    table[aten.var_mean.correction] = _var_mean
    table[aten.std.correction] = _std
    table[aten.native_layer_norm.default] = _layer_norm
    table[aten.scaled_dot_product_attention.default] = _sdpa
    table[aten.nll_loss_forward.default] = _nll_loss_forward
    table[aten.max.dim] = _max_dim
    table[aten.min.dim] = _min_dim
    return table
