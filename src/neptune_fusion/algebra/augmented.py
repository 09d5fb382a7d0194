"""The augmented-state method (beyond Neptune), for ``F = +``.

When ``g`` cannot be inverted, carry more than one accumulator. Start from ``G = [g]`` and
close it under ``d/dr`` for every producer ``r``: each derivative is either a combination
of ``G`` with coefficients free of ``c`` (closed), or it joins ``G`` (with its ``c``-free
factors stripped). If the family closes within a bound, then for any ``r, r'`` there is a
matrix ``M(r, r')`` free of ``c`` with ``G(r', c) = M(r, r') G(r, c)`` (for constant
coefficients ``dG/dr = A G`` it is ``expm((r' - r) A)``). Because the state
``T = sum_j G(r, c_j)`` is a sum and ``M`` is linear, ``T(r') = M T(r)``: the repair.

``M`` is found by evaluating ``G`` at as many sample points of ``c`` as it has components
(``M = G(r') G(r)^-1`` on those points) and is then *proved* on symbolic ``c``.

For ``g = (c - r/n)^2`` (variance) the family is ``[(c - r/n)^2, c - r/n, 1]``: the state
is Welford's (centred sum of squares, centred sum, count) and ``M`` is its shift rule.

**Shared components.** The closure may add a member that a producer already accumulates.
Entropy's ``g = (c - r0 - log r1) exp(c - r0)`` (``r0`` the maximum, ``r1`` the sum
``l = sum exp(c - r0)``) closes as ``[g, g + exp(c - r0)]``; the same span has the basis
``[g, exp(c - r0)]``, whose second member is the producer ``l``'s own term at the same
running maximum, so its sum *is* ``l``'s state and costs nothing to carry
(:func:`prefer_known`; the lowering reads ``l``'s state for it). The known terms offered
are those of sum producers that are themselves repaired (they read a running value, so
their state is centred like the member it replaces); a plain producer's raw sum is never
offered: the variance's centred ``c - r/n`` replaced by the mean's raw ``c`` would make
the shift rule cancel catastrophically.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import sympy as sp

from .proofs import compile_numeric, is_zero, probe, sample_point

MAX_TERMS = 4


@dataclass(frozen=True)
class Augmented:
    basis: tuple[sp.Expr, ...]
    matrix: sp.Matrix
    proof: str
    # (member i, producer k): basis[i] is producer k's own term, its sum k's state
    shared: tuple[tuple[int, int], ...] = ()


def deltas(n: int) -> tuple[sp.Symbol, ...]:
    """The shift symbols ``d_k = r_k' - r_k`` the repair matrix is written in."""
    return tuple(sp.Symbol(f"d{k}", real=True) for k in range(n))


def _strip(d: sp.Expr, c_syms: set) -> sp.Expr:
    """``d`` without its factors that do not depend on ``c`` (they go into the matrix)."""
    d = sp.factor_terms(d)
    if not (d.free_symbols & c_syms):
        return sp.Integer(1)
    if d.is_Mul:
        keep = [a for a in d.args if a.free_symbols & c_syms]
        return sp.Mul(*keep)
    return d


def _in_span(d: sp.Expr, basis: list[sp.Expr], c_syms: list) -> bool:
    """Whether ``d`` looks like a combination of ``basis`` with ``c``-free coefficients.

    A numeric test (least squares over random ``c`` at fixed producer values): the closure
    search only proposes a family; the repair matrix built from it is proved symbolically.
    """
    n = len(basis)
    cs = set(c_syms)
    others = (d.free_symbols | set().union(*(b.free_symbols for b in basis))) - cs
    order = sorted(others | cs, key=str)
    fns = [compile_numeric(order, e) for e in [d, *basis]]
    if any(f is None for f in fns):
        return False
    rng = random.Random(7)
    for trial in range(4):
        fixed = sample_point(others, rng, (1.0, 0.3, 2.0, 0.1)[trial])
        rows = []
        with np.errstate(all="ignore"):
            for _ in range(3 * n + 6):
                pt = {**fixed, **sample_point(cs, rng)}
                args = [pt[s] for s in order]
                try:
                    row = [complex(f(*args)) for f in fns]
                except (ZeroDivisionError, OverflowError, ValueError, TypeError, NameError):
                    continue
                if all(np.isfinite(v) and abs(v.imag) < 1e-12 for v in row):
                    rows.append([v.real for v in row])
        if len(rows) < n + 3:
            continue
        m = np.array(rows)
        y, a = m[:, 0], m[:, 1:]
        coef, *_ = np.linalg.lstsq(a, y, rcond=None)
        return bool(np.max(np.abs(a @ coef - y)) <= 1e-8 * (1 + np.max(np.abs(y))))
    return False


def _vanishes(d: sp.Expr) -> bool:
    if d == 0:
        return True
    bad, finite = probe(d, trials=6)
    return bad is None and finite >= 3  # unevaluable is not zero


def close_family(g: sp.Expr, r: tuple, c_syms: list) -> list[sp.Expr] | str:
    """The family of ``g`` closed under ``d/dr``, or why it does not close."""
    basis = [g]
    queue = [g]
    while queue:
        b = queue.pop(0)
        for rk in r:
            d = sp.diff(b, rk)
            if _vanishes(d):
                continue
            if _in_span(d, basis, c_syms):
                continue
            new = _strip(d, set(c_syms))
            if not _in_span(new, basis, c_syms):
                if len(basis) == MAX_TERMS:
                    return (f"the derivatives of g = {g} with respect to the producer do not "
                            f"close within {MAX_TERMS} terms")
                basis.append(new)
                queue.append(new)
    return basis


def prefer_known(fam: list[sp.Expr], known: tuple[tuple[int, sp.Expr], ...],
                 c_syms: list) -> tuple[list[sp.Expr], tuple[tuple[int, int], ...]]:
    """``fam`` with members replaced by ``known`` producer terms that span the same space
    (see the module docstring), and which member is which producer's term. Member 0, the
    consumer's own term, is never replaced."""
    fam, shared = list(fam), []
    for k, term in known:
        if any(j == k for _, j in shared):
            continue
        same = [i for i, f in enumerate(fam) if sp.expand(f - term) == 0]
        if same:
            if same[0] > 0 and all(i != same[0] for i, _ in shared):
                shared.append((same[0], k))
            continue
        if len(fam) < 2 or not _in_span(term, fam, c_syms):
            continue
        for i in range(len(fam) - 1, 0, -1):
            if any(i == s for s, _ in shared):
                continue
            if _in_span(fam[i], fam[:i] + fam[i + 1:] + [term], c_syms):
                fam[i] = term
                shared.append((i, k))
                break
    return fam, tuple(sorted(shared))


def _coefficients(fam: list[sp.Expr], c_syms: list) -> tuple[sp.Matrix, list]:
    """``C`` with ``fam[i] = sum_k C[i, k] * atom_k(c)``: the family in ``c``-only atoms."""
    rows = []
    for g in fam:
        row: dict = {}
        for term in sp.Add.make_args(sp.expand(g)):
            coef, atom = term.as_independent(*c_syms, as_Add=False)
            row[atom] = row.get(atom, 0) + coef
        rows.append(row)
    atoms = list(dict.fromkeys(a for row in rows for a in row))
    return sp.Matrix([[row.get(a, 0) for a in atoms] for row in rows]), atoms


def augment(g: sp.Expr, r: tuple, rn: tuple, c_syms: list,
            known: tuple[tuple[int, sp.Expr], ...] = ()) -> Augmented | str:
    """The augmented state and its repair matrix for a sum consumer with term ``g``;
    ``known`` are ``(k, term)`` of producers whose state is the sum of ``term`` (offered
    to :func:`prefer_known`).

    Writing the family over ``c``-only atoms, ``G(r, c) = C(r) phi(c)``, the repair is any
    ``M`` with ``M C(r) = C(r')``: solved on ``n`` independent columns, then checked on all
    of them, which proves ``G(r', c) = M G(r, c)`` for every ``c``.
    """
    fam = close_family(g, r, c_syms)
    if isinstance(fam, str):
        return fam
    preferred, shared = prefer_known(fam, known, c_syms)
    if shared:   # the swap is chosen numerically: where it does not prove, the family as closed
        got = _repair_matrix(preferred, r, rn, c_syms, shared)
        if isinstance(got, Augmented):
            return got
    return _repair_matrix(fam, r, rn, c_syms, ())


def _repair_matrix(fam: list[sp.Expr], r: tuple, rn: tuple, c_syms: list,
                   shared: tuple[tuple[int, int], ...]) -> Augmented | str:
    """The proved repair matrix of the family ``fam`` (see :func:`augment`)."""
    n = len(fam)
    sub = dict(zip(r, rn))
    coef, atoms = _coefficients(fam, c_syms)
    if any(a.free_symbols & set(r) for a in atoms):
        return f"the family G = {fam} does not separate into producer and loop factors"
    probe_pt = sample_point(coef.free_symbols, random.Random(3))
    _, pivots = coef.subs(probe_pt).rref(simplify=True)
    if len(pivots) < n:
        return f"the family G = {fam} is not independent over the loop operands"
    square = coef[:, list(pivots)]
    try:
        m = (coef.subs(sub)[:, list(pivots)] * square.inv()).applyfunc(sp.simplify)
    except (ValueError, ZeroDivisionError):
        return f"no repair matrix for G = {fam}"
    if any(e.free_symbols & set(c_syms) for e in m):
        return f"no repair matrix free of the loop operands exists for G = {fam}"
    residual = m * coef - coef.subs(sub)
    if not all(is_zero(e) for e in residual):
        return f"could not prove the repair matrix for G = {fam}"
    # Written in the shifts d_k = r_k' - r_k, not in r and r' separately: an expanded
    # (r'^2 - 2 r r' + r^2) cancels catastrophically, d^2 does not.
    # Only for producers the matrix is shift-invariant in (a mean, not a variance).
    for a, b, d in zip(r, rn, deltas(len(r))):
        shifted = m.subs(b, a + d).applyfunc(lambda e: sp.factor(sp.expand(e)))
        if not any(a in e.free_symbols for e in shifted):
            m = shifted
    return Augmented(tuple(fam), m,
                     f"G(r') = M(r, r') G(r) proved for G = [{', '.join(map(str, fam))}]; "
                     "M is linear, so it distributes over +", shared)
