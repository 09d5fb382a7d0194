"""SDPA in a training graph keeps its own kernel and backward.

Until 2026-12-04 (late) the backend opened every ``scaled_dot_product_attention`` into
its math before AOTAutograd, training graphs too. There the region has no chain left to
fuse once the backward's saved values are outputs (softmax's probabilities among them),
so it went to the rest as unfused math: a ``(B, H, L, S)`` probability tensor written
and saved per call where Inductor alone runs the flash or cuDNN kernel and its
backward. A training graph now keeps SDPA as it is; the report says so. An inference
graph still opens and fuses it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neptune_fusion.dynamo import Backend


def _attend(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)


def _inputs(gen, masked: bool):
    q, k, v = (torch.randn(2, 3, 40, 16, generator=gen, dtype=torch.float32)
               for _ in range(3))
    mask = torch.rand(40, 40, generator=gen) > 0.3 if masked else None
    if mask is not None:
        mask[:, 0] = True   # no row masked everywhere
    return q, k, v, mask


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "mask"])
@pytest.mark.parametrize("rest", ["eager", "inductor"])
def test_a_training_graph_keeps_sdpa_and_its_gradients_match_float64(masked, rest):
    gen = torch.Generator().manual_seed(11)
    q, k, v, mask = _inputs(gen, masked)
    cot = torch.randn(2, 3, 40, 16, generator=gen)
    torch._dynamo.reset()
    backend = Backend(rest=rest)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = torch.compile(_attend, backend=backend)(*leaves, mask)
    (out * cot).sum().backward()
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    want = _attend(*ref, mask)
    (want * cot.double()).sum().backward()
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-5)
    for got, r in zip(leaves, ref):
        torch.testing.assert_close(got.grad.double(), r.grad, rtol=1e-4, atol=1e-5)
    (report,) = backend.reports
    assert not report.fused
    assert any("keeps SDPA's own kernel" in str(x) for x in report.left), str(report)


def test_an_inference_graph_still_fuses_sdpa():
    gen = torch.Generator().manual_seed(12)
    q, k, v, _ = _inputs(gen, False)
    torch._dynamo.reset()
    backend = Backend(rest="eager")
    with torch.no_grad():
        out = torch.compile(_attend, backend=backend)(q, k, v, None)
    want = _attend(q.double(), k.double(), v.double(), None)
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-5)
    (report,) = backend.reports
    assert len(report.fused) == 1 and not report.left, str(report)
