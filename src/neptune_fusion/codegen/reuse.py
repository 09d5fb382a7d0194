"""Speed rule: one exponential per element in a one-tile kernel's epilogue.

When one tile covers the reduction axis (a persistent row reduction, ``one_tile``), each
phase runs its update once from the identity, so a state's final value is that update's
new value and the epilogue may read what the update computed per element. Softmax's
output ``exp(x - m) / l`` is the case: the sum ``l`` already computed
``exp2(s - g(m))`` for every element of the tile (``s = x * log2 e``, ``g(m) = m`` when
``|m| < inf``, else 0: the guard a consumer reads a running maximum through), and the
epilogue computed the exponential a second time. This rule rewrites an output's
``exp2(a - m)`` as::

    exp2(a - g(m)) * exp2(g(m) - m)

whose first factor is the update's own tile value (the code generator's CSE reads it
instead of computing it) and whose second is one value per row. The identity holds in
IEEE arithmetic for every ``a`` and ``m``. For a finite ``m``, ``g(m) = m`` and the
factor is exactly ``exp2(0) = 1``. For ``m = -inf``, ``g(m) = 0`` and the factor is
``inf``: ``exp2(a) * inf`` is NaN for ``a = -inf`` (as ``exp2(-inf + inf)``) and inf
otherwise (as ``exp2(a + inf)``). For ``m = +inf`` the factor is 0: ``exp2(a) * 0`` is 0
for a finite ``a`` (as ``exp2(a - inf)``) and NaN for ``a = inf`` (as ``exp2(inf -
inf)``). A NaN on either side gives NaN on both. Only ``a`` may differ from the
update's: there it may carry the tile's boundary mask, ``where(j < n, a, -inf)``, which
changes nothing where the epilogue stores (its store is masked by the same ``j < n``);
any other difference and the output is left as it is.

Measured on an H200 (fp32 softmax over 4096 x 32768, one row of 32768 per program, 32
warps): 0.382 ms with two exponentials per element (12 registers spilled), 0.301 ms with
one (none spilled; torch.compile 0.373): benchmarks/results/2026-12-02-h200-softmax-reuse.
"""

from __future__ import annotations

from ..ir.nodes import Binary, Const, Expr, Unary, Where
from ..ir.reducers import safe_expr
from ..ir.traverse import rewrite, walk
from .exp2 import canonical_arg, exp_to_exp2, linear


def share_exponentials(outputs, finals: dict, body_exprs, mask: Expr | None):
    """``outputs`` with each ``exp2(a - m)`` whose per-element value the one-tile update
    computed as ``exp2(a' - g(m'))`` read from it (module docstring). ``finals`` maps each
    state parameter to its update's new value; ``mask`` is the tile's boundary condition
    (``j < n``) when the tile is masked, else None."""
    from dataclasses import replace
    shared = _update_exponentials(finals, body_exprs, mask)
    if not shared:
        return outputs

    hits = []

    def fn(x: Expr) -> Expr | None:
        if not (isinstance(x, Unary) and x.op == "exp2"):
            return None
        terms, const = linear(x.x)
        for param, (arg, rest) in shared.items():
            if terms.get(param) != -1.0:
                continue
            others = {t: c for t, c in terms.items() if t != param}
            if (others, const) == rest:
                guard = safe_expr("max", param)
                hits.append(param)
                return Binary("mul", Unary("exp2", arg),
                              Unary("exp2", canonical_arg(Binary("sub", guard, param))))
        return None

    out = []
    for o in outputs:
        hits.clear()
        new = rewrite(exp_to_exp2(o.body), fn)
        out.append(replace(o, body=new) if hits else o)
    return outputs if all(a is b for a, b in zip(out, outputs)) else tuple(out)


def _update_exponentials(finals: dict, body_exprs, mask: Expr | None) -> dict:
    """State parameter ``m`` -> ``(a' - g(m'), terms of a)``: every exponential of the
    updates whose argument is ``a' - g(m')``, ``m'`` the new value of the max or min
    state ``m`` and ``a'`` (unmasked: ``where(mask, a, -inf)`` read as ``a``) a sum of
    terms ``a``."""
    # g(m') of each state's new value m' (the same form for max and min) -> the state
    guards = {safe_expr("max", e): p for p, e in finals.items()}
    out = {}
    for e in body_exprs:
        for x in walk(e):
            if not (isinstance(x, Unary) and x.op == "exp2"):
                continue
            terms, const = linear(x.x)
            for t, c in terms.items():
                if c != -1.0:
                    continue
                param = guards.get(t)
                if param is None:
                    continue
                rest = [(u, k) for u, k in terms.items() if u != t]
                plain = _unmasked(rest, mask)
                if plain is not None:
                    out.setdefault(param, (x.x, (plain, const)))
    return out


def _unmasked(rest, mask: Expr | None) -> dict | None:
    """The terms ``rest`` with a ``where(mask, a, -inf)`` term (coefficient 1) read as
    the terms of ``a``; None when a term is masked some other way."""
    out: dict = {}
    for t, c in rest:
        if isinstance(t, Where):
            if mask is None or c != 1.0 or t.cond != mask or not (
                    isinstance(t.b, Const) and t.b.value == float("-inf")):
                return None
            inner, k0 = linear(t.a)
            if k0:
                return None
            for u, k in inner.items():
                out[u] = out.get(u, 0.0) + k
        else:
            out[t] = out.get(t, 0.0) + c
    return out
