"""``all_merge``: the derived merge of any compiled chain's partial states across ranks.

Every rank holds a :class:`~neptune_fusion.runtime.merge.Partial` of the same plan over
its share of the fused axis (for example ``m`` and ``l`` of a log-sum-exp over its slice
of the vocabulary: the tensor-parallel cross-entropy normaliser). The states cross in one
all_gather (after the small signature gather that checks that every rank's states have
the same members, shapes and dtypes), and every rank merges them with
:func:`~neptune_fusion.runtime.merge.merge_partials`: the plan's proved repairs.
"""

from __future__ import annotations

import zlib

from ..errors import DistributedError
from ..runtime.merge import Partial, merge_partials
from .group import all_gather, dtype_code, dtype_name, gather_ints, ranks

WHAT = "all_merge"


def all_merge(partial: Partial, group=None, *, plan, extent: int | None = None) -> Partial:
    """Merge every rank's ``partial`` of ``plan`` (``nf.plan(outputs)`` of the chain);
    every rank returns the same merged :class:`Partial` (float64 components). ``extent``
    as for ``merge_partials`` (default: the ranks' total count). Ranks with an empty
    partial (``count == 0``) take part and are ignored; a group of one merges alone."""
    if not isinstance(partial, Partial):
        raise DistributedError(f"{WHAT}: partial must be a neptune_fusion Partial (the "
                               f"states and the count they cover), got "
                               f"{type(partial).__name__}")
    import torch
    names = sorted(partial.states)
    comps = [torch.as_tensor(c) for n in names for c in partial.states[n]]
    device = comps[0].device if comps else "cpu"
    sig = [partial.count, len(names)]
    for n in names:
        sig += [zlib.crc32(n.encode()), len(partial.states[n])]
        for c in (torch.as_tensor(x) for x in partial.states[n]):
            sig += [dtype_code(c.dtype), c.dim(), *c.shape]
    where = ranks(group, WHAT)
    rows = gather_ints(sig, device, where)
    for rank, row in enumerate(rows):
        if row[1:] != rows[0][1:]:
            raise DistributedError(f"{WHAT}: the partial states differ across ranks: rank 0 "
                                   f"has {_describe(rows[0])}, rank {rank} has "
                                   f"{_describe(row)}; every rank must pass states of the "
                                   "same members, shapes and dtypes")
    flat = torch.cat([c.to(torch.float64).reshape(-1) for c in comps]) if comps \
        else torch.zeros(0, dtype=torch.float64)
    parts = []
    for row, got in zip(rows, all_gather(flat, where)):
        states, at = {}, 0
        for n in names:
            cs = []
            for c in partial.states[n]:
                c = torch.as_tensor(c)
                cs.append(got[at:at + c.numel()].reshape(c.shape))
                at += c.numel()
            states[n] = tuple(cs)
        parts.append(Partial(states, row[0]))
    return merge_partials(plan, parts, extent=extent)


def _describe(row: list[int]) -> str:
    """A signature row in words: members (by position), their components' dtypes, shapes."""
    out, at = [], 2
    for k in range(row[1]):
        ncomp = row[at + 1]
        at += 2
        shapes = []
        for _ in range(ncomp):
            dt, nd = row[at], row[at + 1]
            shapes.append(f"{dtype_name(dt)}{list(row[at + 2:at + 2 + nd])}")
            at += 2 + nd
        out.append(f"member {k}: {', '.join(shapes)}")
    return f"{row[1]} member(s) ({'; '.join(out)})"
