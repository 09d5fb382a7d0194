"""The inversion method (Neptune, PLDI 2026).

A consumer ``X = F_j g(r, c_j)`` read the producer's value ``r``. If ``g`` can be inverted
in ``c`` (``c = g_c^-1(r, t)``), then ``h(t, r, r') = g(r', g_c^-1(r, t))`` maps each term
``g(r, c)`` to ``g(r', c)``. It repairs an accumulated ``t = F_j g(r, c_j)`` only if ``h``
distributes over ``F``, which is proved before the repair is accepted:

* ``F = +``:   ``h(x + y) = h(x) + h(y)``;
* ``F = max`` or ``min``: ``h`` is nondecreasing in ``t`` (``dh/dt >= 0``);
* ``F = *``:   ``h(x * y) = h(x) * h(y)``.

Two inverses are tried before SymPy's ``solve``: the ratio ``g(r', c) / g(r, c)`` and the
difference ``g(r', c) - g(r, c)``; when either is free of ``c`` it *is* ``h`` (``t * q`` or
``t + d``), found without solving anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from .proofs import MAX_PROOF_OPS, fmt_point, is_zero, probe, simplest, varies


@dataclass(frozen=True)
class Inverted:
    h: sp.Expr
    proof: str


def _candidates(g: sp.Expr, g1: sp.Expr, t: sp.Symbol, c_syms: set):
    # a ratio or difference that visibly varies with c is not simplified (simplify of
    # |tanh(..)| / |tanh(..)| alone took seconds): it cannot become free of c
    for kind in ("ratio", "difference"):
        e = g1 / g if kind == "ratio" else g1 - g
        if varies(e, c_syms):
            continue
        e = simplest(e)
        if not (e.free_symbols & c_syms):
            yield t * e if kind == "ratio" else t + e
    for c in sorted(g.free_symbols & c_syms, key=lambda s: s.name):
        # Invertible "in c" means c occurs once, under a chain of invertible functions;
        # solving polynomials of higher degree would be slow and multivalued.
        if g.count(c) != 1:
            continue
        try:
            sols = sp.solve(sp.Eq(t, g), c, dict=False)
        except (NotImplementedError, ValueError, TypeError):
            continue
        for sol in sols[:2]:
            h = g1.subs(c, sol)
            # the solved operand is gone, but another loop operand may remain
            if not (h.free_symbols & c_syms):
                yield h


def _distributes(h: sp.Expr, t: sp.Symbol, op: str, positive: bool) -> tuple[bool, str]:
    # accumulators of positive terms are positive: only that domain needs the identity
    x, y = (sp.Symbol(n, positive=True) if positive else sp.Symbol(n, real=True)
            for n in ("x", "y"))
    if positive:
        h = h.subs(t, sp.Symbol(t.name, positive=True))
        t = sp.Symbol(t.name, positive=True)
    hx, hy = h.subs(t, x), h.subs(t, y)
    if op in ("sum", "prod"):
        combine = (lambda a, b: a + b) if op == "sum" else (lambda a, b: a * b)
        sym = "+" if op == "sum" else "*"
        lhs = h.subs(t, combine(x, y))
        diff = lhs - combine(hx, hy)
        bad, finite = probe(diff)
        if finite < 3:
            return False, "h is undefined at most sample points"
        if bad is not None:
            return False, f"h(x {sym} y) != h(x) {sym} h(y), e.g. at {fmt_point(bad)}"
        if not is_zero(diff):
            return False, f"could not prove h(x {sym} y) = h(x) {sym} h(y)"
        return True, f"h(x {sym} y) = h(x) {sym} h(y)"
    slope = sp.diff(h, t)
    if slope.count_ops() > 4 * MAX_PROOF_OPS:  # simplify has no time limit: not attempted
        return False, f"dh/dt is too large to prove nondecreasing in t, needed for {op}"
    slope = sp.simplify(slope)
    try:
        nonneg = bool(slope.is_nonnegative)
    except TypeError:  # SymPy compared a NaN on the way
        nonneg = False
    if nonneg:
        return True, f"dh/dt = {slope} >= 0, so h commutes with {op}"
    return False, f"could not prove h nondecreasing in t (dh/dt = {slope}), needed for {op}"


def _maps(h: sp.Expr, t: sp.Symbol, term: sp.Expr, sub: dict) -> str | None:
    """Why ``h`` visibly fails to map ``term`` to its repaired value, or None."""
    bad, finite = probe(h.subs(t, term) - term.subs(sub))
    if bad is not None:
        return f"h = {h} does not map the term {term} to its repaired value"
    if finite < 3:
        return f"h = {h} is undefined at most sample points of the term {term}"
    return None


def invert(branches: list[sp.Expr], op: str, r: tuple, rn: tuple, t: sp.Symbol,
           c_syms: set) -> Inverted | str:
    """The repair ``h`` for a consumer with terms ``branches`` (one per where-branch).

    Returns the proved repair, or the reason none was accepted.
    """
    sub = dict(zip(r, rn))
    main = next((b for b in branches if b.free_symbols & set(r)), None)
    if main is None:
        return "the body does not depend on the producer"
    reasons: list[str] = []
    tried = False
    for h in _candidates(main, main.subs(sub), t, c_syms):
        tried = True
        # cheap numeric falsifiers first, then the symbolic proofs; an h undefined at
        # most points, which is_zero below refuses, is refused before the costlier
        # distributivity proof too (|tanh| inverted has such a branch)
        why = next(filter(None, (_maps(h, t, b, sub) for b in branches)), None)
        if why is not None:
            reasons.append(why)
            continue
        good, why = _distributes(h, t, op, all(b.is_positive for b in branches))
        if not good:
            reasons.append(f"h(t) = {h}: {why}")
            continue
        if not all(is_zero(h.subs(t, b) - b.subs(sub)) for b in branches):
            reasons.append(f"could not prove that h = {h} repairs every term")
            continue
        return Inverted(simplest(h), why)
    if not tried:
        return f"g = {main} is not invertible in a loop-varying operand"
    # the most telling reason: a concrete counterexample beats "could not prove"
    return next((x for x in reasons if "e.g. at" in x), reasons[0] if reasons else "no repair")
