"""Split-k for row chains the combine could not finish before: a consumer of a running
*sum* (variance, whose partial states are extrapolated from each split's own count) and
outputs that read the input again after the loop (a norm's or softmax's ``y[i, k]``),
whose column the combine programs cut into one piece each. Every result is checked
against the float64 reference on fresh random data, with empty splits among the rest."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.errors import UnschedulableError
from neptune_fusion.ir.graph import placeholders
from neptune_fusion.schedule.cost import rank
from neptune_fusion.schedule.schedule import Schedule
from neptune_fusion.schedule.space import H200, Problem, candidates


def _rows(d: int):
    N = nf.size("N")
    x = nf.placeholder((N, d), name="x")
    return x, nf.reduce_axis(d, "r")


def _variance(d: int):
    x, r = _rows(d)
    mu = nf.compute(x.shape[:1], lambda i: nf.sum(x[i, r], r) / d, name="mu")
    return nf.compute(x.shape[:1], lambda i: nf.sum((x[i, r] - mu[i]) ** 2, r) / d,
                      name="var")


def _layer_norm(d: int):
    x, r = _rows(d)
    w = nf.placeholder((d,), name="w")
    mu = nf.compute(x.shape[:1], lambda i: nf.sum(x[i, r], r) / d, name="mu")
    var = nf.compute(x.shape[:1], lambda i: nf.sum((x[i, r] - mu[i]) ** 2, r) / d,
                     name="var")
    return nf.compute(x.shape, lambda i, k: (x[i, k] - mu[i]) * nf.rsqrt(var[i] + 1e-5)
                      * w[k], name="y")


def _softmax(d: int):
    x, r = _rows(d)
    m = nf.compute(x.shape[:1], lambda i: nf.max(x[i, r], r), name="m")
    s = nf.compute(x.shape[:1], lambda i: nf.sum(nf.exp(x[i, r] - m[i]), r), name="s")
    return nf.compute(x.shape, lambda i, k: nf.exp(x[i, k] - m[i]) / s[i], name="y")


def _torch(chain: str, x, w):
    if chain == "variance":
        return torch.var(x, -1, correction=0)
    if chain == "softmax":
        return torch.softmax(x, -1)
    return torch.nn.functional.layer_norm(x, x.shape[-1:], eps=1e-5) * w


# (splits, block_n) over 300 columns: 2 x 160, 3 x 128 (the last split 44), and 8 splits
# of 64 of which 3 are empty
SPLITS = [(2, 32), (3, 64), (8, 64)]


@pytest.mark.parametrize("chain", ["variance", "layer-norm", "softmax"])
@pytest.mark.parametrize("splits,block_n", SPLITS, ids=[f"{k}x{n}" for k, n in SPLITS])
def test_split_k_matches_float64(chain, splits, block_n):
    d = 300
    y = {"variance": _variance, "layer-norm": _layer_norm, "softmax": _softmax}[chain](d)
    sched = Schedule(block_m=2, block_n=block_n, num_warps=2, num_stages=1,
                     strategy="split", splits=splits)
    ins = placeholders([y])
    kern = nf.compile(y, ins, schedule=sched, cache=False)
    assert len(kern.kernels) == 2                       # the partial and the combine
    rng = np.random.default_rng(splits * 100 + block_n)
    # a large mean: a poorly shifted variance would lose its digits to cancellation
    x = (rng.standard_normal((5, d)) * 2.0 + (50.0 if chain == "variance" else 1.0))
    w = rng.standard_normal(d)
    feeds = {"x": x.astype(np.float32), "w": w.astype(np.float32)}
    args = [torch.from_numpy(feeds[p.name]) for p in ins]
    got = kern(*args).double().numpy()
    want = np.asarray(nf.evaluate(y, {p.name: feeds[p.name].astype(np.float64)
                                      for p in ins}))
    spec = _torch(chain, torch.from_numpy(feeds["x"]).double(),
                  torch.from_numpy(feeds["w"]).double()).numpy()
    np.testing.assert_allclose(want, spec, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    if chain != "variance":   # the combine reads x, each program its piece of columns
        combine = kern.kernels[1].program
        assert [a.name for a in combine.inputs][-len(ins):] == [p.name for p in ins]
        assert combine.split.col_blocks == splits
        assert "col_lo = pid_col * piece" in kern.source


def test_running_sum_under_a_mask_partition_is_not_split():
    """Prefix sums (``j <= i``) read by a consumer in the same loop: the mask bounds each
    row's loop by the row, so the combine could not know how many elements each split
    saw, and split-k is refused by name (rolling runs it)."""
    N = nf.size("N")
    x = nf.placeholder((N,), name="x")
    j = nf.reduce_axis(N, "j")
    mu = nf.compute((N,), lambda i: nf.sum(nf.where(j <= i, x[j], 0.0), j), name="mu")
    v = nf.compute((N,), lambda i: nf.sum(nf.where(j <= i, nf.exp(x[j] - mu[i] / 64.0),
                                                   0.0), j), name="v")
    rolling = nf.compile(v, placeholders([v]), cache=False,
                         schedule=Schedule(block_m=2, block_n=16, num_warps=2))
    assert [a.producers for a in rolling.program.accumulators] == [(), (0,)]
    with pytest.raises(UnschedulableError, match="running sum in a loop whose bounds"):
        nf.compile(v, placeholders([v]), cache=False,
                   schedule=Schedule(block_m=2, block_n=16, num_warps=2, strategy="split",
                                     splits=2))


def test_few_long_rows_rank_split_k_first():
    """A group norm at batch 1 (32 rows of 65536, the output row written in chunks) is
    split on the H200; at batch 16 (512 rows) it stays rolling, with several programs per
    multiprocessor now that the chunked output row does not count against registers."""
    def problem(n):
        el = n * 32 * 65536
        return Problem(rows=32, loop=65536, programs=n, inner=1, col=65536, itemsize=2,
                       contraction=False, tensor_bytes=4 * el, reread_bytes=2 * el,
                       col_chunk=2048)
    b1 = rank(problem(1), candidates(problem(1), H200, Schedule()), H200)
    assert b1[0].schedule.strategy == "split" and b1[0].schedule.splits >= 8
    b16 = rank(problem(16), candidates(problem(16), H200, Schedule()), H200)
    assert b16[0].schedule.strategy == "rolling" and b16[0].resources.per_sm >= 2
    whole = Problem(rows=32, loop=65536, programs=16, inner=1, col=65536, itemsize=2,
                    contraction=False, splittable=False)     # no chunk: the old answer
    assert rank(whole, candidates(whole, H200, Schedule()), H200)[0].schedule.num_warps == 16


@pytest.mark.parametrize("schedule", [
    Schedule(block_m=1, block_n=1024, num_warps=4, num_stages=1),
    Schedule(block_m=1, block_n=1024, num_warps=4, num_stages=1, strategy="split", splits=2),
], ids=["rolling", "split-k"])
def test_a_channel_weight_is_one_load_per_chunk(schedule):
    """A group norm's affine reads ``w[k // (H*W)]`` along its output row. With ``H*W`` a
    multiple of the epilogue's chunk, each chunk lies in one channel: the weight is read
    at ``col_start // (H*W)`` once per chunk, not gathered per element."""
    hw, per = 2048, 3
    d = hw * per
    x, r = _rows(d)
    w = nf.placeholder((per,), name="w")
    mu = nf.compute(x.shape[:1], lambda i: nf.sum(x[i, r], r) / d, name="mu")
    var = nf.compute(x.shape[:1], lambda i: nf.sum((x[i, r] - mu[i]) ** 2, r) / d,
                     name="var")
    y = nf.compute(x.shape, lambda i, k: (x[i, k] - mu[i]) * nf.rsqrt(var[i] + 1e-5)
                   * w[k // hw], name="y")
    ins = placeholders([y])
    kern = nf.compile(y, ins, schedule=schedule, cache=False)
    assert f"k0 // {hw}" in kern.source and f"offs_k // {hw}" not in kern.source
    rng = np.random.default_rng(5)
    feeds = {"x": (rng.standard_normal((3, d)) + 2.0).astype(np.float32),
             "w": rng.standard_normal(per).astype(np.float32)}
    got = kern(*[torch.from_numpy(feeds[p.name]) for p in ins]).double().numpy()
    want = np.asarray(nf.evaluate(y, {k: v.astype(np.float64) for k, v in feeds.items()}))
    x64 = torch.from_numpy(feeds["x"]).double()
    spec = torch.nn.functional.layer_norm(x64, (d,), eps=1e-5) * \
        torch.from_numpy(feeds["w"]).double().repeat_interleave(hw)
    np.testing.assert_allclose(want, spec.numpy(), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
