"""Constant folding and algebraic identities: a rule table applied to a fixed point.

Used by the code generator (to simplify loop bodies after masks are specialised, and to
decide legality: "a tile where the mask is false contributes the reducer's identity") and
by the loop partition (to evaluate loop bounds on the host).

IEEE semantics for constants (``exp(-inf) = 0``, ``-inf - 3 = -inf``). Identities with a
non-constant operand assume that operand is *finite*, as kernel data is: ``0 * x = 0`` and
``x - inf = -inf`` hold for every finite ``x``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType

from .dtypes import DType, bool_, float32, int64
from .nodes import Binary, Cast, Const, Expr, IndexVar, Reduce, Size, Unary, Where
from .reducers import REDUCERS
from .traverse import rewrite

INF = math.inf


def fconst(v: float) -> Const:
    return Const(float(v), float32)


def iconst(v: int) -> Const:
    return Const(int(v), int64)


def bconst(v: bool) -> Const:
    return Const(bool(v), bool_)


def is_const(e: Expr, value=None) -> bool:
    if not isinstance(e, Const):
        return False
    if value is None:
        return True
    if isinstance(value, bool) or isinstance(e.value, bool):
        return isinstance(e.value, bool) and e.value is value
    return e.value == value


def _ieee(fn: Callable[..., float], *args) -> float:
    """``fn(*args)`` with Python's exceptions turned into IEEE results."""
    try:
        return fn(*args)
    except OverflowError:
        return INF
    except (ValueError, ZeroDivisionError):
        return math.nan


def _exp2(x: float) -> float:
    return 0.0 if x == -INF else 2.0 ** x


# The value of every elementwise op of the IR on Python constants (tests/test_op_tables.py
# checks that each op has a row).
UNARY: dict[str, Callable] = {
    "neg": lambda x: -x, "exp": math.exp, "exp2": _exp2, "abs": abs,
    "log": lambda x: math.log(x) if x > 0 else (-INF if x == 0 else math.nan),
    "log2": lambda x: math.log2(x) if x > 0 else (-INF if x == 0 else math.nan),
    "sqrt": math.sqrt, "rsqrt": lambda x: 1.0 / math.sqrt(x), "tanh": math.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0,
    "erf": math.erf,
    "not": lambda x: not x,
}
BINARY: dict[str, Callable] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b,
    "pow": lambda a, b: a ** b, "maximum": max, "minimum": min,
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
    "and": lambda a, b: a and b, "or": lambda a, b: a or b,
}


def _make(value, dtype: DType) -> Const:
    if dtype.is_bool:
        return bconst(value)
    if dtype.is_int and not (isinstance(value, float) and not value.is_integer()):
        return iconst(value)
    return fconst(value)


# ------------------------------------------------------------------ the rule table
# Each rule takes a node whose children are already folded and returns a replacement
# or None. The comment above each states the identity it applies.

def _fold_unary(e: Expr) -> Expr | None:
    # op(c) = the constant op(c)
    if isinstance(e, Unary) and isinstance(e.x, Const):
        return _make(_ieee(UNARY[e.op], e.x.value), e.dtype)
    return None


def _fold_binary(e: Expr) -> Expr | None:
    # c1 op c2 = the constant (c1 op c2)
    if isinstance(e, Binary) and isinstance(e.a, Const) and isinstance(e.b, Const):
        if e.op in ("floordiv", "mod") and e.b.value == 0:
            return None
        if e.op == "div" and e.b.value == 0:
            if not e.dtype.is_float:
                return None
            # IEEE: +-inf by the signs (of a signed zero too), NaN for 0 / 0 and NaN / 0
            # (left unfolded, Python's ZeroDivisionError raised in the kernel's source:
            # ``inf / 0.0`` of a settled state's guard, a fuzzing find)
            a = float(e.a.value)
            if a == 0 or math.isnan(a):
                return fconst(math.nan)
            return fconst(math.copysign(INF, a) * math.copysign(1.0, float(e.b.value)))
        return _make(_ieee(BINARY[e.op], e.a.value, e.b.value), e.dtype)
    return None


def _fold_cast(e: Expr) -> Expr | None:
    # cast(c) = the converted constant; cast to a float keeps the value (no rounding)
    if isinstance(e, Cast) and isinstance(e.x, Const):
        v = e.x.value
        if e.dtype.is_int:
            return iconst(int(v)) if math.isfinite(float(v)) else None
        return _make(v if not e.dtype.is_float else float(v), e.dtype)
    return None


def _fold_where(e: Expr) -> Expr | None:
    # where(True, a, b) = a;  where(False, a, b) = b;  where(c, a, a) = a;
    # where(~c, a, b) = where(c, b, a)  (a mask reads as the condition that keeps)
    if isinstance(e, Where):
        if isinstance(e.cond, Const):
            return e.a if e.cond.value else e.b
        if e.a is e.b:
            return e.a
        if isinstance(e.cond, Unary) and e.cond.op == "not":
            return Where(e.cond.x, e.b, e.a)
    return None


def _logic(e: Expr) -> Expr | None:
    # x & True = x;  x & False = False;  x | False = x;  x | True = True
    if isinstance(e, Binary) and e.op in ("and", "or"):
        for c, x in ((e.a, e.b), (e.b, e.a)):
            if isinstance(c, Const):
                if e.op == "and":
                    return x if c.value else bconst(False)
                return bconst(True) if c.value else x
    return None


def _neutral(e: Expr) -> Expr | None:
    # x + 0 = 0 + x = x - 0 = x;  x * 1 = 1 * x = x / 1 = x  (same dtype)
    if not isinstance(e, Binary):
        return None
    a, b = e.a, e.b
    if e.op in ("add", "sub") and is_const(b, 0) and a.dtype == e.dtype:
        return a
    if e.op == "add" and is_const(a, 0) and b.dtype == e.dtype:
        return b
    if e.op in ("mul", "div") and is_const(b, 1) and a.dtype == e.dtype:
        return a
    if e.op == "mul" and is_const(a, 1) and b.dtype == e.dtype:
        return b
    return None


def _absorb(e: Expr) -> Expr | None:
    # 0 * x = x * 0 = 0;  x +- inf = +-inf;  -inf - x = -inf;  max(x, -inf) = x  (x finite)
    # integers: 0 * x = x * 0 = 0;  0 // x = 0  (x a nonzero divisor)
    if isinstance(e, Binary) and e.dtype.is_int:
        if (e.op == "mul" and (is_const(e.a, 0) or is_const(e.b, 0))) or \
                (e.op == "floordiv" and is_const(e.a, 0)):
            return iconst(0)
        return None
    if not isinstance(e, Binary) or not e.dtype.is_float:
        return None
    a, b = e.a, e.b
    if e.op == "mul" and (is_const(a, 0) or is_const(b, 0)):
        return fconst(0.0)
    if e.op in ("add", "sub"):
        for c, sign in ((b, -1.0 if e.op == "sub" else 1.0), (a, 1.0)):
            if isinstance(c, Const) and math.isinf(c.value):
                return fconst(c.value * sign)
    if e.op == "maximum":
        for c, x in ((a, b), (b, a)):
            if is_const(c, -INF):
                return x
    if e.op == "minimum":
        for c, x in ((a, b), (b, a)):
            if is_const(c, INF):
                return x
    return None


def _signs(e: Expr) -> Expr | None:
    # -1 * x = x * -1 = -x;  a + -b = a - b;  -a + b = b - a;  a - -b = a + b;  --x = x
    if isinstance(e, Unary) and e.op == "neg" and isinstance(e.x, Unary) and e.x.op == "neg":
        return e.x.x
    if not isinstance(e, Binary):
        return None
    a, b = e.a, e.b
    if e.op == "mul":
        for c, x in ((a, b), (b, a)):
            if is_const(c, -1) and x.dtype == e.dtype:
                return Unary("neg", x)
    neg = lambda x: isinstance(x, Unary) and x.op == "neg"  # noqa: E731
    if e.op == "add" and neg(b):
        return Binary("sub", a, b.x)
    if e.op == "add" and neg(a):
        return Binary("sub", b, a.x)
    if e.op == "sub" and neg(b):
        return Binary("add", a, b.x)
    return None


def _constants(e: Expr) -> Expr | None:
    # x / c = x * (1/c);  (x * c1) * c2 = x * (c1*c2)  (floats, finite nonzero constants:
    # a multiply is cheaper than a divide and folds into the scale already there)
    if not (isinstance(e, Binary) and e.dtype.is_float and isinstance(e.b, Const)):
        return None
    c = e.b.value
    if e.op == "div" and c != 0 and math.isfinite(c) and e.a.dtype.is_float:
        return Binary("mul", e.a, fconst(1.0 / c))
    a = e.a
    if e.op == "mul" and isinstance(a, Binary) and a.op == "mul" and isinstance(a.b, Const) \
            and a.b.dtype.is_float and math.isfinite(c) and math.isfinite(a.b.value):
        return Binary("mul", a.a, fconst(a.b.value * c))
    return None


def _range(e: Expr) -> tuple[int, int] | None:
    """``(lowest, highest)`` of an integer index expression, or None where unknown: index
    variables of a static extent, integer constants, and sums, products, ``//`` and ``%``
    of those (``//`` and ``%`` by positive constants of nonnegative values only, where
    floored and truncated division agree)."""
    if isinstance(e, Const):
        v = e.value
        return (v, v) if isinstance(v, int) and not isinstance(v, bool) else None
    if isinstance(e, IndexVar):
        return (0, e.extent - 1) if isinstance(e.extent, int) and e.extent > 0 else None
    if not (isinstance(e, Binary) and e.dtype.is_int):
        return None
    a, b = _range(e.a), _range(e.b)
    if a is None or b is None:
        return None
    if e.op == "add":
        return a[0] + b[0], a[1] + b[1]
    if e.op == "mul" and a[0] >= 0 and b[0] >= 0:
        return a[0] * b[0], a[1] * b[1]
    if e.op in ("floordiv", "mod") and a[0] >= 0 and b[0] == b[1] and b[0] > 0:
        c = b[0]
        return (a[0] // c, a[1] // c) if e.op == "floordiv" else (0, min(c - 1, a[1]))
    return None


_NO_LEAVES: Mapping = MappingProxyType({})


def nonneg(e: Expr, leaves: Mapping = _NO_LEAVES) -> bool:
    """Whether an integer index expression is never negative (:func:`lower_bound`)."""
    low = lower_bound(e, leaves)
    return low is not None and low >= 0


def lower_bound(e: Expr, leaves: Mapping = _NO_LEAVES) -> int | None:
    """A lower bound of an integer index expression, or None where unknown: index
    variables and sizes are at least 0, ``leaves`` maps other leaves (a kernel's tile
    starts, at least 0, and block sizes, at least 1) to theirs; sums, differences by a
    constant, products of nonnegative values, minima, maxima, and ``//`` and ``%`` of a
    nonnegative value by a positive one (at least 0) combine them."""
    if isinstance(e, (IndexVar, Size)):
        return 0
    if isinstance(e, Const):
        v = e.value
        return v if isinstance(v, int) and not isinstance(v, bool) else None
    if e in leaves:
        return leaves[e]
    if not (isinstance(e, Binary) and e.dtype.is_int):
        return None
    a, b = lower_bound(e.a, leaves), lower_bound(e.b, leaves)
    if e.op == "maximum":
        return max((x for x in (a, b) if x is not None), default=None)
    if a is None or (b is None and e.op != "sub"):
        return None
    if e.op == "add":
        return a + b
    if e.op == "sub":   # by a constant only: an upper bound of anything else is unknown
        c = e.b.value if isinstance(e.b, Const) else None
        return a - c if isinstance(c, int) and not isinstance(c, bool) else None
    if e.op == "minimum":
        return min(a, b)
    if e.op == "mul" and a >= 0 and b >= 0:
        return a * b
    if e.op in ("floordiv", "mod") and a >= 0 and b >= 1:
        return 0
    return None


def _multiple(e: Expr, c: int) -> Expr | None:
    """``e / c`` when ``e`` is ``x * m`` (or ``m * x``) with ``c`` dividing ``m``."""
    if isinstance(e, Binary) and e.op == "mul":
        for k, x in ((e.b, e.a), (e.a, e.b)):
            if isinstance(k, Const) and isinstance(k.value, int) and k.value % c == 0:
                return x if k.value == c else Binary("mul", x, Const(k.value // c, k.dtype))
    return None


def _index_arith(e: Expr) -> Expr | None:
    # nonnegative integer indices, divisor c > 0 (ranges from _range):
    # y % c = y  (0 <= y < c);  (x*m + y) // c = x*(m/c) + y // c and
    # (x*m + y) % c = y % c  (c divides m; x*m, y >= 0);  (x // c) * c + x % c = x
    if not (isinstance(e, Binary) and e.dtype.is_int):
        return None
    if e.op in ("floordiv", "mod") and isinstance(e.b, Const) and \
            isinstance(e.b.value, int) and e.b.value > 0:
        c, a = e.b.value, e.a
        if not nonneg(a):
            return None
        got = _range(a)
        # not y // c = 0: the derivative reads a grouped query's key head as h // group
        # (autodiff's gather-form adjoint), and one key head (h < group) would become 0
        if got is not None and got[1] < c and e.op == "mod":
            return a
        if isinstance(a, Binary) and a.op == "add":
            for x, y in ((a.a, a.b), (a.b, a.a)):
                q = _multiple(x, c)
                if q is not None and nonneg(x) and nonneg(y):
                    if e.op == "mod":
                        return Binary("mod", y, e.b)
                    return Binary("add", q, Binary("floordiv", y, e.b))
        return None
    if e.op == "add":
        for x, y in ((e.a, e.b), (e.b, e.a)):
            if not (isinstance(y, Binary) and y.op == "mod" and isinstance(y.b, Const)
                    and isinstance(x, Binary) and x.op == "mul"):
                continue
            for q, k in ((x.a, x.b), (x.b, x.a)):
                if is_const(k, y.b.value) and isinstance(q, Binary) and \
                        q.op == "floordiv" and q.a is y.a and is_const(q.b, y.b.value) \
                        and y.b.value > 0 and nonneg(y.a):
                    return y.a
    return None


def _reduce_identity(e: Expr) -> Expr | None:
    # op(identity, j) = identity
    if isinstance(e, Reduce) and isinstance(e.body, Const):
        r = REDUCERS.get(e.op)
        if r is not None and e.body.value == r.identity:
            return fconst(r.identity)
    return None


RULES: tuple[Callable[[Expr], Expr | None], ...] = (
    _fold_unary, _fold_binary, _fold_cast, _fold_where, _logic, _neutral, _absorb, _signs,
    _constants, _index_arith, _reduce_identity)


def fold(root: Expr, rules: tuple = RULES, limit: int = 64) -> Expr:
    """Apply ``rules`` bottom-up until nothing changes."""
    def fn(e: Expr) -> Expr | None:
        out = e
        for _ in range(limit):
            for rule in rules:
                got = rule(out)
                if got is not None and got is not out:
                    out = got
                    break
            else:
                break
        return out if out is not e else None

    for _ in range(limit):
        new = rewrite(root, fn)
        if new is root:
            return root
        root = new
    return root  # pragma: no cover - the rules shrink the tree; this is a safety net
