"""Loop partition: which tiles of the fused loop a block of rows must visit, and which of
them need no mask, by interval analysis of affine mask predicates.

A mask predicate is a conjunction of comparisons. A comparison whose sides are affine in
the row index ``i`` and the loop index ``j`` (integer coefficients, any ``i``/``j``-free
rest: sizes, offsets, head indices) normalises to one :class:`Constraint`
``a*i + b*j + c <= 0``; with ``b = +-1`` it bounds ``j`` above or below by an affine
function of ``i``. Over a block of rows ``[i_first, i_last]`` such a bound has a least and
a greatest value, so

* the tiles the block must visit lie in ``[max(lower bounds at their least), min(upper
  bounds at their greatest)]`` of the *gating* constraints (those whose violation makes the
  whole contribution vanish), and
* a tile lies entirely inside the mask when it is within ``[max(lower bounds at their
  greatest), min(upper bounds at their least)]`` of every constraint and within the axis.

The bounds are integer IR over ``i_first``, ``i_last`` and the sizes: the kernel computes
them once per program, and :func:`evaluate` computes the very same expressions on the host
(tests count visited tiles against it).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.fold import RULES, fold, iconst
from ..ir.nodes import Binary, Const, Expr, IndexVar, Param, Size, Unary
from ..ir.traverse import rewrite, substitute

_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


@dataclass(frozen=True)
class Constraint:
    """``row * i + loop * j + rest <= 0`` (``rest`` is integer IR free of ``i`` and ``j``)."""

    row: int
    loop: int
    rest: Expr

    @property
    def upper(self) -> bool:
        """Bounds ``j`` from above (``j <= -(row * i + rest)``)."""
        return self.loop == 1

    def bound(self, i: Expr) -> Expr:
        """The bound on ``j`` at row ``i``: ``-(row*i + rest)`` (upper) or ``row*i + rest``."""
        lin = _add(_mul(i, self.row), self.rest)
        return _neg(lin) if self.upper else lin


def _add(a: Expr, b: Expr) -> Expr:
    return Binary("add", a, b)


def _mul(a: Expr, k: int) -> Expr:
    return Binary("mul", a, iconst(k))


def _neg(a: Expr) -> Expr:
    return Binary("sub", iconst(0), a)


# ---------------------------------------------------------------- affine decomposition


def affine(e: Expr, row: IndexVar, loop: IndexVar) -> tuple[int, int, Expr] | None:
    """``e`` as ``(a, b, rest)`` with ``e = a*i + b*j + rest``, or None if not affine."""
    if not e.dtype.is_int:
        return None
    if e is row:
        return 1, 0, iconst(0)
    if e is loop:
        return 0, 1, iconst(0)
    if row not in e.free_vars and loop not in e.free_vars:
        return 0, 0, e
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        x, y = affine(e.a, row, loop), affine(e.b, row, loop)
        if x is None or y is None:
            return None
        s = 1 if e.op == "add" else -1
        return x[0] + s * y[0], x[1] + s * y[1], Binary(e.op, x[2], y[2])
    if isinstance(e, Binary) and e.op == "mul":
        for k, other in ((e.a, e.b), (e.b, e.a)):
            if isinstance(k, Const) and isinstance(k.value, int):
                got = affine(other, row, loop)
                if got is None:
                    return None
                return got[0] * k.value, got[1] * k.value, _mul(got[2], k.value)
        return None
    if isinstance(e, Unary) and e.op == "neg":
        got = affine(e.x, row, loop)
        return None if got is None else (-got[0], -got[1], _neg(got[2]))
    return None


def constraint(cond: Expr, row: IndexVar, loop: IndexVar) -> Constraint | None:
    """One comparison as a :class:`Constraint` with ``loop`` coefficient +-1, or None."""
    if not (isinstance(cond, Binary) and cond.op in _FLIP):
        return None
    op, lhs, rhs = cond.op, cond.a, cond.b
    if op in ("gt", "ge"):  # a > b  <=>  b < a
        op, lhs, rhs = _FLIP[op], rhs, lhs
    d = affine(Binary("sub", lhs, rhs), row, loop) if lhs.dtype.is_int and rhs.dtype.is_int \
        else None
    if d is None or d[1] not in (1, -1):
        return None
    a, b, c = d
    if op == "lt":  # d < 0  <=>  d + 1 <= 0 over the integers
        c = Binary("add", c, iconst(1))
    return Constraint(a, b, fold(c))


def conjuncts(cond: Expr) -> list[Expr]:
    """The operands of a tree of ``&``."""
    if isinstance(cond, Binary) and cond.op == "and":
        return conjuncts(cond.a) + conjuncts(cond.b)
    return [cond]


# ----------------------------------------------------------------------- loop bounds


@dataclass(frozen=True)
class Partition:
    """The constraints of a loop: ``gating`` ones bound the visited tiles, ``exact`` ones
    (every analysable ``j`` constraint of every mask) bound the interior tiles."""

    gating: tuple[Constraint, ...]
    exact: tuple[Constraint, ...]

    @property
    def has_lower(self) -> bool:
        """Whether some tiles at the start of the axis may be skipped or masked."""
        return any(not c.upper for c in self.exact)


def _extreme(cons: tuple[Constraint, ...], upper: bool, least: bool,
             i_first: Expr, i_last: Expr) -> list[Expr]:
    """Each constraint's bound at its least (or greatest) value over the row block."""
    out = []
    for c in cons:
        if c.upper != upper:
            continue
        # the bound is -(row*i + rest) (upper) or row*i + rest: monotone in i
        slope = -c.row if upper else c.row
        at_first = (slope >= 0) == least
        out.append(c.bound(i_first if at_first else i_last))
    return out


def _max(xs: list[Expr]) -> Expr:
    out = xs[0]
    for x in xs[1:]:
        out = Binary("maximum", out, x)
    return out


def _min(xs: list[Expr]) -> Expr:
    out = xs[0]
    for x in xs[1:]:
        out = Binary("minimum", out, x)
    return out


def loop_bounds(part: Partition, i_first: Expr, i_last: Expr, extent: Expr, block: Expr
                ) -> dict[str, Expr]:
    """The loop bounds (integer IR): tiles ``[lo, hi)`` are visited, ``[full_lo, full_hi)``
    are interior; ``lo``, ``full_lo`` and ``full_hi`` are multiples of ``block`` (the tile
    size, a positive leaf such as ``Param("BLOCK_N")``)."""
    zero, bn = iconst(0), block
    lows = _extreme(part.gating, False, True, i_first, i_last)
    ups = _extreme(part.gating, True, False, i_first, i_last)
    visit_lo = _max([zero] + lows)
    visit_hi = _min([extent] + [Binary("add", u, iconst(1)) for u in ups])
    lo = Binary("mul", Binary("floordiv", visit_lo, bn), bn)
    f_lo = _max([zero] + _extreme(part.exact, False, False, i_first, i_last))
    f_hi = _min([extent] + [Binary("add", u, iconst(1))
                            for u in _extreme(part.exact, True, True, i_first, i_last)])
    f_lo_t = Binary("mul", Binary("floordiv", Binary("add", f_lo, Binary("sub", bn, iconst(1))),
                                  bn), bn)
    f_hi_t = Binary("mul", Binary("floordiv", Binary("maximum", f_hi, zero), bn), bn)
    # lo <= full_lo <= full_hi and, when nothing is visited, no interior tile either
    full_lo = Binary("maximum", lo, Binary("minimum", f_lo_t, visit_hi))
    if not part.has_lower:  # then lo = f_lo_t = 0 and full_lo = lo exactly
        full_lo = lo
    full_hi = Binary("maximum", f_hi_t, full_lo)
    return {name: tidy(e) for name, e in
            (("lo", lo), ("hi", visit_hi), ("full_lo", full_lo), ("full_hi", full_hi))}


def _linear(e: Expr) -> tuple[dict[Expr, int], int] | None:
    """An integer expression as ``sum(coeff * leaf) + const`` (None if it is not one)."""
    if isinstance(e, Const) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return {}, e.value
    if isinstance(e, Unary) and e.op == "neg":
        got = _linear(e.x)
        return None if got is None else ({k: -v for k, v in got[0].items()}, -got[1])
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        a, b = _linear(e.a), _linear(e.b)
        if a is None or b is None:
            return None
        s = 1 if e.op == "add" else -1
        terms = dict(a[0])
        for k, v in b[0].items():
            terms[k] = terms.get(k, 0) + s * v
        return terms, a[1] + s * b[1]
    if isinstance(e, Binary) and e.op == "mul":
        for k, x in ((e.a, e.b), (e.b, e.a)):
            if isinstance(k, Const) and isinstance(k.value, int):
                got = _linear(x)
                if got is None:
                    return None
                return {t: v * k.value for t, v in got[0].items()}, got[1] * k.value
    if e.dtype.is_int and not isinstance(e, Const):
        return {e: 1}, 0
    return None


def _rebuild(terms: dict[Expr, int], const: int) -> Expr:
    pos = [(k, v) for k, v in terms.items() if v > 0]
    neg = [(k, -v) for k, v in terms.items() if v < 0]

    def term(k: Expr, v: int) -> Expr:
        return k if v == 1 else Binary("mul", k, iconst(v))
    out: Expr | None = None
    for k, v in pos:
        out = term(k, v) if out is None else Binary("add", out, term(k, v))
    for k, v in neg:
        out = Binary("sub", iconst(0) if out is None else out, term(k, v))
    if out is None:
        return iconst(const)
    if const:
        out = Binary("add" if const > 0 else "sub", out, iconst(abs(const)))
    return out


def nonneg(e: Expr) -> bool:
    """Whether the integer ``e`` is provably >= 0 (sizes, rows and tile starts are)."""
    if isinstance(e, Const):
        return e.value >= 0
    if isinstance(e, (Size, Param)):
        return True  # sizes, i_first and i_last (a block exists only for rows < N)
    if isinstance(e, Binary):
        if e.op == "maximum":
            return nonneg(e.a) or nonneg(e.b)
        if e.op in ("minimum", "add", "mul", "floordiv"):
            return nonneg(e.a) and nonneg(e.b)
    return False


def _drop_clamp(e: Expr) -> Expr | None:
    # max(x, 0) = max(0, x) = x for x >= 0
    if isinstance(e, Binary) and e.op == "maximum":
        for c, x in ((e.a, e.b), (e.b, e.a)):
            if isinstance(c, Const) and c.value == 0 and nonneg(x):
                return x
    return None


def tidy(e: Expr) -> Expr:
    """Integer arithmetic in a canonical, readable form: ``i_last + 1``, not
    ``0 - (i_last * -1 + -1) + 0``."""
    def fn(x: Expr) -> Expr | None:
        if isinstance(x, (Binary, Unary)) and x.dtype.is_int and \
                getattr(x, "op", "") in ("add", "sub", "mul", "neg"):
            got = _linear(x)
            if got is not None:
                new = _rebuild({k: v for k, v in got[0].items() if v}, got[1])
                return new if new is not x else None
        return None
    return fold(rewrite(e, fn), RULES + (_drop_clamp,))


class DataDependentBound(ValueError):
    """A loop bound that reads tensor data (``j <= i + d[0]``): not known on the host."""


def evaluate(bounds: dict[str, Expr], env: dict[Expr, int]) -> dict[str, int]:
    """The bounds for one program: ``env`` binds ``i_first``, ``i_last``, sizes, grid vars.
    :class:`DataDependentBound` when a bound reads something else (a tensor's data)."""
    mapping = {k: iconst(v) for k, v in env.items()}
    out = {}
    for name, e in bounds.items():
        got = fold(substitute(e, mapping))
        if not isinstance(got, Const):
            free = sorted({x.name for x in _leaves(got)})
            raise DataDependentBound(f"bound {name} still depends on {', '.join(free)}")
        out[name] = int(got.value)
    return out


def _leaves(e: Expr):
    from ..ir.traverse import walk
    return [x for x in walk(e) if isinstance(x, (Param, Size, IndexVar))]
