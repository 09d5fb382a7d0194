"""nf.attention keys kernels on what a mod computes (its trace), never on the mod object.

Issue 15, finding 1: a mod whose captured value changed reused the old kernel (a silent
wrong result). Every output here is compared with the float64 reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import neptune_fusion as nf
from neptune_fusion import ops
from neptune_fusion.errors import ExprError
from neptune_fusion.frontend.attention import AttentionCache, attention
from neptune_fusion.frontend.mods import guard
from neptune_fusion.schedule.schedule import Schedule

SMALL = Schedule(block_m=16, block_n=16)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def reference(q, k, v, cap=None, keep=None):
    q, k, v = (t.double() for t in (q, k, v))
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if cap is not None:
        s = cap * torch.tanh(s / cap)
    if keep is not None:
        i = torch.arange(q.shape[2])[:, None]
        j = torch.arange(k.shape[2])[None, :]
        s = s.masked_fill(~keep(i, j), float("-inf"))
    return torch.softmax(s, -1) @ v


def close(out, want, tol=1e-4):
    assert float((out.double() - want).abs().max()) < tol


@pytest.fixture(scope="module")
def qkv():
    return tuple(randn(1, 2, 12, 16, seed=s) * 3 for s in range(3))


def test_changed_capture_gives_a_new_kernel(qkv):
    cache = AttentionCache(store=False)
    cap = 0.5
    mod = lambda s, b, h, i, j: cap * nf.tanh(s / cap)  # noqa: E731
    first = attention(*qkv, score_mod=mod, cache=cache, schedule=SMALL)
    close(first, reference(*qkv, cap=0.5))
    cap = 50.0
    second = attention(*qkv, score_mod=mod, cache=cache, schedule=SMALL)
    close(second, reference(*qkv, cap=50.0))
    assert float((first - second).abs().max()) > 0.1 and len(cache) == 2
    # an identical lambda made afresh computes the same thing: the same kernel
    again = lambda s, b, h, i, j: cap * nf.tanh(s / cap)  # noqa: E731
    assert torch.equal(attention(*qkv, score_mod=again, cache=cache, schedule=SMALL), second)
    assert len(cache) == 2 and cache.misses == 2


@dataclass
class MutableCap:   # not frozen: unhashable, and its attribute changes
    cap: float

    def __call__(self, s, b, h, i, j):
        return self.cap * nf.tanh(s / self.cap)


class Window:       # a plain mutable object as mask_mod
    def __init__(self, w):
        self.w = w

    def __call__(self, b, h, i, j):
        return (j <= i) & (i - j < self.w)


def test_mutable_objects_as_mods(qkv):
    cache = AttentionCache(store=False)
    mod, win = MutableCap(0.5), Window(3)
    assert guard(mod) is None and guard(win) is None   # traced on every call
    out = attention(*qkv, score_mod=mod, mask_mod=win, cache=cache, schedule=SMALL)
    close(out, reference(*qkv, cap=0.5, keep=lambda i, j: (j <= i) & (i - j < 3)))
    mod.cap, win.w = 50.0, 5
    out = attention(*qkv, score_mod=mod, mask_mod=win, cache=cache, schedule=SMALL)
    close(out, reference(*qkv, cap=50.0, keep=lambda i, j: (j <= i) & (i - j < 5)))
    assert len(cache) == 2


def test_changed_global_and_default(qkv):
    cache = AttentionCache(store=False)
    g = globals()
    g["_CAP"] = 0.5
    try:
        def mod(s, b, h, i, j, scale=1.0):
            return scale * _CAP * nf.tanh(s / _CAP)  # noqa: F821 - set above
        close(attention(*qkv, score_mod=mod, cache=cache, schedule=SMALL),
              reference(*qkv, cap=0.5))
        g["_CAP"] = 50.0
        close(attention(*qkv, score_mod=mod, cache=cache, schedule=SMALL),
              reference(*qkv, cap=50.0))
        mod.__defaults__ = (2.0,)   # 2 * 50 tanh(s / 50): not the cap-50 result
        out = attention(*qkv, score_mod=mod, cache=cache, schedule=SMALL)
        q, k, v = (t.double() for t in qkv)
        s = q @ k.transpose(-1, -2) * 0.25
        close(out, torch.softmax(100.0 * torch.tanh(s / 50.0), -1) @ v)
        assert len(cache) == 3
    finally:
        del g["_CAP"]


def test_guards():
    cap = 0.5
    lam = lambda s, b, h, i, j: cap * nf.tanh(s / cap)  # noqa: E731
    first = guard(lam)
    assert first is not None and guard(lam) == first
    cap = 50.0
    assert guard(lam) != first
    assert guard(ops.SoftCap(30.0)) == guard(ops.SoftCap(30.0)) != guard(ops.SoftCap(3.0))
    assert guard(ops.score_mod_of(30.0, ops.Alibi(4))) is not None
    assert guard(ops.Chain((lam,))) is not None            # guarded through the lambda
    assert guard(ops.Chain((MutableCap(1.0),))) is None    # not knowable: traced
    box = [1.0]
    assert guard(lambda s, b, h, i, j: s * box[0]) is None  # a list may change

    def softcap(c):   # a forward that makes its mod on every call
        return lambda s, b, h, i, j: c * nf.tanh(s / c)
    assert guard(softcap(30.0)) == guard(softcap(30.0)) != guard(softcap(3.0))


def test_mod_that_reduces_keeps_one_kernel():
    cache = AttentionCache(store=False)
    q, k, v = (randn(1, 2, 12, 16, seed=s) for s in range(3))
    bias = randn(2, 4, seed=5)

    def mod(s, b, h, i, j, bias):   # makes a reduce axis on every call
        r = nf.reduce_axis(4, "r")
        return s + nf.sum(bias[h, r], r)
    for _ in range(2):
        out = attention(q, k, v, score_mod=mod, buffers={"bias": bias}, cache=cache,
                        schedule=SMALL)
    want = torch.softmax((q.double() @ k.double().transpose(-1, -2)) * 0.25
                         + bias.double().sum(1)[None, :, None, None], -1) @ v.double()
    close(out, want)
    assert len(cache) == 1 and cache.misses == 1


def test_bad_mods_are_neptune_errors(qkv):
    cache = AttentionCache(store=False)
    with pytest.raises(ExprError, match="score_mod must be a function"):
        attention(*qkv, score_mod=3.0, cache=cache)
    with pytest.raises(ExprError, match=r"mask_mod failed when called as mask_mod\(b, h, "
                                        r"i, j\).*TypeError"):
        attention(*qkv, mask_mod=lambda i, j: j <= i, cache=cache)
    with pytest.raises(ExprError, match="mask_mod must return a boolean"):
        attention(*qkv, mask_mod=lambda b, h, i, j: j - i, cache=cache)
    with pytest.raises(ExprError, match="score_mod must return a number"):
        attention(*qkv, score_mod=lambda s, b, h, i, j: j <= i, cache=cache)


def test_packed_decode_with_the_query_at_a_constant_position():
    """GQA decode packs a group's heads into rows; the query position is then the int
    offset (0 here), which the traced mods must take (found by the fuzz campaign)."""
    q, k, v = randn(1, 4, 1, 16), randn(1, 2, 9, 16, seed=1), randn(1, 2, 9, 16, seed=2)
    out = attention(q, k, v, mask_mod=ops.Causal(), score_mod=lambda s, b, h, i, j: s + i,
                    enable_gqa=True, cache=AttentionCache(store=False))
    close(out, reference(q, k.repeat_interleave(2, 1)[:, :, :1], v.repeat_interleave(2, 1)
                         [:, :, :1]))
