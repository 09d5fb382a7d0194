"""A program without a reduction (a map), as a reduction over a unit axis.

The code generator lowers fused groups: loops over one reduction axis each. A program
whose outputs reduce nothing (a scale, a cast, the merge of two states with per-row
weights) has no group, and :func:`as_unit_reductions` gives it one: each output's body
becomes a sum over a fresh axis of extent 1 that selects it::

    y[r, d] = f(...)   ->   y[r, d] = cast(sum(where(u == 0, f(...), 0), u), dtype(y))

Exact: the sum has one term, and the cast restores the output's dtype (a sum of a
16-bit body accumulates in float32). An axis the value does not read (a constant, or a
row broadcast along a column) enters the condition as ``axis >= 0``, always true, so the
sum depends on every axis of its output and the kernel has a row to block over. The
planner then sees one loop of one iteration, and the kernel is a map over the output's
tiles. Only floating-point outputs: a boolean or integer map is refused by name.
"""

from __future__ import annotations

from ..ir import build
from ..ir.graph import tensors_in_order
from ..ir.nodes import Compute, IndexVar, Reduce, fresh_uid
from ..ir.traverse import walk


def has_reduction(outputs) -> bool:
    """Whether any compute reachable from ``outputs`` reduces."""
    return any(isinstance(e, Reduce)
               for t in tensors_in_order(list(outputs)) if isinstance(t, Compute)
               for e in walk(t.body))


def as_unit_reductions(outputs: list[Compute]) -> list[Compute] | None:
    """``outputs`` with each body a sum over a unit axis (module docstring), or None when
    an output is not floating point."""
    if not all(o.body.dtype.is_float for o in outputs):
        return None
    out = []
    for o in outputs:
        u = IndexVar(f"{o.name}_unit", 1, "reduce", fresh_uid())
        cond = build.binary("eq", u, 0)
        for a in o.axes:   # an axis the value does not read (a constant row): the kernel
            if a not in o.body.free_vars:   # blocks over rows the sum depends on
                cond = build.binary("and", cond, build.binary("ge", a, 0))
        picked = build.where(cond, o.body, build.const(0.0, o.body.dtype))
        body = build.cast(build.reduce("sum", picked, u), o.body.dtype)
        out.append(Compute(o.name, o.shape, o.axes, body, fresh_uid()))
    return out
