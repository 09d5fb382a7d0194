"""Attention's partial state across shards: the pair ``(o, lse)``.

A shard's attention over its keys, with each row's log-sum-exp ``lse = m + log(l)``
(``nf.attention(..., return_lse=True)``, one kernel), *is* a partial state of the
attention plan (:func:`~neptune_fusion.runtime.merge.merge_partials`) in the plan's own
domain: ``m = lse``, ``l = 1`` and ``o_sum = o`` (``l = 0``, ``o_sum = 0`` for a row with
no key, ``lse = -inf``). :func:`as_partial` builds that :class:`Partial`.

Merging such states with the plan's derived repairs (``l' = l exp(m - m')``, the same for
``o_sum``) reduces to the closed form :func:`merge_states` computes::

    M = max_r lse_r;  w_r = exp(lse_r - M);  L = sum_r w_r
    o = sum_r w_r o_r / L   (0 where L = 0);  lse = M + log(L)

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
    """Merge shards' ``(o_r, lse_r)`` (o: (..., Dv), lse: (...)) into ``(o, lse)``: o in
    float32, lse float32; a row no shard saw gives o = 0, lse = -inf."""
    import torch
    lses = [x.to(torch.float32) for x in lses]
    top = lses[0]
    for x in lses[1:]:
        top = torch.maximum(top, x)
    top = torch.where(torch.isfinite(top), top, torch.zeros((), dtype=top.dtype,
                                                             device=top.device))
    total, acc = None, None
    for o, x in zip(os, lses):
        w = torch.exp(x - top)          # 0 for an empty row (lse = -inf)
        part = w.unsqueeze(-1) * o.to(torch.float32)
        total = w if total is None else total + w
        acc = part if acc is None else acc + part
    o = torch.where(total.unsqueeze(-1) > 0, acc / total.unsqueeze(-1), 0.0)
    return o, top + torch.log(total)
