"""An input the output does not depend on gets a zero gradient, as torch autograd gives.

``nf.attention`` with a score that ignores ``q`` and ``k`` (``scale=0.0``, a score_mod
that reads only the key position) is uniform attention over the unmasked keys: SDPA's
``q`` and ``k`` gradients are zero (its scores still read them, times 0). The derived
backward has no ``d_q``, ``d_k`` program there; the autograd Function returns zeros,
and ``d_v`` (and the sinks' gradient) still match float64 autograd. A compiled chain
(``nf.compile(differentiable=True)``) whose output has no derivative in an input leaves
that input's gradient None, as torch does for the same expression.
"""

from __future__ import annotations

import pytest
import torch

import neptune_fusion as nf
from neptune_fusion import ops
from neptune_fusion.frontend.attention import AttentionCache

B, N, M, D = 1, 3, 5, 4


def _by_key(s, b, h, i, j):
    return nf.cast(j, "float32") * 0.5


def _inputs(hq, hkv, n, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, rows, D, generator=gen)
            for h, rows in ((hq, n), (hkv, M), (hkv, M))]


def _reference(q, k, v, score_mod, causal, offset, sinks=None):
    """float64 attention in torch, the scores spelled out as the kernel's definition has
    them (``q . k * 0`` where the score ignores them, as SDPA with ``scale=0``)."""
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ kk.transpose(-1, -2) * 0.0
    i = torch.arange(q.shape[2]).view(-1, 1) + offset
    j = torch.arange(M).view(1, -1)
    if score_mod is _by_key:
        s = s * 0.0 + j.double() * 0.5
    if causal:
        s = s.masked_fill(j > i, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.view(1, -1, 1, 1).expand(*s.shape[:3], 1)], -1)
        vv = torch.cat([vv, vv.new_zeros(*vv.shape[:2], 1, vv.shape[3])], 2)
    return s.softmax(-1) @ vv


@pytest.mark.parametrize("score_mod,causal,hq,n", [
    (None, False, 2, N),        # scale=0.0: uniform attention
    (None, True, 4, N),         # GQA, causal
    (_by_key, False, 2, N),     # a score_mod that reads only j
    (_by_key, True, 4, 1),      # packed GQA decode
])
def test_a_score_that_ignores_q_and_k_gives_zero_gradients(score_mod, causal, hq, n):
    base = _inputs(hq, 2, n, seed=hq + n)
    got = [t.clone().requires_grad_() for t in base]
    o = nf.attention(*got, scale=0.0 if score_mod is None else None, score_mod=score_mod,
                     mask_mod=ops.Causal() if causal else None, enable_gqa=hq != 2,
                     q_offset="end", cache=AttentionCache(store=False))
    d_o = torch.randn(o.shape, generator=torch.Generator().manual_seed(7))
    (o * d_o).sum().backward()
    want = [t.double().requires_grad_() for t in base]
    ro = _reference(*want, score_mod, causal, M - n)
    torch.testing.assert_close(o.detach().double(), ro.detach(), rtol=1e-5, atol=1e-5)
    (ro * d_o.double()).sum().backward()
    for name, g, w in zip("qkv", got, want):
        assert g.grad is not None and g.grad.shape == w.shape, name
        torch.testing.assert_close(g.grad.double(), w.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, name=name: f"d_{name}: {m}")
    assert not got[0].grad.any() and not got[1].grad.any()


def test_zero_gradients_with_sinks_and_through_autograd_grad():
    """With ``sinks=`` the log-sum-exp's cotangent arrives too (it reaches only the
    scores: nothing for ``q``, ``k``); ``torch.autograd.grad`` gets tensors, not None."""
    base = _inputs(2, 2, N, seed=11)
    sinks = torch.tensor([0.5, -1.0])
    got = [t.clone().requires_grad_() for t in (*base, sinks)]
    o = nf.attention(*got[:3], scale=0.0, sinks=got[3], cache=AttentionCache(store=False))
    d_o = torch.randn(o.shape, generator=torch.Generator().manual_seed(12))
    grads = torch.autograd.grad((o * d_o).sum(), got)
    want = [t.double().requires_grad_() for t in (*base, sinks)]
    ro = _reference(*want[:3], None, False, 0, sinks=want[3])
    wants = torch.autograd.grad((ro * d_o.double()).sum(), want)
    for name, g, w in zip(("q", "k", "v", "sinks"), grads, wants):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, name=name: f"d_{name}: {m}")


def test_a_compiled_chain_leaves_an_input_without_derivative_as_torch_does():
    n_ = nf.size("N")
    x = nf.placeholder((n_, 8), "float32", name="x")
    w = nf.placeholder((n_, 8), "float32", name="w")
    y = nf.compute((n_, 8), lambda i, j: nf.where(x[i, j] > 0, w[i, j] * 2.0, 0.0),
                   name="y")
    kern = nf.compile(y, differentiable=True, cache=False)
    gen = torch.Generator().manual_seed(5)
    args = [torch.randn(4, 8, generator=gen).requires_grad_() for _ in range(2)]
    kern(*args).sum().backward()
    want = [a.detach().double().requires_grad_() for a in args]
    torch.where(want[0] > 0, want[1] * 2.0, 0.0).sum().backward()
    assert args[0].grad is None and want[0].grad is None
    torch.testing.assert_close(args[1].grad.double(), want[1].grad)
