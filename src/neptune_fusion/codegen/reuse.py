"""Speed rule: one exponential per element in a one-tile kernel's epilogue.

When one tile covers the reduction axis (a persistent row reduction, ``one_tile``), each
phase runs its update once from the identity, so a state's final value is that update's
new value and the epilogue may read what the update computed per element. Softmax's
output ``exp(x - m) / l`` is the case: the sum ``l`` already computed
``exp2(s - g(m))`` for every element of the tile (``s = x * log2 e``, ``g(m) = 0`` when
``m`` is the maximum's identity ``-inf``, else ``m``: the guard a consumer reads a
running maximum through, ``reducers.safe_expr``), and the epilogue computed the
exponential a second time. This rule rewrites an output's ``exp2(a - m)`` as::

    exp2(a - g(m)) * where(m == -inf, inf, 1)

whose first factor is the update's own tile value (the code generator's CSE reads it
instead of computing it) and whose second is one select per row (``exp2(g(m) - m)``
where that is not 1). The identity holds in IEEE arithmetic for every ``a`` and ``m``.
Where ``m != -inf`` (finite, ``+inf`` or NaN), ``g(m) = m`` and the product is
``exp2(a - m) * 1``, the same value. For ``m = -inf``, ``g(m) = 0`` and ``exp2(a) * inf``
is NaN for ``a = -inf`` (as ``exp2(-inf + inf)``) and inf otherwise (as ``exp2(a +
inf)``). (Until 2026-12-04 the guard read every non-finite ``m`` as 0 and the factor was
``exp2(g(m) - m)``, an exponential per row; with ``+inf`` kept, that factor would be
``exp2(inf - inf) = NaN``.) A minimum is the mirror image: its identity ``+inf``, the
factor ``where(m == inf, 0, 1)``. Only ``a`` may differ from the
update's: there it may carry the tile's boundary mask, ``where(j < n, a, -inf)``, which
changes nothing where the epilogue stores (its store is masked by the same ``j < n``);
any other difference and the output is left as it is. A widening float cast
(``cast(m, float32)`` of a bfloat16 maximum: how a translated graph reads it, where the
kernel holds every state in float32 anyway) is read as its operand on both sides: it
changes no value. Without that, softmax through the ``torch.compile`` backend computed
its exponentials twice (bf16 softmax over 4096 x 32768 on an H100: 0.202 ms through the
backend against 0.185 for the same chain written in the language, one tile of 32768
each, 2026-12-05).

Measured on an H200 (fp32 softmax over 4096 x 32768, one row of 32768 per program, 32
warps): 0.382 ms with two exponentials per element (12 registers spilled), 0.301 ms with
one (none spilled; torch.compile 0.373): benchmarks/results/2026-12-02-h200-softmax-reuse.
"""

from __future__ import annotations

from ..ir.fold import fconst
from ..ir.nodes import Binary, Cast, Const, Expr, Unary, Where
from ..ir.reducers import reducer, safe_expr, settled_expr
from ..ir.traverse import rewrite, walk
from .exp2 import exp_to_exp2
from .exp2 import linear as _linear


def _widened(x: Expr) -> Expr | None:
    """A widening float cast's operand (the same value); None for any other node."""
    if isinstance(x, Cast) and x.dtype.is_float and x.x.dtype.is_float and \
            x.x.dtype.bits <= x.dtype.bits:
        return x.x
    return None


def linear(e: Expr) -> tuple[dict[Expr, float], float]:
    """:func:`.exp2.linear` of ``e`` read through its widening float casts, for matching
    only (``scale`` pushes a factor inside such a cast: the kernels compute every float
    in float32)."""
    return _linear(rewrite(e, _widened))


def share_exponentials(outputs, finals: dict, ops: dict, body_exprs, mask: Expr | None):
    """``outputs`` with each ``exp2(a - m)`` whose per-element value the one-tile update
    computed as ``exp2(a' - g(m'))`` read from it (module docstring). ``finals`` maps each
    state parameter to its update's new value, ``ops`` to its reducer; ``mask`` is the
    tile's boundary condition (``j < n``) when the tile is masked, else None."""
    from dataclasses import replace
    shared = _update_exponentials(finals, ops, body_exprs, mask)
    if not shared:
        return outputs

    hits = []

    def fn(x: Expr) -> Expr | None:
        if not (isinstance(x, Unary) and x.op == "exp2"):
            return None
        terms, const = linear(x.x)
        for param, (arg, rest) in shared.items():
            k = -terms.get(param, 0.0)
            if not k > 0.0:
                continue
            others = {t: c / k for t, c in terms.items() if t != param}
            if (others, const / k) == rest:
                op = ops[param]
                hits.append(param)
                # exp2(g(m) - m): inf (max) or 0 (min) at the identity, else 1
                return Binary("mul", Unary("exp2", arg), Where(
                    settled_expr(op, param), fconst(2.0 ** -reducer(op).identity),
                    fconst(1.0)))
        return None

    out = []
    for o in outputs:
        hits.clear()
        new = rewrite(exp_to_exp2(o.body), fn)
        out.append(replace(o, body=new) if hits else o)
    return outputs if all(a is b for a, b in zip(out, outputs)) else tuple(out)


def _update_exponentials(finals: dict, ops: dict, body_exprs, mask: Expr | None) -> dict:
    """State parameter ``m`` -> ``(a' - g(m'), terms of a)``: every exponential of the
    updates whose argument is ``a' - g(m')``, ``m'`` the new value of the max or min
    state ``m`` and ``a'`` (unmasked: ``where(mask, a, -inf)`` read as ``a``) a sum of
    terms ``a``."""
    # g(m') of each max or min state's new value m' -> the state
    guards = {safe_expr(ops[p], e): p for p, e in finals.items()
              if ops.get(p) in ("max", "min")}
    out = {}
    for e in body_exprs:
        for x in walk(e):
            if not (isinstance(x, Unary) and x.op == "exp2"):
                continue
            terms, const = linear(x.x)
            for t, c in terms.items():
                if not c < 0.0:
                    continue
                param = guards.get(t)
                if param is None:
                    continue
                # per unit of m: exp2(a - m2) (scaled) and exp2((a - m) * L) alike
                rest = [(u, k / -c) for u, k in terms.items() if u != t]
                plain = _unmasked(rest, mask)
                if plain is not None:
                    out.setdefault(param, (x.x, (plain, const / -c)))
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
