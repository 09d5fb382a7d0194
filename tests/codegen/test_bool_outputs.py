"""A kernel writes a boolean output (one byte an element, as torch stores ``bool``).

A training graph split by the min-cut partitioner saves masks: a hand-written softmax's
maximum has a derivative that reads ``x == max(x)``, which the forward writes beside the
probabilities (docs/jit.md, *Decisions*). Compared with the float64 reference on fresh
data under several tiles (a masked last one), one tile and split-k."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from codegen.test_shared_state import SCHEDULES  # tiles, one tile, split-k


def _softmax_and_mask(d):
    n = nf.size("N")
    x = nf.placeholder((n, d), name="x")
    k = nf.reduce_axis(d, "k")
    m = nf.compute((n,), lambda i: nf.max(x[i, k], k), name="m")
    l = nf.compute((n,), lambda i: nf.sum(nf.exp(x[i, k] - m[i]), k), name="l")  # noqa: E741
    y = nf.compute((n, d), lambda i, j: nf.exp(x[i, j] - m[i]) / l[i], name="y")
    at_max = nf.compute((n, d), lambda i, j: x[i, j] == m[i], name="at_max")
    return [y, at_max, m], [x]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_boolean_output_beside_the_softmax_matches_float64(schedule, rng):
    d = 37
    outs, ins = _softmax_and_mask(d)
    fn = nf.compile(outs, ins, schedule=SCHEDULES[schedule])
    x = torch.from_numpy(rng.standard_normal((5, d)).astype(np.float32))
    x[1, 3] = x[1].max() + 1.0   # a row's maximum in the first tile, one in the last
    x[2, -1] = x[2].max() + 1.0
    y, at_max, m = fn(x)
    want = nf.evaluate(outs, {"x": x.double().numpy()})
    assert at_max.dtype == torch.bool
    np.testing.assert_array_equal(at_max.numpy(), want[1].astype(bool))
    assert int(at_max.sum()) == x.shape[0]     # one maximum a row: the mask is not all-0
    np.testing.assert_allclose(y.double().numpy(), want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.double().numpy(), want[2], rtol=0, atol=0)
