"""Tile program -> Gluon source: the Hopper dialect of the emitter (issue 18).

The same tile program the Triton emitter prints (:mod:`.source`) printed for Triton's
Gluon dialect, where the kernel says what Triton's compiler otherwise decides. A program
of 128 rows runs as three partitions (``gl.warp_specialize``): a load warp and two
consumer warpgroups of 64 rows each (192 rows: three consumers). The load warp brings
the K and V tiles by TMA (descriptors the runtime makes on the host over each whole
input, :func:`descriptor_args`; a ragged batch's made per program on the device) into a
ring of ``STAGES`` (the schedule's ``num_stages``) shared-memory buffers, each signalled by an
mbarrier and released by every consumer. Each consumer runs both products as
asynchronous warpgroup MMAs (``wgmma``), the product ``q . k`` of tile ``t`` issued
before ``p . v`` of tile ``t - 1``, so the element work of tile ``t`` (the derived
repairs, masks and score modifiers: every state update but the products) runs while the
tensor cores still multiply tile ``t - 1`` (FlashAttention-3's intra-warpgroup overlap);
and as the consumers synchronise only themselves, one's element work runs under another's
MMAs
(measured on the H200: this split, not the overlap, is what reaches cuDNN;
docs/hopper.md).

What is printed from the tile program, unchanged: the loop bounds, the grid decomposition,
every element expression of every segment (through the shared :class:`.exprs.Lowerer`
and op tables), the epilogue. What the dialect adds is the skeleton around them, which
needs the program to have the attention shape (:func:`shape_of`, else a
:class:`~neptune_fusion.errors.CodegenError` naming what differs):

* one contraction over the inner axis, ``s = sum_c a[.., i, c] * b[.., j, c]``, both
  operands plain tile loads (its value is the ``wgmma`` result, bound for the Lowerer);
* one state over (row, col) updated as ``acc * f + sum_j p * v[.., j, e]`` in every
  segment, ``f`` per row, ``v`` a plain tile load: ``acc`` lives in the MMA's registers,
  ``p`` goes to the second ``wgmma`` from registers, ``f`` is applied one tile late
  (``acc`` is linear in itself, so delaying ``p . v`` by a tile and scaling it by the
  next tile's ``f`` computes the same sum);
* every other state over rows only; the output columns one tile per program; single
  phase, no split-k, no gathered loads.

A host descriptor covers its input as laid out (up to five dimensions, a box of 1 in
all but the tile's last two, addressed at the program's batch and head indices), so
rows past a head's end read as zeros and any view with 16-byte strides is read in
place. ``b`` and ``v`` may be read as zeros past a per-program length
(``where(j < L, k, 0)``, a ragged batch's ``kv_lens[b]``; the segments' contractions then
differ only in that mask): then the tile that ``L`` crosses is read through a
descriptor the load warp makes over its (batch, head) rows, its box ending at
``min(extent, L)``, so the copy engine fills zeros past it and the cache rows there are
never read; the other tiles through the host's (on a persistent grid every descriptor is
made per item).

Segments (interior / boundary tiles) become branches of one pipelined loop, chosen per
tile by the segment bounds, so the pipeline never drains between them.

A score term linear in the loop index (ALiBi's ``slope * float(j - i_first)``) is added
by the tensor cores, one more 16-wide MMA step of ``q . k``, where every read of the
contraction allows it (:mod:`.mma_bias`): the element work is then a causal kernel's.

The (row, col) outputs are converted from the MMA layout to 16-byte vectors before
their store (:func:`store_layout`): stored from the MMA layout, the address tile alone
was 64 pointers a thread, and the consumers spilled.

The element expressions are printed with the shared ``tl.*`` op tables: the generated
module binds the name ``tl`` to Gluon's language module, which has the same element-wise
functions; what needs a layout (``arange``, ``full``, the MMA operands) is printed here
with one. Gluon's API is Triton-version specific: this prints Triton 3.6's (what the H200
machine has), and nothing runs it under the interpreter. Selected by
``Schedule(dialect="gluon")``, or by the auto-scheduler on sm_90 with Triton 3.6 (unless
``NEPTUNE_FUSION_GLUON=0``; docs/hopper.md says what is measured and what is next).
``Schedule.row_programs`` makes the grid persistent: each partition walks (row block,
batch and head) items, the ring positions counting on across items, and the load warp
loads the next item's first operand once every consumer releases it (``q_empty``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CodegenError
from ..ir.nodes import Binary, Expr, IndexVar, Load, Param, Reduce
from ..ir.traverse import walk
from .emitter import Block, Names
from .exprs import Lowerer, Val, count_uses
from .mma_bias import BIASED, ColumnBias
from .mma_bias import find as find_bias
from .patterns import gathers, loaded, match_contraction
from .program import BLOCK_N, I_FIRST, LOOP_LO, TILE_END, TILE_START, TileProgram, extent_expr
from .source import (
    CONSTEXPR_KINDS,
    KernelArg,
    _bounds,
    _decorator,
    _store_outputs,
    grid_ids,
    kernel_args,
    kernel_scope,
    row_id,
)
from .tiles import masked_load
from .triton_ops import ATOM, NAN_HELPERS, literal, nan_helpers, tl_dtype

HEADER = (
    "import triton",
    "from triton.experimental import gluon",
    "# the element expressions use the shared tl.* op tables; Gluon's language module",
    "# has the same element-wise functions (layouts are given where one is needed)",
    "from triton.experimental.gluon import language as tl",
    "from triton.experimental.gluon import language as gl",
    "from triton.experimental.gluon.language.nvidia.hopper import (",
    "    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)",
    "",
    "",
    "@gluon.jit",
    "def _nf_tile(desc, row, bar, dst, pred):",
    "    mbarrier.expect(bar, desc.block_type.nbytes, pred)",
    "    tma.async_copy_global_to_shared(desc, [row, 0], bar, dst, pred)",
)
# every name the skeleton prints itself (the Lowerer's fresh names avoid them)
SKELETON_NAMES = frozenset((
    "tl", "gl", "triton", "gluon", "fence_async_shared", "mbarrier", "tma",
    "warpgroup_mma", "warpgroup_mma_wait", "_nf_tile", "pid_row", "pid_grid", "i_first",
    "STAGES", "S_LAYOUT", "O_LAYOUT", "P_LAYOUT", "ST_LAYOUT", "a_bar", "b_full", "v_full",
    "b_empty", "v_empty", "st", "WG", "WG_ROWS", "q_half", "phase", "n_tiles", "s_zero", "qk",
    "qk_token", "acc_token", "p", "p_op", "t", "buf", "prev", "last", "q_empty", "w", "n_blocks",
    "n_grid", "base", "it", "g", "back", "x_smem", "qx_op", "XB", *NAN_HELPERS))
# rows per program: two or three consumer warpgroups of 64 rows (a partition each)
ROW_TILES = (128, 192)
WG_ROWS = 64
# the launch's num_warps: the default partition's (one consumer warpgroup); the schedule's
# num_warps (8 or 12) counts the consumers, the load warp comes on top
LAUNCH_WARPS = 4
PRODUCER_REGS = 24         # registers per thread of the load warp (setmaxnreg)
LOOP_TILES = (64, 128)     # keys per tile
SHARED_BYTES = 227 * 1024  # shared memory one program may allocate on sm_90


def consumer_regs(groups: int) -> int:
    """Registers per thread each of ``groups`` consumer warpgroups can get when the load
    warp keeps :data:`PRODUCER_REGS`: Triton pads the partitions to whole warpgroups and
    starts every thread at 64K / threads (a multiple of 8); what the load warp's group
    gives up is shared by the consumers (240 for two, 160 for three)."""
    start = 65536 // ((groups + 1) * 128) // 8 * 8
    return min(240, (start * (groups + 1) - PRODUCER_REGS) // groups // 8 * 8)


@dataclass(frozen=True)
class AttentionShape:
    """The parts of a tile program the Gluon skeleton places (module docstring)."""

    qks: tuple              # per segment: its inner contraction (the first wgmma's value)
    a: Load                 # their (row, inner) operand
    b: Load                 # their (loop, inner) operand
    v: Load                 # the (loop, col) operand of the accumulator's product
    acc: str                # the accumulator state's name
    updates: tuple          # per segment: (p expr, f expr) of ``acc * f + sum_j p * v``
    # the per-program length past which b and v read as zeros (``where(j < L, k, 0)``:
    # a ragged batch's kv_lens[b]), or None: the loop axis's extent
    loop_bound: Expr | None = None
    # a column term of the scores added by one more MMA step (.mma_bias), or None
    bias: ColumnBias | None = None


def _accumulation(e: Expr, acc: Param) -> tuple[Expr, Reduce] | None:
    """``(f, r)`` when ``e`` is ``acc * f + r`` (either order of either operation)."""
    if not (isinstance(e, Binary) and e.op == "add"):
        return None
    for scaled, r in ((e.a, e.b), (e.b, e.a)):
        if isinstance(r, Reduce) and isinstance(scaled, Binary) and scaled.op == "mul":
            if scaled.a == acc:
                return scaled.b, r
            if scaled.b == acc:
                return scaled.a, r
    return None


def _tile_load(e: Expr, low: Lowerer, roles: tuple[str, str]
               ) -> tuple[Load, Expr | None] | None:
    """``(load, bound)``: ``e`` as a plain load whose last two indices are the bare tile
    variables of ``roles`` and whose others span no tile axis (a TMA box), with
    ``bound`` None; or as ``where(r < L, load, 0)`` for its row variable ``r`` and a
    per-program ``L`` (a TMA box whose rows end at ``L``: zeros past it), with ``bound``
    L. None for anything else."""
    bound, ld = None, loaded(e)
    if ld is None:
        ld = masked_load(e)
        cond = e.cond if ld is not None else None
        if not (isinstance(cond, Binary) and cond.op == "lt" and len(ld.indices) >= 2
                and cond.a is ld.indices[-2] and not low.tile_roles(cond.b)):
            return None
        bound = cond.b
    if len(ld.indices) < 2 or any(low.tile_roles(i) for i in ld.indices[:-2]):
        return None
    last = tuple(low.role_of(i) if isinstance(i, IndexVar) else None
                 for i in ld.indices[-2:])
    return (ld, bound) if last == roles else None


def shape_of(prog: TileProgram) -> AttentionShape:
    """The attention shape of ``prog`` (module docstring), or a CodegenError saying
    what differs."""
    def refuse(why: str):
        raise CodegenError(f"the Gluon dialect cannot print {prog.name}: {why}")

    if prog.split is not None or prog.phases != 1:
        refuse("split-k and phased programs run in the Triton dialect")
    if gathers(prog):
        refuse("a gathered (paged) load has no TMA box")
    if prog.one_tile:
        refuse("a one-tile loop has no pipeline")
    if prog.epi:
        refuse(f"the epilogue loops over {', '.join(a.name for a in prog.epi)} in the "
               "Triton dialect")
    cols = [s for s in prog.state if s.roles == ("row", "col")]
    if len(cols) != 1 or any(s.roles != ("row",) for s in prog.state if s not in cols):
        refuse("the state must be one (row, col) accumulator and row values")
    acc = cols[0]
    if prog.col is None or prog.col.chunk is not None or prog.col.programs:
        refuse("the output columns must be one tile per program (block_col=0)")
    low = Lowerer(prog, {s.param: Val(s.name, s.roles, "f32") for s in prog.state},
                  Block(Names(), 0), None, frozenset())
    qks, operands, bounds, updates, vs = [], set(), set(), [], set()
    for seg in prog.segments:
        found = {r for _, e in seg.body for r in walk(e)
                 if isinstance(r, Reduce) and low.role_of(r.axes[0]) == "inner"}
        if len(found) != 1:
            refuse(f"{len(found)} contractions over the inner axis in a segment; the "
                   "skeleton has one")
        [qk] = found
        con = match_contraction(qk, low.role_of, low.tile_roles)
        if con is None or con.mask is not None or (con.x, con.y) != ("row", "loop"):
            refuse("the inner sum is not an unmasked (row, loop) contraction")
        a, b = _tile_load(con.lhs, low, ("row", "inner")), \
            _tile_load(con.rhs, low, ("loop", "inner"))
        if a is None or b is None or a[1] is not None:
            refuse("an operand of the inner contraction is not a plain tile load")
        qks.append(qk)
        operands.add((a[0], b[0]))
        bounds.add(b[1])
        body = dict((s.name, e) for s, e in seg.body)
        got = _accumulation(body[acc.name], acc.param)
        if got is None:
            refuse(f"{acc.name} is not updated as {acc.name} * f + sum_j p * v")
        f, r = got
        pv = match_contraction(r, low.role_of, low.tile_roles)
        if pv is None or (pv.x, pv.y) != ("row", "col") or low.role_of(pv.k) != "loop":
            refuse(f"the sum into {acc.name} is not a (row, loop) x (loop, col) product")
        v = _tile_load(pv.rhs, low, ("loop", "col"))
        if v is None or low.tile_roles(f) - {"row"}:
            refuse(f"{acc.name}'s product or factor does not fit the skeleton")
        p = pv.lhs if pv.mask is None else \
            _masked(pv.lhs, pv.mask, low, refuse)
        vs.add(v[0])
        bounds.add(v[1])
        updates.append((p, f))
    if len(operands) != 1:
        refuse("the segments' inner contractions read different tiles")
    if len(vs) != 1:
        refuse("the segments multiply different value tiles")
    bounds.discard(None)
    if len(bounds) > 1:
        refuse("the key and value tiles end at different lengths")
    [(a, b)] = operands
    rows = [s.name for s in prog.state if s is not acc]
    reads = [(qk, [dict((s.name, e) for s, e in seg.body)[r] for r in rows] + list(pf))
             for qk, seg, pf in zip(qks, prog.segments, updates)]
    bias = find_bias(reads, prog.loop.var, prog.row.var, low.tile_roles,
                     frozenset(s.param for s in prog.state))
    return AttentionShape(tuple(qks), a, b, vs.pop(), acc.name, tuple(updates),
                          bounds.pop() if bounds else None, bias)


def _masked(p: Expr, mask: Expr, low: Lowerer, refuse) -> Expr:
    from ..ir.nodes import Const, Where
    if low.tile_roles(mask) - {"row", "loop"}:
        refuse("the product's mask spans the value columns")
    return Where(mask, p, Const(0.0, p.dtype))


def _swizzle(inner: int, dtype) -> int:
    """The widest swizzle a (rows, ``inner``) tile's row of ``dtype`` allows."""
    row_bytes = inner * dtype.bits // 8
    return max(w for w in (0, 32, 64, 128) if w <= row_bytes)


def _shared_layout(inner: int, dtype, rank: int = 2) -> str:
    """The NVMMA shared layout of a (rows, ``inner``) tile of ``dtype`` (TMA and wgmma
    read it), or of its box of ``rank`` dimensions (leading ones of extent 1)."""
    return f"gl.NVMMASharedLayout(swizzle_byte_width={_swizzle(inner, dtype)}, " \
           f"element_bitwidth={dtype.bits}, rank={rank})"


@dataclass(frozen=True)
class HostDescriptor:
    """A TMA descriptor the runtime makes per call over a whole input (a kernel
    parameter): its box (1 in every dimension but the tile's last two) and the NVMMA
    layout (swizzle bytes, element bits) the box lands in."""

    arg: object          # the input's TensorArg
    block: tuple[int, ...]
    swizzle: int
    bits: int


# TMA boxes have at most five dimensions
TMA_RANK = 5


def gluon_args(prog: TileProgram) -> tuple:
    """The Gluon kernel's parameters: the Triton kernel's (:func:`.source.kernel_args`),
    then the host-side descriptors' (:func:`descriptor_args`); the constexpr ``STAGES``
    comes last."""
    return kernel_args(prog) + descriptor_args(prog)


def descriptor_args(prog: TileProgram) -> tuple:
    """The kernel parameters of the host-side descriptors (one per operand: the first
    product's two, the accumulator's), or () where the device makes them: a program
    without the attention shape, an operand of more than five dimensions, or a
    persistent grid over a ragged batch. Made per program on the device, a descriptor is
    written to global memory and fenced before its first load; on the H200 that cost
    1-6 % at 4096 keys (docs/hopper.md), and 2 % of a Llama prefill's attention call
    with ``kv_lens`` (2026-12-04). A ragged batch on a per-block grid reads its keys and
    values through the host descriptors too, except the one tile its length crosses
    (:meth:`_Kernel._producer`)."""
    try:
        sh = shape_of(prog)
    except CodegenError:
        return ()
    loads = ((sh.a, WG_ROWS), (sh.b, prog.schedule.block_n), (sh.v, prog.schedule.block_n))
    if any(ld.tensor.ndim > TMA_RANK for ld, _ in loads):
        return ()
    if sh.loop_bound is not None and prog.schedule.row_programs > 0:
        return ()   # a persistent ragged walk rewrites its descriptors per item
    out, taken = [], set()
    for (ld, rows), role in zip(loads, "abv"):
        arg = next(a for a in prog.inputs if a.tensor == ld.tensor)
        inner = next(a for a in prog.axes if a.var == ld.indices[-1])
        name = f"{arg.name}_desc" if f"{arg.name}_desc" not in taken \
            else f"{arg.name}_{role}_desc"
        taken.add(name)
        out.append(KernelArg(name, "desc", HostDescriptor(
            arg, (1,) * (ld.tensor.ndim - 2) + (rows, inner.block_size),
            _swizzle(inner.block_size, ld.tensor.dtype), ld.tensor.dtype.bits)))
    return tuple(out)


def check_schedule(prog: TileProgram, shape: AttentionShape) -> None:
    s = prog.schedule
    if s.block_m not in ROW_TILES or s.num_warps != s.block_m // 16:
        raise CodegenError(f"the Gluon dialect takes block_m in {ROW_TILES} with 16 rows "
                           f"per warp (num_warps = block_m // 16: a warpgroup per 64 rows); "
                           f"got block_m={s.block_m}, num_warps={s.num_warps}")
    if s.block_n not in LOOP_TILES:
        raise CodegenError(f"the Gluon dialect takes block_n in {LOOP_TILES}; "
                           f"got {s.block_n}")
    for ax in prog.axes:
        if ax.role in ("col", "inner") and ax.block_size not in (16, 32, 64, 128, 256):
            got = "symbolic (give its extent as an int)" if ax.block_size is None \
                else ax.block_size
            raise CodegenError(f"the Gluon dialect holds the {ax.role} axis {ax.name} in "
                               f"one tile of 16-256 (a power of two); it is {got}")
    width = {ax.role: ax.block_size for ax in prog.axes if ax.role in ("col", "inner")}
    need = 2 * (s.block_m * width["inner"] + s.num_stages * s.block_n
                * (width["inner"] + width["col"])) + _bias_bytes(prog, shape)  # 16-bit q, k, v
    if need > SHARED_BYTES:
        raise CodegenError(
            f"the Gluon dialect's buffers need {need // 1024} KiB of shared memory at "
            f"block_n={s.block_n}, num_stages={s.num_stages} and head dims "
            f"{width['inner']}/{width['col']}; Hopper has {SHARED_BYTES // 1024} KiB per "
            "program (take block_n=64 or fewer stages)")


def _bias_bytes(prog: TileProgram, shape: AttentionShape) -> int:
    """The shared memory of the column term's constant block (:mod:`.mma_bias`): 16
    bfloat16 values a key of the tile."""
    return 32 * prog.schedule.block_n if shape.bias is not None else 0


def store_layout(prog: TileProgram, tiles: list, shape: AttentionShape) -> str | None:
    """The blocked layout the (row, col) outputs ``tiles`` are stored from: 16-byte
    vectors along the columns, a warpgroup's 64 rows; None (store from the MMA layout)
    where there is none or the conversion's shared memory (one warpgroup's tile) would
    not fit beside the buffers. Measured on the H200 (docs/hopper.md): 2-5 % on every
    prefill operator, the consumers' spills gone."""
    if not tiles:
        return None
    s, width = prog.schedule, {ax.role: ax.block_size for ax in prog.axes
                               if ax.role in ("col", "inner")}
    size = max(o.arg.tensor.dtype.bits for o in tiles) // 8
    need = 2 * (s.block_m * width["inner"] + s.num_stages * s.block_n
                * (width["inner"] + width["col"])) + WG_ROWS * width["col"] * size \
        + _bias_bytes(prog, shape)
    if need > SHARED_BYTES:
        return None
    vec = min(16 // size, width["col"])
    cols = min(32, width["col"] // vec)
    return (f"gl.BlockedLayout(size_per_thread=[1, {vec}], threads_per_warp=[{32 // cols}, "
            f"{cols}], warps_per_cta=[4, 1], order=[1, 0])")


def generate(prog: TileProgram) -> str:
    """The Gluon source of ``prog`` (same parameters as the Triton kernel's, plus the
    constexpr ``STAGES``), or a CodegenError when it has not the attention shape."""
    shape = shape_of(prog)
    check_schedule(prog, shape)
    args = gluon_args(prog)
    dt = shape.a.tensor.dtype
    if dt.name not in ("float16", "bfloat16") or \
            {shape.b.tensor.dtype, shape.v.tensor.dtype} != {dt}:
        raise CodegenError("the Gluon dialect multiplies float16 or bfloat16 tiles of "
                           "one dtype")
    clash = sorted(({a.name for a in prog.axes if a.role == "grid"}
                    | {s.name for s in prog.state}) & SKELETON_NAMES)
    if clash:
        raise CodegenError(f"the Gluon dialect cannot print {prog.name}: {', '.join(clash)} "
                           "are names of its skeleton (rename the axis or the compute)")
    names, env = kernel_scope(prog, args, SKELETON_NAMES | {f"{prog.name}_rows",
                                                             f"{prog.name}_loads"})
    funcs = _Kernel(prog, shape, names, env, dt, args).functions(
        _decorator(prog, args, "gluon.jit"))
    return "\n".join(['"""Generated by neptune-fusion: a rolling-update kernel in Gluon '
                      '(Hopper: TMA, wgmma, consumer warpgroups and a load warp)."""', *HEADER,
                      "", "", *nan_helpers("\n".join(funcs), "@gluon.jit"), *funcs, ""])


class _Kernel:
    """The printing of one module: the kernel (buffers, barriers, the partitions), the
    consumer (one warpgroup's 64 rows: the pipelined loop and the epilogue) and the
    producer (the TMA loads), each with its own prologue (program ids, loop bounds)."""

    def __init__(self, prog, shape: AttentionShape, names: Names, env, dt, args) -> None:
        self.prog, self.shape, self.env, self.dt, self.args = prog, shape, env, dt, args
        self.names = names
        self.state_params = frozenset(s.param for s in prog.state)
        self.tensor = {ld: next(a for a in prog.inputs if a.tensor == ld.tensor).name
                       for ld in (shape.a, shape.b, shape.v)}
        # Schedule.row_programs: a persistent grid, each program walks (row block, grid)
        # items; tile numbers then count on across items (``base`` + t)
        self.walk = prog.schedule.row_programs > 0
        self.groups = prog.schedule.block_m // WG_ROWS   # consumer warpgroups
        # the host-side descriptors' parameters per operand (descriptor_args), or {}
        host = [x.name for x in args if x.kind == "desc"]
        self.host = dict(zip((shape.a, shape.b, shape.v), host)) if host else {}

    def tile_no(self, t: str) -> str:
        """The ring position of this item's tile ``t`` (its buffer and phase)."""
        return f"(base + {t})" if self.walk else t

    # ------------------------------------------------------------------ the module
    def functions(self, decorator: str) -> list[str]:
        prog, sh = self.prog, self.shape
        a, b, v = (self.tensor[x] for x in (sh.a, sh.b, sh.v))
        params = [x.name + (": tl.constexpr" if x.kind in CONSTEXPR_KINDS else "")
                  for x in self.args]
        shared = [f"{a}_smem", f"{b}_smem", f"{v}_smem", "a_bar", "b_full", "v_full",
                  "b_empty", "v_empty"] + (["q_empty"] if self.walk else []) \
            + (["x_smem"] if sh.bias is not None else [])
        plain = [x.name for x in self.args]
        rows, loads = f"{prog.name}_rows", f"{prog.name}_loads"
        out = []
        body = self._consumer()
        out += ["@gluon.jit",
                f"def {rows}({', '.join(params + shared)}, WG: tl.constexpr, "
                "STAGES: tl.constexpr):",
                '    """Warpgroup WG: rows i_first + 64 WG ... + 63 of the block."""',
                body.text(), "", ""]
        body = self._producer()
        out += ["@gluon.jit",
                f"def {loads}({', '.join(params + shared)}, STAGES: tl.constexpr):",
                '    """One warp: the TMA loads, each buffer refilled once every consumer '
                'is done with it."""',
                body.text(), "", ""]
        top = Block(self.names, 1)
        for ld, w in ((sh.a, None), (sh.b, "BLOCK_N"), (sh.v, "BLOCK_N")):
            inner = self._inner(ld)
            lay = _shared_layout(inner.block_size, ld.tensor.dtype)
            shape = f"[{self.groups}, BLOCK_M // {self.groups}, {inner.block}]" if w is None \
                else f"[STAGES, BLOCK_N, {inner.block}]"
            top.emit(f"{self.tensor[ld]}_smem = gl.allocate_shared_memory("
                     f"{tl_dtype(self.dt)}, {shape}, {lay})")
        if sh.bias is not None:
            top.comment("the column term's constant block (mma_bias): j - j0 in columns 0-2")
            top.emit("x_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, 16], "
                     f"{_shared_layout(16, self.dt)})")
            lay = self.names.fresh("XL")
            top.emit(f"{lay}: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], "
                     f"threads_per_warp=[32, 1], warps_per_cta=[{LAUNCH_WARPS}, 1], "
                     "order=[1, 0])")
            xr = top.bind("x_rows", f"gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, {lay}))")
            xc = top.bind("x_cols", f"gl.arange(0, 16, layout=gl.SliceLayout(0, {lay}))")
            top.emit(f"x_smem.store(gl.where(({xc} < 3)[None, :], {xr}[:, None], 0)"
                     ".to(gl.bfloat16))")
            top.emit("gl.thread_barrier()")
        top.emit("a_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())")
        for name in ("b_full", "v_full", "b_empty", "v_empty"):
            top.emit(f"{name} = gl.allocate_shared_memory(gl.int64, [STAGES, 1], "
                     "mbarrier.MBarrierLayout())")
        top.emit("mbarrier.init(a_bar, count=1)")
        if self.walk:
            top.comment("every warpgroup is done with the row block's first operand")
            top.emit("q_empty = gl.allocate_shared_memory(gl.int64, [1], "
                     "mbarrier.MBarrierLayout())")
            top.emit(f"mbarrier.init(q_empty, count={self.groups})")
        with top.nested("for st in gl.static_range(STAGES):") as init:
            init.emit("mbarrier.init(b_full.index(st), count=1)")
            init.emit("mbarrier.init(v_full.index(st), count=1)")
            init.comment("every warpgroup releases a buffer")
            init.emit(f"mbarrier.init(b_empty.index(st), count={self.groups})")
            init.emit(f"mbarrier.init(v_empty.index(st), count={self.groups})")
        top.emit("fence_async_shared()")
        call = ", ".join(plain + shared)
        top.emit("gl.warp_specialize([")
        for wg in range(self.groups):
            top.emit(f"    ({rows}, ({call}, {wg}, STAGES)),")
        top.emit(f"    ({loads}, ({call}, STAGES)),")
        workers = self.groups - 1
        regs = [consumer_regs(self.groups)] * workers + [PRODUCER_REGS]
        top.emit(f"], {[4] * workers + [1]}, {regs})")
        out += [decorator, f"def {prog.name}({', '.join(params)}, STAGES: tl.constexpr):",
                top.text()]
        return out

    def _inner(self, ld: Load):
        return next(a for a in self.prog.axes if a.var == ld.indices[-1])

    # ------------------------------------------------------------------ prologues
    def _items(self, pre: Block, env: dict) -> Block:
        """The block an item's work goes in: ``pre`` itself, or with a persistent grid
        the body of the loop over the walk's steps ``w`` (item ``x`` of :meth:`_dealt`:
        row block ``x % n_blocks``, grid index ``x // n_blocks``: the programs at work at
        once share a head's keys and values in L2, as a program per row block does; heads
        first was 8-13 % slower at 16384 keys on the H200), after ``base = 0`` (tiles
        consumed) and ``it = 0`` (items with tiles)."""
        if not self.walk:
            return pre
        prog = self.prog
        low = Lowerer(prog, env, pre, None, frozenset())
        n_rows = low.value(extent_expr(prog.row.extent)).code
        grid = " * ".join(low.value(extent_expr(a.extent)).code for a in prog.grid) or "1"
        pre.emit(f"n_blocks = tl.cdiv({n_rows}, BLOCK_M)")
        pre.emit(f"n_grid = {grid}")
        pre.emit("base = 0")
        pre.emit("it = 0")
        pre.comment("a persistent grid: this program walks items pid, pid + P, ...")
        pre.emit("for w in range(tl.program_id(0), n_blocks * n_grid, tl.num_programs(0)):")
        return pre.child()

    @staticmethod
    def _dealt(pre: Block) -> str:
        """The item the walk's ``w`` stands for: the items dealt to the programs in a
        snake, round ``k = w // P`` by round, odd rounds in reverse (the program that
        took a round's first, and with heaviest-first row blocks its longest, item takes
        the next round's last), so programs whose items differ in length (a causal
        mask) end together; a round's items are the same ``P`` consecutive ones as in a
        plain deal, so the programs at work at once still share a head's keys and
        values. On an H100 (2026-12-05) the snake made the persistent grid 4-13 %
        faster than the plain deal on causal prefill at 2048-16384 keys."""
        n_prog, k, slot, span, item = (pre.names.fresh(h) for h in
                                       ("n_prog", "w_round", "w_slot", "w_span", "item"))
        pre.comment("the items dealt in a snake: odd rounds run the programs in reverse")
        pre.emit(f"{n_prog} = tl.num_programs(0)")
        pre.emit(f"{k} = w // {n_prog}")
        pre.emit(f"{slot} = w % {n_prog}")
        pre.emit(f"{span} = tl.minimum({n_prog}, n_blocks * n_grid - {k} * {n_prog})")
        pre.emit(f"{item} = {k} * {n_prog} + {slot} + ({k} % 2) * ({span} - 1 - 2 * {slot})")
        return item

    def _close_items(self, pre: Block, item: Block) -> None:
        """The item loop's body placed in ``pre``, counting the item's tiles on."""
        if self.walk:
            item.emit("base = base + n_tiles")
            pre.extend(item)

    def _prologue(self, pre: Block, env: dict) -> dict:
        """Program ids, the block's first row and the loop bounds (each partition
        computes them: a few scalar instructions)."""
        prog = self.prog
        if self.walk:
            item = self._dealt(pre)
            row_id(prog, pre, f"{item} % n_blocks", "n_blocks")
            grid_ids(prog, pre, env, f"{item} // n_blocks")
        else:
            row_id(prog, pre)
            grid_ids(prog, pre, env)
        pre.emit("i_first = pid_row * BLOCK_M")
        env[I_FIRST] = Val("i_first", (), "i32")
        env[BLOCK_N] = Val("BLOCK_N", (), "i32")
        bounds = _bounds(prog, pre, Lowerer(prog, env, pre, None, frozenset()), env)
        env[LOOP_LO] = Val(bounds[prog.segments[0].lo], (), "i32")
        lo, hi = bounds[prog.segments[0].lo], bounds[prog.segments[-1].hi]
        pre.emit(f"n_tiles = tl.cdiv({hi} - {lo}, BLOCK_N)")
        return bounds

    def _producer(self) -> Block:
        prog, sh = self.prog, self.shape
        pre, env = Block(self.names, 1), dict(self.env)
        pre.emit(f"WG_ROWS: gl.constexpr = {WG_ROWS}")
        item = self._items(pre, env)
        bounds = self._prologue(item, env)
        lo = bounds[prog.segments[0].lo]
        a, b, v = (self.tensor[x] for x in (sh.a, sh.b, sh.v))
        with item.nested("if n_tiles > 0:") as run:
            if self.walk and not self.host:
                run.comment("the descriptors are rewritten below: the last item's loads "
                            "have landed first (its earlier tiles did before their buffer "
                            "was refilled)")
                with run.nested("if it > 0:") as done:
                    done.emit("mbarrier.wait(a_bar, (it - 1) & 1)")
                with run.nested("for back in gl.static_range(STAGES):") as done:
                    done.emit("g = base - 1 - back")
                    with done.nested("if g >= 0:") as wait:
                        wait.emit("mbarrier.wait(b_full.index(g % STAGES), (g // STAGES) & 1)")
                        wait.emit("mbarrier.wait(v_full.index(g % STAGES), (g // STAGES) & 1)")
            descs = self._descriptors(run, env)
            if self.walk:
                run.emit("mbarrier.wait(q_empty, (it & 1) ^ 1)")
                run.emit("it = it + 1")
            desc, at, box = descs[sh.a]
            run.emit(f"mbarrier.expect(a_bar, {self.groups} * {desc}.block_type.nbytes)")
            for wg in range(self.groups):
                row = "i_first" if wg == 0 else f"i_first + {wg} * WG_ROWS"
                run.emit(f"tma.async_copy_global_to_shared({desc}, [{at}{row}, 0], a_bar, "
                         f"{a}_smem.index({wg}){box})")
            with run.nested("for t in range(n_tiles):") as body:
                body.emit(f"buf = {self.tile_no('t')} % STAGES")
                body.comment("a fresh barrier passes a wait on parity 1: the first STAGES "
                             "tiles load at once")
                body.emit(f"phase = (({self.tile_no('t')} // STAGES) & 1) ^ 1")
                crossed = self._crossed(run, body, env, lo)
                for ld, name, bars in ((sh.b, b, "b"), (sh.v, v, "v")):
                    desc, at, box = descs[ld]
                    body.emit(f"mbarrier.wait({bars}_empty.index(buf), phase)")
                    if not self.host:
                        body.emit(f"_nf_tile({desc}, {lo} + t * BLOCK_N, "
                                  f"{bars}_full.index(buf), {name}_smem.index(buf), True)")
                        continue
                    into = body
                    if crossed is not None:
                        with body.nested(f"if {crossed}:") as tail:
                            low = Lowerer(prog, env, tail, None, frozenset())
                            own = self._device_descriptor(tail, low, ld, "BLOCK_N")
                            tail.emit(f"_nf_tile({own}, {lo} + t * BLOCK_N, "
                                      f"{bars}_full.index(buf), {name}_smem.index(buf), True)")
                        into = body.child()
                    into.emit(f"mbarrier.expect({bars}_full.index(buf), "
                              f"{desc}.block_type.nbytes)")
                    into.emit(f"tma.async_copy_global_to_shared({desc}, [{at}{lo} + t * "
                              f"BLOCK_N, 0], {bars}_full.index(buf), "
                              f"{name}_smem.index(buf){box})")
                    if crossed is not None:
                        with body.nested("else:") as whole:
                            whole.extend(into)
        self._close_items(pre, item)
        return pre

    def _crossed(self, run: Block, body: Block, env: dict, lo: str) -> str | None:
        """With host descriptors and a per-program length ``L`` (a ragged batch): the
        condition, printed in the loop ``body``, that tile ``t`` holds ``L``'s boundary.
        That tile's keys and values come through a descriptor whose box ends at ``L``
        (zeros past it: the cache rows there are never read, and a NaN left in them
        cannot reach ``p . v``); the others through the host's, which spans the whole
        cache. None without a length. ``L`` is computed once, in ``run``."""
        if not self.host or self.shape.loop_bound is None:
            return None
        low = Lowerer(self.prog, env, run, None, frozenset())
        length = low.value(self.shape.loop_bound).code
        return f"{lo} + t * BLOCK_N + BLOCK_N > {length}"

    def _descriptors(self, into: Block, env: dict) -> dict:
        """Per operand ``(descriptor, coordinates before the row's, view of the
        buffer)``: the host-side descriptor over the whole input, addressed at this
        item's (batch, head) indices, its buffer viewed with the box's leading 1s; else
        one made here over this item's (batch, head) rows. Reads past the rows give
        zeros either way."""
        prog, sh = self.prog, self.shape
        low = Lowerer(prog, env, into, None, frozenset())
        descs = {}
        if self.host:
            for ld, block in ((sh.a, "WG_ROWS"), (sh.b, "BLOCK_N"), (sh.v, "BLOCK_N")):
                at = "".join(f"{low.value(i).code}, " for i in ld.indices[:-2])
                box = f".reshape([{'1, ' * (len(ld.indices) - 2)}{block}, " \
                      f"{self._inner(ld).block}])" if len(ld.indices) > 2 else ""
                descs[ld] = (self.host[ld], at, box)
            return descs
        for ld, block in ((sh.a, "WG_ROWS"), (sh.b, "BLOCK_N"), (sh.v, "BLOCK_N")):
            descs[ld] = (self._device_descriptor(into, low, ld, block), "", "")
        return descs

    def _device_descriptor(self, into: Block, low: Lowerer, ld: Load, block: str) -> str:
        """A descriptor made here (bound in ``into``) over this item's (batch, head)
        rows of ``ld``'s operand; a key or value box ends at the per-program length when
        there is one, so the copy engine gives zeros past it."""
        sh = self.shape
        rows = self.prog.row if ld is sh.a else self.prog.loop
        inner, name = self._inner(ld), self.tensor[ld]
        base, _, _ = low.address(ld.tensor, ld.indices)
        n = low.value(extent_expr(rows.extent)).code
        if ld is not sh.a and sh.loop_bound is not None:   # zeros past the length
            n = f"tl.minimum({n}, {low.value(sh.loop_bound).code})"
        w = low.value(extent_expr(inner.extent)).code
        stride = low.value(low.args[ld.tensor].stride(len(ld.indices) - 2)).code
        lay = _shared_layout(inner.block_size, ld.tensor.dtype)
        return into.bind(f"{name}_desc", f"tma.make_tensor_descriptor({base}, "
                         f"shape=[{n}, {w}], strides=[{stride}, 1], "
                         f"block_shape=[{block}, {inner.block}], layout={lay})")

    # ------------------------------------------------------------------ consumer
    def _consumer(self) -> Block:
        prog, sh = self.prog, self.shape
        pre, env = Block(self.names, 1), dict(self.env)
        col = prog.col
        pre.emit("S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], "
                 "warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])")
        pre.emit("O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], "
                 f"warps_per_cta=[4, 1], instr_shape=[16, {col.block}, 16])")
        pre.emit("P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, "
                 f"parent=O_LAYOUT, k_width={32 // self.dt.bits})")
        pre.emit(f"WG_ROWS: gl.constexpr = {WG_ROWS}")
        top, pre = pre, self._items(pre, env)
        bounds = self._prologue(pre, env)
        row = f"offs_{prog.row.name}"
        pre.emit(f"{row} = i_first + WG * WG_ROWS + gl.arange(0, WG_ROWS, "
                 "layout=gl.SliceLayout(1, S_LAYOUT))")
        env[prog.row.var] = Val(row, ("row",), "i32")
        for st in prog.state:
            init, _ = literal(st.init)
            lay = "O_LAYOUT" if st.roles == ("row", "col") else "gl.SliceLayout(1, S_LAYOUT)"
            shape = f"[WG_ROWS, {col.block}]" if st.roles == ("row", "col") else "[WG_ROWS]"
            pre.emit(f"{st.name} = gl.full({shape}, {init}, gl.float32, {lay})")
            env[st.param] = Val(st.name, st.roles, "f32")
        a, b, v = (self.tensor[x] for x in (sh.a, sh.b, sh.v))
        acc, cast = sh.acc, tl_dtype(self.dt)
        lo = bounds[prog.segments[0].lo]
        with pre.nested("if n_tiles > 0:") as outer:
            outer.emit(f"q_half = {a}_smem.index(WG)")
            outer.emit("s_zero = gl.zeros([WG_ROWS, BLOCK_N], gl.float32, S_LAYOUT)")
            # the element work's values that no tile changes (a per-head ALiBi slope's
            # load, row offsets) are bound once here: nothing moves a load across the
            # loop's barriers (on the H200 a slope loaded per tile made PF-ALiBi's kernel
            # 0.44 ms at 4096, 0.34 with the slope computed in the kernel)
            hoist = Block(self.names, outer.level, parent=outer)
            run = Block(self.names, outer.level, parent=hoist)
            if sh.bias is not None:
                self._bias_operand(hoist, env)
            # the column term's tile part (mma_bias): one more 16-wide step of q . k
            xk = "warpgroup_mma(qx_op, x_smem.permute((1, 0)), "
            run.emit(f"mbarrier.wait(a_bar, {'it & 1' if self.walk else '0'})")
            first = "base % STAGES" if self.walk else "0"
            run.emit(f"mbarrier.wait(b_full.index({first}), "
                     f"{'(base // STAGES) & 1' if self.walk else '0'})")
            run.emit(f"qk = warpgroup_mma(q_half, {b}_smem.index({first}).permute((1, 0)), "
                     "s_zero, use_acc=False)")
            if sh.bias is not None:
                run.emit(f"qk = {xk}qk)")
            _release(run, "b", first)
            p, _ = self._tile(run, env, bounds, lo, "0", hoist)
            run.emit(f"p = {p}")
            with run.nested("for t in range(1, n_tiles):") as body:
                if self.walk:
                    body.emit("g = base + t")
                g = "g" if self.walk else "t"
                body.emit(f"buf = {g} % STAGES")
                body.emit(f"prev = ({g} - 1) % STAGES")
                body.emit(f"mbarrier.wait(b_full.index(buf), ({g} // STAGES) & 1)")
                body.emit(f"qk_token = warpgroup_mma(q_half, {b}_smem.index(buf)"
                          ".permute((1, 0)), s_zero, use_acc=False, is_async=True)")
                if sh.bias is not None:
                    body.emit(f"qk_token = {xk}qk_token, is_async=True)")
                body.emit(f"mbarrier.wait(v_full.index(prev), (({g} - 1) // STAGES) & 1)")
                body.emit(f"p_op = gl.convert_layout(p.to({cast}), P_LAYOUT)")
                body.comment("the product of tile t - 1 runs under tile t's element work")
                body.emit(f"acc_token = warpgroup_mma(p_op, {v}_smem.index(prev), {acc}, "
                          "is_async=True)")
                body.emit("qk = warpgroup_mma_wait(1, deps=(qk_token, ))")
                _release(body, "b", "buf")
                p, f = self._tile(body, env, bounds, lo, "t", hoist)
                body.emit(f"{acc}, p_op = warpgroup_mma_wait(0, deps=(acc_token, p_op))")
                _release(body, "v", "prev")
                body.emit(f"{acc} = {acc} * gl.convert_layout({f}, "
                          "gl.SliceLayout(1, O_LAYOUT))[:, None]")
                body.emit(f"p = {p}")
            if self.walk:   # the item's last q . k is done: the next item's may load
                _release(run, "q", None)
            run.emit(f"last = {self.tile_no('n_tiles')} - 1")
            run.emit("mbarrier.wait(v_full.index(last % STAGES), (last // STAGES) & 1)")
            run.emit(f"p_op = gl.convert_layout(p.to({cast}), P_LAYOUT)")
            run.emit(f"{acc} = warpgroup_mma(p_op, {v}_smem.index(last % STAGES), {acc})")
            if self.walk:
                _release(run, "v", "last % STAGES")
                run.emit("it = it + 1")
            outer.extend(hoist)
            outer.extend(run)
        self._epilogue(pre, env)
        self._close_items(top, pre)
        return top

    def _bias_operand(self, into: Block, env: dict) -> None:
        """``qx_op``, the A operand of the column term's MMA step (:mod:`.mma_bias`):
        per row ``u = C / k`` in three bfloat16 parts, in columns 0-2 of 16."""
        bias = self.shape.bias
        into.comment("the column term C * float(j - s) as one more 16-wide K step of q . k "
                     "(mma_bias): u = C / scale in three bfloat16 parts against x_smem's "
                     "j - j0")
        into.emit("XB: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], "
                  "threads_per_warp=[32, 1], warps_per_cta=[4, 1], order=[1, 0])")
        # bound and remembered here: the tiles' element work reads the same name
        c = Lowerer(self.prog, env, into, None, frozenset()).lower(bias.coef, force="coef")
        coef = c.code
        if c.axes:   # per row: from the accumulator's row layout
            u = into.bind("u", f"gl.convert_layout({coef}, gl.SliceLayout(1, XB)) / "
                          f"{bias.scale!r}")
        else:
            u = into.bind("u", f"gl.full([WG_ROWS], {coef} / {bias.scale!r}, gl.float32, "
                          "gl.SliceLayout(1, XB))")
        u1 = into.bind("u1", f"{u}.to(gl.bfloat16).to(gl.float32)")
        u2 = into.bind("u2", f"({u} - {u1}).to(gl.bfloat16).to(gl.float32)")
        k = into.bind("x_k", "gl.arange(0, 16, layout=gl.SliceLayout(0, XB))[None, :]")
        into.emit(f"qx_op = gl.convert_layout(gl.where({k} == 0, {u1}[:, None], gl.where("
                  f"{k} == 1, {u2}[:, None], gl.where({k} == 2, ({u} - {u1} - {u2})"
                  "[:, None], 0.0))).to(gl.bfloat16), gl.DotOperandLayout(operand_index=0, "
                  "parent=S_LAYOUT, k_width=2))")

    def _tile(self, into: Block, env: dict, bounds: dict, lo: str, t: str,
              hoist: Block) -> tuple[str, str]:
        """The element work of tile ``t`` from ``qk``: each segment's body in a branch
        chosen by the tile's start, what no tile changes bound in ``hoist``; the row
        states updated, ``p`` and the accumulator's factor ``f`` bound to the names
        returned. The first tile's factor is not applied (the accumulator is still
        zero)."""
        prog, sh = self.prog, self.shape
        loop = prog.loop.name
        j0 = into.bind(f"{loop}0", f"{lo} + {t} * BLOCK_N")
        offs = f"offs_{loop}"
        cols = into.bind(f"cols_{loop}",
                         "gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))")
        into.emit(f"{offs} = {j0} + {cols}")
        rows = [s for s in prog.state if s.name != sh.acc]
        outs = [into.names.fresh(f"{s.name}_next") for s in rows]
        p_name, f_name = into.names.fresh("p_next"), into.names.fresh("f_next")
        segs = list(zip(prog.segments, sh.updates))
        for k, (seg, (p, f)) in enumerate(segs):
            head = "else:" if k == len(segs) - 1 else \
                f"{'if' if k == 0 else 'elif'} {j0} < {bounds[seg.hi]}:"
            with into.nested(head) as br:
                local = dict(env)
                local[prog.loop.var] = Val(offs, ("loop",), "i32")
                local[TILE_START] = Val(j0, (), "i32")
                ext = Lowerer(prog, env, br, None, frozenset()).value(
                    extent_expr(prog.loop.extent))
                local[TILE_END] = Val(f"tl.minimum({j0} + BLOCK_N, {ext.code})", (), "i32")
                br.remember(("v", sh.qks[k], ("row", "loop")), Val("qk", ("row", "loop"), "f32",
                                                                ATOM))
                body = dict((s.name, e) for s, e in seg.body)
                roots = [body[s.name] for s in rows] + [p, f]
                variant, hints = self.state_params | {TILE_START, TILE_END}, dict(seg.hints)
                if sh.bias is not None:   # q . k arrives with the column term's tile part
                    roots = [sh.bias.apply(r, sh.qks[k], prog.loop.var, prog.row.var)
                             for r in roots]
                    hints = {sh.bias.apply(e, sh.qks[k], prog.loop.var, prog.row.var): n
                             for e, n in hints.items()}
                    local[BIASED] = Val("qk", ("row", "loop"), "f32", ATOM)
                    variant |= {BIASED}
                uses = count_uses(roots)
                for r in roots:   # a root another root reads is bound once, not twice
                    uses[r] = uses.get(r, 0) + 1
                # a thread of the wgmma accumulator holds the columns 8 k + r (r from
                # the lane and one register bit): Lowerer.column_float
                low = Lowerer(prog, local, br, hoist, variant,
                              guard=seg.guard, uses=uses, hints=hints,
                              columns=(cols, 8))
                vals = [low.value(r) for r in roots[:len(rows)]]
                pv, fv = low.value(roots[-2], ("row", "loop")), low.value(roots[-1])
                br.emit(f"{', '.join(outs + [p_name, f_name])} = "
                        f"{', '.join([v.code for v in vals] + [pv.code, fv.code])}")
        if rows:
            into.emit(f"{', '.join(s.name for s in rows)} = {', '.join(outs)}")
        return p_name, f_name

    def _epilogue(self, pre: Block, env: dict) -> None:
        """Outputs from the final state, in the accumulator's layout (the row values
        converted to it once)."""
        prog = self.prog
        env = dict(env)
        pre.comment("epilogue: outputs from the final state")
        for s in prog.state:
            if s.roles == ("row",):
                pre.emit(f"{s.name}_out = gl.convert_layout({s.name}, "
                         "gl.SliceLayout(1, O_LAYOUT))")
                env[s.param] = Val(f"{s.name}_out", ("row",), "f32")
        row = f"offs_{prog.row.name}_out"
        pre.emit(f"{row} = i_first + WG * WG_ROWS + gl.arange(0, WG_ROWS, "
                 "layout=gl.SliceLayout(1, O_LAYOUT))")
        env[prog.row.var] = Val(row, ("row",), "i32")
        col = prog.col
        pre.emit(f"offs_{col.name} = gl.arange(0, {col.block}, "
                 "layout=gl.SliceLayout(0, O_LAYOUT))")
        env[col.var] = Val(f"offs_{col.name}", ("col",), "i32")
        tiles = [o for o in prog.outputs if prog.row.var in o.axes and col.var in o.axes]
        rest = [o for o in prog.outputs if o not in tiles]
        layout = store_layout(prog, tiles, self.shape)
        if layout is None:
            _store_outputs(prog, pre, env, self.state_params, prog.outputs)
            return
        # (row, col) outputs leave in 16-byte vectors: the MMA layout holds pairs of
        # columns, a pointer (two registers) per 4 bytes -- what made the consumers spill
        pre.emit(f"ST_LAYOUT: gl.constexpr = {layout}")
        pre.emit(f"{row}_st = i_first + WG * WG_ROWS + gl.arange(0, WG_ROWS, "
                 "layout=gl.SliceLayout(1, ST_LAYOUT))")
        pre.emit(f"offs_{col.name}_st = gl.arange(0, {col.block}, "
                 "layout=gl.SliceLayout(0, ST_LAYOUT))")
        at = {prog.row.var: Val(f"{row}_st", ("row",), "i32"),
              col.var: Val(f"offs_{col.name}_st", ("col",), "i32")}
        _store_outputs(prog, pre, env, self.state_params, tiles, relayout=("ST_LAYOUT", at))
        if rest:
            _store_outputs(prog, pre, env, self.state_params, rest)


def _release(block: Block, which: str, buf: str | None) -> None:
    """Every warp of this warpgroup is past its wait: one arrive frees the buffer (of
    the ring, or the one buffer of ``which`` where ``buf`` is None)."""
    block.emit("gl.thread_barrier()")
    block.emit(f"mbarrier.arrive({which}_empty{'' if buf is None else f'.index({buf})'})")
