"""A softmax's max and sum replaced by the saved log-sum-exp, and ``delta`` from the
saved output: how attention's backward comes out as FlashAttention-2's.

:func:`use_saved_lse` is a pure transform of a forward program. Before and after::

    m[r] = max(s[r, j], j)                 p[r, j] = exp(s[r, j] - lse[r])
    p[r, j] = exp(s[r, j] - m[r])          o[r, e] = sum(p[r, j] * v[j, e], j)
    l[r] = sum(p[r, j], j)
    o[r, e] = where(l[r] > 0 | m[r] != -inf, sum(p[r, j] * v[j, e], j) / l[r], 0)

with ``lse`` a placeholder (the forward kernel's second output). With ``m := lse`` the
normaliser is 1, so the ratio the forward divides out is unchanged. Legality: ``m`` is
the max over the last axis of ``s``; ``l`` the sum over it of ``exp(s - m)``; ``m`` is
read only as ``exp(s[r, j] - m[r])``, the whole body of a compute ``p`` (and by the
forward's own ``lse`` output, dropped) or in the guard ``m != -inf`` (the row has a
key); ``l`` only as ``l > 0`` or as the divisor of a sum over ``j`` of ``p`` times a
factor reading neither ``m`` nor ``l``. With ``l := 1`` the guard folds away. A row with
no key has ``lse = -inf``: the caller passes ``+inf`` there, so that ``p = 0`` (no
gradient).

The :class:`~.reverse.Link` it returns says ``lse[r] = log(sum_j exp(s[r, j]))``:
``d_s[r, j] += d_lse[r] * p[r, j]``. Reverse mode then gives ``d_lse[r] = -sum_j(d_p[r,
j] * p[r, j])``, which :func:`saved_output_rule` rewrites with the saved output ``O``
(``sum_j p v`` exchanged with ``d_p = sum_e dO v``) into ``-sum_e(dO[r, e] * O[r, e])``:
FlashAttention's ``delta``, O(rows) work instead of O(rows x keys).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ..errors import DerivativeError
from ..ir.dtypes import float32
from ..ir.fold import fold
from ..ir.graph import tensors_in_order
from ..ir.nodes import (
    Binary,
    Cast,
    Compute,
    Const,
    Expr,
    IndexVar,
    Load,
    Placeholder,
    Reduce,
    Tensor,
    Unary,
    fresh_uid,
)
from ..ir.traverse import factors, product, rewrite, substitute, walk
from .reverse import Link


def _is_load(e: Expr, t: Tensor) -> bool:
    return isinstance(e, Load) and e.tensor is t


def _softmax_pairs(order: list[Tensor]):
    """``(s, m, l)`` for each max ``m`` over the last axis of ``s`` with a sum ``l`` of
    ``exp(s - m)`` over it."""
    out = []
    for m in order:
        if not (isinstance(m, Compute) and isinstance(m.body, Reduce) and m.body.op == "max"
                and isinstance(m.body.body, Load)):
            continue
        ld, (j,) = m.body.body, m.body.axes
        if ld.indices != (*m.axes, j) or not isinstance(ld.tensor, Compute):
            continue
        s = ld.tensor
        for l in order:  # noqa: E741
            if not (isinstance(l, Compute) and isinstance(l.body, Reduce)
                    and l.body.op == "sum" and len(l.body.axes) == 1):
                continue
            body = fold(substitute(l.body.body, dict(zip(l.axes, m.axes))))
            jl = l.body.axes[0]
            want = Unary("exp", Binary("sub", Load(s, (*m.axes, jl)), Load(m, m.axes)))
            inlined = body
            if isinstance(body, Load) and isinstance(body.tensor, Compute):
                p = body.tensor
                inlined = substitute(p.body, dict(zip(p.axes, body.indices)))
            if inlined is want:
                out.append((s, m, l))
    return out


def _check_uses(order, s: Compute, m: Compute, l: Compute, dropped) -> None:  # noqa: E741
    """The legality conditions of :func:`use_saved_lse` (module docstring)."""
    ps = [t for t in order if isinstance(t, Compute) and isinstance(t.body, Unary)
          and t.body.op == "exp" and isinstance(t.body.x, Binary) and t.body.x.op == "sub"
          and _is_load(t.body.x.a, s) and _is_load(t.body.x.b, m)
          and t.body.x.a.indices == t.axes and t.body.x.b.indices == t.axes[:-1]]
    for t in order:
        if not isinstance(t, Compute) or t in (m, l) or t in dropped:
            continue
        ok: set[int] = set()
        for e in walk(t.body):
            if t in ps and e is t.body.x.b:
                ok.add(id(e))
            if isinstance(e, Binary) and e.op == "gt" and _is_load(e.a, l) \
                    and isinstance(e.b, Const) and e.b.value == 0:
                ok.add(id(e.a))
            if _no_key_guard(e, m):
                ok.add(id(e.a))
            if isinstance(e, Binary) and e.op == "div" and _is_load(e.b, l) \
                    and isinstance(e.a, Reduce) and e.a.op == "sum":
                fs = factors(e.a.body)
                hits = [f for f in fs if isinstance(f, Load) and f.tensor in ps]
                if len(hits) == 1 and all(not ({m, l} & _reads(f)) for f in fs
                                          if f is not hits[0]):
                    ok.add(id(e.b))
        for e in walk(t.body):
            if (_is_load(e, m) or _is_load(e, l)) and id(e) not in ok:
                raise DerivativeError(
                    f"cannot use the saved log-sum-exp: {t.name!r} reads "
                    f"{e.tensor.name!r} as {e} outside exp(s - max) and the normalising "
                    "divide")


def _no_key_guard(e: Expr, m: Tensor) -> bool:
    """Whether ``e`` is ``m != -inf`` (the row has a key: attention's output guard)."""
    return isinstance(e, Binary) and e.op == "ne" and _is_load(e.a, m) \
        and isinstance(e.b, Const) and e.b.value == -math.inf


def _reads(e: Expr) -> set[Tensor]:
    return {n.tensor for n in walk(e) if isinstance(n, Load)}


def use_saved_lse(outputs: Sequence[Compute], drop: Sequence[Compute] = ()
                  ) -> tuple[list[Compute], Placeholder, Compute, Compute]:
    """``(outputs', lse, s', p')``: the program recomputed from a saved log-sum-exp
    (module docstring); ``drop`` are outputs left out (the forward's own ``lse``).
    Raises :class:`DerivativeError` when there is not exactly one softmax or it is read
    otherwise."""
    keep = [o for o in outputs if o not in drop]
    order = tensors_in_order(list(outputs))
    pairs = _softmax_pairs(order)
    if len(pairs) != 1:
        raise DerivativeError(f"the saved log-sum-exp needs exactly one softmax (a max "
                              f"and a sum of exp(s - max) over one axis); found "
                              f"{len(pairs)}")
    s, m, l = pairs[0]  # noqa: E741
    _check_uses(order, s, m, l, drop)
    lse = Placeholder("lse", m.shape, float32, fresh_uid())
    new: dict[Tensor, Tensor] = {}

    def put(e: Expr) -> Expr | None:
        if isinstance(e, Load):
            if e.tensor is m:
                return Load(lse, e.indices)
            if e.tensor is l:
                return Const(1.0, l.dtype)
            if e.tensor in new:
                return Load(new[e.tensor], e.indices)
        return None
    for t in tensors_in_order(keep):
        if isinstance(t, Compute):
            new[t] = Compute(t.name, t.shape, t.axes, fold(rewrite(t.body, put)), fresh_uid())
            if t is s:
                new[t] = outline_sum(new[t], "qk")
    p = next(new[t] for t in order if t in new and isinstance(t.body, Unary)
             and t.body.op == "exp" and _reads(t.body) == {s, m})
    return [new[o] for o in keep], lse, new[s], p


def outline_sum(t: Compute, name: str) -> Compute:
    """``t`` with the one sum over all of its axes in its body made its own compute
    ``name`` (``t`` itself when there is none or several). Before and after::

        s[i, j] = mod(sum(q[i, c] * k[j, c], c) * scale)
        qk[i, j] = sum(q[i, c] * k[j, c], c);  s[i, j] = mod(qk[i, j] * scale)

    The adjoint of ``qk`` is then the score's cotangent through the mod: ``dS``."""
    sums = [e for e in walk(t.body) if isinstance(e, Reduce) and e.op == "sum"
            and e is not t.body and e.free_vars <= frozenset(t.axes)]
    outer = [e for e in sums if not any(e is not o and e in set(walk(o)) for o in sums)]
    if len(outer) != 1 or outer[0].free_vars != frozenset(t.axes):
        return t
    inner = Compute(name, t.shape, t.axes, outer[0], fresh_uid())
    body = rewrite(t.body, lambda e: Load(inner, t.axes) if e is outer[0] else None)
    return Compute(t.name, t.shape, t.axes, body, fresh_uid())


def lse_link(lse: Placeholder, s: Compute, p: Compute) -> Link:
    """``lse[r] = log(sum_j exp(s[r, j]))``: its cotangent reaches ``s`` weighted by the
    softmax, ``d_s[r, j] += d_lse[r] * p[r, j]``. A ``d_lse`` that is ``-x`` (after
    :func:`saved_output_rule`: ``x`` is ``delta``) is written ``-delta[r] * p[r, j]``
    with ``delta`` its own compute."""
    made: dict[int, Tensor] = {}

    def adjoint(d: Tensor, xs: tuple[IndexVar, ...]) -> Expr:
        rows = xs[:-1]
        if id(d) not in made:
            made[id(d)] = d
            if isinstance(d, Compute):
                body = d.body.x if isinstance(d.body, Cast) else d.body
                if isinstance(body, Unary) and body.op == "neg":
                    made[id(d)] = Compute("delta", d.shape, d.axes, body.x, fresh_uid())
        t = made[id(d)]
        got = Load(t, rows)
        if t is not d:
            got = Unary("neg", got)
        return Binary("mul", got, Load(p, xs))
    return Link(lse, s, adjoint)


def _strip(e: Expr) -> Expr:
    """``e`` without float-to-float casts on top."""
    while isinstance(e, Cast) and e.dtype.is_float and e.x.dtype.is_float:
        e = e.x
    return e


def _match(pat: Expr, t: Expr, env: dict) -> bool:
    """Bind ``pat``'s pattern variables (the keys of ``env`` bound to None) to make it
    ``t``; reduce axes bind to reduce axes; products match in either order; float-to-float
    casts are looked through (they only round)."""
    pat, t = _strip(pat), _strip(t)
    if isinstance(pat, IndexVar) and pat in env:
        if env[pat] is None:
            env[pat] = t
            return True
        return env[pat] is t
    if pat is t:
        return True
    if type(pat) is not type(t):
        return False
    if isinstance(pat, Load):
        return pat.tensor is t.tensor and all(_match(a, b, env)
                                             for a, b in zip(pat.indices, t.indices))
    if isinstance(pat, Reduce):
        if pat.op != t.op or len(pat.axes) != len(t.axes):
            return False
        for a, b in zip(pat.axes, t.axes):
            env[a] = b
        return _match(pat.body, t.body, env)
    if isinstance(pat, Binary):
        if pat.op != t.op:
            return False
        saved = dict(env)
        if _match(pat.a, t.a, env) and _match(pat.b, t.b, env):
            return True
        env.clear()
        env.update(saved)
        return pat.op in ("mul", "add") and _match(pat.a, t.b, env) and _match(pat.b, t.a, env)
    kids_p, kids_t = pat.children(), t.children()
    if not kids_p or len(kids_p) != len(kids_t) or pat.with_children(kids_t) is not t:
        # same node type: compare the non-child fields by rebuilding with t's children
        return False
    return all(_match(a, b, env) for a, b in zip(kids_p, kids_t))


def saved_output_rule(saved: Mapping[Compute, Placeholder]):
    """A simplifier rule: ``sum_j(A_j * D[.., j])`` with ``D = sum_e(B_e * C_{j,e})`` and
    ``sum_j(A_j * C_{j,e})`` the body of a saved output ``O`` is ``sum_e(B_e * O[.., e])``.
    (Exchanging two finite sums; ``O``'s saved value may be rounded to its dtype.)"""
    def rule(e: Expr) -> Expr | None:
        if not (isinstance(e, Reduce) and e.op == "sum" and len(e.axes) == 1):
            return None
        (j,) = e.axes
        fs = factors(e.body)
        for k, f in enumerate(fs):
            if not (isinstance(f, Load) and isinstance(f.tensor, Compute)
                    and isinstance(f.tensor.body, Reduce) and f.tensor.body.op == "sum"
                    and len(f.tensor.body.axes) == 1):
                continue
            inner = substitute(f.tensor.body, dict(zip(f.tensor.axes, f.indices)))
            (ax,) = inner.axes
            ifs = factors(inner.body)
            outside = [x for x in ifs if j not in x.free_vars]
            within = [x for x in ifs if j in x.free_vars]
            rest = fs[:k] + fs[k + 1:]
            if not outside or not within or not rest:
                continue
            cand = Reduce("sum", product(rest + within), (j,))
            for o, ph in saved.items():
                body = _strip(o.body)
                env: dict = {a: None for a in o.axes}
                if _match(body, cand, env) and all(env[a] is not None for a in o.axes):
                    got = Load(ph, tuple(env[a] for a in o.axes))
                    return Reduce("sum", product(outside + [got]), (ax,))
        return None
    return rule
