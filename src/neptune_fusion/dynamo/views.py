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
from collections.abc import Mapping, Sequence

from ..ir.nodes import Expr
from .refused import Refused
from .symbolic import hint, same, static


class Merges:
    """The merged indices built during one translation (by identity of the interned
    expression), so that a split of a merge gives back its parts. ``size_of`` gives a
    dynamic size's IR value (symbolic.py), with which a merge of dynamic dimensions is
    written: ``(b, h) -> b * H + h``."""

    def __init__(self, size_of=None) -> None:
        self._made: dict[int, tuple[Expr, tuple[Expr, ...], tuple]] = {}
        self._size_of = size_of or (lambda n: n)

    def merge(self, idx: Sequence[Expr], sizes: Sequence) -> Expr:
        """``idx[0] * prod(sizes[1:]) + ... + idx[-1]``: row-major linear index."""
        if len(idx) == 1:
            return idx[0]
        out = idx[0]
        for i, n in zip(idx[1:], sizes[1:]):
            out = out * (n if static(n) else self._size_of(n)) + i
        self._made[id(out)] = (out, tuple(idx), tuple(sizes))
        return out

    def split(self, lin: Expr, sizes: Sequence) -> tuple[Expr, ...]:
        """The row-major components of ``lin`` over ``sizes`` (inverse of :meth:`merge`).
        Only a merge's own split may have a dynamic size past the first: a division by
        a dynamic size is not written (``Refused``)."""
        if len(sizes) == 1:
            return (lin,)
        got = self._made.get(id(lin))
        if got is not None and got[0] is lin and _same_dims(got[2], sizes):
            return got[1]
        if not all(static(n) for n in sizes[1:]):
            raise Refused(f"a split of a dimension over dynamic sizes {tuple(sizes)} that "
                          "is not the inverse of a merge")
        out = []
        for k in range(len(sizes)):
            stride = math.prod(sizes[k + 1:])
            part = lin // stride if stride > 1 else lin
            out.append(part if k == 0 else part % sizes[k])
        return tuple(out)


def _same_dims(a: Sequence, b: Sequence) -> bool:
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


def broadcast(idx: Sequence[Expr], shape: Sequence[int], out: Sequence[int]) -> tuple:
    """The index into a tensor of ``shape`` broadcast to ``out`` (torch's rules)."""
    lead = len(out) - len(shape)
    return tuple(0 if n == 1 and out[lead + d] != 1 else idx[lead + d]
                 for d, n in enumerate(shape))


def view_groups(src: Sequence, dst: Sequence, hints: Mapping | None = None
                ) -> list[tuple[list[int], list[int]]]:
    """Pair the non-1 dimensions of ``src`` and ``dst`` into groups of equal product
    (``(2, 3, 4) -> (6, 4)``: ``[([0, 1], [0]), ([2], [1])]``). For dynamic dimensions
    (sympy expressions) the example values of their symbols (``hints``) choose the
    pairing, and each group's products are checked equal as expressions."""
    hints = hints or {}
    s = [d for d, n in enumerate(src) if not (static(n) and n == 1)]
    t = [d for d, n in enumerate(dst) if not (static(n) and n == 1)]
    groups, i, j = [], 0, 0
    while i < len(s) or j < len(t):
        gs, gt, ps, pt = [], [], 1, 1
        while True:
            if ps <= pt and i < len(s):
                gs.append(s[i])
                ps *= hint(src[s[i]], hints)
                i += 1
            elif j < len(t):
                gt.append(t[j])
                pt *= hint(dst[t[j]], hints)
                j += 1
            else:
                break
            if ps == pt and gs and gt:
                break
        if ps != pt or not same(math.prod(src[d] for d in gs),
                                math.prod(dst[d] for d in gt)):
            raise Refused(f"view {tuple(src)} -> {tuple(dst)}: sizes do not pair up")
        groups.append((gs, gt))
    return groups


def view_index(merges: Merges, idx: Sequence[Expr], src: Sequence, dst: Sequence,
               hints: Mapping | None = None) -> tuple:
    """The index into ``src`` of the element at ``idx`` of its row-major view ``dst``
    (``hints``: see :func:`view_groups`)."""
    out: list = [0] * len(src)
    # an extent-1 index is 0 whichever axis of extent 1 gives it; keeping the view's own
    # (its trailing ones paired with the source's) keeps a row axis the compiler tiles
    ones_src = [d for d, n in enumerate(src) if static(n) and n == 1]
    ones_dst = [d for d, n in enumerate(dst) if static(n) and n == 1]
    for d, e in zip(reversed(ones_src), reversed(ones_dst)):
        out[d] = idx[e]
    for gs, gt in view_groups(src, dst, hints):
        lin = merges.merge([idx[d] for d in gt], [dst[d] for d in gt])
        for d, e in zip(gs, merges.split(lin, [src[d] for d in gs])):
            out[d] = e
    return tuple(out)
