"""The serving surface in the bounded fuzz campaign: random ragged (``kv_lens``) and paged
(``block_table``) caches through ``nf.attention``, against a float64 reference computed per
sequence (docs/serving.md).

Each example draws a batch of sequences with lengths from 0 to the cache's capacity
(page boundaries favoured), one to four queries per sequence at the end of each (the
positions the mods see), GQA, a score and a mask mod, a dtype and a schedule; the values
past each length and in the pages no sequence uses are NaN, and table entries past a
sequence's pages point outside the pool, so a kernel that reads either fails. Every
example calls twice on one cache, through ``nf.attention`` and through one prepared call
bound on the first: a second set of lengths (and, paged, a reshuffled pool) must give its
own right answer with the first call's kernels. The second call also runs with
``return_lse=True`` (the log-sum-exp against float64, ``-inf`` exactly where a row sees
no key) and into a transposed ``out=`` buffer.

The 2026-12-04 campaign (about 1,700 cases, tests/serving/test_fuzz_finds.py) ran as a
script; this keeps its core in the suite. ``NF_FUZZ`` sizes it as the rest of tests/fuzz.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fuzz.test_fuzz import DTYPES, FUZZ, MASKS, SCORE_MODS, _examples, modded
from neptune_fusion.frontend.attention import AttentionCache, attention
from neptune_fusion.frontend.prepared import prepare_attention
from neptune_fusion.schedule.schedule import Schedule

D = 16
SCHEDULES = {"auto": None,
             "split": Schedule(block_m=16, block_n=16, strategy="split", splits=3),
             "rolling": Schedule(block_m=16, block_n=32)}
OUTSIDE = 10 ** 6     # a table entry no sequence reaches


def reference(q, keys, vals, lens, score, keep, slopes):
    """float64 attention of sequence ``b`` over its ``lens[b]`` keys (``keys[b]``:
    ``(Hkv, >= lens[b], D)``), its queries at ``lens[b] - N ...``: ``(out, lse)``, a row
    with no key 0 and ``-inf``."""
    b_, hq, n, _ = q.shape
    out = torch.zeros(b_, hq, n, vals[0].shape[-1], dtype=torch.float64)
    lse = torch.full((b_, hq, n), float("-inf"), dtype=torch.float64)
    for b in range(b_):
        m = int(lens[b])
        g = hq // keys[b].shape[0]
        k = keys[b][:, :m].double().repeat_interleave(g, 0)
        v = vals[b][:, :m].double().repeat_interleave(g, 0)
        s = modded(q[b].double() @ k.transpose(-1, -2) * D ** -0.5,
                   torch.arange(n) + (m - n), m, score, keep, slopes)
        out[b] = torch.softmax(s, -1).nan_to_num(0.0) @ v
        if m:
            lse[b] = torch.logsumexp(s, -1)
    return out, lse


def cache(lens, hkv, page, max_pages, dtype, gen):
    """``(k, v, block_table or None, keys, vals)``: the cache holding each sequence's
    keys (``keys[b]``, ``(Hkv, capacity, D)``, NaN past its length); ``page`` 0: a
    contiguous cache of ``max_pages * 16`` keys."""
    cap = max_pages * (page or 16)
    keys = [torch.randn(hkv, cap, D, generator=gen).to(dtype) for _ in lens]
    vals = [torch.randn(hkv, cap, D, generator=gen).to(dtype) for _ in lens]
    for k, v, x in zip(keys, vals, lens):
        k[:, x:] = float("nan")
        v[:, x:] = float("nan")
    if not page:
        return torch.stack(keys), torch.stack(vals), None, keys, vals
    pages = len(lens) * max_pages + 2
    kp = torch.full((pages, hkv, page, D), float("nan"), dtype=dtype)
    vp = torch.full_like(kp, float("nan"))
    order = torch.randperm(pages, generator=gen).tolist()
    table = torch.full((len(lens), max_pages), OUTSIDE, dtype=torch.int32)
    for b, x in enumerate(lens):
        for p in range(-(-x // page)):
            at = order.pop()
            table[b, p] = at
            kp[at] = keys[b][:, p * page:(p + 1) * page]
            vp[at] = vals[b][:, p * page:(p + 1) * page]
    return kp, vp, table, keys, vals


def lengths(b: int, cap: int):
    """``b`` lengths in ``[0, cap]``, page and tile boundaries favoured."""
    edges = sorted({0, 1, 15, 16, 17, 31, 32, 33, cap - 1, cap} & set(range(cap + 1)))
    one = st.one_of(st.sampled_from(edges), st.integers(0, cap))
    return st.lists(one, min_size=b, max_size=b)


DRAWS = dict(data=st.data(), b=st.integers(1, 3), hkv=st.integers(1, 2),
             group=st.sampled_from((1, 2, 4)), n=st.sampled_from((1, 2, 4)),
             page=st.sampled_from((0, 16, 32)), max_pages=st.integers(1, 3),
             dtype=st.sampled_from(sorted(DTYPES)), score=st.sampled_from(sorted(SCORE_MODS)),
             mask=st.sampled_from(sorted(MASKS)), schedule=st.sampled_from(sorted(SCHEDULES)),
             seed=st.integers(0, 2 ** 31 - 1))


@settings(max_examples=_examples(12, 300), **FUZZ)
@given(**DRAWS)
def test_fuzz_ragged_and_paged_caches(**drawn):
    check("cpu", **drawn)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@settings(max_examples=_examples(12, 300), **FUZZ)
@given(**DRAWS)
def test_fuzz_ragged_and_paged_caches_on_gpu(**drawn):
    """The generated kernels compiled for the GPU (explicit schedules: "auto" would tune
    every shape class drawn)."""
    assume(drawn["schedule"] != "auto")
    check("cuda", **drawn)


def check(device, data, b, hkv, group, n, page, max_pages, dtype, score, mask, schedule,
          seed):
    tdtype, tol = DTYPES[dtype]
    gen = torch.Generator().manual_seed(seed)
    hq = hkv * group
    cap = max_pages * (page or 16)
    score_mod, score_ref = SCORE_MODS[score]
    mask_mod, keep = MASKS[mask]
    slopes = torch.rand(hq, generator=gen) * 0.5 if score == "slopes" else None
    q = torch.randn(b, hq, n, D, generator=gen).to(tdtype)
    shared = AttentionCache(store=False)
    bufs = {"slopes": slopes.to(device)} if slopes is not None else None
    kw = dict(score_mod=score_mod, mask_mod=mask_mod, enable_gqa=group > 1, buffers=bufs,
              cache=shared, schedule=SCHEDULES[schedule])
    prepared, other = None, AttentionCache(store=False)
    for call in range(2):    # new lengths (and pages) on the first call's kernels
        lens = data.draw(lengths(b, cap), label=f"lens {call}")
        k, v, table, keys, vals = cache(lens, hkv, page, max_pages, tdtype, gen)
        kv_lens = torch.tensor(lens, dtype=torch.int32)
        want, want_lse = reference(q, keys, vals, lens, score_ref, keep, slopes)
        qd, k, v, kv_lens = (t.to(device) for t in (q, k, v, kv_lens))
        table = None if table is None else table.to(device)
        outs = {"call": attention(qd, k, v, kv_lens=kv_lens, block_table=table, **kw)}
        if prepared is None:     # bound to the first call's signature, run on both
            prepared = prepare_attention(qd, k, v, kv_lens=kv_lens, block_table=table, **kw)
        outs["prepared"] = prepared(qd, k, v, bufs, kv_lens, table).clone()
        if call:     # the state for a merge, and a strided output (kernels of their own)
            kw2 = dict(kw, cache=other)
            got, lse = attention(qd, k, v, kv_lens=kv_lens, block_table=table,
                                 return_lse=True, **kw2)
            outs["return_lse"] = got
            lse = lse.cpu().double()
            assert torch.equal(lse.isneginf(), want_lse.isneginf()), "rows with no key"
            fin = want_lse.isfinite()
            if fin.any():
                err = float((lse[fin] - want_lse[fin]).abs().max())
                assert err <= tol * max(1.0, float(want_lse[fin].abs().max())), err
            buf = torch.empty(b, n, hq, D, dtype=tdtype, device=device)
            outs["out="] = attention(qd, k, v, kv_lens=kv_lens, block_table=table,
                                     out=buf.transpose(1, 2), **kw2)
        for how, out in outs.items():
            out = out.cpu()
            assert out.shape == want.shape and out.dtype == tdtype
            assert torch.isfinite(out).all(), f"{how} {call}: a non-finite value"
            err = float((out.double() - want).abs().max())
            assert err <= tol * max(1.0, float(want.abs().max())), (how, call, err)
    assert len(shared.kernels()) == 1, "new lengths or pages compiled another kernel"
