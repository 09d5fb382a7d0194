"""One tile, two names: ``w[j, c]`` (a dot over ``c``) and ``w[j, e]`` (a dot into column
``e``) over axes of one extent are loaded once per loop tile, the second use ``tl.trans``
of the first (``TileOps.twin``, docs/codegen.md); over axes of different extents they
are two loads. Results against the float64 reference on random data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.runtime.pipeline import compile


def _program(d: int, cols: int):
    """``y[i, e] = sum_j tanh(sum_c x[i, c] w[j, c]) * w[j, e]``, ``e < cols``."""
    n, m = nf.sizes("N M")
    x = nf.placeholder((n, d), name="x")
    w = nf.placeholder((m, d), name="w")
    c = nf.reduce_axis(d, "c")
    s = nf.compute((n, m), lambda i, j: nf.sum(x[i, c] * w[j, c], c), name="s")
    j = nf.reduce_axis(m, "j")
    y = nf.compute((n, cols), lambda i, e: nf.sum(nf.tanh(s[i, j]) * w[j, e], j),
                   name="y")
    return y, [x, w]


def _loop_loads(src: str) -> list[int]:
    """Per ``for`` loop of the source: how many times it loads ``w``."""
    counts = []
    for line in src.splitlines():
        if line.startswith("    for "):
            counts.append(0)
        elif counts and line.startswith("        ") and "tl.load(w_ptr " in line:
            counts[-1] += 1
    return counts


@pytest.mark.parametrize("d,cols,loads", [(16, 16, 1), (12, 12, 1), (16, 8, 2)])
def test_a_tile_named_twice_is_loaded_once(d, cols, loads):
    y, ins = _program(d, cols)
    k = compile(y, ins, block_m=16, block_n=16)
    counts = _loop_loads(k.source)
    assert counts and all(n == loads for n in counts), k.source
    assert ("= tl.trans(wT" in k.source) == (loads == 1)
    gen = torch.Generator().manual_seed(4)
    xs, ws = torch.randn(40, d, generator=gen), torch.randn(50, d, generator=gen)
    ref = nf.evaluate(y, {"x": xs.double().numpy(), "w": ws.double().numpy()})
    np.testing.assert_allclose(k(xs, ws).double().numpy(), ref, rtol=1e-4, atol=1e-4)
