"""Ragged and paged decode under the split-k schedules the auto-scheduler now picks for
them (issue 17), on the CPU interpreter against a float64 reference per sequence: a split
count that does not divide the capacity, sequences of length 0 and of the full capacity,
NaN in every cache slot past a length (a kernel that reads one fails)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from neptune_fusion import ops
from neptune_fusion.frontend.attention import AttentionCache
from neptune_fusion.frontend.attention import attention as nf_attention
from neptune_fusion.schedule.cost import rank
from neptune_fusion.schedule.schedule import Schedule
from neptune_fusion.schedule.space import candidates, wants_split

D, HQ, HKV, PS = 32, 4, 2, 16
# the H200's first choices for the serving suite's B = 8 and B = 64 ragged problems
# (tests/schedule/test_ragged_split.py), here over a short cache that neither divides
B8_FIRST = Schedule(block_m=16, block_n=128, num_warps=4, num_stages=3, strategy="split",
                    splits=10)
B64_FIRST = Schedule(block_m=16, block_n=64, num_warps=4, num_stages=3, strategy="split",
                     splits=4)


def _reference(q, keys, vals, lens, causal):
    """float64 attention of sequence b over its first ``lens[b]`` keys (queries last)."""
    b_, hq, n, d = q.shape
    out = torch.zeros(b_, hq, n, d, dtype=torch.float64)
    for b, m in enumerate(lens):
        k = keys[b][:, :m].double().repeat_interleave(hq // keys[b].shape[0], 0)
        v = vals[b][:, :m].double().repeat_interleave(hq // vals[b].shape[0], 0)
        s = q[b].double() @ k.transpose(-1, -2) / math.sqrt(d)
        if causal:
            pos = torch.arange(n)[:, None] + (m - n)
            s = s.masked_fill(torch.arange(m)[None, :] > pos, -math.inf)
        out[b] = (torch.softmax(s, -1).nan_to_num(0.0) @ v)
    return out


def _inputs(lens, cap, n, page, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(len(lens), HQ, n, D, generator=g)
    keys = [torch.randn(HKV, cap, D, generator=g) for _ in lens]
    vals = [torch.randn(HKV, cap, D, generator=g) for _ in lens]
    for x, k, v in zip(lens, keys, vals):
        k[:, x:] = float("nan")       # past the length: must never reach the output
        v[:, x:] = float("nan")
    kl = torch.tensor(lens, dtype=torch.int32)
    if not page:
        return q, torch.stack(keys), torch.stack(vals), kl, None, keys, vals
    per = cap // page
    pages = len(lens) * per + 2
    order = torch.randperm(pages, generator=g)      # a shuffled pool with spare pages
    kp = torch.full((pages, HKV, page, D), float("nan"))
    vp = torch.full((pages, HKV, page, D), float("nan"))
    table = torch.empty(len(lens), per, dtype=torch.int32)
    for b in range(len(lens)):
        for j in range(per):
            pid = int(order[b * per + j])
            table[b, j] = pid
            kp[pid] = keys[b][:, j * page:(j + 1) * page]
            vp[pid] = vals[b][:, j * page:(j + 1) * page]
    return q, kp, vp, kl, table, keys, vals


@pytest.mark.parametrize("sched", [B8_FIRST, B64_FIRST], ids=["k10x128", "k4x64"])
@pytest.mark.parametrize("page", [0, PS])
@pytest.mark.parametrize("n", [1, 4])
def test_split_decode_matches_float64(sched, page, n):
    cap = 19 * PS                      # 304 keys: 10 and 4 splits of 128 / 64-key tiles
    lens = [0, cap, 1, 150, cap - 1]   # a length-0 sequence under split-k, a full one
    q, k, v, kl, table, keys, vals = _inputs(lens, cap, n, page, seed=n + page)
    cache = AttentionCache(store=False)
    out = nf_attention(q, k, v, kv_lens=kl, block_table=table, enable_gqa=True,
                       mask_mod=ops.Causal() if n > 1 else None, cache=cache,
                       schedule=sched)
    [kern] = cache.kernels()
    assert [g.program.split.stage for g in kern.kernels] == ["partial", "combine"]
    assert torch.isfinite(out).all()
    want = _reference(q, keys, vals, lens, causal=n > 1)
    assert (out.double() - want).abs().max().item() < 1e-5
    assert out[0].abs().max().item() == 0.0       # no key: zeros


def test_auto_picks_split_for_a_long_ragged_cache_and_matches_float64():
    """schedule="auto" on CPU (the cost model alone): 4 sequences x 2 kv heads fill the
    interpreter's 8 "multiprocessors", so a padded cache of this shape runs rolling; with
    kv_lens the ragged rule offers split-k, the model picks it, and it is correct."""
    cap = 4096
    lens = [0, 4096, 37, 2049]
    q, k, v, kl, table, keys, vals = _inputs(lens, cap, 1, 0, seed=3)
    cache = AttentionCache(store=False)
    out = nf_attention(q, k, v, kv_lens=kl, enable_gqa=True, cache=cache)
    [kern] = cache.kernels()
    chosen = kern.last_choice.schedule
    assert chosen.strategy == "split" and chosen.splits > 1
    problem, device, space = kern.space_for(q.reshape(4, HKV, HQ // HKV, D), k, v, kl)
    assert problem.lengths == 4 and not wants_split(problem, device)
    dense = replace(problem, lengths=0)
    assert rank(dense, candidates(dense, device), device)[0].schedule.strategy == "rolling"
    want = _reference(q, keys, vals, lens, causal=False)
    assert (out.double() - want).abs().max().item() < 1e-5
