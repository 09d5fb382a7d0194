"""NaN through max and min, as the reference and PyTorch give it (codegen/triton_ops.py,
NAN_HELPERS): a float ``maximum``/``minimum`` and a ``max``/``min`` reduction give NaN
where an operand is NaN (``relu(nan)``, ``amax`` and ``clamp`` of a row holding a NaN),
in every schedule; attention gives a row with a NaN score NaN and a row with no key 0.

Until 2026-12-04 the kernels used Triton's ``tl.maximum``/``tl.max``, which drop NaN: a
relu before a softmax made a NaN row finite, an ``amax`` skipped the NaN, and attention's
output guard (``l > 0``) gave a row whose scores were all NaN 0. Each kernel is compared
with the float64 reference (``nf.evaluate``), NaN positions exactly, and with eager torch
(SDPA's math backend).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import neptune_fusion as nf
from neptune_fusion.frontend.attention import (
    AttentionCache,
    AttentionSpec,
    attention,
    attention_definition,
)
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


# ------------------------------------------------------------------------ attention


def _sdpa_math(q, k, v):
    """SDPA's definition in float64 (the math backend: torch's CPU flash kernel gives a
    query row of NaN 0, its running maximum drops NaN as tl.max did)."""
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q.double(), k.double(), v.double())


def _qkv(n: int = 9, m: int = 9, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 2, s, 16, generator=g) for s in (n, m, m))


SMALL = Schedule(block_m=16, block_n=16)
SPLIT = Schedule(block_m=16, block_n=16, strategy="split", splits=3)


@pytest.mark.parametrize("schedule", [SMALL, None], ids=["rolling", "auto"])
def test_attention_rows_with_a_nan_score_give_nan(schedule):
    """A NaN in key 3 of head 0 makes every score of that head NaN at key 3 (every row
    NaN); a NaN in query 4 of head 1 makes that row's scores all NaN (that row NaN,
    where the kernel's guard for a row with no key gave 0)."""
    q, k, v = _qkv()
    k[0, 0, 3, 5] = NAN
    q[0, 1, 4, 0] = NAN
    got = attention(q, k, v, cache=AttentionCache(store=False), schedule=schedule)
    want = _sdpa_math(q, k, v)
    assert got[0, 0].isnan().all() and got[0, 1, 4].isnan().all()
    _same(got, want, 1e-5)


def test_split_decode_with_a_nan_key_gives_nan():
    q, k, v = _qkv(1, 70)
    k[0, 1, 50, 2] = NAN
    got = attention(q, k, v, cache=AttentionCache(store=False), schedule=SPLIT)
    assert got[0, 1].isnan().all() and not got[0, 0].isnan().any()
    _same(got, _sdpa_math(q, k, v), 1e-5)


@pytest.mark.parametrize("schedule", [SMALL, None], ids=["rolling", "auto"])
def test_masked_rows_still_give_zero_beside_nan_rows(schedule):
    """Causal, rows 0-1 see no key: 0 (the guard kept); a NaN in key 3 reaches rows 3 and
    later only (the mask removes it from rows 2 and before, as in the reference, whose
    masked score is -inf whatever it was)."""
    mask = lambda b, h, i, j: (j <= i) & (i >= 2)  # noqa: E731
    q, k, v = _qkv()
    k[0, :, 3, 0] = NAN
    got = attention(q, k, v, mask_mod=mask, cache=AttentionCache(store=False),
                    schedule=schedule)
    [o], _ = attention_definition(AttentionSpec("float32", 2, 2, 16, 16, 0.25,
                                                mask_mod=mask))
    want = nf.evaluate(o, {"q": q.double().numpy(), "k": k.double().numpy(),
                           "v": v.double().numpy()})
    assert torch.equal(got[:, :, :2], torch.zeros_like(got[:, :, :2]))
    assert not got[:, :, 2].isnan().any() and got[:, :, 3:].isnan().all()
    _same(got, want, 1e-5)


def test_the_reference_gives_nan_rows_nan_and_empty_rows_zero():
    """The definition's guard: the maximum tells a row with no key (-inf: 0) from a row
    with a NaN score (NaN), where l is NaN for both in float64."""
    [o], _ = attention_definition(AttentionSpec(
        "float32", 1, 1, 4, 4, 0.5, mask_mod=lambda b, h, i, j: j < i))
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 1, 3, 4)) for _ in range(3))
    q[0, 0, 2, 1] = NAN
    out = nf.evaluate(o, {"q": q, "k": k, "v": v})
    assert np.array_equal(out[0, 0, 0], np.zeros(4))
    assert np.isfinite(out[0, 0, 1]).all() and np.isnan(out[0, 0, 2]).all()
