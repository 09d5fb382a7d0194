"""From a fusion plan to a tile program: the rolling update as data (stage ``lower``).

    plan -> roles of the axes -> accumulators (members on the loop variable j)
         -> per-tile state updates (IR) -> TileProgram: one loop over every tile

The per-tile update is exactly the fused reference's algorithm
(:class:`neptune_fusion.fusion.reference.GroupRunner`): for each member in order, the
producers' new running values (an empty max's ``-inf`` read as 0), the tile's partial
of each term at those values, and the old state repaired to them and merged. The state
starts at the reducers' identities with the producers' values at theirs (``-inf`` for a
max), which makes the first repair vanish (checked, see :func:`_vanishes`). The outputs
read the final state settled (:mod:`.settle`).

A plan that is not single-pass but a chain of groups over one reduction axis of one row
(:func:`phase_groups`) is lowered the same way, group ``k`` as *phase* ``k``: one loop per
phase, run one after the other, a later phase's terms reading the earlier reductions'
final state.

The next stages of the pipeline (:mod:`neptune_fusion.runtime.pipeline`) rewrite this
program: :func:`~.exp2.apply_exp2` (exp -> exp2) re-derives the per-tile body from the
rewritten accumulators with :func:`rederive`, and :func:`~.variants.partition_loop` splits
the one loop into masked boundary and unmasked interior loops.
"""

from __future__ import annotations

import re
from dataclasses import replace

from ..algebra.synth import moved, running, state
from ..errors import CodegenError, ScheduleError, UnschedulableError
from ..fusion.plan import FusedGroup, FusionPlan
from ..fusion.stages import rows_apart
from ..ir.dtypes import float32
from ..ir.fold import fconst, fold
from ..ir.graph import placeholders
from ..ir.nodes import (
    Binary,
    Const,
    Expr,
    IndexVar,
    Load,
    Param,
    Placeholder,
    Reduce,
    Size,
    Where,
    fresh_uid,
)
from ..ir.pow2 import TILE_MIN, tile_extent
from ..ir.reducers import combined_with, reducer, running_expr, safe_expr
from ..ir.traverse import substitute, walk
from ..schedule.schedule import Schedule
from .patterns import match_contraction
from .program import (
    LOOP_LO,
    TILE_END,
    TILE_START,
    Accumulator,
    Axis,
    Output,
    Segment,
    StateVar,
    TensorArg,
    TileProgram,
    extent_expr,
)
from .settle import settle, settle_output
from .triton_ops import REDUCE_OPS


def ident(name: str, taken: set[str]) -> str:
    """A fresh Python identifier made from ``name``."""
    base = re.sub(r"\W", "_", name.replace("'", "_p")) or "t"
    if base[0].isdigit():
        base = "_" + base
    out, k = base, 1
    while out in taken:
        k += 1
        out = f"{base}{k}"
    taken.add(out)
    return out


# ------------------------------------------------------------------------ the plan


def check_single_pass(plan: FusionPlan) -> None:
    """Raise the error :func:`lower` would for a plan that is not one fused loop."""
    _the_group(plan)


def check_phased(plan: FusionPlan) -> None:
    """Raise the error :func:`lower` would for a plan it cannot lower into one kernel:
    neither one fused loop nor a chain of phases (:func:`phase_groups`)."""
    phase_groups(plan)


def phase_groups(plan: FusionPlan) -> tuple[FusedGroup, ...]:
    """The fused groups of ``plan``, one per phase of one tile program, in order.

    A single-pass plan is one phase (its one group). A plan that is not single-pass is
    lowered as *phases* when its groups form a chain over one reduction axis of one row:
    each group reduces over one axis, all of the same extent, every member depends only
    on the program's spatial axes (its state is per row), they block over one row axis,
    which every output has, and a column some state carries is static and reached through
    a contraction (attention's head dim in ``sum_j p * v[j, e]``). Phase ``k``'s loop
    runs after phase ``k - 1``'s and its terms read the earlier reductions' final values.
    Otherwise :class:`UnschedulableError` says why (the pipeline then runs one kernel per
    pass).
    """
    if plan.single_pass:
        return (_the_group(plan),)
    u = plan.unfused[0]
    head = (f"schedule strategy 'rolling': the plan is not single-pass ({u.consumer} reads "
            f"the final {u.producer}: {u.reason}) and its passes are not phases of one "
            "kernel: ")
    why = _not_phases(plan)
    if why is not None:
        raise UnschedulableError(head + why)
    return plan.groups


def _not_phases(plan: FusionPlan) -> str | None:
    """Why the groups of ``plan`` are not the phases of one tile program (None: they are)."""
    groups = plan.groups
    for g in groups:
        if len(g.axes) != 1:
            return f"group {g.index} reduces over {len(g.axes)} axes at once"
    ext0 = groups[0].axes[0].extent
    for g in groups[1:]:
        ext = g.axes[0].extent
        if not (ext is ext0 or (isinstance(ext, int) and ext == ext0)):
            return (f"group {g.index} reduces over {g.axes[0].name} of extent {ext}, group "
                    f"0 over {groups[0].axes[0].name} of extent {ext0} (different axes)")
    context = set(plan.context)
    for g in groups:
        for m in g.members:
            other = m.node.free_vars - context
            if other:
                return (f"{m.name} depends on {', '.join(sorted(v.name for v in other))}, "
                        "not a spatial axis (it is read at other rows)")
            for p in m.producers:
                if p.op not in ("max", "min", "sum"):
                    return f"{m.name} reads the running {p.op} {plan.name(p)}"
    loop = IndexVar(groups[0].axes[0].name, ext0, "reduce", fresh_uid())

    def bodies(gs):
        return [substitute(m.node.body, {m.node.axes[0]: loop}) for g in gs for m in g.members]
    try:
        _, row, col = _roles(plan, bodies(groups), loop)
    except CodegenError as err:
        return str(err)
    wide = [m for g in groups for m in g.members if col is not None
            and col in m.node.free_vars and not isinstance(col.extent, int)]
    if wide:
        # attention's head dim is a static column; a symbolic one is rows of their own
        return (f"{wide[0].name} is per {row.name} and {col.name}, the chain per {row.name} "
                f"(different rows: a column of symbolic extent {col.extent} is not held "
                "in registers)")
    roles = {row: "row", loop: "loop", col: "col"}

    def spans(e: Expr) -> frozenset[str]:
        got = {roles[v] for v in e.free_vars if v in roles}
        return frozenset(got - ({roles[a] for a in e.axes if a in roles}
                                if isinstance(e, Reduce) else set()))
    for g in groups:
        for m in g.members:
            if col is None or col not in m.node.free_vars:
                continue
            r = Reduce(m.node.op, substitute(m.node.body, {m.node.axes[0]: loop}), (loop,))
            if match_contraction(r, roles.get, spans) is None:
                # its terms span rows, the loop and the column: no tile holds them
                return (f"{m.name} is per {row.name} and {col.name} and not a contraction "
                        f"over {loop.name} (different rows: {col.name} is not a column of "
                        "the chain)")
    for o, axes in zip(plan.outputs, plan.out_axes):
        if row not in axes:
            return f"output {o.name} does not have the row axis {row.name}"
    return None


def _the_group(plan: FusionPlan) -> FusedGroup:
    if not plan.single_pass:
        u = plan.unfused[0]
        raise UnschedulableError(
            f"schedule strategy 'rolling': the plan is not single-pass ({u.consumer} reads "
            f"the final {u.producer}: {u.reason}); the rolling kernel needs one fused loop")
    if len(plan.groups) != 1:
        raise UnschedulableError(
            f"schedule strategy 'rolling': the plan has {len(plan.groups)} fused groups; the "
            "rolling kernel lowers one group (one loop over one reduction axis)")
    g = plan.groups[0]
    apart = rows_apart(plan)
    if apart is not None:
        raise UnschedulableError(f"schedule strategy 'rolling': {apart}; the kernels block "
                                 "over rows, so it runs as a pass of its own")
    if len(g.axes) != 1:
        raise CodegenError(
            f"group 0 ({', '.join(m.name for m in g.members)}) reduces over {len(g.axes)} "
            f"axes at once ({', '.join(a.name for a in g.axes)}); one is supported (a "
            "multi-axis reduction is not lowered, in one pass or several)")
    for m in g.members:
        for p in m.producers:
            if p.op not in ("max", "min", "sum"):
                raise CodegenError(
                    f"{m.name} reads the running {p.op} {plan.name(p)}; the rolling kernel "
                    "supports max, min and sum producers")
    return g


def _roles(plan: FusionPlan, bodies: list[Expr], loop: IndexVar):
    """Row: the innermost axis every member depends on (states are per row); with a
    column only some members depend on, the innermost such axis no load along the loop
    reads (:func:`_streamed_axes`). Column: the one axis only some members depend on
    (attention's ``e``: ``o_sum`` but not ``m``), or else an output axis no member reads
    (softmax's ``j``; one of extent 1 last), or else -- a plain matmul -- the right
    operand's axis (:func:`_right_operand_axis`), preferring the pair whose
    column is an output's contiguous last axis. Grid: the rest."""
    frees = [b.free_vars - {loop} for b in bodies]
    common = frozenset.intersection(*frees)
    union = frozenset.union(*frees)
    out_vars = {v for axes in plan.out_axes for v in axes}
    row = next((v for v in plan.context if v in common), None)
    if row is None:
        raise CodegenError("the fused reductions share no spatial axis to block over; the "
                           "rolling kernel needs a row axis every member depends on")
    partial = [v for v in plan.context if v in union - common]
    if len(partial) > 1:
        raise CodegenError(
            f"members depend on different axes "
            f"({', '.join(f'{v.name} < {v.extent}' for v in partial)}: outputs over "
            "columns of their own, such as projections to q and to k); the rolling "
            "kernel holds one column axis")
    if partial:   # attention's value column: the row is the query axis (_streamed_axes)
        streamed = _streamed_axes(bodies, loop, plan.context)
        row = next((v for v in plan.context if v in common and v not in streamed), row)
    # an output axis of extent 1 (a keepdim statistic's, beside the row's outputs) is
    # no column: taken as one, the row's own column became a scalar loop around the
    # epilogue, one element a step (a training forward's softmax ran 40x slower)
    alone = [v for v in plan.context if v in out_vars and v not in union]
    col = partial[0] if partial else next((v for v in alone if v.extent != 1),
                                          alone[0] if alone else None)
    if col is None:     # a plain matmul: rows and columns of the output, both shared
        pairs = [(r, c) for r in plan.context if r in common
                 for c in [_right_operand_axis(bodies, loop, r, common)] if c is not None]
        last = {axes[-1] for axes in plan.out_axes if axes}
        row, col = next((p for p in pairs if p[1] in last), pairs[0] if pairs else (row, None))
    grid = tuple(v for v in plan.context if v is not row and v is not col)
    return grid, row, col


def _streamed_axes(bodies: list[Expr], loop: IndexVar, context) -> frozenset:
    """The context axes the loop's contraction operand reads: a load along the loop axis
    that also reads an axis of its own (attention's keys ``k[b, h, j, c]``: ``b`` and
    ``h``; a mask ``m[i, j]`` reads no axis of its own and does not count). The row is
    preferably none of them -- the query axis ``s``, which no key depends on -- whatever
    the order of the output's axes: an output laid out ``(s, b, h, d)`` (attention
    written into its heads' merged layout for the output projection) still has ``s`` as
    its row."""
    context = frozenset(context)
    found: set = set()
    for b in bodies:
        for node in walk(b):
            if isinstance(node, Load):
                used = frozenset().union(*(e.free_vars for e in node.indices))
                if loop in used and used - context - {loop}:
                    found |= used & context
    return frozenset(found)


def _epilogue_axes(grid: tuple, bodies: list[Expr], col) -> tuple[tuple, tuple]:
    """``(grid, epi)``: the grid axes no reduction reads (output axes of the epilogue
    alone, beside its column ``col``) move to ``epi``, scalar loops around the epilogue;
    a grid axis would run the reductions again in each of its programs. An axis of extent
    1 (a batch of one, read as index 0) stays on the grid: it costs nothing there."""
    if col is None:
        return grid, ()
    read = frozenset().union(*(b.free_vars for b in bodies))
    epi = tuple(v for v in grid if v not in read and v.extent != 1)
    return tuple(v for v in grid if v not in epi), epi


def _right_operand_axis(bodies: list[Expr], loop: IndexVar, row: IndexVar, common):
    """A plain matmul's output-column axis: a shared axis that indexes some load together
    with the loop axis (``W[c, o]``) and never a load with the row axis (``x[i, c]``). As
    the column (not a grid axis: a program per column) it makes the sum a ``tl.dot``."""
    with_row: set = set()
    with_loop: set = set()
    for b in bodies:
        for x in walk(b):
            if isinstance(x, Load):
                used = {v for idx in x.indices for v in idx.free_vars}
                if row in used:
                    with_row |= used
                if loop in used:
                    with_loop |= used
    return next((v for v in common if v is not row and v in with_loop - with_row), None)


def _inner_axes(bodies: list[Expr], loop: IndexVar, taken: set[str]) -> tuple[Axis, ...]:
    out: list[Axis] = []
    for b in bodies:
        for x in walk(b):
            if isinstance(x, Reduce):
                for a in x.axes:
                    if a is not loop and all(a is not o.var for o in out):
                        size = tile_extent(a.extent) if isinstance(a.extent, int) else None
                        out.append(Axis(a, "inner", ident(f"BLOCK_{a.name.upper()}", taken),
                                        size))
    return tuple(out)


def _sizes(tensors, exprs) -> tuple[Size, ...]:
    found: list[Size] = []
    for t in tensors:
        for s in t.shape:
            if isinstance(s, Size) and s not in found:
                found.append(s)
    for e in exprs:
        for x in walk(e):
            extents = [x] if isinstance(x, Size) else \
                [x.extent] if isinstance(x, IndexVar) else []
            for s in extents:
                if isinstance(s, Size) and s not in found:
                    found.append(s)
    return tuple(found)


# -------------------------------------------------------------------- accumulators


def _accumulators(plan, groups, loop, grid, row, col, taken):
    """The accumulators of every group, group ``k`` in phase ``k``; a member's terms read
    the reductions of earlier phases as their final state (``finals``), settled
    (:mod:`.settle`)."""
    index: dict[int, int] = {}
    accs: list[Accumulator] = []
    finals: dict = {}
    members = {m.node for g in groups for m in g.members}
    for phase, g in enumerate(groups):
        for m in g.members:
            acc = _accumulator(plan, m, loop, grid, row, col, taken, index, finals, phase)
            left = [x for t in acc.terms + acc.updates for x in walk(t) if x in members]
            if left:
                raise CodegenError(f"{m.name} reads {plan.name(left[0])} other than at its "
                                   "own rows; a phase reads an earlier one's final value")
            index[id(m.node)] = len(accs)
            accs.append(acc)
        finals.update({m.node: settle(accs, index[id(m.node)], loop.extent)
                       for m in g.members})
    return tuple(accs)


def _accumulator(plan, m, loop, grid, row, col, taken, index, finals, phase):
    """One member as an :class:`Accumulator` of ``phase``."""
    ren = {m.node.axes[0]: loop}
    allowed = set(grid) | {row} | ({col} if col is not None else set())
    extra = m.node.free_vars - allowed
    if extra:
        raise CodegenError(f"{m.name} depends on {', '.join(v.name for v in extra)}, "
                           "which is neither a grid, row nor column axis")
    roles = ("row",) + (("col",) if col is not None and col in m.node.free_vars else ())
    if m.repair is None:
        op, prods, updates = m.node.op, (), ()
        terms = (substitute(substitute(m.node.body, finals), ren),)
    else:
        op = combined_with(m.node.op, m.repair.method)
        prods = tuple(index[id(p)] for p in m.repair.producers)
        terms = tuple(substitute(substitute(t, finals), ren) for t in m.repair.terms)
        updates = tuple(substitute(u, finals) for u in m.repair.update)
    if op not in REDUCE_OPS:
        raise CodegenError(f"{m.name}: reducer {op} is not lowered "
                           f"({', '.join(REDUCE_OPS)} are)")
    svars = tuple(StateVar(n, Param(f"state:{n}", float32), roles, reducer(op).identity)
                  for n in (ident(s, taken) for s in m.state_names[:len(terms)]))
    shared = tuple((i, prods[k]) for i, k in m.repair.shared) if m.repair else ()
    return Accumulator(m.name, op, prods, terms, updates, svars, phase=phase, shared=shared)


def _vanishes(accs: tuple[Accumulator, ...], a: Accumulator, i: int) -> bool:
    """Whether update ``i`` of ``a`` leaves the empty state alone: with the state at the
    identities and the producers at theirs, it gives the identity back for any new
    producer value (FlashAttention's ``0 * exp(-inf - m') = 0``)."""
    env = {state(n): fconst(s.init) for n, s in enumerate(a.state)}
    env.update({running(n): fconst(reducer(accs[p].op).identity)
                for n, p in enumerate(a.producers)})
    for probe in (-1e4, -1.0, 0.0, 2.5, 1e4):
        env.update({moved(n): fconst(probe) for n in range(len(a.producers))})
        got = fold(substitute(a.updates[i], env))
        if not (isinstance(got, Const) and got.value == a.state[i].init):
            return False
    return True


def _running(acc: Accumulator, value: Expr, end: Expr, loop: IndexVar) -> Expr:
    """A producer's running value from its state ``value`` covering ``[0, end)`` (the
    reducer table's rule; ``end`` is positive at a tile's end)."""
    return running_expr(acc.op, value, end, extent_expr(loop.extent), end is TILE_END)


def _steps(accs: tuple[Accumulator, ...], loop: IndexVar, phase: int = 0):
    """The new value of every state variable of ``phase`` after one of its tiles, and
    readable names."""
    new: dict[int, list[Expr]] = {}
    hints: list[tuple[Expr, str]] = []
    for k, a in enumerate(accs):
        if a.phase != phase:
            continue
        olds = [s.param for s in a.state]
        shared = dict(_shared(accs, a))   # component -> the producer whose state it is
        if not a.producers:
            parts = [Reduce(a.op, a.terms[0], (loop,))]
            comps = [Binary(reducer(a.op).combine, olds[0], parts[0])]
        else:
            if any(p >= k for p in a.producers):
                raise CodegenError(f"{a.name} is listed before its producers")
            run_new = {n: safe_expr(accs[p].op, _running(accs[p], new[p][0], TILE_END, loop))
                       for n, p in enumerate(a.producers)}
            for n, p in enumerate(a.producers):
                hints.append((run_new[n], f"{accs[p].state[0].name}_run"))
            env_t = {running(n): r for n, r in run_new.items()}
            env_u = {state(i): o for i, o in enumerate(olds)}
            env_u.update({running(n): _running(accs[p], accs[p].state[0].param, TILE_START,
                                               loop)
                          for n, p in enumerate(a.producers)})
            env_u.update({moved(n): r for n, r in run_new.items()})
            parts = [Reduce(a.op, substitute(t, env_t), (loop,)) for t in a.terms]
            ups = [fold(substitute(u, env_u)) for u in a.updates]
            # a repair that does not vanish on the empty state is skipped on the first tile
            ups = [u if _vanishes(accs, a, i) else
                   Where(Binary("eq", TILE_START, LOOP_LO), fconst(a.state[i].init), u)
                   for i, u in enumerate(ups)]
            for u, o in zip(ups, olds):
                if isinstance(u, Binary) and u.op == "mul" and (u.a is o or u.b is o):
                    hints.append((u.b if u.a is o else u.a, "alpha"))
            comps = [Binary(reducer(a.op).combine, u, p) for u, p in zip(ups, parts)]
            for i, p in shared.items():   # the producer's own state: no tile for it
                comps[i] = new[p][0]
        new[k] = [fold(c) for c in comps]
        for s, c, p in ((a.state[n], new[k][n], parts[n]) for n in range(len(a.state))
                        if n not in shared):
            hints.append((c, f"{s.name}_new"))
            hints.append((p, f"{s.name}_tile"))
    body = tuple((s, new[k][i]) for k, a in enumerate(accs) if a.phase == phase
                 for i, s in enumerate(a.state))
    return body, hints


def _shared(accs: tuple[Accumulator, ...], a: Accumulator) -> list[tuple[int, int]]:
    """``a``'s components that take a producer's state: those whose producer keeps it in
    ``a``'s phase, with ``a``'s reducer and unscaled (otherwise the component is reduced
    as any other, which is always correct)."""
    return [(i, p) for i, p in a.shared
            if accs[p].phase == a.phase and accs[p].op == a.op and accs[p].scaled == 1.0]


def _loops(accs: tuple[Accumulator, ...], loop: IndexVar) -> tuple[Segment, ...]:
    """One loop over every tile per phase, without masks."""
    out = []
    for k in range(1 + max(a.phase for a in accs)):
        body, hints = _steps(accs, loop, k)
        out.append(Segment("lo", "hi", False, body, tuple(hints), phase=k))
    return tuple(out)


def lower(plan: FusionPlan, inputs: list[Placeholder], schedule: Schedule,
          name: str = "fused_kernel") -> TileProgram:
    """Stage ``lower``: the tile program of ``plan`` under ``schedule`` (see module
    docstring), before the speed rules and the loop partition: one loop over every tile
    of the loop axis, its body without boundary masks (``partition_loop`` adds them)."""
    schedule.check()
    groups = phase_groups(plan)
    axis0 = groups[0].axes[0]
    loop = IndexVar(axis0.name, axis0.extent, "reduce", fresh_uid())
    bodies = [substitute(m.node.body, {m.node.axes[0]: loop})
              for g in groups for m in g.members]
    grid, row, col = _roles(plan, bodies, loop)
    grid, epi = _epilogue_axes(grid, bodies, col)
    taken = {"INTERPRET", "BLOCK_M", "BLOCK_N", "tl", "triton", "pid_row", "pid_grid"}
    taken |= {v.name for v in plan.context} | {loop.name}
    needed = placeholders(list(plan.outputs))
    missing = [p.name for p in needed if p not in inputs]
    if missing:
        raise CodegenError(f"the outputs read {', '.join(missing)}, not among the inputs")
    ins = tuple(TensorArg(ident(p.name, taken), p, "input") for p in inputs)
    accs = _accumulators(plan, groups, loop, grid, row, col, taken)
    finals = {m.node: a.state[0].param
              for m, a in zip([m for g in groups for m in g.members], accs)}
    outs = []
    for o, body, axes in zip(plan.outputs, plan.bodies, plan.out_axes):
        if row not in axes:
            raise CodegenError(f"output {o.name} does not have the row axis {row.name}")
        read = settle_output(substitute(body, finals), accs, loop.extent)
        outs.append(Output(TensorArg(ident(o.name, taken), o, "output"), axes, fold(read)))
    outs = tuple(outs)
    segments = _loops(accs, loop)
    exprs = [e for seg in segments for _, e in seg.body] + [o.body for o in outs]
    inner = _inner_axes(exprs, loop, taken)
    col_axis = _col_axis(col, accs, outs, schedule, taken)
    ext = Const(loop.extent, row.dtype) if isinstance(loop.extent, int) else loop.extent
    grid_axes, row_axis, col_axis, loop_axis, inner = _named_apart(
        tuple(Axis(v, "grid") for v in grid + epi),
        Axis(row, "row", "BLOCK_M", schedule.block_m),
        col_axis, Axis(loop, "loop", "BLOCK_N", schedule.block_n), inner)
    grid_axes, epi_axes = grid_axes[:len(grid)], grid_axes[len(grid):]
    return check_tiles(TileProgram(
        name=name, inputs=ins, outputs=outs, sizes=kernel_sizes(inputs, outs, exprs),
        grid=grid_axes, row=row_axis, col=col_axis, loop=loop_axis,
        inner=inner, accumulators=accs, epi=epi_axes,
        bounds=(("lo", Const(0, row.dtype)), ("hi", ext)),
        segments=segments, schedule=schedule,
        rules=(f"phases: {len(groups)} loops over {loop.name}, one per pass of the plan",)
        if len(groups) > 1 else ()))


EPILOGUE_CHUNK = 2048  # columns per epilogue step when the column carries no state


def _named_apart(grid: tuple, row: Axis, col: Axis | None, loop: Axis, inner: tuple):
    """The axes with distinct identifiers: a later axis whose variable shares its name
    with an earlier, different variable (a derived program's ``c`` as a row and as a
    contraction) is named ``c_2``, ... (the source names offsets ``offs_<name>``).

    Before: row ``c`` (d_k's head dim), inner ``c`` (q . k)  ->  ``offs_c`` twice.
    After:  row ``c``, inner ``c_2``."""
    seen: dict[str, IndexVar] = {}

    def apart(a: Axis | None) -> Axis | None:
        if a is None:
            return None
        name, k = a.var.name, 2
        if seen.get(name, a.var) is a.var:
            seen[name] = a.var
            return a
        while f"{a.var.name}_{k}" in seen:
            k += 1
        name = f"{a.var.name}_{k}"
        seen[name] = a.var
        return replace(a, ident=name)
    grid = tuple(apart(a) for a in grid)
    row, loop = apart(row), apart(loop)
    col = apart(col)
    return grid, row, col, loop, tuple(apart(a) for a in inner)


def _col_axis(col: IndexVar | None, accs, outs, schedule: Schedule,
              taken: set[str]) -> Axis | None:
    """The column axis: one tile per program (attention's head dim); walked in chunks by
    the epilogue when no carried state holds it (softmax's output row); or, with
    ``schedule.block_col``, tiled across programs (a matmul epilogue's output columns)
    where that is legal -- the state holds the column and every output has it; elsewhere
    ``block_col`` has no effect (a multi-pass kernel shares one schedule over passes
    with and without a column)."""
    if col is None:
        return None
    block = ident(f"BLOCK_{col.name.upper()}", taken)
    size = tile_extent(col.extent) if isinstance(col.extent, int) else None
    stateless = not any("col" in s.roles for a in accs for s in a.state)
    tiled = schedule.block_col and not stateless and \
        all(any(v is col for v in o.axes) for o in outs)
    if tiled and (size is None or schedule.block_col < size):
        return Axis(col, "col", block, schedule.block_col, programs=True)
    chunk = EPILOGUE_CHUNK if stateless else None
    if size is not None and chunk is not None:
        size = min(size, chunk)
    return Axis(col, "col", block, size, chunk)


def dot_roles(prog: TileProgram) -> frozenset[str]:
    """The tile axes (roles) of ``prog`` that feed a ``tl.dot``: both sides and the
    contracted axis of every reduction that lowers to one (attention: row, inner, loop
    and col); empty for a row reduction (softmax, log-sum-exp, variance)."""
    roles_of = {a.var: a.role for a in prog.axes if a.role != "grid"}
    state = {s.param: frozenset(s.roles) for s in prog.state}
    memo: dict[Expr, frozenset[str]] = {}

    def roles(e: Expr) -> frozenset[str]:
        got = memo.get(e)
        if got is None:
            if isinstance(e, Param):
                got = state.get(e, frozenset())
            elif isinstance(e, IndexVar):
                got = frozenset((roles_of[e],)) if e in roles_of else frozenset()
            else:
                got = frozenset().union(*(roles(c) for c in e.children()))
                if isinstance(e, Reduce):
                    got -= {roles_of.get(a) for a in e.axes}
            memo[e] = got
        return got

    exprs = [e for seg in prog.segments for _, e in seg.body] + [o.body for o in prog.outputs]
    out: set[str] = set()
    for e in exprs:
        for x in walk(e):
            if isinstance(x, Reduce):
                c = match_contraction(x, roles_of.get, roles)
                if c is not None:
                    out |= {c.x, c.y, roles_of[c.k]}
    return frozenset(out)


def check_tiles(prog: TileProgram) -> TileProgram:
    """Raise :class:`ScheduleError` naming the schedule field when a tile axis that feeds
    ``tl.dot`` is tiled below its 16-element minimum; return ``prog``. Axes no
    contraction reads may be tiled down to 1 (one row per program)."""
    dots = dot_roles(prog)
    tiles = [("block_m", prog.row), ("block_n", prog.loop)]
    if prog.col is not None and prog.col.programs:
        tiles.append(("block_col", prog.col))
    for field, axis in tiles:
        size = getattr(prog.schedule, field)
        if axis.role in dots and size < TILE_MIN:
            raise ScheduleError(
                f"schedule: {field}={size} is below {TILE_MIN}, the smallest tl.dot tile: "
                f"{prog.name} contracts over its {axis.role} axis {axis.name} with tl.dot "
                f"(a program without a contraction may use tiles down to 1)")
    return prog


def rederive(prog: TileProgram, accs: tuple[Accumulator, ...],
             outputs: tuple[Output, ...]) -> TileProgram:
    """A lowered ``prog`` (one loop per phase) with new accumulators and outputs -- a
    rewrite of the update templates such as exp -> exp2 -- and its per-tile bodies derived
    from them."""
    if len(prog.segments) != prog.phases or any(s.masked for s in prog.segments):
        raise CodegenError(f"{prog.name}: the per-tile body is re-derived only before the "
                           "loop partition (one loop over every tile per phase)")
    return replace(prog, accumulators=accs, outputs=outputs,
                   segments=_loops(accs, prog.loop.var))


def kernel_sizes(inputs, outputs: tuple[Output, ...], exprs) -> tuple[Size, ...]:
    """The symbolic sizes a kernel takes as int arguments: those of the input placeholders'
    shapes, then any the outputs and ``exprs`` use, which must be among the former."""
    sizes = _sizes([p for p in inputs] + [o.arg.tensor for o in outputs], exprs)
    unbound = [s.name for s in sizes
               if not any(s is d for p in inputs for d in p.shape)]
    if unbound:
        raise CodegenError(f"size(s) {', '.join(unbound)} are not the shape of any input")
    return sizes
