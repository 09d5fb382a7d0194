"""The torch ops on a CUDA device: Inductor, CUDA graphs (``mode="reduce-overhead"``) and
torch.export with real compiled kernels, each checked against float64. Skipped without a
GPU (CI is CPU-only; run with ``pytest -m gpu`` on a GPU machine)."""

from __future__ import annotations

import pytest
import torch

import neptune_fusion as nf
from neptune_fusion import ops
from runtime.test_attention_api import reference

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CAUSAL = ops.Causal()


def _keep(h, i, j):
    return j <= i


def _qkv(n, m, dtype=torch.float16, hq=8, hkv=2, d=64):
    g = torch.Generator(device="cuda").manual_seed(n * 1000 + m)

    def r(*s):
        return torch.randn(*s, device="cuda", dtype=dtype, generator=g)
    return r(2, hq, n, d), r(2, hkv, m, d), r(2, hkv, m, d)


def _attend(q, k, v):
    return nf.attention(q, k, v, mask_mod=CAUSAL, enable_gqa=True, q_offset="end") * 2.0


def _check(out, q, k, v):
    want = reference(q.double().cpu(), k.double().cpu(), v.double().cpu(), keep=_keep,
                     offset=k.shape[2] - q.shape[2]) * 2.0
    err = (out.double().cpu() - want).norm() / want.norm()
    assert err < 2e-3, err


@pytest.mark.parametrize("n,m", [(1, 1000), (128, 640)])   # decode (split-k), prefill
def test_reduce_overhead_captures_and_replays(n, m):
    fn = torch.compile(_attend, mode="reduce-overhead", fullgraph=True)
    for step in range(4):   # the first calls run eagerly (tuning), later ones replay a graph
        q, k, v = _qkv(n, m)
        q = q + step   # new values each call: the replay must read them
        _check(fn(q, k, v).clone(), q, k, v)


def test_inductor_fullgraph_matches():
    q, k, v = _qkv(64, 300)
    fn = torch.compile(lambda q, k, v: torch.relu(_attend(q, k, v)) + 1, fullgraph=True)
    out = fn(q, k, v)
    want = torch.relu(_attend(q, k, v)) + 1
    assert torch.equal(out, want)


def test_export_runs_on_cuda():
    class M(torch.nn.Module):
        def forward(self, q, k, v):
            return _attend(q, k, v)

    q, k, v = _qkv(32, 96)
    ep = torch.export.export(M(), (q, k, v))
    _check(ep.module()(q, k, v), q, k, v)


def test_the_backward_on_two_streams_equals_the_sequential_one():
    """The first backward of a signature runs d_q and d_k, d_v in sequence (it tunes
    them); later ones run d_q on a side stream: gradients bit-identical, and against
    float64 autograd."""
    q, k, v = _qkv(300, 300)
    grads = []
    for _ in range(3):
        xs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = nf.attention(*xs, mask_mod=CAUSAL, enable_gqa=True)
        out.backward(torch.ones_like(out))
        grads.append([t.grad for t in xs])
    for later in grads[1:]:
        for a, b in zip(grads[0], later):
            assert torch.equal(a, b)
    want = [t.double().cpu().requires_grad_() for t in (q, k, v)]
    ref = reference(*want, keep=_keep, offset=0)
    ref.backward(torch.ones_like(ref))
    for g, w in zip(grads[-1], want):
        err = (g.double().cpu() - w.grad).norm() / w.grad.norm()
        assert err < 5e-3, err


def _rel(a, b):
    return float((a.double().cpu() - b).norm() / b.norm())


def _sink_reference(qd, kd, vd, sd):
    """Float64 causal GQA attention (4 query heads a key head, d 64) with a sink logit
    per head: the output and the log-sum-exp."""
    n = qd.shape[2]
    kk, vv = kd.repeat_interleave(4, 1), vd.repeat_interleave(4, 1)
    s = qd @ kk.transpose(-1, -2) / 8.0
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    s = torch.cat([s, sd.view(1, -1, 1, 1).expand(*s.shape[:3], 1)], -1)
    vv = torch.cat([vv, vv.new_zeros(*vv.shape[:2], 1, vv.shape[3])], 2)
    return s.softmax(-1) @ vv, torch.logsumexp(s, -1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_compiled_training_step_with_lse_and_sinks(dtype):
    """torch.compile (Inductor, fullgraph) of a loss over ``return_lse=True`` and
    ``sinks=``: the attention op's saved output and log-sum-exp feed the derived
    backward (the forward runs once); values and the gradients of q, k, v and the sinks
    against float64 autograd."""
    q, k, v = _qkv(200, 200, dtype)
    sinks = torch.randn(q.shape[1], device="cuda")
    xs = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    w = torch.randn(q.shape[:3], device="cuda")

    def loss(q, k, v, sinks):
        o, lse = nf.attention(q, k, v, mask_mod=CAUSAL, enable_gqa=True, sinks=sinks,
                              return_lse=True)
        return o.float().square().sum() + (lse * w).sum()
    torch._dynamo.reset()
    got = torch.compile(loss, fullgraph=True)(*xs)
    got.backward()
    want = [t.detach().double().cpu().requires_grad_() for t in (q, k, v, sinks)]
    o, lse = _sink_reference(*want)
    ref = o.square().sum() + (lse * w.double().cpu()).sum()
    ref.backward()
    assert abs(float(got.detach()) - float(ref.detach())) / abs(float(ref.detach())) < 5e-3
    for name, g, t in zip(("q", "k", "v", "sinks"), xs, want):
        assert _rel(g.grad, t.grad) < 2e-2, name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_inference_with_lse_and_sinks_under_inductor(dtype):
    """No input requires grad: ``return_lse=True`` and ``sinks=`` trace to the
    ``attention_infer_lse`` op (no autograd wrapper) under Inductor; the output and the
    log-sum-exp against float64."""
    q, k, v = _qkv(200, 200, dtype)
    sinks = torch.randn(q.shape[1], device="cuda")

    def infer(q, k, v, sinks):
        return nf.attention(q, k, v, mask_mod=CAUSAL, enable_gqa=True, sinks=sinks,
                            return_lse=True)
    torch._dynamo.reset()
    with torch.no_grad():
        o, lse = torch.compile(infer, fullgraph=True)(q, k, v, sinks)
    want_o, want_lse = _sink_reference(*(t.double().cpu() for t in (q, k, v, sinks)))
    # bf16 keeps 8 bits: its output and probabilities round at 2**-9 (2.6e-3 measured)
    assert _rel(o, want_o) < (2e-3 if dtype == torch.float16 else 1e-2)
    assert _rel(lse, want_lse) < 5e-4


def test_a_differentiable_chain_trains_under_inductor():
    """``nf.compile(..., differentiable=True)`` traced by torch.compile (Inductor): the
    ``kernel_grad`` op and its derived gradient kernels, against float64."""
    N, M = nf.sizes("N M")
    x = nf.placeholder((N, M), "float32", name="x")
    j, j2 = nf.reduce_axis(M, "j"), nf.reduce_axis(M, "j2")
    m = nf.compute((N,), lambda i: nf.max(x[i, j], j), name="m")
    lse = nf.compute((N,), lambda i: m[i] + nf.log(nf.sum(nf.exp(x[i, j2] - m[i]), j2)),
                     name="lse")
    kern = nf.compile(lse, differentiable=True)
    a = torch.randn(512, 3000, device="cuda", requires_grad=True)
    w = torch.randn(512, device="cuda")
    torch._dynamo.reset()
    got = torch.compile(lambda a: (kern(a) * w).sum(), fullgraph=True)(a)
    got.backward()
    ad = a.detach().double().cpu().requires_grad_()
    ref = (torch.logsumexp(ad, 1) * w.double().cpu()).sum()
    ref.backward()
    assert abs(float(got.detach()) - float(ref.detach())) / abs(float(ref.detach())) < 1e-5
    assert _rel(a.grad, ad.grad) < 1e-5
