"""``baddbmm`` inside a chain through the backend (Bloom's attention scores with their
ALiBi bias); outputs against float64."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from neptune_fusion.dynamo import Backend


@pytest.mark.parametrize("beta", [1.0, 0.0])
def test_bloom_style_attention_through_baddbmm(beta):
    """Bloom adds its ALiBi bias to the scores with ``baddbmm`` (no rule before: the
    scores were Inductor's, written whole); with ``beta=0`` (as models that pass
    ``torch.empty`` do) the input is ignored, NaN included, as torch ignores it."""
    L, D = 9, 16
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(4, L, D, generator=gen) for _ in range(3))
    bias = torch.randn(4, 1, L, generator=gen) if beta else torch.full((4, 1, L), float("nan"))

    def attn(q, k, v, bias):
        s = torch.baddbmm(bias, q, k.transpose(1, 2), beta=beta, alpha=1 / math.sqrt(D))
        s = s.masked_fill(torch.triu(torch.ones(L, L, dtype=torch.bool), 1),
                          torch.finfo(s.dtype).min)
        return torch.bmm(F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype), v)
    torch._dynamo.reset()
    backend = Backend()
    fn = torch.compile(attn, backend=backend)
    got = fn(q, k, v, bias)
    want = attn(q.double(), k.double(), v.double(), bias.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    [report] = backend.reports
    assert len(report.fused) == 1 and not report.left, report
    assert "baddbmm" in report.fused[0].ops, report
