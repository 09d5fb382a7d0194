"""A variance's sums are centred on a value of the row (analysis/centre.py).

Before, ``var`` of ``randn + 1e5`` in float32 was off by 1e-5..1e-4 where eager float32 is
within 4e-8 of float64: the mean's rounding ``delta`` entered the centred sum of squares
as ``m * delta ** 2``. Now the sums run over ``x - x[i, 0]``. Each compiled result is
compared with float64 on fresh data far from 0 and near it, under one tile, a masked tile
and several tiles; the plan shows the pivot; an infinity, a NaN and an empty row give
what the program as written gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.analysis.centre import centre
from neptune_fusion.dynamo import Backend
from neptune_fusion.fusion.plan import plan

SHAPES = ((3, 16), (5, 45), (4, 300))
OFFSETS = (0.0, 1e5, -3e6)


def _stats(d, dtype="float32", correction=0, std=False):
    """Mean and variance (or std) of rows; ``d`` an int, or None for a symbolic M."""
    n = nf.size("N")
    m = nf.size("M") if d is None else d
    x = nf.placeholder((n, m), dtype, name="x")
    k = nf.reduce_axis(m, "k")
    xf = (lambda i, j: nf.cast(x[i, j], "float32")) if dtype != "float32" else \
        (lambda i, j: x[i, j])
    mu = nf.compute((n,), lambda i: nf.sum(xf(i, k), k) / m, name="mean")
    var = nf.compute((n,), lambda i: nf.sum((xf(i, k) - mu[i]) ** 2, k) / (m - correction),
                     name="var")
    out = nf.compute((n,), lambda i: nf.sqrt(var[i]), name="std") if std else var
    return [mu, out], [x]


def _layer_norm(d):
    n = nf.size("N")
    x = nf.placeholder((n, d), name="x")
    w = nf.placeholder((d,), name="w")
    k = nf.reduce_axis(d, "k")
    mu = nf.compute((n,), lambda i: nf.sum(x[i, k], k) / d, name="mean")
    var = nf.compute((n,), lambda i: nf.sum((x[i, k] - mu[i]) * (x[i, k] - mu[i]), k) / d,
                     name="var")
    y = nf.compute((n, d), lambda i, j: (x[i, j] - mu[i]) * nf.rsqrt(var[i] + 1e-5) * w[j],
                   name="y")
    return [y], [x, w]


def _data(rng, shape, offset):
    return (rng.standard_normal(shape) * 2.0 + offset).astype(np.float32)


def _tol(eager, want):
    """Four times eager float32's own error, plus a floor."""
    return 4 * float((eager - want).abs().max()) + 1e-6


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("shape", SHAPES)
def test_variance_far_from_zero(shape, offset, rng):
    x = torch.tensor(_data(rng, shape, offset))
    outs, ins = _stats(shape[1])
    mean, var = nf.compile(outs, inputs=ins)(x)
    xd = x.double()
    want_var, want_mean = xd.var(-1, correction=0), xd.mean(-1)
    assert (var.double() - want_var).abs().max() <= _tol(x.var(-1, correction=0), want_var)
    assert (mean.double() - want_mean).abs().max() <= _tol(x.mean(-1), want_mean)


@pytest.mark.parametrize("shape", SHAPES)
def test_std_with_a_correction_and_a_symbolic_extent(shape, rng):
    x = torch.tensor(_data(rng, shape, 1e5))
    outs, ins = _stats(None, correction=1, std=True)
    _, std = nf.compile(outs, inputs=ins)(x)
    want = x.double().std(-1)
    assert (std.double() - want).abs().max() <= _tol(x.std(-1), want)


@pytest.mark.parametrize("offset", (0.0, 1e5))
def test_layer_norm_far_from_zero(offset, rng):
    x = torch.tensor(_data(rng, (4, 300), offset))
    w = torch.tensor(rng.standard_normal(300).astype(np.float32))
    outs, ins = _layer_norm(300)
    [y] = nf.compile(outs, inputs=ins)(x, w)
    want = torch.nn.functional.layer_norm(x.double(), (300,), w.double(), eps=1e-5)
    eager = torch.nn.functional.layer_norm(x, (300,), w, eps=1e-5)
    assert (y.double() - want).abs().max() <= _tol(eager, want)


def test_the_plan_shows_the_pivot_and_keeps_the_names():
    p = plan(_stats(64)[0])
    text = str(p)
    assert "x[i, k] - where(abs(x[i, 0]) < inf, x[i, 0], 0.0)" in text, text
    [g] = p.groups
    assert [m.name for m in g.members] == ["mean_sum", "var_sum"]
    assert "output mean[i] = where(abs(x[i, 0]) < inf, x[i, 0], 0.0) + mean_sum / 64" \
        in text, text


def test_what_is_not_centred():
    # 16-bit data, cast to float32 or not (its x - K would round in its dtype, and it
    # cannot sit far enough from 0 to need it); a sum no reduction subtracts as a mean
    # (RMSNorm's mean of squares, a plain mean) keeps its form
    for dtype in ("float16", "bfloat16"):
        assert "x[i, 0]" not in str(plan(_stats(64, dtype)[0]))
    n = nf.size("N")
    x = nf.placeholder((n, 64), name="x")
    k = nf.reduce_axis(64, "k")
    ms = nf.compute((n,), lambda i: nf.sum(x[i, k] * x[i, k], k) / 64, name="ms")
    y = nf.compute((n, 64), lambda i, j: x[i, j] * nf.rsqrt(ms[i] + 1e-6), name="y")
    mean = nf.compute((n,), lambda i: nf.sum(x[i, k], k) / 64, name="mean")
    for outs in ([y], [mean]):
        assert "x[i, 0]" not in str(plan(outs))
    # a bfloat16 body (no cast): the sum is bfloat16
    xb = nf.placeholder((n, 64), "bfloat16", name="xb")
    mb = nf.compute((n,), lambda i: nf.sum(xb[i, k], k) / 64, name="mb")
    vb = nf.compute((n,), lambda i: nf.sum((xb[i, k] - mb[i]) ** 2, k) / 64, name="vb")
    bodies = plan([vb]).bodies
    assert centre(list(bodies))[1] == {}


@pytest.mark.parametrize("where", [0, 7])
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_values_as_written(where, bad, rng):
    """An infinity or NaN at the pivot or elsewhere: the pivot reads as 0 where it is not
    finite, so the row gives what the uncentred program gives (the reference's)."""
    x = _data(rng, (3, 45), 1e5)
    x[1, where] = bad
    outs, ins = _stats(45)
    got = nf.compile(outs, inputs=ins)(torch.tensor(x))
    want = nf.evaluate(outs, {"x": x.astype(np.float64)})
    for g, w in zip(got, want):
        g, w = g.double().numpy(), np.asarray(w)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_array_equal(np.isinf(g), np.isinf(w))
        ok = np.isfinite(w)
        np.testing.assert_allclose(g[ok], w[ok], rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("mode", ["rolling", "split"])
def test_an_empty_row_reads_nothing(mode):
    """M = 0: the pivot's read is masked (the kernel) and reads NaN (the fused reference),
    never out of bounds; mean and variance are 0/0 = NaN as written."""
    outs, ins = _stats(None)
    x = np.zeros((3, 0), np.float32)
    for got in (nf.compile(outs, inputs=ins)(torch.tensor(x)),
                nf.evaluate(outs, {"x": x}, mode=mode)):
        for g in got:
            assert np.isnan(np.asarray(g)).all()


@pytest.mark.parametrize("fn", [
    lambda x: x.var(-1),
    lambda x: torch.var_mean(x, -1, correction=0),
    lambda x: torch.nn.functional.layer_norm(x, (x.shape[-1],)),
], ids=["var", "var_mean", "layer_norm"])
def test_through_the_backend(fn):
    x = torch.randn(6, 300, generator=torch.Generator().manual_seed(3)) * 2.0 + 1e5
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(fn, backend=Backend(rest="eager"))(x)
    want, eager = fn(x.double()), fn(x)
    for g, w, e in zip(*(t if isinstance(t, tuple) else (t,) for t in (got, want, eager))):
        assert (g.double() - w).abs().max() <= _tol(e, w)


def test_split_k_reads_the_pivot_in_its_combine(rng):
    """A centred mean is ``K + S' / n``: an output reading ``x[i, 0]`` once per row, which
    split-k's combine reads itself (it refused outputs that read an input without a
    column written in chunks)."""
    from neptune_fusion.schedule.schedule import Schedule
    outs, ins = _stats(700)
    x = torch.tensor(_data(rng, (5, 700), 1e5))
    split = Schedule(strategy="split", splits=3, block_m=8, block_n=128)
    mean, var = nf.compile(outs, inputs=ins, schedule=split)(x)
    xd = x.double()
    want_var, want_mean = xd.var(-1, correction=0), xd.mean(-1)
    assert (var.double() - want_var).abs().max() <= _tol(x.var(-1, correction=0), want_var)
    assert (mean.double() - want_mean).abs().max() <= _tol(x.mean(-1), want_mean)
