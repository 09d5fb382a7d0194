"""What the auto-scheduler reasons about: the device, the problem, and the search space.

All three are plain frozen data, so the cost model (:mod:`.cost`) and the search are pure
functions of them and testable without a GPU.

* :class:`Device`: the numbers of one GPU the cost model needs (multiprocessors, shared
  memory and registers per block, bandwidth, tensor-core rate). :func:`device_of` reads
  them from a CUDA device; :data:`H200` is the reference description and :data:`CPU`
  the interpreter's (a few "multiprocessors", so CPU runs stay small).
* :class:`Problem`: one kernel at one shape, reduced to what matters for speed -- rows
  (the query-like axis), loop length (the fused reduction axis), independent programs
  (batch x heads), contraction and output widths, element size, and whether split-k is
  possible for the plan.
* :func:`candidates`: the schedules worth considering for a problem: rolling tiles when
  there are enough rows to fill the GPU, split-k (with split counts around "fill the
  GPU") when there are not.
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


# NVIDIA H200 (SXM, 132 SMs): 227 KiB shared memory per block, 64 K registers per SM;
# bandwidth and matmul rate as measured by the bench's ceilings on 2026-11-30
# (4.24 TB/s copy, 658-758 TFLOP/s fp16 matmul).
H200 = Device("NVIDIA H200", sms=132, smem_per_block=232448, regs_per_sm=65536,
              max_warps_per_sm=64, bandwidth=4.24e12, mma_flops=7.0e14, fp32_flops=6.0e13)

# Triton's interpreter: few programs keep CPU runs fast; resources are not limited.
CPU = Device("cpu (Triton interpreter)", sms=8, smem_per_block=1 << 30, regs_per_sm=1 << 30,
             max_warps_per_sm=1 << 10, bandwidth=1e10, mma_flops=1e10, fp32_flops=1e10,
             launch_s=1e-3)


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
                   mma_flops=H200.mma_flops * scale, fp32_flops=H200.fp32_flops * scale)


@dataclass(frozen=True)
class Problem:
    """One kernel at one shape, as far as its speed is concerned.

    ``rows`` is the extent of the row (query) axis, ``loop`` of the fused reduction axis,
    ``programs`` the number of independent (batch, head, ...) instances, ``inner`` the
    contraction width (head dim of q/k), ``col`` the output width (head dim of v),
    ``itemsize`` the input element size. ``streamed`` is the bytes of the inputs indexed
    along the loop axis (k and v; 0: every program reads its own). ``splittable``: split-k
    is legal for the plan. ``visits``: per tile shape, the share of loop tiles the loop
    partition visits (causal masks, sliding windows).
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
    # ((block_m, block_n, share of the row-block x loop-tile pairs the loop visits), ...)
    visits: tuple[tuple[int, int, float], ...] = ()

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
ROLLING_N = (32, 64, 128)
SPLIT_N = (64, 128, 256)
WARPS = (4, 8)
STAGES = (2, 3, 4)


def tile_shapes(rows: int) -> tuple[tuple[int, int], ...]:
    """Every ``(block_m, block_n)`` :func:`candidates` may use for ``rows`` rows."""
    rows_p2 = next_pow2(rows, 16)
    ms = tuple(m for m in ROLLING_M if m <= rows_p2) or (rows_p2,)
    return tuple(sorted({(m, n) for m in ms for n in ROLLING_N}
                        | {(rows_p2, n) for n in SPLIT_N}))


def wants_split(problem: Problem, device: Device) -> bool:
    """Split-k when the rolling kernel cannot fill the GPU: fewer row blocks (at the
    smallest tile) times programs than multiprocessors, and a loop long enough to split."""
    blocks = -(-problem.rows // 16) * problem.programs
    return problem.splittable and blocks < device.sms and problem.loop > 64


def split_counts(problem: Problem, device: Device, block_n: int) -> tuple[int, ...]:
    """Split counts around "two programs per multiprocessor" (a quarter of that to twice
    it: fewer, longer chunks often stream better), clamped to the tile count."""
    tiles = max(1, -(-problem.loop // block_n))
    blocks = max(1, -(-problem.rows // 16) * problem.programs)
    fill = max(1, -(-2 * device.sms // blocks))
    want = {max(1, fill // 4), max(1, fill // 2), fill, 2 * fill}
    return tuple(sorted({max(1, min(w, tiles)) for w in want}))


def candidates(problem: Problem, device: Device, base: Schedule | None = None
               ) -> list[Schedule]:
    """Every schedule of the search space for ``problem`` (speed rules from ``base``).

    Rolling: BLOCK_M in {64, 128} (or the rows rounded up when fewer), BLOCK_N in
    {32, 64, 128}, 4 or 8 warps, 2-4 stages. Split-k (see :func:`wants_split`): BLOCK_M the
    rows rounded up to a power of two >= 16, BLOCK_N in {64, 128, 256}, 4 or 8 warps, 2-4
    stages, and the split counts of :func:`split_counts`.
    """
    base = base if base is not None else Schedule()
    base = replace(base, strategy="rolling", splits=1)
    out: list[Schedule] = []
    if wants_split(problem, device):
        bm = next_pow2(problem.rows, 16)
        for bn in SPLIT_N:
            for k in split_counts(problem, device, bn):
                for w in WARPS:
                    for st in STAGES:
                        out.append(replace(base, block_m=bm, block_n=bn, num_warps=w,
                                           num_stages=st, strategy="split" if k > 1
                                           else "rolling", splits=k))
        return sorted(set(out), key=_order)
    rows_p2 = next_pow2(problem.rows, 16)
    ms = tuple(m for m in ROLLING_M if m <= rows_p2) or (rows_p2,)
    for bm in ms:
        for bn in ROLLING_N:
            for w in WARPS:
                for st in STAGES:
                    out.append(replace(base, block_m=bm, block_n=bn, num_warps=w,
                                       num_stages=st))
    return sorted(set(out), key=_order)


def _order(s: Schedule) -> tuple:
    return (s.strategy, s.block_m, s.block_n, s.splits, s.num_warps, s.num_stages)
