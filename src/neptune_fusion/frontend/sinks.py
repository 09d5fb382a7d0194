"""Attention sinks (``nf.attention(..., sinks=...)``): one more logit per query head whose
value row is zero, as gpt-oss's ``s_aux``: each row's softmax runs over its scores and
``sinks[h]``.

A sink is a partial state of attention's plan: log-sum-exp ``sinks[h]``, output 0 (no
value). Merging it into a row's state ``(o, lse)`` with the derived merge
(:func:`~neptune_fusion.distributed.states.merge_states`, the closed form of the plan's
repairs) gives::

    lse' = logaddexp(lse, sink)
    o'   = exp(lse - lse') o + exp(sink - lse') 0 = sigmoid(lse - sink) o

So the kernel runs unchanged (with its row log-sum-exp, ``return_lse``) and the sink
costs one elementwise pass over ``o``. Written with torch operations, the merge is
differentiable: under autograd the sinks get their gradient, and ``o`` and ``lse`` pass
theirs to the derived backward (docs/autodiff.md). A row that sees no key has
``lse = -inf``: its output is 0 and its log-sum-exp the sink's.
"""

from __future__ import annotations

from ..errors import FeedError


def check_sinks(sinks, q) -> None:
    """``sinks``: a float tensor of shape ``(Hq,)`` on ``q``'s device; else a
    :class:`FeedError` naming what is wrong."""
    import torch
    if not isinstance(sinks, torch.Tensor):
        raise FeedError(f"attention: sinks must be a torch tensor of shape ({q.shape[1]},) "
                        f"(one logit per query head), got {type(sinks).__name__}")
    if sinks.dim() != 1 or sinks.shape[0] != q.shape[1]:
        raise FeedError(f"attention: sinks has shape {tuple(sinks.shape)}; it holds one "
                        f"logit per query head: shape ({q.shape[1]},)")
    if not sinks.dtype.is_floating_point:
        raise FeedError(f"attention: sinks must be a float tensor, got {sinks.dtype}")
    if sinks.device != q.device:
        raise FeedError(f"attention: sinks is on {sinks.device}, q on {q.device}; put both "
                        "on one device")


def _weights(o, lse, sinks):
    """``(lse, sink, weight)`` in ``o``'s arithmetic width (float32, float64 for float64
    inputs): the row weight ``sigmoid(lse - sink)`` of the merge (module docstring)."""
    import torch
    wide = torch.promote_types(o.dtype, torch.float32)
    lse, sink = lse.to(wide), sinks.to(wide).view(1, -1, 1)
    return lse, sink, torch.sigmoid(lse - sink)


def merge_sinks_into(o, lse, sinks):
    """:func:`merge_sinks` written into ``o`` (a prepared call's output, overwritten by
    every call anyway): the same arithmetic, rounded to ``o``'s dtype once. Returns
    ``o``."""
    return o.mul_(_weights(o, lse, sinks)[2].unsqueeze(-1))


def merge_sinks(o, lse, sinks, return_lse: bool):
    """``o`` (B, Hq, N, Dv) and its row ``lse`` (B, Hq, N) merged with the per-head sink
    logits (module docstring); ``(o', lse')`` with ``return_lse``. ``o'`` keeps ``o``'s
    dtype, the arithmetic is float32 (float64 for float64 inputs)."""
    import torch
    lse, sink, weight = _weights(o, lse, sinks)
    out = (o.to(lse.dtype) * weight.unsqueeze(-1)).to(o.dtype)
    if not return_lse:
        return out
    return out, torch.logaddexp(lse, sink.expand_as(lse))
