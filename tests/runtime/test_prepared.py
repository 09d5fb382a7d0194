"""nf.prepare_attention: a call bound to one signature (runtime/prepared.py). On CPU the
bound arguments launch through the interpreter, so these check the binding (inputs,
sizes, split-k workspace, packed GQA decode) against float64; the speed is the H200's
(benchmarks/host_overhead.py)."""

from __future__ import annotations

import pytest
import torch

import neptune_fusion as nf
from neptune_fusion import ops
from neptune_fusion.errors import FeedError
from neptune_fusion.frontend.attention import AttentionCache
from neptune_fusion.schedule.schedule import Schedule
from runtime.test_attention_api import randn, reference, rel

SPLIT = Schedule(block_m=16, block_n=16, num_warps=4, strategy="split", splits=3)
ROLL = Schedule(block_m=16, block_n=16)


def _keep(h, i, j):
    return j <= i


@pytest.mark.parametrize("hq,n,sched", [(4, 1, SPLIT), (2, 1, SPLIT), (2, 9, ROLL)])
def test_prepared_matches_float64_on_fresh_data(hq, n, sched):
    """Split-k decode (packed GQA with hq=4 over 2 KV heads, plain with 2), and rolling
    prefill: each call's output is right for *its* inputs, and the same tensor."""
    m, cache = 45, AttentionCache()
    kw = dict(mask_mod=ops.Causal(), q_offset="end", enable_gqa=True, schedule=sched,
              cache=cache)
    shapes = ((1, hq, n, 16), (1, 2, m, 16), (1, 2, m, 16))
    q, k, v = (randn(*s, seed=x, dtype=torch.float32) for x, s in enumerate(shapes))
    prepared = nf.prepare_attention(q, k, v, **kw)
    outs = []
    for seed in (10, 20):
        q, k, v = (randn(*s, seed=seed + x, dtype=torch.float32)
                   for x, s in enumerate(shapes))
        out = prepared(q, k, v)
        assert out is prepared.output
        assert rel(out, reference(q, k, v, keep=_keep, offset=m - n)) < 1e-5
        outs.append(out.clone())
    assert not torch.equal(outs[0], outs[1])
    # what it launches, named: the given schedule here (the bench's notes print it)
    assert prepared.schedule.strategy == sched.strategy
    assert prepared.schedule.block_m == sched.block_m


@pytest.mark.parametrize("hq,n,sched", [(4, 1, SPLIT), (2, 3, ROLL)])
def test_prepared_with_sinks_matches_float64(hq, n, sched):
    """``sinks=`` (gpt-oss's decode through the Hugging Face integration): the prepared
    kernel writes the row log-sum-exp, each call merges the sinks it is given into the
    output in place. Against float64 softmax over ``[scores, sink]`` with a zero value
    row, on fresh data and fresh sinks per call; without sinks the general path."""
    m, cache = 37, AttentionCache()
    kw = dict(mask_mod=ops.Causal(), q_offset="end", enable_gqa=True, schedule=sched,
              cache=cache)
    shapes = ((1, hq, n, 16), (1, 2, m, 16), (1, 2, m, 16))
    q, k, v = (randn(*s, seed=x, dtype=torch.float32) for x, s in enumerate(shapes))
    prepared = nf.prepare_attention(q, k, v, sinks=torch.zeros(hq), **kw)
    g = hq // 2
    for seed in (10, 20):
        q, k, v = (randn(*s, seed=seed + x, dtype=torch.float32)
                   for x, s in enumerate(shapes))
        sinks = randn(hq, seed=seed + 5, dtype=torch.float32) * 2
        got = prepared(q, k, v, sinks=sinks)
        assert got is prepared.output
        kk, vv = (t.double().repeat_interleave(g, 1) for t in (k, v))
        s = q.double() @ kk.transpose(-1, -2) / 4.0
        i = torch.arange(n)[:, None] + (m - n)
        s = s.masked_fill(torch.arange(m)[None, :] > i, float("-inf"))
        s = torch.cat([s, sinks.double().view(1, hq, 1, 1).expand(1, hq, n, 1)], -1)
        want = torch.softmax(s, -1)[..., :m] @ vv
        assert rel(got, want) < 1e-5
        assert rel(nf.attention(q, k, v, sinks=sinks, **kw), want) < 1e-5
    assert rel(prepared(q, k, v), reference(q, k, v, keep=_keep, offset=m - n)) < 1e-5


def test_prepared_with_a_buffer():
    slopes = torch.tensor([0.5, 0.25], dtype=torch.float32)
    q, k, v = randn(1, 2, 1, 16, seed=1), randn(1, 2, 30, 16, seed=2), randn(1, 2, 30, 16,
                                                                            seed=3)
    kw = dict(score_mod=ops.AlibiSlopes(), q_offset="end", buffers={"slopes": slopes},
              schedule=SPLIT, cache=AttentionCache())
    prepared = nf.prepare_attention(q, k, v, **kw)
    other = torch.tensor([0.125, 1.0], dtype=torch.float32)
    got = prepared(q, k, v, buffers={"slopes": other})
    want = nf.attention(q, k, v, **(kw | {"buffers": {"slopes": other}}))
    assert rel(got, want.double()) < 1e-3


def test_another_signature_takes_the_general_path():
    cache = AttentionCache()
    q, k, v = randn(1, 2, 1, 16, seed=1), randn(1, 2, 30, 16, seed=2), randn(1, 2, 30, 16,
                                                                            seed=3)
    prepared = nf.prepare_attention(q, k, v, q_offset="end", schedule=SPLIT, cache=cache)
    k2, v2 = randn(1, 2, 31, 16, seed=4), randn(1, 2, 31, 16, seed=5)   # one key more
    out = prepared(q, k2, v2)
    assert out is not prepared.output
    assert rel(out, reference(q, k2, v2)) < 5e-3
    k3 = k.clone().requires_grad_()
    out = prepared(q, k3, v)   # the general path: differentiable, not a silent cut
    assert out.grad_fn is not None and rel(out.detach(), reference(q, k, v)) < 5e-3


def test_what_cannot_be_prepared_is_refused():
    q, v = randn(1, 2, 1, 16, seed=1), randn(1, 2, 30, 16, seed=3)
    k = randn(1, 2, 16, 30, seed=2).transpose(2, 3)   # last dimension strided
    with pytest.raises(FeedError, match="k .* is not laid out as the kernel reads it"):
        nf.prepare_attention(q, k, v, q_offset="end", schedule=SPLIT)
