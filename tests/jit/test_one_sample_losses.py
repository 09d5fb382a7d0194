"""``F.cross_entropy`` and ``F.nll_loss`` of one sample (a 1-d input, a 0-d target)
through the backend: with Inductor as the rest they raised (``nll_loss_forward`` left in
the graph, which Inductor decomposes and does not lower; a fuzzing find of 2026-12-04).
One sample is a batch of one (decomp._nll_loss_forward), fused with the log-softmax;
an op our table declines goes to Inductor's decomposition (decomp.over). Values and
gradients against float64 eager PyTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neptune_fusion.dynamo import Backend
from neptune_fusion.dynamo.decomp import over

WEIGHT = torch.rand(24, generator=torch.Generator().manual_seed(9)) + 0.5
CASES = {"mean": {}, "none": {"reduction": "none"}, "sum": {"reduction": "sum"},
         "weights": {"weight": WEIGHT}, "weights-none": {"weight": WEIGHT,
                                                        "reduction": "none"},
         "ignored": {"ignore_index": 5}, "ignored-sum": {"ignore_index": 5,
                                                        "reduction": "sum"}}


def _loss(kind, kw):
    def fn(z, t):
        if kind == "nll_loss":
            z = torch.log_softmax(z, -1)
        w = kw.get("weight")
        return getattr(F, kind)(z, t, **{**kw, "weight": None if w is None else
                                         w.to(z.dtype)})
    return fn


@pytest.mark.parametrize("rest", ["inductor", "eager"])
@pytest.mark.parametrize("kind", ["cross_entropy", "nll_loss"])
@pytest.mark.parametrize("case", list(CASES))
def test_one_sample_losses_match_float64(rest, kind, case):
    gen = torch.Generator().manual_seed(len(case))
    logits, target = torch.randn(24, generator=gen), torch.tensor(5)
    fn = _loss(kind, CASES[case])
    torch._dynamo.reset()
    backend = Backend(rest=rest)
    x = logits.clone().requires_grad_()
    got = torch.compile(fn, backend=backend)(x, target)
    got.backward()
    x64 = logits.double().requires_grad_()
    want = fn(x64, target)
    want.backward()
    assert got.shape == want.shape == () and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want.detach(), rtol=1e-5, atol=1e-6,
                               equal_nan=True)
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-6,
                               equal_nan=True)
    [report] = backend.reports
    assert report.fused and "gather" in report.fused[0].ops, report


def test_an_op_our_table_declines_takes_inductors_decomposition():
    op = torch.ops.aten.nll_loss_forward.default
    table = over({op: lambda *a: NotImplemented, "ours": lambda: 1},
                 {op: lambda *a: ("theirs", a), "other": lambda: 2})
    assert table[op](1, 2) == ("theirs", (1, 2))
    assert table["ours"]() == 1 and table["other"]() == 2
