"""The dataflow graph of reductions, and which of its edges block single-pass fusion.

After inlining and canonicalisation each output is one expression. A reduction whose free
variables are all spatial (output) axes is *hoistable*: it is a value per output point,
computed by a loop over its own axes. Hoistable reductions are the nodes of the graph; an
edge ``P -> C`` says that ``P``'s final value appears in ``C``'s body. When ``P`` and ``C``
reduce over axes of the same extents, they could share one loop if ``C`` could read ``P``'s
running value instead: that is the edge the algebra tries to break.

Reductions that depend on an enclosing binder (``q . k`` inside attention's loop over
``j``) are not nodes: they are part of their consumer's per-element computation.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.nodes import Expr, IndexVar, Reduce


def extents_key(r: Reduce) -> tuple:
    """What must agree for two reductions to share a loop: the extents of their axes."""
    return tuple(a.extent for a in r.axes)


def same_extents(a: Reduce, b: Reduce) -> bool:
    ka, kb = extents_key(a), extents_key(b)
    return len(ka) == len(kb) and all(x is y or (isinstance(x, int) and x == y)
                                      for x, y in zip(ka, kb))


def maximal_hoistable(root: Expr, outer: frozenset[IndexVar]) -> list[Reduce]:
    """Hoistable reductions under ``root`` not nested in another hoistable one."""
    found: list[Reduce] = []
    seen: set[int] = set()
    stack = [root]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, Reduce) and e.free_vars <= outer:
            found.append(e)
            continue
        stack.extend(reversed(e.children()))
    return found


@dataclass(frozen=True)
class ReductionGraph:
    """Hoistable reductions in dependency order, and each one's direct producers."""

    order: tuple[Reduce, ...]
    deps: dict[Reduce, tuple[Reduce, ...]]

    def consumers_of(self, p: Reduce) -> list[Reduce]:
        return [c for c in self.order if any(x is p for x in self.deps[c])]


def reduction_graph(bodies: list[Expr], outer: frozenset[IndexVar]) -> ReductionGraph:
    """Build the graph of the hoistable reductions the output ``bodies`` need."""
    deps: dict[Reduce, tuple[Reduce, ...]] = {}
    order: list[Reduce] = []

    def visit(r: Reduce) -> None:
        if r in deps:
            return
        inner = tuple(p for p in maximal_hoistable(r.body, outer) if p is not r)
        deps[r] = inner
        for p in inner:
            visit(p)
        order.append(r)

    for b in bodies:
        for r in maximal_hoistable(b, outer):
            visit(r)
    return ReductionGraph(tuple(order), deps)


def reaches_through_other(graph: ReductionGraph, p: Reduce, c: Reduce,
                          fused: set[tuple[Reduce, Reduce]]) -> Reduce | None:
    """A reduction ``x`` on a path ``p -> ... -> x -> ... -> c`` that needs ``p`` final.

    Such a path forces ``c`` into a later pass than ``p`` whatever the repair.
    """
    # walk forward from p; remember whether a non-fused edge has been crossed
    frontier = [(p, None)]
    seen: set[tuple[int, bool]] = set()
    while frontier:
        node, culprit = frontier.pop()
        for nxt in graph.consumers_of(node):
            crossed = culprit
            if crossed is None and (node, nxt) not in fused:
                crossed = nxt
            if nxt is c:
                if crossed is not None:
                    return crossed
                continue
            key = (id(nxt), crossed is not None)
            if key not in seen:
                seen.add(key)
                frontier.append((nxt, crossed))
    return None
