"""A refused region tried again as the parts only copies join (partition.pieces)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import neptune_fusion as nf


def _block(x, wo, g):
    """GPT-2's shape in small: positions added to the input, a causal mask from
    positions, attention, an output projection, the residual, a layer norm. The
    attention and the norm share only the positions (computed again by each part)."""
    s_len, d = x.shape[-2:]
    h = x + torch.arange(s_len, dtype=x.dtype)[:, None] * 0.01
    keep = torch.arange(s_len)[:, None] >= torch.arange(s_len)[None, :]
    s = (h @ h.transpose(-1, -2)) * d ** -0.5
    # a finite fill: the written form stays (it would become SDPA's call in training
    # with -inf, dynamo/written_attention.py)
    p = torch.where(keep, s, -1e4).softmax(-1)
    return F.layer_norm(h + (p @ h) @ wo, (d,), g)


def test_a_refused_attention_leaves_the_layer_norm_after_it_fused_in_training():
    """In a training forward the attention saves its probabilities and is refused; the
    region held the layer norm after its output projection too (joined through the
    positions both read), and every node of it went to the rest. Now the norm fuses on
    its own, the attention is reported with its reason, and the output and every
    gradient match float64."""
    gen = torch.Generator().manual_seed(4)
    args = [torch.randn(2, 8, 16, generator=gen), torch.randn(16, 16, generator=gen) / 4,
            torch.randn(16, generator=gen)]
    torch._dynamo.reset()
    g = nf.jit(_block, rest="eager")
    xs = [a.clone().requires_grad_() for a in args]
    ref = [a.double().requires_grad_() for a in args]
    out, want = g(*xs), _block(*ref)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    (out * want.detach().float()).sum().backward()
    (want * want.detach()).sum().backward()
    for a, r in zip(xs, ref):
        torch.testing.assert_close(a.grad.double(), r.grad, rtol=1e-4, atol=1e-5)
    [report] = g.backend.reports
    [norm] = report.fused
    assert "rsqrt" in norm.ops and "amax" not in norm.ops, report
    [attention] = [x for x in report.left if "amax" in x.ops]
    # refused: its probabilities are saved (no dependent chain is left in one kernel)
    assert "rsqrt" not in attention.ops and "chain" in attention.reason, report


def test_an_inference_graph_fuses_both_parts():
    """Without gradients the attention fuses too, and the norm beside it: the region
    whole had been refused (one kernel cannot hold a chain, a product of its result and
    a chain over that), and nothing of it fused."""
    gen = torch.Generator().manual_seed(5)
    args = [torch.randn(2, 8, 16, generator=gen), torch.randn(16, 16, generator=gen) / 4,
            torch.randn(16, generator=gen)]
    torch._dynamo.reset()
    g = nf.jit(_block, rest="eager")
    with torch.no_grad():
        out = g(*args)
    torch.testing.assert_close(out.double(), _block(*[a.double() for a in args]),
                               rtol=1e-5, atol=1e-5)
    [report] = g.backend.reports
    assert any("amax" in f.ops for f in report.fused), report
    assert any("rsqrt" in f.ops for f in report.fused), report
