"""One tile covers the row (a persistent schedule): no loop, the tile loaded once and read
by every phase and by an epilogue over the same row (softmax reads x once); symbolic
lengths branch at run time between that code and the loops. Every kernel is checked
against the float64 reference on fresh random data at ragged lengths."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.errors import VerificationError
from neptune_fusion.fusion.plan import plan
from neptune_fusion.ir.graph import placeholders
from neptune_fusion.runtime.pipeline import build_programs
from neptune_fusion.runtime.problem import problem_of
from neptune_fusion.schedule.cost import row_estimate
from neptune_fusion.schedule.schedule import Schedule
from neptune_fusion.schedule.space import H200


def _x(d):
    N = nf.size("N")
    M = nf.size("M") if d is None else d
    return N, M, nf.placeholder((N, M), name="x"), nf.reduce_axis(M, "k")


def softmax(d=None):
    N, _, x, k = _x(d)
    m = nf.compute((N,), lambda i: nf.max(x[i, k], k), name="m")
    lv = nf.compute((N,), lambda i: nf.sum(nf.exp(x[i, k] - m[i]), k), name="l")
    return [nf.compute(x.shape, lambda i, j: nf.exp(x[i, j] - m[i]) / lv[i], name="y")]


def log_softmax(d=None):
    N, _, x, k = _x(d)
    m = nf.compute((N,), lambda i: nf.max(x[i, k], k), name="m")
    return [nf.compute(x.shape, lambda i, j: x[i, j] - m[i] - nf.log(
        nf.sum(nf.exp(x[i, k] - m[i]), k)), name="y")]


def tanh_softmax(d=None):
    """Phased: the max, then a softmax of tanh(x - max) (its sum reads the max through
    tanh), written over the row: two phases and an epilogue on one tile."""
    N, _, x, k = _x(d)
    m = nf.compute((N,), lambda i: nf.max(x[i, k], k), name="m")
    s = nf.compute((N,), lambda i: nf.sum(nf.exp(nf.tanh(x[i, k] - m[i])), k), name="s")
    return [nf.compute(x.shape, lambda i, j: nf.exp(nf.tanh(x[i, j] - m[i])) / s[i],
                       name="y")]


def logsumexp(d=None):
    N, _, x, k = _x(d)
    return [nf.compute((N,), lambda i: nf.max(x[i, k], k) + nf.log(
        nf.sum(nf.exp(x[i, k] - nf.max(x[i, k], k)), k)), name="lse")]


CHAINS = {f.__name__: f for f in (softmax, log_softmax, tanh_softmax, logsumexp)}
PERSISTENT = Schedule(block_m=2, block_n=64, num_warps=2, num_stages=1)


def _run(outs, schedule, rows, d, seed=0):
    kern = nf.compile(outs[0], placeholders(outs), schedule=schedule, cache=False)
    x = np.random.default_rng(seed).standard_normal((rows, d)) * 2.0
    got = kern(torch.tensor(x, dtype=torch.float32)).double().numpy()
    want = np.asarray(nf.evaluate(outs[0], {"x": x}))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * max(1.0, np.abs(want).max()))
    return kern


def _program(outs, schedule):
    [prog] = build_programs(plan(outs), placeholders(outs), schedule, "k")
    return prog


@pytest.mark.parametrize("name", sorted(CHAINS))
@pytest.mark.parametrize("d", [1, 29, 33, 64])
def test_static_one_tile_reads_the_input_once(name, d):
    """A static row within BLOCK_N: no loop, one load of x in the whole kernel."""
    kern = _run(CHAINS[name](d), PERSISTENT, 5, d)
    assert kern.program.one_tile == "static"
    src = kern.source
    assert "for " not in src and src.count("tl.load(") == 1
    if d == 64:     # the tile is exactly the row: no masks on it
        assert "offs_k < 64" not in src


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_a_looped_schedule_keeps_the_loops(name):
    kern = _run(CHAINS[name](45), Schedule(block_m=2, block_n=16, num_warps=1), 5, 45)
    assert kern.program.one_tile == "" and "for " in kern.source


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "tanh_softmax"])
def test_symbolic_length_branches_at_run_time(name):
    """One kernel: lengths up to BLOCK_N take the one-tile branch (x read once), longer
    ones the loops and the chunked epilogue."""
    sched = Schedule(block_m=2, block_n=32, num_warps=1, num_stages=1)
    outs = CHAINS[name]()
    prog = _program(outs, sched)
    assert prog.one_tile == "runtime"
    kern = None
    for d in (1, 29, 32, 33, 70):
        kern = _run(outs, sched, 3, d, seed=d)
    src = kern.source
    exact, rest = src.split("\n    if ONE_TILE == 2:\n")[1].split("\n    elif ONE_TILE == 1:\n")
    one, rest = rest.split("\n    else:\n")
    assert one.count("tl.load(") == 1 and "for " not in one
    assert exact.count("tl.load(") == 1 and "for " not in exact
    assert "offs_k < M" not in exact and "offs_k < M" in one   # exact: no masks on k
    assert rest.count("tl.load(") > 1 and "for " in rest


def test_a_symbolic_reduction_that_reads_nothing_after_branches_too():
    """log-sum-exp reads x in the loop only: no read to save, but the one tile starts from
    the empty state (no repair) and an exact tile drops its masks, so it branches too."""
    prog = _program(logsumexp(), PERSISTENT)
    assert prog.one_tile == "runtime"
    src = _run(logsumexp(), PERSISTENT, 3, 64).source
    exact = src.split("if ONE_TILE == 2:")[1].split("elif ONE_TILE == 1:")[0]
    assert "alpha" not in exact and "offs_k < M" not in exact and "for " not in exact


def test_the_one_tile_starts_from_the_empty_state():
    """The first tile's repair folds away: no select on the tile position, no alpha."""
    src = _run(softmax(29), PERSISTENT, 3, 29).source
    assert "j0" not in src and "alpha" not in src and "== 0" not in src


def test_check_states_the_one_tile_invariants():
    prog = _program(softmax(29), PERSISTENT)
    with pytest.raises(VerificationError, match=r"one tile: BLOCK_N = 16 does not cover"):
        replace(prog, schedule=replace(prog.schedule, block_n=16),
                loop=replace(prog.loop, block_size=16)).check()
    with pytest.raises(VerificationError, match=r"one tile: the loop axis .* is static"):
        replace(prog, one_tile="runtime").check()
    with pytest.raises(VerificationError, match=r"one tile: mode 'always'"):
        replace(prog, one_tile="always").check()


def test_split_programs_walk_chunks():
    outs = logsumexp(29)
    sched = Schedule(block_m=1, block_n=64, num_warps=1, strategy="split", splits=2)
    assert [p.one_tile for p in _program_all(outs, sched)] == ["", ""]


def _program_all(outs, schedule):
    return build_programs(plan(outs), placeholders(outs), schedule, "k")


@pytest.mark.parametrize("name, rereads", [("softmax", 1), ("log_softmax", 1),
                                           ("tanh_softmax", 2), ("logsumexp", 0)])
def test_cost_model_counts_the_reread(name, rereads):
    """A looped softmax moves 3x its input's bytes, a persistent one 2x: the model adds
    the input again (``reread_bytes``) to every schedule that is not persistent."""
    outs = CHAINS[name]()
    ins = placeholders(outs)
    [prog] = build_programs(plan(outs), ins, Schedule(block_m=1, block_n=1024), "k")
    x = torch.empty(4096, 32768)
    sizes = {s: v for s, v in zip(ins[0].shape, x.shape)}
    prob = problem_of(prog, ins, [x], sizes, visits=False)
    nbytes = x.numel() * 4
    assert prob.reread_bytes == rereads * nbytes
    looped = Schedule(block_m=1, block_n=2048, num_warps=16, num_stages=2)
    whole = Schedule(block_m=1, block_n=32768, num_warps=16, num_stages=1)
    base = replace(prob, reread_bytes=0)
    gap = row_estimate(prob, looped, H200).seconds - row_estimate(base, looped, H200).seconds
    assert row_estimate(prob, whole, H200).seconds == row_estimate(base, whole, H200).seconds
    assert (gap > 0) == (rereads > 0)
    if rereads:    # the extra bytes at the bandwidth the programs reach (at most the device's)
        assert 1.0 <= gap / (rereads * nbytes / H200.bandwidth) < 4.0


def test_the_epilogue_stores_from_the_tile():
    """softmax's output is stored at the tile's offsets: the epilogue's column renamed to
    the loop axis (no BLOCK_ of the column in any tl.arange)."""
    src = _run(softmax(33), PERSISTENT, 3, 33).source
    assert re.search(r"tl\.store\(y_ptr \+ .*offs_k\[None, :\]", src)
    assert "tl.arange(0, BLOCK_J)" not in src


WALK = replace(PERSISTENT, row_programs=1)


@pytest.mark.parametrize("name", sorted(CHAINS))
@pytest.mark.parametrize("rows", [1, 2, 5, 9])     # fewer, as many and more row blocks
@pytest.mark.parametrize("d", [29, 64, 70])        # masked tile, exact tile, the loops
def test_a_persistent_grid_walks_the_row_blocks(name, rows, d):
    """``row_programs``: the launch caps the row grid (2 programs per "multiprocessor"
    on the interpreter, so 9 rows in blocks of 2 are walked 3 deep); every row block is
    computed once, against float64, with the next block's tile loaded ahead."""
    _run(CHAINS[name](), WALK, rows, d, seed=rows * 100 + d)
    _run(CHAINS[name](d), WALK, rows, d, seed=rows * 100 + d + 1)   # a static length


def test_the_walk_loads_the_next_row_block_ahead():
    outs = softmax()
    src = nf.compile(outs[0], placeholders(outs), schedule=WALK, cache=False).source
    exact = src.split("if ONE_TILE == 2:")[1].split("elif ONE_TILE == 1:")[0]
    head, loop = exact.split("for walk in range(tl.program_id(0), tl.cdiv(N, BLOCK_M), "
                             "tl.num_programs(0)):")
    assert head.count("tl.load(") == 1 and "offs_i_walk" in head
    ahead = loop.split("tl.max(")[0]        # the next block's load precedes the arithmetic
    assert ahead.count("tl.load(") == 1 and "offs_i_next" in ahead
    assert loop.rstrip().endswith("offs_i_walk, x = offs_i_next, x_2"), loop
    loops = src.split("\n    else:\n")[1]   # the looped branch keeps a program per block
    assert "walk" not in loops


def test_walking_grid_is_capped_only_when_the_tile_runs():
    outs = softmax()
    kern = nf.compile(outs[0], placeholders(outs), schedule=WALK, cache=False)
    [spec] = kern.specs
    assert spec.row_programs == 1
    x = torch.randn(40, 64)
    kern(x)
    steps = list(kern._steps.values())
    assert [s.grid[0] for s in steps] == [2]          # 20 row blocks walked by 2 programs
    kern(torch.randn(40, 100))                       # the loops: a program per row block
    assert sorted(s.grid[0] for s in kern._steps.values()) == [2, 20]


def test_row_programs_is_checked():
    with pytest.raises(nf.ScheduleError, match="row_programs"):
        Schedule(row_programs=-1).check()
    with pytest.raises(nf.ScheduleError, match="row_programs"):
        Schedule(row_programs=1, strategy="split", splits=2).check()


@pytest.mark.parametrize("d", [29, 64])
def test_the_walk_over_a_batch_axis(d):
    """A batch axis in the grid beside the walked rows: every (batch, row block) once."""
    B, N = nf.size("B"), nf.size("N")
    x = nf.placeholder((B, N, d), name="x")
    k = nf.reduce_axis(d, "k")
    m = nf.compute((B, N), lambda b, i: nf.max(x[b, i, k], k), name="m")
    lv = nf.compute((B, N), lambda b, i: nf.sum(nf.exp(x[b, i, k] - m[b, i]), k), name="l")
    y = nf.compute(x.shape, lambda b, i, j: nf.exp(x[b, i, j] - m[b, i]) / lv[b, i], name="y")
    kern = nf.compile(y, [x], schedule=WALK, cache=False)
    assert "walk" in kern.source
    xs = np.random.default_rng(d).standard_normal((3, 7, d)) * 2.0
    got = kern(torch.tensor(xs, dtype=torch.float32)).double().numpy()
    want = np.asarray(nf.evaluate(y, {"x": xs}))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
