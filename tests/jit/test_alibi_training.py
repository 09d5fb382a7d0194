"""Bloom's written-out attention (a ``baddbmm`` ALiBi bias, an additive mask, a float32
softmax, ``bmm``) in a training graph becomes ``nf.attention``'s op with its derived
backward (dynamo/alibi_attention.py): the output and every gradient against float64;
the causal mask built from positions becomes ``mask_mod=Causal()``, a mask read from a
tensor a buffer; ``beta=0`` ignores the bias; forms it must leave alone stay written."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import neptune_fusion as nf
from neptune_fusion import ops
from neptune_fusion.dynamo.alibi_attention import alibi_attention_to_nf
from neptune_fusion.runtime import torch_ops

B, H, L, D = 2, 3, 12, 16
MADE = "made nf.attention's op"


def _positions_mask(dtype):
    keep = torch.arange(L)[None, None, None, :] <= torch.arange(L)[None, None, :, None]
    return torch.where(keep.expand(B, 1, L, L), torch.zeros((), dtype=dtype),
                       torch.finfo(dtype).min)


def _bloom(q, k, v, alibi, mask=None, beta=1.0, dropout=0.0):
    """Bloom's eager attention over (B*H, L, D) heads (transformers' BloomAttention)."""
    s = alibi.baddbmm(batch1=q, batch2=k.transpose(-1, -2), beta=beta, alpha=D ** -0.5)
    w = s.view(B, H, L, -1)
    w = w + (_positions_mask(q.dtype) if mask is None else mask)
    p = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    p = F.dropout(p, dropout, True, False)
    return torch.bmm(p.view(B * H, L, -1), v)


def _inputs(gen, dtype=torch.float32):
    q, k, v = (torch.randn(B * H, L, D, generator=gen, dtype=dtype) for _ in range(3))
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / H) for h in range(H)])
    alibi = (slopes[:, None] * torch.arange(L)[None, :]).repeat(B, 1)[:, None, :].to(dtype)
    return q, k, v, alibi


def _handles(gm) -> list:
    return [n.args[-1] for n in gm.graph.nodes
            if n.op == "call_function" and n.target is torch.ops.neptune_fusion.attention.default]


def _step(fn, args, gen, grads=3):
    """One training step through the backend (the rest eager) against float64: output and
    the gradients of q, k, v; the report and the op entries the rewrite made."""
    seen = []

    class Spy(nf.dynamo.Backend):
        def __call__(self, gm, example):
            out = super().__call__(gm, example)
            seen.extend(torch_ops.entry(h) for h in _handles(gm))
            return out
    torch._dynamo.reset()
    backend = Spy(rest="eager")
    xs = [a.clone().requires_grad_(i < grads) for i, a in enumerate(args)]
    out = torch.compile(fn, backend=backend)(*xs)
    cot = torch.randn(out.shape, generator=gen)
    (out * cot).sum().backward()
    ref = [a.double().requires_grad_(i < grads) for i, a in enumerate(args)]
    want = fn(*ref)
    (want * cot.double()).sum().backward()
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-5)
    for a, r in zip(xs[:grads], ref[:grads]):
        torch.testing.assert_close(a.grad.double(), r.grad, rtol=1e-4, atol=1e-5)
    [report] = backend.reports
    return report, seen


def test_bloom_attention_in_training_becomes_nf_attention_with_a_causal_mask_mod():
    gen = torch.Generator().manual_seed(1)
    report, [entry] = _step(_bloom, _inputs(gen), gen)
    assert any(MADE in x.reason for x in report.left), report
    assert entry.kw["mask_mod"] == ops.Causal() and entry.kw["scale"] == D ** -0.5
    assert entry.names == ("alibi",)


def test_a_mask_read_from_a_tensor_is_a_buffer():
    """A padding mask (data, not positions): read per score; a padded key gets no weight."""
    gen = torch.Generator().manual_seed(2)
    mask = _positions_mask(torch.float32).clone()
    mask[1, :, :, 8:] = torch.finfo(torch.float32).min
    report, [entry] = _step(_bloom, (*_inputs(gen), mask), gen, grads=3)
    assert entry.kw["mask_mod"] is None and entry.names == ("alibi", "mask")


def test_beta_zero_ignores_the_bias():
    """``beta=0``: torch ignores the input, NaN included; so does the op (no bias read)."""
    gen = torch.Generator().manual_seed(3)
    q, k, v, _ = _inputs(gen)

    def fn(q, k, v):
        return _bloom(q, k, v, torch.full((B * H, 1, L), float("nan"), dtype=q.dtype),
                      beta=0.0)
    report, [entry] = _step(fn, (q, k, v), gen)
    assert entry.names is None


def test_a_live_dropout_and_read_probabilities_stay_written():
    """nf.attention has no dropout; probabilities read elsewhere must be computed: both
    forms keep their written ops (the output still right where it can be compared)."""
    gen = torch.Generator().manual_seed(4)
    args = _inputs(gen)

    def found(fn):
        got = []

        def backend(gm, example):
            got.append(alibi_attention_to_nf(gm))
            return gm.forward
        torch._dynamo.reset()
        torch.compile(fn, backend=backend)(*[a.clone().requires_grad_() for a in args])
        return got[0]

    def probs_out(q, k, v, alibi):
        s = alibi.baddbmm(q, k.transpose(-1, -2), beta=1.0, alpha=0.25).view(B, H, L, L)
        p = F.softmax(s + _positions_mask(q.dtype), dim=-1)
        return torch.bmm(p.view(B * H, L, L), v), p
    assert found(lambda *a: _bloom(*a, dropout=0.1)) == 0
    assert found(probs_out) == 0
    assert found(_bloom) == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sixteen_bit_training_within_the_dtypes_tolerance(dtype):
    """16-bit q, k, v and bias: the op's scores stay float32 where eager's ``baddbmm``
    rounds them; output and gradients against float64 within the dtype's tolerance."""
    gen = torch.Generator().manual_seed(5)
    args = _inputs(gen, dtype)
    torch._dynamo.reset()
    xs = [a.clone().requires_grad_(i < 3) for i, a in enumerate(args)]
    out = nf.jit(_bloom, rest="eager")(*xs)
    cot = torch.randn(out.shape, generator=gen)
    (out.double() * cot).sum().backward()
    ref = [a.double().requires_grad_(i < 3) for i, a in enumerate(args)]
    want = _bloom(*ref)
    (want * cot).sum().backward()
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3

    def rel(a, b):
        return float((a.double() - b).norm() / b.norm())
    assert rel(out, want) <= tol
    for a, r in zip(xs[:3], ref[:3]):
        assert rel(a.grad, r.grad) <= 2 * tol
