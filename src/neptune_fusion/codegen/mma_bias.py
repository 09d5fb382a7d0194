"""A score's column term through the tensor cores (the Gluon dialect, issue 18).

ALiBi's score is ``k * qk + C * float(j - s)``: the scaled contraction ``qk = sum_c
q[i, c] kk[j, c]`` plus a term linear in the loop index ``j``, whose coefficient ``C``
is one value per program (a head's slope) or per row, and ``s`` a per-program integer
(the block's first row, after :mod:`.separate`). Per score that term is one more add
before the row's maximum, and the per-column values it needs: on Hopper 9-12 % of
PF-Causal's time, where FlexAttention's ALiBi costs it 4 %.

Written as ``C * float(j - s) = k * u * (j - j0) + C * float(j0 - s)`` with ``u = C /
k`` and ``j0`` the tile's first index, the first part is a product the tensor cores can
take: ``q`` gets one more 16-wide K block holding ``u`` (split into three bfloat16 parts,
``u = u1 + u2 + u3`` to about float32's precision: bfloat16 has float32's range, so no
``C`` overflows it) against a constant shared-memory block whose first three columns
hold ``j - j0`` (integers below 256: exact in bfloat16). The product then arrives as
``qk + u (j - j0)`` and the element work is PF-Causal's: ``k * qk' + b`` with ``b = C *
float(j0 - s)`` one value per tile (or row). One more 16-wide MMA step a tile: 1/16
more of a tile's two products at head dim 128. Measured (H100, 2026-12-06, as a textual
edit of the printed kernel; ``benchmarks/results/2026-12-06-h100-mma-bias``): PF-ALiBi
9-11 % faster at 4096 and 16384 keys, fp16 and bf16, the float64 error unchanged.

Legality (:func:`find`): every read of the contraction in the program's element work is
inside such a sum (the same ``k``, ``C``, ``s`` everywhere), ``k`` a non-zero constant,
``C`` free of the loop and the state. The value differs from the per-score form only in
rounding: ``u``'s split is exact to about ``2**-24`` relative and the tensor cores add
in float32. A non-finite ``C`` makes every score of its row NaN here, where the
per-score form gives some ``+-inf`` and NaN (both give a NaN row).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.dtypes import float32
from ..ir.nodes import Binary, Cast, Const, Expr, IndexVar, Param, Reduce, Unary
from ..ir.traverse import factors, product, rewrite, walk
from .program import TILE_START
from .separate import separate_expr

# the contraction with the column term's tile part added by the tensor cores (the
# consumer binds it to the wgmma result)
BIASED = Param("qk_biased", float32)


@dataclass(frozen=True)
class ColumnBias:
    """``k * qk + C * float(j op s)`` taken through the MMA (module docstring)."""

    scale: float     # k
    coef: Expr       # C, per program or per row

    def apply(self, e: Expr, qk: Reduce, loop: IndexVar, row: IndexVar) -> Expr:
        """``e`` with each such sum over ``qk`` read as ``k * BIASED + C * float(j0 op
        s)``, the second term then taken out of the per-element work as a per-row term
        is (:func:`.separate.separate_expr`: one add an element fewer)."""
        def fn(node: Expr) -> Expr | None:
            got = _match(node, qk, loop)
            if got is None:
                return None
            scaled, term, cast = got
            d = cast.x
            start = TILE_START if d is loop else Binary(d.op, TILE_START, d.b) \
                if d.a is loop else Binary(d.op, d.a, TILE_START)
            new = BIASED if scaled is qk else \
                scaled.with_children(tuple(BIASED if c is qk else c
                                           for c in scaled.children()))
            first = Cast(start, cast.dtype)   # the term at the tile's first index
            return Binary(node.op, new, rewrite(term, lambda n: first if n is cast else None))
        return separate_expr(rewrite(e, fn), loop, row, frozenset((BIASED,)))


def _scale(x: Expr, qk: Reduce) -> float | None:
    if x is qk:
        return 1.0
    if isinstance(x, Binary) and x.op == "mul":
        for a, b in ((x.a, x.b), (x.b, x.a)):
            if a is qk and isinstance(b, Const):
                return float(b.value)
    return None


def _origin(cast: Expr, loop: IndexVar) -> tuple[Expr | None] | None:
    """``(s,)`` when ``cast`` is ``float(j - s)`` or ``float(j + s)`` (either order),
    ``(None,)`` for ``float(j)``, else None."""
    if not (isinstance(cast, Cast) and cast.dtype.is_float):
        return None
    d = cast.x
    if d is loop:
        return (None,)
    if not (isinstance(d, Binary) and not d.dtype.is_float):
        return None
    if d.op == "sub" and d.a is loop and loop not in d.b.free_vars:
        return (d.b,)
    if d.op == "add" and loop in (d.a, d.b):
        s = d.b if d.a is loop else d.a
        return (s,) if loop not in s.free_vars else None
    return None


def _column(y: Expr, loop: IndexVar) -> tuple[Expr, Cast] | None:
    """``(C, float(j op s))`` when ``y`` is a product of factors one of which is
    ``float(j op s)`` and the others (``C``, their product) do not read the loop."""
    fs = factors(y)
    cols = [f for f in fs if _origin(f, loop) is not None]
    rest = [f for f in fs if f not in cols]
    if len(fs) < 2 or len(cols) != 1 or any(loop in f.free_vars for f in rest):
        return None
    return product(rest), cols[0]


def _match(e: Expr, qk: Reduce, loop: IndexVar) -> tuple[Expr, Expr, Cast] | None:
    """``(k * qk, term, float(j op s))`` when ``e`` is the sum of ``k * qk`` and a
    column term (:func:`_column`), either order, or their difference."""
    if not (isinstance(e, Binary) and e.op in ("add", "sub") and e.dtype.is_float):
        return None
    for x, y in ((e.a, e.b), (e.b, e.a)) if e.op == "add" else ((e.a, e.b),):
        col = _column(y, loop)
        if col is not None and _scale(x, qk) is not None:
            return x, y, col[1]
    return None


def _coef(e: Binary, y: Expr, loop: IndexVar) -> Expr:
    """The coefficient of ``j`` in the matched ``e`` whose column term is ``y``."""
    c = _column(y, loop)[0]
    return Unary("neg", c) if e.op == "sub" else c


def find(roots: list[tuple[Reduce, list[Expr]]], loop: IndexVar, row: IndexVar,
         tile_roles, state: frozenset) -> ColumnBias | None:
    """The column term of every segment's element work (``roots``: per segment its
    contraction and the expressions that read it), or None where it is not one
    ``k * qk + C * float(j op s)`` read everywhere the contraction is (module
    docstring). ``tile_roles`` gives an expression's tile axes; ``state`` the state
    parameters ``C`` may not read."""
    found = set()
    for qk, exprs in roots:
        for e in exprs:
            for node in walk(e):
                got = _match(node, qk, loop)
                if got is not None:
                    x, y, cast = got
                    found.add((_scale(x, qk), _coef(node, y, loop), *_origin(cast, loop)))
    if len(found) != 1:
        return None
    [(k, c, s)] = found
    if not (k and abs(k) != float("inf") and k == k) or tile_roles(c) - {"row"} \
            or s is not None and (tile_roles(s) or s.dtype.is_float) or not c.dtype.is_float \
            or any(n in state or isinstance(n, Reduce) for n in walk(c)):
        return None
    bias = ColumnBias(k, c)
    for qk, exprs in roots:
        if any(qk in set(walk(bias.apply(e, qk, loop, row))) for e in exprs):
            return None   # a read of the contraction outside the sum
    return bias
