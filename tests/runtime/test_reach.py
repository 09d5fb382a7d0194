"""A tensor indexed bare by an axis that ranges past it is refused at the call, by name,
where the sizes are known only then (a buffer of 4 read as ``w[j]`` over 12 keys: the
kernels read past it, silently, before; a fuzzing find of 2026-12-04). A later good
call is right (nothing cached from the refused one), and a read under its own guard
(``where(j < 4, w[j], 0)``) stays allowed. Results against float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.analysis.reach import reaches


def _qkv(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, n, 16, generator=g) for _ in range(3))


MODS = {
    "score over keys": dict(score_mod=lambda s, b, h, i, j, w: s + w[j]),
    "score over queries": dict(score_mod=lambda s, b, h, i, j, w: s + w[i]),
    "mask over keys": dict(mask_mod=lambda b, h, i, j, w: w[j] < 1.0),
}


@pytest.mark.parametrize("name", list(MODS))
def test_a_short_buffer_is_refused_then_a_full_one_is_right(name):
    q, k, v = _qkv()
    w = torch.randn(12, generator=torch.Generator().manual_seed(1)).abs() * 0.5
    with pytest.raises(nf.FeedError, match=r"tensor 'w' has 4 entries along dimension 0.*"
                                           r"over [MN] = 12 values.*at least 12"):
        nf.attention(q, k, v, buffers={"w": w[:4]}, **MODS[name])
    got = nf.attention(q, k, v, buffers={"w": w}, **MODS[name])
    s = q.double() @ k.double().transpose(-1, -2) / 4.0
    if name == "score over keys":
        s = s + w.double()
    elif name == "score over queries":
        s = s + w.double()[:, None]
    else:
        s = s.masked_fill(~(w < 1.0), -np.inf)
    want = torch.softmax(s, -1) @ v.double()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def _weighted():
    N, D = nf.sizes("N D")
    x, w = nf.placeholder((N, D), name="x"), nf.placeholder((4,), name="w")
    j = nf.reduce_axis(D, "j")
    return nf.compute((N,), lambda i: nf.sum(x[i, j] * w[j], j), name="y")


def test_a_compiled_operator_refuses_a_short_input():
    kern = nf.compile(_weighted(), cache=False)
    x = torch.randn(3, 16)
    with pytest.raises(nf.FeedError, match=r"kernel nf_y: tensor 'w' has 4 entries.*"
                                           r"axis 'j' reads it over D = 16"):
        kern(x, torch.randn(4))
    x4, w4 = torch.randn(3, 4), torch.randn(4)
    torch.testing.assert_close(kern(x4, w4).double(), x4.double() @ w4.double(),
                               rtol=1e-5, atol=1e-5)


def test_a_guarded_read_is_allowed():
    N, D = nf.sizes("N D")
    x, w = nf.placeholder((N, D), name="x"), nf.placeholder((4,), name="w")
    j = nf.reduce_axis(D, "j")
    y = nf.compute((N,), lambda i: nf.sum(x[i, j] * nf.where(j < 4, w[j], 0.0), j), name="y")
    assert reaches([y]) == ()
    assert [r.tensor for r in reaches([_weighted()])] == ["w"]
    x16, w4 = torch.randn(3, 16), torch.randn(4)
    got = nf.compile(y, cache=False)(x16, w4)
    torch.testing.assert_close(got.double(), x16[:, :4].double() @ w4.double(),
                               rtol=1e-5, atol=1e-5)
