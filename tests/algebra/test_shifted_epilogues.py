"""A constant shift moved out of a maximum (``max(x + c) = max(x) + c``, normalisation)
left ``(x + c) - (max(x) + c)`` in a log-softmax's epilogue, outside the exponential whose
shift the exp2 rule cancels: float32 rounded ``x + 1e6`` there and not inside, an output
off by 0.05 at ``1e6`` and by several units at ``1e12`` -- neither float64's answer nor
eager float32's (a fuzzing find, 2026-12-04, ``torch.log_softmax(x + c)`` through the
backend). Normalisation now cancels the equal shifts (analysis/normalize._shifts_cancel),
so the output is shift-invariant like the sum beside it: against float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.analysis.normalize import normalize
from neptune_fusion.dynamo import Backend
from neptune_fusion.ir.nodes import Binary, Const
from neptune_fusion.ir.traverse import walk

SHIFTS = (1e3, 1e6, 1e12, -1e12, -7.5)


def _log_softmax(shift: float, n: int = 4, d: int = 16):
    x = nf.placeholder((n, d), name="x")
    k = nf.reduce_axis(d, "k")
    s = nf.compute((n, d), lambda i, j: x[i, j] + shift, name="s")
    m = nf.compute((n,), lambda i: nf.max(s[i, k], k), name="m")
    l = nf.compute((n,), lambda i: nf.sum(nf.exp(s[i, k] - m[i]), k), name="l")  # noqa: E741
    return nf.compute((n, d), lambda i, j: s[i, j] - m[i] - nf.log(l[i]), name="y")


@pytest.mark.parametrize("shift", SHIFTS)
def test_a_shifted_log_softmax_is_shift_invariant(shift, rng):
    x = rng.standard_normal((4, 16)) * 2.0
    got = nf.compile(_log_softmax(shift))(torch.tensor(x, dtype=torch.float32))
    want = torch.log_softmax(torch.tensor(x), -1).numpy()
    np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=2e-6)


@pytest.mark.parametrize("shift", SHIFTS)
def test_through_the_backend(shift):
    x = torch.randn(6, 37, generator=torch.Generator().manual_seed(3)) * 2.0
    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.log_softmax(x + shift, -1), backend=Backend(rest="eager"))
    with torch.no_grad():
        got = fn(x)
    torch.testing.assert_close(got.double(), torch.log_softmax(x.double(), -1), rtol=0,
                               atol=2e-6)


def _shifts(e) -> list:
    return [n for n in walk(e) if isinstance(n, Binary) and isinstance(n.b, Const)
            and n.op in ("add", "sub")]


def test_equal_finite_shifts_cancel_and_others_stay():
    x = nf.placeholder((4, 16), name="x")
    k = nf.reduce_axis(16, "k")
    for c, cancels in ((1e6, True), (-3.0, True), (float("inf"), False),
                       (float("nan"), False)):
        e = (x[0, 1] + c) - nf.max(x[0, k] + c, k)
        assert bool(_shifts(normalize(e))) != cancels, (c, normalize(e))
    # different constants, or a shift on one side only: kept
    assert _shifts(normalize((x[0, 1] + 2e6) - nf.max(x[0, k] + 1e6, k)))
    assert _shifts(normalize((x[0, 1] - 1e6) - nf.max(x[0, k] + 1e6, k)))
