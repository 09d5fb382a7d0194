"""What the CPU fuzzing of the serving surface found (2026-12-04, docs/serving.md):

* a paged cache's call key took the query-offset mode from the *page size* (dimension 2
  of the pool), not the cache length ``max_pages * page_size``: an int ``q_offset`` equal
  to ``page_size - N`` was keyed as ``"end"``, and a later ``q_offset="end"`` call found
  that setup and ran with the offset of the first (a wrong answer);
* the same key let an int ``q_offset`` through with ``kv_lens`` once a ``"end"`` call
  had made the setup (refused on a first call: the two disagreed);
* the prepared and bound calls' signature gave every tensor off CUDA the device index -1,
  so a ``kv_lens`` or ``block_table`` on ``meta`` matched a CPU binding: a raw torch
  error instead of the ``FeedError`` naming the tensor.
"""

from __future__ import annotations

import math

import pytest
import torch

import neptune_fusion as nf
from neptune_fusion import ops
from neptune_fusion.errors import FeedError
from neptune_fusion.frontend.attention import AttentionCache


def _pool(seed, pages=5, hkv=2, ps=16, d=16, hq=4, n=1, max_pages=2):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, hq, n, d, generator=g)
    kp = torch.randn(pages, hkv, ps, d, generator=g)
    vp = torch.randn(pages, hkv, ps, d, generator=g)
    table = torch.randperm(pages, generator=g)[:max_pages].to(torch.int32)[None]
    return q, kp, vp, table


def _causal_reference(q, kp, vp, table, offset):
    """float64: the keys of the table's pages in order, query row r at ``offset + r``,
    key j kept when ``j <= offset + r``."""
    k = kp[table[0].long()].double().permute(1, 0, 2, 3).flatten(1, 2)   # (Hkv, M, D)
    v = vp[table[0].long()].double().permute(1, 0, 2, 3).flatten(1, 2)
    hq, n, d = q.shape[1:]
    k = k.repeat_interleave(hq // k.shape[0], 0)
    v = v.repeat_interleave(hq // v.shape[0], 0)
    s = q[0].double() @ k.transpose(-1, -2) / math.sqrt(d)
    pos = torch.arange(n)[:, None] + offset
    s = s.masked_fill(torch.arange(k.shape[1])[None, :] > pos, -math.inf)
    return (torch.softmax(s, -1) @ v)[None]


@pytest.mark.parametrize("n", [1, 3])
def test_paged_end_offset_is_not_the_page_size_offset(n):
    q, kp, vp, table = _pool(seed=n, n=n)
    cache = AttentionCache(store=False)
    kw = dict(block_table=table, mask_mod=ops.Causal(), enable_gqa=True, cache=cache)
    m = table.shape[1] * kp.shape[2]
    for off, at in ((kp.shape[2] - n, kp.shape[2] - n), ("end", m - n), (m - n, m - n)):
        out = nf.attention(q, kp, vp, q_offset=off, **kw)
        torch.testing.assert_close(out.double(), _causal_reference(q, kp, vp, table, at),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("paged", [False, True])
def test_int_offset_with_kv_lens_is_refused_after_an_end_call(paged):
    q, kp, vp, table = _pool(seed=7)
    lens = torch.tensor([20], dtype=torch.int32)
    if paged:
        k, v, kw = kp, vp, dict(block_table=table)
        m = table.shape[1] * kp.shape[2]
    else:
        k = kp[table[0].long()].permute(1, 0, 2, 3).flatten(1, 2)[None].contiguous()
        v = vp[table[0].long()].permute(1, 0, 2, 3).flatten(1, 2)[None].contiguous()
        kw, m = {}, k.shape[2]
    kw.update(kv_lens=lens, mask_mod=ops.Causal(), enable_gqa=True,
              cache=AttentionCache(store=False))
    out = nf.attention(q, k, v, q_offset="end", **kw)
    want = _causal_reference(q, kp, vp, table, 19)   # causal at 19: the first 20 keys
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    for _ in range(3):   # the general path, then the bound one
        with pytest.raises(FeedError, match="q_offset"):
            nf.attention(q, k, v, q_offset=m - 1, **kw)


@pytest.mark.parametrize("which", ["kv_lens", "block_table"])
def test_meta_kv_tensors_after_a_cpu_binding_name_the_tensor(which):
    q, kp, vp, table = _pool(seed=3)
    lens = torch.tensor([25], dtype=torch.int32)
    cache = AttentionCache(store=False)
    kw = dict(enable_gqa=True, cache=cache)
    for _ in range(3):   # seen, bound, launched bound
        out = nf.attention(q, kp, vp, kv_lens=lens, block_table=table, **kw)
    want = _causal_reference(q, kp, vp, table, 24)   # causal at the end = the first 25
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    bad = dict(kv_lens=lens, block_table=table)
    bad[which] = bad[which].to("meta")
    with pytest.raises(FeedError, match=f"{which} is on meta"):
        nf.attention(q, kp, vp, **bad, **kw)
    step = nf.prepare_attention(q, kp, vp, kv_lens=lens, block_table=table, **kw)
    with pytest.raises(FeedError, match=f"{which} is on meta"):
        step(q, kp, vp, **bad)
    with pytest.raises(FeedError, match="meta"):   # every input on meta: no launch
        nf.attention(q.to("meta"), kp.to("meta"), vp.to("meta"),
                     **{n: t.to("meta") for n, t in bad.items()}, **kw)
