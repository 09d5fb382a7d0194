"""Normalisation of reductions: a rule table, applied bottom-up to a fixed point.

Each rule moves a factor or term that does not depend on the reduction axes out of the
reduction. That shrinks what a fused loop must carry: attention written as
``sum(e[i, j] * v[j, d] / l[i], j)`` becomes ``sum(e[i, j] * v[j, d], j) / l[i]`` (the
division moves to the epilogue), and RMSNorm-then-matmul loses its dependency entirely.
No rule splits ``exp(a - b)`` or expands a product: those would trade a centred, stable
form for an unstable one.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir.nodes import Binary, Cast, Expr, Reduce, Unary
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


def normalize(root: Expr, rules: tuple[Rule, ...] = RULES) -> Expr:
    """Apply ``rules`` to every reduction until none fires."""
    def fn(e: Expr) -> Expr | None:
        if not isinstance(e, Reduce):
            return None
        ax = frozenset(e.axes)
        for rule in rules:
            got = rule(e, ax)
            if got is not None:
                return normalize(got, rules)
        return None
    return rewrite(root, fn)
