"""Bad ``out=`` tensors and flags refused with a FeedError before anything runs or is
written: ``nf.attention``'s out overlapping q or itself, a wrong ``cache=``, non-bool
flags; a compiled operator's out list (type, count, shape, dtype, self-overlap), a
strided last dimension included. Good calls against float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.frontend.attention import AttentionCache, attention
from neptune_fusion.ir.graph import placeholders
from neptune_fusion.schedule.schedule import Schedule

from .test_attention_api import reference, rel

SMALL = Schedule(block_m=16, block_n=16)


def _qkv(hkv=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 4, 4, 16, generator=g),
            *(torch.randn(1, hkv, 4, 16, generator=g) for _ in range(2)))


def test_attention_out_overlapping_q_is_refused_every_call():
    q, k, v = _qkv()
    cache = AttentionCache()
    for _ in range(3):   # the bound (later) calls too
        qq = q.clone()
        for out in (qq.transpose(1, 2), qq):
            with pytest.raises(nf.FeedError, match="out shares memory with q"):
                attention(qq, k, v, out=out, cache=cache, schedule=SMALL)
        assert torch.equal(qq, q)
        into = torch.full((1, 4, 4, 16), float("nan")).transpose(1, 2)
        assert attention(q, k, v, out=into, cache=cache, schedule=SMALL) is into
        assert rel(into, reference(q, k, v)) < 1e-5


@pytest.mark.parametrize("bad", ["expand", "as_strided"])
def test_attention_out_overlapping_itself_is_refused(bad):
    q, k, v = _qkv()
    cache = AttentionCache()
    for _ in range(2):   # binds the signature: the bound path sees the out next
        assert rel(attention(q, k, v, cache=cache, schedule=SMALL), reference(q, k, v)) < 1e-5
    for _ in range(2):
        out = torch.zeros(1, 1, 1, 16).expand(1, 4, 4, 16) if bad == "expand" else \
            torch.zeros(76).as_strided((1, 4, 4, 16), (0, 16, 4, 1))
        with pytest.raises(nf.FeedError, match="out has strides .*share memory"):
            attention(q, k, v, out=out, cache=cache, schedule=SMALL)
        assert not out.any()


def test_attention_cache_and_flags_are_checked():
    q, k, v = _qkv(hkv=2)
    with pytest.raises(nf.FeedError, match="cache must be an AttentionCache.*got object"):
        attention(q, k, v, enable_gqa=True, cache=object())
    with pytest.raises(nf.FeedError, match="enable_gqa must be True or False, got 'yes'"):
        attention(q, k, v, enable_gqa="yes")
    with pytest.raises(nf.FeedError, match="return_lse must be True or False, got 'no'"):
        attention(q, k, v, enable_gqa=True, return_lse="no")
    with pytest.raises(nf.FeedError, match="enable_gqa must be True or False, got 1"):
        attention(q, k, v, enable_gqa=1)
    # NumPy bools are bools
    o, lse = attention(q, k, v, enable_gqa=np.bool_(True), return_lse=np.bool_(True),
                       cache=AttentionCache(), schedule=SMALL)
    assert rel(o, reference(q, k, v)) < 1e-5 and lse.shape == (1, 4, 4)


@pytest.fixture(scope="module")
def softmax():
    x = nf.placeholder((nf.size("R"), nf.size("C")), name="x")
    j = nf.reduce_axis(x.shape[1], "j")
    m = nf.compute((x.shape[0],), lambda r: nf.max(x[r, j], j), name="m")
    s = nf.compute((x.shape[0],), lambda r: nf.sum(nf.exp(x[r, j] - m[r]), j), name="s")
    y = nf.compute(x.shape, lambda r, c: nf.exp(x[r, c] - m[r]) / s[r], name="y")
    return nf.compile(y, placeholders([y]), schedule=Schedule(block_m=4, block_n=16),
                      cache=False)


def test_kernel_out_good_layouts(softmax):
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(1))
    ref = torch.softmax(x.double(), 1)
    strided = torch.full((3, 64), float("nan"))[:, ::2]   # last dim not unit: copied in
    transposed = torch.full((32, 3), float("nan")).t()    # written by the kernel
    for out in (strided, transposed):
        assert softmax(x, out=[out]) is out and rel(out, ref) < 1e-6
    got = softmax(x, out=[None])
    assert got.is_contiguous() and rel(got, ref) < 1e-6


@pytest.mark.parametrize("bad, match", [
    ([torch.zeros(5, 64)[:, ::2]], r"out\[0\] \(output 'y'\) is a \(5, 32\) torch.float32"),
    ([torch.zeros(3, 64)[:, ::2]], r"out\[0\] \(output 'y'\) is a \(3, 32\)"),
    ([torch.zeros(2, 32, dtype=torch.float64)], r"is a \(2, 32\) torch.float64"),
    ([torch.zeros(1, 32)], r"pass a \(2, 32\) torch.float32 tensor on cpu"),
    ([torch.zeros(1, 32).expand(2, 32)], r"out\[0\] \(output 'y'\) has strides \(0, 1\)"),
    ([torch.zeros(2, 1).expand(2, 32)], r"has strides \(1, 0\): some of its elements share"),
    ([3], r"out\[0\] \(output 'y'\) must be a torch tensor or None, got int"),
    (torch.zeros(2, 32), r"out must be a list with one tensor \(or None\) per output \(y\)"
                         r", got Tensor"),
    ([None, None], r"per output \(y\), got 2 entries"),
])
def test_kernel_bad_out_is_refused_before_anything_runs(softmax, bad, match):
    x = torch.ones(2, 32)
    for _ in range(2):   # the second call with a seen signature too
        with pytest.raises(nf.FeedError, match=match):
            softmax(x, out=bad)
        for o in (bad if isinstance(bad, list) else [bad]):
            assert not isinstance(o, torch.Tensor) or not o.any()   # nothing written


def test_kernel_strided_out_is_never_broadcast_into(softmax):
    """One result row is not copied into five: the shape is checked before the copy."""
    out = torch.zeros(5, 64)[:, ::2]
    with pytest.raises(nf.FeedError, match=r"is a \(5, 32\) .* pass a \(1, 32\)"):
        softmax(torch.ones(1, 32), out=[out])
    assert not out.any()
