"""A small sign analysis: which values are provably positive or non-negative.

Proofs for ``max``/``min`` consumers need ``dh/dt >= 0``; with a normaliser in ``h``
(``t * l / l'``) that holds only if SymPy knows ``l > 0``, and ``sqrt(var)`` is real only
if it knows ``var >= 0``. A sum of exponentials is positive, a sum of squares non-negative.
"""

from __future__ import annotations

from ..ir.nodes import Binary, Cast, Const, Expr, Reduce, Size, Unary, Where

# The lattice, weakest first: a value is "real", or known ">= 0", or known "> 0".
REAL, NONNEGATIVE, POSITIVE = 0, 1, 2
_NAMES = {REAL: "real", NONNEGATIVE: "nonnegative", POSITIVE: "positive"}


def _sign(e: Expr) -> int:
    if isinstance(e, Const):
        if isinstance(e.value, bool):
            return REAL
        return POSITIVE if e.value > 0 else (NONNEGATIVE if e.value == 0 else REAL)
    if isinstance(e, Size):
        return POSITIVE
    if isinstance(e, Unary):
        if e.op in ("exp", "exp2", "sigmoid"):
            return POSITIVE
        if e.op in ("sqrt", "rsqrt"):
            return _sign(e.x)
        if e.op == "abs":
            return max(NONNEGATIVE, _sign(e.x))
        return REAL
    if isinstance(e, Binary):
        if e.op == "pow" and isinstance(e.b, Const):
            v = float(e.b.value)
            even = v.is_integer() and int(v) % 2 == 0
            return max(_sign(e.a), NONNEGATIVE) if even else _sign(e.a)
        if e.op in ("add", "mul", "div", "minimum"):
            return min(_sign(e.a), _sign(e.b))
        if e.op == "maximum":
            return max(_sign(e.a), _sign(e.b))
        return REAL
    if isinstance(e, Where):
        return min(_sign(e.a), _sign(e.b))
    if isinstance(e, Cast):
        return _sign(e.x) if e.dtype.is_float else REAL
    if isinstance(e, Reduce):
        return _sign(e.body)
    return REAL


def sign_of(e: Expr) -> str:
    """``"positive"``, ``"nonnegative"`` or ``"real"``: what is provable about ``e``."""
    return _NAMES[_sign(e)]


def is_positive(e: Expr) -> bool:
    """True only if ``e`` is > 0 wherever it is defined."""
    return _sign(e) == POSITIVE


def is_nonnegative(e: Expr) -> bool:
    """True only if ``e`` is >= 0 wherever it is defined."""
    return _sign(e) >= NONNEGATIVE
