"""Grouped-query decode through the backend: the query heads of a key/value group are
packed into the rows of one program (dynamo/gqa.py), with the index arithmetic that reads
``h // g`` back as the key/value head (ir/index.py); every result against float64."""

from __future__ import annotations

import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.ir.index import bound, simplify

from .test_backend import _check


def _axes(*extents):
    return nf.compute(tuple(extents), lambda *i: i[0] * 0).axes


def test_index_identities():
    hk, r = _axes(nf.size("H"), 12)
    g, n = 4, 3
    h = hk * g + r // n
    assert simplify(h // g) is hk
    assert simplify(h % g) is simplify(r // n)
    assert simplify((h % g) * n + r % n) is r
    assert simplify(r // 1) is r and simplify(r % 16) is r and bound(r // n) == 4
    assert simplify((r + 0) * 1) is r
    # a possibly negative part or an unknown range is left alone
    j, i = _axes(9, 9)
    assert simplify((j - i) // 4) is (j - i) // 4
    assert simplify(hk // 4) is hk // 4 and bound(hk) is None


def _gqa(n_rows: int, softcap: float | None = None, bias: bool = False,
         causal: bool = False):
    """Plain PyTorch attention with K and V repeated over the query heads."""
    def attention(q, k, v):
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        if bias:   # a per-head bias: the head is used outside the loads
            s = s + torch.arange(q.shape[1], dtype=s.dtype)[:, None, None] * 0.1
        if causal:   # a mask on the query position: the row is used outside the loads
            i = torch.arange(s.shape[-2])[:, None] + s.shape[-1] - s.shape[-2]
            s = s.masked_fill(torch.arange(s.shape[-1])[None, :] > i, float("-inf"))
        return torch.softmax(s, -1) @ v
    return attention


def _inputs(hq, hkv, n, m=19, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, hq, n, d, generator=g),
            torch.randn(2, hkv, m, d, generator=g), torch.randn(2, hkv, m, d, generator=g))


@pytest.mark.parametrize("hq, hkv, n, softcap", [(8, 2, 1, None), (6, 2, 3, 20.0),
                                                 (4, 1, 2, None)])
def test_grouped_decode_is_packed(hq, hkv, n, softcap):
    ex = _check(_gqa(n, softcap), _inputs(hq, hkv, n))
    fused = ex.fused[0]
    assert f"the {hq // hkv} query heads of each key/value head" in fused.plan
    [out] = fused.kernel.outputs
    assert len(out.shape) == 4 and out.shape[2] == hq // hkv * n   # rows: group x N


@pytest.mark.parametrize("what", ["bias", "causal", "prefill", "mha"])
def test_what_is_not_packed(what):
    hq, hkv, n = (4, 4, 1) if what == "mha" else (8, 2, 20 if what == "prefill" else 2)
    fn = _gqa(n, bias=what == "bias", causal=what == "causal")
    ex = _check(fn, _inputs(hq, hkv, n))
    assert "packed" not in ex.fused[0].plan


def test_a_packed_program_that_fails_to_compile_runs_plain(monkeypatch):
    import neptune_fusion.dynamo.backend as backend
    real = backend.trial

    def trial(kernel, inputs, casts, packed=None, hints=None):
        if packed is not None:
            raise RuntimeError("the packed kernel does not compile")
        return real(kernel, inputs, casts, packed, hints)
    monkeypatch.setattr(backend, "trial", trial)
    ex = _check(_gqa(1), _inputs(8, 2, 1))
    assert "packed" not in ex.fused[0].plan


def test_sdpa_with_enable_gqa_is_packed():
    import torch.nn.functional as F

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    ex = _check(sdpa, _inputs(8, 2, 1))
    assert "GQA decode packed: the 4 query heads" in ex.fused[0].plan


def test_two_layers_of_grouped_decode_share_one_packed_kernel():
    """A second layer of the same grouped decode takes the first one's packed kernel
    (dynamo/memo.py): its query input is reshaped as the packing says, by its own node."""
    one = _gqa(1)

    def layers(q, k, v, q2, k2, v2):
        return one(q, k, v), one(q2, k2, v2)
    ex = _check(layers, (*_inputs(8, 2, 1), *_inputs(8, 2, 1, seed=1)), fused=2)
    first, second = ex.fused
    assert second.same_as == first.name and second.kernel is first.kernel
    assert "the 4 query heads of each key/value head" in second.plan


def _sdpa_gqa(q, k, v, m=None):
    import torch.nn.functional as F
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)


@pytest.mark.parametrize("rest", ["eager", "inductor"])
@pytest.mark.parametrize("mask", ["float", "bool"])
def test_a_mask_per_query_head_is_packed_with_the_queries(mask, rest):
    """A mask of shape ``(B, Hq, N, M)`` is read as the queries are, and passed packed
    with them; a bool one after its cast to int32, which the rewrite had passed
    unpacked (the op's input check raised: a fuzzing find, 2026-12-04)."""
    q, k, v = _inputs(8, 2, 2)
    gen = torch.Generator().manual_seed(3)
    m = torch.randn(2, 8, 2, 19, generator=gen)
    if mask == "bool":
        m = m > -0.5
        m[..., 0] = True   # no row without keys
    ex = _check(_sdpa_gqa, (q, k, v, m), rest=rest)
    assert "the 4 query heads of each key/value head" in ex.fused[0].plan


@pytest.mark.parametrize("rest", ["eager", "inductor"])
def test_strided_queries_are_copied_then_packed(rest):
    """Queries without unit-stride rows (a transposed input, scaled by a ``(1, 1, 1, 1)``
    tensor) are copied for the kernel and the copy passed packed (it was passed
    unpacked, as the mask above)."""
    _, k, v = _inputs(8, 2, 2)
    gen = torch.Generator().manual_seed(4)
    qt = torch.randn(2, 8, 16, 2, generator=gen).transpose(-1, -2)
    scale = torch.rand(1, 1, 1, 1, generator=gen) + 0.5
    assert qt.stride(-1) != 1

    def fn(q, s, k, v):
        return _sdpa_gqa(q * s, k, v)
    ex = _check(fn, (qt, scale, k, v), rest=rest)
    assert "the 4 query heads of each key/value head" in ex.fused[0].plan
