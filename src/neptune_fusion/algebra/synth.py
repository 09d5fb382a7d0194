"""Repair synthesis: from a consumer reduction and its producers to a proved repair.

The derivation works on the canonical SymPy abstraction of the consumer's body and is
memoised on it, so a chain shape is derived (and proved) once per process. Each
derivation has a time budget (:mod:`.budget`): one stopped by it is no repair, remembered
with its budget and tried again only under a larger one.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import sympy as sp

from ..ir.dtypes import float32
from ..ir.nodes import Expr, IndexVar, Param, Reduce
from ..ir.traverse import substitute
from .augmented import Augmented, augment, deltas
from .budget import TimedOut, within
from .inversion import Inverted, invert
from .sign import sign_of
from .sym import Abstraction, Unsupported, producer_symbols, to_ir, where_branches


def running(k: int) -> Param:
    """The running value of producer ``k`` that a consumer's terms were computed with."""
    return Param(f"r{k}", float32)


def moved(k: int) -> Param:
    """The new running value of producer ``k`` a repair moves the state to."""
    return Param(f"r{k}_new", float32)


def state(i: int) -> Param:
    """Component ``i`` of a consumer's accumulated state."""
    return Param(f"t{i}", float32)


@dataclass(frozen=True)
class Repair:
    """How a consumer keeps its state exact while its producers' values move.

    The state has one component per entry of ``terms``: component ``i`` accumulates
    ``terms[i]`` (IR in which producer ``k`` is ``running(k)``) with the consumer's reducer
    (``+`` for the augmented method). When producer values move from ``running(k)`` to
    ``moved(k)``, component ``i`` becomes ``update[i]`` (IR in ``state(i)``,
    ``running(k)``, ``moved(k)``). Component 0 is the consumer's value.
    """

    method: str  # "inversion" | "augmented"
    producers: tuple[Reduce, ...]
    terms: tuple[Expr, ...]
    update: tuple[Expr, ...]
    sym_terms: tuple[sp.Expr, ...]
    sym_update: tuple[sp.Expr, ...]
    meaning: dict
    proof: str
    # (component i, producer k): component i is the sum producer k accumulates, at the
    # same running values; its state is k's (augmented.py, "Shared components")
    shared: tuple[tuple[int, int], ...] = ()


def _guarded(attempt):
    """Run a derivation; SymPy failing on the way is a failed proof, never a crash."""
    try:
        return attempt()
    except (TypeError, ValueError, ZeroDivisionError, NotImplementedError, RecursionError,
            AttributeError, KeyError, IndexError) as err:  # SymPy's internals, e.g. KeyError: zoo
        return f"SymPy could not complete the derivation ({type(err).__name__}: {err})"


Derived = Inverted | Augmented | str | TimedOut
_MEMO: dict[tuple, Derived] = {}
_MEMO_LOCK = threading.Lock()
MEMO_SIZE = 1024


def derive(op: str, branches: tuple[sp.Expr, ...], nprod: int,
           signs: tuple[str, ...] = (), budget: float = math.inf,
           known: tuple[tuple[int, sp.Expr], ...] = ()) -> Derived:
    """The memoised derivation: a proved repair, the reasons none exists, or
    :class:`TimedOut` when it did not finish within ``budget`` seconds. A derivation
    stopped by a budget is tried again only under a larger one. ``known``: the terms
    of repaired sum producers, ``(k, term)``, that an augmented state may share."""
    key = (op, branches, nprod, signs, known)
    got = _MEMO.get(key)
    if got is not None and not (isinstance(got, TimedOut) and budget > got.seconds):
        return got
    got = within(budget, lambda: _derive(op, branches, nprod, signs, known))
    with _MEMO_LOCK:
        if len(_MEMO) >= MEMO_SIZE:
            _MEMO.pop(next(iter(_MEMO)))   # the oldest
        _MEMO[key] = got
    return got


def clear_memo() -> None:
    """Forget every derivation (as ``functools.lru_cache``'s ``cache_clear``)."""
    with _MEMO_LOCK:
        _MEMO.clear()


def _derive(op: str, branches: tuple[sp.Expr, ...], nprod: int,
            signs: tuple[str, ...],
            known: tuple[tuple[int, sp.Expr], ...] = ()) -> Inverted | Augmented | str:
    r, rn = producer_symbols(nprod, signs)
    t = sp.Symbol("t0", real=True)
    c_syms = sorted({s for b in branches for s in b.free_symbols if s.name[0] == "c"},
                    key=lambda s: s.name)
    got = _guarded(lambda: invert(list(branches), op, r, rn, t, set(c_syms)))
    if isinstance(got, Inverted):
        return got
    reasons = [f"inversion: {got}"]
    if op != "sum":
        reasons.append(f"augmented state: needs a sum consumer, this is {op}")
    elif len(branches) > 1:
        reasons.append("augmented state: a producer inside a where-branch is not supported")
    else:
        aug = _guarded(lambda: augment(branches[0], r, rn, c_syms, known))
        if isinstance(aug, Augmented):
            return aug
        reasons.append(f"augmented state: {aug}")
    return "; ".join(reasons)


def synthesize(consumer: Reduce, producers: list[Reduce], outer: frozenset[IndexVar],
               budget: float = math.inf) -> Repair | str | TimedOut:
    """Derive the repair of ``consumer`` for ``producers`` moving together: the repair,
    why there is none, or :class:`TimedOut` when the derivation took more than
    ``budget`` seconds."""
    params = tuple(running(k) for k in range(len(producers)))
    body = substitute(consumer.body, dict(zip(producers, params)))
    signs = tuple(sign_of(p) for p in producers)
    ab = Abstraction(params, outer, signs)
    try:
        branches_ir = where_branches(body, ab.has_producer)
        branches = tuple(ab.to_sympy(b) for b in branches_ir)
    except Unsupported as err:
        return str(err)
    known = _known_terms(consumer, producers, params, ab, branches) \
        if consumer.op == "sum" and len(branches) == 1 else ()
    got = derive(consumer.op, branches, len(producers), signs, budget, known)
    if isinstance(got, (str, TimedOut)):
        return got
    try:
        return _repair(got, producers, ab, body, branches, signs)
    except Unsupported as err:   # a proved repair that has no IR form
        return f"the derived repair has no IR form: {err}"


def _known_terms(consumer: Reduce, producers: list[Reduce], params: tuple, ab: Abstraction,
                 branches: tuple) -> tuple[tuple[int, sp.Expr], ...]:
    """``(k, term)`` for each producer ``k`` that is a sum reading other producers of the
    consumer (so its state is centred by its own repair), its term in the consumer's
    symbols: what an augmented state may share instead of carrying it again. Only terms
    written in the consumer's own loop operands (no new ``c`` symbol) are offered."""
    mine = set().union(*(b.free_symbols for b in branches))
    out = []
    for k, p in enumerate(producers):
        if p.op != "sum" or len(p.axes) != 1 or len(consumer.axes) != 1:
            continue
        body = substitute(p.body, {p.axes[0]: consumer.axes[0]}) \
            if p.axes[0] is not consumer.axes[0] else p.body
        body = substitute(body, dict(zip(producers, params)))
        if not ab.has_producer(body):
            continue            # plain: its raw sum would undo a centring (variance)
        try:
            term = ab.to_sympy(body)
        except Unsupported:
            continue
        if term.free_symbols <= mine:
            out.append((k, term))
    return tuple(out)


def _repair(got: Inverted | Augmented, producers: list[Reduce], ab: Abstraction,
            body: Expr, branches: tuple, signs: tuple) -> Repair:
    """The proved ``got`` as IR, each symbol replaced by what it stands for."""
    _, rn = producer_symbols(len(producers), signs)
    env: dict[sp.Symbol, Expr] = dict(ab.meaning)
    env.update({s: moved(k) for k, s in enumerate(rn)})
    if isinstance(got, Inverted):
        t = sp.Symbol("t0", real=True)
        env[t] = state(0)
        return Repair("inversion", tuple(producers), (body,), (to_ir(got.h, env),),
                      (branches[0],), (got.h,), env, got.proof)
    ts = [sp.Symbol(f"t{i}", real=True) for i in range(len(got.basis))]
    env.update({s: state(i) for i, s in enumerate(ts)})
    env.update({d: moved(k) - running(k) for k, d in enumerate(deltas(len(producers)))})
    sym_update = tuple(sum(got.matrix[i, j] * ts[j] for j in range(len(ts)))
                       for i in range(len(ts)))
    terms = tuple(to_ir(b, env) for b in got.basis)
    return Repair("augmented", tuple(producers), terms,
                  tuple(to_ir(u, env) for u in sym_update), got.basis, sym_update, env,
                  got.proof, got.shared)
