"""Split-k: the rolling tile program cut into a partial kernel and a combine kernel.

    rolling TileProgram --partial_program--> loop restricted to chunk ``split_id`` of the
                                             fused axis; epilogue stores every state
                                             variable to the fp32 workspace
                        --combine_program--> per output point, one loop over the splits
                                             per level of the chain: producers merged
                                             first, then each split's consumer state
                                             repaired to the merged producer value
                                             (``update`` IR) and combined; then the
                                             rolling program's output epilogue

Both are plain :class:`~neptune_fusion.codegen.program.TileProgram` data printed by the one
emitter. The chunk is ``ceil(ceil(n / splits) / BLOCK_N) * BLOCK_N`` elements, so every
chunk boundary is a tile boundary and the loop partition's bounds (multiples of
``BLOCK_N`` except the last) stay valid after clamping to the chunk. A split whose chunk
starts past the end of the axis is empty: the combine skips it (the fused reference's
``count == 0``), so it contributes the identity and never a NaN.
"""

from __future__ import annotations

from dataclasses import replace

from ..algebra.synth import moved, running, state
from ..errors import CodegenError, UnschedulableError
from ..ir.dtypes import float32, int64
from ..ir.fold import fconst, fold
from ..ir.nodes import Binary, Const, Expr, IndexVar, Load, Param, Placeholder, Where, fresh_uid
from ..ir.reducers import EXTRAPOLATED, reducer, running_expr, safe_expr
from ..ir.traverse import substitute, walk
from .program import (
    BLOCK_N,
    LOOP_LO,
    SPLIT_ID,
    SPLIT_PRODUCERS,
    TILE_END,
    TILE_START,
    Output,
    Split,
    TensorArg,
    TileProgram,
    extent_expr,
)


def chunk_of(prog: TileProgram, splits: int) -> Expr:
    """Loop elements per split: ``ceil(n / (splits * BLOCK_N)) * BLOCK_N``."""
    per = Binary("mul", Const(splits, int64), BLOCK_N)
    n = extent_expr(prog.loop.extent)
    up = Binary("floordiv", Binary("add", n, Binary("sub", per, Const(1, int64))), per)
    return Binary("mul", up, BLOCK_N)


def ws_axes(prog: TileProgram, s) -> tuple:
    """The workspace index of state variable ``s``: ``[split, *grid, row, (col)]``."""
    tail = (prog.col.var,) if "col" in s.roles else ()
    return (SPLIT_ID,) + tuple(a.var for a in prog.grid) + (prog.row.var,) + tail


def _workspace(prog: TileProgram, splits: int):
    out = []
    for s in prog.state:
        axes = ws_axes(prog, s)
        shape = (splits,) + tuple(v.extent for v in axes[1:])
        ws = Placeholder(f"ws_{s.name}", shape, float32, fresh_uid())
        out.append((s, TensorArg(f"ws_{s.name}", ws, "output"), axes))
    return out


def _check(prog: TileProgram, splits: int) -> None:
    if not isinstance(splits, int) or splits < 1:
        raise CodegenError(f"split-k needs splits >= 1, got {splits!r}")
    if prog.phases > 1:
        raise UnschedulableError(
            f"schedule strategy 'split': {prog.name} runs {prog.phases} phases (loops over "
            "the fused axis one after the other, a later one reading the earlier ones' "
            "final values); split-k cuts one loop, so a phased program stays rolling")
    for a in prog.accumulators:
        for p in a.producers:
            if prog.accumulators[p].op not in SPLIT_PRODUCERS:
                raise UnschedulableError(
                    f"schedule strategy 'split': {a.name} reads the running "
                    f"{prog.accumulators[p].op} {prog.accumulators[p].name}; split-k "
                    f"supports {', '.join(SPLIT_PRODUCERS)} producers")
    if _extrapolated(prog) and any(isinstance(x, (IndexVar, Load)) or (
            isinstance(x, Param) and x != BLOCK_N) for _, e in prog.bounds for x in walk(e)):
        raise UnschedulableError(
            f"schedule strategy 'split': {prog.name} reads a running sum in a loop whose "
            "bounds depend on the row or on data (a mask partition); the combine could "
            "not tell the elements each split has seen")
    reads = _epilogue_reads(prog, wide=True)
    if reads and (prog.col is None or prog.col.chunk is None):
        raise UnschedulableError(
            f"schedule strategy 'split': the outputs read "
            f"{', '.join(a.name for a in reads)} after the loop, and "
            "no output column is written in chunks to cut among the combine programs")


def _epilogue_reads(prog: TileProgram, wide: bool = False) -> tuple:
    """The inputs of ``prog`` its outputs load after the loop (softmax's or a norm's
    ``x``), in input order; ``wide``: only those loaded along the output column (a value
    per row, such as a centred mean's pivot ``x[i, 0]``, is one load per row anywhere)."""
    col = prog.col.var if prog.col is not None else None
    read = {x.tensor for o in prog.outputs for x in walk(o.body) if isinstance(x, Load)
            and (not wide or col in x.free_vars)}
    return tuple(a for a in prog.inputs if a.tensor in read)


def _extrapolated(prog: TileProgram) -> bool:
    """Whether a consumer reads a producer whose running value is extrapolated from the
    elements seen (a sum: ``state * n / seen``, reducers.running_expr)."""
    return any(reducer(prog.accumulators[p].op).running == EXTRAPOLATED
               for a in prog.accumulators for p in a.producers)


def _split_local(prog: TileProgram, lo: Expr) -> tuple:
    """``prog``'s segments counting positions from ``lo``, the split's first element: an
    extrapolated running value then scales a chunk's partial sum by the elements the
    chunk has seen (``seen = j_end - lo``), as the reference's partial states do
    (fusion/reference.py), and the combine knows each split's final count. The first-tile
    test ``j_start == loop_lo`` is shifted on both sides, so it is unchanged."""
    shift = {v: Binary("sub", v, lo) for v in (TILE_START, TILE_END, LOOP_LO)}
    return tuple(replace(seg, body=tuple((sv, substitute(e, shift)) for sv, e in seg.body),
                         hints=tuple((substitute(e, shift), n) for e, n in seg.hints))
                 for seg in prog.segments)


def partial_program(prog: TileProgram, splits: int) -> TileProgram:
    """Kernel 1: the rolling loop over chunk ``split_id`` only; stores the state."""
    _check(prog, splits)
    chunk = chunk_of(prog, splits)
    lo = Binary("mul", SPLIT_ID, chunk)
    hi = Binary("add", lo, chunk)
    bounds = tuple((n, Binary("minimum", Binary("maximum", e, lo), hi))
                   for n, e in prog.bounds)
    if _extrapolated(prog):
        prog = replace(prog, segments=_split_local(prog, lo))
    ws = _workspace(prog, splits)
    outs = tuple(Output(replace(arg, kind="output"), axes, s.param) for s, arg, axes in ws)
    info = Split(splits, "partial", tuple((s, arg) for s, arg, _ in ws), chunk)
    return replace(prog, name=f"{prog.name}_partial", outputs=outs, bounds=bounds,
                   split=info, rules=prog.rules + (f"split-k: {splits} splits, partial",),
                   one_tile="")


def _linear_in_own(u: Expr, i: int) -> bool:
    """Whether update ``i`` reads no other state component (then a zero-state split is
    left at the identity exactly, without evaluating ``0 * exp(big)``)."""
    others = {state(k) for k in range(16)} - {state(i)}
    return not any(x in others for x in walk(u) if isinstance(x, Param))


def combine_steps(prog: TileProgram) -> tuple[tuple, ...]:
    """The merged state, one group of ``(state variable, new value)`` per loop (IR).

    Producers first: a level of the chain is merged over all splits before the next one
    reads it. Level 0 (``max``) needs no repair; a consumer's split state is repaired
    from its split's producer value to the *final* merged one with the derived
    ``update`` and then combined. Because no loop iteration depends on a value merged in
    the same loop, the splits' loads of a level are independent of each other and can
    all be in flight at once (the emitter unrolls the loops); a single rolling pass
    (repairing the merged-so-far state at every split) makes each split wait for the
    previous one, a serial chain of memory latencies.

    A split whose chunk starts past the end of the axis stored its initial state. Its
    merge is guarded by ``where(split_id * chunk < n, new, old)`` only where that state
    could contribute something: a level-0 state is combined with its init (the reducer's
    identity), and a consumer whose repairs are each linear in their own component keeps
    the identity exactly (above), so for them the guard is the identity and is left out.
    With a symbolic extent it cannot fold away, and on an H200 the guarded merge of
    16 splits took 6.0 us against 2.5 us unguarded (B = 1 decode, 32/8 heads:
    benchmarks/results/2026-12-01-h200-b1).
    """
    ws = dict(prog.split.workspace)

    def load(s):
        return Load(ws[s].tensor, ws_axes(prog, s))

    ext = extent_expr(prog.loop.extent)
    first = Binary("mul", SPLIT_ID, prog.split.chunk)
    nonempty = Binary("lt", first, ext)
    # the elements split ``split_id`` saw (its chunk, cut at the end of the axis; <= 0:
    # none) -- a running sum's extrapolation in its partial kernel (_split_local)
    seen = Binary("sub", Binary("minimum", Binary("add", first, prog.split.chunk), ext),
                  first)
    level: dict[int, int] = {}   # accumulator index -> its loop
    groups: list[list] = []
    for k, a in enumerate(prog.accumulators):
        olds = [s.param for s in a.state]
        if not a.producers:
            level[k] = 0
            news = [Binary(reducer(a.op).combine, olds[0], load(a.state[0]))]
        else:
            if any(p not in level for p in a.producers):
                raise CodegenError(f"{a.name}: a producer comes after its consumer")
            level[k] = 1 + max(level[p] for p in a.producers)
            env = {state(i): load(s) for i, s in enumerate(a.state)}
            for n, p in enumerate(a.producers):
                op, prod = prog.accumulators[p].op, prog.accumulators[p].state[0]
                # the split's producer value, as its last tile saw it (_split_local)
                env[running(n)] = safe_expr(op, running_expr(op, load(prod), seen, ext))
                env[moved(n)] = safe_expr(op, prod.param)       # the merged (final) one
            news, exact = [], True
            for i, s in enumerate(a.state):
                mine = substitute(a.updates[i], env)
                if _linear_in_own(a.updates[i], i):   # identity stays exact (no 0 * inf)
                    mine = Where(Binary("eq", load(s), fconst(s.init)), fconst(s.init), mine)
                else:
                    exact = False
                news.append(Binary(reducer(a.op).combine, olds[i], mine))
            if not exact:   # an empty split's state may not merge as the identity
                news = [fold(Where(nonempty, n, o)) for n, o in zip(news, olds)]
        while len(groups) <= level[k]:
            groups.append([])
        groups[level[k]].extend(zip(a.state, news))
    return tuple(tuple(g) for g in groups)


COMBINE_COL_BLOCK = 32   # columns per combine program when the col axis is split


def _col_blocks(prog: TileProgram) -> int:
    """Combine programs per row block over the col axis.

    The combine reads ``splits`` state tiles per row block; decode has a handful of row
    blocks, so a constant col extent is cut into ``COMBINE_COL_BLOCK``-wide programs, each
    merging its columns (row-only states such as the max and the sum are merged again by
    each): more programs share the loads and each holds a quarter of the registers, which
    the full unroll of the loop over splits needs. Measured on an H200 (DC-GQA, 16
    splits): 4.5 -> 4.2 us alone; the unroll then took it to 2.5 us.
    Legal when every output is indexed by the col axis (each output element then reads
    only its own column of col-role state; a row-only output would be written by every
    column program).
    """
    c = prog.col
    if c is None or not isinstance(c.extent, int) or c.extent <= COMBINE_COL_BLOCK \
            or c.extent % COMBINE_COL_BLOCK:
        return 1
    if any(c.var not in o.axes for o in prog.outputs):
        return 1
    return c.extent // COMBINE_COL_BLOCK


def combine_program(prog: TileProgram, part: TileProgram) -> TileProgram:
    """Kernel 2: reads the workspace, writes ``prog``'s outputs (see module docstring).

    Outputs that load inputs after the loop (a norm's ``y = (x - mean) * rstd``, over a
    column written in chunks) read them here too, and the column is cut into one piece
    per split: ``splits`` combine programs per row block, each merging the same states
    and writing its piece, so the second pass over ``x`` is spread like the first (a
    group norm at batch 1 has 32 rows of 65536 elements)."""
    reads, wide = _epilogue_reads(prog), _epilogue_reads(prog, wide=True)
    inputs = tuple(replace(arg, kind="input") for _, arg in part.split.workspace) + reads
    blocks = part.split.splits if wide else _col_blocks(prog)
    info = replace(part.split, stage="combine", col_blocks=blocks)
    col = prog.col if blocks == 1 or wide else \
        replace(prog.col, block_size=COMBINE_COL_BLOCK)
    rule = f"split-k: {info.splits} splits, combine" + \
        (f" ({blocks} programs per row block over {prog.col.name})" if blocks > 1 else "")
    return replace(prog, name=f"{prog.name}_combine", inputs=inputs, inner=(), bounds=(),
                   segments=(), split=info, col=col, rules=(rule,), one_tile="")


def split_programs(prog: TileProgram, splits: int) -> tuple[TileProgram, ...]:
    """Split-k: ``(partial, combine)`` (checked by the pipeline, runtime/pipeline.py)."""
    part = partial_program(prog, splits)
    return part, combine_program(prog, part)


