"""The search space and the cost model for row reductions (no tl.dot): rows per program
from 1, persistent tiles, 1-16 warps, split-k when rows are few and long. The model's picks
are asserted by kind (persistent or looped, programs vs multiprocessors), not by tile."""

from __future__ import annotations

import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.frontend.examples import plain_attention
from neptune_fusion.ir.graph import placeholders
from neptune_fusion.schedule.cost import rank
from neptune_fusion.schedule.schedule import Schedule
from neptune_fusion.schedule.space import (
    CPU,
    H200,
    ROW_WARPS,
    Problem,
    candidates,
    persistent,
    row_candidates,
    tile_budget,
    wants_split,
)


def _logsumexp():
    """log-sum-exp over rows of symbolic length."""
    x = nf.placeholder((nf.size("N"), nf.size("D")), name="x")
    k = nf.reduce_axis(x.shape[1], "k")
    m = nf.compute((x.shape[0],), lambda i: nf.max(x[i, k], k), name="m")
    return nf.compute((x.shape[0],), lambda i: m[i] + nf.log(
        nf.sum(nf.exp(x[i, k] - m[i]), k)), name="lse")


def _rows(rows, loop, col=1, splittable=True, itemsize=4):
    return Problem(rows=rows, loop=loop, programs=1, inner=1, col=col, itemsize=itemsize,
                   fp32=itemsize >= 4, contraction=False, splittable=splittable,
                   tensor_bytes=rows * (loop + col) * itemsize)


def _programs(p: Problem, s) -> int:
    return -(-p.rows // s.block_m) * p.programs * s.splits


LSE = _rows(4096, 32768)                              # log-sum-exp, variance, denominators
SOFTMAX = _rows(4096, 32768, col=32768, splittable=False)   # an output row per row
FEW_LONG = _rows(8, 1 << 20)                          # 8 rows x 1M: split-k
FEW_LONG_UNSPLIT = _rows(8, 1 << 20, splittable=False)      # a sum producer (variance)


def test_space_has_small_rows_whole_rows_and_every_warp_count():
    space = candidates(LSE, H200)
    assert min(s.block_m for s in space) == 1
    assert {s.num_warps for s in space} == set(ROW_WARPS)
    assert any(persistent(LSE, s) for s in space)           # the whole row in one tile
    assert all(s.strategy == "rolling" for s in space)      # 4096 rows fill the GPU
    for s in space:                                         # within the register budget
        assert s.block_m * s.block_n <= tile_budget(s.num_warps)
        assert _programs(LSE, s) >= 2 * H200.sms or s.block_m == 1
    # an output row per row (softmax): the epilogue's row tile must fit too
    assert all(s.block_m * 32768 <= tile_budget(s.num_warps) for s in candidates(SOFTMAX, H200))


@pytest.mark.parametrize("problem", [LSE, SOFTMAX], ids=["lse", "softmax"])
def test_long_rows_rank_persistent_first_then_looped(problem):
    ranked = rank(problem, candidates(problem, H200), H200)
    first, second = ranked[0], ranked[1]
    assert persistent(problem, first.schedule) and first.schedule.strategy == "rolling"
    assert _programs(problem, first.schedule) >= H200.sms
    assert not persistent(problem, second.schedule)         # a GPU measures both kinds
    assert _programs(problem, second.schedule) >= 2 * H200.sms
    assert all(e.resources.regs <= 255 for e in ranked[:4])  # nothing spills


def test_the_measured_few_hold_every_kind_of_schedule():
    """An instance norm's rows (4096 of 4096 half-precision elements, the output row
    written in chunks): the model prices one tile walking the rows fastest, but the
    first four -- what a GPU measures -- hold a program per row block and a loop too
    (on the H200 the walking form took 34 us, a program per row block 18 us)."""
    p = Problem(rows=4096, loop=4096, programs=1, inner=1, col=4096, itemsize=2,
                contraction=False, tensor_bytes=4 * 4096 * 4096, col_chunk=2048)
    first = [e.schedule for e in rank(p, candidates(p, H200), H200)[:4]]
    assert first[0].row_programs and persistent(p, first[0])
    assert any(not s.row_programs and persistent(p, s) for s in first)
    assert any(not persistent(p, s) for s in first)


def test_rows_that_fit_go_persistent_with_many_programs():
    p = _rows(4096, 4096)
    best = rank(p, candidates(p, H200), H200)[0].schedule
    assert persistent(p, best) and _programs(p, best) >= 2 * H200.sms


def test_few_long_rows_split_across_the_gpu():
    assert wants_split(FEW_LONG, H200) and not wants_split(LSE, H200)
    ranked = rank(FEW_LONG, candidates(FEW_LONG, H200), H200)
    best = ranked[0].schedule
    assert best.strategy == "split" and _programs(FEW_LONG, best) >= H200.sms
    rolling = [e for e in ranked if e.schedule.strategy == "rolling"]
    assert rolling and rolling[0].seconds > 3 * ranked[0].seconds   # 8 programs: 8 SMs


def test_few_long_rows_without_split_take_one_row_per_program():
    assert not wants_split(FEW_LONG_UNSPLIT, H200)
    best = rank(FEW_LONG_UNSPLIT, candidates(FEW_LONG_UNSPLIT, H200), H200)[0].schedule
    assert best.block_m == 1 and best.num_warps >= 8 and best.strategy == "rolling"


def test_a_tiny_problem_still_has_a_candidate():
    p = _rows(1, 1)
    space = row_candidates(p, CPU, Schedule())
    assert space and all(s.block_m == 1 for s in space)


def test_problem_of_tells_row_reductions_from_contractions():
    o = _logsumexp()
    kern = nf.compile(o, placeholders([o]), cache=False)
    x = torch.randn(40, 19)
    problem, device, space = kern.space_for(x)
    assert not problem.contraction and problem.tensor_bytes == (40 * 19 + 40) * 4
    assert min(s.block_m for s in space) == 1
    torch.testing.assert_close(kern(x).double(), torch.logsumexp(x.double(), 1),
                               rtol=1e-5, atol=1e-5)
    assert kern.last_choice.source == "model"
    [a], ins = plain_attention("N", "M", 16, "float32")
    q, k = torch.randn(20, 16), torch.randn(33, 16)
    assert nf.compile(a, ins, cache=False).space_for(q, k, k)[0].contraction


def test_row_split_on_cpu_device_is_correct():
    """Few long rows on the interpreter's device model choose split-k and match."""
    o = _logsumexp()
    kern = nf.compile(o, placeholders([o]), cache=False)
    x = torch.randn(2, 4100)
    problem, device, space = kern.space_for(x)
    assert wants_split(problem, device) and any(s.strategy == "split" for s in space)
    torch.testing.assert_close(kern(x).double(), torch.logsumexp(x.double(), 1),
                               rtol=1e-5, atol=1e-5)


def test_an_output_row_past_every_budget_still_gets_wide_programs():
    p = _rows(64, 1 << 17, col=1 << 17, splittable=False)     # softmax over 128K columns
    space = candidates(p, H200)
    assert space and all(s.block_m == 1 and s.num_warps == 16 for s in space)
    assert rank(p, space, H200)
