"""The cost model: resources and an estimated time for a schedule on a problem.

It is a *ranking* model (a roofline with occupancy and wave quantisation), not a
simulator: on a GPU the auto-scheduler measures its best few candidates and keeps the
fastest, so the model only has to put the winner among them. On CPU it chooses alone.

Per program (one row block of one instance, or one split of it):

* shared memory: the K/V pipeline plus the q tile, as Triton 3.6 allocates them on Hopper
  (checked against its "out of resource" reports on an H200): row blocks of 64 or more
  (warp-group MMA) buffer ``stages`` K/V tiles of ``BLOCK_N * (inner + col)`` elements,
  smaller ones ``stages - 1`` (plus three q-sized tiles) -- more than the device allows is
  infeasible;
* registers per thread: the fp32 accumulator and score tiles and the q tile spread over
  the warps' threads; above 255 the compiler spills, which costs a large factor;
* time: memory (every row block streams the loop axis; the decode floor) and tensor-core
  work, each at the share of the device the occupied programs get, divided by wave
  efficiency, plus a per-iteration overhead, plus launches (and split-k's combine);
* a loop whose length is device data (``Problem.lengths``: a ragged or paged KV cache) is
  priced at the worst case of its shape class: every instance at the capacity (the total
  bytes' upper bound) plus the critical path of one instance at the capacity while the
  others may be short, and each program's start (:func:`ragged_terms`).

A row reduction (no ``tl.dot``: ``problem.contraction`` false) is priced by
:func:`row_estimate`: its bytes read and written once -- plus, unless one tile covers the
row (persistent), the input it reads again (``reread_bytes``: softmax's epilogue, a later
phase: a looped softmax moves 3x its input's bytes, a persistent one 2x) -- at the share
of the bandwidth the programs reach -- multiprocessors occupied (programs vs SMs) and
bytes in flight per multiprocessor (resident programs x tile bytes x pipelined tiles) --
plus per-element work, loop iterations, launches and split-k's combine; registers from
the tile (the loop tile, or the output row tile of a softmax-like epilogue) over the
threads. A persistent schedule that walks the row blocks (``row_programs``) holds the next
block's raw tile as well and exposes no per-program latency (the next load is in flight).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ScheduleError
from ..ir.pow2 import next_pow2
from .schedule import COL_GROUP, Schedule
from .space import Device, Problem, persistent

_ITER_S = 4e-8        # fixed cost of one loop iteration of one program (issue, barriers)
_SPILL = 3.0          # slowdown of a kernel whose registers spill
# a ragged loop's per-program start, per program per multiprocessor: fitted to the
# recorded split-count sweep of dense decode (DC-GQA at 16K keys on the H200, 128 / 264 /
# 528 programs: 0.0274 / 0.0336 / 0.0463 ms, about 6 us per extra program per SM); only
# the ragged terms use it (the dense model ranks those splits as fitted, model_fit.md)
_START_S = 6e-6


@dataclass(frozen=True)
class Resources:
    smem: int                    # bytes per program
    regs: int                    # registers per thread (estimate)
    per_sm: int                  # programs resident per multiprocessor (0: cannot run)


def _unfit(r: Resources, device: Device) -> str:
    """Why a program of resources ``r`` cannot run on ``device``, or ""."""
    if r.smem > device.smem_per_block:
        return f"shared memory {r.smem} > {device.smem_per_block} bytes"
    return "no program fits a multiprocessor" if r.per_sm < 1 else ""


@dataclass(frozen=True)
class Estimate:
    schedule: Schedule
    seconds: float               # inf when infeasible
    resources: Resources
    why: str = ""                # why infeasible, or ""

    @property
    def feasible(self) -> bool:
        return not self.why


def resources(problem: Problem, s: Schedule, device: Device) -> Resources:
    """Shared memory, registers and residency of one program of ``s`` on ``device``."""
    if not problem.contraction:
        return row_resources(problem, s, device)
    if s.block_col:
        return _gemm_resources(problem, s, device)
    bm, bn, it = s.block_m, s.block_n, problem.itemsize
    inner, col = next_pow2(problem.inner), next_pow2(problem.col)
    kv = bn * (inner + col)
    if bm >= 64 and s.num_warps % 4 == 0:       # wgmma: one buffer per stage
        smem = (s.num_stages * kv + bm * inner) * it
    else:                                       # mma v2 / cp.async: stages - 1 buffers
        smem = (max(s.num_stages - 1, 1) * kv + 3 * bm * inner) * it
    threads = 32 * s.num_warps
    regs = (bm * col + bm * bn + bm * inner * it // 4) // threads + 40
    per_sm = min(device.smem_per_block // max(smem, 1),
                 device.regs_per_sm // (min(regs, 255) * threads),
                 device.max_warps_per_sm // s.num_warps, 32)
    return Resources(smem, regs, per_sm)


def check_resources(problem: Problem, s: Schedule, device: Device) -> None:
    """Raise :class:`ScheduleError` when ``s`` cannot run on ``device`` (shared memory)."""
    r = resources(problem, s, device)
    if r.smem > device.smem_per_block:
        raise ScheduleError(
            f"schedule: shared memory exceeded: block_m={s.block_m}, block_n={s.block_n}, "
            f"num_stages={s.num_stages} need about {r.smem // 1024} KiB per program for "
            f"head dims {problem.inner}/{problem.col} at {problem.itemsize}-byte elements; "
            f"{device.name} allows {device.smem_per_block // 1024} KiB. Lower num_stages "
            "or block_n")


def estimate(problem: Problem, s: Schedule, device: Device) -> Estimate:
    """The estimated time of ``s`` on ``problem`` (see module docstring)."""
    if not problem.contraction:
        return row_estimate(problem, s, device)
    if s.block_col:
        return gemm_estimate(problem, s, device)
    r = resources(problem, s, device)
    if _unfit(r, device):
        return Estimate(s, float("inf"), r, _unfit(r, device))
    splits = s.splits if s.strategy == "split" else 1
    row_blocks = -(-problem.rows // s.block_m)
    progs = row_blocks * problem.programs * splits
    if progs == 0:   # empty sizes (B, N = 0): nothing runs, every schedule is as good
        return Estimate(s, device.launch_s, r)
    slots = device.sms * r.per_sm
    waves = -(-progs // slots)
    busy = min(1.0, progs / slots)           # share of the device the programs occupy
    wave_eff = progs / (waves * slots) if progs >= slots else 1.0
    # the share of loop tiles the programs visit (masks: causal ~1/2, a window little;
    # the diagonal/band tiles a larger tile drags in are what smaller tiles save)
    frac = problem.visited(s.block_m, s.block_n)
    # loop-axis bytes: each row block streams it (shared heads hit in L2 after the first)
    loop_elems = -(-problem.loop // splits) * frac
    per_prog_bytes = loop_elems * (problem.inner + problem.col) * problem.itemsize
    unique = problem.loop_bytes * row_blocks * frac
    mem = unique / (device.bandwidth * min(1.0, busy * 4))
    flops = 2.0 * max(problem.rows, 1) * problem.loop * problem.programs \
        * (problem.inner + problem.col) * frac
    padded = flops * s.block_m / max(min(problem.rows, s.block_m), 1)   # idle tile rows
    rate = device.fp32_flops if problem.fp32 else device.mma_flops
    mma_eff = min(1.0, s.block_m / 64) * min(1.0, s.block_n / 64)
    comp = padded / (rate * mma_eff * busy)
    iters = -(-loop_elems // s.block_n) * waves
    t = max(mem, comp) / wave_eff + iters * _ITER_S + device.launch_s
    if s.num_stages < 3:        # less latency hiding when the kernel streams memory
        t += 0.15 * mem / max(s.num_stages, 1)
    if per_prog_bytes < 32 * 1024 and splits > 1:   # chunks too small to stream well
        t += device.launch_s * 0.5
    if splits > 1:              # the combine kernel: read every split's state, write out
        ws = splits * problem.programs * problem.rows * (problem.col + 2) * 4
        t += device.launch_s + ws / device.bandwidth
    if problem.lengths:         # lengths are device data: the worst case of the class
        # program starts are priced where the split count sets how many there are: one row
        # block per instance (decode); a prefill's programs are the dense model's
        starts = progs if problem.rows <= s.block_m else 0
        t += ragged_terms(problem, per_prog_bytes, starts, device)
    if r.regs > 255:
        t *= _SPILL
    return Estimate(s, t, r)


def ragged_terms(problem: Problem, per_prog_bytes: float, progs: int,
                 device: Device) -> float:
    """What a loop whose length is device data (:attr:`Problem.lengths`: ``kv_lens``)
    adds to the estimate of every instance at the capacity (the total bytes' upper bound,
    priced above), for the worst case its shape class allows (docs/scheduling.md,
    "Ragged decode"):

    * the critical path: one instance at the full capacity while the others may be short.
      Its program streams its chunk of the capacity (``per_prog_bytes``: split-k divides
      it by the split count) at one multiprocessor's share of the bandwidth, and may start
      last (greedy list scheduling: makespan <= total / machines + the longest job).
      Scaled by ``1 - 1/lengths``: with one instance every program sees the same length
      and the capacity-wide estimate is already the worst case;
    * each program's start (q tile, the pipeline's first loads, the partial state's
      store), :data:`_START_S` per program per multiprocessor -- what keeps the split
      count from growing without bound. ``progs``: the programs whose starts count (0 for
      a prefill: :func:`estimate` prices them only when one row block covers the rows;
      a 6 us start per program made 128-row tiles rank above 64-row ones on a 4096-query
      causal prefill over a cache, H200: 0.200 against 0.189 ms measured)."""
    tail = (1.0 - 1.0 / problem.lengths) * per_prog_bytes * device.sms / device.bandwidth
    return tail + -(-progs // device.sms) * _START_S


def rank(problem: Problem, schedules, device: Device) -> list[Estimate]:
    """Feasible estimates of ``schedules``, fastest first (ties: :func:`_tie`, then the
    given order).

    A row reduction's fastest persistent schedule goes first when it is within
    :data:`PERSISTENT_SLACK` of the fastest: what it saves (the loop, the carried state's
    repairs, the load latency of each tile) is below what the model resolves, and the
    fastest looped schedule stays second, so a GPU measures both kinds. A ragged loop
    (:attr:`Problem.lengths`) ranks the fastest schedule of each split count first
    (:func:`_splits_first`). Column-tiled
    (GEMM-like) schedules are ranked one per tile shape first (:func:`_shapes_first`)."""
    ests = [estimate(problem, s, device) for s in schedules]
    ranked = sorted((e for e in ests if e.feasible),
                    key=lambda e: (e.seconds, _tie(problem, e.schedule)))
    if ranked and ranked[0].schedule.block_col:
        return _shapes_first(ranked)
    if problem.lengths and problem.contraction:
        return _splits_first(ranked)
    if problem.contraction or not ranked:
        return ranked
    best = ranked[0].seconds
    pers = next((e for e in ranked if persistent(problem, e.schedule)), None)
    if pers is not None and pers is not ranked[0] and \
            pers.seconds <= best * (1 + PERSISTENT_SLACK):
        ranked = [pers] + [e for e in ranked if e is not pers]
    return _kinds_first(problem, ranked)


def _kinds_first(problem: Problem, ranked: list[Estimate]) -> list[Estimate]:
    """A row reduction's estimates with the fastest of each kind of schedule -- split-k,
    one tile walking the rows, one tile a program per row block, a loop -- next after the
    fastest, then the rest: the model prices a walking one tile without exposed latency,
    and before this the few measured on the H200 were all walking ones (the instance
    norm, 2026-12-04), so a GPU never compared it with a program per row block."""
    def kind(e: Estimate) -> tuple:
        s = e.schedule
        return (s.strategy, persistent(problem, s), bool(s.row_programs))
    if not ranked:
        return ranked
    first, seen = [ranked[0]], {kind(ranked[0])}
    for e in ranked[1:]:
        if kind(e) not in seen:
            first.append(e)
            seen.add(kind(e))
    return first + [e for e in ranked if not any(e is f for f in first)]




def _tie(problem: Problem, s: Schedule) -> int:
    """Among schedules the model prices alike: a 128-row attention tile with 8 warps before
    4 (the model does not tell them apart at head dim 64; measured on the H200, fp16,
    PF-Global and PF-Causal at 4096 and 16384, 128 x 64 tiles: 8 warps 2-8 % faster,
    benchmarks/results/2026-12-02-h200-d64-tiles); else the given order."""
    if problem.contraction and s.strategy == "rolling" and s.block_m >= 128:
        return -s.num_warps
    return 0


def _splits_first(ranked: list[Estimate]) -> list[Estimate]:
    """The fastest estimate, then the fastest with its split count and another loop tile,
    then the fastest of each other split count (in order), then the rest: for a ragged
    loop the split count is what the lengths at hand decide (the model prices the worst
    case), so the few a GPU measures should differ in it; and a paged cache's loop tile
    matters beyond what the model sees (H200, B = 64, pages of 64: 4 splits of 128-key
    tiles 1.14 ms, of 64-key tiles 1.38 ms; docs/scheduling.md), so the best split count
    is measured at two tiles."""
    def splits(e: Estimate) -> int:
        return e.schedule.splits if e.schedule.strategy == "split" else 1
    if not ranked:
        return ranked
    best = ranked[0]
    other_tile = next((e for e in ranked if splits(e) == splits(best)
                       and e.schedule.block_n != best.schedule.block_n), None)
    first = [best] + ([other_tile] if other_tile is not None else [])
    seen = {splits(best)}
    for e in ranked:
        if splits(e) not in seen:
            first.append(e)
            seen.add(splits(e))
    return first + [e for e in ranked if not any(e is f for f in first)]


# ------------------------------------------------ column tiles across programs (GEMM-like)
def _shapes_first(ranked: list[Estimate]) -> list[Estimate]:
    """The fastest estimate of each tile shape first (in order), then the rest: GEMM-like
    tiles that the model prices alike differ in how they pipeline, which only a
    measurement resolves, so the few measured should be different shapes."""
    seen: set = set()
    first, rest = [], []
    for e in ranked:
        shape = (e.schedule.block_m, e.schedule.block_n, e.schedule.block_col)
        (rest if shape in seen else first).append(e)
        seen.add(shape)
    return first + rest


def _gemm_resources(problem: Problem, s: Schedule, device: Device) -> Resources:
    """A program of a row x column grid: per pipeline stage a left tile (``block_m x
    block_n``: the rows' loop elements, normalised in registers) and a right tile
    (``block_n x block_col``, one per column state) in shared memory; the ``block_m x
    block_col`` accumulators (``Problem.col_states``) and the left tile in registers."""
    bm, bn, bc, it = s.block_m, s.block_n, s.block_col, problem.itemsize
    cs = problem.col_states
    stages = s.num_stages if bm >= 64 and s.num_warps % 4 == 0 else max(s.num_stages - 1, 1)
    smem = stages * bn * (bm + cs * bc) * it
    threads = 32 * s.num_warps
    regs = (cs * bm * bc + 2 * bm * bn) // threads + 40
    per_sm = min(device.smem_per_block // max(smem, 1),
                 device.regs_per_sm // (min(regs, 255) * threads),
                 device.max_warps_per_sm // s.num_warps, 32)
    return Resources(smem, regs, per_sm)


def gemm_estimate(problem: Problem, s: Schedule, device: Device) -> Estimate:
    """A contraction whose output columns are tiled across programs (``block_col``): a
    GEMM with a fused prologue. Tensor-core (or, for float32, FMA) work at an efficiency
    that grows with the tile, the row statistics recomputed by every column tile, and the
    memory traffic of the grouped grid: the left operand once, the right operand once per
    group of :data:`~.schedule.COL_GROUP` row tiles (the rest hits L2)."""
    r = _gemm_resources(problem, s, device)
    if _unfit(r, device):
        return Estimate(s, float("inf"), r, _unfit(r, device))
    bm, bn, bc, it = s.block_m, s.block_n, s.block_col, problem.itemsize
    rows, loop, col = max(problem.rows, 1), max(problem.loop, 1), max(problem.col, 1)
    row_tiles, col_tiles = -(-rows // bm), -(-col // bc)
    progs = row_tiles * col_tiles * problem.programs
    slots = device.sms * r.per_sm
    waves = -(-progs // slots)
    busy = min(1.0, progs / slots)
    wave_eff = progs / (waves * slots) if progs >= slots else 1.0
    cs = problem.col_states   # GEMMs sharing the left tile (gate and up projections)
    flops = 2.0 * problem.programs * row_tiles * bm * loop * \
        (cs * col_tiles * bc + col_tiles * problem.inner)
    rate = device.fp32_flops if problem.fp32 else device.mma_flops
    mma_eff = min(1.0, bm / 128) * min(1.0, bc / 128) * min(1.0, bn / 32)
    comp = flops / (rate * mma_eff * busy)
    left = problem.programs * rows * loop * it
    right = cs * problem.programs * loop * col * it
    mem = (left + right * -(-row_tiles // COL_GROUP)) / device.bandwidth
    iters = -(-loop // bn) * waves
    t = max(mem, comp) / wave_eff + iters * _ITER_S + device.launch_s
    if s.num_stages < 3:
        t += 0.15 * mem / max(s.num_stages, 1)
    if r.regs > 255:
        t *= _SPILL
    return Estimate(s, t, r)


# ------------------------------------------------------------ row reductions (no tl.dot)
PERSISTENT_SLACK = 0.25   # a persistent row reduction this close to the fastest goes first
_ROW_FLOPS = 8.0        # fp32 operations per element (exp, max, fma, the masks)
_IN_FLIGHT = 32 * 1024  # bytes in flight per SM that keep an H200 at its copy rate
                        # (~4.8 TB/s x ~0.9 us latency / 132 SMs)
_ROW_TAIL_S = 5e-7      # per program: start, cross-warp reductions, epilogue, store --
                        # hidden by the other resident programs' loads, if any
_ROW_ITER_S = 3e-7      # per loop iteration: a tile's load latency and reduction barrier,
                        # hidden by pipelining (stages) and the other resident programs


def row_resources(problem: Problem, s: Schedule, device: Device) -> Resources:
    """A row-reduction program: the loop tile (or the output row tile of an epilogue over
    the column axis) in registers across its threads; shared memory for the cross-warp
    reduction (one float per row and warp). Pipeline buffers are not counted: whether
    Triton stages a load that feeds no ``tl.dot`` through shared memory is its choice, and
    an estimate must not refuse a schedule it would run."""
    threads = 32 * s.num_warps
    col = problem.col_tile
    live = s.block_m * max(s.block_n, col)
    if s.row_programs and persistent(problem, s):   # the next block's raw tile as well
        live += -(-s.block_m * s.block_n * problem.itemsize // 4)
    regs = -(-live // threads) + 32
    smem = 4 * s.block_m * s.num_warps
    per_sm = min(device.smem_per_block // max(smem, 1),
                 device.regs_per_sm // (min(regs, _reg_cap(s, device)) * threads),
                 device.max_warps_per_sm // s.num_warps, 32)
    return Resources(smem, regs, per_sm)


def _reg_cap(s: Schedule, device: Device) -> int:
    """Registers per thread the compiler allows a program (above: it spills): 255, or
    fewer where one program's threads would not fit the register file (16 warps: 128)."""
    return min(255, device.regs_per_sm // (32 * s.num_warps))


def row_estimate(problem: Problem, s: Schedule, device: Device) -> Estimate:
    """The estimated time of ``s`` on a row reduction (see module docstring)."""
    r = row_resources(problem, s, device)
    if _unfit(r, device):
        return Estimate(s, float("inf"), r, _unfit(r, device))
    bm, bn, it = s.block_m, s.block_n, problem.itemsize
    splits = s.splits if s.strategy == "split" else 1
    rows = max(problem.rows, 1)
    progs = -(-rows // bm) * problem.programs * splits
    if progs == 0:   # empty sizes (B = 0): nothing runs, every schedule is as good
        return Estimate(s, device.launch_s, r)
    slots = device.sms * r.per_sm
    waves = -(-progs // slots)
    wave_eff = progs / (waves * slots) if progs >= slots else 1.0
    sms_busy = min(1.0, progs / device.sms)           # multiprocessors that have work
    chunk = -(-problem.loop // splits)
    iters = max(1, -(-chunk // bn))
    resident = min(r.per_sm, -(-progs // device.sms))
    flight = resident * bm * min(bn, chunk) * it * min(s.num_stages, iters)
    stream = min(1.0, flight / _IN_FLIGHT) or 1.0   # an empty loop streams nothing
    nbytes = problem.tensor_bytes or \
        problem.programs * rows * (problem.loop + problem.col) * it
    if not persistent(problem, s) or splits > 1:   # a later phase, softmax's epilogue:
        nbytes += problem.reread_bytes               # x read again (by split-k's combine)
    mem = nbytes / (device.bandwidth * sms_busy * stream)
    # padded work: rows past the end, the last tile's tail, threads without an element
    elems = max(bm * min(bn, next_pow2(chunk)), 32 * s.num_warps) * iters * progs
    comp = elems * _ROW_FLOPS / (device.fp32_flops * sms_busy)
    # latency not hidden: each program's tail and unpipelined iterations, shared by the
    # programs resident together (a lone program per SM leaves the SM idle meanwhile)
    per_sm = progs / min(progs, device.sms)
    exposed = per_sm * (_ROW_TAIL_S + iters * _ROW_ITER_S / min(s.num_stages, iters)) \
        / resident
    if s.row_programs and persistent(problem, s):
        exposed = 0.0   # the walk loads the next block while this one computes
    t = max(mem, comp) / wave_eff + exposed + device.launch_s + progs * device.program_s
    if splits > 1:              # the combine kernel: read every split's state, write out
        t += device.launch_s + splits * problem.programs * rows * 2 * 4 / device.bandwidth
    if r.regs > _reg_cap(s, device):
        t *= _SPILL
    return Estimate(s, t, r)


# ------------------------------------------------ a contraction in the vendor library
LIBRARY_EFFICIENCY = 0.95   # cuBLAS's share of the measured matmul ceiling at large tiles
# A product of at least this many FLOP is tuned as the library form alone: at 4096^3
# (1.4e11) the library won over the best fused tile by 1.5x in bf16 and 4.6x in float32
# on the H200 (2026-11-30-h200-chains-3), and each fused GEMM candidate costs seconds of
# compile. Below it (where no measurement says who wins) fused tiles are measured too.
LIBRARY_ALONE_FLOP = 2.0 * 2048 ** 3


def library_alone(problem: Problem) -> bool:
    """Whether a product the library can run is large enough to tune as the library form
    alone (:data:`LIBRARY_ALONE_FLOP`); a failing library candidate still falls back to
    the fused tiles."""
    flops = 2.0 * problem.programs * problem.rows * problem.loop * max(problem.col, 1)
    return problem.contraction and flops >= LIBRARY_ALONE_FLOP


def library_fits(problem: Problem) -> bool:
    """Whether the library form may be offered at all: it writes its computed left
    operand (rows x reduction) to memory, which must be no larger than the tensors the
    kernel reads and writes. A norm's rows before a projection are the size of its input;
    attention's scores are not (the backward's ``d_q = dS . k`` would write the rows x
    keys ``dS``: 1 GiB at S = 4096 with 32 heads, 0.35x the fused kernel's speed on the
    H200, and never an S x T tensor is the backward's memory rule: docs/autodiff.md)."""
    left = problem.programs * max(problem.rows, 1) * max(problem.loop, 1) * problem.itemsize
    return not problem.tensor_bytes or left <= problem.tensor_bytes


def library_estimate(problem: Problem, s: Schedule, device: Device) -> Estimate:
    """``strategy="library"``: the computed left operand written by one row pass (read
    the rows, write the operand), then ``torch.matmul`` reading it and the right operand
    once, at the library's share of the tensor-core rate (float32: TF32 at half the
    16-bit rate, IEEE at the FMA rate), two launches. On a device that runs programs one
    after another (the interpreter) it is priced last: there it is only the fallback."""
    r = Resources(0, 0, 1)
    if device.program_s:
        return Estimate(s, float("inf") if not problem.contraction else 1e9, r)
    rows, loop, col = max(problem.rows, 1), max(problem.loop, 1), max(problem.col, 1)
    left = problem.programs * rows * loop * problem.itemsize
    right = problem.programs * loop * col * problem.itemsize
    out = problem.programs * rows * col * problem.itemsize
    flops = 2.0 * problem.programs * rows * loop * col
    if not problem.fp32:
        rate = device.mma_flops
    else:
        rate = device.mma_flops / 2 if s.fp32_precision == "tf32" else device.fp32_flops
    t = (3 * left + right + out) / device.bandwidth + \
        flops / (rate * LIBRARY_EFFICIENCY) + 2 * device.launch_s
    return Estimate(s, t, r)
