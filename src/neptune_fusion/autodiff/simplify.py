"""The fold rules of ir/fold.py plus the identities the derivation needs.

A derivative multiplies cotangents into long products; these rules bring them back to
the form a person writes (and a kernel computes cheaply): constants to the right and
multiplied together, negations outward, common factors taken out of a sum.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir.fold import RULES, fold
from ..ir.nodes import Binary, Const, Expr, IndexVar, Reduce, Unary


def _neg_out(e: Expr) -> Expr | None:
    # sum_j(-x) = -sum_j(x);  (-a) * b = a * (-b) = -(a * b)
    if isinstance(e, Reduce) and e.op == "sum" and isinstance(e.body, Unary) \
            and e.body.op == "neg":
        return Unary("neg", Reduce("sum", e.body.x, e.axes))
    if isinstance(e, Binary) and e.op == "mul":
        if isinstance(e.a, Unary) and e.a.op == "neg":
            return Unary("neg", Binary("mul", e.a.x, e.b))
        if isinstance(e.b, Unary) and e.b.op == "neg":
            return Unary("neg", Binary("mul", e.a, e.b.x))
    return None


def _const_right(e: Expr) -> Expr | None:
    # c * x = x * c;  (a * c) * b = (a * b) * c  (c a float constant, x and b not constants)
    if not (isinstance(e, Binary) and e.op == "mul" and e.dtype.is_float):
        return None
    if isinstance(e.a, Const) and not isinstance(e.b, Const) and e.a.dtype == e.b.dtype:
        return Binary("mul", e.b, e.a)
    a = e.a
    if isinstance(a, Binary) and a.op == "mul" and isinstance(a.b, Const) \
            and not isinstance(e.b, Const) and a.a.dtype == e.dtype:
        return Binary("mul", Binary("mul", a.a, e.b), a.b)
    return None


def _factor(e: Expr) -> Expr | None:
    # x + x = x * 2;  a * x + b * x = (a + b) * x;  a * x - b * x = (a - b) * x
    if isinstance(e, Binary) and e.op == "add" and e.a is e.b and e.dtype.is_float:
        return Binary("mul", e.a, Const(2.0, e.dtype))
    if isinstance(e, Binary) and e.op in ("add", "sub") and isinstance(e.a, Binary) \
            and isinstance(e.b, Binary) and e.a.op == "mul" and e.b.op == "mul" \
            and e.a.b is e.b.b:
        return Binary("mul", Binary(e.op, e.a.a, e.b.a), e.a.b)
    return None


def _group_div(e: Expr) -> Expr | None:
    # (x * G + g) // G = x  (g an axis over [0, G), x an axis: both nonnegative integers)
    if isinstance(e, Binary) and e.op == "floordiv" and isinstance(e.b, Const) \
            and isinstance(e.a, Binary) and e.a.op == "add":
        xg, g = e.a.a, e.a.b
        if isinstance(xg, Binary) and xg.op == "mul" and isinstance(xg.a, IndexVar) \
                and isinstance(xg.b, Const) and xg.b.value == e.b.value \
                and isinstance(g, IndexVar) and isinstance(g.extent, int) \
                and g.extent <= e.b.value:
            return xg.a
    return None


EXTRA: tuple[Callable[[Expr], Expr | None], ...] = (_neg_out, _const_right, _factor, _group_div)


def simplify(e: Expr, extra: tuple = ()) -> Expr:
    """``e`` under the fold rules, :data:`EXTRA` and ``extra``, to a fixed point."""
    return fold(e, RULES + EXTRA + tuple(extra))
