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
    """Random values: positive symbols in [0.5, 3], the rest in [-2, 2], times ``scale``."""
    pt = {}
    for s in syms:
        if s.is_positive or s.is_nonnegative:
            pt[s] = rng.uniform(0.5, 3.0) * scale
        else:
            pt[s] = rng.uniform(-2.0, 2.0) * scale
    return pt


def numeric_value(expr: sp.Expr, pt: dict) -> float:
    syms = sorted(expr.free_symbols, key=lambda s: s.name)
    f = sp.lambdify(syms, expr, modules="numpy")
    with np.errstate(all="ignore"):
        try:
            v = complex(f(*[pt[s] for s in syms]))
        except (ZeroDivisionError, OverflowError, ValueError, TypeError):
            return float("nan")
    return v.real if abs(v.imag) <= 1e-12 * (1 + abs(v.real)) else float("nan")


_SCALES = (1.0, 0.3, 0.1, 2.0)


def probe(expr: sp.Expr, trials: int = 12, seed: int = 0) -> tuple[dict | None, int]:
    """``(point where expr is clearly nonzero or None, number of finite evaluations)``."""
    rng = random.Random(seed)
    syms = expr.free_symbols
    finite = 0
    for k in range(trials):
        pt = sample_point(syms, rng, _SCALES[k % len(_SCALES)])
        v = numeric_value(expr, pt)
        if np.isfinite(v):
            finite += 1
            if abs(v) > 1e-8:
                return pt, finite
    return None, finite


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
