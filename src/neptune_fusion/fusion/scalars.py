"""A 0-d tensor as a tensor of one row.

The kernels block over a row axis that every fused reduction depends on. A compute with
no axes -- a full reduction (a loss, ``sum_i lse[i]``), or a reduction of an earlier
reduction's result (``max_i sum_j x[i, j]``) -- has none. :func:`unit_rows` gives each
0-d compute one axis of extent 1 that its outermost reductions depend on::

    c[] = F_j f(j)    ->    c[z] = F_j where(z >= 0, f(j), identity_F)     z in [0, 1)
    c[] = g(...)      ->    c[z] = where(z >= 0, g(...), 0)                (no reduction)

Its readers read ``c[0]``; a 0-d reader reads ``c[z]`` at its own unit row, since the
planner may inline the read and a constant there would fold the guard away. Exact: the
condition always holds, so each reduction sees its own terms. The kernels then write a
``(1,)`` tensor per such output, which
:class:`~neptune_fusion.runtime.scalars.ScalarOutputs` views as 0-d.

A reduction that no output row depends on can also appear inside a row-indexed output
(``x[i, j] / sum_r x[r, 0]``, or after the planner's algebra: ``max_j(x[i, j] - c) =
max_j x[i, j] - c``); ``codegen/lower`` refuses to fuse it with the rows, and
``fusion/stages.split_passes`` makes it a pass with a 0-d output of its own, compiled
through this rewrite, and the outputs a map over its result.
"""

from __future__ import annotations

from ..ir import build
from ..ir.dtypes import int64
from ..ir.graph import tensors_in_order
from ..ir.nodes import Compute, Const, Expr, IndexVar, Load, Reduce, fresh_uid
from ..ir.reducers import reducer
from ..ir.traverse import rewrite, walk


def has_scalars(outputs) -> bool:
    """Whether a compute reachable from ``outputs`` has no axes."""
    return any(isinstance(t, Compute) and not t.shape
               for t in tensors_in_order(list(outputs)))


def unit_rows(outputs: list[Compute]) -> list[Compute]:
    """``outputs`` with every 0-d compute reachable from them given a unit row (module
    docstring); a compute that reads none is returned as it is."""
    memo: dict[int, Compute] = {}

    def compute(t: Compute) -> Compute:
        got = memo.get(id(t))
        if got is None:
            got = memo[id(t)] = _convert(t, compute)
        return got

    return [compute(o) for o in outputs]


def _convert(t: Compute, compute) -> Compute:
    z = None if t.shape else IndexVar(f"{t.name}_row", 1, "spatial", fresh_uid())
    # a 0-d reader reads a 0-d tensor at its own unit row (the planner may inline the
    # read, and a constant index there would fold the read's guard away); others at 0
    at = (Const(0, int64),) if z is None else (z,)

    def reads(e: Expr) -> Expr | None:
        if isinstance(e, Load) and isinstance(e.tensor, Compute):
            new = compute(e.tensor)
            if not e.tensor.shape:             # now a (1,) tensor: its only element
                return Load(new, at)
            return None if new is e.tensor else Load(new, e.indices)
        return None

    body = rewrite(t.body, reads)
    if z is None:
        return t if body is t.body else Compute(t.name, t.shape, t.axes, body, fresh_uid())
    kept = build.binary("ge", z, 0)

    def guard(e: Expr) -> Expr:
        """The outermost reductions of ``e`` guarded (a nested one stays as it is: its
        terms then span only its own axes and its parent's loop)."""
        if isinstance(e, Reduce):
            ident = build.const(reducer(e.op).identity, e.body.dtype)
            return Reduce(e.op, build.where(kept, e.body, ident), e.axes)
        kids = e.children()
        new = tuple(guard(c) for c in kids)
        return e if all(a is b for a, b in zip(new, kids)) else e.with_children(new)

    if any(isinstance(x, Reduce) for x in walk(body)):
        body = guard(body)
    else:
        body = build.where(kept, body, build.const(0, body.dtype))
    return Compute(t.name, (1,), (z,), body, fresh_uid())
