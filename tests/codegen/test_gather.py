"""Gathered loads: an index read from another tensor (``x[idx[i], j]``, the paged KV
cache's ``k[table[b, j // 16], ...]``) is lowered per element, clamped into its dimension."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.errors import CodegenError, FeedError
from neptune_fusion.runtime.pipeline import compile as nf_compile


def _rows():
    N, M, V = nf.sizes("N M V")
    x = nf.placeholder((V, M), name="x")
    idx = nf.placeholder((N,), "int32", name="idx")
    j = nf.reduce_axis(M, "j")
    return nf.compute((N,), lambda i: nf.max(x[idx[i], j], j), name="rowmax"), [x, idx]


def test_a_row_gathered_by_an_index_tensor(rng):
    out, ins = _rows()
    kernel = nf_compile(out, ins, block_m=4, block_n=16)
    xs = torch.tensor(rng.standard_normal((7, 37)), dtype=torch.float32)
    ids = torch.tensor(rng.integers(0, 7, 11), dtype=torch.int32)
    want = nf.evaluate(out, {"x": xs, "idx": ids})
    np.testing.assert_allclose(kernel(xs, ids).double().numpy(), want, rtol=1e-6)
    # the gathered row index is clamped into the dimension: 0 <= idx <= V - 1, in
    # 32 bits (the id's type), then widened for the address
    assert re.search(r"tl\.minimum\(tl\.maximum\(idx, 0\), .*tl\.minimum\(V - 1, "
                     r"2147483647\)\)\.to\(tl\.int64\)", kernel.source), kernel.source
    assert "idx >= 0" not in kernel.source     # no mask: the load is not predicated


def test_an_id_outside_the_tensor_reads_inside_it_not_past_it():
    """The reference reads NaN out of range (a contract violation, undefined); the
    kernel clamps the id into the dimension, so it reads an element of the tensor
    (the first or last row) and never memory past it."""
    out, ins = _rows()
    kernel = nf_compile(out, ins, block_m=4, block_n=16)
    xs = torch.rand(3, 20) + 1.0
    got = kernel(xs, torch.tensor([1, 3, -1, 1000], dtype=torch.int32))
    assert got.tolist() == [xs[1].max(), xs[2].max(), xs[0].max(), xs[2].max()]


def test_an_empty_dimension_read_through_ids_is_refused():
    """Every read of ``x[idx[i], j]`` with no row in ``x`` falls outside it, where the clamp
    has no element to land on (the interpreter crashed on it): a FeedError naming ``x``
    and the dimension, before anything runs (also with no ids: the check reads shapes
    alone). An empty id tensor over a full ``x`` gives no rows."""
    out, ins = _rows()
    kernel = nf_compile(out, ins, block_m=4, block_n=16)
    with pytest.raises(FeedError, match=r"argument 0 \('x'\) has no elements along "
                                        r"dimension 0, which the kernel indexes by values"):
        kernel(torch.zeros(0, 20), torch.tensor([1, 0], dtype=torch.int32))
    assert kernel(torch.rand(3, 20), torch.zeros(0, dtype=torch.int32)).shape == (0,)


def test_a_shifted_tile_index_is_still_refused():
    N, M = nf.sizes("N M")
    x = nf.placeholder((N, M), name="x")
    j = nf.reduce_axis(M, "j")
    out = nf.compute((N,), lambda i: nf.max(x[2 * i, j], j), name="o")
    with pytest.raises(CodegenError, match=r"mixes tile axes .* \(or gather"):
        nf_compile(out, block_m=4, block_n=16)(torch.zeros(8, 16))


def test_an_index_chosen_per_row_is_gathered(rng):
    """``x[i, where(t[i] != -100, t[i], 0)]``: a cross-entropy's target logit with
    ignored rows reading class 0 -- a choice between gathered indices is gathered too."""
    N, V = nf.sizes("N V")
    x = nf.placeholder((N, V), name="x")
    t = nf.placeholder((N,), "int64", name="t")
    j = nf.reduce_axis(V, "j")
    out = nf.compute((N,), lambda i: nf.max(x[i, j], j)
                     - x[i, nf.where(t[i] != -100, t[i], 0)], name="gap")
    kernel = nf_compile(out, [x, t], block_m=4, block_n=16)
    xs = torch.tensor(rng.standard_normal((9, 37)), dtype=torch.float32)
    ts = torch.tensor(rng.integers(0, 37, 9))
    ts[2] = -100
    want = xs.double().amax(1) - xs.double()[torch.arange(9), ts.clamp(min=0)]
    np.testing.assert_allclose(kernel(xs, ts).double().numpy(), want.numpy(), rtol=1e-6)
