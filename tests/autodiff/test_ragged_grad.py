"""Gradients over a ragged contiguous KV cache (``kv_lens=``): the backward derived from
the ragged definition (its masks and the queries at ``kv_lens[b] - N ...``), the kernels
on the CPU interpreter, against torch autograd of a float64 attention run per sequence
over its own keys. Keys past a sequence's length get zero gradient; a sequence of length
0 gives zeros everywhere. A paged cache is refused by name."""

from __future__ import annotations

import math

import pytest
import torch

import neptune_fusion as nf
from neptune_fusion import ops
from neptune_fusion.frontend.attention import AttentionCache

LENS = [0, 1, 5, 8]   # M = 8: an empty sequence, one key, a partial tile, a full cache
D = 3


def _reference(q, k, v, lens, causal: bool, scale: float):
    """float64 attention of each sequence over its ``lens[b]`` keys (differentiable)."""
    b_, hq, n, _ = q.shape
    group = hq // k.shape[1]
    outs = []
    for b in range(b_):
        m = int(lens[b])
        kk = k[b, :, :m].repeat_interleave(group, 0)
        vv = v[b, :, :m].repeat_interleave(group, 0)
        s = q[b] @ kk.transpose(-1, -2) * scale
        if causal:
            pos = torch.arange(n)[:, None] + (m - n)
            s = s.masked_fill(~(torch.arange(m)[None, :] <= pos), -math.inf)
        p = torch.softmax(s, -1).nan_to_num(0.0)   # a row with no key: zeros
        outs.append(p @ vv)
    return torch.stack(outs)


@pytest.mark.parametrize("hq,hkv,n,causal,compiled", [
    (2, 2, 1, True, False), (4, 2, 1, True, False), (2, 2, 3, True, False),
    (4, 2, 3, False, False),
    # traced by torch.compile: the attention op's saved output and log-sum-exp, packed
    # GQA decode (n = 1) among them
    (4, 2, 1, True, True), (4, 2, 3, True, True)])
def test_ragged_gradients_float32_against_float64(hq, hkv, n, causal, compiled):
    gen = torch.Generator().manual_seed(hq * 10 + n)
    q = torch.randn(len(LENS), hq, n, D, generator=gen)
    k, v = (torch.randn(len(LENS), hkv, 8, D, generator=gen) for _ in range(2))
    lens = torch.tensor(LENS, dtype=torch.int32)
    got = [t.clone().requires_grad_() for t in (q, k, v)]
    cache = AttentionCache(store=False)

    def attend(q, k, v, lens):
        return nf.attention(q, k, v, kv_lens=lens, mask_mod=ops.Causal() if causal else None,
                            scale=0.6, enable_gqa=hq != hkv, cache=cache)
    if compiled:
        torch._dynamo.reset()
        attend = torch.compile(attend, fullgraph=True, backend="aot_eager")
    o = attend(*got, lens)
    d_o = torch.randn_like(o)
    o.backward(d_o)
    want = [t.double().requires_grad_() for t in (q, k, v)]
    ref = _reference(*want, LENS, causal, 0.6)
    torch.testing.assert_close(o.detach().double(), ref.detach(), rtol=1e-5, atol=1e-5)
    ref.backward(d_o.double())
    for name, g, w in zip("qkv", got, want):
        torch.testing.assert_close(g.grad.double(), w.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, name=name: f"d_{name}: {m}")
    for b, m in enumerate(LENS):   # keys past the length: no gradient
        assert torch.all(got[1].grad[b, :, m:] == 0) and torch.all(got[2].grad[b, :, m:] == 0)


@pytest.mark.parametrize("compiled", [False, True])
def test_a_paged_cache_with_grad_is_refused(compiled):
    """Eagerly, and traced by torch.compile (at the trace, not at the backward)."""
    q = torch.randn(1, 2, 1, D, requires_grad=True)
    pool = torch.randn(2, 2, 16, D)
    cache = AttentionCache(store=False)

    def attend(q):
        return nf.attention(q, pool, pool, kv_lens=torch.tensor([3], dtype=torch.int32),
                            block_table=torch.tensor([[0]], dtype=torch.int32), cache=cache)
    if compiled:
        torch._dynamo.reset()
        attend = torch.compile(attend, fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match=r"paged cache \(block_table=\) has no backward: "
                                        r"q, k or v requires grad"):
        attend(q)


def test_a_compiled_training_step_over_a_ragged_cache():
    """torch.compile(fullgraph=True): the op's registered backward takes kv_lens along."""
    gen = torch.Generator().manual_seed(21)
    q = torch.randn(len(LENS), 2, 1, D, generator=gen)
    k, v = (torch.randn(len(LENS), 2, 8, D, generator=gen) for _ in range(2))
    lens = torch.tensor(LENS, dtype=torch.int32)
    d_o = torch.randn(q.shape, generator=gen)
    cache = AttentionCache(store=False)
    got = [t.clone().requires_grad_() for t in (q, k, v)]

    def loss(q, k, v):
        return (nf.attention(q, k, v, kv_lens=lens, mask_mod=ops.Causal(), scale=0.6,
                             cache=cache) * d_o).sum()
    torch._dynamo.reset()
    torch.compile(loss, fullgraph=True, backend="aot_eager")(*got).backward()
    want = [t.double().requires_grad_() for t in (q, k, v)]
    (_reference(*want, LENS, True, 0.6) * d_o.double()).sum().backward()
    for name, g, w in zip("qkv", got, want):
        torch.testing.assert_close(g.grad.double(), w.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, name=name: f"d_{name}: {m}")
