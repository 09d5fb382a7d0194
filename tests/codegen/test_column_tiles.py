"""Matmul-epilogue chains on a GEMM-like grid: output columns tiled across programs
(``Schedule.block_col``), a plain matmul's columns found, the row statistic beside the
matmul reduced once (deferred), the cost-based second pass for an augmented matmul, and
the search space and cost model at 4096^3; every result against float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.errors import ScheduleError
from neptune_fusion.schedule.cost import rank, resources
from neptune_fusion.schedule.space import H200, Problem, candidates


def _inputs(kernel, n: int, d: int, kout: int, rng) -> list[torch.Tensor]:
    shapes = {"x": (n, d), "w": (d,), "b": (d,), "W": (d, kout), "g": (d,)}
    return [torch.tensor(rng.standard_normal(shapes[p.name]) + (0.5 if p.name == "x" else 0),
                         dtype=torch.float32) for p in kernel.inputs]


def _check(out, kernel, tensors) -> None:
    want = nf.evaluate(out, {p.name: t.double().numpy()
                             for p, t in zip(kernel.inputs, tensors)})
    got = kernel(*tensors).double().numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


def _wide(kind: str, kout, d="D"):
    """``out = norm(x) @ W`` over ``d`` (an int or a size name) with ``kout`` columns."""
    N = nf.size("N")
    D = nf.size(d) if isinstance(d, str) else d
    x = nf.placeholder((N, D), name="x")
    w = nf.placeholder((D,), name="w")
    W = nf.placeholder((D, kout), name="W")
    c = nf.reduce_axis(D, "c")
    dd = nf.cast(D, "float32") if isinstance(d, str) else float(d)
    if kind == "rms":
        ms = nf.compute((N,), lambda i: nf.sum(x[i, c] * x[i, c], c) / dd, name="ms")
        y = nf.compute((N, D), lambda i, e: x[i, e] * nf.rsqrt(ms[i] + 1e-6) * w[e],
                       name="y")
    elif kind == "l2":
        ss = nf.compute((N,), lambda i: nf.sum(x[i, c] ** 2, c), name="ss")
        y = nf.compute((N, D), lambda i, e: x[i, e] / nf.sqrt(ss[i]) * w[e], name="y")
    else:
        b = nf.placeholder((D,), name="b")
        mu = nf.compute((N,), lambda i: nf.sum(x[i, c], c) / dd, name="mean")
        var = nf.compute((N,), lambda i: nf.sum((x[i, c] - mu[i]) ** 2, c) / dd, name="var")
        y = nf.compute((N, D), lambda i, e: (x[i, e] - mu[i]) * nf.rsqrt(var[i] + 1e-5)
                       * w[e] + b[e], name="y")
    return nf.compute((N, kout), lambda i, o: nf.sum(y[i, c] * W[c, o], c), name="out")


@pytest.mark.parametrize("kind", ["rms", "l2", "layer"])
@pytest.mark.parametrize("n,d,kout", [(1, 29, 33), (29, 33, 40), (33, 16, 64)])
def test_column_tiles_match_float64(kind, n, d, kout, rng):
    out = _wide(kind, kout)
    kernel = nf.compile(out, block_m=16, block_n=16, block_col=16, num_warps=4,
                        num_stages=2, fp32_precision="ieee")
    _check(out, kernel, _inputs(kernel, n, d, kout, rng))


def test_column_tiles_grid_and_source(rng):
    out = _wide("rms", 40)
    kernel = nf.compile(out, block_m=16, block_n=16, block_col=16, fp32_precision="ieee")
    assert kernel.program.col.programs and kernel.program.col.block_size == 16
    src = kernel.source
    assert "pid_col = " in src and "tl.dot(" in src and "group_width" in src
    tensors = _inputs(kernel, 33, 29, 40, rng)
    grid = kernel.launch(*tensors).grid
    assert grid[0] == 3 * 3          # cdiv(33, 16) row tiles x cdiv(40, 16) column tiles
    _check(out, kernel, tensors)


def test_whole_column_when_the_tile_covers_it(rng):
    out = _wide("rms", 6, d=20)
    kernel = nf.compile(out, block_m=16, block_n=16, block_col=64, fp32_precision="ieee")
    assert not kernel.program.col.programs          # 6 columns fit one 64-wide tile
    _check(out, kernel, _inputs(kernel, 5, 20, 6, rng))


def test_block_col_has_no_effect_without_a_state_column(rng):
    N, M = nf.sizes("N M")
    x = nf.placeholder((N, M), name="x")
    j = nf.reduce_axis(M, "j")
    m = nf.compute((N,), lambda i: nf.max(x[i, j], j), name="m")
    s = nf.compute((N,), lambda i: nf.sum(nf.exp(x[i, j] - m[i]), j), name="s")
    y = nf.compute((N, M), lambda i, c: nf.exp(x[i, c] - m[i]) / s[i], name="y")
    kernel = nf.compile(y, block_m=2, block_n=32, block_col=16, num_warps=1)
    assert not kernel.program.col.programs
    t = torch.randn(5, 70)
    torch.testing.assert_close(kernel(t), torch.softmax(t.double(), -1).float(),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", [3, -16, True, "64"])
def test_block_col_must_be_a_power_of_two(bad):
    with pytest.raises(ScheduleError, match="block_col"):
        nf.Schedule(block_col=bad).check()


def test_block_col_needs_rolling():
    with pytest.raises(ScheduleError, match="block_col=64.*rolling"):
        nf.Schedule(block_col=64, strategy="split", splits=2).check()


def test_block_col_round_trips_through_json():
    s = nf.Schedule(block_col=128)
    assert nf.Schedule.from_json(s.to_json()) == s
    assert nf.Schedule.from_dict({"block_m": 64}).block_col == 0   # old records


def test_plain_matmul_tiles_its_output_columns(rng):
    N, D, K = nf.sizes("N D K")
    x = nf.placeholder((N, D), name="x")
    w = nf.placeholder((D, K), name="W")
    c = nf.reduce_axis(D, "c")
    out = nf.compute((N, K), lambda i, o: nf.sum(x[i, c] * w[c, o], c), name="out")
    kernel = nf.compile(out, block_m=16, block_n=16, block_col=16, fp32_precision="ieee")
    prog = kernel.program
    assert (prog.row.name, prog.col.name) == ("i", "o") and not prog.grid
    a, b = torch.randn(21, 19), torch.randn(19, 35)
    torch.testing.assert_close(kernel(a, b), (a.double() @ b.double()).float(),
                               rtol=1e-5, atol=1e-5)


def test_row_statistic_beside_a_matmul_is_deferred(rng):
    out = _wide("rms", 24)
    kernel = nf.compile(out, block_m=16, block_n=16, block_col=16, fp32_precision="ieee")
    prog = kernel.program
    assert any(r.startswith("deferred tile reductions: ms") for r in prog.rules)
    deferred = [s for s in prog.state if s.roles == ("row", "loop")]
    assert [s.name for s in deferred] == ["ms_sum"]
    assert "tl.sum(ms_sum, 1)" in kernel.source
    _check(out, kernel, _inputs(kernel, 19, 45, 24, rng))


def test_attention_keeps_its_states(rng):
    from neptune_fusion.frontend.examples import plain_attention
    [o], _ = plain_attention()
    kernel = nf.compile(o, block_m=16, block_n=16)
    assert not any("deferred" in r for r in kernel.program.rules)


def test_layernorm_matmul_takes_a_second_pass_unless_required(rng):
    out = _wide("layer", 20)
    p = nf.plan(out)
    assert not p.single_pass and "costlier than a second pass" in p.unfused[0].reason
    assert nf.plan(out, require_single_pass=True).single_pass
    staged = nf.compile(out, cache=False)
    fused = nf.compile(out, cache=False, require_single_pass=True)
    # two passes over the rows: here (a static column) one kernel of two phases
    assert staged.program.phases == 2 and fused.program.phases == 1
    tensors = _inputs(fused, 9, 37, 20, rng)
    _check(out, staged, tensors)
    _check(out, fused, tensors)


def _gemm_problem(itemsize: int) -> Problem:
    n = 4096
    return Problem(rows=n, loop=n, programs=1, inner=1, col=n, itemsize=itemsize,
                   streamed=3 * n * n * itemsize, splittable=False, fp32=itemsize == 4,
                   contraction=True)


@pytest.mark.parametrize("itemsize", [2, 4])
def test_gemm_space_at_4096_cubed(itemsize):
    problem = _gemm_problem(itemsize)
    space = candidates(problem, H200)
    assert any(s.block_col for s in space)
    ranked = rank(problem, space, H200)
    assert ranked, "no schedule of the search space fits"
    top = ranked[:4]
    assert all(e.schedule.block_col for e in top)
    shapes = {(e.schedule.block_m, e.schedule.block_n, e.schedule.block_col) for e in top}
    assert len(shapes) == len(top)           # the measured few are distinct tile shapes
    for e in ranked:
        assert resources(problem, e.schedule, H200).smem <= H200.smem_per_block


def test_gemm_cost_prefers_large_tiles():
    from neptune_fusion.schedule.cost import estimate
    problem = _gemm_problem(2)
    small = estimate(problem, nf.Schedule(block_m=64, block_n=32, block_col=64,
                                          num_warps=4, num_stages=3), H200)
    large = estimate(problem, nf.Schedule(block_m=128, block_n=64, block_col=256,
                                          num_warps=8, num_stages=3), H200)
    assert large.seconds < small.seconds
    too_big = estimate(problem, nf.Schedule(block_m=128, block_n=128, block_col=256,
                                            num_warps=8, num_stages=4), H200)
    assert not too_big.feasible and "shared memory" in too_big.why


def test_two_column_states_price_two_accumulators_and_two_right_operands():
    """RMSNorm -> gate and up projections: one kernel, two ``block_m x block_col``
    accumulators. A tile whose pair spills or overflows shared memory is priced so
    (Llama-1B's tuner once compiled a 128 x 256 pair for minutes), and the work is two
    GEMMs' (``Problem.col_states``)."""
    from dataclasses import replace

    from neptune_fusion.schedule.cost import estimate
    one = _gemm_problem(2)
    two = replace(one, col_states=2)
    big = nf.Schedule(block_m=128, block_n=64, block_col=256, num_warps=8, num_stages=3)
    assert estimate(one, big, H200).feasible
    assert not estimate(two, big, H200).feasible        # two right tiles per stage
    mid = nf.Schedule(block_m=128, block_n=64, block_col=128, num_warps=8, num_stages=3)
    assert resources(two, mid, H200).regs > resources(one, mid, H200).regs
    assert estimate(two, mid, H200).seconds > 1.8 * estimate(one, mid, H200).seconds
    assert all(e.resources.regs <= 255 for e in rank(two, candidates(two, H200), H200)[:4])


def test_problem_counts_the_column_states():
    from neptune_fusion.runtime.problem import problem_of
    N, D, K = nf.size("N"), nf.size("D"), 48
    x = nf.placeholder((N, D), name="x")
    wg, wu = nf.placeholder((D, K), name="wg"), nf.placeholder((D, K), name="wu")
    c = nf.reduce_axis(D, "c")
    ms = nf.compute((N,), lambda i: nf.sum(x[i, c] * x[i, c], c), name="ms")
    outs = [nf.compute((N, K), lambda i, o, w=w: nf.sum(x[i, c] * w[c, o], c)
                       * nf.rsqrt(ms[i] + 1e-6), name=f"out{k}")
            for k, w in enumerate((wg, wu))]
    kernel = nf.compile(outs, [x, wg, wu])
    ts = [torch.randn(8, 32), torch.randn(32, K), torch.randn(32, K)]
    sizes = {N: 8, D: 32}
    assert problem_of(kernel._program(), kernel.inputs, ts, sizes, False).col_states == 2
    one = nf.compile(outs[:1], [x, wg])
    assert problem_of(one._program(), one.inputs, ts[:2], sizes, False).col_states == 1


def test_only_the_output_column_extent_is_specialised():
    from neptune_fusion.frontend.examples import plain_attention
    from neptune_fusion.runtime.launcher import reuse_key
    gemm = nf.compile(_wide("rms", nf.size("K")), block_m=16, block_n=16, block_col=16)
    assert "do_not_specialize=['N', 'D']" in gemm.source   # K masks contiguous tiles
    assert gemm.kernels[0].spec.specialized == ("K",)
    [o], _ = plain_attention()
    attn = nf.compile(o, block_m=16, block_n=16)
    assert "do_not_specialize=['N', 'M']" in attn.source  # decode: one kernel, any length
    kinds = ("specialized", "size")
    assert reuse_key(kinds, (4096, 17)) == reuse_key(kinds, (32, 4000))
    assert reuse_key(kinds, (4096, 17)) != reuse_key(kinds, (4095, 17))
    assert reuse_key(kinds, (1, 17)) != reuse_key(kinds, (3, 17))


def test_static_sizes_specialises_every_size_and_keys_steps_by_their_class():
    """``static_sizes``: no ``do_not_specialize``; a launch step (whose launcher keeps one
    compiled kernel) is never shared by two lengths Triton compiles apart -- here the
    loop length M, which shapes no output, in and out of the multiple-of-16 class."""
    import torch
    n, m = nf.sizes("N M")
    x = nf.placeholder((n, m), "float32", name="x")
    k = nf.reduce_axis(m, "k")
    mx = nf.compute((n,), lambda i: nf.max(x[i, k], k), name="mx")
    den = nf.compute((n,), lambda i: nf.sum(nf.exp(x[i, k] - mx[i]), k), name="den")
    loose = nf.compile([den], block_m=1, block_n=16, num_warps=1)
    tight = nf.compile([den], block_m=1, block_n=16, num_warps=1, static_sizes=True)
    assert "do_not_specialize=['N', 'M']" in loose.source
    assert "do_not_specialize" not in tight.source
    assert tight.kernels[0].spec.specialized == ("N", "M")
    for kern, steps in ((loose, 1), (tight, 2)):
        whole = torch.randn(3, 64, dtype=torch.float32)
        for cols in (32, 48, 29):   # one row stride: the steps differ by M alone
            xs = whole[:, :cols]
            want = torch.exp(xs.double() - xs.double().amax(1, keepdim=True)).sum(1)
            torch.testing.assert_close(kern(xs)[0].double(), want, rtol=1e-5, atol=1e-6)
        assert kern.steps_kept == steps, kern.schedule
