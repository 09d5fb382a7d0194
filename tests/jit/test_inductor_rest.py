"""The rest of a graph compiled by Inductor: gradients right when the forward saves two
views of one tensor (no donated buffers), and no Inductor graph cache for graphs that
name our kernels by number (a fuzzing find of 2026-12-04: another process got the code
of another kernel). Against float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import neptune_fusion as nf


def test_attention_gradients_under_inductor_match_float64():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 8, 16, generator=g, requires_grad=True) for _ in range(3))
    d_o = torch.randn(1, 2, 8, 16, generator=g)
    torch._dynamo.reset()
    nf.jit(F.scaled_dot_product_attention)(q, k, v).backward(d_o)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*ref).backward(d_o.double())
    for name, t, r in zip("qkv", (q, k, v), ref):
        torch.testing.assert_close(t.grad.double(), r.grad, rtol=1e-5, atol=1e-5,
                                   msg=lambda m, name=name: f"d_{name}: {m}")


def test_graphs_with_fused_ops_skip_inductors_graph_cache(monkeypatch):
    import torch._inductor.compile_fx as cfx
    import torch._inductor.config as inductor_config
    seen, real = [], cfx.compile_fx_inner

    def spy(gm, *a, **kw):
        fused = any("neptune_fusion" in str(n.target) for n in gm.graph.nodes)
        seen.append((fused, inductor_config.fx_graph_cache))
        return real(gm, *a, **kw)
    monkeypatch.setattr(cfx, "compile_fx_inner", spy)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(3))
    torch._dynamo.reset()
    with torch.no_grad():
        got = nf.jit(lambda x: torch.sin(torch.softmax(x, -1)))(x)
    torch.testing.assert_close(got.double(), torch.sin(torch.softmax(x.double(), -1)),
                               rtol=1e-5, atol=1e-6)
    assert (True, False) in seen and (True, True) not in seen, seen


@pytest.mark.parametrize("ours", [False, True], ids=["joint-passes", "written_attention"])
def test_written_out_attention_in_training_takes_inductors_joint_graph_patterns(
        monkeypatch, ours):
    """A training graph's joint forward and backward go through Inductor's joint-graph
    passes before the min-cut split (``rest="inductor"``), as under Inductor alone: the
    attention patterns make written-out attention SDPA's kernel with its own backward
    (not a forward that writes the probabilities for an unfused backward), and the
    report says so. Since 2026-12-05 our own rewrite (dynamo/written_attention.py) takes
    this form first; without it (``ours=False``) Inductor's patterns still do. Gradients
    against float64."""
    import neptune_fusion.dynamo.backend as backend
    if not ours:
        monkeypatch.setattr(backend, "written_attention_to_sdpa", lambda gm: 0)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 2, 16, 8, generator=g) for _ in range(3))
    d_o = torch.randn(2, 2, 16, 8, generator=g)

    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1) @ v

    torch._dynamo.reset()
    fused = nf.jit(attention)
    xs = [t.clone().requires_grad_() for t in (q, k, v)]
    fused(*xs).backward(d_o)
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    attention(*ref).backward(d_o.double())
    for name, t, r in zip("qkv", xs, ref):
        torch.testing.assert_close(t.grad.double(), r.grad, rtol=1e-5, atol=1e-5,
                                   msg=lambda m, name=name: f"d_{name}: {m}")
    [report] = fused.backend.reports
    said = "made SDPA's call" if ours else "SDPA's kernel"
    assert any(x.ops == ("attention",) and said in x.reason for x in report.left), report
