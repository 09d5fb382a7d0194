"""What the auto-scheduler reasons about: the device, the problem, and the search space.

All three are plain frozen data, so the cost model (:mod:`.cost`) and the search are pure
functions of them and testable without a GPU.

* :class:`Device`: the numbers of one GPU the cost model needs (multiprocessors, shared
  memory and registers per block, bandwidth, tensor-core rate). :func:`device_of` reads
  them from a CUDA device; :data:`H200` is the reference description and :data:`CPU`
  the interpreter's (a few "multiprocessors", so CPU runs stay small).
* :class:`Problem`: one kernel at one shape, reduced to what matters for speed -- rows
  (the query-like axis), loop length (the fused reduction axis), independent programs
  (batch x heads), contraction and output widths, element size, whether split-k is
  possible for the plan, and whether the tiles feed ``tl.dot`` (attention) or not (a row
  reduction: softmax, log-sum-exp, variance).
* :func:`candidates`: the schedules worth considering for a problem. With a contraction:
  rolling tiles when there are enough rows to fill the GPU, split-k (with split counts
  around "fill the GPU") when there are not. Without one (:func:`row_candidates`): rows
  per program from 1 up, the loop tile up to the whole row (a *persistent* reduction: one
  read, the loop runs once) within a register budget, 1-16 warps, and split-k across
  programs when rows are few and long.
* A problem whose loop length is read from device data per instance (``kv_lens``: a
  ragged or paged KV cache, :attr:`Problem.lengths`) gets split-k candidates next to
  rolling whenever its capacity is long (:func:`wants_ragged_split`), whatever the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..ir.pow2 import next_pow2
from .schedule import Schedule


@dataclass(frozen=True)
class Device:
    """The resources of one GPU, as the cost model sees them."""

    name: str
    sms: int                     # streaming multiprocessors
    smem_per_block: int          # bytes of shared memory one program may use (opt-in max)
    regs_per_sm: int             # 32-bit registers per multiprocessor
    max_warps_per_sm: int
    bandwidth: float             # device memory bytes / s (measured copy rate)
    mma_flops: float             # 16-bit tensor-core multiply-add rate, flop / s
    fp32_flops: float            # float32 (non tensor-core) rate, flop / s
    launch_s: float = 3e-6       # fixed cost of one kernel launch (GPU side)
    # fixed cost of one program where programs run one after another (the interpreter);
    # 0 on a GPU, whose per-program costs the cost model prices by residency
    program_s: float = 0.0
    # the Gluon dialect's schedules are offered (:func:`gluon_device`)
    gluon: bool = False


# NVIDIA H200 (SXM, 132 SMs): 227 KiB shared memory per block, 64 K registers per SM;
# bandwidth and matmul rate as measured by the bench's ceilings on 2026-11-30
# (4.24 TB/s copy, 658-758 TFLOP/s fp16 matmul).
H200 = Device("NVIDIA H200", sms=132, smem_per_block=232448, regs_per_sm=65536,
              max_warps_per_sm=64, bandwidth=4.24e12, mma_flops=7.0e14, fp32_flops=6.0e13)

# Triton's interpreter: few programs keep CPU runs fast; resources are not limited.
CPU = Device("cpu (Triton interpreter)", sms=8, smem_per_block=1 << 30, regs_per_sm=1 << 30,
             max_warps_per_sm=1 << 10, bandwidth=1e10, mma_flops=1e10, fp32_flops=1e10,
             launch_s=1e-3, program_s=1e-2)


def device_of(torch_device) -> Device:
    """The :class:`Device` of a torch device: :data:`CPU` for CPU tensors; for CUDA, the
    multiprocessor count, shared memory and registers read from the device, and the
    bandwidth/flop rates of :data:`H200` scaled by the multiprocessor count (a ranking
    model needs ratios, not exact rates)."""
    if getattr(torch_device, "type", "cpu") != "cuda":
        return CPU
    import torch
    p = torch.cuda.get_device_properties(torch_device)
    smem = getattr(p, "shared_memory_per_block_optin", 0) or H200.smem_per_block
    regs = getattr(p, "regs_per_multiprocessor", 0) or H200.regs_per_sm
    warps = (getattr(p, "max_threads_per_multi_processor", 0) or 2048) // 32
    scale = p.multi_processor_count / H200.sms
    return replace(H200, name=p.name, sms=p.multi_processor_count, smem_per_block=smem,
                   regs_per_sm=regs, max_warps_per_sm=warps,
                   mma_flops=H200.mma_flops * scale, fp32_flops=H200.fp32_flops * scale,
                   gluon=gluon_device((p.major, p.minor)))


def gluon_device(capability: tuple[int, int]) -> bool:
    """Whether the Gluon dialect's schedules are offered on a GPU of ``capability``:
    ``NEPTUNE_FUSION_GLUON`` is on, the GPU is sm_90 (Hopper: wgmma, TMA) and the
    installed Triton has the Gluon API the dialect prints (3.6; codegen/gluon.py)."""
    from ..settings import gluon_enabled
    if capability != (9, 0) or not gluon_enabled():
        return False
    try:
        import triton
        from triton.experimental.gluon.language.nvidia import hopper  # noqa: F401
    except ImportError:
        return False
    return triton.__version__.startswith("3.6")


# the persistent Gluon grid is offered up to this many row blocks per multiprocessor
# (more where every item is as long as every other)
GLUON_WALK_ITEMS = 16


def gluon_candidates(problem: Problem, device: Device, base: Schedule) -> list[Schedule]:
    """The Gluon dialect's schedules for ``problem`` (codegen/gluon.py): 128 rows as two
    warpgroups, 64 or 128 keys a tile, two stages, a program per row block; and, where
    each multiprocessor has at most :data:`GLUON_WALK_ITEMS` row blocks to do, 128 x 128
    on a persistent grid of one program per multiprocessor (the forms measured on the
    H200: docs/hopper.md; with host-side descriptors the persistent grid beat a program
    per row block by 2-4 % at 1024 and 2048 blocks and by 2 % at 4096 blocks of equal
    length, and lost 4-14 % on causal masks at 4096-8192 blocks -- dealt in a snake since
    2026-12-05 it ties a program per row block there), or at any count where
    every item's loop is equally long (no mask partition, no per-batch length). Only
    16-bit attention-shaped problems of at least 128 rows whose loop loads directly; a
    program without the attention shape fails to build, and the tuner drops it."""
    if not problem.contraction or problem.fp32 or problem.itemsize != 2 \
            or problem.gathers or problem.rows < 128:
        return []
    out = [replace(base, block_m=128, block_n=bn, num_warps=8, num_stages=2,
                   dialect="gluon", tma=False, block_col=0, row_programs=0)
           for bn in (128, 64)]
    even = not problem.lengths and all(frac >= 1.0 for _, _, frac in problem.visits)
    if even or problem.programs * -(-problem.rows // 128) <= GLUON_WALK_ITEMS * device.sms:
        out.append(replace(out[0], row_programs=1))
    return out


@dataclass(frozen=True)
class Problem:
    """One kernel at one shape, as far as its speed is concerned.

    ``rows`` is the extent of the row (query) axis, ``loop`` of the fused reduction axis,
    ``programs`` the number of independent (batch, head, ...) instances, ``inner`` the
    contraction width (head dim of q/k), ``col`` the output width (head dim of v),
    ``itemsize`` the input element size, ``tensor_bytes`` what a row reduction reads and
    writes once (inputs and outputs; each row block reads only its own rows).
    ``streamed`` is the bytes of the inputs indexed along the loop axis (k and v; 0: every
    program reads its own). ``splittable``: split-k is legal for the plan. ``visits``: per
    tile shape, the share of loop tiles the loop partition visits (causal masks, sliding
    windows). ``lengths``: how many instances read their own loop length from device data
    (``kv_lens[b]``: B); 0 when the loop bound is static. Then ``loop`` is the capacity,
    an upper bound: any instance may stream all of it or none, and the lengths change
    between calls without a new choice (docs/scheduling.md, "Ragged decode").
    ``gathers``: a tile loop loads through a table (a paged cache; :func:`gather_depth`).
    ``col_states``: how many state tiles span the output columns, each its own
    ``block_m x col`` accumulator and, in a GEMM-tiled kernel, its own right operand
    (RMSNorm followed by the gate and up projections: 2); priced by the GEMM path only.
    ``col_chunk``: the epilogue writes the output columns this many at a time (a column
    no state holds: softmax's or a norm's output row, ``codegen.lower.EPILOGUE_CHUNK``);
    0 when it holds the whole column tile.
    """

    rows: int
    loop: int
    programs: int
    inner: int
    col: int
    itemsize: int = 2
    streamed: int = 0
    splittable: bool = True
    fp32: bool = False           # float32 inputs: tl.dot without 16-bit tensor cores
    # the row or loop tile feeds tl.dot (attention, a norm -> matmul): tiles >= 16 and
    # the attention-shaped space; False: a row reduction (rows per program down to 1)
    contraction: bool = True
    tensor_bytes: int = 0        # bytes of every input and output (0: unknown)
    # ((block_m, block_n, share of the row-block x loop-tile pairs the loop visits), ...)
    visits: tuple[tuple[int, int, float], ...] = ()
    # bytes a row reduction reads again after its first loop -- a later phase, an
    # epilogue that loads (softmax's x) -- unless one tile covers the row (persistent)
    reread_bytes: int = 0
    # instances whose loop bound is read from device data (kv_lens: B); 0: a static bound
    lengths: int = 0
    # a tile loop loads through a table (a paged KV cache: k[block_table[b, j // p], ...])
    gathers: bool = False
    col_states: int = 1
    col_chunk: int = 0

    @property
    def col_tile(self) -> int:
        """The output columns one program holds in registers at once (0: no column)."""
        if self.col <= 1:
            return 0
        whole = next_pow2(self.col)
        return min(whole, self.col_chunk) if self.col_chunk else whole

    def visited(self, block_m: int, block_n: int) -> float:
        """The share of loop tiles a schedule's programs visit (masks skip the rest);
        1.0 when unknown."""
        for bm, bn, frac in self.visits:
            if (bm, bn) == (block_m, block_n):
                return frac
        return 1.0

    @property
    def loop_bytes(self) -> float:
        """Bytes of loop-axis input (k and v) read once: the decode floor's numerator."""
        return self.streamed or \
            self.programs * self.loop * (self.inner + self.col) * self.itemsize


ROLLING_M = (64, 128)
# an output column wider than this is tiled across programs (block_col), GEMM-like
COL_WHOLE_MAX = 256
GEMM_M = (64, 128)
GEMM_N = (32, 64, 128)      # the loop (contraction) step
GEMM_COL = (64, 128, 256)
ROLLING_N = (32, 64, 128)
SPLIT_N = (64, 128, 256)
WARPS = (4, 8)
STAGES = (2, 3, 4)
# a ragged loop (Problem.lengths) this long or longer (the capacity, in keys) gets split-k
# candidates whatever the batch, with at least these split counts
RAGGED_SPLIT_MIN = 4096
RAGGED_SPLITS = (2, 4, 8)


def tile_shapes(rows: int) -> tuple[tuple[int, int], ...]:
    """Every ``(block_m, block_n)`` :func:`candidates` may use for ``rows`` rows of a
    problem with a contraction (the shapes whose visited-tile shares matter: masks)."""
    rows_p2 = next_pow2(rows, 16)
    ms = tuple(m for m in ROLLING_M if m <= rows_p2) or (rows_p2,)
    return tuple(sorted({(m, n) for m in ms for n in ROLLING_N}
                        | {(rows_p2, n) for n in SPLIT_N}))


def wants_split(problem: Problem, device: Device) -> bool:
    """Split-k when the rolling kernel cannot fill the GPU: fewer row blocks (at the
    smallest tile: 16 rows with a contraction, else 1) times programs than
    multiprocessors, and a loop long enough to split (a row reduction: at least
    :data:`SPLIT_MIN_LOOP` elements, so that each split streams a useful chunk)."""
    least = 16 if problem.contraction else 1
    blocks = -(-problem.rows // least) * problem.programs
    long = problem.loop > 64 if problem.contraction else problem.loop >= SPLIT_MIN_LOOP
    return problem.splittable and blocks < device.sms and long


def wants_ragged_split(problem: Problem) -> bool:
    """Split-k candidates next to rolling for a loop whose length is device data
    (:attr:`Problem.lengths`) and whose capacity is at least :data:`RAGGED_SPLIT_MIN`: the
    longest sequence's programs set a rolling kernel's time (a critical path the cost
    model prices, :func:`~.cost.estimate`), however many programs the batch has."""
    return problem.splittable and problem.contraction and problem.lengths > 0 \
        and problem.loop >= RAGGED_SPLIT_MIN


def split_counts(problem: Problem, device: Device, block_n: int,
                 block_m: int = 16) -> tuple[int, ...]:
    """Split counts around "two programs per multiprocessor" (a quarter of that to twice
    it: fewer, longer chunks often stream better), clamped to the tile count."""
    tiles = max(1, -(-problem.loop // block_n))
    blocks = max(1, -(-problem.rows // block_m) * problem.programs)
    fill = max(1, -(-2 * device.sms // blocks))
    want = {max(1, fill // 4), max(1, fill // 2), fill, 2 * fill}
    return tuple(sorted({max(1, min(w, tiles)) for w in want}))


def candidates(problem: Problem, device: Device, base: Schedule | None = None
               ) -> list[Schedule]:
    """Every schedule of the search space for ``problem`` (speed rules from ``base``).

    A problem without a contraction gets :func:`row_candidates`. Otherwise rolling:
    BLOCK_M in {64, 128} (or the rows rounded up when fewer), BLOCK_N in
    {32, 64, 128}, 4 or 8 warps, 2-4 stages; an output column wider than
    :data:`COL_WHOLE_MAX` (a norm followed by a matmul) adds GEMM-like tiles: BLOCK_M in
    {64, 128}, column tiles of {64, 128, 256} across programs (``block_col``), a loop step
    of {32, 64, 128}. Split-k (see :func:`wants_split`): BLOCK_M the rows rounded up to a
    power of two >= 16, BLOCK_N in {64, 128, 256}, 4 or 8 warps, 2-4 stages, and the split
    counts of :func:`split_counts`. A ragged problem (:func:`wants_ragged_split`) gets
    those split candidates, with at least the counts of :data:`RAGGED_SPLITS`, next to
    the rolling ones. Tensor descriptors (``Schedule.tma``) are not in the space
    (docs/hopper.md says why); a ``base`` with ``tma`` keeps it on the rolling schedules.
    A device with ``gluon`` adds :func:`gluon_candidates` to the rolling ones.
    """
    base = base if base is not None else Schedule()
    base = replace(base, strategy="rolling", splits=1)
    if not problem.contraction:
        return row_candidates(problem, device, base)
    out: list[Schedule] = []
    split, ragged = wants_split(problem, device), wants_ragged_split(problem)
    if split or ragged:
        bm = next_pow2(problem.rows, 16)
        for bn in SPLIT_N:
            tiles = -(-problem.loop // bn)
            extra = {min(k, tiles) for k in RAGGED_SPLITS} if ragged else set()
            for k in sorted(set(split_counts(problem, device, bn)) | extra):
                for w in WARPS:
                    for st in STAGES:
                        out.append(replace(base, block_m=bm, block_n=bn, num_warps=w,
                                           num_stages=st, strategy="split" if k > 1
                                           else "rolling", splits=k,
                                           tma=base.tma and k == 1))
        if split:   # (ragged or not) the rolling kernel cannot fill the GPU anyway
            return sorted({gather_depth(problem, device, c) for c in out}, key=_order)
    rows_p2 = next_pow2(problem.rows, 16)
    ms = tuple(m for m in ROLLING_M if m <= rows_p2) or (rows_p2,)
    for bm in ms:
        for bn in ROLLING_N:
            for w in WARPS:
                for st in STAGES:
                    out.append(replace(base, block_m=bm, block_n=bn, num_warps=w,
                                       num_stages=st))
    if device.gluon:
        out += gluon_candidates(problem, device, base)
    if problem.col > COL_WHOLE_MAX:     # a matmul epilogue: row x column tiles
        ms = tuple(m for m in GEMM_M if m <= rows_p2) or (rows_p2,)
        for bm in ms:
            for bc in GEMM_COL:
                for bn in GEMM_N:
                    for w in WARPS:
                        for st in STAGES:
                            out.append(replace(base, block_m=bm, block_n=bn, block_col=bc,
                                               num_warps=w, num_stages=st))
    return sorted({gather_depth(problem, device, c) for c in out}, key=_order)


def gather_depth(problem: Problem, device: Device, s: Schedule) -> Schedule:
    """``s`` with ``gather_stages = 2 * num_stages - 1`` where a loop that loads through
    a table must hide its latency with one program per multiprocessor: the problem
    gathers, ``s`` has at least 3 stages, and its programs (row blocks x instances x
    splits) fit one per multiprocessor. Then the loop keeps ``num_stages - 1`` tiles in
    flight, as a direct load does (``Schedule.gather_stages``).

    Measured on an H200 (fp16, 32/8 and 32/32 heads, one sequence of 31090 keys, 128
    programs: benchmarks/results/2026-12-01-h200-b1): the deeper loop took pages of 16 and
    64 from 52-54 to 40-42 us (32/8) and 143-145 to 128-131 us (32/32). With more programs
    than multiprocessors occupancy hides the latency instead, and the deeper loop's
    buffers cost it: 8 sequences, pages of 64, 0.180 against 0.153 ms; so the others keep
    the plain loop (their stage count is the tuner's).
    """
    if not problem.gathers or s.num_stages < 3 or s.gather_stages:
        return s
    splits = s.splits if s.strategy == "split" else 1
    if -(-problem.rows // s.block_m) * problem.programs * splits > device.sms:
        return s
    return replace(s, gather_stages=2 * s.num_stages - 1)


def _order(s: Schedule) -> tuple:
    return (s.strategy, s.block_m, s.block_n, s.block_col, s.splits, s.num_warps,
            s.num_stages, s.tma, s.dialect)


# ------------------------------------------------------------ row reductions (no tl.dot)
ROW_WARPS = (1, 2, 4, 8, 16)
ROW_STAGES = (1, 2)         # a loop: unpipelined or one tile in flight ahead
ROW_MAX_M = 64               # rows per program at most (more only adds registers)
ROW_MIN_N = 32               # the smallest loop tile worth a loop (below: the whole row)
ELEMS_PER_THREAD = 64        # register budget: fp32 tile elements per thread
SPLIT_MIN_LOOP = 4096        # a row reduction splits only rows at least this long
SPLIT_ROW_N = (512, 1024, 2048, 4096)


def tile_budget(num_warps: int) -> int:
    """The fp32 elements one program of ``num_warps`` warps holds in registers (64 per
    thread: 8K at 4 warps, 16K at 8, 32K at 16), its loop tile and its output row tile."""
    return ELEMS_PER_THREAD * 32 * num_warps


def persistent(problem: Problem, s: Schedule) -> bool:
    """Whether ``s`` covers the whole reduction axis (of a split's chunk) in one tile: the
    loop runs once, the input is read once and no carried state is repaired."""
    splits = s.splits if s.strategy == "split" else 1
    return s.block_n >= -(-problem.loop // splits)


def _row_ms(problem: Problem, device: Device) -> list[int]:
    """Rows per program: 1 up to the rows (rounded up) and :data:`ROW_MAX_M`, keeping at
    least two programs per multiprocessor where the rows allow (1 always). A device that
    runs programs one after another (the interpreter: ``program_s``) gains nothing from
    more programs, so every size is offered there."""
    out = []
    bm = 1
    fill = 0 if device.program_s else 2 * device.sms
    while bm <= min(next_pow2(problem.rows), ROW_MAX_M):
        if bm == 1 or -(-problem.rows // bm) * problem.programs >= fill:
            out.append(bm)
        bm *= 2
    return out


def row_candidates(problem: Problem, device: Device, base: Schedule) -> list[Schedule]:
    """The search space of a row reduction (no ``tl.dot``: tiles may be 1 wide).

    Rolling: BLOCK_M from 1 up (:func:`_row_ms`), BLOCK_N powers of two from
    :data:`ROW_MIN_N` up to the whole row (``next_pow2(loop)``: persistent), 1-16 warps,
    within :func:`tile_budget` (the loop tile and, when the outputs have a column axis,
    the output row tile); 1 or 2 stages (1 when the loop runs once); a persistent
    schedule of a 16-bit input also walking the row blocks (``row_programs=1``). Split-k when
    :func:`wants_split`: BLOCK_M up to the rows, BLOCK_N in :data:`SPLIT_ROW_N`, the split
    counts of :func:`split_counts`; the rolling candidates stay, for the model to weigh.
    An output row past every budget keeps one row per program at 16 warps (it spills);
    a row shorter than a warp, one tile at 1 warp.
    """
    full = next_pow2(problem.loop)
    col = problem.col_tile
    out: set[Schedule] = set()

    def add(bm: int, bn: int, w: int, k: int, budget: int | None = None) -> None:
        if bm * max(bn, col if budget is None else 0) > (budget or tile_budget(w)) \
                or bm * bn < 32 * w:
            return          # spills, or threads without an element
        one = bn >= -(-problem.loop // k)
        for st in ((1,) if one else ROW_STAGES):
            out.add(replace(base, block_m=bm, block_n=bn, num_warps=w, num_stages=st,
                            strategy="split" if k > 1 else "rolling", splits=k))

    ns = []
    bn = min(ROW_MIN_N, full)
    while bn <= full:
        ns.append(bn)
        bn *= 2
    for bm in _row_ms(problem, device):
        for bn in ns:
            for w in ROW_WARPS:
                add(bm, bn, w, 1)
    if wants_split(problem, device):
        bm = 1
        while bm <= min(next_pow2(problem.rows), ROW_MAX_M):
            for bn in SPLIT_ROW_N:
                for k in split_counts(problem, device, bn, bm):
                    if k > 1:
                        for w in ROW_WARPS[2:]:
                            add(bm, bn, w, k)
            bm *= 2
    if problem.itemsize <= 2 and not device.program_s:
        # a 16-bit row that one tile covers, over at least two row blocks per
        # multiprocessor: also walked by a persistent grid, the next block's tile in
        # flight (Schedule.row_programs; the raw tile's registers fit beside the fp32 one)
        for s in list(out):
            if s.strategy == "rolling" and persistent(problem, s) and \
                    -(-problem.rows // s.block_m) * problem.programs >= 2 * device.sms:
                out.add(replace(s, row_programs=1))
    if not out:     # an output row longer than any budget (softmax over > 32K): it
        for bn in ns:   # spills whatever the loop tile; one row per program, 16 warps
            add(1, bn, ROW_WARPS[-1], 1, tile_budget(ROW_WARPS[-1]))
    if not out:     # a row shorter than a warp
        out.add(replace(base, block_m=1, block_n=full, num_warps=1, num_stages=1))
    return sorted(out, key=_order)
