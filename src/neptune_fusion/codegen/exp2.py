"""Speed rule: ``exp`` -> ``exp2`` with ``log2(e)`` folded into the scale.

``exp(x) = exp2(x * L)`` with ``L = log2(e)``. Pushing the factor ``L`` down the
expression folds it into constants that are there anyway (the softmax scale):
``exp(s * c - m) = exp2(s * (c*L) - m*L)``. A ``max``/``min`` producer ``m`` read by
consumers only as ``m*L`` can then be *kept* in the scaled domain: carry ``m2 = max(s*L)
= L * max(s)`` (``L > 0``), and every ``m*L`` in the consumers becomes ``m2``::

    before:  m' = max(m, max_tile(s));   p = exp(s - m');   alpha = exp(m - m')
    after:   m2' = max(m2, max_tile(s * (c*L)));  p = exp2(s * (c*L) - m2');
             alpha = exp2(m2 - m2')

Legality: after the rewrite, no consumer may read the producer other than through
``m*L`` (checked on the IR: the producer is substituted as ``m2 / L`` and every
occurrence must cancel). Outputs that read the producer's final value get ``m2 / L``,
within an ulp of ``m``; a producer that is itself an output is not scaled, so that
output is the exact maximum.

**Natural maxima.** The scaled form is exact only up to an offset: ``m2 / L`` is ``m``
within an ulp of ``m``, which cancels where outputs read only ratios of the sums or
``m + log l`` (attention, a log-sum-exp), and shows where an output subtracts ``m`` from
the data (log-softmax's ``x - m``: 0.05 off at ``x ~ 1e6``) or reads a sum alone. So a
maximum stays *natural* where an output adds it to a term that reads a tensor, and in
every program without a contraction (bound by memory: the one FMA an element the scaled
form saves buys nothing there). An exponential that reads a natural maximum is
*factored*, ``exp2((x - m) * L)`` (:func:`factored`): ``x - m`` is exact where ``x`` is
near ``m``, as in eager PyTorch, and the one rounding is relative to the difference.

In a phased program the rule applies to every phase's templates; a later phase reads a
producer kept in the scaled domain as ``m2 / L`` (the final value, like an output), which
the rewrite cancels inside an ``exp``.

Equal math is one IR node: every ``exp2`` argument is put in one canonical form
(:func:`canonical_arg`), a sum of terms times constants, positive terms first, so
``exp((s - m) * c)`` and ``exp(s * c - m * c)`` -- or a repair factor's ``exp(-(m' - m))``
and the rescale ``exp(m - m')`` -- become the same node, which the emitter's CSE computes
once per element (or per row).

The rule rewrites the accumulators' templates (:func:`to_exp2`); the pipeline's stage
``exp2`` is :func:`apply_exp2`, which also re-derives the per-tile body from them.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..algebra.synth import moved, running
from ..ir.fold import fconst, fold
from ..ir.nodes import Binary, Cast, Const, Expr, Load, Param, Reduce, Unary, Where
from ..ir.traverse import rewrite, substitute, walk
from .lower import rederive
from .program import Accumulator, Output, TileProgram

LOG2E = 1.0 / math.log(2.0)


def _marked(e: Expr, markers: frozenset) -> bool:
    return any(x in markers for x in walk(e) if isinstance(x, Param))


def scale(e: Expr, k: float, markers: frozenset = frozenset()) -> Expr:
    """``e * k`` for ``k > 0``, with the factor pushed into sums, selects and constants."""
    if isinstance(e, Const) and e.dtype.is_float:
        return fconst(e.value * k)
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        return Binary(e.op, scale(e.a, k, markers), scale(e.b, k, markers))
    if isinstance(e, Unary) and e.op == "neg":
        return Unary("neg", scale(e.x, k, markers))
    if isinstance(e, Where):
        return Where(e.cond, scale(e.a, k, markers), scale(e.b, k, markers))
    if isinstance(e, Cast) and e.dtype.is_float and e.x.dtype.is_float:
        # a float widening or narrowing, as a traced fp16 graph has around its scores
        # (``float(half(s * c)) - float(m)``): the kernels compute every float in
        # float32, so the factor goes inside and still meets the scale and the maximum
        return Cast(scale(e.x, k, markers), e.dtype)
    if isinstance(e, Binary) and e.op == "div" and isinstance(e.b, Const):
        return Binary("mul", e.a, fconst(k / e.b.value))
    if isinstance(e, Binary) and e.op == "mul":
        a, b = e.a, e.b
        if _marked(a, markers) and not _marked(b, markers):
            return Binary("mul", scale(a, k, markers), b)
        if _marked(b, markers) and not _marked(a, markers):
            return Binary("mul", a, scale(b, k, markers))
        if isinstance(a, Const) or (not isinstance(b, Const)
                                    and len(a.free_vars) < len(b.free_vars)):
            return Binary("mul", scale(a, k, markers), b)
        return Binary("mul", a, scale(b, k, markers))
    return Binary("mul", e, fconst(k))


def linear(e: Expr) -> tuple[dict[Expr, float], float]:
    """``e`` as ``sum(c_t * t) + c0``: the coefficient of every term (an expression that is
    not a sum, a negation or a product with a constant) and the constant ``c0``."""
    terms: dict[Expr, float] = {}
    const = [0.0]

    def visit(x: Expr, k: float) -> None:
        if isinstance(x, Const) and x.dtype.is_float:
            const[0] += k * x.value
        elif isinstance(x, Binary) and x.op in ("add", "sub"):
            visit(x.a, k)
            visit(x.b, -k if x.op == "sub" else k)
        elif isinstance(x, Unary) and x.op == "neg":
            visit(x.x, -k)
        elif isinstance(x, Binary) and x.op == "mul" and isinstance(x.b, Const):
            visit(x.a, k * x.b.value)
        elif isinstance(x, Binary) and x.op == "mul" and isinstance(x.a, Const):
            visit(x.b, k * x.a.value)
        elif isinstance(x, Binary) and x.op == "div" and isinstance(x.b, Const) and \
                x.b.value != 0:   # a division by 0 stays a term (a fuzzing find)
            visit(x.a, k / x.b.value)
        else:
            terms[x] = terms.get(x, 0.0) + k
    visit(e, 1.0)
    return terms, const[0]


def canonical_arg(e: Expr) -> Expr:
    """``e`` in the canonical form of an ``exp2`` argument: ``t1 * c1 + t2 * c2 ... + c0``
    with positive coefficients first, then terms over more variables first, then by text;
    a coefficient of 1 is left out, a negative one is a subtraction. ``e`` itself when a
    constant is not finite, a term is not a float or nothing changes."""
    if not e.dtype.is_float:
        return e
    terms, const = linear(e)
    coefs = list(terms.values()) + [const]
    if not all(math.isfinite(c) for c in coefs) or \
            not all(t.dtype.is_float for t in terms):
        return e
    order = sorted(((t, c) for t, c in terms.items() if c != 0.0),
                   key=lambda tc: (tc[1] < 0, -len(tc[0].free_vars), str(tc[0])))
    out: Expr | None = None
    for t, c in order:
        mag = t if abs(c) == 1.0 else Binary("mul", t, fconst(abs(c)))
        if out is None:
            out = mag if c > 0 else Unary("neg", t) if c == -1.0 else \
                Binary("mul", t, fconst(c))
        else:
            out = Binary("add" if c > 0 else "sub", out, mag)
    if out is None:
        return fconst(const)
    if const != 0.0:
        out = Binary("add" if const > 0 else "sub", out, fconst(abs(const)))
    return e if out == e or out.dtype != e.dtype else out


def factored(e: Expr, exact: frozenset) -> Expr:
    """``e * log2(e)`` as ``(x - m) * log2(e)``: the difference with the natural maximum
    ``m`` (a leaf of ``exact``) taken before the product, so that ``x - m`` is exact
    where ``x`` is near ``m`` (Sterbenz) and the one rounding is relative to the
    difference. ``m``'s coefficient ``k`` goes into the factor, ``(x / T - m / T) =
    (x - m) * (1 / T)``; the difference itself is in canonical form
    (:func:`canonical_arg`), so equal math is one node."""
    terms, _ = linear(e)
    ks = [abs(c) for t, c in terms.items() if _bare(t) in exact and c != 0.0]
    k = ks[0] if ks and math.isfinite(ks[0]) else 1.0
    inner = canonical_arg(fold(Binary("mul", e, fconst(1.0 / k))) if k != 1.0 else e)
    return Binary("mul", inner, fconst(k * LOG2E))


def exp_to_exp2(e: Expr, markers: frozenset = frozenset(),
                exact: frozenset = frozenset()) -> Expr:
    """Every ``exp(x)`` in ``e`` as ``exp2(x * log2(e))`` with the factor pushed in, and
    every ``exp2`` argument in its canonical form (:func:`canonical_arg`). An argument
    that reads a leaf of ``exact`` (a maximum kept in its natural domain) is
    :func:`factored` instead: ``exp2((x - m) * log2(e))``."""
    def reads_exact(x: Expr) -> bool:
        return bool(exact) and any(p in exact for p in walk(x)
                                   if isinstance(p, (Param, Load)))

    def fn(x: Expr) -> Expr | None:
        if isinstance(x, Unary) and x.op == "exp":
            if reads_exact(x.x) and not _marked(x.x, markers):
                return Unary("exp2", factored(fold(x.x), exact))
            return Unary("exp2", scale(x.x, LOG2E, markers))
        return None

    def canon(x: Expr) -> Expr | None:
        if isinstance(x, Unary) and x.op == "exp2":
            arg = x.x
            if isinstance(arg, Binary) and arg.op == "mul" and isinstance(arg.b, Const) \
                    and reads_exact(arg.a):   # factored: the difference stays together
                got = canonical_arg(arg.a)
                return None if got is arg.a else Unary("exp2", Binary("mul", got, arg.b))
            got = canonical_arg(arg)
            return None if got is arg else Unary("exp2", got)
        return None
    return rewrite(fold(rewrite(e, fn)), canon)


def _cancelled(e: Expr, markers: frozenset) -> bool:
    """Every marker stands bare: none is left scaled (``m2 / L`` or ``m2 * (1/L)``), which
    is what a read outside an ``exp`` leaves behind."""
    for x in walk(e):
        if isinstance(x, Binary) and x.op in ("mul", "div") and \
                (x.a in markers or x.b in markers):
            return False
    return True


def _consumer(acc: Accumulator, scaled: set[int], natural: set[int],
              exact: frozenset) -> tuple[Accumulator, bool] | None:
    """``acc`` with its exps in base 2, its scaled producers' values in the scaled
    domain and the exps reading its ``natural`` producers (maxima not scaled) or the
    ``exact`` final values factored; the flag says whether every scaled producer
    cancelled."""
    mark: dict[Expr, Expr] = {}
    back: dict[Expr, Expr] = {}
    for n, p in enumerate(acc.producers):
        if p in scaled:
            for leaf in (running(n), moved(n)):
                m = Param(f"__scaled_{leaf.name}", leaf.dtype)
                mark[leaf] = Binary("div", m, fconst(LOG2E))
                back[m] = leaf
        elif p in natural:
            exact = exact | {running(n), moved(n)}
    markers = frozenset(back)
    terms = tuple(exp_to_exp2(substitute(t, mark), markers, exact) for t in acc.terms)
    updates = tuple(exp_to_exp2(substitute(u, mark), markers, exact)
                    for u in acc.updates)
    ok = all(_cancelled(x, markers) for x in terms + updates)
    terms = tuple(substitute(t, back) for t in terms)
    updates = tuple(substitute(u, back) for u in updates)
    return replace(acc, terms=terms, updates=updates), ok


def to_exp2(accs: tuple[Accumulator, ...], outputs: tuple[Output, ...], loop=None
            ) -> tuple[tuple[Accumulator, ...], tuple[Output, ...], tuple[str, ...]]:
    """Apply the rule (see module docstring); returns the notes of what was applied.
    ``loop`` (the loop's index variable): without a contraction, a per-row value read
    from a tensor beside the data in an exponent (a maximum an earlier pass wrote) is
    natural too (:func:`_row_reads`)."""
    candidates = {p for a in accs for p in a.producers if accs[p].op in ("max", "min")}
    # a maximum that is itself an output stays exact: read back from the scaled domain
    # (m2 / log2 e) it is off by an ulp, and a reader comparing it with the input --
    # amax's backward counts the elements equal to it -- finds none (0 / 0: NaN)
    extremes = set(candidates)
    candidates -= {p for p in candidates if any(
        _bare(o.body) == accs[p].state[0].param for o in outputs)}
    # a maximum an output subtracts from (or adds to) a value of the data stays natural:
    # log-softmax's ``x - m`` is exact as in eager PyTorch, where ``x - m2 * ln 2`` is off
    # by an ulp of ``m`` (0.05 at 1e6; a fuzzing find, 2026-12-04)
    exact_reads = {p for p in candidates if any(
        _cancels_data(o.body, accs[p].state[0].param) for o in outputs)}
    candidates -= exact_reads
    # without a contraction the kernel is bound by memory, and the scaled form's one
    # saved operation an element buys nothing; natural, no output can see the offset
    # an ulp of m leaves between m2 / L and m (an output of the sum l alone is off by
    # 2 ** (ulp(m2) / 2): 4 % at m = 1e6)
    rows: frozenset = frozenset()
    if not _contracts(accs):
        exact_reads |= candidates
        candidates = set()
        rows = _row_reads(accs, loop)
    while True:
        # a later phase reads a scaled producer's final value: m2 / L, like an output
        src = _finals_read(accs, _finals(accs, candidates))
        natural = extremes - candidates
        exact = frozenset(accs[p].state[0].param for p in natural) | rows
        new = list(src)
        failed = set()
        for k, a in enumerate(src):
            if a.producers or a.updates:
                got, ok = _consumer(a, candidates, natural, exact)
                new[k] = got
                if not ok:
                    failed |= {p for p in a.producers if p in candidates}
            else:
                new[k] = replace(a, terms=tuple(exp_to_exp2(t, exact=exact)
                                                for t in a.terms))
        if not failed:
            break
        candidates -= failed
    notes = ["exp -> exp2 (log2(e) folded into constants)"]
    notes += [f"{accs[p].name} kept natural: exp2((x - {accs[p].name}) * log2(e))"
              for p in sorted(exact_reads)]
    for p in sorted(candidates):
        a = new[p]
        new[p] = replace(a, terms=tuple(fold(scale(t, LOG2E)) for t in a.terms),
                         scaled=LOG2E)
        notes.append(f"{a.name} kept in the exp2 domain ({a.name} * log2(e))")
    finals = _finals(accs, candidates)
    outs = tuple(replace(o, body=fold(_read_finals(o.body, finals))) for o in outputs)
    return tuple(new), outs, tuple(notes)


def _row_reads(accs: tuple[Accumulator, ...], loop) -> frozenset:
    """The loads free of ``loop`` that an exponent adds to a load of the data (``m`` in
    ``exp(x[i, j] - m[i])``): a maximum a staged program's earlier pass wrote (a
    reduction to one value, read by every row: cross-entropy of one row through the
    backend). Scaled, ``x * log2 e - m * log2 e`` rounds at an ulp of ``x * log2 e``
    (0.02 off at 1e6, where eager is exact to 1e-7: a fuzzing find, 2026-12-04);
    factored, the difference is taken first. A later pass's elementwise output (a
    softmax over every element) runs as a unit loop, which neither load reads."""
    if loop is None:
        return frozenset()
    out = set()
    for a in accs:
        for t in a.terms + a.updates:
            for x in walk(t):
                if not (isinstance(x, Unary) and x.op == "exp"):
                    continue
                terms, _ = linear(x.x)
                bare = [_bare(u) for u, c in terms.items() if c != 0.0]
                free = {u for u in bare if isinstance(u, Load) and loop not in u.free_vars}
                # beside the data: read at the loop index, or another load (the unit
                # loop of a later pass's elementwise output, exp(x[i] - m[0]) / l[0])
                if free and any(loop in u.free_vars or
                                (u not in free and any(isinstance(y, Load) for y in walk(u)))
                                for u in bare) or len(free) > 1:
                    out |= free
    return frozenset(out)


def _contracts(accs: tuple[Accumulator, ...]) -> bool:
    """Whether a term holds a contraction, a sum over an axis of its own of a product of
    two tensors' values (``sum_c q[i, c] * k[j, c]``); an inner reduction of one tensor
    (a row's ``max_k x[i, k]`` under a maximum over rows) is none."""
    def product(e: Expr) -> bool:
        e = _bare(e)
        if not (isinstance(e, Binary) and e.op == "mul"):
            return False
        reads = [{x.tensor for x in walk(f) if isinstance(x, Load)} for f in (e.a, e.b)]
        return all(reads) and reads[0] != reads[1]
    return any(isinstance(x, Reduce) and x.op == "sum" and product(x.body)
               for a in accs for t in a.terms for x in walk(t))


def _cancels_data(body: Expr, param: Param) -> bool:
    """Whether ``body`` adds ``param`` (a maximum's final value) to a term that reads a
    tensor, ``x - m`` or ``m + log(l) - x[t]``: a sum whose result may be far smaller
    than ``m``, so ``m``'s own rounding would show."""
    for node in walk(body):
        if isinstance(node, Binary) and node.op in ("add", "sub") and node.dtype.is_float:
            terms, _ = linear(node)
            if any(_bare(t) == param for t, c in terms.items() if c != 0.0) and any(
                    isinstance(x, Load) for t, c in terms.items()
                    if c != 0.0 and _bare(t) != param for x in walk(t)):
                return True
    return False


def _bare(e: Expr) -> Expr:
    """``e`` without the casts around it."""
    while isinstance(e, Cast):
        e = e.x
    return e


def _finals(accs: tuple[Accumulator, ...], scaled: set[int]) -> dict:
    """The final value of each scaled producer read from its state: ``m2 / log2(e)``."""
    return {accs[p].state[0].param: Binary("div", accs[p].state[0].param, fconst(LOG2E))
            for p in scaled}


def _read_finals(e: Expr, finals: dict) -> Expr:
    """``e`` with the scaled producers' final values ``m2 / L`` substituted; a test of
    one against an infinity reads ``m2`` itself (``m2 / L == -inf`` iff ``m2 == -inf``:
    ``L > 1``, so a finite ``m2`` stays finite), which needs no cancelling: the guards
    of attention's output and of a settled state (``settle.py``) compare ``m`` with
    ``-inf``."""
    scaled = {v: k for k, v in finals.items()}

    def fn(x: Expr) -> Expr | None:
        if isinstance(x, Binary) and x.op in ("eq", "ne") and x.a in scaled \
                and isinstance(x.b, Const) and math.isinf(x.b.value):
            return Binary(x.op, scaled[x.a], x.b)
        return None
    return rewrite(substitute(e, finals), fn) if finals else e


def _finals_read(accs: tuple[Accumulator, ...], finals: dict) -> tuple[Accumulator, ...]:
    """``accs`` with every read of an earlier phase's final state (a phased program)
    through ``finals``; the exps of the result are rewritten as usual, so an
    ``exp(x - m)`` of a later phase becomes ``exp2(x * log2(e) - m2)``."""
    if not finals:
        return accs
    return tuple(a if a.phase == 0 else replace(
        a, terms=tuple(_read_finals(t, finals) for t in a.terms),
        updates=tuple(_read_finals(u, finals) for u in a.updates)) for a in accs)


def apply_exp2(prog: TileProgram) -> TileProgram:
    """Stage ``exp2``: the rule applied to a lowered ``prog`` when its schedule asks for it
    (``Schedule.exp2``), the per-tile body re-derived; else ``prog`` itself."""
    if not prog.schedule.exp2:
        return prog
    if _huge_scores(prog):
        return replace(prog, rules=prog.rules + (
            "exp kept in base e: a dense float bias or a constant beyond +-1e37 reaches "
            "the exponent (x * log2 e overflows past 2.4e38)",))
    accs, outs, notes = to_exp2(prog.accumulators, prog.outputs, prog.loop.var)
    return replace(rederive(prog, accs, outs), rules=prog.rules + notes)


HUGE = 1e37   # |x| * log2(e) overflows float32 from about 2.36e38


def _huge_scores(prog: TileProgram) -> bool:
    """Whether a finite value near float32's limit may reach an exponent: a float constant
    beyond ``HUGE`` (``masked_fill(mask, finfo.min)``) or, in an exponent beside a
    contraction (the scores ``q . k``) or another such tensor, a float tensor read at
    (row, loop) -- a dense additive mask, which transformers fills with ``finfo.min``. In base 2
    ``exp(s - m)`` is ``exp2(s * L - m * L)`` and both products overflow to -inf: a row
    masked everywhere gave NaN or 0 where torch gives a uniform row (a fuzzing find,
    2026-12-04); in base e the difference is taken first. A computed score (``q . k``,
    ALiBi's ``slope[h] * (j - i)``) stays in base 2, and so does a softmax of one input
    (its values are the scores; its maximum is natural, so the difference is taken
    first there too: a row of nothing but ``finfo.min`` gives the uniform row)."""
    pair = {prog.row.var, prog.loop.var}
    for a in prog.accumulators:
        for t in a.terms + a.updates:
            if any(isinstance(x, Const) and x.dtype.is_float and math.isfinite(x.value)
                   and abs(x.value) > HUGE for x in walk(t)):
                return True
            for e in walk(t):
                if not (isinstance(e, Unary) and e.op == "exp"):
                    continue
                arg = list(walk(e.x))
                dense = {x.tensor for x in arg if isinstance(x, Load) and x.dtype.is_float
                         and pair <= set(x.indices)}
                if len(dense) > 1 or (dense and any(isinstance(x, Reduce) for x in arg)):
                    return True
    return False
