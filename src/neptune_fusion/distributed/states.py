"""Attention's partial state across shards: the pair ``(o, lse)``.

A shard's attention over its keys, with each row's log-sum-exp ``lse = m + log(l)``
(``nf.attention(..., return_lse=True)``, one kernel), *is* a partial state of the
attention plan (:func:`~neptune_fusion.runtime.merge.merge_partials`) in the plan's own
domain: ``m = lse``, ``l = 1`` and ``o_sum = o`` (``l = 0``, ``o_sum = 0`` for a row with
no key, ``lse = -inf``). :func:`as_partial` builds that :class:`Partial`.

Merging such states with the plan's derived repairs (``l' = l exp(m - m')``, the same for
``o_sum``) reduces to the closed form :func:`merge_states` computes::

    lse = log sum_r exp(lse_r);   o = sum_r exp(lse_r - lse) o_r   (0 where lse = -inf)

a handful of torch operations instead of ``merge_partials``' evaluation of the repair IR
per partial (1.2-2.5 ms of host time for three small partials on the 2-core CPU host,
2026-11-30: too slow for a decode step). tests/distributed/test_states.py checks that
both give the same state.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..runtime.merge import Partial


def as_partial(o, lse, count: int) -> Partial:
    """``(o, lse)`` as a :class:`Partial` of the attention plan (module docstring)."""
    import torch
    lse = lse.to(torch.float64)
    return Partial({"m": (lse,), "l": (torch.isfinite(lse).to(torch.float64),),
                    "o_sum": (o.to(torch.float64),)}, count)


def merge_states(os: Sequence, lses: Sequence):
    """Merge shards' ``(o_r, lse_r)`` (o: (..., Dv), lse: (...)) into ``(o, lse)``, both
    float32; a row no shard saw gives o = 0, lse = -inf."""
    import torch
    lses = [x.to(torch.float32) for x in lses]
    lse = lses[0]
    for x in lses[1:]:
        lse = torch.logaddexp(lse, x)      # -inf with -inf gives -inf
    acc = None
    for o, x in zip(os, lses):
        w = torch.exp(x - lse).nan_to_num_(0.0)   # NaN where every lse is -inf: no key
        part = w.unsqueeze(-1) * o.to(torch.float32)
        acc = part if acc is None else acc.add_(part)
    return acc, lse


def merge_stacked(o, lse):
    """:func:`merge_states` of states stacked along dim 0: ``o`` (P, ..., Dv) and ``lse``
    (P, ...), float32 (the form one all_gather gives); six torch operations."""
    import torch
    total = torch.logsumexp(lse, 0)
    w = torch.exp(lse - total).nan_to_num_(0.0)
    return (w.unsqueeze(-1) * o).sum(0), total
