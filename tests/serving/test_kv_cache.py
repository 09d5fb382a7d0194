"""Ragged (``kv_lens``) and paged (``block_table``) KV caches of ``nf.attention``, on the
CPU interpreter, against a float64 reference computed per sequence; the values past each
sequence's length (and the pages no sequence uses) are NaN, so a kernel that reads them
into the result fails."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion import ops
from neptune_fusion.errors import FeedError
from neptune_fusion.frontend.attention import AttentionCache, AttentionSpec, attention_definition
from neptune_fusion.schedule.schedule import Schedule

PS = 16                               # page size
LENS = [0, 1, PS - 1, PS, PS + 1]     # the lengths every case covers
D = 32
SPLIT = Schedule(block_m=16, block_n=16, num_warps=4, strategy="split", splits=3)
ROLL = Schedule(block_m=16, block_n=32, num_warps=4)
# (q heads, kv heads, scale-free options) of the decode operators at test size
HEADS = {"DC-Causal": (2, 2), "DC-GQA": (4, 2), "DC-ALiBi": (2, 2), "DC-SoftCap": (4, 2)}


def _reference(q, keys, vals, lens, op, window=None):
    """float64 attention of each sequence over its own ``lens[b]`` keys, queries at
    ``lens[b] - N ...``; ``keys[b]``/``vals[b]`` are (Hkv, >= lens[b], D)."""
    b_, hq, n, d = q.shape
    out = torch.zeros(b_, hq, n, vals[0].shape[-1], dtype=torch.float64)
    for b in range(b_):
        m = int(lens[b])
        k = keys[b][:, :m].double().repeat_interleave(hq // keys[b].shape[0], 0)
        v = vals[b][:, :m].double().repeat_interleave(hq // vals[b].shape[0], 0)
        s = q[b].double() @ k.transpose(-1, -2) * d ** -0.5
        if op.softcap is not None:
            s = op.softcap * torch.tanh(s / op.softcap)
        pos = torch.arange(n, dtype=torch.float64)[:, None] + (m - n)
        j = torch.arange(m, dtype=torch.float64)[None, :]
        if op.alibi:
            slope = torch.exp2(-8.0 * torch.arange(1, hq + 1, dtype=torch.float64) / hq)
            s = s + slope[:, None, None] * (j - pos)
        keep = j <= pos if op.causal else torch.ones_like(j, dtype=torch.bool)
        if window is not None:
            keep = keep & (pos - j < window)
        s = s.masked_fill(~keep, -math.inf)
        p = torch.softmax(s, -1).nan_to_num(0.0)
        out[b] = p @ v
    return out


def _contiguous(lens, hq, hkv, n, m, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(len(lens), hq, n, D, generator=g).to(dtype)
    k = torch.randn(len(lens), hkv, m, D, generator=g).to(dtype)
    v = torch.randn(len(lens), hkv, m, D, generator=g).to(dtype)
    for b, x in enumerate(lens):    # garbage past each length: must never reach the output
        k[b, :, x:] = float("nan")
        v[b, :, x:] = float("nan")
    return q, k, v, torch.tensor(lens, dtype=torch.int32)


def _paged(lens, hq, hkv, n, max_pages, dtype, seed):
    """A shuffled page pool with spare (NaN) pages; unused table entries point nowhere."""
    g = torch.Generator().manual_seed(seed)
    pages = len(lens) * max_pages + 3
    q = torch.randn(len(lens), hq, n, D, generator=g).to(dtype)
    kp = torch.full((pages, hkv, PS, D), float("nan"), dtype=dtype)
    vp = torch.full((pages, hkv, PS, D), float("nan"), dtype=dtype)
    order = torch.randperm(pages, generator=g)
    table = torch.full((len(lens), max_pages), 10 ** 6, dtype=torch.int32)  # outside
    keys, vals, used = [], [], 0
    for b, x in enumerate(lens):
        k = torch.randn(hkv, max_pages * PS, D, generator=g).to(dtype)
        v = torch.randn(hkv, max_pages * PS, D, generator=g).to(dtype)
        k[:, x:] = float("nan")
        v[:, x:] = float("nan")
        for p in range(-(-x // PS)):
            page = int(order[used])
            used += 1
            table[b, p] = page
            kp[page] = k[:, p * PS:(p + 1) * PS]
            vp[page] = v[:, p * PS:(p + 1) * PS]
        keys.append(k)
        vals.append(v)
    return q, kp, vp, torch.tensor(lens, dtype=torch.int32), table, keys, vals


def _tol(dtype):
    return dict(rtol=2e-3, atol=2e-3) if dtype == torch.float16 else dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ops.DECODE)
@pytest.mark.parametrize("layout", ["ragged", "paged"])
def test_decode_operators(name, layout):
    """Every decode operator, ragged and paged, split-k, lengths 0, 1, page-1, page,
    page+1 (and a full cache); GQA operators pack their query heads."""
    op = ops.operator(name)
    hq, hkv = HEADS[name]
    lens = LENS + [3 * PS]
    dtype = torch.float16 if name == "DC-GQA" else torch.float32
    cache = AttentionCache(store=False)
    if layout == "ragged":
        q, k, v, kl = _contiguous(lens, hq, hkv, 1, 3 * PS, dtype, seed=len(name))
        out = ops.run(name, q, k, v, kv_lens=kl, cache=cache, schedule=SPLIT)
        keys, vals = list(k), list(v)
    else:
        q, k, v, kl, table, keys, vals = _paged(lens, hq, hkv, 1, 3, dtype, seed=len(name))
        out = ops.run(name, q, k, v, kv_lens=kl, block_table=table, cache=cache,
                      schedule=SPLIT)
    [kern] = cache.kernels()
    assert [g.program.split.stage for g in kern.kernels] == ["partial", "combine"]
    want = _reference(q, keys, vals, lens, op)
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), want, **_tol(dtype))


@pytest.mark.parametrize("layout", ["ragged", "paged"])
@pytest.mark.parametrize("n", [1, 20])
def test_boundary_tiles_keep_the_narrow_dot(layout, n):
    """The tiles at a sequence's end read ``where(j < kv_lens, v, 0)``: a masked load,
    so P @ V stays an fp16 product (not an emulated fp32 one, which made the ragged
    kernels 1.5-10x slower on the H200) and P is one exponential shared with the row
    sum. Prefill-sized (causal) and decode queries, against float64."""
    lens = [n + 3, PS + n, 3 * PS]
    cache = AttentionCache(store=False)
    sched = SPLIT if n == 1 else ROLL
    if layout == "ragged":
        q, k, v, kl = _contiguous(lens, 4, 2, n, 3 * PS, torch.float16, seed=n)
        keys, vals, table = list(k), list(v), None
    else:
        q, k, v, kl, table, keys, vals = _paged(lens, 4, 2, n, 3, torch.float16, seed=n)
    out = nf.attention(q, k, v, kv_lens=kl, block_table=table, mask_mod=ops.Causal(),
                       enable_gqa=True, cache=cache, schedule=sched)
    torch.testing.assert_close(out.double(), _reference(q, keys, vals, lens,
                                                        ops.OpSpec("x", "DC", 4, 2)),
                               **_tol(torch.float16))
    [kern] = cache.kernels()
    src = "\n".join(g.source for g in kern.kernels)
    assert "input_precision" not in src and "tl.float32), 0.0)" not in src
    for loop in src.split("    for j0")[1:]:   # the key loops
        assert loop.split("# ")[0].count("tl.exp2(") == 2   # the rescale and P
    if layout == "paged":   # a pointer per key (64-bit once per key), the page id clamped
        assert "kT = tl.load(k_rows[None, :] + offs_c[:, None])" in src
        assert "block_table >= 0" not in src and "tl.minimum(tl.maximum(block_table" in src


@pytest.mark.parametrize("layout", ["ragged", "paged"])
def test_four_queries_per_sequence(layout):
    """Speculative decoding: 4 queries at lens[b] - 4 ... lens[b] - 1, causal, with a
    sliding window; a sequence shorter than 4 has rows that see no key (zeros)."""
    op = ops.OpSpec("x", "DC", 4, 2, softcap=20.0)
    lens = [0, 2, PS - 1, PS, PS + 1]
    mask = ops.SlidingWindow(5)
    cache = AttentionCache(store=False)
    if layout == "ragged":
        q, k, v, kl = _contiguous(lens, 4, 2, 4, 2 * PS, torch.float32, seed=4)
        keys, vals, table = list(k), list(v), None
    else:
        q, k, v, kl, table, keys, vals = _paged(lens, 4, 2, 4, 2, torch.float32, seed=5)
    out = nf.attention(q, k, v, kv_lens=kl, block_table=table, score_mod=op.score_mod(),
                       mask_mod=mask, enable_gqa=True, cache=cache, schedule=ROLL)
    want = _reference(q, keys, vals, lens, op, window=5)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    assert out[0].abs().max() == 0 and out[1, :, :2].abs().max() == 0


def test_paged_without_lengths_reads_every_page():
    """A block table alone: every sequence is max_pages * page_size keys long, the query
    at the end (q_offset "end"), auto schedule."""
    lens = [2 * PS, 2 * PS]
    q, k, v, _, table, keys, vals = _paged(lens, 2, 2, 1, 2, torch.float32, seed=6)
    out = ops.attention(q, k, v, scale=D ** -0.5, causal=True, q_start=2 * PS - 1,
                        block_table=table, cache=AttentionCache(store=False))
    want = _reference(q, keys, vals, lens, ops.OpSpec("x", "DC", 2, 2))
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


def _dense_flags(kern) -> list[tuple[bool, ...]]:
    """The ``<pool>_DENSE`` constexprs of the partial kernel's launch steps so far."""
    spec = kern.specs[0]
    at = [i for i, a in enumerate(spec.args) if a[0] == "dense"]
    return sorted({tuple(step.args[i][1] for i in at)
                   for key, step in kern._steps.items() if key[0] == 0})


def test_page_pools_of_any_layout():
    """A pool whose strides are the dense ones runs with them as constants (the kernel's
    ``k_DENSE``); a pool of another layout (the pages stored key-major, viewed
    head-major) or a slice of a larger cache (``kv[0]``: dense strides again) is read
    through its own strides. Each is right against float64, through one cache."""
    lens = [1, PS + 3, 2 * PS]
    q, k, v, kl, table, keys, vals = _paged(lens, 4, 2, 1, 2, torch.float32, seed=11)
    want = _reference(q, keys, vals, lens, ops.operator("DC-GQA"))
    cache = AttentionCache(store=False)
    strided = (k.transpose(1, 2).contiguous().transpose(1, 2),
               v.transpose(1, 2).contiguous().transpose(1, 2))
    assert strided[0].stride() != k.stride()
    torch.testing.assert_close(strided[0], k, rtol=0, atol=0, equal_nan=True)
    both = torch.stack([k, v])          # a (2, pages, Hkv, page, D) cache
    for pk, pv in ((k, v), strided, (both[0], both[1]), (k, strided[1])):
        out = ops.dc_gqa(q, pk, pv, kv_lens=kl, block_table=table, cache=cache,
                         schedule=SPLIT)
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    [kern] = cache.kernels()
    assert "if k_DENSE:" in kern.specs[0].source
    assert _dense_flags(kern) == [(False, False), (True, False), (True, True)]


def test_the_reference_evaluates_the_same_ir(rng):
    """The float64 evaluator runs the paged, ragged definition the kernels compile: the
    gathered load k[block_table[b, j // 16], h, j % 16, c] and the masks on kv_lens."""
    spec = AttentionSpec("float32", 2, 2, D, D, D ** -0.5, kv_lens=True, page_size=PS,
                         max_pages=2, q_offset="end", mask_mod=ops.Causal())
    [o], ins = attention_definition(spec)
    assert [p.name for p in ins] == ["q", "k", "v", "kv_lens", "block_table"]
    lens = [0, PS + 1, 2 * PS]
    q, k, v, kl, table, keys, vals = _paged(lens, 2, 2, 1, 2, torch.float32, seed=7)
    got = nf.evaluate(o, {"q": q, "k": k, "v": v, "kv_lens": kl, "block_table": table})
    want = _reference(q, keys, vals, lens, ops.OpSpec("x", "DC", 2, 2))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)


def test_new_lengths_and_pages_compile_nothing():
    """Lengths and pages are data: changing them between calls builds no kernel, no
    shape class, no call setup and no launch step (one CUDA graph serves them all)."""
    cache = AttentionCache(store=False)
    lens = [1, PS + 1, 2 * PS]
    q, k, v, kl, table, keys, vals = _paged(lens, 4, 2, 1, 2, torch.float16, seed=8)
    ops.dc_gqa(q, k, v, kv_lens=kl, block_table=table, cache=cache)
    [auto] = cache.kernels()
    [kern] = auto.kernels()
    before = (cache.cache_info().misses, auto.cache_info().misses, len(auto.kernels()),
              kern.cache_info().misses, kern.steps_kept, len(kern._modules))
    for seed, new in ((9, [PS, 0, PS - 1]), (10, [2 * PS, 2, PS + 3])):
        q2, k2, v2, kl2, table2, keys2, vals2 = _paged(new, 4, 2, 1, 2, torch.float16, seed)
        q.copy_(q2)
        k.copy_(k2)
        v.copy_(v2)
        kl.copy_(kl2)
        table.copy_(table2)
        out = ops.dc_gqa(q, k, v, kv_lens=kl, block_table=table, cache=cache)
        want = _reference(q, keys2, vals2, new, ops.operator("DC-GQA"))
        torch.testing.assert_close(out.double(), want, rtol=2e-3, atol=2e-3)
    after = (cache.cache_info().misses, auto.cache_info().misses, len(auto.kernels()),
             kern.cache_info().misses, kern.steps_kept, len(kern._modules))
    assert after == before


# ----------------------------------------------------------------------- bad input


def _ok():
    q, k, v, kl = _contiguous([3, 5], 2, 2, 1, 8, torch.float32, seed=11)
    return q, k, v, kl


BAD = [
    ("kv_lens", lambda kl, t: kl.float(), None, "kv_lens must be int32, got torch.float32"),
    ("kv_lens", lambda kl, t: kl[:1], None, r"kv_lens must have shape \(B,\) = \(2,\)"),
    ("kv_lens", lambda kl, t: [3, 5], None, "kv_lens must be a torch tensor, got list"),
    ("kv_lens", lambda kl, t: kl.to("meta"), None, "kv_lens is on meta but q is on cpu"),
    ("kv_lens", lambda kl, t: torch.tensor([3, 9], dtype=torch.int32), None,
     r"kv_lens\[1\] = 9 is outside \[0, 8\], the cache length"),
    ("kv_lens", lambda kl, t: torch.tensor([-1, 2], dtype=torch.int32), None,
     r"kv_lens\[0\] = -1 is outside \[0, 8\]"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_kv_lens(case):
    _, make, _, msg = BAD[case]
    q, k, v, kl = _ok()
    with pytest.raises(FeedError, match=msg):
        nf.attention(q, k, v, kv_lens=make(kl, None), cache=AttentionCache(store=False))


def _pool():
    q, k, v, kl, table, _, _ = _paged([PS + 1, 3], 2, 2, 1, 2, torch.float32, seed=12)
    return q, k, v, kl, table


@pytest.mark.parametrize("change,msg", [
    (lambda a: {"block_table": a["block_table"].long()}, "block_table must be int32"),
    (lambda a: {"block_table": a["block_table"][0]},
     r"block_table must have shape \(B, max_pages\) with B = 2"),
    (lambda a: {"block_table": a["block_table"][:, :0]}, "max_pages >= 1"),
    (lambda a: {"k": a["k"][:, :, :8], "v": a["v"][:, :, :8]},
     "page size .* must be a power of two >= 16, got 8"),
    (lambda a: {"k": torch.zeros(5, 2, 24, D), "v": torch.zeros(5, 2, 24, D)},
     "power of two >= 16, got 24"),
    (lambda a: {"v": a["v"][:4]}, "must agree in num_pages and page_size"),
    (lambda a: {"k": a["k"][:0], "v": a["v"][:0],
                "kv_lens": torch.zeros(2, dtype=torch.int32)},
     "need at least one page; got num_pages = 0"),
    (lambda a: {"kv_lens": torch.tensor([2 * PS + 1, 0], dtype=torch.int32)},
     r"kv_lens\[0\] = 33 is outside \[0, 32\], the cache length \(max_pages 2 x "
     r"page_size 16\)"),
    (lambda a: {"block_table": torch.tensor([[0, 40], [1, 2]], dtype=torch.int32)},
     r"block_table\[0, 1\] = 40 is outside the pool of \d+ pages \(sequence 0 uses its "
     r"first 2 pages\)"),
    (lambda a: {"block_table": torch.tensor([[0, 3], [-2, 2]], dtype=torch.int32)},
     r"block_table\[1, 0\] = -2 is outside the pool"),
    (lambda a: {"q_offset": 3}, "q_offset=3 with kv_lens"),
    (lambda a: {"buffers": {"kv_lens": a["kv_lens"]}},
     "buffer name 'kv_lens' must be an identifier other than"),
])
def test_bad_paged_input(change, msg):
    q, k, v, kl, table = _pool()
    args = dict(q=q, k=k, v=v, kv_lens=kl, block_table=table)
    args.update(change(args))
    with pytest.raises(FeedError, match=msg):
        nf.attention(args.pop("q"), args.pop("k"), args.pop("v"),
                     cache=AttentionCache(store=False), **args)


def test_paged_decode_under_torch_compile():
    """kv_lens and block_table travel through the neptune_fusion::attention op: one
    graph, no break, the eager kernels' result."""
    lens = [1, PS + 1, 2 * PS]
    q, k, v, kl, table, keys, vals = _paged(lens, 4, 2, 1, 2, torch.float32, seed=13)
    cache = AttentionCache(store=False)

    def step(q, k, v, kl, table):
        return nf.attention(q, k, v, kv_lens=kl, block_table=table, enable_gqa=True,
                            mask_mod=ops.Causal(), cache=cache) * 2.0

    explained = torch._dynamo.explain(step)(q, k, v, kl, table)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    got = torch.compile(step, fullgraph=True, backend="eager")(q, k, v, kl, table)
    assert torch.equal(got, step(q, k, v, kl, table))
    want = _reference(q, keys, vals, lens, ops.OpSpec("x", "DC", 4, 2)) * 2.0
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_values_are_checked_on_cpu_always_and_on_cuda_when_asked(monkeypatch):
    from neptune_fusion.frontend.kv import wants_values_checked
    monkeypatch.delenv("NEPTUNE_FUSION_VALIDATE", raising=False)
    assert wants_values_checked(torch.device("cpu"))
    assert not wants_values_checked(torch.device("cuda", 0))   # no host sync by default
    monkeypatch.setenv("NEPTUNE_FUSION_VALIDATE", "1")
    assert wants_values_checked(torch.device("cuda", 0))


def test_buffers_alibi_slopes_and_attention_sinks():
    """Mods reading buffers see the per-sequence positions: ALiBi from a slopes buffer,
    and a window that always keeps the first ``sinks[0]`` keys (attention sinks)."""
    lens = [3, PS - 1, PS + 1, 2 * PS]
    q, k, v, kl = _contiguous(lens, 2, 2, 2, 2 * PS, torch.float32, seed=14)
    slopes = torch.tensor([0.5, 0.125])
    sinks = torch.tensor([2], dtype=torch.int32)

    def keep(b, h, i, j, slopes, sinks):
        return (j <= i) & ((j < sinks[0]) | (i - j < 4))
    out = nf.attention(q, k, v, kv_lens=kl, score_mod=ops.AlibiSlopes(), mask_mod=keep,
                       buffers={"slopes": slopes, "sinks": sinks},
                       cache=AttentionCache(store=False), schedule=ROLL)
    want = torch.zeros_like(out, dtype=torch.float64)
    for b, m in enumerate(lens):
        s = q[b].double() @ k[b, :, :m].double().transpose(-1, -2) * D ** -0.5
        pos = torch.arange(2)[:, None] + (m - 2)
        j = torch.arange(m)[None, :]
        s = s + slopes.double()[:, None, None] * (j - pos)
        s = s.masked_fill(~((j <= pos) & ((j < 2) | (pos - j < 4))), -math.inf)
        want[b] = torch.softmax(s, -1) @ v[b, :, :m].double()
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


def test_one_prepared_call_serves_every_step():
    """nf.prepare_attention with kv_lens and block_table: the lengths and pages change
    between calls (written into the same tensors, as a serving loop does) and every call
    takes the prepared launches -- the same output tensor -- and is right for its step."""
    cache = AttentionCache(store=False)
    q, kp, vp, kl, table, keys, vals = _paged([5, 20], 4, 2, 1, 2, torch.float32, 11)
    prepared = nf.prepare_attention(q, kp, vp, kv_lens=kl, block_table=table,
                                    enable_gqa=True, mask_mod=ops.Causal(), cache=cache,
                                    schedule=SPLIT)
    for seed, lens in ((12, [17, 3]), (13, [32, 0])):
        q2, kp2, vp2, kl2, table2, keys, vals = _paged(lens, 4, 2, 1, 2, torch.float32,
                                                       seed)
        q.copy_(q2)
        kp.copy_(kp2)
        vp.copy_(vp2)
        kl.copy_(kl2)
        table.copy_(table2)
        out = prepared(q, kp, vp, kv_lens=kl, block_table=table)
        assert out is prepared.output
        want = _reference(q, keys, vals, lens, _Causal())
        torch.testing.assert_close(out.double(), want, **_tol(torch.float32))


class _Causal:
    """The reference's view of a causal operator (no soft-cap, no ALiBi)."""
    softcap, alibi, causal = None, False, True


@pytest.mark.parametrize("name", ops.PREFILL)
@pytest.mark.parametrize("layout", ["ragged", "paged"])
def test_prefill_operators_take_a_ragged_or_paged_cache(name, layout):
    """Every prefill operator with ``kv_lens``: a chunked prefill, its 4 queries the last
    positions of each sequence (those before position 0 see no key: zeros). ``ops.run``
    passed ``q_offset=0`` beside ``kv_lens``, which attention refuses (a fuzzing find,
    2026-12-04)."""
    op = ops.operator(name)
    hq, hkv = (4, 2) if op.q_heads != op.kv_heads else (2, 2)
    lens = LENS + [3 * PS]
    cache = AttentionCache(store=False)
    if layout == "ragged":
        q, k, v, kl = _contiguous(lens, hq, hkv, 4, 3 * PS, torch.float32, seed=len(name))
        out = ops.run(name, q, k, v, kv_lens=kl, cache=cache, schedule=ROLL)
        keys, vals = list(k), list(v)
    else:
        q, k, v, kl, table, keys, vals = _paged(lens, hq, hkv, 4, 3, torch.float32,
                                                seed=len(name))
        out = ops.run(name, q, k, v, kv_lens=kl, block_table=table, cache=cache,
                      schedule=ROLL)
    want = _reference(q, keys, vals, lens, op, window=op.window)
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
