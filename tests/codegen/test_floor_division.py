"""``//`` and ``%`` round toward minus infinity in the kernels, as in Python, the IR and
the reference evaluator: Triton's truncate toward zero, so a mask such as
``(j - i) // 4 == -1`` kept the wrong keys (a fuzzing find, 2026-12-04). Index
arithmetic of nonnegative values by a positive constant (``h // group``) keeps the
plain operators (truncation is the floor there). Checked against float64 on fresh
random data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf

MASKS = {
    "floordiv": (lambda b, h, i, j: (j - i) // 4 == -1,
                 lambda i, j: torch.div(j - i, 4, rounding_mode="floor") == -1),
    "mod": (lambda b, h, i, j: (j - i) % 3 == 1,
            lambda i, j: torch.remainder(j - i, 3) == 1),
    "negative divisor": (lambda b, h, i, j: (i + 1) // (2 * j - 9) == -1,
                         lambda i, j: torch.div(i + 1, 2 * j - 9, rounding_mode="floor") == -1),
    "remainder by a negative divisor": (
        lambda b, h, i, j: (i + 2) % (5 - 2 * j) == -1,
        lambda i, j: torch.remainder(i + 2, 5 - 2 * j) == -1),
}


@pytest.mark.parametrize("name", list(MASKS))
@pytest.mark.parametrize("tiled", [False, True])
def test_masks_with_floor_division_match_float64(name, tiled):
    mod, want_mask = MASKS[name]
    n = 40
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g) for _ in range(3))
    kw = {"schedule": nf.Schedule(block_m=16, block_n=16, num_warps=4)} if tiled else {}
    got = nf.attention(q, k, v, mask_mod=mod, **kw)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None]
    keep = want_mask(i, j)
    s = (q.double() @ k.double().transpose(-1, -2)) / 4.0
    p = torch.softmax(s.masked_fill(~keep, -np.inf), -1).nan_to_num(0.0)   # empty rows: 0
    torch.testing.assert_close(got.double(), p @ v.double(), rtol=1e-5, atol=1e-5)


def test_an_elementwise_chain_takes_the_floored_remainder():
    N, E = nf.sizes("N E")
    x = nf.placeholder((N, E), name="x")
    y = nf.compute((N, E), lambda i, e: x[i, e] + nf.cast((e - 5) % 4, "float32")
                   + nf.cast((e - 5) // 4, "float32"), name="y")
    data = np.random.default_rng(3).standard_normal((3, 12)).astype(np.float32)
    want = nf.evaluate(y, {"x": data})
    e = np.arange(12)
    np.testing.assert_allclose(want - data, np.broadcast_to((e - 5) % 4 + (e - 5) // 4,
                                                            data.shape), atol=1e-6)
    got = nf.compile(y, cache=False)(torch.from_numpy(data))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)


def test_nonnegative_index_arithmetic_keeps_the_plain_operators():
    """A grouped-query head index: no correction emitted."""
    B, H, N, D = nf.sizes("B H N D")
    q, k = nf.placeholder((B, H, N, D), name="q"), nf.placeholder((B, 2, N, D), name="k")
    y = nf.compute((B, H, N, D), lambda b, h, n, d: q[b, h, n, d] * k[b, h // 4, n, d],
                   name="y")
    src = nf.compile(y, schedule=nf.Schedule(block_m=16, block_n=16), cache=False).source
    assert "// 4" in src and "rem" not in src, src
