"""A small sign analysis: which values are provably positive.

Proofs for ``max``/``min`` consumers need ``dh/dt >= 0``; with a normaliser in ``h``
(``t * l / l'``) that holds only if SymPy knows ``l > 0``. A sum of exponentials is.
"""

from __future__ import annotations

from ..ir.nodes import Binary, Cast, Const, Expr, Reduce, Size, Unary, Where

_POSITIVE_UNARY = {"exp", "exp2", "sigmoid"}
_PRESERVING_UNARY = {"sqrt", "rsqrt"}


def sign_of(e: Expr) -> str:
    """``"positive"``, ``"nonnegative"`` or ``"real"``: what is provable about ``e``."""
    if is_positive(e):
        return "positive"
    return "nonnegative" if is_nonnegative(e) else "real"


def is_nonnegative(e: Expr) -> bool:
    """True only if ``e`` is >= 0 wherever it is defined."""
    if is_positive(e):
        return True
    if isinstance(e, Const):
        return not isinstance(e.value, bool) and e.value >= 0
    if isinstance(e, Unary):
        return e.op == "abs" or (e.op in _PRESERVING_UNARY and is_nonnegative(e.x))
    if isinstance(e, Binary):
        if e.op == "pow" and isinstance(e.b, Const):
            v = e.b.value
            return (float(v).is_integer() and int(v) % 2 == 0) or is_nonnegative(e.a)
        if e.op in ("add", "mul", "div", "minimum"):
            return is_nonnegative(e.a) and is_nonnegative(e.b)
        if e.op == "maximum":
            return is_nonnegative(e.a) or is_nonnegative(e.b)
        return False
    if isinstance(e, Where):
        return is_nonnegative(e.a) and is_nonnegative(e.b)
    if isinstance(e, Cast):
        return e.dtype.is_float and is_nonnegative(e.x)
    if isinstance(e, Reduce):
        return is_nonnegative(e.body)
    return False


def is_positive(e: Expr) -> bool:
    """True only if ``e`` is > 0 wherever it is defined."""
    if isinstance(e, Const):
        return not isinstance(e.value, bool) and e.value > 0
    if isinstance(e, Size):
        return True
    if isinstance(e, Unary):
        if e.op in _POSITIVE_UNARY:
            return True
        return e.op in _PRESERVING_UNARY and is_positive(e.x)
    if isinstance(e, Binary):
        if e.op in ("add", "mul", "div", "minimum"):
            return is_positive(e.a) and is_positive(e.b)
        if e.op == "maximum":
            return is_positive(e.a) or is_positive(e.b)
        return False
    if isinstance(e, Where):
        return is_positive(e.a) and is_positive(e.b)
    if isinstance(e, Cast):
        return e.dtype.is_float and is_positive(e.x)
    if isinstance(e, Reduce):
        return e.op in ("sum", "prod", "max", "min") and is_positive(e.body)
    return False
