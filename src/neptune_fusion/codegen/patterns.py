"""Pattern tables over the IR that decide how a reduction lowers.

A ``sum`` over one axis ``k`` of a product whose factors split into a side spanning
``(X, k)`` and a side spanning ``(k, Y)`` is a *contraction*: it lowers to
``tl.dot(lhs, rhs)`` on ``(X, k)`` and ``(k, Y)`` tiles. Two of them make attention:

* ``sum(q[b, h, i, c] * k[b, h // g, j, c], c)``: ``X = i``, ``k = c``, ``Y = j``;
* ``sum(p[i, j] * v[b, h // g, j, e], j)``: ``X = i``, ``k = j``, ``Y = e``.

A boundary tile's guard wraps the product, ``where(k < K, a * b, 0)``; with ``a`` and
``b`` finite that is ``where(k < K, a, 0) * b``, so a select whose condition spans ``k``
and at most one of ``X``, ``Y`` still leaves a contraction: it is kept as the
contraction's ``mask`` and the lowerer applies it to one operand -- or to none when an
operand is a load the guard already masks to zero (mask the loads, not the product).

Everything here reads IR only; the emitter asks, never the other way round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..ir.fold import is_const
from ..ir.nodes import Cast, Expr, IndexVar, Load, Reduce, Where
from ..ir.traverse import factors, product, walk
from .program import TILE_ORDER


@dataclass(frozen=True)
class Contraction:
    lhs: Expr            # spans (x, k)
    rhs: Expr            # spans (k, y)
    k: IndexVar
    x: str               # tile roles
    y: str
    mask: Expr | None = None    # where(mask, lhs * rhs, 0): spans k and at most one of x, y


def canonical(roles) -> tuple[str, ...]:
    return tuple(sorted(roles, key=TILE_ORDER.__getitem__))


def loaded(e: Expr) -> Load | None:
    """The load behind ``e`` when ``e`` is a load or a float cast of one (no rounding)."""
    if isinstance(e, Load):
        return e
    if isinstance(e, Cast) and e.dtype.is_float and isinstance(e.x, Load) \
            and e.x.dtype.is_float:
        return e.x
    return None


def match_contraction(r: Reduce, role_of: Callable[[IndexVar], str | None],
                      roles: Callable[[Expr], frozenset[str]]) -> Contraction | None:
    """``r`` as a :class:`Contraction`, or None when it is not one.

    ``role_of`` gives an index variable's tile role, ``roles`` the tile axes an
    expression spans (state values span axes without any free variable)."""
    if r.op != "sum" or len(r.axes) != 1:
        return None
    k = r.axes[0]
    kr = role_of(k)
    if kr is None:
        return None
    out = roles(r)
    if len(out) != 2:
        return None
    x, y = canonical(out)
    body, mask = r.body, None
    if isinstance(body, Where) and is_const(body.b, 0.0):
        mask, body = body.cond, body.a
        if not roles(mask) <= {kr, x} and not roles(mask) <= {kr, y}:
            return None
    lhs, rhs, rest = [], [], []
    for f in factors(body):
        fr = roles(f)
        if x in fr and y in fr:
            return None
        (lhs if x in fr else rhs if y in fr else rest).append(f)
    if not lhs or not rhs:
        return None
    lhs += rest  # factors over k alone (or scalars) ride with the left operand
    a, b = product(lhs), product(rhs)
    if kr not in roles(a) or kr not in roles(b):
        return None
    return Contraction(a, b, k, x, y, mask)


def gathered_dims(x: Load) -> tuple[int, ...]:
    """The dimensions of load ``x`` indexed by values read from another tensor."""
    return tuple(d for d, i in enumerate(x.indices)
                 if any(isinstance(y, Load) for y in walk(i)))


def gathered_loads(exprs):
    """The loads among ``exprs`` indexed by another load: gathers through a table, as a
    paged cache's ``k[block_table[b, j // page], h, j % page, c]``."""
    for e in exprs:
        for x in walk(e):
            if isinstance(x, Load) and gathered_dims(x):
                yield x


def indirect_load(exprs) -> bool:
    """Whether a load among ``exprs`` is indexed by another load (:func:`gathered_loads`)."""
    return next(gathered_loads(exprs), None) is not None


def gathers(prog) -> bool:
    """Whether a tile loop of tile program ``prog`` loads through a table."""
    return any(indirect_load(e for _, e in seg.body) for seg in prog.segments)
