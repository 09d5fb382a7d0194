"""Symbolic identity checks, each guarded by a fast numeric falsifier.

A claim is first tried at random points (cheap, and it finds counterexamples); only if it
survives does SymPy try to prove it. A claim SymPy cannot prove is *not* accepted.
"""

from __future__ import annotations

import random

import numpy as np
import sympy as sp

# SymPy's simplify has no time limit; beyond this size a claim is not attempted.
MAX_PROOF_OPS = 60


def sample_point(syms, rng: random.Random, scale: float = 1.0) -> dict:
    """Random values: positive symbols in [0.5, 3], negative ones in [-3, -0.5], the rest
    in [-2, 2], times ``scale``."""
    pt = {}
    for s in syms:
        if s.is_positive or s.is_nonnegative:
            pt[s] = rng.uniform(0.5, 3.0) * scale
        elif s.is_negative or s.is_nonpositive:
            pt[s] = -rng.uniform(0.5, 3.0) * scale
        else:
            pt[s] = rng.uniform(-2.0, 2.0) * scale
    return pt


def compile_numeric(syms, expr: sp.Expr):
    """A NumPy function of ``syms`` computing ``expr``, or ``None`` if it has none."""
    try:
        return sp.lambdify(syms, expr, modules="numpy")
    except (KeyError, TypeError, NameError, SyntaxError):  # e.g. zoo, DiracDelta
        return None


def _numeric(f, syms, pt: dict) -> float:
    with np.errstate(all="ignore"):
        try:
            v = complex(f(*[pt[s] for s in syms]))
        except (ZeroDivisionError, OverflowError, ValueError, TypeError, NameError):
            return float("nan")  # NameError: a function NumPy lacks (DiracDelta)
    return v.real if abs(v.imag) <= 1e-12 * (1 + abs(v.real)) else float("nan")


_SCALES = (1.0, 0.3, 0.1, 2.0)


def probe(expr: sp.Expr, trials: int = 12, seed: int = 0) -> tuple[dict | None, int]:
    """``(point where expr is clearly nonzero or None, number of finite evaluations)``."""
    rng = random.Random(seed)
    syms = sorted(expr.free_symbols, key=lambda s: s.name)
    if not syms:
        try:
            v = complex(expr.evalf())
        except TypeError:
            return None, 0
        return (None if abs(v) <= 1e-8 else {}), trials
    f = compile_numeric(syms, expr)
    if f is None:
        return None, 0
    finite = 0
    for k in range(trials):
        pt = sample_point(syms, rng, _SCALES[k % len(_SCALES)])
        v = _numeric(f, syms, pt)
        if np.isfinite(v):
            finite += 1
            if abs(v) > 1e-8:
                return pt, finite
    return None, finite


def varies(expr: sp.Expr, syms: set, trials: int = 6, seed: int = 0) -> bool:
    """Whether ``expr`` visibly changes when only ``syms`` change (at random points).

    True is a fact (two finite values that differ), so no simplification can make
    ``expr`` free of ``syms``; False proves nothing.
    """
    order = sorted(expr.free_symbols, key=lambda s: s.name)
    moving = [s for s in order if s in syms]
    if not moving:
        return False
    f = compile_numeric(order, expr)
    if f is None:
        return False
    rng = random.Random(seed)
    for k in range(trials):
        pt = sample_point(order, rng, _SCALES[k % len(_SCALES)])
        a = _numeric(f, order, pt)
        b = _numeric(f, order, {**pt, **sample_point(moving, rng, _SCALES[k % len(_SCALES)])})
        if np.isfinite(a) and np.isfinite(b) and abs(a - b) > 1e-6 * (1 + abs(a) + abs(b)):
            return True
    return False


def counterexample(expr: sp.Expr, trials: int = 12, seed: int = 0) -> dict | None:
    """A point where ``expr`` is clearly nonzero, or ``None`` if none was found."""
    return probe(expr, trials, seed)[0]


def simplest(expr: sp.Expr) -> sp.Expr:
    """A cheap canonical simplification, then full ``simplify`` only if small enough."""
    e = sp.powsimp(sp.expand(expr))
    if e == 0 or e.count_ops() < 8 or e.count_ops() > MAX_PROOF_OPS:
        return e
    return sp.simplify(e)


def is_zero(expr: sp.Expr) -> bool:
    """Proved identically zero (numeric falsifier first, then SymPy)."""
    bad, finite = probe(expr)
    if bad is not None or finite < 3:
        return False  # a counterexample, or too few points where it is even defined
    e = sp.powsimp(sp.expand(expr))
    if e == 0:
        return True
    if e.count_ops() > MAX_PROOF_OPS:
        return False  # too large to prove in reasonable time: not accepted
    return sp.simplify(e) == 0


def fmt_point(pt: dict) -> str:
    return ", ".join(f"{s}={v:.3g}" for s, v in sorted(pt.items(), key=lambda kv: kv[0].name))
