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
