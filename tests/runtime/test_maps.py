"""Programs without a reduction (maps) compile: each output becomes a sum over a unit
axis (fusion/maps.py), checked against float64 on fresh random data."""

from __future__ import annotations

import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.errors import CodegenError


@pytest.mark.parametrize("rows", [1, 29, 33])
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 1.6e-2)])
def test_row_scaled_map(rows, dtype, tol):
    """y[r, d] = x[r, d] * exp(s[r]) + 1, in the inputs' dtype; symbolic sizes."""
    R, D = nf.sizes("R D")
    x = nf.placeholder((R, D), name="x", dtype=dtype)
    s = nf.placeholder((R,), name="s")
    y = nf.compute((R, D), lambda r, d: nf.cast(x[r, d] * nf.exp(s[r]) + 1.0, dtype),
                   name="y")
    g = torch.Generator().manual_seed(rows)
    X = torch.randn((rows, 19), generator=g).to(getattr(torch, dtype))
    S = torch.randn((rows,), generator=g)
    got = nf.compile(y, cache=False)(X, S)
    want = X.double() * S.double().exp()[:, None] + 1.0
    assert got.dtype == X.dtype and got.shape == want.shape
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


def test_flattened_rows_and_two_outputs_static():
    """Two outputs of one shape; a per-row factor read through ``q // 16``; int sizes."""
    x = nf.placeholder((40 * 16,), name="x")
    w = nf.placeholder((40,), name="w")
    a = nf.compute((40 * 16,), lambda q: x[q] * w[q // 16], name="a")
    b = nf.compute((40 * 16,), lambda q: nf.tanh(x[q]) - w[q // 16], name="b")
    g = torch.Generator().manual_seed(7)
    X, W = torch.randn(640, generator=g), torch.randn(40, generator=g)
    got_a, got_b = nf.compile([a, b], cache=False)(X, W)
    torch.testing.assert_close(got_a.double(), X.double() * W.double().repeat_interleave(16),
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_b.double(),
                               X.double().tanh() - W.double().repeat_interleave(16),
                               rtol=1e-5, atol=1e-6)


def test_boolean_map_is_refused_by_name():
    N = nf.size("N")
    x = nf.placeholder((N,), name="x")
    b = nf.compute((N,), lambda i: x[i] > 0, name="positive")
    with pytest.raises(CodegenError, match="positive .*cast"):
        nf.compile(b, cache=False)


def test_map_broadcasting_a_row_value():
    """y[r, d] = exp(s[r]) reads no column: the kernel still blocks over rows."""
    R = nf.size("R")
    s = nf.placeholder((R,), name="s")
    y = nf.compute((R, 5), lambda r, d: nf.exp(s[r]), name="y")
    S = torch.randn(11, generator=torch.Generator().manual_seed(3))
    got = nf.compile(y, cache=False)(S)
    torch.testing.assert_close(got.double(), S.double().exp()[:, None].expand(11, 5),
                               rtol=1e-5, atol=1e-6)
