"""The schedule of a rolling-update kernel: plain, frozen, JSON-serialisable data.

A schedule says *how* a plan runs (tile sizes, launch parameters, which speed rules apply),
never *what* it computes: every schedule that passes :meth:`Schedule.check` gives the same
result up to rounding. The defaults are the FlashAttention-2 shape that is fast on an H200
for head dim 128 (BLOCK_M=128, BLOCK_N=64, 8 warps, 3 pipeline stages); with
``schedule="auto"`` the auto-scheduler (:mod:`neptune_fusion.runtime.auto`) picks a schedule
per shape class from the search space (:mod:`.space`) by the cost model (:mod:`.cost`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from ..errors import ScheduleError

FP32_PRECISIONS = ("ieee", "tf32")
STRATEGIES = ("rolling", "split", "library")
DIALECTS = ("triton", "gluon")
MAX_BLOCK = 1 << 20   # Triton's largest tensor (TRITON_MAX_TENSOR_NUMEL)
# with block_col: row tiles that walk the column tiles together (the grid's L2 grouping)
COL_GROUP = 8


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@dataclass(frozen=True, slots=True)
class Schedule:
    """Tile sizes, launch parameters and speed rules of one kernel.

    * ``block_m`` rows of the query-like axis per program, ``block_n`` elements of the
      fused reduction axis per loop iteration (both powers of two; a tile axis that feeds
      ``tl.dot`` needs >= 16, which the lowering checks against the program:
      :func:`~neptune_fusion.codegen.lower.check_tiles`);
    * ``num_warps`` / ``num_stages``: Triton launch parameters;
    * ``exp2``: rewrite ``exp`` to ``exp2`` with ``log2(e)`` folded into the score scale,
      running maxima kept in the scaled domain;
    * ``partition``: skip tiles the mask removes entirely and run interior tiles without
      mask arithmetic (off: one masked loop over every tile, the baseline);
    * ``fast_tanh``: ``tanh.approx.f32`` through inline PTX on CUDA (the interpreter always
      uses a portable formula);
    * ``fp32_precision``: ``tl.dot`` precision for float32 operands (``"ieee"`` exact,
      ``"tf32"`` faster on tensor cores);
    * ``strategy``: ``"rolling"`` (one program walks the whole fused axis) or ``"split"``
      (split-k: ``splits`` programs each walk one chunk of it and write their partial state
      to a float32 workspace; a second kernel merges the partials with the derived repairs)
      or ``"library"`` (a contraction output run as ``torch.matmul``, its computed
      operands materialised by our own kernels first: :mod:`..runtime.library`; the tile
      fields do not apply);
    * ``block_col``: 0 (default) covers the output-column axis in one tile per program
      (attention's head dim); a power of two tiles it across programs instead, so the grid
      is row tiles x column tiles as a GEMM's (a norm followed by a matmul; each program
      recomputes its rows' statistics, a few percent of the work); rolling only, and no
      effect on a kernel whose carried state has no column axis;
    * ``tma``: 2-d tile loads through tensor descriptors (the copy engine of Hopper-class
      GPUs, ``codegen/tma.py``); a call whose inputs break the copy engine's alignment
      rules runs the kernel's pointer loads instead. Rolling only; opt-in (not in the
      auto-scheduler's space: docs/hopper.md);
    * ``gather_stages``: 0 (default) pipelines every tile loop ``num_stages`` deep; n > 0
      pipelines a loop that loads through a table (a paged KV cache) n deep, which at
      ``2 * num_stages - 1`` keeps as many tiles in flight as a direct load does at
      ``num_stages`` (Triton places a load addressed by a load a stage later:
      docs/codegen.md, "Loads"); the search space sets it where one program per
      multiprocessor must hide the latency alone;
    * ``static_sizes``: Triton specialises the kernel on its symbolic sizes (whether each
      is 1 and whether a multiple of 16), as for a static shape: at most a few compiled
      kernels per shape class instead of one for every length. Off (default), only the
      output column's extent is specialised (codegen/source.unspecialized_sizes), so a
      decode loop's growing key length reuses one compiled kernel; on where the lengths
      are fixed per step and measurement says it pays (the backward's ``d_k, d_v``
      kernel: docs/autodiff.md);
    * ``row_programs``: 0 (default) launches a program per row block. n > 0, for a row
      reduction whose one tile covers the row (a persistent schedule): n programs per
      multiprocessor walk the row blocks, each loading the next block's tile before this
      one's arithmetic (codegen/source._walk_rows); in the Gluon dialect, n programs per
      multiprocessor walk the (row block, batch and head) items, the next item's loads
      issued while this one's output is stored (codegen/gluon.py); no effect on other
      kernels;
    * ``dialect``: ``"triton"`` (default: the portable kernel, every GPU and the
      interpreter) or ``"gluon"``: the same tile program printed in Triton's Gluon dialect
      for Hopper-class GPUs (TMA, asynchronous warpgroup MMAs: ``codegen/gluon.py``) --
      rolling attention-shaped programs only, CUDA only, 16-byte aligned inputs, ``block_m``
      128 with 8 warps (two consumer warpgroups) or 192 with 12 (three; the one block_m
      that is not a power of two), ``num_stages`` buffers per operand. In the
      auto-scheduler's space on sm_90 with Triton 3.6 unless ``NEPTUNE_FUSION_GLUON=0``
      (docs/hopper.md);
    * ``count_visits``: debug; the kernel counts the tiles it visits per program into a
      buffer (masked and interior tiles apart): ``Kernel.launch(...).visits``.
    """

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 3
    exp2: bool = True
    partition: bool = True
    fast_tanh: bool = True
    fp32_precision: str = "ieee"
    count_visits: bool = False
    strategy: str = "rolling"
    splits: int = 1
    block_col: int = 0
    tma: bool = False
    gather_stages: int = 0
    static_sizes: bool = False
    row_programs: int = 0
    dialect: str = "triton"

    def check(self) -> Schedule:
        """Raise :class:`ScheduleError` naming the first violated invariant; return self."""
        # the Gluon dialect's three consumer warpgroups: 192 rows on 12 warps
        three = self.dialect == "gluon" and (self.block_m, self.num_warps) == (192, 12)
        for name in ("block_m", "block_n"):
            v = getattr(self, name)
            if (not isinstance(v, int) or isinstance(v, bool) or not _pow2(v)
                    or v > MAX_BLOCK) and not (three and name == "block_m"):
                raise ScheduleError(f"schedule: {name} must be a power of two in "
                                    f"[1, {MAX_BLOCK}] (or block_m=192 with num_warps=12 "
                                    f"in the Gluon dialect), got {v!r}")
        if self.num_warps not in (1, 2, 4, 8, 16) and not three:
            raise ScheduleError(
                f"schedule: num_warps must be one of 1, 2, 4, 8, 16 (or 12 with block_m=192 "
                f"in the Gluon dialect), got {self.num_warps!r}")
        if not isinstance(self.num_stages, int) or not 1 <= self.num_stages <= 8:
            raise ScheduleError(
                f"schedule: num_stages must be an int in [1, 8], got {self.num_stages!r}")
        if self.fp32_precision not in FP32_PRECISIONS:
            raise ScheduleError(
                f"schedule: fp32_precision must be one of {', '.join(FP32_PRECISIONS)}, "
                f"got {self.fp32_precision!r}")
        if self.strategy not in STRATEGIES:
            raise ScheduleError(f"schedule: strategy must be one of {', '.join(STRATEGIES)}, "
                                f"got {self.strategy!r}")
        if not isinstance(self.splits, int) or isinstance(self.splits, bool) \
                or self.splits < 1:
            raise ScheduleError(f"schedule: splits must be an int >= 1, got {self.splits!r}")
        bc = self.block_col
        if not isinstance(bc, int) or isinstance(bc, bool) or bc < 0 or \
                (bc and not _pow2(bc)) or bc > MAX_BLOCK:
            raise ScheduleError(f"schedule: block_col must be 0 (the whole column axis) or "
                                f"a power of two <= {MAX_BLOCK}, got {bc!r}")
        if bc and self.strategy != "rolling":
            raise ScheduleError(f"schedule: block_col={bc} (column tiles across programs) "
                                "needs strategy='rolling'")
        gs = self.gather_stages
        if not isinstance(gs, int) or isinstance(gs, bool) or not 0 <= gs <= 16:
            raise ScheduleError(f"schedule: gather_stages must be an int in [0, 16] (0: "
                                f"num_stages), got {gs!r}")
        rp = self.row_programs
        if not isinstance(rp, int) or isinstance(rp, bool) or not 0 <= rp <= 8:
            raise ScheduleError(f"schedule: row_programs must be an int in [0, 8] (0: a "
                                f"program per row block), got {rp!r}")
        if rp and self.strategy != "rolling":
            raise ScheduleError(f"schedule: row_programs={rp} needs strategy='rolling'")
        if self.strategy != "split" and self.splits != 1:
            raise ScheduleError(f"schedule: splits={self.splits} needs strategy='split'")
        if self.tma and self.strategy != "rolling":
            raise ScheduleError(f"schedule: tma=True needs strategy='rolling', got "
                                f"{self.strategy!r}")
        if self.dialect not in DIALECTS:
            raise ScheduleError(f"schedule: dialect must be one of {', '.join(DIALECTS)}, "
                                f"got {self.dialect!r}")
        if self.dialect == "gluon" and (self.strategy != "rolling" or self.tma):
            raise ScheduleError("schedule: dialect='gluon' needs strategy='rolling' (and "
                                "loads every tile by TMA itself: tma=False)")
        for name in ("exp2", "partition", "fast_tanh", "count_visits", "tma", "static_sizes"):
            if not isinstance(getattr(self, name), bool):
                raise ScheduleError(f"schedule: {name} must be a bool, "
                                    f"got {getattr(self, name)!r}")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    def brief(self) -> str:
        """One line for logs and listings: ``rolling 128x128 warps=8 stages=2 gluon``,
        ``split 16x128 warps=4 stages=3 splits=8``; fields at their defaults left out."""
        extra = [f"splits={self.splits}" if self.strategy == "split" else "",
                 f"block_col={self.block_col}" if self.block_col else "",
                 f"row_programs={self.row_programs}" if self.row_programs else "",
                 "tma" if self.tma else "",
                 self.dialect if self.dialect != "triton" else ""]
        return " ".join([f"{self.strategy} {self.block_m}x{self.block_n} "
                         f"warps={self.num_warps} stages={self.num_stages}"]
                        + [x for x in extra if x])

    def to_json(self) -> str:
        """The schedule as a JSON object (every field; :meth:`from_json` reads it back)."""
        import json
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        """A schedule from :meth:`to_json`'s text (fields left out keep their defaults);
        validated, so a bad field raises :class:`ScheduleError` naming it."""
        import json
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as err:
            raise ScheduleError(f"schedule: not JSON: {err}") from None
        if not isinstance(data, dict):
            raise ScheduleError(f"schedule: JSON must be an object, got {type(data).__name__}")
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict) -> Schedule:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ScheduleError(f"schedule: unknown field(s) {', '.join(unknown)}; "
                                f"known: {', '.join(sorted(known))}")
        return cls(**data).check()


def make_schedule(schedule: Schedule | None = None, **options) -> Schedule:
    """``schedule`` (default :class:`Schedule`) with ``options`` replaced, checked."""
    base = Schedule() if schedule is None else schedule
    if not isinstance(base, Schedule):
        raise ScheduleError(f"schedule must be a neptune_fusion Schedule, got {base!r}")
    known = {f.name for f in fields(Schedule)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ScheduleError(f"unknown option(s) {', '.join(unknown)}; schedule fields are "
                            f"{', '.join(sorted(known))}")
    return replace(base, **options).check() if options else base.check()


def default_schedule(head_dim: int, query_len: int | None = None,
                     itemsize: int = 2) -> Schedule:
    """The default schedule for a head dimension (and a known query length, for decode).

    Head dim <= 128: BLOCK_M=128, BLOCK_N=64, 8 warps, 3 stages (FlashAttention-2 on Hopper).
    Larger heads halve BLOCK_N to keep the tiles in registers; 4-byte inputs use 2 stages
    (3 stages of fp32 K and V tiles nearly fill an H200's shared memory). A query length
    <= 16 (decode) uses BLOCK_M=16: one program per head, the smallest ``tl.dot`` tile.
    """
    s = Schedule() if head_dim <= 128 else Schedule(block_n=32)
    if itemsize >= 4:
        s = replace(s, num_stages=2)
    if query_len is not None and query_len <= 16:
        s = replace(s, block_m=16, num_warps=4)
    return s
