"""``any`` and ``all`` over one dimension inside a chain.

``_safe_softmax`` (torch's softmax that gives 0 on a row masked everywhere) written by
hand reads ``all(x == -inf)`` beside the softmax; ``any``/``all`` had no rule, so the
reduction cut the chain (two kernels, explain: "any has no translation rule"). They are
now a max/min of the elements read as 1.0/0.0 (``rules._reduction(logical=True)``), in
the softmax's loop. Against float64 and eager."""

from __future__ import annotations

import pytest
import torch

from neptune_fusion.dynamo import Backend

NINF = float("-inf")


def _safe_by_hand(x):
    rows = (x == NINF).all(-1, keepdim=True)
    return torch.where(rows, 0.0, torch.softmax(x, -1))


CASES = {
    "safe softmax by hand": _safe_by_hand,
    "aten._safe_softmax": lambda x: torch.ops.aten._safe_softmax(x, -1),
    "any positive, then a softmax": lambda x: torch.softmax(x, -1)
    * (x > 1.5).any(-1, keepdim=True),
    "all of a float row (nonzero)": lambda x: torch.softmax(x, -1)
    * torch.all(x.clamp(min=-1.0) + 1.0, -1, keepdim=True),
    "any over dim 0": lambda x: torch.softmax(x, 0) * (x > 2.0).any(0, keepdim=True),
}


def _data():
    x = torch.randn(6, 37, generator=torch.Generator().manual_seed(21)) * 2
    x[1] = NINF               # a row masked everywhere
    x[3, :20] = NINF          # partly masked
    x[4, 5] = -1.0            # all(...) false on this row
    return x


@pytest.mark.parametrize("name", sorted(CASES))
def test_logical_reductions_join_the_chain(name):
    fn, x = CASES[name], _data()
    torch._dynamo.reset()
    backend = Backend(rest="eager")
    with torch.no_grad():
        got = torch.compile(fn, backend=backend)(x)
    want = fn(x.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert got.dtype == fn(x).dtype
    (report,) = backend.reports
    assert len(report.fused) == 1 and not report.left, str(report)
    assert {"any", "all"} & set(report.fused[0].ops), str(report)


def test_arithmetic_with_a_boolean_tensor_is_promoted():
    """``x * mask`` with a boolean ``mask`` (torch promotes it to 1.0 / 0.0) inside a
    chain: the rule table refused ``mul`` on a boolean (the same promotion the logical
    reductions' results need)."""
    gen = torch.Generator().manual_seed(22)
    x = torch.randn(5, 33, generator=gen)
    mask = torch.rand(5, 33, generator=gen) > 0.4

    def fn(x, mask):
        return torch.softmax(x * mask + (x > 0), -1) - torch.maximum(x, mask)
    torch._dynamo.reset()
    backend = Backend(rest="eager")
    with torch.no_grad():
        got = torch.compile(fn, backend=backend)(x, mask)
    torch.testing.assert_close(got.double(), fn(x.double(), mask), rtol=1e-5, atol=1e-6)
    (report,) = backend.reports
    assert len(report.fused) == 1 and not report.left, str(report)
