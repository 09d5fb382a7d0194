"""Sums over several axes split into single-axis sums, each its own compute.

A gradient often sums over several axes at once (``d_g[k] = sum_{i,n} d_y[i, n] w[k, n]
x[i, k] r[i]``); the code generator lowers one reduction axis per loop. The split is
exact (finite sums commute) and chooses, for the inner sum, the axis whose factors need
the fewest coordinates, taking the other factors out. Before and after::

    d_g[k] = sum(d_y[i, n] * w[k, n] * x[i, k] * r[i], (i, n))

    d_g_n[i, k] = sum(d_y[i, n] * w[k, n], n)
    d_g[k] = sum(x[i, k] * r[i] * d_g_n[i, k], i)
"""

from __future__ import annotations

from ..ir.nodes import Compute, Expr, IndexVar, Load, Reduce, fresh_uid
from ..ir.traverse import factors, product, rewrite, substitute
from ..ir.verify import verify


def _inner(red: Reduce) -> tuple[IndexVar, list[Expr], list[Expr], list[IndexVar]]:
    """``(axis, with, without, coordinates)``: the axis to sum first, the factors that
    depend on it and those that do not, and the coordinates the partial sum needs."""
    fs = factors(red.body)
    best = None
    for a in reversed(red.axes):
        dep = [f for f in fs if a in f.free_vars]
        rest = [f for f in fs if a not in f.free_vars]
        free = frozenset().union(*(f.free_vars for f in dep)) - {a}
        coords = sorted(free, key=lambda v: (v.name, v.uid))
        if best is None or len(coords) < len(best[3]):
            best = (a, dep, rest, coords)
    return best


def split_sums(body: Expr, name: str) -> Expr:
    """``body`` with every sum over several axes made single-axis sums over partial-sum
    computes named ``<name>_<axis>`` (module docstring)."""
    def one(e: Expr) -> Expr | None:
        if not (isinstance(e, Reduce) and e.op == "sum" and len(e.axes) > 1):
            return None
        while isinstance(e, Reduce) and len(e.axes) > 1:
            a, dep, rest, coords = _inner(e)
            xs = tuple(IndexVar(v.name, v.extent, "spatial", fresh_uid()) for v in coords)
            inner = substitute(Reduce("sum", product(dep), (a,)), dict(zip(coords, xs)))
            t = Compute(f"{name}_{a.name}", tuple(v.extent for v in coords), xs, inner,
                        fresh_uid())
            verify(t)
            axes = tuple(x for x in e.axes if x is not a)
            e = Reduce("sum", product(rest + [Load(t, tuple(coords))]), axes)
        return e
    return rewrite(body, one)
