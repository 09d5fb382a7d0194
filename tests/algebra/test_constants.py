"""Constants in the algebra: the derivation's cost must not depend on their values.

Kept exact, ``exp(c - r + 10**9)`` made SymPy's ``solve`` build a polynomial of degree
``10**9`` (minutes, a fuzzing find through the torch.compile backend) and
``exp(c - r + 1000)`` overflowed the numeric falsifier (a softmax of ``x - 1000`` was left
unfused). Every constant but the small exact ones is a signed symbol now.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import sympy as sp

import neptune_fusion as nf
from neptune_fusion.algebra.sym import Abstraction, small_number
from neptune_fusion.ir.nodes import Const

SHIFTS = (1.0, 1e3, 1e6, 1e9, 1e30, -1e9, 1 / 3, 0.1, 2.0**-40)


def _shifted_softmax(shift: float, n: int = 4, d: int = 16):
    x = nf.placeholder((n, d), name="x")
    k = nf.reduce_axis(d, "k")
    s = nf.compute((n, d), lambda i, j: x[i, j] - shift, name="s")
    m = nf.compute((n,), lambda i: nf.max(s[i, k], k), name="m")
    l = nf.compute((n,), lambda i: nf.sum(nf.exp(s[i, k] - m[i]), k), name="l")  # noqa: E741
    return nf.compute((n, d), lambda i, j: nf.exp(s[i, j] - m[i]) / l[i], name="y")


@pytest.mark.parametrize("shift", SHIFTS)
def test_a_shifted_softmax_fuses_whatever_the_shift(shift, rng):
    y = _shifted_softmax(shift)
    start = time.perf_counter()
    plan = nf.plan(y, budget=30)
    assert time.perf_counter() - start < 10, "the derivation took too long"
    assert plan.single_pass, str(plan)
    # exact in float64 while the shift leaves x - shift some digits (not 1e30's)
    if abs(shift) <= 1e9:
        f = {"x": rng.standard_normal((4, 16))}
        want = nf.evaluate(y, f)
        for mode, kw in (("rolling", {"tile": 5}), ("split", {"splits": 3})):
            np.testing.assert_allclose(nf.evaluate(y, f, mode=mode, **kw), want,
                                       rtol=1e-6 if abs(shift) >= 1e6 else 1e-12)


def test_the_shift_is_a_signed_symbol_and_equal_constants_are_one():
    ab = Abstraction((), frozenset())
    big, neg = Const(1e9, nf.float32), Const(-1e9, nf.float32)
    a, b, c = ab.to_sympy(big), ab.to_sympy(Const(1e9, nf.float32)), ab.to_sympy(neg)
    assert a is b and a.is_Symbol and a.is_positive
    assert c.is_Symbol and c.is_negative and c != a
    assert ab.meaning[a] == big
    # small ones stay exact numbers, and a NaN is not read as zero (sp.Rational's)
    assert small_number(0.5) == sp.Rational(1, 2) and small_number(-16) == -16
    assert small_number(17) is None and small_number(0.1) is None
    assert small_number(math.inf) == sp.oo and small_number(math.nan) is sp.nan


def test_a_huge_exponent_is_a_symbol_too():
    """``(x - mean) ** 1e9``: kept exact, ``expand`` would never finish."""
    N = 16
    x = nf.placeholder((4, N), name="x")
    k = nf.reduce_axis(N, "k")
    m = nf.compute((4,), lambda i: nf.sum(x[i, k], k), name="m")
    out = nf.compute((4,), lambda i: nf.sum((x[i, k] - m[i] / N) ** 1e9, k), name="out")
    start = time.perf_counter()
    plan = nf.plan(out, budget=30)
    assert time.perf_counter() - start < 10
    assert not plan.single_pass and not plan.timed_out
