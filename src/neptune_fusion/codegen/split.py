"""Split-k: the rolling tile program cut into a partial kernel and a combine kernel.

    rolling TileProgram --partial_program--> loop restricted to chunk ``split_id`` of the
                                             fused axis; epilogue stores every state
                                             variable to the fp32 workspace
                        --combine_program--> per output point, one loop over the splits:
                                             producers merged, consumer states (merged so
                                             far and the split's) repaired to the new
                                             merged value (``update`` IR) and combined;
                                             then the rolling program's output epilogue

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
from ..ir.nodes import Binary, Const, Expr, Load, Param, Placeholder, Size, Where, fresh_uid
from ..ir.traverse import substitute, walk
from .lower import _COMBINE, safe
from .program import BLOCK_N, SPLIT_ID, Output, Split, TensorArg, TileProgram


def _extent(ext) -> Expr:
    return ext if isinstance(ext, Size) else Const(ext, int64)


def chunk_of(prog: TileProgram, splits: int) -> Expr:
    """Loop elements per split: ``ceil(n / (splits * BLOCK_N)) * BLOCK_N``."""
    per = Binary("mul", Const(splits, int64), BLOCK_N)
    n = _extent(prog.loop.extent)
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
    for a in prog.accumulators:
        for p in a.producers:
            if prog.accumulators[p].op == "sum":
                raise UnschedulableError(
                    f"schedule strategy 'split': {a.name} reads the running sum "
                    f"{prog.accumulators[p].name}; split-k supports max and min "
                    "producers (a sum's running value needs the count)")


def partial_program(prog: TileProgram, splits: int) -> TileProgram:
    """Kernel 1: the rolling loop over chunk ``split_id`` only; stores the state."""
    _check(prog, splits)
    chunk = chunk_of(prog, splits)
    lo = Binary("mul", SPLIT_ID, chunk)
    hi = Binary("add", lo, chunk)
    bounds = tuple((n, Binary("minimum", Binary("maximum", e, lo), hi))
                   for n, e in prog.bounds)
    ws = _workspace(prog, splits)
    outs = tuple(Output(replace(arg, kind="output"), axes, s.param) for s, arg, axes in ws)
    info = Split(splits, "partial", tuple((s, arg) for s, arg, _ in ws), chunk)
    return replace(prog, name=f"{prog.name}_partial", outputs=outs, bounds=bounds,
                   split=info, rules=prog.rules + (f"split-k: {splits} splits, partial",))


def _linear_in_own(u: Expr, i: int) -> bool:
    """Whether update ``i`` reads no other state component (then a zero-state split is
    left at the identity exactly, without evaluating ``0 * exp(big)``)."""
    others = {state(k) for k in range(16)} - {state(i)}
    return not any(x in others for x in walk(u) if isinstance(x, Param))


def combine_steps(prog: TileProgram):
    """One pass over the splits: the new merged state after split ``SPLIT_ID`` (IR).

    The merge is itself a rolling update over the splits: producers combine (``max``), and
    a consumer's merged state so far *and* the split's state are both repaired to the new
    merged producer value with the derived ``update`` before they are combined -- the
    merged state was computed under the old merged value, the split's under its own.
    One loop with three independent loads per split, rather than a loop per member
    (which made the combine's serial latency grow three times as fast with the splits).
    """
    ws = dict(prog.split.workspace)

    def load(s):
        return Load(ws[s].tensor, ws_axes(prog, s))

    nonempty = Binary("lt", Binary("mul", SPLIT_ID, prog.split.chunk),
                      _extent(prog.loop.extent))
    merged: dict[int, Expr] = {}    # producer index -> its merged value after this split
    steps = []
    for k, a in enumerate(prog.accumulators):
        olds = [s.param for s in a.state]
        if not a.producers:
            news = [Binary(_COMBINE[a.op], olds[0], load(a.state[0]))]
        else:
            if any(p not in merged for p in a.producers):
                raise CodegenError(f"{a.name}: a producer comes after its consumer")
            new_p = {moved(n): safe(merged[p]) for n, p in enumerate(a.producers)}

            def repaired(vals, under, a=a, new_p=new_p):
                env = {state(i): v for i, v in enumerate(vals)}
                env.update({running(n): safe(r) for n, r in enumerate(under)})
                env.update(new_p)
                return [substitute(u, env) for u in a.updates]
            mine = repaired([load(s) for s in a.state],
                            [load(prog.accumulators[p].state[0]) for p in a.producers])
            theirs = repaired(olds, [prog.accumulators[p].state[0].param
                                     for p in a.producers])
            news = []
            for i, s in enumerate(a.state):
                m_i, t_i = mine[i], theirs[i]
                if _linear_in_own(a.updates[i], i):   # identity stays exact (no 0 * inf)
                    m_i = Where(Binary("eq", load(s), fconst(s.init)), fconst(s.init), m_i)
                    t_i = Where(Binary("eq", olds[i], fconst(s.init)), fconst(s.init), t_i)
                news.append(Binary(_COMBINE[a.op], t_i, m_i))
        news = [fold(Where(nonempty, n, o)) for n, o in zip(news, olds)]
        merged[k] = news[0]
        steps.extend(zip(a.state, news))
    return (tuple(steps),)


def combine_program(prog: TileProgram, part: TileProgram) -> TileProgram:
    """Kernel 2: reads the workspace, writes ``prog``'s outputs (see module docstring)."""
    inputs = tuple(replace(arg, kind="input") for _, arg in part.split.workspace)
    info = replace(part.split, stage="combine")
    return replace(prog, name=f"{prog.name}_combine", inputs=inputs, inner=(), bounds=(),
                   segments=(), split=info,
                   rules=(f"split-k: {info.splits} splits, combine",))


def merged_program(prog: TileProgram, splits: int) -> TileProgram:
    """One kernel: the partial kernel, whose last program per row block to finish (an
    atomic counter) merges every split's state and writes ``prog``'s outputs."""
    part = partial_program(prog, splits)
    info = replace(part.split, stage="merged")
    return replace(part, name=f"{prog.name}_merged", outputs=part.outputs + prog.outputs,
                   split=info, rules=prog.rules + (
                       f"split-k: {splits} splits, merged by the last program",))


def split_programs(prog: TileProgram, splits: int, merge: str = "kernel"
                   ) -> tuple[TileProgram, ...]:
    """Split-k: ``(partial, combine)``, or ``(merged,)`` with ``merge="last_block"``."""
    if merge == "last_block":
        return (merged_program(prog, splits),)
    part = partial_program(prog, splits)
    return part, combine_program(prog, part)


