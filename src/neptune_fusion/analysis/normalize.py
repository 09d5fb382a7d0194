"""Normalisation of reductions: a rule table, applied bottom-up to a fixed point.

Each rule moves a factor or term that does not depend on the reduction axes out of the
reduction. That shrinks what a fused loop must carry: attention written as
``sum(e[i, j] * v[j, d] / l[i], j)`` becomes ``sum(e[i, j] * v[j, d], j) / l[i]`` (the
division moves to the epilogue), and RMSNorm-then-matmul loses its dependency entirely.
No rule splits ``exp(a - b)`` or expands a product: those would trade a centred, stable
form for an unstable one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..ir.nodes import Binary, Cast, Const, Expr, Reduce, Unary
from ..ir.traverse import factors, product, rewrite

Rule = Callable[[Reduce, frozenset], Expr | None]


def _free_of(e: Expr, axes: frozenset) -> bool:
    return not (e.free_vars & axes)


def _sub_reduce(r: Reduce, body: Expr) -> Reduce:
    return Reduce(r.op, body, r.axes)


def _sum_scale(r: Reduce, ax: frozenset) -> Expr | None:
    # sum(a * b_j * c) = (a * c) * sum(b_j), for every factor free of the axes
    if r.op != "sum" or not (isinstance(r.body, Binary) and r.body.op == "mul"):
        return None
    fs = factors(r.body)
    free = [f for f in fs if _free_of(f, ax)]
    if not free:
        return None
    rest = [f for f in fs if not _free_of(f, ax)]
    return Binary("mul", product(free), _sub_reduce(r, product(rest)))


def _sum_divide(r: Reduce, ax: frozenset) -> Expr | None:
    # sum(b_j / a) = sum(b_j) / a
    b = r.body
    if r.op == "sum" and isinstance(b, Binary) and b.op == "div" and _free_of(b.b, ax):
        return Binary("div", _sub_reduce(r, b.a), b.b)
    return None


def _sum_factor_divide(r: Reduce, ax: frozenset) -> Expr | None:
    # sum(p * (b_j / a) * q) = sum(p * b_j * q) / a  (RMSNorm's rsqrt, L2-norm's 1/sqrt)
    if r.op != "sum" or not (isinstance(r.body, Binary) and r.body.op == "mul"):
        return None
    fs = factors(r.body)
    for n, f in enumerate(fs):
        if isinstance(f, Binary) and f.op == "div" and _free_of(f.b, ax):
            body = product(fs[:n] + [f.a] + fs[n + 1:])
            return Binary("div", _sub_reduce(r, body), f.b)
    return None


def _sum_negate(r: Reduce, ax: frozenset) -> Expr | None:
    # sum(-b_j) = -sum(b_j)
    b = r.body
    if r.op == "sum" and isinstance(b, Unary) and b.op == "neg":
        return Unary("neg", _sub_reduce(r, b.x))
    return None


def _extreme_shift(r: Reduce, ax: frozenset) -> Expr | None:
    # max(a + b_j) = a + max(b_j);  max(b_j + a) = max(b_j) + a;  max(b_j - a) = max(b_j) - a
    b = r.body
    if r.op in ("max", "min") and isinstance(b, Binary) and b.op in ("add", "sub"):
        if b.op == "add" and _free_of(b.a, ax):
            return Binary("add", b.a, _sub_reduce(r, b.b))
        if _free_of(b.b, ax):
            return Binary(b.op, _sub_reduce(r, b.a), b.b)
    return None


def _extreme_cast(r: Reduce, ax: frozenset) -> Expr | None:
    # max(cast(b_j)) = cast(max(b_j)) for a cast between float dtypes: rounding is
    # monotone, so the largest term rounds to the largest rounded term. SDPA in bf16
    # guards an empty row with max(s) == -inf beside softmax's max(cast(s, float32)):
    # one maximum, not two (the second one also kept the kernel off the Gluon path)
    b = r.body
    if r.op in ("max", "min") and isinstance(b, Cast) and b.dtype.is_float \
            and b.x.dtype.is_float:
        return Cast(_sub_reduce(r, b.x), b.dtype_)
    return None


RULES: tuple[Rule, ...] = (_sum_scale, _sum_divide, _sum_factor_divide, _sum_negate,
                          _extreme_shift, _extreme_cast)


def _shift(e: Expr) -> tuple[Expr, Const, str] | None:
    """``(a, c, side)`` when ``e`` is ``a + c``, ``c + a`` or ``a - c`` (``side`` "add",
    "radd" or "sub") for a finite float constant ``c``."""
    if not (isinstance(e, Binary) and e.op in ("add", "sub")):
        return None
    for c, a, side in ((e.b, e.a, e.op), (e.a, e.b, "radd")):
        if isinstance(c, Const) and c.dtype.is_float and math.isfinite(c.value) \
                and not (side == "radd" and e.op == "sub"):
            return a, c, side
    return None


def _shifts_cancel(e: Expr) -> Expr | None:
    # (a + c) - (b + c) = a - b;  (c + a) - (c + b) = a - b;  (a - c) - (b - c) = a - b
    # (c a finite float constant). _extreme_shift moves a constant shift out of a
    # maximum, max(x + c) = max(x) + c, so log_softmax(x + c) reads (x + c) - (max(x) + c)
    # beside the exponential's: left as written, float32 rounded x + 1e12 to 1e12 outside
    # the exponential while exp2's rule cancelled the shift inside it, an output that was
    # neither float64's nor eager float32's (a fuzzing find, 2026-12-04)
    if not (isinstance(e, Binary) and e.op == "sub"):
        return None
    left, right = _shift(e.a), _shift(e.b)
    if left is None or right is None or left[1] is not right[1] or left[2] != right[2]:
        return None
    got = Binary("sub", left[0], right[0])
    return got if got.dtype == e.dtype else None


def normalize(root: Expr, rules: tuple[Rule, ...] = RULES) -> Expr:
    """Apply ``rules`` to every reduction until none fires, then cancel the constant
    shifts they moved out of maxima (:func:`_shifts_cancel`)."""
    def fn(e: Expr) -> Expr | None:
        if not isinstance(e, Reduce):
            return None
        ax = frozenset(e.axes)
        for rule in rules:
            got = rule(e, ax)
            if got is not None:
                return normalize(got, rules)
        return None
    return rewrite(rewrite(root, fn), _shifts_cancel)
