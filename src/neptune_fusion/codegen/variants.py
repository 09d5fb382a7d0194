"""Loop partition in the tile program: bounds, and the masked and interior loop bodies.

The per-tile body is specialised twice, by pure IR rewrites:

* **interior** tiles (entirely inside every analysable mask constraint and inside the
  axis): each proved conjunct becomes ``True`` and folds away -- no mask arithmetic;
* **boundary** tiles: each tile reduction ``op(body, j)`` becomes
  ``op(where(j < M, body, identity), j)``, then the rules below push the select down to the
  score, where it merges with the user's mask: ``exp2(where(c, s, -inf) - m)`` instead of
  ``where(c, exp2(s - m), 0)``, so one select per tile serves every member.

Skipping tiles is legal only for *gating* conditions: those whose falsity makes every tile
reduction's contribution its identity (checked by folding, :func:`gating`).

The pipeline's stage ``partition`` is :func:`partition_loop`: a lowered program's one loop
becomes these loops (with ``Schedule.partition`` off: one loop over every tile, masked).
"""

from __future__ import annotations

from dataclasses import replace

from ..analysis.masks import Partition, conjuncts, constraint, loop_bounds
from ..errors import CodegenError
from ..ir.fold import RULES, bconst, fconst, fold, is_const
from ..ir.nodes import Binary, Cast, Const, Expr, IndexVar, Load, Reduce, Unary, Where
from ..ir.reducers import reducer
from ..ir.traverse import rewrite, substitute, walk
from ..schedule.schedule import Schedule
from .lower import dot_roles, kernel_sizes
from .program import BLOCK_N, I_FIRST, I_LAST, Segment, StateVar, TileProgram

NINF = -float("inf")
INF = float("inf")


def _loadish(e: Expr) -> bool:
    """A load, a cast of one, or one selected to zero (``where(j < kv_lens, v, 0)``: read
    as a masked load, so it is no computed factor either)."""
    if isinstance(e, Where) and is_const(e.b, 0.0):
        e = e.a
    return isinstance(e, Load) or (isinstance(e, Cast) and isinstance(e.x, Load))


def _push_rules(loop: IndexVar):
    def free(e: Expr) -> bool:
        return loop not in e.free_vars

    def push(e: Expr) -> Expr | None:
        # only selects on the loop index (masks, the guard): they are the ones whose
        # other branch makes a contribution vanish; a select on values (the non-finite
        # guard of a running value) must stay where it is
        if not isinstance(e, Where) or free(e.cond):
            return None
        c, a, b = e.cond, e.a, e.b
        # where(c, exp(x), 0) = exp(where(c, x, -inf))
        if is_const(b, 0.0) and isinstance(a, Unary) and a.op in ("exp", "exp2"):
            return Unary(a.op, Where(c, a.x, fconst(NINF)))
        # where(c, x * y, 0) = where(c, x, 0) * y = x * where(c, y, 0)  (x, y finite): mask
        # the computed factor, not the load (attention's p, not v)
        if is_const(b, 0.0) and isinstance(a, Binary) and a.op == "mul":
            if _loadish(a.b) and not _loadish(a.a):
                return Binary("mul", Where(c, a.a, b), a.b)
            if not _loadish(a.b):
                return Binary("mul", a.a, Where(c, a.b, b))
        # where(c, (x - y) * k, -inf) = where(c, x - y, -inf) * k  (k > 0: exp2's
        # factored difference, which the rule below then masks at x)
        if is_const(b, NINF) and isinstance(a, Binary) and a.op == "mul" and \
                isinstance(a.a, Binary) and a.a.op in ("add", "sub") and \
                isinstance(a.b, Const) and a.b.dtype.is_float and 0.0 < a.b.value < INF:
            return Binary("mul", Where(c, a.a, b), a.b)
        if is_const(b, NINF) and isinstance(a, Binary) and a.op in ("add", "sub"):
            # where(c, x - y, -inf) = where(c, x, -inf) - y   (y finite, free of j)
            if free(a.b) and not free(a.a):
                return Binary(a.op, Where(c, a.a, b), a.b)
            # where(c, y + x, -inf) = y + where(c, x, -inf)
            if a.op == "add" and free(a.a) and not free(a.b):
                return Binary("add", a.a, Where(c, a.b, b))
        # where(c1, where(c2, x, z), z) = where(c1 & c2, x, z)
        if isinstance(a, Where) and a.b is b:
            return Where(Binary("and", c, a.cond), a.a, b)
        return None
    return RULES + (push,)


def tile_reduces(exprs, loop: IndexVar) -> list[Reduce]:
    out: list[Reduce] = []
    for e in exprs:
        for x in walk(e):
            if isinstance(x, Reduce) and x.axes == (loop,) and x not in out:
                out.append(x)
    return out


def gating(cond: Expr, reduces: list[Reduce]) -> bool:
    """Whether ``cond`` false makes every tile reduction contribute its identity."""
    if not reduces:
        return False
    for r in reduces:
        got = fold(substitute(r.body, {cond: bconst(False)}))
        if not (isinstance(got, Const) and got.value == reducer(r.op).identity):
            return False
    return True


def analyse(exprs, row: IndexVar, loop: IndexVar) -> tuple[Partition, dict[Expr, Expr]]:
    """The partition's constraints, and the conjuncts interior tiles may take as true."""
    conds: list[Expr] = []
    for e in exprs:
        for x in walk(e):
            if isinstance(x, Where) and loop in x.cond.free_vars and x.cond not in conds:
                conds.append(x.cond)
    reduces = tile_reduces(exprs, loop)
    gate, exact, proven = [], [], {}
    for c in conds:
        gates = gating(c, reduces)
        for conj in conjuncts(c):
            con = constraint(conj, row, loop)
            if con is None:
                continue
            exact.append(con)
            proven[conj] = bconst(True)
            if gates:
                gate.append(con)
    return Partition(tuple(gate), tuple(exact)), proven


def build_segments(body: tuple[tuple[StateVar, Expr], ...], hints, row: IndexVar,
                   loop: IndexVar, schedule: Schedule):
    """``(bounds, segments, notes)`` of the loop (see module docstring)."""
    exprs = [e for _, e in body]
    extent = loop.extent
    ext = Const(extent, row.dtype) if isinstance(extent, int) else extent
    even = isinstance(extent, int) and extent % schedule.block_n == 0
    rules = _push_rules(loop)
    guard = Binary("lt", loop, ext)

    def guarded(x: Expr) -> Expr | None:
        # op(body, j) -> op(where(j < extent, body, identity), j), innermost first
        if isinstance(x, Reduce) and x.axes == (loop,) and not even:
            return Reduce(x.op, Where(guard, x.body, fconst(reducer(x.op).identity)), x.axes)
        return None

    def masked(e: Expr) -> Expr:
        return fold(rewrite(e, guarded), rules)

    def segment(lo: str, hi: str, fn, is_masked: bool, tail: bool = False) -> Segment:
        return Segment(lo, hi, is_masked, tuple((s, fn(e)) for s, e in body),
                       tuple((fn(k), n) for k, n in hints), guard=is_masked and not even,
                       tail=tail)

    if not schedule.partition:
        bounds = (("lo", Const(0, row.dtype)), ("hi", ext))
        return bounds, (segment("lo", "hi", masked, True),), ()
    part, proven = analyse([fold(e) for e in exprs], row, loop)   # ~c, c & True: canonical

    def interior(e: Expr) -> Expr:
        return fold(substitute(e, proven))

    named = loop_bounds(part, I_FIRST, I_LAST, ext, BLOCK_N)
    segs = []
    if part.has_lower:
        segs.append(segment("lo", "full_lo", masked, True))
    segs.append(segment("full_lo" if part.has_lower else "lo", "full_hi", interior, False))
    upper = any(c.upper for c in part.exact)
    if not even or upper:   # with no upper bound but the length's: the ragged tail
        segs.append(segment("full_hi", "hi", masked, True, tail=not upper))
    used = [n for n in ("lo", "hi", "full_lo", "full_hi")
            if any(n in (s.lo, s.hi) for s in segs)]
    notes = (f"loop partition: {len(part.gating)} gating and {len(part.exact)} interior "
             f"constraint(s); {len(segs)} loop(s), interior tiles unmasked",)
    return tuple((n, named[n]) for n in used), tuple(segs), notes


def partition_loop(prog: TileProgram) -> TileProgram:
    """Stage ``partition``: the one loop of a lowered ``prog`` -- one per phase -- as the
    bounds and loops of :func:`build_segments`; the kernel's sizes now include those its
    bounds use. A later phase's bound equal to an earlier one is that one (same name);
    one that differs is named with the phase (``hi_1``)."""
    if len(prog.segments) != prog.phases or any(s.masked for s in prog.segments):
        raise CodegenError(f"{prog.name}: the loop is partitioned once, after lowering "
                           "(one loop over every tile per phase, no masks yet)")
    bounds: list[tuple[str, Expr]] = []
    segments: list[Segment] = []
    notes: list[str] = []
    for whole in prog.segments:
        got, segs, said = build_segments(whole.body, whole.hints, prog.row.var,
                                         prog.loop.var, prog.schedule)
        rename = {}
        for n, e in got:
            same = next((m for m, f in bounds if f == e), None)
            if same is None:
                same = n if whole.phase == 0 else f"{n}_{whole.phase}"
                bounds.append((same, e))
            rename[n] = same
        segments += [replace(s, lo=rename[s.lo], hi=rename[s.hi], phase=whole.phase)
                     for s in segs]
        notes += [f"phase {whole.phase}: {x}" if prog.phases > 1 else x for x in said]
    exprs = [e for whole in prog.segments for _, e in whole.body] + \
        [o.body for o in prog.outputs]
    sizes = kernel_sizes([a.tensor for a in prog.inputs], prog.outputs,
                         exprs + [e for _, e in bounds])
    mode = one_tile(prog)
    if mode:
        notes.append("one tile covers the row: " + (
            "no loop, the tile is loaded once" if mode == "static" else
            f"when {prog.loop.name}'s extent <= BLOCK_N (at run time), no loop and the tile "
            "is loaded once; else the loops"))
    return replace(prog, bounds=tuple(bounds), segments=tuple(segments), sizes=sizes,
                   rules=prog.rules + tuple(notes), one_tile=mode)


def one_tile(prog: TileProgram) -> str:
    """How a row reduction (no ``tl.dot``) runs when one loop tile covers the loop axis
    (a *persistent* schedule; :attr:`TileProgram.one_tile`): ``"static"`` when the extent
    is static and at most ``BLOCK_N``; ``"runtime"`` when it is symbolic (the launch sets
    the constexpr ``ONE_TILE`` from the length, so only the branch taken is compiled);
    else ``""``. The one tile reads its input once -- where the kernel reads it again
    after the first loop (a later phase, softmax's epilogue) that saves a pass -- starts
    from the empty state (no repairs) and, when the length is exactly BLOCK_N, has no
    masks on the loop axis."""
    if dot_roles(prog):
        return ""
    ext = prog.loop.extent
    if isinstance(ext, int):
        return "static" if ext <= prog.schedule.block_n else ""
    return "runtime"
