"""Reductions over several axes at once (fusion/axes.py): split into single-axis
reductions over partial computes, each a pass of its own; every result against float64
(ragged, symbolic and static sizes, 16-bit inputs, chains, three axes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.errors import UnschedulableError
from neptune_fusion.fusion.axes import has_multi_axis, split_axes
from neptune_fusion.ir.graph import tensors_in_order
from neptune_fusion.ir.nodes import Compute, Reduce
from neptune_fusion.ir.traverse import walk
from neptune_fusion.runtime.staged import StagedKernel


def _x(sizes, dtype=nf.float32):
    n, m, k = nf.sizes("N M K") if sizes is None else sizes
    x = nf.placeholder((n, m, k), dtype, name="x")
    return n, x, nf.reduce_axis(m, "j"), nf.reduce_axis(k, "k")


def _reductions(sizes=None):
    n, x, j, k = _x(sizes)
    return [nf.compute((n,), lambda i, op=op: op(x[i, j, k], (j, k)), name=name)
            for name, op in (("s", nf.sum), ("hi", nf.max), ("lo", nf.min))]


def _softmax2(sizes=None, dtype=nf.float32):
    """A softmax over two axes: the maximum, the normaliser, every element."""
    n, x, j, k = _x(sizes, dtype)
    m = nf.compute((n,), lambda i: nf.max(x[i, j, k], (j, k)), name="m")
    den = nf.compute((n,), lambda i: nf.sum(nf.exp(x[i, j, k] - m[i]), (j, k)), name="den")
    y = nf.compute(x.shape, lambda i, a, b: nf.exp(x[i, a, b] - m[i]) / den[i], name="y")
    return [den, y]


def _run(outs, t):
    kern = nf.compile(outs, cache=False)
    got = kern(t)
    want = nf.evaluate(outs, {"x": t.double().numpy()})
    return kern, (got if isinstance(got, list) else [got]), want


@pytest.mark.parametrize("shape", [(3, 5, 7), (1, 29, 33), (2, 1, 29)])
def test_sum_max_min_over_two_axes(shape):
    t = torch.randn(*shape)
    kern, got, want = _run(_reductions(), t)
    assert isinstance(kern, StagedKernel)
    for g, w, ref in zip(got, want, (t.sum((1, 2)), t.amax((1, 2)), t.amin((1, 2)))):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(g.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)


def test_static_sizes_and_a_product():
    n, x, j, k = _x((2, 4, 9))
    p = nf.compute((n,), lambda i: nf.prod(x[i, j, k], (j, k)), name="p")
    t = torch.rand(2, 4, 9) + 0.5
    _, [got], want = _run([p], t)
    np.testing.assert_allclose(got.numpy(), want[0], rtol=1e-4)


@pytest.mark.parametrize("dtype", [nf.float32, nf.bfloat16])
def test_softmax_over_two_axes(dtype):
    outs = _softmax2(dtype=dtype)
    tdt = torch.float32 if dtype == nf.float32 else torch.bfloat16
    t = (torch.randn(3, 6, 29) * 3).to(tdt)
    kern, got, want = _run(outs, t)
    tol = 1e-5 if dtype == nf.float32 else 2e-2
    for g, w in zip(got, want):
        assert g.dtype == tdt
        np.testing.assert_allclose(g.float().numpy(), w, rtol=tol, atol=tol)
    ref = torch.softmax(t.double().reshape(3, -1), -1).reshape(t.shape)
    np.testing.assert_allclose(got[1].double().numpy(), ref.numpy(), rtol=tol, atol=tol)


def test_three_axes_inside_a_loaded_compute():
    n, m, k, l = nf.sizes("N M K L")  # noqa: E741
    x = nf.placeholder((n, m, k, l), name="x")
    j, a, b = nf.reduce_axis(m, "j"), nf.reduce_axis(k, "a"), nf.reduce_axis(l, "b")
    tot = nf.compute((n,), lambda i: nf.sum(x[i, j, a, b], (j, a, b)), name="tot")
    r = nf.compute((n, m), lambda i, c: x[i, c, 0, 0] / tot[i], name="r")
    t = torch.rand(2, 3, 4, 5) + 0.1
    _, [got], want = _run([r], t)
    np.testing.assert_allclose(got.numpy(), want[0], rtol=1e-5)


def test_split_leaves_one_axis_per_reduction():
    outs = _softmax2()
    assert has_multi_axis(outs)
    split, partials = split_axes(outs)
    assert [p.name for p in partials] == ["max_k", "sum_k"]
    assert not has_multi_axis(split)
    for t in tensors_in_order(split):
        if isinstance(t, Compute):
            assert all(len(e.axes) == 1 for e in walk(t.body) if isinstance(e, Reduce))
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    for a, b in zip(nf.evaluate(outs, {"x": x}), nf.evaluate(split, {"x": x})):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_require_single_pass_refuses():
    with pytest.raises(UnschedulableError, match="several axes at once"):
        nf.compile(_reductions()[0], cache=False, require_single_pass=True)
