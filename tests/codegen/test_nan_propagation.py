"""NaN through max and min, as the reference and PyTorch give it (codegen/triton_ops.py,
NAN_HELPERS): a float ``maximum``/``minimum`` and a ``max``/``min`` reduction give NaN
where an operand is NaN (``relu(nan)``, ``amax`` and ``clamp`` of a row holding a NaN),
in every schedule.

Until 2026-12-04 the kernels used Triton's ``tl.maximum``/``tl.max``, which drop NaN: a
relu before a softmax made a NaN row finite, an ``amax`` skipped the NaN. Each kernel is
compared with the float64 reference (``nf.evaluate``), NaN positions exactly, and with
eager torch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.frontend.attention import AttentionSpec, attention_definition
from neptune_fusion.ir.graph import placeholders
from neptune_fusion.schedule.schedule import Schedule

D = 40
NAN = float("nan")
# one tile holds the row (one_tile), or the loop walks it in five tiles, a masked one last
SCHEDULES = {"one_tile": Schedule(block_m=2, block_n=64, num_warps=1, num_stages=1),
             "looped": Schedule(block_m=2, block_n=8, num_warps=1, num_stages=1)}


def _x(seed: int = 3) -> torch.Tensor:
    """Rows of float32 noise: row 2 holds one NaN, row 4 is all NaN, the rest finite."""
    x = torch.randn(5, D, generator=torch.Generator().manual_seed(seed)) * 3
    x[2, 7] = NAN
    x[4, :] = NAN
    return x


def _chain(kind: str):
    N = nf.size("N")
    x = nf.placeholder((N, D), name="x")
    k = nf.reduce_axis(D, "k")
    if kind == "clamp":       # torch.clamp(x, 0, 1): relu's maximum, then a minimum
        return nf.compute(x.shape, lambda i, j: nf.minimum(nf.maximum(x[i, j], 0.0), 1.0),
                          name="y")
    if kind == "amax":
        return nf.compute((N,), lambda i: nf.max(x[i, k], k), name="y")
    if kind == "amin":
        return nf.compute((N,), lambda i: nf.min(x[i, k], k), name="y")
    # softmax(relu(x)): a row with a NaN gives NaN (relu(nan) = nan, its max nan)
    r = nf.compute(x.shape, lambda i, j: nf.maximum(x[i, j], 0.0), name="r")
    m = nf.compute((N,), lambda i: nf.max(r[i, k], k), name="m")
    s = nf.compute((N,), lambda i: nf.sum(nf.exp(r[i, k] - m[i]), k), name="s")
    return nf.compute(x.shape, lambda i, j: nf.exp(r[i, j] - m[i]) / s[i], name="y")


EAGER = {"clamp": lambda x: torch.clamp(x, 0, 1), "amax": lambda x: torch.amax(x, -1),
         "amin": lambda x: torch.amin(x, -1),
         "relu_softmax": lambda x: torch.softmax(torch.relu(x), -1)}


def _same(got: torch.Tensor, want, tol: float = 1e-6) -> None:
    """NaN exactly where ``want`` has NaN, the rest within ``tol``."""
    want = torch.as_tensor(np.asarray(want))
    assert torch.equal(got.isnan(), want.isnan()), (got, want)
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol,
                               equal_nan=True)


@pytest.mark.parametrize("sched", sorted(SCHEDULES))
@pytest.mark.parametrize("kind", sorted(EAGER))
def test_max_and_min_propagate_nan_as_the_reference_and_torch(kind, sched):
    out = _chain(kind)
    kern = nf.compile(out, placeholders([out]), schedule=SCHEDULES[sched], cache=False)
    x = _x()
    got = kern(x)
    _same(got, nf.evaluate(out, {"x": x.double().numpy()}))
    _same(got, EAGER[kind](x))
    assert got[2].isnan().any() and got[4].isnan().all() and not got[[0, 1, 3]].isnan().any()


def test_a_split_max_propagates_nan():
    """Split-k: the partial kernels' maxima and the combine's merge of them."""
    out = _chain("amax")
    kern = nf.compile(out, placeholders([out]), strategy="split", splits=3, block_m=16,
                      block_n=16, cache=False)
    x = _x()
    assert "_nf_maximum(" in kern.source
    _same(kern(x), torch.amax(x, -1))


def test_float_extremes_lower_to_the_nan_helpers_and_integers_stay():
    """The float maximum, the max reduction and its running update call the module's
    helpers (defined once each, only where called); integer bounds keep tl.maximum."""
    out = _chain("relu_softmax")
    src = nf.compile(out, placeholders([out]), schedule=SCHEDULES["looped"],
                     cache=False).source
    assert src.count("def _nf_maximum(") == 1 and src.count("def _nf_max(") == 1
    assert "propagate_nan=triton.language.PropagateNan.ALL" in src
    assert "_nf_minimum" not in src and "_nf_min(" not in src
    body = src.split("def nf_y(")[1]
    assert "tl.maximum(" not in body and "tl.max(" not in body
    assert "_nf_maximum(" in body and "_nf_max(" in body
    clamp = _chain("clamp")
    assert "def _nf_max(" not in nf.compile(clamp, placeholders([clamp]), cache=False,
                                           schedule=SCHEDULES["looped"]).source
    [o], ins = attention_definition(AttentionSpec("float32", 2, 2, 16, 16, 0.25,
                                                  mask_mod=lambda b, h, i, j: j <= i))
    src = nf.compile(o, ins, schedule=Schedule(block_m=16, block_n=16), cache=False).source
    assert "tl.minimum(M, i_last + 1)" in src        # an integer loop bound
