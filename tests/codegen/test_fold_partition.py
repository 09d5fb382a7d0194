"""Folding rules, integer tidying, affine constraints and loop bounds vs brute force."""

from __future__ import annotations

import math

import pytest

import neptune_fusion as nf
from neptune_fusion.analysis.masks import (
    Partition,
    conjuncts,
    constraint,
    evaluate,
    loop_bounds,
    tidy,
)
from neptune_fusion.ir.fold import bconst, fconst, fold, iconst
from neptune_fusion.ir.nodes import Binary, IndexVar, Param, Reduce, Unary, Where, fresh_uid

N, M = nf.sizes("N M")
I = IndexVar("i", N, "spatial", fresh_uid())  # noqa: E741
J = IndexVar("j", M, "reduce", fresh_uid())
X = Param("x", nf.float32)


@pytest.mark.parametrize("expr, want", [
    (Unary("exp", fconst(-math.inf)), 0.0),                       # exp(-inf) = 0
    (Binary("sub", X, fconst(math.inf)), -math.inf),              # x - inf = -inf
    (Binary("mul", fconst(0.0), X), 0.0),                         # 0 * x = 0
    (Binary("maximum", X, fconst(-math.inf)), X),                 # max(x, -inf) = x
    (Where(bconst(False), X, fconst(-math.inf)), -math.inf),      # where(False, a, b) = b
    (Reduce("max", fconst(-math.inf), (J,)), -math.inf),          # max over identity
    (Unary("exp2", Binary("sub", Where(bconst(False), X, fconst(-math.inf)), X)), 0.0),
    (Binary("add", X, Unary("neg", X)), Binary("sub", X, X)),     # a + -b = a - b
])
def test_fold_rules(expr, want):
    got = fold(expr)
    if isinstance(want, float):
        assert got is fconst(want)
    else:
        assert got is want


def test_fold_leaves_unknown_alone():
    e = Binary("add", X, Param("y", nf.float32))
    assert fold(e) is e


def test_tidy_writes_integer_arithmetic_plainly():
    i_last = Param("i_last", nf.int64)
    e = Binary("add", Binary("sub", iconst(0), Binary("add", Binary("mul", i_last, iconst(-1)),
                                                          iconst(-5))), iconst(1))
    assert str(tidy(e)) == "i_last + 6"
    assert str(tidy(Binary("maximum", Binary("floordiv", iconst(0), N), iconst(0)))) == "0"


def test_constraints_of_masks():
    c = constraint(J <= I + 3, I, J)
    assert (c.row, c.loop, str(c.rest), c.upper) == (-1, 1, "-3", True)
    c = constraint(I - J < 7, I, J)  # j >= i - 6
    assert (c.row, c.loop, c.upper) == (1, -1, False)
    assert constraint(J * 2 <= I, I, J) is None          # |coefficient of j| != 1
    assert constraint(J % 2 == 0, I, J) is None          # not affine
    assert len(conjuncts((J <= I) & (I - J < 4) & (J >= 0))) == 3


MASKS = {
    "causal": lambda i, j: j <= i,
    "causal+5": lambda i, j: j <= i + 5,
    "strict": lambda i, j: j < i,
    "window": lambda i, j: (j <= i) & (i - j < 20),
    "lower": lambda i, j: j >= i - 9,
    "twice": lambda i, j: j <= 2 * i,
    "bottom-right": lambda i, j: j <= i + (M - N),
}


def _tiles(lo, hi, bn):
    return set(range(lo, max(lo, hi), bn)) if hi > lo else set()


@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("n, m, bm, bn", [(77, 77, 32, 16), (40, 90, 16, 32), (64, 64, 16, 16),
                                          (5, 53, 16, 16)])
def test_loop_bounds_match_brute_force(mask, n, m, bm, bn):
    fn = MASKS[mask]
    cond = fn(I, J)
    cons = tuple(c for c in (constraint(x, I, J) for x in conjuncts(cond)) if c is not None)
    part = Partition(cons, cons)
    first, last, bnp = Param("i_first", nf.int64), Param("i_last", nf.int64), \
        Param("BLOCK_N", nf.int64)
    bounds = loop_bounds(part, first, last, M, bnp)
    for i0 in range(0, n, bm):
        i1 = min(i0 + bm, n) - 1
        b = evaluate(bounds, {first: i0, last: i1, bnp: bn, N: n, M: m})
        live, full = set(), set()
        for t in range(0, m, bn):
            cells = [_eval(mask, i, j, n, m) for i in range(i0, i1 + 1)
                     for j in range(t, min(t + bn, m))]
            if any(cells):
                live.add(t)
            if all(cells) and t + bn <= m:
                full.add(t)
        visited = _tiles(b["lo"], b["hi"], bn)
        interior = _tiles(b["full_lo"], b["full_hi"], bn)
        assert live <= visited, (i0, sorted(live - visited))
        assert visited == live  # exact for conjunctions of affine constraints
        assert interior == full
        assert b["lo"] <= b["full_lo"] <= b["full_hi"]


def _eval(mask, i, j, n, m):
    return {"causal": j <= i, "causal+5": j <= i + 5, "strict": j < i,
            "window": j <= i and i - j < 20, "lower": j >= i - 9, "twice": j <= 2 * i,
            "bottom-right": j <= i + (m - n)}[mask]
