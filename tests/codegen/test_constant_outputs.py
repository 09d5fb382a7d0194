"""A kernel output that is a constant (``nf.const`` in the output's shape), beside a
chain: the store had applied ``.to`` to a Python number, an opaque ``AttributeError``
from the interpreter (the backend met one in a hinge loss's decomposition). The store
now casts it and broadcasts it over the tile. Float and boolean constants, under
several tiles (a masked last one), one tile and split-k, against float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from codegen.test_shared_state import SCHEDULES  # tiles, one tile, split-k


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_constant_outputs_beside_a_chain_match_float64(schedule, rng):
    n, d = nf.size("N"), 37
    x = nf.placeholder((n, d), name="x")
    k = nf.reduce_axis(d, "k")
    m = nf.compute((n,), lambda i: nf.max(x[i, k], k), name="m")
    l = nf.compute((n,), lambda i: nf.sum(nf.exp(x[i, k] - m[i]), k), name="l")  # noqa: E741
    two = nf.compute((n, d), lambda i, j: nf.const(2.5), name="two")
    yes = nf.compute((n, d), lambda i, j: nf.const(True), name="yes")
    per_row = nf.compute((n,), lambda i: nf.const(-1.0), name="per_row")
    outs = [l, two, yes, per_row]
    fn = nf.compile(outs, [x], schedule=SCHEDULES[schedule])
    xs = torch.from_numpy(rng.standard_normal((5, d)).astype(np.float32))
    got = fn(xs)
    want = nf.evaluate(outs, {"x": xs.double().numpy()})
    np.testing.assert_allclose(got[0].double().numpy(), want[0], rtol=1e-5)
    for g, w in zip(got[1:], want[1:], strict=True):
        assert tuple(g.shape) == w.shape
        np.testing.assert_array_equal(g.numpy(), w.astype(g.numpy().dtype))
    assert got[2].dtype == torch.bool
