"""Index maps of torch's views and broadcasting, as functions of index expressions.

A translated tensor is a function from an index tuple (IR expressions) to the IR
expression of its element (:class:`~neptune_fusion.dynamo.translate.Val`). A view changes
which element an index names; these helpers build the source index from the view's.

``view``/``reshape`` merge and split dimensions. A merge builds ``b * H + h``; splitting
that expression again by ``(B, H)`` (``bmm``'s batch, flattened and then restored, as
``matmul`` decomposes) gives back ``(b, h)`` instead of ``((b*H + h) // H, (b*H + h) % H)``:
the :class:`Merges` of one translation remembers the merges it built.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..ir.nodes import Expr


class Refused(Exception):
    """A graph node the translation cannot take, with the reason (never escapes the
    backend: the region falls back to the rest of the compiler with this reason)."""


class Merges:
    """The merged indices built during one translation (by identity of the interned
    expression), so that a split of a merge gives back its parts."""

    def __init__(self) -> None:
        self._made: dict[int, tuple[Expr, tuple[Expr, ...], tuple[int, ...]]] = {}

    def merge(self, idx: Sequence[Expr], sizes: Sequence[int]) -> Expr:
        """``idx[0] * prod(sizes[1:]) + ... + idx[-1]``: row-major linear index."""
        if len(idx) == 1:
            return idx[0]
        out = idx[0]
        for i, n in zip(idx[1:], sizes[1:]):
            out = out * n + i
        self._made[id(out)] = (out, tuple(idx), tuple(sizes))
        return out

    def split(self, lin: Expr, sizes: Sequence[int]) -> tuple[Expr, ...]:
        """The row-major components of ``lin`` over ``sizes`` (inverse of :meth:`merge`)."""
        if len(sizes) == 1:
            return (lin,)
        got = self._made.get(id(lin))
        if got is not None and got[0] is lin and got[2] == tuple(sizes):
            return got[1]
        out, stride = [], math.prod(sizes)
        for k, n in enumerate(sizes):
            stride //= n
            part = lin // stride if stride > 1 else lin
            out.append(part if k == 0 else part % n)
        return tuple(out)


def broadcast(idx: Sequence[Expr], shape: Sequence[int], out: Sequence[int]) -> tuple:
    """The index into a tensor of ``shape`` broadcast to ``out`` (torch's rules)."""
    lead = len(out) - len(shape)
    return tuple(0 if n == 1 and out[lead + d] != 1 else idx[lead + d]
                 for d, n in enumerate(shape))


def view_groups(src: Sequence[int], dst: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Pair the non-1 dimensions of ``src`` and ``dst`` into groups of equal product
    (``(2, 3, 4) -> (6, 4)``: ``[([0, 1], [0]), ([2], [1])]``)."""
    s = [d for d, n in enumerate(src) if n != 1]
    t = [d for d, n in enumerate(dst) if n != 1]
    groups, i, j = [], 0, 0
    while i < len(s) or j < len(t):
        gs, gt, ps, pt = [], [], 1, 1
        while True:
            if ps <= pt and i < len(s):
                gs.append(s[i])
                ps *= src[s[i]]
                i += 1
            elif j < len(t):
                gt.append(t[j])
                pt *= dst[t[j]]
                j += 1
            else:
                break
            if ps == pt and gs and gt:
                break
        if ps != pt:
            raise Refused(f"view {tuple(src)} -> {tuple(dst)}: sizes do not pair up")
        groups.append((gs, gt))
    return groups


def view_index(merges: Merges, idx: Sequence[Expr], src: Sequence[int],
               dst: Sequence[int]) -> tuple:
    """The index into ``src`` of the element at ``idx`` of its row-major view ``dst``."""
    out: list = [0] * len(src)
    # an extent-1 index is 0 whichever axis of extent 1 gives it; keeping the view's own
    # (its trailing ones paired with the source's) keeps a row axis the compiler tiles
    ones_src = [d for d, n in enumerate(src) if n == 1]
    ones_dst = [d for d, n in enumerate(dst) if n == 1]
    for d, e in zip(reversed(ones_src), reversed(ones_dst)):
        out[d] = idx[e]
    for gs, gt in view_groups(src, dst):
        lin = merges.merge([idx[d] for d in gt], [dst[d] for d in gt])
        for d, e in zip(gs, merges.split(lin, [src[d] for d in gs])):
            out[d] = e
    return tuple(out)
