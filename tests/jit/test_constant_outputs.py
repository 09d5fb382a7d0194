"""A region's output that is a constant in the shape of a value inside it
(``zeros_like(y)``, ``zeros_like(y) + 1``: a hinge loss's decomposition makes one). Such
an output had made the kernel write a constant, which the reference evaluator refused
(an opaque ``AttributeError``), and the whole chain went to the rest. Now it stays in the
graph as a mask from positions does (partition._cheap), and the chain fuses."""

from __future__ import annotations

import pytest
import torch

from neptune_fusion.dynamo import Backend


def _zeros(x):
    y = x - torch.logsumexp(x, -1, keepdim=True)
    return y, torch.zeros_like(y)


def _ones(x):
    y = x - torch.logsumexp(x, -1, keepdim=True)
    return y * 2.0, torch.zeros_like(y) + 1.0, torch.full_like(y, 3.0) * y


@pytest.mark.parametrize("fn", [_zeros, _ones])
def test_a_constant_output_beside_a_chain(fn):
    x = torch.randn(4, 24, generator=torch.Generator().manual_seed(3)) * 3.0
    torch._dynamo.reset()
    backend = Backend(rest="eager")
    with torch.no_grad():
        got = torch.compile(fn, backend=backend)(x)
    for g, w in zip(got, fn(x.double()), strict=True):
        assert g.shape == w.shape and g.dtype == torch.float32
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-6)
    [report] = backend.reports
    assert len(report.fused) == 1 and not report.left, report
