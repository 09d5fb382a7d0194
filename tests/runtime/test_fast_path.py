"""The steady-state eager path: cached call setups (Kernel) and call setups (attention).

A signature seen before skips the checks; these tests pin that a *new* signature (another
length, a wrong dtype, a strided view) is still fully checked after good calls, and that
repeated calls give identical outputs.
"""

from __future__ import annotations

import pytest
import torch

from neptune_fusion import ops
from neptune_fusion.errors import FeedError, SizeBindingError
from neptune_fusion.frontend.attention import (
    AttentionCache,
    AttentionSpec,
    attention,
    attention_definition,
)
from neptune_fusion.runtime.pipeline import compile as nf_compile
from neptune_fusion.schedule.schedule import Schedule

SMALL = Schedule(block_m=16, block_n=16)


def randn(*shape, dtype=torch.float16, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.fixture(scope="module")
def kern():
    spec = AttentionSpec("float16", 2, 2, 32, 32, 32 ** -0.5, mask_mod=ops.Causal())
    outs, ins = attention_definition(spec)
    return nf_compile(outs[0], ins, schedule=SMALL, name="fast_path")


def test_kernel_repeated_calls_identical_and_new_length_validated(kern):
    q, k, v = (randn(1, 2, 20, 32, seed=s) for s in range(3))
    first = kern(q, k, v)
    assert torch.equal(kern(q, k, v), first)          # the cached plan
    assert kern.cache_info() == (1, 1, 256, 1)          # (hits, misses, maxsize, currsize)
    q2, k2, v2 = (randn(1, 2, 37, 32, seed=s) for s in range(3))
    other = kern(q2, k2, v2)                          # a new signature: a new plan
    assert other.shape == (1, 2, 37, 32) and kern.cache_info().currsize == 2
    assert torch.equal(kern(q, k, v), first)
    with pytest.raises(FeedError, match=r"argument 1 \('k'\) must be float16, got float32"):
        kern(q2, k2.float(), v2)
    with pytest.raises(SizeBindingError):
        kern(q, k2, v)                                # M bound to 37 by k, 20 by v
    with pytest.raises(FeedError, match=r"'k'\) must have unit stride"):
        kern(q, randn(1, 2, 32, 20).transpose(2, 3), v)
    with pytest.raises(FeedError, match=r"argument 2 \('v'\) must be a torch tensor"):
        kern(q, k, v.numpy())
    assert torch.equal(kern(q, k, v), first)          # errors leave the plans intact


def test_attention_call_plan_revalidates_new_signatures():
    cache = AttentionCache()
    q, k, v = randn(1, 4, 1, 32, seed=0), randn(1, 2, 40, 32, seed=1), \
        randn(1, 2, 40, 32, seed=2)

    def run(q, k, v, **kw):
        return attention(q, k, v, mask_mod=ops.Causal(), enable_gqa=True, q_offset=39,
                         cache=cache, **kw)

    first = run(q, k, v)
    assert torch.equal(run(q, k, v), first)
    assert (cache.misses, cache.hits) == (1, 1)       # a call-setup hit counts as a hit
    k2, v2 = randn(1, 2, 41, 32, seed=1), randn(1, 2, 41, 32, seed=2)
    assert attention(q, k2, v2, mask_mod=ops.Causal(), enable_gqa=True, q_offset=40,
                     cache=cache).shape == q.shape
    with pytest.raises(FeedError, match="attention: k is torch.int32"):
        run(q, k.to(torch.int32), v)
    with pytest.raises(FeedError, match="q, k, v must share a dtype"):
        run(q, k.float(), v)
    with pytest.raises(FeedError, match="pass enable_gqa=True"):
        attention(q, k, v, mask_mod=ops.Causal(), q_offset=39, cache=cache)
    with pytest.raises(FeedError, match="q_offset must be an int"):
        attention(q, k, v, mask_mod=ops.Causal(), enable_gqa=True, q_offset=True,
                  cache=cache)
    with pytest.raises(FeedError, match="must be a torch tensor"):
        run(q, k, v.numpy())
    assert torch.equal(run(q, k, v), first)
