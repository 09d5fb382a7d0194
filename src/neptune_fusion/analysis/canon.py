"""Canonical forms: equal computations become identical (interned) nodes.

Two rewrites make that so:

* binders are renamed by the *height* of their reduction (1 + the height of the highest
  reduction inside its body), so ``max(s[i, j], j)`` and an inlined copy of it with a
  fresh ``j`` become the same node, and nested binders never collide; two reductions
  equal but for their binders' names (the backend names axes after their ops: SDPA's
  softmax maximum over ``r_amax`` and its empty-row guard's over ``r_amax_1``) become
  the first of them;
* the spatial axes of the outputs become one shared variable per (position, extent),
  so a reduction that two outputs both need (the row max of attention and of its
  log-sum-exp) is one node, computed once.

Both are pure renamings, so the reference value of every expression is unchanged.
"""

from __future__ import annotations

from ..ir.nodes import Compute, Expr, IndexVar, Reduce
from ..ir.traverse import inline, rewrite, substitute

_BINDER_BASE = -1_000_000  # canonical uids are negative: users' are positive


def _height(e: Expr, memo: dict[int, tuple[Expr, int]]) -> int:
    # keyed by id, so the memo keeps each node alive: the rewrite below builds transient
    # nodes, and a freed node's id can be reused by the next one (a stale height)
    got = memo.get(id(e))
    if got is None:
        h = max((_height(c, memo) for c in e.children()), default=0)
        if isinstance(e, Reduce):
            h += 1
        memo[id(e)] = got = (e, h)
    return got[1]


def canonical_binders(root: Expr, seen: dict | None = None) -> Expr:
    """Rename every reduction's axes to canonical variables chosen by its height, and
    make reductions equal up to their binders' names one node: the first seen, in
    ``seen`` (shared across a program's bodies: ``SpatialVars.binders``)."""
    heights: dict[int, tuple[Expr, int]] = {}
    seen = {} if seen is None else seen

    def fn(e: Expr) -> Expr | None:
        if not isinstance(e, Reduce):
            return None
        h = _height(e, heights)
        new_axes = tuple(
            # primes added by capture-avoiding renames are dropped: the height alone keeps
            # nested binders apart, and equal reductions must get equal names
            IndexVar(a.name.rstrip("'") or a.name, a.extent, "reduce",
                     _BINDER_BASE - 64 * h - p)
            for p, a in enumerate(e.axes))
        out = e if all(a is b for a, b in zip(new_axes, e.axes)) else \
            Reduce(e.op, substitute(e.body, dict(zip(e.axes, new_axes))), new_axes)
        # its name-free form (its children are canonical already: the rewrite is
        # bottom-up) keys the first reduction of that form
        anon = tuple(IndexVar("_", a.extent, "reduce", a.uid) for a in new_axes)
        key = Reduce(out.op, substitute(out.body, dict(zip(new_axes, anon))), anon)
        first = seen.setdefault(key, out)
        return None if first is e else first

    return rewrite(root, fn)


class SpatialVars:
    """Shared canonical spatial variables, one per (position, extent)."""

    def __init__(self) -> None:
        self._vars: dict[tuple[int, object], IndexVar] = {}
        self.binders: dict = {}   # reductions by name-free form (canonical_binders)

    def axes_for(self, c: Compute) -> tuple[IndexVar, ...]:
        out = []
        for p, a in enumerate(c.axes):
            key = (p, a.extent if isinstance(a.extent, int) else id(a.extent))
            v = self._vars.get(key)
            if v is None:
                v = IndexVar(a.name, a.extent, "spatial", _BINDER_BASE // 2 - len(self._vars))
                self._vars[key] = v
            out.append(v)
        return tuple(out)

    def copy(self) -> SpatialVars:
        """An independent copy holding the same canonical variables."""
        other = SpatialVars()
        other._vars = dict(self._vars)
        other.binders = dict(self.binders)
        return other

    @property
    def context(self) -> tuple[IndexVar, ...]:
        """All canonical spatial variables, innermost (highest position) first."""
        keyed = sorted(self._vars.items(), key=lambda kv: -kv[0][0])
        return tuple(v for _, v in keyed)


def canonical_output(c: Compute, spatial: SpatialVars, memo: dict | None = None
                     ) -> tuple[Expr, tuple[IndexVar, ...]]:
    """``c``'s body with every compute inlined, on canonical spatial axes and binders.

    ``memo`` (compute -> inlined body) may be shared across calls on one graph.
    """
    axes = spatial.axes_for(c)
    body = substitute(inline(c.body, memo), dict(zip(c.axes, axes)))
    return canonical_binders(body, spatial.binders), axes
