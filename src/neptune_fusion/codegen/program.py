"""The tile program: what a rolling-update kernel does, as plain frozen data.

It sits between the fusion plan and the Triton text. One program instance of the kernel
owns one value of every *grid* axis (batch, head, ...) and a block of ``BLOCK_M`` values of
the *row* axis (the query axis ``i``); it holds the whole *col* axis (the head dimension
``e`` of the output) in registers and walks the fused reduction axis (the *loop* axis
``j``) in tiles of ``BLOCK_N``, carrying the group's state. *Inner* axes are contraction
axes inside the loop body (``c`` in ``sum(q[i, c] * k[j, c], c)``).

Everything the emitter prints is here as IR: the loop body is one expression per state
variable (the new value, in terms of :class:`~neptune_fusion.ir.nodes.Param` leaves for
the state at the start of the tile), the loop bounds are integer IR over the program's
first and last row, and the epilogue is one expression per output. The emitter decides
nothing about *what* is computed; it only chooses how to print it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.dtypes import int64
from ..ir.nodes import Const, Expr, IndexVar, Param, Size, Tensor
from ..schedule.schedule import Schedule

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


def extent_expr(ext) -> Expr:
    """An axis extent (a symbolic :class:`Size` or an int) as integer IR."""
    return ext if isinstance(ext, Size) else Const(ext, int64)


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

    @property
    def name(self) -> str:
        return self.var.name

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


@dataclass(frozen=True)
class Segment:
    """One loop over tiles ``j0 in range(lo, hi, BLOCK_N)``."""

    lo: str                    # names of prologue scalars (see TileProgram.bounds)
    hi: str
    masked: bool               # boundary tiles: masks applied; interior: none
    body: tuple[tuple[StateVar, Expr], ...]
    hints: tuple[tuple[Expr, str], ...] = ()   # readable names for values of the body
    guard: bool = False        # tiles may cross the end of the loop axis: check j < extent


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

    @property
    def state(self) -> tuple[StateVar, ...]:
        return tuple(s for a in self.accumulators for s in a.state)

    @property
    def axes(self) -> tuple[Axis, ...]:
        tail = (self.col,) if self.col is not None else ()
        return self.grid + (self.row, self.loop) + tail + self.inner

    def role_of(self, v: IndexVar) -> Axis | None:
        for a in self.axes:
            if a.var is v:
                return a
        return None

    def blocks(self) -> tuple[tuple[str, Axis], ...]:
        """Every constexpr tile size and the axis it covers."""
        return tuple((a.block, a) for a in self.axes if a.block is not None)
