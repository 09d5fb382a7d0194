"""A reduction over an inner axis whose tile is wider than the axis (a symbolic or odd
extent) fills the padding with the reducer's identity (``tiles.TileOps.padded``): the
masked loads read 0 there, which a max of negative values or a sum of exponentials would
count. Found as a wrong answer (1-2 % off) of a weighted sum of row log-sum-exps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf


def _weighted(inner):
    """``out[r] = sum_n w[r, n] * inner(x, n)``: the loop is over ``n``; ``inner`` reduces
    row ``n`` of ``x`` over its columns inside the loop body (an inner axis)."""
    n, m, r = nf.sizes("N M R")
    x = nf.placeholder((n, m), name="x")
    w = nf.placeholder((r, n), name="w")
    j, k = nf.reduce_axis(m, "j"), nf.reduce_axis(n, "k")
    row = nf.compute((n,), lambda i: inner(x, i, j), name="row")
    return nf.compute((r,), lambda a: nf.sum(w[a, k] * row[k], k), name="out")


def _lse(x, i, j):
    return nf.log(nf.sum(nf.exp(x[i, j]), j))


def _top(x, i, j):
    return nf.max(x[i, j], j)


def _low(x, i, j):
    return nf.min(x[i, j], j)


@pytest.mark.parametrize("inner", [_lse, _top, _low], ids=["lse", "max", "min"])
@pytest.mark.parametrize("cols", [1, 29, 33])
def test_inner_reduction_ignores_the_padding(inner, cols, rng):
    out = _weighted(inner)
    kernel = nf.compile(out, cache=False)
    # below zero for the max (a padded 0 would win), above for the min
    sign = 1.0 if inner is _low else -1.0
    x = (sign * (rng.random((5, cols)) + 0.5)).astype(np.float32)
    w = rng.standard_normal((3, 5)).astype(np.float32)
    feeds = {"x": x, "w": w}
    got = kernel(*[torch.tensor(feeds[p.name]) for p in kernel.inputs])
    want = nf.evaluate(out, feeds)
    assert np.allclose(got.double().numpy(), want, rtol=1e-5, atol=1e-6)


def test_two_inner_axes_in_one_tile_are_refused():
    """A column sum of attention inlines attention's chain into the loop over its rows:
    ``kk[j, c]`` would need two inner tile axes, which the lowering once paired element
    by element (a wrong answer when their tiles had one size). Refused by name now."""
    n, m, k, e = nf.sizes("N M K E")
    q = nf.placeholder((n, k), name="q")
    kk = nf.placeholder((m, k), name="kk")
    v = nf.placeholder((m, e), name="v")
    c, j, r = nf.reduce_axis(k, "c"), nf.reduce_axis(m, "j"), nf.reduce_axis(n, "r")
    s = nf.compute((n, m), lambda i, jj: nf.sum(q[i, c] * kk[jj, c], c), name="s")
    mx = nf.compute((n,), lambda i: nf.max(s[i, j], j), name="mx")
    den = nf.compute((n,), lambda i: nf.sum(nf.exp(s[i, j] - mx[i]), j), name="den")
    o = nf.compute((n, e), lambda i, a: nf.sum(nf.exp(s[i, j] - mx[i]) * v[j, a], j)
                   / den[i], name="o")
    col = nf.compute((e,), lambda a: nf.sum(o[r, a], r), name="col")
    with pytest.raises(nf.CodegenError, match=r"spans two inner axes \(j, c\)"):
        nf.compile(col, schedule=nf.Schedule(block_m=16, block_n=16, num_warps=4),
                   cache=False)
    auto = nf.compile(col, cache=False)     # the auto-scheduler: no candidate builds
    with pytest.raises(nf.CodegenError, match="spans two inner axes"):
        auto(torch.randn(6, 16), torch.randn(16, 16), torch.randn(16, 16))
