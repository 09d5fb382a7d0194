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


# The same closed form as one compiled kernel, for a decode step (six torch operations,
# a dozen small kernels, cost about 0.3 ms of host time per step on the H200 host,
# 2026-12-01). Rows are flattened with the value axis, ``q = r * Dv + d``, so the
# program has two tile axes (rows, ranks); each row re-reads its rank's ``lse`` (P
# values). ``lse = -inf`` (a rank that saw no key of the row) is raised to ``FLOOR`` so
# that a row no rank saw has a finite maximum: its weights are then equal and its
# ``o_r`` zero, so the output is 0, and its log-sum-exp is set to -inf explicitly.
FLOOR = -1e30
_KERNELS: dict = {}   # (Dv, dtypes, lse?) -> the compiled merge (a bounded memo of derived code)


def merge_kernel(dv: int, dtype: str, ranks: int = 8):
    """The compiled merge of ``P`` stacked states: ``(lse (P, R) float32, o (P, R * dv)
    dtype) -> (o (R * dv,) dtype, lse (R * dv,) float32)`` (each row's log-sum-exp
    repeated over its ``dv`` values). One fixed schedule, so every rank runs the same
    arithmetic and returns the same bits; its rank tile is ``ranks`` rounded up to a
    power of two. Made for a decode step's small states: on the ring's large ones (8k
    rows x 32 heads x 128, H200, 2026-12-01) it took 3.8 ms for two states stacked
    rank-first (the tile's rank axis strides by a whole state: uncoalesced loads) and
    0.5-1.9 ms stacked rank-last (two to four states; torch's pairwise merges 0.57-1.40
    ms), so the ring merges with :func:`merge_states`."""
    import math

    from ..runtime.inputs import remember
    tile = max(2, 1 << (max(ranks, 1) - 1).bit_length())
    key = (dv, dtype, tile)
    got = _KERNELS.get(key)
    if got is not None:
        return got
    import neptune_fusion as nf
    P, R, Q = nf.sizes("P R Q")
    lse = nf.placeholder((P, R), name="lse")
    o = nf.placeholder((P, Q), name="o", dtype=dtype)
    p = nf.reduce_axis(P, "p")

    def a(p_, q):
        return nf.maximum(lse[p_, q // dv], FLOOR)
    m = nf.compute((Q,), lambda q: nf.max(a(p, q), p), name="m")
    w = lambda q: nf.exp(a(p, q) - m[q])  # noqa: E731
    l_ = nf.compute((Q,), lambda q: nf.sum(w(q), p), name="l")
    s = nf.compute((Q,), lambda q: nf.sum(w(q) * o[p, q], p), name="s")
    out = nf.compute((Q,), lambda q: nf.cast(s[q] / l_[q], dtype), name="o_merged")
    lse_out = nf.compute((Q,), lambda q: nf.where(m[q] <= FLOOR, -math.inf,
                                                  m[q] + nf.log(l_[q])), name="lse_merged")
    got = nf.compile([out, lse_out], [lse, o], name="merge_states",
                     schedule=nf.Schedule(block_m=256, block_n=tile, num_warps=4,
                                          num_stages=1))
    remember(_KERNELS, key, got, 16)
    return got


def merge_flat(got, o_shape, lse_shape, dtype):
    """Merge the states one all_gather of :func:`pack` gave (``got``: (P, packed)) with
    :func:`merge_kernel`: ``(o, lse)``, o of ``o_shape`` in ``dtype``, lse float32."""
    import torch
    n_o = _numel(o_shape)
    dv = o_shape[-1]
    pad = _pad(n_o, dtype)
    o_s = got[:, :n_o]
    lse_s = got[:, n_o + pad:].view(torch.float32)
    o, lse = merge_kernel(dv, str(dtype).removeprefix("torch."), ranks=got.shape[0])(lse_s, o_s)
    return o.view(o_shape), lse.view(-1, dv)[:, 0].reshape(lse_shape)


def pack(o, lse):
    """``o`` and ``lse`` (float32, its bits viewed in ``o``'s dtype) in one flat tensor of
    ``o``'s dtype: one all_gather carries both."""
    import torch
    n_o = o.numel()
    pad = _pad(n_o, o.dtype)
    parts = [o.reshape(-1)]
    if pad:
        parts.append(torch.zeros(pad, dtype=o.dtype, device=o.device))
    parts.append(lse.to(torch.float32).reshape(-1).view(o.dtype))
    return torch.cat(parts)


def _numel(shape) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


def _pad(n_o: int, dtype) -> int:
    """Elements of ``dtype`` after ``n_o`` of them so the float32 part starts 4-aligned."""
    size = dtype.itemsize
    return (-(n_o * size) % 4) // size
