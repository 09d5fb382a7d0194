"""Output axes that no reduction reads, beside the epilogue's column (an instance norm's
``h`` when ``w`` is the column), are scalar loops around the epilogue, not grid axes: a
grid axis would run the reductions again in each of its programs. Checked against the
float64 reference on fresh random data, rolling, one-tile and split-k."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.ir.graph import placeholders
from neptune_fusion.schedule.schedule import Schedule


def _instance_norm(h: int, w: int):
    """``(x - mean) * rsqrt(var + eps)`` over each (n, c) plane of ``x`` (N, C, h, w),
    the statistics over the plane read as one axis ``r < h * w``."""
    N, C = nf.size("N"), nf.size("C")
    x = nf.placeholder((N, C, h, w), name="x")
    r = nf.reduce_axis(h * w, "r")
    mean = nf.compute((N, C), lambda n, c: nf.sum(x[n, c, r // w, r % w], r) / (h * w),
                      name="mean")
    var = nf.compute((N, C), lambda n, c: nf.sum(
        (x[n, c, r // w, r % w] - mean[n, c]) ** 2, r) / (h * w), name="var")
    return nf.compute(x.shape, lambda n, c, i, j: (x[n, c, i, j] - mean[n, c])
                      * nf.rsqrt(var[n, c] + 1e-5), name="y")


def _plane_softmax(h: int, w: int, broadcast: bool = False):
    """A softmax over each (n, c) plane: max, then the sum of exponentials. ``broadcast``:
    the plane's log-sum-exp written at each of its points instead (split-k's combine then
    reads no input after the loop; with the softmax it reads ``x`` again, each combine
    program a piece of the columns)."""
    N, C = nf.size("N"), nf.size("C")
    x = nf.placeholder((N, C, h, w), name="x")
    r = nf.reduce_axis(h * w, "r")
    m = nf.compute((N, C), lambda n, c: nf.max(x[n, c, r // w, r % w], r), name="m")
    s = nf.compute((N, C), lambda n, c: nf.sum(nf.exp(x[n, c, r // w, r % w] - m[n, c]),
                                               r), name="s")
    if broadcast:
        return nf.compute(x.shape, lambda n, c, i, j: m[n, c] + nf.log(s[n, c]), name="y")
    return nf.compute(x.shape, lambda n, c, i, j: nf.exp(x[n, c, i, j] - m[n, c])
                      / s[n, c], name="y")


ROLLING = Schedule(block_m=4, block_n=16, num_warps=4)        # masked tail
ONE_TILE = Schedule(block_m=2, block_n=64, num_warps=4)
SPLIT = Schedule(block_m=2, block_n=16, num_warps=4, strategy="split", splits=3)
WALK = Schedule(block_m=2, block_n=64, num_warps=2, num_stages=1, row_programs=1)


@pytest.mark.parametrize("chain,schedule", [
    ("norm", ROLLING), ("norm", ONE_TILE), ("norm", WALK), ("softmax", ROLLING),
    ("lse", SPLIT), ("norm", SPLIT), ("softmax", SPLIT),
], ids=["norm-rolling", "norm-one-tile", "norm-walking-rows", "softmax-rolling",
        "lse-split-k", "norm-split-k", "softmax-split-k"])
def test_a_plane_reduction_loops_over_its_plane_in_the_epilogue(chain, schedule):
    y = _instance_norm(5, 7) if chain == "norm" else _plane_softmax(5, 7, chain == "lse")
    kern = nf.compile(y, placeholders([y]), schedule=schedule, cache=False)
    for prog in [k.program for k in kern.kernels]:   # split-k: the partial and the combine
        assert [a.name for a in prog.epi] == ["i"]           # h: a scalar loop
        assert all(a.name != "i" for a in prog.grid)          # not a grid axis
    assert "for i in range(0, 5):" in kern.source
    assert "a persistent grid" not in kern.source   # walking rows: not with epilogue loops
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 6, 5, 7)) * 2.0 + 1.0).astype(np.float32)
    got = kern(torch.from_numpy(x)).double().numpy()
    want = np.asarray(nf.evaluate(y, {"x": x.astype(np.float64)}))
    x64 = torch.from_numpy(x).double()
    flat = x64.flatten(2)
    spec = {"norm": torch.nn.functional.instance_norm(x64, eps=1e-5),
            "softmax": torch.softmax(flat, -1).view(x.shape),
            "lse": torch.logsumexp(flat, -1)[..., None, None].expand(x.shape)}[chain]
    np.testing.assert_allclose(want, spec.numpy(), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
