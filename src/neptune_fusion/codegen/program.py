"""The tile program: what a rolling-update kernel does, as plain frozen data.

It sits between the fusion plan and the Triton text. One program instance of the kernel
owns one value of every *grid* axis (batch, head, ...) and a block of ``BLOCK_M`` values of
the *row* axis (the query axis ``i``); it holds the whole *col* axis (the head dimension
``e`` of the output) in registers and walks the fused reduction axis (the *loop* axis
``j``) in tiles of ``BLOCK_N``, carrying the group's state. *Inner* axes are contraction
axes inside the loop body (``c`` in ``sum(q[i, c] * k[j, c], c)``).

A *phased* program runs several such loops over the same tiles of the same rows, one
after the other (a chain no repair fuses: ``sum_j tanh(x - max_j x)``). Every accumulator
and segment has a ``phase``; phase ``k``'s loops update only phase ``k``'s state, and its
terms read the state of earlier phases as plain final values (registers, no workspace).
A program of one phase is the ordinary rolling kernel.

Everything the emitter prints is here as IR: the loop body is one expression per state
variable (the new value, in terms of :class:`~neptune_fusion.ir.nodes.Param` leaves for
the state at the start of the tile), the loop bounds are integer IR over the program's
first and last row, and the epilogue is one expression per output. The emitter decides
nothing about *what* is computed; it only chooses how to print it.

:meth:`TileProgram.check` states the structural invariants the emitter relies on; the
pipeline runs it after each stage that builds a program when ``NEPTUNE_FUSION_VERIFY``
is on.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from ..errors import VerificationError
from ..ir.dtypes import int64
from ..ir.nodes import Const, Expr, IndexVar, Load, Param, Size, Tensor
from ..ir.reducers import reducer
from ..ir.traverse import walk
from ..schedule.schedule import Schedule
from .triton_ops import REDUCE_OPS

ROLES = ("grid", "row", "loop", "col", "inner")
# Canonical axis order of 2-d tile values: rows, then the loop axis, then columns.
TILE_ORDER = {"row": 0, "loop": 1, "col": 2, "inner": 3}

I_FIRST = Param("i_first", int64)   # first row of this program's block
I_LAST = Param("i_last", int64)     # last row of the block that exists (< N)
BLOCK_N = Param("BLOCK_N", int64)   # the loop's tile size (a constexpr of the kernel)
TILE_START = Param("j_start", int64)  # first loop index of the current tile
LOOP_LO = Param("j_lo", int64)        # first loop index the program visits
TILE_END = Param("j_end", int64)      # one past its last index inside the axis
SPLIT_ID = Param("split_id", int64)   # split-k: the chunk of the loop axis (program_id(2))
COL_START = Param("col_start", int64)  # first column of the epilogue's current chunk
# lower bounds of the kernel's index parameters: where an integer // or % is of values
# never negative (ir.fold.lower_bound), Triton's truncating operators are the IR's floor
INDEX_PARAMS = MappingProxyType({I_FIRST: 0, I_LAST: 0, BLOCK_N: 1, TILE_START: 0, LOOP_LO: 0,
                                 TILE_END: 0, SPLIT_ID: 0, COL_START: 0})

# producers whose split values a consumer's repair moves to the merged one (split.py). A
# sum's split value is its chunk's partial sum: the derived update M(r, r') holds for
# every pair r, r', so it moves a chunk's state from its own partial sum to the total as
# it moves a rolling state from one prefix sum to the next (variance).
SPLIT_PRODUCERS = ("max", "min", "sum")


def extent_expr(ext) -> Expr:
    """An axis extent (a symbolic :class:`Size` or an int) as integer IR."""
    return ext if isinstance(ext, Size) else Const(ext, int64)


def contiguous_strides(shape) -> tuple[int, ...]:
    """The strides of a row-major tensor of ``shape`` (ints), as ``torch.empty`` makes
    them (an empty dimension counts as one)."""
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def extent_value(ext, sizes: dict) -> int:
    """An axis extent's value, ``sizes`` mapping each :class:`Size` to its bound value."""
    return sizes[ext] if isinstance(ext, Size) else int(ext)


@dataclass(frozen=True)
class Axis:
    """An index variable of the kernel and the part it plays."""

    var: IndexVar
    role: str                  # one of ROLES
    block: str | None = None   # the constexpr tile size that covers it (BLOCK_M, ...)
    block_size: int | None = None  # the tile size when known now (else: from the extent)
    # the output-column axis of a program whose state has no column: the epilogue walks it
    # in tiles of at most ``chunk`` (softmax's row is written piecewise, not as one tile)
    chunk: int | None = None
    # the output-column axis tiled across programs (``Schedule.block_col``): each program
    # covers one tile of ``block_size`` columns, ``pid_col`` of the row x column grid
    programs: bool = False
    # the identifier stem in the source when the variable's own name is taken by another
    # axis of the kernel (two distinct index variables may share a name: a derived
    # program's); None: the variable's name
    ident: str | None = None

    @property
    def name(self) -> str:
        return self.ident or self.var.name

    @property
    def extent(self):
        return self.var.extent


@dataclass(frozen=True)
class TensorArg:
    """A tensor the kernel reads (``input``) or writes (``output``)."""

    name: str        # identifier stem: pointer ``{name}_ptr``, strides ``{name}_s{d}``
    tensor: Tensor
    kind: str        # "input" | "output"

    def stride(self, d: int) -> Param:
        """The stride of dimension ``d`` as an IR leaf (the last dimension has stride 1)."""
        return Param(f"{self.name}_s{d}", int64)


@dataclass(frozen=True)
class StateVar:
    """One component of a member's carried state: a register tile of the loop."""

    name: str
    param: Param               # how the loop body refers to the value at tile start
    roles: tuple[str, ...]     # ("row",) or ("row", "col")
    init: float                # the reducer's identity


@dataclass(frozen=True)
class Accumulator:
    """A member of the fused group, in kernel terms (loop variable renamed to ``j``).

    ``terms[i]`` is reduced over the tile into component ``i``; consumers read producer
    ``k``'s running value as ``running(k)`` and are repaired by ``updates``. Plain members
    (no producers) have one term, their body.
    """

    name: str
    op: str                            # reducer of the terms: sum, max, min
    producers: tuple[int, ...]         # indices of producer accumulators
    terms: tuple[Expr, ...]
    updates: tuple[Expr, ...]          # empty for plain members
    state: tuple[StateVar, ...]
    scaled: float = 1.0                # state kept as value * scaled (exp2 domain)
    phase: int = 0                     # the phase whose loop reduces it (module docstring)
    # (component i, accumulator p): component i equals p's state, the same sum at the same
    # running values (algebra/augmented.py, "Shared components"): it takes p's new value
    # instead of reducing its own terms
    shared: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Segment:
    """One loop over tiles ``j0 in range(lo, hi, BLOCK_N)``."""

    lo: str                    # names of prologue scalars (see TileProgram.bounds)
    hi: str
    masked: bool               # boundary tiles: masks applied; interior: none
    body: tuple[tuple[StateVar, Expr], ...]
    hints: tuple[tuple[Expr, str], ...] = ()   # readable names for values of the body
    guard: bool = False        # tiles may cross the end of the loop axis: check j < extent
    phase: int = 0             # updates the state of this phase's accumulators only
    # the ragged tail alone (tiles past the loop length's last multiple of BLOCK_N, no
    # other mask bounds it): empty when the length is a multiple of BLOCK_N
    tail: bool = False


@dataclass(frozen=True)
class Output:
    arg: TensorArg
    axes: tuple[IndexVar, ...]     # the output's own axis order
    body: Expr                     # over row/col/grid vars and final state Params


@dataclass(frozen=True)
class Split:
    """Split-k: which of the two kernels this program is, and the fp32 workspace.

    ``workspace[k]`` holds state variable ``k`` of every split, indexed
    ``[split, *grid, row, (col)]``; the partial kernel writes it, the combine reads it.
    """

    splits: int
    stage: str                                   # "partial" | "combine"
    workspace: tuple[tuple[StateVar, TensorArg], ...]
    chunk: Expr                                  # loop elements per split (a BLOCK_N multiple)
    col_blocks: int = 1   # "combine": programs per row block over the col axis (grid z)


@dataclass(frozen=True)
class TileProgram:
    """A rolling-update kernel (see module docstring)."""

    name: str
    inputs: tuple[TensorArg, ...]
    outputs: tuple[Output, ...]
    sizes: tuple[Size, ...]                 # passed as int arguments
    grid: tuple[Axis, ...]                  # flattened into program_id(1), innermost first
    row: Axis
    col: Axis | None
    loop: Axis
    inner: tuple[Axis, ...]
    accumulators: tuple[Accumulator, ...]
    bounds: tuple[tuple[str, Expr], ...]    # prologue scalars (loop bounds), in order
    segments: tuple[Segment, ...]
    schedule: Schedule
    rules: tuple[str, ...] = ()             # speed/lowering rules applied, for reports
    split: Split | None = None              # split-k stage (None: the rolling kernel)
    # one loop tile covers the whole loop axis (a persistent schedule): "static" -- always
    # (a static extent <= BLOCK_N): no loops, the tile is loaded once and every phase and
    # the epilogue read it; "runtime" -- a symbolic extent: that code when the extent fits
    # BLOCK_N at run time, the loops otherwise; "" -- the loops
    one_tile: str = ""
    # the epilogue's own axes beyond the column: output axes that no reduction reads (an
    # instance norm's h when w is the column). Scalar loops around the epilogue, not grid
    # axes: as grid axes each program would run the whole reduction again for its value
    # (64x the reads on the H200's instance norm, 2026-12-04). Role "grid" (a scalar).
    epi: tuple[Axis, ...] = ()

    @property
    def state(self) -> tuple[StateVar, ...]:
        return tuple(s for a in self.accumulators for s in a.state)

    @property
    def phases(self) -> int:
        """How many phases (loops over the fused axis, one after the other) it runs."""
        return 1 + max((a.phase for a in self.accumulators), default=0)

    def phase_state(self, k: int) -> tuple[StateVar, ...]:
        """The state variables phase ``k``'s loops update."""
        return tuple(s for a in self.accumulators if a.phase == k for s in a.state)

    @property
    def axes(self) -> tuple[Axis, ...]:
        tail = (self.col,) if self.col is not None else ()
        return self.grid + (self.row, self.loop) + tail + self.inner + self.epi

    def role_of(self, v: IndexVar) -> Axis | None:
        for a in self.axes:
            if a.var is v:
                return a
        return None

    def blocks(self) -> tuple[tuple[str, Axis], ...]:
        """Every constexpr tile size and the axis it covers."""
        return tuple((a.block, a) for a in self.axes if a.block is not None)

    def check(self) -> TileProgram:
        """Raise :class:`VerificationError` naming the first broken invariant; return self.

        Axes play their roles with consistent tile sizes; every accumulator's state is
        its reducer's and the loop bodies of each phase update exactly that phase's
        state (phases numbered from 0, loops in phase order, producers in their
        consumer's phase); every expression
        reads only what the kernel defines there (its axes, the state, the loop's
        position, its input tensors and size arguments); every output has the row axis;
        the split-k stage, if any, agrees with the workspace it writes or reads; a one-tile
        program is a rolling one whose tile covers the loop axis.
        """
        for part in (_check_axes, _check_tensors, _check_state, _check_segments,
                     _check_outputs, _check_split, _check_one_tile):
            part(self)
        return self


def _fail(prog: TileProgram, invariant: str, detail: str) -> None:
    raise VerificationError(f"tile program {prog.name!r}: {invariant}: {detail}")


def _same(xs, ys) -> bool:
    """The same objects in the same order."""
    return len(xs) == len(ys) and all(x is y for x, y in zip(xs, ys))


def _pow2(n: int) -> bool:
    return isinstance(n, int) and n > 0 and n & (n - 1) == 0


def _check_axes(prog: TileProgram) -> None:
    want = [(a, "grid") for a in prog.grid] + [(prog.row, "row"), (prog.loop, "loop")]
    want += [(prog.col, "col")] if prog.col is not None else []
    want += [(a, "inner") for a in prog.inner] + [(a, "grid") for a in prog.epi]
    for a, role in want:
        if a.role != role:
            _fail(prog, "axis roles", f"{a.name} has role {a.role!r} where {role!r} belongs")
        if (a.block is None) != (role == "grid"):
            _fail(prog, "axis roles", f"{role} axis {a.name} has tile size {a.block!r}")
        if a.block_size is not None and not _pow2(a.block_size) and not (
                role == "row" and prog.schedule.dialect == "gluon"
                and a.block_size % 64 == 0):   # Gluon: whole 64-row warpgroups
            _fail(prog, "tile sizes", f"{a.block} = {a.block_size} is not a power of two")
        if a.programs and (role != "col" or a.block_size is None or a.chunk is not None
                           or prog.split is not None):
            _fail(prog, "column tiles", f"{role} axis {a.name} is tiled across programs; "
                  "only the column axis of a rolling kernel with a fixed tile may be")
        if a.programs and any(all(v is not a.var for v in o.axes) for o in prog.outputs):
            _fail(prog, "column tiles", f"an output lacks the column axis {a.name}, which "
                  "is tiled across programs (every column program would write it)")
    vars_ = [a.var for a in prog.axes]
    if len({id(v) for v in vars_}) != len(vars_):
        _fail(prog, "axis roles", "an index variable plays two roles")
    names = [b for b, _ in prog.blocks()]
    if len(set(names)) != len(names):
        _fail(prog, "tile sizes", f"a tile size names two axes ({', '.join(names)})")
    # the emitter prints BLOCK_M and BLOCK_N by name; the schedule gives their values
    for a, name, size in ((prog.row, "BLOCK_M", prog.schedule.block_m),
                          (prog.loop, "BLOCK_N", prog.schedule.block_n)):
        if a.block != name or a.block_size != size:
            _fail(prog, "tile sizes", f"the {a.role} axis is tiled by {a.block} = "
                  f"{a.block_size}, not {name} = {size} (the schedule's)")


def _check_tensors(prog: TileProgram) -> None:
    args = prog.inputs + tuple(o.arg for o in prog.outputs)
    for t in args:
        kind = "input" if t in prog.inputs else "output"
        if t.kind != kind:
            _fail(prog, "tensor arguments", f"{t.name} is an {kind} of kind {t.kind!r}")
    if len({t.name for t in args}) != len(args):
        _fail(prog, "tensor arguments", "two tensor arguments share a name")
    shapes = [s for t in args for s in t.tensor.shape]
    extents = [a.extent for a in prog.axes]
    for s in shapes + extents:
        if isinstance(s, Size) and s not in prog.sizes:
            _fail(prog, "sizes", f"{s.name} is read but not a size argument")


def _check_state(prog: TileProgram) -> None:
    names = [s.name for s in prog.state]
    if len(set(names)) != len(names):
        _fail(prog, "state", f"two state variables share a name ({', '.join(names)})")
    for k, a in enumerate(prog.accumulators):
        if a.op not in REDUCE_OPS:
            _fail(prog, "state", f"{a.name} reduces with {a.op}, which is not lowered")
        if any(not 0 <= p < k for p in a.producers):
            _fail(prog, "state", f"{a.name} reads a producer that is not listed before it")
        if any(prog.accumulators[p].phase != a.phase for p in a.producers):
            _fail(prog, "phases", f"{a.name} reads the running value of a producer of "
                  "another phase")
        before = prog.accumulators[k - 1].phase if k else 0
        if a.phase not in (before, before + 1):
            _fail(prog, "phases", f"{a.name} is in phase {a.phase} after phase {before} "
                  "(phases are numbered from 0, in order)")
        n = len(a.state)
        if len(a.terms) != n or len(a.updates) != (n if a.producers else 0):
            _fail(prog, "state", f"{a.name} has {n} state variable(s), {len(a.terms)} "
                  f"term(s) and {len(a.updates)} update(s)")
        for s in a.state:
            if s.init != reducer(a.op).identity:
                _fail(prog, "state", f"{s.name} starts at {s.init}, not the identity of "
                      f"{a.op}")
            if s.roles not in (("row",), ("row", "col"), ("row", "loop")) or \
                    ("col" in s.roles and prog.col is None) or \
                    ("loop" in s.roles and (a.producers or prog.split is not None)):
                _fail(prog, "state", f"{s.name} spans {s.roles}; states span the row "
                      "axis and maybe the column axis (or, a deferred plain member of a "
                      "rolling kernel, the loop axis)")


def _reads(prog: TileProgram, where: str, exprs, params: set, variables: set) -> None:
    """Every Param, free index variable, Size and load of ``exprs`` is defined."""
    inputs = {id(t.tensor) for t in prog.inputs}
    for e in exprs:
        loose = [v.name for v in e.free_vars if all(v is not u for u in variables)]
        if loose:
            _fail(prog, "defined values", f"{where} uses {', '.join(sorted(loose))}, "
                  "not an axis there")
        for x in walk(e):
            if isinstance(x, Param) and x not in params:
                _fail(prog, "defined values", f"{where} reads {x.name}, not defined there")
            if isinstance(x, Size) and x not in prog.sizes:
                _fail(prog, "sizes", f"{where} reads {x.name}, not a size argument")
            if isinstance(x, Load) and id(x.tensor) not in inputs:
                _fail(prog, "defined values", f"{where} loads {x.tensor.name}, not an input")


def _check_segments(prog: TileProgram) -> None:
    bound = dict(prog.bounds)
    split = {SPLIT_ID} if prog.split is not None else set()
    spatial = {a.var for a in prog.grid}
    _reads(prog, "the loop bounds", bound.values(), {I_FIRST, I_LAST, BLOCK_N} | split,
           spatial)
    tile = {TILE_START, TILE_END, BLOCK_N, I_FIRST} | split
    tile |= {LOOP_LO} if "lo" in bound else set()
    tile |= {I_LAST} if any(x is I_LAST for e in bound.values() for x in walk(e)) else set()
    rows = spatial | {prog.row.var} | ({prog.col.var} if prog.col is not None else set())
    if not prog.segments and (prog.split is None or prog.split.stage != "combine"):
        _fail(prog, "segments", "no loop over the fused axis")
    phases = [seg.phase for seg in prog.segments]
    if prog.segments and (phases != sorted(phases) or set(phases) != set(range(prog.phases))):
        _fail(prog, "phases", f"the loops run phases {phases}; every phase of "
              f"0..{prog.phases - 1} has loops, in order")
    for seg in prog.segments:
        where = f"segment {seg.lo}..{seg.hi}" + (f" of phase {seg.phase}"
                                                 if prog.phases > 1 else "")
        if seg.lo not in bound or seg.hi not in bound:
            _fail(prog, "segments", f"{where} runs between bounds the prologue lacks")
        own = prog.phase_state(seg.phase)
        if not _same([s for s, _ in seg.body], own):
            _fail(prog, "segments", f"{where} updates "
                  f"{', '.join(s.name for s, _ in seg.body)}, not the accumulators' "
                  f"state ({', '.join(s.name for s in own)})")
        if seg.guard and not seg.masked:
            _fail(prog, "segments", f"{where} checks the axis end but is unmasked")
        # the state of earlier phases is final here: read as a plain value; a deferred
        # (loop-spanning) state reads the tile itself
        state = {s.param for k in range(seg.phase + 1) for s in prog.phase_state(k)}
        for v, e in seg.body:
            _reads(prog, where, [e], state | tile,
                   rows | ({prog.loop.var} if "loop" in v.roles else set()))


def _check_outputs(prog: TileProgram) -> None:
    state = {s.param for s in prog.state}
    rows = {a.var for a in prog.grid + prog.epi} | {prog.row.var}
    rows |= {prog.col.var} if prog.col is not None else set()
    split = prog.split is not None and prog.split.stage == "partial"
    for o in prog.outputs:
        where = f"output {o.arg.name}"
        if all(v is not prog.row.var for v in o.axes):
            _fail(prog, "outputs", f"{where} does not have the row axis {prog.row.name}")
        if len(o.axes) != o.arg.tensor.ndim:
            _fail(prog, "outputs", f"{where} has {len(o.axes)} axes for a "
                  f"{o.arg.tensor.ndim}-d tensor")
        for v in o.axes:
            if not (any(v is u for u in rows) or (split and v is SPLIT_ID)):
                _fail(prog, "outputs", f"{where} is indexed by {v}, not a grid, row or "
                      "column axis")
        if not (o.arg.tensor.dtype.is_float or o.arg.tensor.dtype.is_bool):
            _fail(prog, "outputs", f"{where} is {o.arg.tensor.dtype}, not a float or "
                  "boolean tensor")
        _reads(prog, where, [o.body], state, rows)


def _check_split(prog: TileProgram) -> None:
    sp = prog.split
    if sp is None:
        return
    if prog.phases > 1:
        _fail(prog, "split-k", f"a program of {prog.phases} phases is not split")
    if sp.stage not in ("partial", "combine") or not isinstance(sp.splits, int) \
            or sp.splits < 1:
        _fail(prog, "split-k", f"stage {sp.stage!r} with {sp.splits} splits")
    if not _same([s for s, _ in sp.workspace], prog.state):
        _fail(prog, "split-k", "the workspace does not hold exactly the accumulators' state")
    for a in prog.accumulators:
        if any(prog.accumulators[p].op not in SPLIT_PRODUCERS for p in a.producers):
            _fail(prog, "split-k", f"{a.name} reads a producer that is not a "
                  f"{' or '.join(SPLIT_PRODUCERS)}")
    ws = tuple(arg for _, arg in sp.workspace)
    if sp.stage == "partial":
        if tuple(o.arg for o in prog.outputs) != ws or sp.col_blocks != 1 or \
                any(o.body is not s.param for o, s in zip(prog.outputs, prog.state)):
            _fail(prog, "split-k", "the partial kernel must store its state to the "
                  "workspace, one output per state variable")
        return
    if tuple(t.tensor for t in prog.inputs[:len(ws)]) != tuple(t.tensor for t in ws):
        _fail(prog, "split-k", "the combine kernel must read the workspace first")
    if prog.segments or prog.bounds or prog.inner:
        _fail(prog, "split-k", "the combine kernel has no loop over the fused axis")
    c = prog.col
    loads = [x for o in prog.outputs for x in walk(o.body) if isinstance(x, Load)]
    if {t.tensor for t in prog.inputs[len(ws):]} - {x.tensor for x in loads}:
        _fail(prog, "split-k", "a combine kernel reads only the inputs its outputs load")
    if c is not None and c.chunk is None and any(c.var in x.free_vars for x in loads):
        _fail(prog, "split-k", "a combine kernel that reads inputs along its column cuts "
              "a chunked column")
    if sp.col_blocks > 1 and (c is None or (c.chunk is None and
                                            c.block_size * sp.col_blocks != c.extent)):
        _fail(prog, "split-k", f"{sp.col_blocks} column programs do not cover the column "
              "axis")


def _check_one_tile(prog: TileProgram) -> None:
    mode, ext = prog.one_tile, prog.loop.extent
    if mode not in ("", "static", "runtime"):
        _fail(prog, "one tile", f"mode {mode!r} is not '', 'static' or 'runtime'")
    if mode and prog.split is not None:
        _fail(prog, "one tile", "a split-k program walks chunks of the loop axis")
    if mode == "static" and not (isinstance(ext, int) and ext <= prog.schedule.block_n):
        _fail(prog, "one tile", f"BLOCK_N = {prog.schedule.block_n} does not cover the loop "
              f"axis {prog.loop.name} < {ext}")
    if mode == "runtime" and isinstance(ext, int):
        _fail(prog, "one tile", f"the loop axis {prog.loop.name} < {ext} is static: whether "
              "one tile covers it is known now")
