"""Settling: a consumer's final state where its producer ended at the guarded identity.

Inside the loop a consumer reads a max producer through the reducer table's guard
(``reducers.safe_expr``): the identity ``-inf`` (no element yet, or every element so far
``-inf``) as 0, so that ``exp(x - m)`` of a masked prefix is 0 and not NaN. A row whose
maximum *ends* at ``-inf`` (a nonempty row of ``-inf``: every key masked) keeps the
state built at 0, ``l = sum_j exp(-inf - 0) = 0``, where the reference, which is the
spec, sums ``exp(-inf - -inf) = NaN``. Its outputs therefore read the state *settled*:
repaired once more, after the loop, from the guarded value 0 to the identity with the
derived ``update`` (in that branch the producer is the constant, which folds)::

    before:  store l                     after:  store where(m == -inf, l * inf, l)

``0 * inf = NaN``: the reference's value. An empty axis (a symbolic extent of 0) keeps
the identities, as the reference's empty reductions do. The cost is per row, after the
loop: a comparison, a select, and a product per column of a column state.

An output that cannot tell the settled state from the unsettled one reads the state as
it is (:func:`settle_output`): attention's ``where((l > 0) | (m != -inf), o / l, 0)`` is
0 at ``m = -inf`` either way. The test is exact and cheap: a consumer whose every term
carries the factor ``exp(P - m)``, ``P`` the operand the producer maximises, holds 0 or
NaN at ``m = -inf`` (``exp(-inf - 0) = 0`` times anything), settled NaN; the output is
folded at ``m = -inf`` for each such value and must give one constant. So attention's
kernels keep their epilogue, and a softmax denominator, a log-sum-exp or a variance
over the maximum of a row of ``-inf`` gives NaN, as the reference and PyTorch do.

Before 2026-12-04 the guard read every non-finite value as 0 and nothing was settled:
``softmax`` of a row holding ``+inf`` gave 0 beside a NaN (PyTorch: NaN everywhere), a
row of ``-inf`` gave a denominator 0 (NaN) and ``logsumexp`` ``-inf`` (NaN).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..algebra.synth import moved, running, state
from ..ir.fold import fconst, fold
from ..ir.nodes import Binary, Cast, Const, Expr, Param, Unary, Where
from ..ir.reducers import reducer, safe_expr, settled_expr
from ..ir.traverse import factors, substitute, walk
from ..reference.interp import BINARY, UNARY

NAN = math.nan
PROBES = 4   # consumers of one producer an output is folded for (2**PROBES values each)


def _gates(accs, k: int) -> list[tuple[int, int]]:
    """``(n, p)``: the producers ``p`` of accumulator ``k`` (its ``n``-th) read through
    the guard."""
    return [(n, p) for n, p in enumerate(accs[k].producers)
            if settled_expr(accs[p].op, accs[p].state[0].param) is not None]


def _gate(accs, producers, extent) -> Expr | None:
    """Whether any of ``producers`` ended at its guarded identity over a nonempty axis
    (None: never, the axis is empty)."""
    if isinstance(extent, int) and extent == 0:
        return None
    cond = None
    for p in producers:
        got = settled_expr(accs[p].op, accs[p].state[0].param)
        cond = got if cond is None else Binary("or", cond, got)
    if not isinstance(extent, int):   # an empty axis keeps the identities
        cond = Binary("and", cond, Binary("gt", extent, Const(0, extent.dtype)))
    return cond


def settle(accs, k: int, extent) -> Expr:
    """The final value of accumulator ``k`` as an output or a later phase reads it: its
    state, settled where a guarded producer ended at its identity (module docstring)."""
    a = accs[k]
    t = a.state[0].param
    gates = _gates(accs, k)
    cond = _gate(accs, [p for _, p in gates], extent) if gates and a.updates else None
    if cond is None:
        return t
    env = {state(i): s.param for i, s in enumerate(a.state)}
    for n, p in enumerate(a.producers):
        final = accs[p].state[0].param
        env[running(n)], env[moved(n)] = safe_expr(accs[p].op, final), final
    if len(gates) == 1:   # the branch knows the producer's value: its identity
        n, p = gates[0]
        env[running(n)] = fconst(0.0)
        env[moved(n)] = fconst(reducer(accs[p].op).identity)
    return Where(cond, fold(substitute(a.updates[0], env)), t)


def _vanishing(accs, k: int, p: int) -> bool:
    """Whether consumer ``k`` holds 0 or NaN when its one guarded producer ``p`` is the
    max (or min) of a nonempty row at its identity: a one-component sum each of whose
    terms has the factor ``exp(P - running)`` (``exp(running - P)`` for a min), ``P`` the
    producer's own term -- ``exp(-inf - 0) = 0`` times the rest."""
    a, prod = accs[k], accs[p]
    if a.op != "sum" or len(a.state) != 1 or len(a.terms) != 1 or prod.producers \
            or len(prod.terms) != 1 or [q for _, q in _gates(accs, k)] != [p]:
        return False
    r = running(a.producers.index(p))
    big, small = (prod.terms[0], r) if prod.op == "max" else (r, prod.terms[0])
    return any(isinstance(f, Unary) and f.op == "exp" and isinstance(f.x, Binary)
               and f.x.op == "sub" and f.x.a is big and f.x.b is small
               for f in factors(a.terms[0]))


def _value(e: Expr):
    """The value of ``e`` where constants decide it, else None: IEEE arithmetic in float64
    (the reference's op table), a select or a logical op decided by what is known. (Not
    ``fold``: its identities assume finite data, ``x + inf = inf``, and here the data is
    the row of ``-inf``.)"""
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Where):
        c = _value(e.cond)
        return None if c is None else _value(e.a if c else e.b)
    if isinstance(e, Cast):
        v = _value(e.x)
        return None if v is None or not e.dtype.is_float else float(v)
    if isinstance(e, Binary) and e.op in ("and", "or"):
        a, b = _value(e.a), _value(e.b)
        if any(x is not None and bool(x) == (e.op == "or") for x in (a, b)):
            return e.op == "or"
        return None if a is None or b is None else bool(a) and bool(b)
    kids = [_value(c) for c in e.children()] if isinstance(e, (Unary, Binary)) else [None]
    if any(v is None for v in kids):
        return None
    with np.errstate(all="ignore"):
        fn = UNARY[e.op] if isinstance(e, Unary) else BINARY[e.op]
        return fn(*(np.float64(v) if isinstance(v, float) else v for v in kids)).item()


def _same_at_identity(body: Expr, accs, p: int, reads: list[int]) -> bool:
    """Whether constants decide ``body`` with producer ``p`` at its identity and each
    consumer in ``reads`` at 0 or NaN (unsettled) or NaN (settled), and to one value."""
    base = {accs[p].state[0].param: fconst(reducer(accs[p].op).identity)}
    got = set()
    for values in itertools.product((0.0, NAN), repeat=len(reads)):
        env = dict(base)
        env.update({accs[k].state[0].param: fconst(v) for k, v in zip(reads, values)})
        v = _value(substitute(body, env))
        if v is None:
            return False
        got.add("nan" if isinstance(v, float) and math.isnan(v) else v)
    return len(got) == 1


def settle_output(body: Expr, accs, extent) -> Expr:
    """Output ``body`` (reading the final state as the accumulators' state params) with
    each consumer's state settled (:func:`settle`), but for the consumers of a producer
    the output cannot tell settled from unsettled (module docstring)."""
    params = {x for x in walk(body) if isinstance(x, Param)}
    read = [k for k, a in enumerate(accs) if a.state[0].param in params]
    keep: set[int] = set()
    for p in {q for k in read for _, q in _gates(accs, k)}:
        mine = [k for k in read if p in accs[k].producers]
        if len(mine) <= PROBES and all(_vanishing(accs, k, p) for k in mine) \
                and _same_at_identity(body, accs, p, mine):
            keep |= set(mine)
    env = {accs[k].state[0].param: settle(accs, k, extent) for k in read if k not in keep}
    return substitute(body, {p: e for p, e in env.items() if e is not p})


__all__ = ["settle", "settle_output"]
