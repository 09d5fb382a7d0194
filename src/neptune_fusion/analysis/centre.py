"""Centring: a sum that a later reduction subtracts as a mean is taken around a data value.

``var = sum((x - sum(x) / m) ** 2) / m`` in float32 loses digits when ``x`` sits far
from 0 relative to its spread: the mean is rounded to an ulp of the sum (to an ulp of
itself at best), and the centred sum of squares inherits ``m * delta ** 2`` from that
error ``delta``: ``randn + 1e5`` gave a variance off by 1e-5..1e-4 where float32 data
allow 4e-8. The variance does not change when every ``x`` moves by the same ``K``, so
with ``K = x`` at the axis's first index (a value of the row, close to its mean in units
of its spread) the shifted-data form

    mean = K + sum(x - K) / m        x - mean = (x - K) - sum(x - K) / m

adds numbers of the spread's size in both sums, and the difference ``x - K`` is exact
where ``x`` and ``K`` are close (Sterbenz). This pass rewrites every sum ``S`` over axes
``A`` whose mean ``S / |A|`` is subtracted from ``S``'s own body inside a reduction (a
variance, a layer norm's statistics, a standard deviation):

* each ``e - S / |A|`` with ``e`` the body of ``S`` on other variables of the same extents
  becomes ``(e - K) - S' / |A|``, where ``S' = sum(body - K, A)``;
* every other ``S / |A|`` becomes ``K + S' / |A|`` (the mean itself as an output).

``K`` is the body at index 0 of ``A``: no reduction, one read a row. A ``K`` that is not
finite is read as 0 (the uncentred sum, so an infinity or NaN in the row propagates as it
did); where an extent of ``A`` is symbolic, its reads are masked by ``extent > 0`` (an
empty row reads nothing). Only bodies that compute in float32/float64 from float32/float64
data are centred: a 16-bit body's ``x - K`` would round in its own dtype, and 16-bit data
cannot sit far enough from 0 for the float32 mean's rounding to show (an ulp of 1e3 in
float16 is 0.5), where the pivot's read and subtraction cost 3 % of an fp16 instance norm
on the H200 (2026-12-05). The fused kernels and the fused reference run the centred
bodies; the plain reference (the spec) runs the program as written.
"""

from __future__ import annotations

import itertools
import math

from ..ir.dtypes import int64
from ..ir.nodes import Binary, Cast, Const, Expr, IndexVar, Load, Reduce, Unary, Where
from ..ir.traverse import rewrite, substitute, walk


def _extent_value(c: Expr, axes: tuple[IndexVar, ...]) -> str | None:
    """How ``c`` is the element count of ``axes``: ``"div"`` for ``S / c``, ``"mul"`` for
    ``S * c`` with ``c`` its exact reciprocal; None when it is neither."""
    exts = [a.extent for a in axes]
    if all(isinstance(n, int) for n in exts):
        n = math.prod(exts)
        if isinstance(c, Const) and not isinstance(c.value, bool) and n > 0:
            if c.value == n:
                return "div"
            if c.value * n == 1.0:
                return "mul"
        return None
    if len(exts) == 1:
        inner = c.x if isinstance(c, Cast) else c
        if inner is exts[0]:
            return "div"
    return None


def _mean_of(q: Expr) -> tuple[Reduce, Expr, str] | None:
    """``(S, c, op)`` when ``q`` is a mean ``S / c`` (or ``S * (1/c)``, ``(1/c) * S``)."""
    if not isinstance(q, Binary) or q.op not in ("div", "mul"):
        return None
    for s, c in ((q.a, q.b),) + (((q.b, q.a),) if q.op == "mul" else ()):
        if isinstance(s, Reduce) and s.op == "sum" and _extent_value(c, s.axes) == q.op:
            return s, c, q.op
    return None


def _centrable(s: Reduce) -> bool:
    wide = ("float32", "float64")
    if s.body.dtype.name not in wide or _centred(s):
        return False
    nodes = list(walk(s.body))
    return not any(isinstance(n, Reduce) or isinstance(n, Load) and n.dtype.is_float
                   and n.dtype.name not in wide for n in nodes)


def _centred(s: Reduce) -> bool:
    """Whether ``s`` is centred already (``sum(e - K)``, ``K`` the pivot of ``e``): a
    staged program plans the centred bodies of its parts again."""
    b = s.body
    return isinstance(b, Binary) and b.op == "sub" and \
        _pivot(Reduce("sum", b.a, s.axes)) is b.b


def _same_body(s: Reduce, e: Expr) -> bool:
    """Whether ``e`` is ``s``'s body with its axes renamed to free variables of ``e``."""
    vs = [v for v in e.free_vars if isinstance(v, IndexVar)]
    cands = [[v for v in vs if v.extent is a.extent or (
        isinstance(a.extent, int) and isinstance(v.extent, int) and v.extent == a.extent)]
        for a in s.axes]
    for pick in itertools.product(*cands):
        if len(set(map(id, pick))) == len(pick) and \
                substitute(s.body, dict(zip(s.axes, pick))) is e:
            return True
    return False


def _pivot(s: Reduce) -> Expr | None:
    """``K``: the body at index 0 of every axis, masked where an extent may be 0, read as 0
    where it is not finite; None when a read of it cannot be masked."""
    at0 = substitute(s.body, {a: Const(0, int64) for a in s.axes})
    sym = [a.extent for a in s.axes if not isinstance(a.extent, int)]
    if sym:
        cond: Expr | None = None
        for n in sym:
            c = Binary("gt", n, Const(0, int64))
            cond = c if cond is None else Binary("and", cond, c)
        loads = [n for n in walk(at0) if isinstance(n, Load)]
        if any(not ld.dtype.is_float for ld in loads):
            return None
        at0 = substitute(at0, {ld: Where(cond, ld, Const(0.0, ld.dtype)) for ld in loads})
    zero, inf = Const(0.0, at0.dtype), Const(math.inf, at0.dtype)
    return Where(Binary("lt", Unary("abs", at0), inf), at0, zero)


def centre(bodies: list[Expr]) -> tuple[list[Expr], dict[Reduce, Reduce]]:
    """The bodies with every centred sum taken around its pivot (module docstring), and
    the map from each reduction this rewrote to its new form (names follow it)."""
    found: dict[Reduce, Reduce] = {}
    for b in bodies:
        for r in walk(b):
            if not isinstance(r, Reduce):
                continue
            for n in walk(r.body):
                if isinstance(n, Binary) and n.op == "sub":
                    got = _mean_of(n.b)
                    if got and got[0] not in found and _centrable(got[0]) \
                            and _same_body(got[0], n.a):
                        k = _pivot(got[0])
                        if k is not None:
                            s = got[0]
                            found[s] = Reduce("sum", Binary("sub", s.body, k), s.axes)
    if not found:
        return bodies, {}
    pivots = {s: c.body.b for s, c in found.items()}
    means: dict[Expr, tuple[Reduce, Expr]] = {}   # rewritten mean -> (S, S' / c)

    def fn(e: Expr) -> Expr | None:
        got = _mean_of(e)
        if got is not None and got[0] in found:
            s, c, op = got
            scaled = Binary(op, found[s], c) if e.a is s else Binary(op, c, found[s])
            new = Binary("add", pivots[s], scaled)
            means[new] = (s, scaled)
            return new
        if isinstance(e, Binary) and e.op == "sub" and e.b in means:
            s, scaled = means[e.b]
            if _same_body(s, e.a):
                return Binary("sub", Binary("sub", e.a, pivots[s]), scaled)
        return None

    out = [rewrite(b, fn) for b in bodies]
    renamed = dict(found)   # every reduction rewritten, old -> new (names follow them)
    for b in bodies:
        for r in walk(b):
            if isinstance(r, Reduce) and r not in renamed:
                new = rewrite(r, fn)
                if new is not r:
                    renamed[r] = new
    return out, renamed
