"""The auto-scheduler's choice for ragged and paged decode (issue 17): a loop whose length
is device data (``kv_lens``) is priced at the worst case its shape class allows -- one
sequence at the full capacity on the critical path -- so split-k ranks first on the H200
at B = 8 and at B = 64 (where the rolling kernel alone fills the GPU), next to rolling."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.frontend.attention import AttentionSpec, attention_definition
from neptune_fusion.schedule.cost import estimate, ragged_terms, rank
from neptune_fusion.schedule.schedule import Schedule
from neptune_fusion.schedule.space import (
    H200,
    RAGGED_SPLIT_MIN,
    Problem,
    candidates,
    wants_ragged_split,
)

CAP, HQ, HKV, D = 32768, 32, 8, 128


def _problem(batch: int, page: int = 0, kv_lens: bool = True) -> Problem:
    """The serving suite's problem (32/8 heads, packed decode, fp16, capacity 32K) as the
    auto-scheduler builds it from the kernel's own tile program (no 32K cache is
    allocated: the tensors are broadcast views)."""
    spec = AttentionSpec("float16", HQ, HKV, D, D, D ** -0.5, q_offset="end", packed=True,
                         kv_lens=kv_lens, page_size=page,
                         max_pages=CAP // page if page else 0)
    [o], ins = attention_definition(spec)
    one = torch.zeros(1, 1, 1, D, dtype=torch.float16)   # unit stride in the last dim
    q = one.expand(batch, HKV, HQ // HKV, D)
    kv = one.expand(batch * CAP // page, HKV, page, D) if page else \
        one.expand(batch, HKV, CAP, D)
    t = [q, kv, kv]
    if kv_lens:
        t.append(torch.full((batch,), 7, dtype=torch.int32))
    if page:
        t.append(torch.zeros(batch, CAP // page, dtype=torch.int32))
    return nf.compile(o, ins, cache=False).space_for(*t)[0]


def _splits(e) -> int:
    return e.schedule.splits if e.schedule.strategy == "split" else 1


@pytest.mark.parametrize("batch,page", [(8, 0), (64, 0), (8, 16), (64, 64)])
def test_ragged_problem_knows_its_lengths(batch, page):
    p = _problem(batch, page)
    assert p.lengths == batch and p.loop == CAP and p.rows == HQ // HKV
    assert p.programs == batch * HKV and wants_ragged_split(p)


@pytest.mark.parametrize("page", [0, 16])
def test_a_cache_without_kv_lens_has_no_data_lengths(page):
    """A padded cache, or a paged one whose sequences all fill ``max_pages`` pages."""
    p = _problem(8, page, kv_lens=False)
    assert p.lengths == 0 and not wants_ragged_split(p)


@pytest.mark.parametrize("batch", [8, 64])
@pytest.mark.parametrize("page", [0, 16])
def test_ragged_decode_ranks_split_k_first(batch, page):
    p = _problem(batch, page)
    ranked = rank(p, candidates(p, H200), H200)
    assert ranked[0].schedule.strategy == "split"
    top = [(_splits(e), e.schedule.block_n) for e in ranked[:4]]
    # the four a GPU measures: the best split count at two loop tiles, then two other
    # split counts
    assert top[0][0] == top[1][0] and top[0][1] != top[1][1]
    assert len({k for k, _ in top}) == 3
    # the same shape without kv_lens (every sequence at the capacity) is not moved
    dense = replace(p, lengths=0)
    assert rank(dense, candidates(dense, H200), H200)[0].schedule.splits <= 2


def test_b64_offers_splits_next_to_rolling():
    p = _problem(64)
    space = candidates(p, H200)
    assert {2, 4, 8} <= {s.splits for s in space if s.strategy == "split"}
    assert any(s.strategy == "rolling" and s.block_m == 16 and s.block_n == 32
               for s in space)
    top = [_splits(e) for e in rank(p, space, H200)[:6]]
    assert 1 in top        # rolling ranks next: the model prices a worst case
    # the dense B = 64 batch keeps rolling only (the rolling kernel fills the GPU)
    dense = replace(p, lengths=0)
    assert {s.strategy for s in candidates(dense, H200)} == {"rolling"}


def test_short_ragged_loop_gets_no_extra_splits():
    p = replace(_problem(64), loop=RAGGED_SPLIT_MIN // 2,
                streamed=64 * HKV * RAGGED_SPLIT_MIN // 2 * 2 * D * 2)
    assert not wants_ragged_split(p)
    assert {s.strategy for s in candidates(p, H200)} == {"rolling"}


def test_ragged_terms_price_the_critical_path():
    """Split-k divides the longest program's chunk (at one SM's share of the bandwidth);
    one instance (B = 1) has no spread of lengths to pay for."""
    p = _problem(64)
    roll = Schedule(block_m=16, block_n=64, num_warps=4, num_stages=3)
    split = replace(roll, strategy="split", splits=4)
    dense = replace(p, lengths=0)
    for s in (roll, split):
        extra = estimate(p, s, H200).seconds - estimate(dense, s, H200).seconds
        k = s.splits if s.strategy == "split" else 1
        chunk = -(-CAP // k) * 2 * D * 2
        progs = p.programs * k
        assert extra == pytest.approx(ragged_terms(p, chunk, progs, H200))
        assert extra > (1 - 1 / 64) * chunk / (H200.bandwidth / H200.sms)
    one = replace(p, lengths=1, programs=HKV)
    assert ragged_terms(one, 2 ** 20, 8, H200) < 1e-5      # the start only
    assert ragged_terms(p, 2 ** 20, 8, H200) > 2 ** 20 * H200.sms / H200.bandwidth * 0.9


def _prefill_problem(kv_lens: bool, n: int = 4096, cap: int = 4168) -> Problem:
    """A causal bf16 prefill of ``n`` queries, last in a cache of ``cap`` slots (the
    Hugging Face static cache: Llama-shaped, 32/8 heads, head dim 64), with and without
    device lengths."""
    from neptune_fusion import ops
    spec = AttentionSpec("bfloat16", HQ, HKV, 64, 64, 0.125, mask_mod=ops.Causal(),
                         q_offset=0 if kv_lens else "end", kv_lens=kv_lens)
    [o], ins = attention_definition(spec)
    one = torch.zeros(1, 1, 1, 64, dtype=torch.bfloat16)
    t = [one.expand(1, HQ, n, 64), one.expand(1, HKV, cap, 64), one.expand(1, HKV, cap, 64)]
    if kv_lens:
        t.append(torch.full((1,), cap, dtype=torch.int32))
    return nf.compile(o, ins, cache=False).space_for(*t)[0]


def test_a_causal_prefill_over_a_cache_ranks_as_without_kv_lens():
    """With kv_lens the loop bound is device data; the visited share is priced with the
    lengths at the capacity (queries at its end), so the cost model sees the causal skip
    it sees without kv_lens, and a prefill's program starts are not priced as a decode's:
    the same schedule ranks first (was: every tile visited, a start per program, and
    128-row tiles first -- 0.200 ms on the H200 against 0.189 for the 64-row tiles)."""
    ragged, dense = _prefill_problem(True), _prefill_problem(False)
    assert ragged.lengths == 1 and dense.lengths == 0
    shares = {(bm, bn): f for bm, bn, f in ragged.visits}
    assert shares == {(bm, bn): f for bm, bn, f in dense.visits}
    assert all(0.5 < f < 0.6 for (bm, _), f in shares.items() if bm < 4096)
    first = [rank(p, candidates(p, H200), H200)[0].schedule for p in (ragged, dense)]
    assert first[0] == first[1] and first[0].block_m == 64


@pytest.mark.parametrize("batch,page", [(1, 16), (1, 64), (1, 0), (8, 16), (64, 64)])
def test_one_program_per_sm_gathers_deeper(batch, page):
    """A paged loop pipelines its gathers 2s - 1 deep exactly where its programs fit one
    per multiprocessor (B = 1: 8 heads x 16 splits = 128 on 132); a contiguous cache and
    a batch that fills the GPU keep the plain loop (space.gather_depth)."""
    p = _problem(batch, page)
    assert p.gathers == bool(page)
    for s in candidates(p, H200):
        programs = -(-p.rows // s.block_m) * p.programs * (s.splits if s.strategy == "split"
                                                           else 1)
        deep = bool(page) and s.num_stages >= 3 and programs <= H200.sms
        assert s.gather_stages == (2 * s.num_stages - 1 if deep else 0), s
    best = rank(p, candidates(p, H200), H200)[0].schedule
    assert (best.gather_stages > 0) == (batch == 1 and page > 0)
