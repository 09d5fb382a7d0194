"""nf.attention: FlexAttention-style mods, the shape-class cache, offsets and buffers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from algebra.chains import FUSABLE
from neptune_fusion import ops
from neptune_fusion.frontend.attention import AttentionCache, attention
from neptune_fusion.runtime.pipeline import compile as nf_compile
from neptune_fusion.schedule.schedule import Schedule

SMALL = Schedule(block_m=16, block_n=16)


def reference(q, k, v, score_mod=None, keep=None, offset=0, scale=None):
    """Float64 torch attention: scores, then score_mod(s, h, i, j), then the mask."""
    q, k, v = (t.double() for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) * (scale or q.shape[-1] ** -0.5)
    i = torch.arange(q.shape[2])[:, None] + offset
    j = torch.arange(k.shape[2])[None, :]
    h = torch.arange(q.shape[1])[:, None, None]
    if score_mod is not None:
        s = score_mod(s, h, i, j)
    if keep is not None:
        s = s.masked_fill(~keep(h, i, j), float("-inf"))
    return torch.softmax(s, -1) @ v


def rel(a, b):
    return float((a.double() - b).norm() / b.norm())


def randn(*shape, dtype=torch.float16, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_one_kernel_per_shape_class():
    cache = AttentionCache()
    causal = ops.Causal()
    for b, n in ((1, 20), (2, 37), (1, 53)):  # batch and length are symbolic sizes
        q, k, v = (randn(b, 2, n, 32, seed=s) for s in range(3))
        out = attention(q, k, v, mask_mod=causal, cache=cache, schedule=SMALL)
        keep = lambda h, i, j: j <= i  # noqa: E731
        assert rel(out, reference(q, k, v, keep=keep)) < 5e-3
    assert (len(cache), cache.misses, cache.hits) == (1, 1, 2)
    attention(q.float(), k.float(), v.float(), mask_mod=causal, cache=cache, schedule=SMALL)
    attention(q, k, v, mask_mod=ops.SlidingWindow(8), cache=cache, schedule=SMALL)
    assert len(cache) == 3  # a new dtype, a new mask: new classes
    cache.clear()
    assert len(cache) == 0


def test_custom_mods_and_grouped_heads():
    q, k, v = randn(1, 4, 33, 64, seed=1), randn(1, 2, 33, 64, seed=2), randn(1, 2, 33, 64, seed=3)

    def score_mod(s, b, h, i, j):  # relative position bias, stronger for odd heads
        return s + nf.cast(h % 2 + 1, "float32") * 0.05 * nf.cast(j - i, "float32")

    def mask_mod(b, h, i, j):
        return (j <= i) & ((i - j < 9) | (j < 4))  # a window plus 4 sink tokens

    out = attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod, enable_gqa=True,
                    cache=AttentionCache(), schedule=SMALL)
    want = reference(q, k, v, score_mod=lambda s, h, i, j: s + (h % 2 + 1) * 0.05 * (j - i),
                     keep=lambda h, i, j: (j <= i) & ((i - j < 9) | (j < 4)))
    assert rel(out, want) < 5e-3


@pytest.mark.parametrize("n", [1, 5])
def test_queries_at_the_end(n):
    """q_offset = M - N (decode, chunked prefill): one kernel serves every length."""
    cache = AttentionCache()
    for m in (29, 48):
        q, k, v = randn(1, 2, n, 64, seed=m), randn(1, 2, m, 64, seed=1), randn(1, 2, m, 64)
        out = attention(q, k, v, mask_mod=ops.Causal(), q_offset=m - n, cache=cache)
        want = reference(q, k, v, keep=lambda h, i, j: j <= i, offset=m - n)
        assert rel(out, want) < 5e-3
    assert len(cache) == 1


def test_buffers_and_value_head_dim():
    q, k, v = randn(1, 3, 26, 64, seed=4), randn(1, 3, 26, 64, seed=5), randn(1, 3, 26, 32)
    slopes = torch.tensor([0.5, 0.25, 0.125])
    out = attention(q, k, v, score_mod=ops.AlibiSlopes(), mask_mod=ops.Causal(),
                    buffers={"slopes": slopes}, scale=0.1, cache=AttentionCache(),
                    schedule=SMALL)
    assert out.shape == (1, 3, 26, 32)
    want = reference(q, k, v, scale=0.1, keep=lambda h, i, j: j <= i,
                     score_mod=lambda s, h, i, j: s + slopes.double()[h] * (j - i))
    assert rel(out, want) < 5e-3


CHAINS = sorted(n for n in FUSABLE if n != "prod_chain")


@pytest.mark.parametrize("name", CHAINS)
def test_catalogue_chains_compile_to_one_kernel(name):
    outs, feeds = FUSABLE[name]()
    # fusable: one kernel when asked for (LayerNorm -> matmul takes two passes by default,
    # the cheaper plan: docs/algebra.md, section 3)
    kernel = nf_compile(outs, block_m=16, block_n=16, require_single_pass=True)
    f = feeds(np.random.default_rng(7))
    tensors = [torch.tensor(f[p.name]).to(getattr(torch, p.dtype.name)) for p in kernel.inputs]
    want = nf.evaluate(outs, {p: t.double().numpy() for p, t in zip(kernel.inputs, tensors)})
    got = kernel(*tensors)
    tol = 5e-3 if any(p.dtype.name == "float16" for p in kernel.inputs) else 1e-5
    for g, w in zip(got, want):
        assert np.linalg.norm(g.double().numpy() - w) <= tol * np.linalg.norm(w), name
    assert len(kernel.kernels) == 1


def test_kernel_attributes():
    [o], ins = ops.definition("PF-Causal", "float32", 32, 2, 2)
    kernel = nf_compile(o, ins, block_m=16, block_n=16)
    assert kernel.plan.single_pass and kernel.program.name == "nf_o"
    assert kernel.source == kernel.kernels[0].source
    q, k, v = (randn(1, 2, 19, 32, dtype=torch.float32, seed=s) for s in range(3))
    out = kernel(q, k, v)
    assert rel(out, reference(q, k, v, keep=lambda h, i, j: j <= i)) < 1e-5
    assert math.isfinite(float(out.abs().max()))
