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
  efficiency, plus a per-iteration overhead, plus launches (and split-k's combine).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ScheduleError
from ..ir.pow2 import next_pow2
from .schedule import Schedule
from .space import Device, Problem

_ITER_S = 4e-8        # fixed cost of one loop iteration of one program (issue, barriers)
_SPILL = 3.0          # slowdown of a kernel whose registers spill


@dataclass(frozen=True)
class Resources:
    smem: int                    # bytes per program
    regs: int                    # registers per thread (estimate)
    per_sm: int                  # programs resident per multiprocessor (0: cannot run)


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
    r = resources(problem, s, device)
    if r.smem > device.smem_per_block:
        return Estimate(s, float("inf"), r, f"shared memory {r.smem} > "
                                            f"{device.smem_per_block} bytes")
    if r.per_sm < 1:
        return Estimate(s, float("inf"), r, "no program fits a multiprocessor")
    splits = s.splits if s.strategy == "split" else 1
    row_blocks = -(-problem.rows // s.block_m)
    progs = row_blocks * problem.programs * splits
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
    if r.regs > 255:
        t *= _SPILL
    return Estimate(s, t, r)


def rank(problem: Problem, schedules, device: Device) -> list[Estimate]:
    """Feasible estimates of ``schedules``, fastest first (ties: the given order)."""
    ests = [estimate(problem, s, device) for s in schedules]
    return sorted((e for e in ests if e.feasible), key=lambda e: e.seconds)


