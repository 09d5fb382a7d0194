"""The lean eager call (frontend/bound.py BoundCalls): a call seen twice with one
signature (a decode step, a prefill) launches bound kernels. On CPU the bound arguments
run through the interpreter, so these check the binding -- every result against float64
on fresh data and bit-identical to the general path's --, that a changed stride, shape,
dtype or alignment takes the general path (never a wrong answer), that results never
alias, and that changing lengths compiles nothing new."""

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


def _keep(h, i, j):
    return j <= i


def _inputs(hq, m, seed, dtype=torch.float32, d=16):
    return (randn(1, hq, 1, d, seed=seed, dtype=dtype), randn(1, 2, m, d, seed=seed + 1,
                                                               dtype=dtype),
            randn(1, 2, m, d, seed=seed + 2, dtype=dtype))


def test_bound_calls_match_float64_and_the_general_path_and_never_alias():
    """Packed GQA decode (4 query heads over 2), split-k: the first call is general, the
    second binds and launches bound, as do the rest; every output is fresh and right
    for its data."""
    cache, general = AttentionCache(), AttentionCache()
    kw = dict(mask_mod=ops.Causal(), q_offset="end", enable_gqa=True, schedule=SPLIT)
    outs = []
    for call in range(4):
        q, k, v = _inputs(4, 45, seed=10 * call)
        out = nf.attention(q, k, v, cache=cache, **kw)
        assert rel(out, reference(q, k, v, keep=_keep, offset=44)) < 1e-5
        general.bound.clear()   # a cache that never binds: the general path
        assert torch.equal(out, nf.attention(q, k, v, cache=general, **kw))
        outs.append(out)
    assert cache.bound.hits == 3 and general.bound.hits == 0
    assert len({o.data_ptr() for o in outs}) == 4   # no output reused
    assert not torch.equal(outs[2], outs[3])


def test_a_buffer_and_a_ragged_cache_bind_too():
    cache = AttentionCache()
    slopes = torch.tensor([0.5, 0.25, 0.125, 1.0], dtype=torch.float32)
    kw = dict(score_mod=ops.AlibiSlopes(), enable_gqa=True, schedule=SPLIT, cache=cache)

    def alibi(s, h, i, j):
        return s + slopes.double()[h] * (j - i).double()
    for call in range(3):
        q, k, v = _inputs(4, 40, seed=7 * call)
        lens = torch.tensor([33 - call], dtype=torch.int32)
        out = nf.attention(q, k, v, buffers={"slopes": slopes}, kv_lens=lens, **kw)
        n = 33 - call
        want = reference(q, k[:, :, :n], v[:, :, :n], score_mod=alibi, offset=n - 1)
        assert rel(out, want) < 1e-5
    assert cache.bound.hits == 2   # new lengths: the same signature (values on the device)


def test_another_stride_shape_dtype_or_alignment_takes_the_general_path():
    cache = AttentionCache()
    kw = dict(q_offset="end", schedule=SPLIT, cache=cache)
    for seed in (1, 2):
        q, k, v = _inputs(2, 30, seed)
        nf.attention(q, k, v, **kw)
    assert cache.bound.hits == 1
    q, k, v = _inputs(2, 30, 3)
    k_t = torch.empty(1, 30, 2, 16).transpose(1, 2).copy_(k)      # heads, rows swapped
    k_strided = torch.empty(1, 2, 30, 32)[..., :16].copy_(k)       # another row stride
    flat = torch.empty(k.numel() + 1)[1:]                          # 4 bytes off 16
    k_off = flat.view(k.shape).copy_(k)
    q2, k2, v2 = _inputs(2, 31, 5)                                  # another length
    qh, kh, vh = (t.half() for t in (q, k, v))                      # another dtype
    for q_, k_, v_ in ((q, k_strided, v), (q, k_off, v), (q2, k2, v2), (qh, kh, vh),
                       (q, k_t, v)):
        got = nf.attention(q_, k_, v_, **kw)
        assert got.dtype == q_.dtype
        assert rel(got, reference(q_, k_, v_, offset=k_.shape[2] - 1)) < 5e-3
    assert cache.bound.hits == 1   # each a first sighting: general


def test_changing_lengths_compiles_nothing_new():
    cache = AttentionCache()
    kw = dict(mask_mod=ops.Causal(), q_offset="end", enable_gqa=True, schedule=SPLIT,
              cache=cache)
    for m in (20, 20, 21, 21, 37, 37, 20):
        q, k, v = _inputs(4, m, seed=m)
        out = nf.attention(q, k, v, **kw)
        assert rel(out, reference(q, k, v, keep=_keep, offset=m - 1)) < 1e-5
    assert (len(cache), cache.misses) == (1, 1)
    assert cache.bound.hits == 4


def test_a_prefill_is_bound_unless_it_writes_an_out_tensor():
    """A prefill (more than 16 queries) repeated with one signature binds at its second
    call and launches bound from then on, like a decode step, each result against
    float64 on its own fresh data; with ``out=`` (a model's transposed buffer) it stays
    general, the kernel writing ``out`` itself rather than a bound result being copied
    into it."""
    cache = AttentionCache()
    kw = dict(mask_mod=ops.Causal(), cache=cache)
    outs = []
    for call in range(3):
        q, k, v = (randn(1, 2, 40, 16, seed=10 * call + s, dtype=torch.float32)
                   for s in range(3))
        out = nf.attention(q, k, v, **kw)
        assert rel(out, reference(q, k, v, keep=_keep)) < 1e-5
        outs.append(out)
    assert cache.bound.hits == 2
    assert len({o.data_ptr() for o in outs}) == 3   # fresh outputs, never aliased
    into = torch.empty(1, 40, 2, 16).transpose(1, 2)
    for _ in range(3):
        got = nf.attention(q, k, v, out=into, **kw)
        assert got.data_ptr() == into.data_ptr()
        assert rel(into, reference(q, k, v, keep=_keep)) < 1e-5
    assert cache.bound.hits == 2


def test_what_is_not_bound():
    """A mod without a guard (traced every call), a strided last dimension: general
    every time (inputs that require grad: the test above)."""
    cache = AttentionCache()
    q, k, v = randn(1, 2, 17, 16, seed=1), randn(1, 2, 30, 16, seed=2), randn(1, 2, 30, 16,
                                                                             seed=3)
    q1 = q[:, :, :1]
    opaque = [0.0]

    def bias(s, b, h, i, j):
        return s + opaque[0]   # captures a list: no guard
    for _ in range(3):
        nf.attention(q1, k, v, score_mod=bias, q_offset="end", cache=cache)
    ks = randn(1, 2, 16, 30, seed=4).transpose(2, 3)
    for _ in range(3):
        out = nf.attention(q1, ks, v, q_offset="end", cache=cache)
    assert rel(out, reference(q1, ks, v, offset=29)) < 5e-3
    assert cache.bound.hits == 0


def test_a_parameter_buffer_is_keyed_and_bound_like_a_tensor():
    """A buffer that is a module's parameter (gpt-oss's sinks, learned ALiBi slopes)
    requires grad: under ``no_grad`` the call is keyed (one call setup) and bound like
    one with a plain tensor, each result against float64. With grad mode on the bound
    launch (keyed by grad mode) is not taken: the general path refuses the buffer."""
    cache = AttentionCache()
    slopes = torch.nn.Parameter(torch.tensor([0.5, 0.25, 0.125, 0.0625]))
    kw = dict(score_mod=ops.AlibiSlopes(), enable_gqa=True, cache=cache)

    def alibi(s, h, i, j):
        return s + slopes.detach().double()[h] * (j - i).double()
    with torch.no_grad():
        for call in range(3):
            q, k, v = _inputs(4, 40, seed=5 * call)
            out = nf.attention(q, k, v, buffers={"slopes": slopes}, q_offset="end", **kw)
            want = reference(q, k, v, score_mod=alibi, offset=39)
            assert rel(out, want) < 1e-5
    assert cache.bound.hits == 2 and (len(cache), cache.misses) == (1, 1)
    with pytest.raises(FeedError, match="slopes"):   # grad mode on: not the no_grad binding
        nf.attention(q, k, v, buffers={"slopes": slopes}, q_offset="end", **kw)
    assert cache.bound.hits == 2


def test_bad_input_after_binding_is_still_reported():
    """A bound signature does not swallow errors: a buffer that is not a tensor, lengths
    of another dtype -- the general path names them."""
    cache = AttentionCache()
    slopes = torch.tensor([0.5, 0.25], dtype=torch.float32)
    lens = torch.tensor([20], dtype=torch.int32)
    kw = dict(score_mod=ops.AlibiSlopes(), schedule=SPLIT, cache=cache)
    q, k, v = _inputs(2, 30, seed=3)
    for _ in range(3):
        nf.attention(q, k, v, buffers={"slopes": slopes}, kv_lens=lens, **kw)
    assert cache.bound.hits == 2
    with pytest.raises(FeedError, match="slopes"):
        nf.attention(q, k, v, buffers={"slopes": 0.5}, kv_lens=lens, **kw)
    with pytest.raises(FeedError, match="kv_lens"):
        nf.attention(q, k, v, buffers={"slopes": slopes}, kv_lens=lens.long(), **kw)
    with pytest.raises(FeedError, match="kv_lens"):   # values checked on CPU, every call
        nf.attention(q, k, v, buffers={"slopes": slopes}, kv_lens=lens + 20, **kw)


def test_allocations_per_call(monkeypatch):
    """A prepared call allocates nothing; a bound eager call its output only (counted at
    the torch.empty the runtime calls; the kernels' launches stubbed out)."""
    from neptune_fusion.runtime import prepared as prepared_mod
    cache = AttentionCache()
    kw = dict(mask_mod=ops.Causal(), q_offset="end", enable_gqa=True, schedule=SPLIT,
              cache=cache)
    q, k, v = _inputs(4, 45, seed=1)
    step = nf.prepare_attention(q, k, v, **kw)
    for _ in range(2):
        nf.attention(q, k, v, **kw)   # seen, then bound
    made = []
    real_empty = torch.empty

    def counting(*args, **kwargs):
        made.append(args)
        return real_empty(*args, **kwargs)
    monkeypatch.setattr(torch, "empty", counting)
    monkeypatch.setattr(prepared_mod, "_runner", None)   # nothing binds from here on
    for launch in [step._launch] + [got[0] for got in cache.bound._table.values()]:
        launch._launches = tuple((lambda args, stream: None, t, s, d)
                                 for _, t, s, d in launch._launches)
    for _ in range(3):
        assert step(q, k, v) is step.output
    assert made == []
    hits = cache.bound.hits
    outs = [nf.attention(q, k, v, **kw) for _ in range(3)]
    assert cache.bound.hits == hits + 3 and len(made) == 3
    assert len({o.data_ptr() for o in outs}) == 3
