"""``nf.attention(..., out=)`` and a kernel's strided ``out`` tensors: the kernel writes
any layout whose last dimension is unit-stride itself (a launch step per out strides),
any other through a copy; every result against float64."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import neptune_fusion as nf
from neptune_fusion import ops
from neptune_fusion.frontend.attention import AttentionCache, attention
from neptune_fusion.ir.graph import placeholders
from neptune_fusion.schedule.schedule import Schedule

from .test_attention_api import reference, rel

SMALL = Schedule(block_m=16, block_n=16)
B, HQ, HKV, N, M, D = 2, 4, 2, 37, 53, 16


def _inputs(n=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    # q as a model hands it over: a (B, H, N, D) view of a (B, N, H, D) projection
    q = torch.randn(B, n, HQ, D, generator=g).transpose(1, 2)
    k, v = (torch.randn(B, HKV, M, D, generator=g) for _ in range(2))
    return q, k, v


def _causal_end(h, i, j):
    return j <= i


@pytest.mark.parametrize("layout", ["bshd", "bhsd", "strided-last"])
def test_out_is_written_in_its_layout(layout):
    q, k, v = _inputs()
    if layout == "bshd":      # the layout a model's output projection reads
        buf = torch.full((B, N, HQ, D), float("nan"))
        out = buf.transpose(1, 2)
    elif layout == "bhsd":
        buf = out = torch.full((B, HQ, N, D), float("nan"))
    else:                     # last dimension not unit-stride: written through a copy
        buf = torch.full((D, B, HQ, N), float("nan"))
        out = buf.permute(1, 2, 3, 0)
    cache = AttentionCache()
    got = attention(q, k, v, mask_mod=ops.Causal(), enable_gqa=True, q_offset="end",
                    out=out, cache=cache, schedule=SMALL)
    assert got is out and got.data_ptr() == buf.data_ptr()
    ref = reference(q, k, v, keep=lambda h, i, j: j <= i, offset=M - N)
    assert rel(buf.permute(*(range(4) if layout == "bhsd" else
                            (0, 2, 1, 3) if layout == "bshd" else (1, 2, 3, 0))), ref) < 1e-5
    # the same call without out= (a contiguous result) after it: its own launch step
    plain = attention(q, k, v, mask_mod=ops.Causal(), enable_gqa=True, q_offset="end",
                      cache=cache, schedule=SMALL)
    assert plain.is_contiguous() and rel(plain, ref) < 1e-5


def test_out_with_lse_decode_and_bad_out():
    q, k, v = _inputs(n=1, seed=1)
    ref = reference(q, k, v)
    buf = torch.empty(B, 1, HQ, D)
    o, lse = attention(q, k, v, enable_gqa=True, q_offset="end", out=buf.transpose(1, 2),
                       return_lse=True)
    assert o.data_ptr() == buf.data_ptr() and rel(buf.transpose(1, 2), ref) < 1e-5
    assert lse.shape == (B, HQ, 1)
    with pytest.raises(nf.NeptuneError, match=r"out has shape \(2, 4, 2, 16\)"):
        attention(q, k, v, enable_gqa=True, out=torch.empty(B, HQ, 2, D))
    with pytest.raises(nf.NeptuneError, match="out is torch.float16"):
        attention(q, k, v, enable_gqa=True, out=torch.empty(B, HQ, 1, D,
                                                           dtype=torch.float16))
    with pytest.raises(nf.NeptuneError, match="out must be a torch tensor"):
        attention(q, k, v, enable_gqa=True, out=[0])
    with pytest.raises(nf.NeptuneError, match="out shares memory with v"):
        attention(q, k, v, enable_gqa=True, out=v.view(-1)[:B * HQ * D].view(B, HQ, 1, D))
    with pytest.raises(nf.NeptuneError, match="does not support automatic"):
        attention(q.clone().requires_grad_(), k, v, enable_gqa=True,
                  out=torch.empty(B, HQ, 1, D))


def test_compiled_kernel_alternates_out_layouts():
    """One kernel, calls with a contiguous and a transposed out in turn: each call's
    launch step has its own output strides (none is reused for the other)."""
    x = nf.placeholder((nf.size("R"), nf.size("C")), name="x")
    j = nf.reduce_axis(x.shape[1], "j")
    m = nf.compute((x.shape[0],), lambda r: nf.max(x[r, j], j), name="m")
    y = nf.compute(x.shape, lambda r, c: nf.exp(x[r, c] - m[r]), name="y")
    kern = nf.compile(y, placeholders([y]), schedule=Schedule(block_m=4, block_n=16),
                      cache=False)
    for seed in range(3):
        xs = torch.randn(29, 33, generator=torch.Generator().manual_seed(seed))
        ref = torch.exp(xs.double() - xs.double().amax(1, keepdim=True))
        t = torch.full((33, 29), float("nan"))
        got = kern(xs, out=[t.t()])
        assert got.data_ptr() == t.data_ptr() and rel(t.t(), ref) < 1e-6
        c = torch.full((29, 33), float("nan"))
        assert rel(kern(xs, out=[c]), ref) < 1e-6


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_misaligned_out_takes_the_checked_launch():
    """An out view that starts off a 16-byte boundary is launched through Triton's
    dispatch (its unaligned kernel), never the direct launch of the aligned one."""
    q, k, v = (t.cuda().half() for t in _inputs())
    ref = reference(q.float().cpu(), k.float().cpu(), v.float().cpu())
    cache = AttentionCache()
    aligned = attention(q, k, v, enable_gqa=True, cache=cache)   # binds the direct path
    flat = torch.full((B * N * HQ * D + 1,), float("nan"), device="cuda", dtype=torch.half)
    out = flat[1:].view(B, N, HQ, D).transpose(1, 2)
    got = attention(q, k, v, enable_gqa=True, cache=cache, out=out)
    assert got.data_ptr() % 16 and rel(got.float().cpu(), ref) < 2e-3
    assert rel(aligned.float().cpu(), ref) < 2e-3


@settings(max_examples=6, deadline=None)
@given(perm=st.permutations(range(4)), seed=st.integers(0, 2**31 - 1))
def test_any_out_layout_gets_the_result(perm, seed):
    """An out tensor of any dimension order (a permuted view of a fresh buffer): the
    kernel writes through its strides, or through a copy when the last dimension is not
    unit-stride; the result matches float64 either way."""
    q, k, v = _inputs(n=5, seed=seed % 1000)
    shape = (B, HQ, 5, D)
    buf = torch.full(tuple(shape[p] for p in perm), float("nan"))
    out = buf.permute(*[perm.index(d) for d in range(4)])
    assert out.shape == shape
    got = attention(q, k, v, enable_gqa=True, q_offset="end", out=out, schedule=SMALL,
                    cache=AttentionCache())
    assert got is out
    assert rel(out, reference(q, k, v, offset=M - 5)) < 1e-5
