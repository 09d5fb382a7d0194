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

from .proofs import counterexample, fmt_point, is_zero, probe, simplest


@dataclass(frozen=True)
class Inverted:
    h: sp.Expr
    proof: str


def _candidates(g: sp.Expr, g1: sp.Expr, t: sp.Symbol, c_syms: set):
    q = simplest(g1 / g)
    if not (q.free_symbols & c_syms):
        yield t * q
    d = simplest(g1 - g)
    if not (d.free_symbols & c_syms):
        yield t + d
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
    slope = sp.simplify(sp.diff(h, t))
    try:
        nonneg = bool(slope.is_nonnegative)
    except TypeError:  # SymPy compared a NaN on the way
        nonneg = False
    if nonneg:
        return True, f"dh/dt = {slope} >= 0, so h commutes with {op}"
    return False, f"could not prove h nondecreasing in t (dh/dt = {slope}), needed for {op}"


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
        # cheap numeric falsifiers first, then the symbolic proofs
        wrong = next((b for b in branches
                      if counterexample(h.subs(t, b) - b.subs(sub)) is not None), None)
        if wrong is not None:
            reasons.append(f"h = {h} does not map the term {wrong} to its repaired value")
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
