"""Integer index arithmetic: a rule table over non-negative index expressions.

Index expressions are built from index variables (``v`` in ``[0, extent)``), non-negative
integer constants, ``+``, ``*``, ``//`` and ``%``: their values are never negative, and
where the extents are ints their ranges are known. :func:`simplify` applies these
identities bottom-up to a fixed point (``a``, ``b``, ``x`` non-negative, ``c > 0`` a
constant):

* ``x // 1 = x``, ``x % 1 = 0``, ``x * 1 = 1 * x = x``, ``x + 0 = 0 + x = x``;
* ``(a * c + b) // c = a + b // c`` and ``(a * c + b) % c = b % c``;
* ``x // c = 0`` and ``x % c = x`` when ``x < c`` is known from the extents;
* ``(x // c) * c + x % c = x``.

It is what lets a re-indexed program (dynamo/gqa.py: a query head ``h = hk * g + r``)
read its key/value head ``h // g`` as ``hk`` again. Expressions of other types, and
integer ones with a possibly negative part (``j - i``), are left alone.
"""

from __future__ import annotations

from .nodes import Binary, Const, Expr, IndexVar
from .traverse import rewrite

_INDEX_OPS = ("add", "mul", "floordiv", "mod")


def int_const(e: Expr) -> int | None:
    """The value of an integer constant, or None."""
    if isinstance(e, Const) and e.dtype.is_int and not isinstance(e.value, bool):
        return int(e.value)
    return None


def nonnegative(e: Expr) -> bool:
    """Whether ``e`` is an index expression, never negative by construction."""
    if isinstance(e, IndexVar):
        return True
    c = int_const(e)
    if c is not None:
        return c >= 0
    return isinstance(e, Binary) and e.op in _INDEX_OPS and e.dtype.is_int and \
        nonnegative(e.a) and nonnegative(e.b)


def bound(e: Expr) -> int | None:
    """An exclusive upper bound of a non-negative index expression, or None if unknown."""
    if isinstance(e, IndexVar):
        return e.extent if isinstance(e.extent, int) else None
    c = int_const(e)
    if c is not None:
        return c + 1 if c >= 0 else None
    if not isinstance(e, Binary) or e.op not in _INDEX_OPS:
        return None
    if e.op == "mod" and int_const(e.b) is not None and int_const(e.b) > 0:
        got = bound(e.a)
        return int_const(e.b) if got is None else min(got, int_const(e.b))
    a, b = bound(e.a), bound(e.b)
    if a is None or b is None:
        return None
    if e.op == "add":
        return a + b - 1
    if e.op == "mul":
        return (a - 1) * (b - 1) + 1
    if e.op == "floordiv" and int_const(e.b) is not None and int_const(e.b) > 0:
        return (a - 1) // int_const(e.b) + 1
    return None


def _times(e: Expr, c: int) -> Expr | None:
    """``a`` when ``e`` is ``a * c`` or ``c * a``."""
    if isinstance(e, Binary) and e.op == "mul":
        if int_const(e.b) == c:
            return e.a
        if int_const(e.a) == c:
            return e.b
    return None


# Each rule takes an index node (children already rewritten) and returns a replacement
# or None; the comment above each states its identity.

def _neutral(e: Binary, ca, cb) -> Expr | None:
    # x + 0 = 0 + x = x;  x * 1 = 1 * x = x;  x // 1 = x;  x % 1 = 0
    if e.op == "add":
        return e.a if cb == 0 else e.b if ca == 0 else None
    if e.op == "mul":
        return e.a if cb == 1 else e.b if ca == 1 else None
    if cb == 1:
        return e.a if e.op == "floordiv" else Const(0, e.dtype)
    return None


def _regroup(e: Binary, ca, cb) -> Expr | None:
    # (p * c + q) // c = p + q // c;  (p * c + q) % c = q % c  (c > 0)
    if e.op in ("floordiv", "mod") and cb is not None and cb > 0 and \
            isinstance(e.a, Binary) and e.a.op == "add":
        for p, q in ((e.a.a, e.a.b), (e.a.b, e.a.a)):
            inner = _times(p, cb)
            if inner is not None:
                return inner + q // cb if e.op == "floordiv" else q % cb
    return None


def _in_range(e: Binary, ca, cb) -> Expr | None:
    # x // c = 0;  x % c = x  (0 <= x < c by the extents)
    if e.op in ("floordiv", "mod") and cb is not None and cb > 0:
        top = bound(e.a)
        if top is not None and top <= cb:
            return Const(0, e.dtype) if e.op == "floordiv" else e.a
    return None


def _recompose(e: Binary, ca, cb) -> Expr | None:
    # (x // c) * c + x % c = x  (c > 0)
    if e.op != "add":
        return None
    for p, q in ((e.a, e.b), (e.b, e.a)):
        if isinstance(q, Binary) and q.op == "mod" and int_const(q.b) is not None:
            x, c = q.a, int_const(q.b)
            inner = _times(p, c)
            if c > 0 and isinstance(inner, Binary) and inner.op == "floordiv" and \
                    inner.a is x and int_const(inner.b) == c:
                return x
    return None


RULES = (_neutral, _regroup, _in_range, _recompose)


def _rule(e: Expr) -> Expr | None:
    if not (isinstance(e, Binary) and e.op in _INDEX_OPS and nonnegative(e)):
        return None
    ca, cb = int_const(e.a), int_const(e.b)
    for rule in RULES:
        got = rule(e, ca, cb)
        if got is not None:
            return got
    return None


def simplify(e: Expr) -> Expr:
    """``e`` with the module's identities applied until none applies."""
    for _ in range(16):
        new = rewrite(e, _rule)
        if new is e:
            return e
        e = new
    return e
