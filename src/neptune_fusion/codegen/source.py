"""Tile program -> Triton source (one module, one ``@triton.jit`` kernel).

Layout of the generated kernel::

    signature      pointers, strides, sizes, constexpr tile sizes, INTERPRET
    program ids    the row block (axis 0) and the grid axes (axis 1, flattened)
    prologue       tile offsets, loop-invariant values (the q tile), loop bounds, state
    loops          one per segment: boundary tiles (masked) / interior tiles (no masks)
    epilogue       the outputs from the final state, stored under the row/column masks

``INTERPRET`` is a constexpr: the runtime passes True under Triton's interpreter, which
selects portable code where CUDA gets a fast path (``tanh.approx.f32``) or where the
interpreter is wrong (bfloat16 ``tl.dot``).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace

from ..errors import CodegenError
from ..ir.fold import bconst, fconst, fold
from ..ir.nodes import Binary, Const, Expr, Load, Reduce, Size
from ..ir.traverse import substitute, walk
from ..schedule.schedule import COL_GROUP
from .emitter import Block, Names
from .exprs import Lowerer, Val, count_uses
from .patterns import gathered_loads, indirect_load
from .program import (
    BLOCK_N,
    COL_START,
    I_FIRST,
    I_LAST,
    LOOP_LO,
    SPLIT_ID,
    TILE_END,
    TILE_START,
    TileProgram,
    contiguous_strides,
    extent_expr,
)
from .reuse import share_exponentials
from .triton_ops import ATOM, NAN_HELPERS, PROD_HELPERS, literal, nan_helpers, tl_dtype, wrap


@dataclass(frozen=True)
class KernelArg:
    """One parameter of the generated kernel and where its value comes from."""

    name: str
    kind: str      # tensor | stride | size | block | flag | tma | visits | even | one | desc
    #                dense
    ref: object    # TensorArg | (TensorArg, dim) | Size | Axis | HostDescriptor | None


EVEN = "LOOP_EVEN"
ONE = "ONE_TILE"
CONSTEXPR_KINDS = ("block", "flag", "tma", "even", "one", "dense")


def even_tail(prog: TileProgram) -> bool:
    """Whether the kernel takes ``LOOP_EVEN`` (a constexpr: the loop length is a multiple
    of BLOCK_N) and runs its ragged-tail loop only when it is False: with
    ``static_sizes`` (a compiled kernel per class of lengths anyway) and a tail loop over
    a symbolic length. The empty loop is not free: its pipeline prologue and code cost
    the backward's d_k, d_v kernel 4 % on the H200 (docs/autodiff.md)."""
    return prog.schedule.static_sizes and isinstance(prog.loop.extent, Size) and \
        any(s.tail for s in prog.segments)


def kernel_args(prog: TileProgram) -> tuple[KernelArg, ...]:
    out: list[KernelArg] = []
    for t in prog.inputs + tuple(o.arg for o in prog.outputs):
        out.append(KernelArg(f"{t.name}_ptr", "tensor", t))
        out.extend(KernelArg(t.stride(d).name, "stride", (t, d))
                   for d in range(t.tensor.ndim - 1))
    out.extend(KernelArg(s.name, "size", s) for s in prog.sizes)
    if prog.schedule.count_visits:
        out.append(KernelArg("visits_ptr", "visits", None))
    out.extend(KernelArg(name, "block", ax) for name, ax in prog.blocks())
    out.append(KernelArg("INTERPRET", "flag", None))
    if even_tail(prog):   # the runtime says whether the loop length divides into tiles
        out.append(KernelArg(EVEN, "even", prog.loop.extent))
    if prog.one_tile == "runtime":   # the runtime says whether one tile covers the loop
        out.append(KernelArg(ONE, "one", prog.loop.extent))
    if prog.schedule.tma:   # the runtime says per call whether descriptors may be used
        out.append(KernelArg("TMA", "tma", None))
    # the runtime says whether each gathered tensor has its dense strides
    out.extend(KernelArg(f"{t.name}_DENSE", "dense", t) for t in dense_candidates(prog))
    return tuple(out)


def dense_strides(t) -> tuple[int, ...] | None:
    """The strides of input ``t`` when it is dense (row-major, as ``torch.empty`` makes
    it), where every one of them is a constant: all dimensions but the first static."""
    shape = t.tensor.shape
    if len(shape) < 2 or not all(isinstance(n, int) for n in shape[1:]):
        return None
    return contiguous_strides([1, *shape[1:]])    # the first extent sets no stride


def dense_candidates(prog: TileProgram) -> tuple:
    """The inputs of ``prog`` that a tile loop gathers (a paged cache's page pools,
    ``k[table[b, j // page], h, j % page, c]``) and whose dense strides are constants.
    The kernel takes a constexpr ``<name>_DENSE`` for each, set at launch from the
    call's strides (runtime/kernel.py); when it is True the strides are those
    constants, so each gathered row's 64-bit address is a shift and an add, shared by
    tensors of the same layout, not a 64-bit multiply per stride and tensor (sm_90 SASS
    of the paged decode's tile: 593 -> 479 instructions, where a contiguous cache's
    takes 456; docs/serving.md)."""
    seen = {x.tensor for x in gathered_loads(e for seg in prog.segments for _, e in seg.body)}
    return tuple(t for t in prog.inputs if t.tensor in seen and dense_strides(t))


def kernel_scope(prog: TileProgram, args, skeleton: set) -> tuple[Names, dict]:
    """The kernel's fresh names (its parameters, axes, state and the ``skeleton``'s own
    names taken) and the environment binding its stride and size parameters."""
    reserved = {a.name for a in args} | set(skeleton)
    for a in prog.axes:
        reserved.add(a.name if a.role == "grid" else f"offs_{a.name}")
    for s in prog.state:
        reserved.add(s.name)
    env: dict[Expr, Val] = {}
    for a in args:
        if a.kind == "stride":
            t, d = a.ref
            env[t.stride(d)] = Val(a.name, (), "i32")
        elif a.kind == "size":
            env[a.ref] = Val(a.name, (), "i32")
    return Names(reserved), env


def generate(prog: TileProgram) -> str:
    """The Triton source of ``prog``: a module with imports and one kernel."""
    args = kernel_args(prog)
    names, env = kernel_scope(prog, args, {
        "tl", "triton", "pid_row", "pid_grid", "pid_col", "_nf_prod", "_nf_mul", "pid",
        "row_tiles", "group_width", "first_row", "group_rows", *NAN_HELPERS})
    state_params = frozenset(s.param for s in prog.state)
    pre = Block(names, 1)
    _dense_strides(prog, pre, args)
    _program_ids(prog, pre, env)
    low = Lowerer(prog, env, pre, None, state_params)
    bounds = {} if prog.one_tile == "static" else _bounds(prog, pre, low, env)
    for s in prog.state:
        shape = ", ".join(_block_of(prog, r) for r in s.roles)
        init, _ = literal(s.init)
        pre.emit(f"{s.name} = tl.full([{shape}], {init}, tl.float32)")
        env[s.param] = Val(s.name, s.roles, "f32")
    main = Block(names, 1, parent=pre)
    if prog.split is not None and prog.split.stage == "combine":
        _combine_loops(prog, main, env, state_params)
    if prog.one_tile == "static":
        _one_tile(prog, main, pre, env, state_params)
    elif prog.one_tile == "runtime":
        ext = Lowerer(prog, env, pre, None, frozenset()).value(extent_expr(prog.loop.extent))
        main.comment(f"{ONE} (constexpr, set at launch): 2 when {prog.loop.name} < "
                     f"{ext.code} == BLOCK_N, 1 when {ext.code} < BLOCK_N (one tile, loaded "
                     "once), 0 when the loops run")
        with main.nested(f"if {ONE} == 2:") as exact:
            _one_tile(prog, exact, pre, env, state_params, exact=True)
        with main.nested(f"elif {ONE} == 1:") as one:
            _one_tile(prog, one, pre, env, state_params)
        with main.nested("else:") as rest:
            _loops(prog, rest, pre, env, state_params, bounds)
    else:
        _loops(prog, main, pre, env, state_params, bounds)
    what = "a rolling-update (FlashAttention-class) kernel" + (
        f" of {prog.phases} phases" if prog.phases > 1 else "") if prog.split is None else \
        f"split-k {prog.split.stage} kernel ({prog.split.splits} splits, FlashDecoding-class)"
    lines = [
        f'"""Generated by neptune-fusion: {what}."""',
        "import triton",
        "import triton.language as tl",
        "",
        "",
    ] + ([*PROD_HELPERS, "", ""] if _uses_prod(prog) else []) + nan_helpers(
        "\n".join(pre.lines + main.lines)) + [
        _decorator(prog, args),
        f"def {prog.name}(",
    ] + [f"    {group}," for group in _signature_groups(args)] + ["):"]
    body = pre.lines + main.lines
    return "\n".join(lines + body) + "\n"


def _dense_strides(prog: TileProgram, pre: Block, args) -> None:
    """Each gathered tensor's strides as constants where the launch says it is dense
    (``<name>_DENSE``; :func:`dense_candidates`)."""
    for a in args:
        if a.kind != "dense":
            continue
        t, strides = a.ref, dense_strides(a.ref)
        with pre.nested(f"if {a.name}:") as dense:
            for d in range(t.tensor.ndim - 1):
                dense.emit(f"{t.stride(d).name} = {strides[d]}")


def _loops(prog: TileProgram, into: Block, pre: Block, env, state_params, bounds) -> None:
    """The loops of every segment, then the epilogue, into ``into``."""
    names, level = into.names, into.level
    blocks = [Block(names, level, parent=into)]
    hoist, within, phase = pre, blocks[0], 0
    for seg in prog.segments:
        if seg.phase != phase:
            # a later phase: what its loops read of the earlier phases' final state
            # alone is computed once, between the phases
            hoist = Block(names, level, parent=within)
            within = Block(names, level, parent=hoist)
            blocks += [hoist, within]
            done = [s.name for k in range(seg.phase) for s in prog.phase_state(k)]
            hoist.comment(f"phase {seg.phase}: {', '.join(done)} final from here")
            phase = seg.phase
        variant = frozenset(s.param for k in range(seg.phase, prog.phases)
                            for s in prog.phase_state(k))
        _segment(prog, seg, bounds, within, hoist, env, variant, dict(zip(
            [a for a, _ in seg.hints], [n for _, n in seg.hints])))
    post = Block(names, level, parent=within)
    _epilogue(prog, post, pre, env, state_params, prog.outputs)
    for b in blocks + [post]:
        into.extend(b)


def _one_tile(prog: TileProgram, into: Block, pre: Block, env, state_params,
              exact: bool = False) -> None:
    """One tile covers the loop axis: each phase's update once, straight-line, from the
    empty state, then the epilogue; the tile's loads are bound once, before any phase,
    and every phase -- and an epilogue whose column is the loop axis itself (softmax's
    row) -- reads them: the input is read once. ``exact``: the extent is BLOCK_N (known
    at launch), so no element is masked. With ``Schedule.row_programs`` the program walks
    row blocks (:func:`_walk_rows`)."""
    tile = _TileParts(prog, env, pre, exact)
    into.comment(f"one tile: {prog.loop.name} < {tile.ext} " +
                 ("== BLOCK_N, unmasked" if exact else "<= BLOCK_N" +
                  (", masked" if tile.guard else "")))
    if walks_rows(prog):
        _walk_rows(prog, into, tile, env, state_params)
    else:
        _tile_body(prog, into, pre, tile, env, state_params)


def walks_rows(prog: TileProgram) -> bool:
    """Whether the one-tile code walks row blocks (``Schedule.row_programs``): a rolling
    row reduction whose one tile covers the row, with no column programs, no visit
    counting (which is per program) and no loops over epilogue axes (``prog.epi``: on
    the H200 an instance norm walking its rows so wrote non-finite values, caught by the
    trial call's reference check, and once faulted, 2026-12-04; not understood yet, and
    the interpreter computes it right)."""
    s = prog.schedule
    return bool(s.row_programs and prog.one_tile and prog.split is None
                and not (prog.col is not None and prog.col.programs)
                and not s.count_visits and not prog.epi)


class _TileParts:
    """What the one tile computes: each phase's update from the empty state, and the
    outputs (reading the updates' exponentials: reuse.py)."""

    def __init__(self, prog: TileProgram, env, pre: Block, exact: bool) -> None:
        loop = prog.loop
        self.ext = Lowerer(prog, env, pre, None, frozenset()).value(
            extent_expr(loop.extent)).code
        self.guard = not exact and not (isinstance(loop.extent, int)
                                        and loop.extent == prog.schedule.block_n)
        zero = Const(0, TILE_START.dtype)
        bodies = []
        for k in range(prog.phases):
            segs = [s for s in prog.segments if s.phase == k]
            seg = next((s for s in segs if s.masked), segs[0])
            # the first tile: the state and its position at their starting values, folded
            start = {s.param: fconst(s.init) for s in prog.phase_state(k)}
            start.update({TILE_START: zero, LOOP_LO: zero})
            if exact:   # the length guard the masked tiles carry (variants.build_segments)
                start[Binary("lt", loop.var, loop.extent)] = bconst(True)
            bodies.append((seg, tuple((s, fold(substitute(e, start))) for s, e in seg.body)))
        outputs = _on_the_tile(prog)
        self.on_loop = outputs is not prog.outputs   # the epilogue's column is the loop axis
        if prog.schedule.exp2:   # the epilogue reads the updates' exponentials (reuse.py)
            ext_e = Const(loop.extent, loop.var.dtype) if isinstance(loop.extent, int) \
                else loop.extent
            outputs = share_exponentials(
                outputs, {s.param: e for _, body in bodies for s, e in body},
                {s.param: a.op for a in prog.accumulators for s in a.state},
                [e for _, body in bodies for _, e in body],
                Binary("lt", loop.var, ext_e) if self.guard else None)
        self.bodies, self.outputs = bodies, outputs
        self.exprs = [e for _, body in bodies for _, e in body] + [o.body for o in outputs]

    def local(self, prog: TileProgram, env, row: Val | None = None) -> dict:
        """``env`` on the tile (the loop axis its offsets), the row axis ``row`` if given."""
        local = dict(env)
        local[prog.loop.var] = Val(f"offs_{prog.loop.name}", ("loop",), "i32")
        local[TILE_START] = local[LOOP_LO] = Val("0", (), "i32")
        local[TILE_END] = Val(self.ext, (), "i32")
        if row is not None:
            local[prog.row.var] = row
        return local

    def load(self, prog: TileProgram, into: Block, hoist: Block | None, local,
             state_params) -> None:
        """The tile's loads, bound in ``into`` (every later block sees them)."""
        loads = Lowerer(prog, local, into, hoist, state_params, guard=self.guard)
        for x in _tile_loads(self.exprs, prog.loop.var):
            loads.lower(x)


def _tile_body(prog: TileProgram, into: Block, hoist: Block | None, tile: _TileParts, env,
               state_params, local: dict | None = None) -> None:
    """The one tile's loads (unless a block above bound them), updates and epilogue;
    what does not change along the loop axis is hoisted to ``hoist`` (None: kept here)."""
    if local is None:   # else the walking rows' first block bound the tile's offsets
        into.emit(f"offs_{prog.loop.name} = tl.arange(0, BLOCK_N)")
        local = tile.local(prog, env)
    guard = tile.guard
    # the tile's loads first, in the block every phase and the epilogue see
    tile.load(prog, into, hoist, local, state_params)
    # each phase's block sees the ones before it, and the epilogue sees them all: its
    # values (an exponential per element) are read, not recomputed
    uses = count_uses(tile.exprs)
    prev = into
    for seg, body in tile.bodies:
        block = Block(into.names, into.level, parent=prev)
        prev = block
        low = Lowerer(prog, local, block, hoist, state_params | {TILE_START, TILE_END},
                      guard=guard, uses=uses,
                      hints=dict(zip([a for a, _ in seg.hints], [n for _, n in seg.hints])))
        news = [low.lower(e, force=f"{s.name}_new") for s, e in body]
        if prog.schedule.count_visits:   # a phase's one tile, as its loop would count it
            block.emit(f"tl.atomic_add(visits_ptr + (pid_row * tl.num_programs(1) + "
                       f"{'pid_grid' if prog.grid else '0'}) * 2 + {0 if guard else 1}, 1)")
        # a value over fewer axes than its state (a count of the row's elements, the
        # same for every row) is broadcast: every branch of `if ONE_TILE` must give the
        # state one shape (Triton's compiler checks it; the interpreter does not)
        block.emit(f"{', '.join(s.name for s, _ in body)} = "
                   f"{', '.join(_as_state(prog, s, v) for (s, _), v in zip(body, news))}")
        into.extend(block)
    post = Block(into.names, into.level, parent=prev)
    if not tile.on_loop:
        _epilogue(prog, post, hoist, local, state_params, tile.outputs)
    else:
        post.comment("epilogue: outputs from the final state and the tile")
        with _epilogue_loops(prog, post, local) as (block, at):
            _store_outputs(prog, block, at, state_params, tile.outputs, guard)
    into.extend(post)


def _walk_rows(prog: TileProgram, into: Block, tile: _TileParts, env, state_params) -> None:
    """``Schedule.row_programs``: a persistent grid. The program walks the row blocks
    ``program_id(0) + k * num_programs(0)`` and loads the next block's tile (masked past
    the rows) before this block's arithmetic, so its loads are in flight while this one
    computes: a double buffer in registers. Measured on the H200 (hand-written probe,
    bf16 softmax over 4096 x 32768: 0.166 -> 0.142 ms; docs/codegen.md). The blocks here
    have no parent: every value is lowered against the walking row's offsets, never
    found among the values the kernel's prologue bound for ``pid_row``."""
    names, level = into.names, into.level
    row = prog.row
    offs = f"offs_{row.name}"
    cur = Val(names.fresh(f"{offs}_walk"), ("row",), "i32")
    nxt_row = Val(names.fresh(f"{offs}_next"), ("row",), "i32")
    n_row = Lowerer(prog, env, into, None, frozenset()).value(extent_expr(row.extent)).code
    into.comment("a persistent grid: this program walks row blocks pid, pid + P, ...; the "
                 "next block's tile is loaded before this block's arithmetic")
    head = Block(names, level)
    head.emit(f"offs_{prog.loop.name} = tl.arange(0, BLOCK_N)")
    head.emit(f"{cur.code} = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)")
    tile.load(prog, head, None, tile.local(prog, env, cur), state_params)
    into.extend(head)
    step = names.fresh("walk")
    ahead = Block(names, level + 1)
    ahead.emit(f"{nxt_row.code} = {cur.code} + tl.num_programs(0) * BLOCK_M")
    tile.load(prog, ahead, None, tile.local(prog, env, nxt_row), state_params)
    body = Block(names, level + 1, parent=head)
    _tile_body(prog, body, None, tile, env, state_params, tile.local(prog, env, cur))
    with into.nested(f"for {step} in range(tl.program_id(0), tl.cdiv({n_row}, BLOCK_M), "
                     "tl.num_programs(0)):") as loop:
        loop.extend(ahead)
        loop.extend(body)
        # every name the first block bound takes its value for the next block (a name
        # there, or the code the next block left inline: the body reads the name)
        pairs = {a: b for a, b in ((_code(v), _code(ahead.memo.get(k)))
                                   for k, v in head.memo.items())
                 if a.isidentifier() and b and a != b}
        pairs[cur.code] = nxt_row.code
        pairs = list(pairs.items())
        loop.emit(f"{', '.join(a for a, _ in pairs)} = {', '.join(b for _, b in pairs)}")


def _code(v) -> str:
    """The code of a CSE entry (a value, a pointer base, a shared load's name), or ''."""
    return v.code if isinstance(v, Val) else v if isinstance(v, str) else \
        v[0] if isinstance(v, tuple) and v and isinstance(v[0], str) else ""


def _on_the_tile(prog: TileProgram):
    """The outputs with the epilogue's column read on the loop tile when the column is
    a stateless axis of the loop's extent (softmax's ``j``): the same offsets, so the
    same loads; else ``prog.outputs`` (the epilogue walks its columns as usual)."""
    col, loop = prog.col, prog.loop
    if col is None or col.chunk is None or not (
            col.extent is loop.extent or (isinstance(col.extent, int)
                                          and col.extent == loop.extent)):
        return prog.outputs
    ren = {col.var: loop.var}
    return tuple(replace(o, axes=tuple(loop.var if v is col.var else v for v in o.axes),
                         body=substitute(o.body, ren)) for o in prog.outputs)


def _tile_loads(exprs, loop_var) -> list:
    """Every load of ``exprs`` indexed by the loop axis, once, in order."""
    out: list = []
    for e in exprs:
        for x in walk(e):
            if isinstance(x, Load) and loop_var in x.free_vars and x not in out:
                out.append(x)
    return out


def _uses_prod(prog: TileProgram) -> bool:
    """Whether any reduction of ``prog`` (an accumulator or a reduction inside a body) is
    a product: then the module defines ``_nf_prod``."""
    if any(a.op == "prod" for a in prog.accumulators):
        return True
    exprs = [e for seg in prog.segments for _, e in seg.body] + [o.body for o in prog.outputs]
    return any(isinstance(x, Reduce) and x.op == "prod" for e in exprs for x in walk(e))


def unspecialized_sizes(prog: TileProgram) -> frozenset:
    """The symbolic sizes Triton is told not to specialise on: all but the output
    column's extent. Unspecialised, one compiled kernel serves every length -- a decode
    loop's growing key length, a query length of 1 -- and the launcher reuses it without
    Triton's dispatch (runtime/launcher.py). The column's extent is specialised (a
    multiple of 16 or not): its mask runs along a contiguous tile -- a projection's output
    columns, a softmax's row -- and vectorises only when Triton knows the extent is a
    multiple of 16. Measured on an H200 (bf16 RMSNorm -> matmul, 4096^3, symbolic sizes):
    1.00 ms unspecialised, 0.32 ms specialised. Decode kernels have no symbolic column,
    so they compile exactly as before. A schedule with ``static_sizes`` specialises every
    size (none here)."""
    if prog.schedule.static_sizes:
        return frozenset()
    col = prog.col.extent if prog.col is not None else None
    return frozenset(s for s in prog.sizes if s is not col)


def _decorator(prog: TileProgram, args: tuple[KernelArg, ...], jit: str = "triton.jit") -> str:
    """``@triton.jit`` (or ``jit``), with ``do_not_specialize`` for
    :func:`unspecialized_sizes`."""
    loose = unspecialized_sizes(prog)
    sizes = [a.name for a in args if a.kind == "size" and a.ref in loose]
    if not sizes:
        return f"@{jit}"
    return f"@{jit}(do_not_specialize={sizes!r})"


def _signature_groups(args: tuple[KernelArg, ...]) -> list[str]:
    """The parameters, one line per tensor (pointer and strides), sizes, constexprs."""
    groups: list[list[str]] = []
    prev = ""
    for a in args:
        text = f"{a.name}: tl.constexpr" if a.kind in CONSTEXPR_KINDS else a.name
        same = groups and (a.kind == "stride" or (a.kind == prev and a.kind != "tensor"))
        if same:
            groups[-1].append(text)
        else:
            groups.append([text])
        prev = a.kind
    return [", ".join(g) for g in groups]


def _block_of(prog: TileProgram, role: str) -> str:
    for a in prog.axes:
        if a.role == role:
            return a.block
    raise CodegenError(f"no tile axis with role {role}")  # pragma: no cover


def _program_ids(prog: TileProgram, pre: Block, env: dict) -> None:
    low = Lowerer(prog, env, pre, None, frozenset())
    col = prog.col
    if col is not None and col.programs:
        _grouped_ids(prog, pre, low)
    else:
        row_id(prog, pre)
    grid_ids(prog, pre, env)
    if prog.split is not None and prog.split.stage == "partial":
        pre.emit("pid_split = tl.program_id(2)")
        env[SPLIT_ID] = Val("pid_split", (), "i32")
    pre.emit("i_first = pid_row * BLOCK_M")
    env[I_FIRST] = Val("i_first", (), "i32")
    env[BLOCK_N] = Val("BLOCK_N", (), "i32")
    row = f"offs_{prog.row.name}"
    pre.emit(f"{row} = i_first + tl.arange(0, BLOCK_M)")
    env[prog.row.var] = Val(row, ("row",), "i32")
    col_split = prog.split is not None and prog.split.col_blocks > 1
    if col_split:
        pre.emit("pid_col = tl.program_id(2)")
    for a in prog.axes:
        if a.role in ("col", "inner"):
            env[a.var] = Val(f"offs_{a.name}", (a.role,), "i32")
            if a.chunk is not None:
                continue  # defined by the epilogue's loop over column chunks
            tiled = col_split or a.programs
            start = f"pid_col * {a.block} + " if tiled and a.role == "col" else ""
            pre.emit(f"offs_{a.name} = {start}tl.arange(0, {a.block})")


def row_id(prog: TileProgram, pre: Block, pid: str = "tl.program_id(0)",
           count: str = "tl.num_programs(0)") -> None:
    """``pid_row`` from ``pid`` (of ``count`` row blocks): in reverse where
    :func:`heaviest_first`."""
    if heaviest_first(prog):
        pre.comment("row blocks in reverse: the ones whose loop is longest start first")
        pre.emit(f"pid_row = {count} - 1 - {pid}")
    else:
        pre.emit(f"pid_row = {pid}")


def grid_ids(prog: TileProgram, pre: Block, env: dict, pid: str = "tl.program_id(1)") -> None:
    """Each grid axis's value from ``pid`` (the grid flattened, innermost axis
    fastest)."""
    low = Lowerer(prog, env, pre, None, frozenset())
    if prog.grid:
        pre.emit(f"pid_grid = {pid}")
    rest = "pid_grid"
    for k, a in enumerate(prog.grid):  # innermost first
        if k == len(prog.grid) - 1:
            pre.emit(f"{a.name} = {rest}")
        else:
            ext = low.value(extent_expr(a.extent))
            pre.emit(f"{a.name} = {rest} % {ext.code}")
            if k == len(prog.grid) - 2:
                rest = f"{rest} // {ext.code}"
            else:
                nxt = pre.names.fresh("pid_rest")
                pre.emit(f"{nxt} = {rest} // {ext.code}")
                rest = nxt
        env[a.var] = Val(a.name, (), "i32")


def heaviest_first(prog: TileProgram) -> bool:
    """Whether the row blocks run last to first: when the loop's upper end grows with
    the row (a causal mask: the last rows visit the most tiles), launching the longest
    programs first leaves short ones for the tail of the grid (on the H200 1-3 % on
    causal prefill, 2026-12-01-h200-hopper). The upper end is the bound that closes a
    phase's last loop, not an inner one: the key rows of attention's d_k, d_v loop from
    their diagonal to the end (``full_hi`` reads ``full_lo``, which grows with the row,
    but ``hi`` is the extent), so their *first* blocks are the longest and the natural
    order is already heaviest first. Any order computes the same."""
    if prog.split is not None:
        return False
    bound = dict(prog.bounds)
    starts = {(s.phase, s.lo) for s in prog.segments}
    ends = [bound.get(s.hi) for s in prog.segments if (s.phase, s.hi) not in starts]
    return any(x is I_LAST or x is I_FIRST for e in ends if e is not None for x in walk(e))


def _grouped_ids(prog: TileProgram, pre: Block, low: Lowerer) -> None:
    """``pid_row`` and ``pid_col`` of a row x column grid flattened into program_id(0),
    in groups of :data:`COL_GROUP` row tiles: the programs running together share a few
    row tiles (rows of the left operand) and walk the column tiles (columns of the right
    operand) together, so both stay in L2 -- the ordering of a tiled GEMM."""
    n_row = low.value(extent_expr(prog.row.extent)).code
    n_col = low.value(extent_expr(prog.col.extent)).code
    pre.emit("pid = tl.program_id(0)")
    pre.emit(f"row_tiles = tl.cdiv({n_row}, BLOCK_M)")
    pre.emit(f"group_width = {COL_GROUP} * tl.cdiv({n_col}, {prog.col.block})")
    pre.emit(f"first_row = pid // group_width * {COL_GROUP}")
    pre.emit(f"group_rows = tl.minimum(row_tiles - first_row, {COL_GROUP})")
    pre.emit("pid_row = first_row + pid % group_width % group_rows")
    pre.emit("pid_col = pid % group_width // group_rows")


def _bounds(prog: TileProgram, pre: Block, low: Lowerer, env: dict) -> dict[str, str]:
    exprs = [e for _, e in prog.bounds]
    if any(x is I_LAST for e in exprs for x in walk(e)):
        n = low.value(extent_expr(prog.row.extent))
        pre.emit(f"i_last = tl.minimum(i_first + BLOCK_M, {n.code}) - 1")
        env[I_LAST] = Val("i_last", (), "i32")
    low.uses = count_uses(exprs)
    out = {}
    for name, e in prog.bounds:
        out[name] = low.lower(e, force=f"{prog.loop.name}_{name}").code
    if "lo" in out:  # the split-k combine has no loop over the fused axis
        env[LOOP_LO] = Val(out["lo"], (), "i32")
    return out


def _loop_range(prog: TileProgram, seg, lo: str, hi: str) -> str:
    """The tile loop's iterator: ``range``, or, for a loop that loads through a table (a
    paged cache's ``k[block_table[b, j // page], ...]``) under a schedule with
    ``gather_stages``, ``tl.range`` pipelined that deep. Triton's pipeliner (3.6 and 3.9,
    read off their sm_90 TTGIR) puts such a load a stage after the table load, so at the
    kernel's depth ``s`` it keeps ``ceil((s - 2) / 2)`` tiles in flight, not the ``s - 1``
    of a direct load (pages of 16, 128-key tiles, 3 stages: one buffer, 72 KiB of shared
    memory, against two and 136 KiB contiguous); at ``2s - 1`` it keeps ``s - 1``. The
    search space asks for that where one program per multiprocessor must hide the latency
    alone (schedule/space.gather_depth; docs/codegen.md, "Loads")."""
    depth = prog.schedule.gather_stages
    if depth and indirect_load(e for _, e in seg.body):
        return f"tl.range({lo}, {hi}, BLOCK_N, num_stages={depth})"
    return f"range({lo}, {hi}, BLOCK_N)"


def _segment(prog, seg, bounds, loops: Block, pre: Block, env, state_params, hints) -> None:
    """One loop of ``seg``: ``pre`` takes what does not change in it, ``state_params`` are
    the state it (or a later phase) updates."""
    kind = "boundary tiles (masked)" if seg.masked else "interior tiles (no masks)"
    if prog.phases > 1:
        kind = f"phase {seg.phase}, {kind}"
    loops.comment(f"{kind}: {seg.lo} <= {prog.loop.name} < {seg.hi}")
    if seg.tail and even_tail(prog):   # compiled out when the length divides evenly
        with loops.nested(f"if not {EVEN}:") as inner:
            _segment_loop(prog, seg, bounds, inner, pre, env, state_params, hints)
    else:
        _segment_loop(prog, seg, bounds, loops, pre, env, state_params, hints)


def _segment_loop(prog, seg, bounds, loops: Block, pre: Block, env, state_params,
                  hints) -> None:
    lo, hi = bounds[seg.lo], bounds[seg.hi]
    j0 = loops.names.fresh(f"{prog.loop.name}0")
    with loops.nested(f"for {j0} in {_loop_range(prog, seg, lo, hi)}:") as body:
        offs = f"offs_{prog.loop.name}"
        body.emit(f"{offs} = {j0} + tl.arange(0, BLOCK_N)")
        local = dict(env)
        local[prog.loop.var] = Val(offs, ("loop",), "i32")
        local[TILE_START] = Val(j0, (), "i32")
        first = next(s for s in prog.segments if s.phase == seg.phase)
        local[LOOP_LO] = Val(bounds[first.lo], (), "i32")   # where this phase's loop starts
        ext = Lowerer(prog, env, body, None, frozenset()).value(extent_expr(prog.loop.extent))
        local[TILE_END] = Val(f"tl.minimum({j0} + BLOCK_N, {ext.code})", (), "i32")
        roots = [e for _, e in seg.body]
        low = Lowerer(prog, local, body, pre, state_params | {TILE_START, TILE_END},
                      guard=seg.guard,
                      uses=count_uses(roots), hints=hints)
        news = [low.lower(e, force=f"{s.name}_new") for s, e in seg.body]
        if prog.schedule.count_visits:
            slot = 0 if seg.masked else 1
            body.emit(f"tl.atomic_add(visits_ptr + (pid_row * tl.num_programs(1) + "
                      f"{'pid_grid' if prog.grid else '0'}) * 2 + {slot}, 1)")
        targets = ", ".join(s.name for s, _ in seg.body)
        body.emit(f"{targets} = {', '.join(v.code for v in news)}")


def _as_state(prog: TileProgram, s, v: Val) -> str:
    """``v``'s code, broadcast to state ``s``'s tile when it spans fewer of its axes."""
    if set(s.roles) <= set(v.axes):
        return v.code
    shape = ", ".join(_block_of(prog, r) for r in s.roles)
    return f"tl.full([{shape}], 0.0, tl.float32) + {wrap(v.code, v.prec, ATOM)}"


def _combine_loops(prog: TileProgram, loops: Block, env, state_params) -> None:
    """Split-k combine: loops over the splits merging the partial states with the
    derived repairs (see :func:`.split.combine_steps`)."""
    from .split import combine_steps
    for steps in combine_steps(prog):
        loops.comment("merge the splits' states: " + ", ".join(s.name for s, _ in steps))
        sid = loops.names.fresh("split_id")
        # no split's loads depend on a value merged in the same loop, so unrolled their
        # loads are in flight together: up to 16 splits fully (static_range; measured on
        # an H200: DC-GQA's combine 3.8 -> 2.5 us at 16 splits), more eight at a time
        # (fully unrolled 32 or 64 splits spill: 5.5 -> 10 us)
        n = prog.split.splits
        if n <= 16:
            head = f"for {sid} in tl.static_range({n}):"
        else:
            head = f"for {sid} in tl.range(0, {n}, loop_unroll_factor=8):"
        with loops.nested(head) as body:
            local = dict(env)
            local[SPLIT_ID] = Val(sid, (), "i32")
            roots = [e for _, e in steps]
            low = Lowerer(prog, local, body, None, state_params | {SPLIT_ID},
                          uses=count_uses(roots))
            news = [low.lower(e, force=f"{s.name}_new") for s, e in steps]
            body.emit(f"{', '.join(s.name for s, _ in steps)} = "
                      f"{', '.join(v.code for v in news)}")


def _epilogue(prog: TileProgram, post: Block, pre: Block, env, state_params,
              outputs) -> None:
    post.comment("epilogue: outputs from the final state")
    with _epilogue_loops(prog, post, env) as (post, env):
        _epilogue_columns(prog, post, env, state_params, outputs)


@contextmanager
def _epilogue_loops(prog: TileProgram, post: Block, env):
    """``(block, env)`` inside one scalar loop per epilogue axis (``prog.epi``)."""
    with ExitStack() as stack:
        for a in prog.epi:
            ext = Lowerer(prog, env, post, None, frozenset()).value(extent_expr(a.extent))
            post = stack.enter_context(post.nested(f"for {a.name} in range(0, {ext.code}):"))
            env = {**env, a.var: Val(a.name, (), "i32")}
        yield post, env


def _epilogue_columns(prog: TileProgram, post: Block, env, state_params, outputs) -> None:
    col = prog.col
    if col is not None and col.chunk is not None and \
            any(v == col.var for o in outputs for v in o.axes):
        # the column carries no state: write the outputs a chunk of columns at a time
        # (a split-k partial stores row states only: no loop)
        ext = Lowerer(prog, env, post, None, frozenset()).value(extent_expr(col.extent))
        c0 = post.names.fresh(f"{col.name}0")
        lo, hi = "0", ext.code
        if prog.split is not None and prog.split.col_blocks > 1:
            # a split-k combine: this program's piece of the columns (split.combine_program)
            n = prog.split.col_blocks
            post.emit(f"piece = tl.cdiv({ext.code}, {n} * {col.block}) * {col.block}")
            post.emit("col_lo = pid_col * piece")
            post.emit(f"col_hi = tl.minimum(col_lo + piece, {ext.code})")
            lo, hi = "col_lo", "col_hi"
        with post.nested(f"for {c0} in range({lo}, {hi}, {col.block}):") as body:
            body.emit(f"offs_{col.name} = {c0} + tl.arange(0, {col.block})")
            _store_outputs(prog, body, {**env, COL_START: Val(c0, (), "i32")}, state_params,
                           _chunk_uniform(col, outputs))
        return
    _store_outputs(prog, post, env, state_params, outputs)


def _chunk_uniform(col, outputs) -> list:
    """``outputs`` with each ``k // c`` of the chunked column ``k`` read as
    ``col_start // c`` (one value per chunk, not a gather per element) where every chunk
    lies inside one block of ``c`` columns: a chunk is a power of two of at most
    ``EPILOGUE_CHUNK`` columns (the tile, when the extent is static) starting at a
    multiple of its size, so ``c`` a multiple of it is enough. A group norm's channel
    weight ``w[g, k // (H*W)]`` (H*W = 4096) becomes one load per chunk: the gathered form
    cost its H200 kernel 7 us of 68 (2026-12-04)."""
    from .lower import EPILOGUE_CHUNK
    size = col.block_size or EPILOGUE_CHUNK
    hits = {x for o in outputs for x in walk(o.body)
            if isinstance(x, Binary) and x.op == "floordiv" and x.a == col.var
            and isinstance(x.b, Const) and isinstance(x.b.value, int) and x.b.value > 0
            and x.b.value % size == 0}
    if not hits:
        return list(outputs)
    uniform = {h: Binary("floordiv", COL_START, h.b) for h in hits}
    return [replace(o, body=substitute(o.body, uniform)) for o in outputs]


def _store_outputs(prog: TileProgram, post: Block, env, state_params, outputs,
                   guard: bool = False, relayout: tuple[str, dict] | None = None) -> None:
    """``relayout``: (a layout, index values in it): each value is converted to that
    layout before its store, whose addresses and mask are formed from those indices
    (the Gluon dialect's blocked store)."""
    # nothing is hoisted out of the epilogue: it would stay live through the loops
    low = Lowerer(prog, env, post, None, state_params, guard=guard,
                  uses=count_uses([o.body for o in outputs]))
    # the addresses in the other layout: a block of their own, whose CSE table does not
    # hand them the values lowered in the first one (same IR, other layout)
    at_block = post if relayout is None else Block(post.names, post.level)
    at = low if relayout is None else \
        Lowerer(prog, {**env, **relayout[1]}, at_block, None, state_params, guard=guard)
    for o in outputs:
        axes = tuple(a for a in ("row", "loop", "col")
                     if any(prog.role_of(v) is not None and prog.role_of(v).role == a
                            for v in o.axes))
        val = low.value(o.body, axes)
        if not (o.arg.tensor.dtype.is_float or o.arg.tensor.dtype.is_bool):
            raise CodegenError(f"output {o.arg.name} is {o.arg.tensor.dtype}; float and "
                               "boolean outputs are supported")
        base, offset, mask = at.address(o.arg.tensor, o.axes)
        off = at.value(offset, axes)
        data = low.expand(val, axes)
        if not val.axes:   # a constant (a Python number): the store broadcasts it
            if relayout is not None:
                raise CodegenError(f"output {o.arg.name} is a constant; the Gluon "
                                   "dialect's stores take tiles (use the Triton path)")
            data = f"tl.cast({data}, {tl_dtype(o.arg.tensor.dtype)})"
        else:
            if data == val.code and val.prec < ATOM:
                data = f"({data})"
            data = f"{data}.to({tl_dtype(o.arg.tensor.dtype)})"
        if relayout is not None:
            data = f"gl.convert_layout({data}, {relayout[0]})"
        store = f"tl.store({base} + {at.operand(off, axes, 5)}, {data}"
        if mask is not None:
            store += f", mask={at.expand(at.value(mask, axes), axes)}"
        if at_block is not post:
            post.extend(at_block)
            at_block.lines.clear()
        post.emit(store + ")")

