"""The row log-sum-exp as a differentiable output (``return_lse=True``) and attention
sinks (``sinks=``), under autograd (docs/autodiff.md).

* float64 ``gradcheck`` of the derivation: the definition and its derived backward
  programs evaluated by the float64 reference, the log-sum-exp's cotangent folded into
  ``delta`` as the kernels fold it, and the sinks merged in torch;
* the kernels (CPU interpreter): float32 gradients of q, k, v (and the sinks) against
  torch autograd of a float64 reference, and half precision;
* what is refused.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.autodiff.attention import attention_backward
from neptune_fusion.frontend.attention import AttentionCache
from neptune_fusion.frontend.sinks import merge_sinks
from neptune_fusion.reference.evaluate import evaluate_unfused

from .test_attention_grad import (
    CASES,
    INF,
    _inputs,
    _spec,
    reference_forward,
    reference_scores,
)


class ReferenceAttentionLse(torch.autograd.Function):
    """``(o, lse)`` of the definition and the derived backward, evaluated by the float64
    reference, with ``d_lse`` folded into the saved ``delta`` (``delta - d_lse``)."""

    @staticmethod
    def forward(ctx, spec, q, k, v, *bufs):
        return reference_forward(ctx, spec, q, k, v, *bufs)

    @staticmethod
    def backward(ctx, d_out, d_lse):
        bw = attention_backward(*ctx.program)
        saved = bw.with_saved_delta(list(bw.grads))
        [delta] = evaluate_unfused([saved.delta], {"o": ctx.o, "d_o": d_out.numpy()})
        lse = np.where(np.isfinite(ctx.lse), ctx.lse, INF)
        feeds = dict(ctx.feeds, d_o=d_out.numpy(), lse=lse, delta=delta - d_lse.numpy())
        names = {p.name for p in saved.inputs}
        got = evaluate_unfused(saved.outputs, {k: v for k, v in feeds.items() if k in names})
        return (None, *(torch.from_numpy(g) for g in got), *[None] * (len(ctx.feeds) - 3))


@pytest.mark.parametrize("case", ["plain", "gqa", "softcap"])
def test_lse_cotangent_passes_gradcheck_in_float64(case):
    spec = _spec(case)
    q, k, v, slopes = _inputs(case)
    bufs = (slopes,) if spec.buffers else ()
    w = torch.randn(q.shape[:3], dtype=torch.float64)

    def f(*a):   # both outputs in the loss: d_o and d_lse are both nonzero
        o, lse = ReferenceAttentionLse.apply(spec, *a, *bufs)
        return o.sum(-1) + lse * w
    args = [t.requires_grad_() for t in (q, k, v)]
    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", ["causal", "gqa"])
def test_sinks_pass_gradcheck_in_float64(case):
    spec = _spec(case)
    q, k, v, _ = _inputs(case)
    sinks = torch.randn(q.shape[1], dtype=torch.float64)

    def f(q, k, v, sinks):
        o, lse = ReferenceAttentionLse.apply(spec, q, k, v)
        return merge_sinks(o, lse, sinks, return_lse=True)
    args = [t.requires_grad_() for t in (q, k, v, sinks)]
    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-7)


def _reference(q, k, v, case, sinks=None):
    """float64 ``(o, lse)`` in torch; with ``sinks`` a softmax over [scores, sink] with a
    zero value row, spelled out as gpt-oss does (not through the merge)."""
    hq, hkv, sm, mm, _ = CASES[case]
    s = reference_scores(q, k, hq, hkv, sm, mm, None, 0.7)
    vv = v.repeat_interleave(hq // hkv, 1)
    if sinks is not None:
        s = torch.cat([s, sinks.view(1, hq, 1, 1).expand(*s.shape[:3], 1)], -1)
        vv = torch.cat([vv, vv.new_zeros(*vv.shape[:2], 1, vv.shape[3])], 2)
    return s.softmax(-1) @ vv, torch.logsumexp(s, -1)


def _nf(case, got, n, cache=None, **kw):
    hq, hkv, sm, mm, _ = CASES[case]
    return nf.attention(*got, score_mod=sm, mask_mod=mm, scale=0.7, enable_gqa=hq != hkv,
                        cache=AttentionCache(store=False) if cache is None else cache,
                        q_offset="end" if n == 1 else None, **kw)


@pytest.mark.parametrize("case,n", [("gqa", 8), ("softcap", 8), ("causal", 8), ("gqa", 1)])
def test_lse_output_gradients_float32_against_float64(case, n):
    q, k, v, _ = _inputs(case, dtype=torch.float32, seed=3, n=n, m=8, d=3)
    got = [t.clone().requires_grad_() for t in (q, k, v)]
    o, lse = _nf(case, got, n, return_lse=True)
    assert lse.grad_fn is not None and lse.shape == q.shape[:3]
    d_o, d_lse = torch.randn_like(o), torch.randn_like(lse)
    ((o * d_o).sum() + (lse * d_lse).sum()).backward()
    want = [t.double().requires_grad_() for t in (q, k, v)]
    ro, rl = _reference(*want, case)
    torch.testing.assert_close(lse.detach().double(), rl.detach(), rtol=1e-5, atol=1e-5)
    ((ro * d_o.double()).sum() + (rl * d_lse.double()).sum()).backward()
    for name, g, w in zip("qkv", got, want):
        torch.testing.assert_close(g.grad.double(), w.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, name=name: f"d_{name}: {m}")


def test_an_unused_lse_or_output_gets_no_cotangent():
    """Only ``lse`` in the loss (``d_o`` is None) and only ``o`` (``d_lse`` None)."""
    q, k, v, _ = _inputs("causal", dtype=torch.float32, seed=4, n=8, m=8, d=3)
    for use in ("lse", "o"):
        got = [t.clone().requires_grad_() for t in (q, k, v)]
        o, lse = _nf("causal", got, 8, return_lse=True)
        (lse.sum() if use == "lse" else o.sum()).backward()
        want = [t.double().requires_grad_() for t in (q, k, v)]
        ro, rl = _reference(*want, "causal")
        (rl.sum() if use == "lse" else ro.sum()).backward()
        for g, w in zip(got, want):   # lse does not read v: torch leaves its grad None
            ref = torch.zeros_like(w) if w.grad is None else w.grad
            torch.testing.assert_close(g.grad.double(), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case,n", [("gqa", 8), ("causal", 8), ("gqa", 1)])
def test_sinks_gradients_float32_against_float64(case, n):
    q, k, v, _ = _inputs(case, dtype=torch.float32, seed=6, n=n, m=8, d=3)
    sinks = torch.randn(q.shape[1]) * 2
    got = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    o = _nf(case, got[:3], n, sinks=got[3])
    d_o = torch.randn_like(o)
    (o * d_o).sum().backward()
    want = [t.double().requires_grad_() for t in (q, k, v, sinks)]
    ro, _ = _reference(*want[:3], case, sinks=want[3])
    torch.testing.assert_close(o.detach().double(), ro.detach(), rtol=1e-5, atol=1e-5)
    (ro * d_o.double()).sum().backward()
    for name, g, w in zip(("q", "k", "v", "sinks"), got, want):
        torch.testing.assert_close(g.grad.double(), w.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, name=name: f"d_{name}: {m}")


def test_sinks_in_half_precision_and_a_row_with_no_key():
    """bf16 inputs; row 0 sees no key (its output 0, its log-sum-exp the sink's)."""
    q, k, v, _ = _inputs("causal", dtype=torch.float32, seed=8, n=6, m=6, d=8)
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    sinks = torch.randn(q.shape[1])
    mask = lambda b, h, i, j: (j <= i) & (i > 0)   # noqa: E731
    o, lse = nf.attention(q, k, v, mask_mod=mask, scale=0.7, sinks=sinks, return_lse=True,
                          cache=AttentionCache(store=False))
    assert o.dtype == torch.bfloat16 and torch.all(o[:, :, 0] == 0)
    torch.testing.assert_close(lse[0, :, 0], sinks)
    s = reference_scores(q.double(), k.double(), 2, 2, None, None, None, 0.7)
    n = torch.arange(6)
    s = s.masked_fill(~((n[None, :] <= n[:, None]) & (n[:, None] > 0)), -INF)
    s = torch.cat([s, sinks.double().view(1, 2, 1, 1).expand(1, 2, 6, 1)], -1)
    vv = torch.cat([v.double(), v.new_zeros(1, 2, 1, 8).double()], 2)
    torch.testing.assert_close(o.double(), s.softmax(-1) @ vv, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("bad,match", [
    (lambda q: torch.zeros(3), r"sinks has shape \(3,\); .* shape \(2,\)"),
    (lambda q: torch.zeros(2, 1), r"sinks has shape \(2, 1\)"),
    (lambda q: torch.zeros(2, dtype=torch.int32), "sinks must be a float tensor"),
    (lambda q: [0.0, 1.0], "sinks must be a torch tensor"),
])
def test_bad_sinks_are_refused_by_name(bad, match):
    q, k, v, _ = _inputs("causal", dtype=torch.float32)
    with pytest.raises(nf.FeedError, match=match):
        nf.attention(q, k, v, sinks=bad(q), cache=AttentionCache(store=False))


@pytest.mark.parametrize("case,n", [("gqa", 8), ("causal", 8), ("gqa", 1)])
def test_lse_and_sinks_under_torch_compile_against_float64(case, n):
    """``return_lse=True`` and ``sinks=`` traced by torch.compile(fullgraph=True): the
    op's two outputs, the sinks merged in the graph; values and the gradients of q, k,
    v and the sinks (both outputs in the loss) against float64."""
    q, k, v, _ = _inputs(case, dtype=torch.float32, seed=11, n=n, m=8, d=3)
    sinks, cache = torch.randn(q.shape[1]) * 2, AttentionCache(store=False)
    for with_sinks in (False, True):
        got = [t.clone().requires_grad_() for t in (q, k, v, sinks)]

        def f(q, k, v, sinks, with_sinks=with_sinks):
            return _nf(case, (q, k, v), n, cache, return_lse=True,
                       sinks=sinks if with_sinks else None)
        torch._dynamo.reset()
        o, lse = torch.compile(f, fullgraph=True, backend="aot_eager")(*got)
        d_o, d_lse = torch.randn_like(o), torch.randn_like(lse)
        ((o * d_o).sum() + (lse * d_lse).sum()).backward()
        want = [t.double().requires_grad_() for t in (q, k, v, sinks)]
        ro, rl = _reference(*want[:3], case, sinks=want[3] if with_sinks else None)
        torch.testing.assert_close(o.detach().double(), ro.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lse.detach().double(), rl.detach(), rtol=1e-5,
                                   atol=1e-5)
        ((ro * d_o.double()).sum() + (rl * d_lse.double()).sum()).backward()
        for name, g, w in zip(("q", "k", "v", "sinks"), got, want):
            if name == "sinks" and not with_sinks:
                continue
            torch.testing.assert_close(g.grad.double(), w.grad, rtol=1e-4, atol=1e-5,
                                       msg=lambda m, name=name: f"d_{name}: {m}")


def test_lse_under_torch_compile_without_gradients():
    """No input requires grad: ``attention_infer_lse`` (no autograd wrapper), its
    log-sum-exp against float64."""
    q, k, v, _ = _inputs("causal", dtype=torch.float32, seed=12, n=8, m=8, d=3)
    cache = AttentionCache(store=False)
    graphs = []

    def capture(gm, example_inputs):
        graphs.append({str(n.target).removesuffix(".default") for n in gm.graph.nodes})
        return gm.forward
    torch._dynamo.reset()
    o, lse = torch.compile(lambda q, k, v: _nf("causal", (q, k, v), 8, cache,
                                               return_lse=True),
                           fullgraph=True, backend=capture)(q, k, v)
    (targets,) = graphs
    assert "neptune_fusion.attention_infer_lse" in targets
    assert "neptune_fusion.attention" not in targets
    ro, rl = _reference(q.double(), k.double(), v.double(), "causal")
    torch.testing.assert_close(o.double(), ro, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), rl, rtol=1e-5, atol=1e-5)
