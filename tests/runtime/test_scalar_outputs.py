"""0-d computes compile (fusion/scalars.py: a row of one; runtime/scalars.py: the outputs
viewed as 0-d): full reductions, a loss over a chain, a reduction of a reduction, mixed
with row outputs; every result against float64 on fresh random data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.fusion.scalars import has_scalars, unit_rows
from neptune_fusion.ir.graph import tensors_in_order
from neptune_fusion.ir.nodes import Compute


def _lse_chain(sizes=None, dtype=nf.float32):
    n, v = nf.sizes("N V") if sizes is None else sizes
    x = nf.placeholder((n, v), dtype, name="x")
    j, r = nf.reduce_axis(v, "j"), nf.reduce_axis(n, "r")
    m = nf.compute((n,), lambda i: nf.max(x[i, j], j), name="m")
    den = nf.compute((n,), lambda i: nf.sum(nf.exp(x[i, j] - m[i]), j), name="den")
    lse = nf.compute((n,), lambda i: m[i] + nf.log(den[i]), name="lse")
    loss = nf.compute((), lambda: nf.sum(lse[r], r) / n, name="loss")
    return x, lse, loss


def _check(kernel, outs, arrays, tol):
    got = kernel(*[torch.tensor(a) for a in arrays])
    got = got if isinstance(got, list) else [got]
    feeds = {p.name: a for p, a in zip(kernel.inputs, arrays)}
    for o, g in zip(outs, got):
        ref = nf.evaluate(o, feeds)
        assert tuple(g.shape) == tuple(np.shape(ref)), o.name
        err = np.abs(g.double().numpy() - ref).max() / max(np.abs(ref).max(), 1e-30)
        assert err < tol, (o.name, err)


@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 29), (33, 200)])
def test_mean_log_sum_exp(rows, cols, rng):
    """The mean over rows of a log-sum-exp: the loss of a chain, one number."""
    x, _, loss = _lse_chain()
    kernel = nf.compile(loss, cache=False)
    arr = rng.standard_normal((rows, cols)).astype(np.float32) * 3
    _check(kernel, [loss], [arr], 1e-5)
    got = kernel(torch.tensor(arr))
    assert got.shape == () and got.dtype == torch.float32
    want = torch.logsumexp(torch.tensor(arr, dtype=torch.float64), -1).mean()
    assert abs(got.item() - want.item()) < 1e-5 * max(1.0, abs(want.item()))


def test_scalar_beside_a_row_output_and_static_sizes(rng):
    x, lse, loss = _lse_chain(sizes=(6, 40))
    kernel = nf.compile([lse, loss], cache=False)
    _check(kernel, [lse, loss], [rng.standard_normal((6, 40)).astype(np.float32)], 1e-5)


def test_reductions_of_reductions(rng):
    """max_i sum_j x, a full sum over two axes, and a 0-d map of a 0-d reduction."""
    n, m = nf.sizes("N M")
    x = nf.placeholder((n, m), name="x")
    j, i2, j2 = nf.reduce_axis(m, "j"), nf.reduce_axis(n, "i2"), nf.reduce_axis(m, "j2")
    rows = nf.compute((n,), lambda i: nf.sum(x[i, j], j), name="rows")
    top = nf.compute((), lambda: nf.max(rows[i2], i2), name="top")
    total = nf.compute((), lambda: nf.sum(x[i2, j2], (i2, j2)), name="total")
    mean = nf.compute((), lambda: total[()] / (n * m) + top[()], name="mean")
    arr = rng.standard_normal((5, 31)).astype(np.float32)
    for outs in ([top], [total], [mean, top]):
        _check(nf.compile(outs, cache=False), outs, [arr], 1e-5)


def test_bf16_input(rng):
    x, _, loss = _lse_chain(dtype=nf.bfloat16)
    kernel = nf.compile(loss, cache=False)
    arr = torch.randn(9, 70, generator=torch.Generator().manual_seed(5)).bfloat16()
    got = kernel(arr)
    want = torch.logsumexp(arr.double(), -1).mean()
    assert got.shape == () and abs(got.double() - want) < 2e-2 * abs(want)


def test_out_tensor_and_explicit_schedule(rng):
    x, _, loss = _lse_chain()
    kernel = nf.compile(loss, schedule=nf.Schedule(block_m=1, block_n=32, num_warps=1),
                        cache=False)
    arr = torch.randn(4, 50)
    out = torch.full((), float("nan"))
    got = kernel(arr, out=[out])
    assert got.data_ptr() == out.data_ptr()
    assert abs(out.item() - torch.logsumexp(arr.double(), -1).mean().item()) < 1e-5


def test_gradient_of_a_scalar_loss():
    x, _, loss = _lse_chain()
    kernel = nf.compile(loss, cache=False, differentiable=True)
    arr = torch.randn(5, 23, dtype=torch.float64)
    a = arr.float().requires_grad_()
    kernel(a).backward()
    ref = arr.clone().requires_grad_()
    torch.logsumexp(ref, -1).mean().backward()
    assert (a.grad.double() - ref.grad).abs().max() < 1e-6


def test_compiled_by_torch_compile():
    x, _, loss = _lse_chain()
    kernel = nf.compile(loss, cache=False)

    def fn(t):
        return kernel(t) * 2.0

    arr = torch.randn(6, 19)
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(arr)
    assert got.shape == () and torch.allclose(got, fn(arr))


def test_unit_rows_rewrite():
    """Every 0-d compute becomes a (1,) compute; its readers read element 0."""
    x, lse, loss = _lse_chain()
    assert has_scalars([loss]) and not has_scalars([lse])
    [new] = unit_rows([loss])
    assert new.shape == (1,) and not has_scalars([new])
    assert unit_rows([lse]) == [lse]      # nothing 0-d: returned as it is
    assert all(t.shape for t in tensors_in_order([new]) if isinstance(t, Compute))
