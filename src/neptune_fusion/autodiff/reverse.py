"""Reverse mode on the IR: the gradients of a program's outputs as new plain programs.

For each tensor, last consumer first, its adjoint ``d_t`` is a new :class:`Compute` over
``t``'s shape: the sum, over every load of ``t`` in the program, of the cotangent that the
rule tables (:mod:`.rules`) carry from the consumer's adjoint down to that load, with the
load's indices solved for ``t``'s coordinates (:mod:`.invert`) and every other variable
summed. Before and after (``y[i] = sum_j(x[i, j] * w[j])``, seed ``d_y``)::

    d_x[i, j] = d_y[i] * w[j]
    d_w[j]    = sum_i(d_y[i] * x[i, j])

A :class:`Link` adds what the loads cannot show: a saved tensor that stands for a
function of another (the log-sum-exp of a softmax's scores, :mod:`.softmax`), whose
adjoint flows into that tensor by the link's own rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import DerivativeError
from ..ir import build
from ..ir.dtypes import float32
from ..ir.graph import tensor_inputs
from ..ir.nodes import (
    Binary,
    Cast,
    Compute,
    Expr,
    IndexVar,
    Load,
    Placeholder,
    Reduce,
    Tensor,
    Unary,
    Where,
    fresh_uid,
)
from ..ir.traverse import rewrite, substitute
from ..ir.verify import verify
from . import rules
from .invert import invert
from .simplify import simplify
from .split import split_sums


@dataclass(frozen=True, eq=False)
class Link:
    """``saved`` stands for a function of ``source``; ``adjoint(d_saved, xs)`` is the
    cotangent it passes to ``source`` at the coordinates ``xs`` (a list of terms)."""

    saved: Placeholder
    source: Compute
    adjoint: Callable[[Compute, tuple[IndexVar, ...]], Expr]


def backprop(e: Expr, g: Expr, values: Mapping[Expr, Expr] = {}) -> list[tuple[Load, Expr]]:
    """The cotangent arriving at each load in ``e`` (one entry per path from the root:
    a load reached twice gets two entries) when ``g`` arrives at ``e``; reduce axes stay
    free. ``values`` names nodes by a load of their value (a compute's body by the
    compute), so that ``exp``'s derivative reads ``p[i, j]`` rather than recomputing."""
    out: list[tuple[Load, Expr]] = []
    stack = [(e, g)]
    while stack:
        node, g = stack.pop()
        if not node.dtype.is_float:
            continue
        if isinstance(node, Load):
            out.append((node, g))
            continue
        y = values.get(node, node)
        if isinstance(node, Unary):
            rule = rules.UNARY[node.op]
            if rule is not None:
                stack.append((node.x, rule(node.x, y, g)))
        elif isinstance(node, Binary):
            rule = rules.BINARY[node.op]
            if rule is not None:
                ga, gb = rule(node.a, node.b, y, g)
                stack.extend((c, gc) for c, gc in ((node.b, gb), (node.a, ga))
                             if gc is not None)
        elif isinstance(node, Where):
            stack.append((node.b, build.where(node.cond, 0.0, g)))
            stack.append((node.a, build.where(node.cond, g, 0.0)))
        elif isinstance(node, Cast):
            stack.append((node.x, g))   # float to float: the value passes through
        elif isinstance(node, Reduce):
            stack.append((node.body, rules.REDUCE[node.op](node.body, y, g)))
    return out


def _order(outputs: Sequence[Compute], links: Mapping[Placeholder, Link]) -> list[Tensor]:
    """Tensors, each after those it reads; a linked saved tensor after its source."""
    order: list[Tensor] = []
    seen: set[Tensor] = set()

    def deps(t: Tensor) -> list[Tensor]:
        link = links.get(t)
        return tensor_inputs(t) + ([link.source] if link is not None else [])

    def visit(t: Tensor) -> None:
        stack = [(t, False)]
        while stack:
            u, done = stack.pop()
            if done:
                order.append(u)
                continue
            if u in seen:
                continue
            seen.add(u)
            stack.append((u, True))
            stack.extend((w, False) for w in reversed(deps(u)) if w not in seen)
    for o in outputs:
        visit(o)
    return order


def _sum_rest(body: Expr, keep: frozenset, taken: set[str]) -> Expr:
    """``body`` summed over its free variables outside ``keep`` (renamed apart from
    ``taken``, so that a summed axis never prints like a coordinate)."""
    rest = sorted(body.free_vars - keep, key=lambda v: v.name)
    fresh = {}
    for v in rest:
        name = v.name
        while name in taken:
            name += "'"
        taken.add(name)
        fresh[v] = IndexVar(name, v.extent, "reduce", fresh_uid())
    body = substitute(body, fresh)
    if fresh and body.dtype.is_float and body.dtype.bits < 32:
        # half-precision loads widened: the sum accumulates in float32 (and stays a sum of
        # a product, the contraction tl.dot takes)
        body = rewrite(body, lambda e: Cast(e, float32) if isinstance(e, Load)
                       and e.dtype.is_float and e.dtype.bits < 32 else None)
    return build.reduce("sum", body, tuple(fresh.values())) if fresh else body


def _term(load: Load, g: Expr, xs: tuple[IndexVar, ...], extra_rules: tuple) -> Expr:
    """``g`` (arriving at ``load``) at the loaded tensor's coordinates ``xs``, summed over
    every other variable. A grouped index (``h // G``) sums in two steps, each over one
    axis as the code generator lowers them: ``d_k_h[b, h, j, c] = sum_i(...)`` per
    query head, then ``sum_g(d_k_h[b, hk * G + g, j, c])``."""
    mapping, summed = invert(load, xs)
    if not summed:
        body = substitute(g, mapping)
        return _sum_rest(body, frozenset(xs), {x.name for x in xs})
    t = load.tensor
    heads = [v.a if isinstance(v, Binary) else v for v in load.indices]
    ys = tuple(IndexVar(v.name, v.extent, "spatial", fresh_uid()) for v in heads)
    inner = substitute(g, dict(zip(heads, ys)))
    inner = _sum_rest(inner, frozenset(ys), {y.name for y in ys})
    name = f"d_{t.name}_" + "".join(v.name for v in heads if v not in load.indices)
    per = Compute(name, tuple(v.extent for v in heads), ys,
                  build.cast(simplify(inner, extra_rules), float32), fresh_uid())
    verify(per)
    body = Load(per, tuple(mapping[v] for v in heads))
    return build.reduce("sum", body, tuple(summed))


def gradients(outputs: Sequence[Compute], seeds: Sequence[Placeholder],
              wrt: Sequence[Placeholder], links: Sequence[Link] = (),
              extra_rules: tuple = ()) -> list[Compute | None]:
    """The gradient of ``sum(outputs[k] * seeds[k])`` with respect to each of ``wrt``: a
    :class:`Compute` named ``d_<name>`` of the placeholder's shape and dtype, or None
    where no output depends on it. Intermediate adjoints are float32 computes the
    gradients read; ``extra_rules`` join the simplifier (:mod:`.simplify`)."""
    if len(seeds) != len(outputs):
        raise DerivativeError(f"{len(outputs)} outputs but {len(seeds)} seeds")
    for o, s in zip(outputs, seeds):
        if len(o.shape) != len(s.shape):
            raise DerivativeError(f"the seed {s.name!r} of output {o.name!r} has "
                                  f"{len(s.shape)} dimensions, the output {len(o.shape)}")
    link_of = {ln.saved: ln for ln in links}
    order = _order(outputs, link_of)
    needs: set[Tensor] = set(wrt)
    for t in order:   # a tensor needs an adjoint when a wanted input flows into it
        if any(u in needs for u in tensor_inputs(t)) or \
                (t in link_of and link_of[t].source in needs):
            needs.add(t)
    terms: dict[Tensor, list] = {t: [] for t in order}
    for o, s in zip(outputs, seeds):
        terms[o].append(lambda xs, s=s: Load(s, xs))
    adjoint: dict[Tensor, Compute] = {}
    for t in reversed(order):
        if t not in needs or not terms.get(t):
            continue
        parts = terms[t]
        if len(parts) == 1 and callable(parts[0]) and t in outputs and t not in wrt:
            d = seeds[outputs.index(t)]   # an output read by nothing: its seed
        else:
            d = _adjoint(t, parts, t.dtype if t in wrt else float32, extra_rules)
        adjoint[t] = d
        if isinstance(t, Compute):
            values = {t.body: Load(t, t.axes)}
            for load, g in backprop(t.body, Load(d, t.axes), values):
                if load.tensor in needs:
                    terms[load.tensor].append((load, g))
        link = link_of.get(t)
        if link is not None and link.source in needs:
            terms[link.source].append(lambda xs, link=link, d=d: link.adjoint(d, xs))
    return [adjoint.get(p) for p in wrt]


def _adjoint(t: Tensor, parts: list, dtype, extra_rules: tuple) -> Compute:
    """``d_t``: the sum of ``parts`` (a load and its cotangent, or a link's rule) over
    ``t``'s coordinates, named as ``t``'s own axes where it has them."""
    names = [a.name for a in t.axes] if isinstance(t, Compute) else _names(t, parts)
    xs = tuple(IndexVar(n, e, "spatial", fresh_uid()) for n, e in zip(names, t.shape))
    total = None
    for part in parts:
        e = part(xs) if callable(part) else _term(part[0], part[1], xs, extra_rules)
        total = e if total is None else total + e
    body = build.cast(split_sums(simplify(total, extra_rules), "d_" + t.name), dtype)
    out = Compute("d_" + t.name, t.shape, xs, body, fresh_uid())
    verify(out)
    return out


def _names(t: Tensor, parts: list) -> list[str]:
    """Coordinate names for a placeholder's adjoint: those of the first load of it whose
    index is an axis (``q[b, h, i, c]`` gives ``d_q[b, h, i, c]``), else ``x0, x1, ...``."""
    names = [f"x{d}" for d in range(len(t.shape))]
    for part in parts:
        if not callable(part):
            for d, idx in enumerate(part[0].indices):
                if names[d] == f"x{d}":
                    base = idx.a if isinstance(idx, Binary) else idx
                    if isinstance(base, IndexVar) and base.name not in names:
                        names[d] = base.name
    return names
