"""Attention's backward, derived on the IR (docs/autodiff.md).

* float64 ``gradcheck`` of the *derivation*: the forward definition and the derived
  backward programs, both evaluated by the float64 reference (the spec), for plain,
  causal, GQA, ALiBi, soft-cap and sliding-window attention;
* ``nf.attention`` under autograd on CPU (the interpreter): float32 kernel gradients
  against torch autograd through a float64 reference;
* the derived dS of soft-cap, printed (golden), and what is refused.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion import ops
from neptune_fusion.autodiff.attention import attention_backward
from neptune_fusion.frontend.attention import AttentionCache, AttentionSpec, attention_definition
from neptune_fusion.ir.graph import tensors_in_order
from neptune_fusion.ir.printer import program_str
from neptune_fusion.reference.evaluate import evaluate_unfused

INF = math.inf
CAP = 2.0


def softcap(s, b, h, i, j):
    return CAP * nf.tanh(s / CAP)


def causal(b, h, i, j, **buffers):
    return j <= i


def window(b, h, i, j):
    return (j <= i) & (i - j < 2)


def alibi(s, b, h, i, j, slopes):
    return s + slopes[h] * nf.cast(j - i, "float32")


# name -> (q heads, kv heads, score_mod, mask_mod, buffers?)
CASES = {
    "plain": (2, 2, None, None, False),
    "causal": (2, 2, None, causal, False),
    "gqa": (4, 2, None, causal, False),
    "alibi": (2, 2, alibi, causal, True),
    "softcap": (2, 2, softcap, None, False),
    "window": (2, 2, None, window, False),
}
B, N, M, D = 1, 3, 4, 3


def reference_scores(q, k, hq, hkv, score_mod, mask_mod, slopes, scale):
    """The scores in torch (float64), for torch autograd to differentiate."""
    g = hq // hkv
    s = q @ k.repeat_interleave(g, 1).transpose(-1, -2) * scale
    n, m = q.shape[2], k.shape[2]
    i = torch.arange(n).view(n, 1) + (m - n if n == 1 else 0)
    j = torch.arange(m).view(1, m)
    if score_mod is softcap:
        s = CAP * torch.tanh(s / CAP)
    elif score_mod is alibi:
        s = s + slopes.view(1, hq, 1, 1) * (j - i)
    if mask_mod is causal:
        s = s.masked_fill(~(j <= i), -INF)
    elif mask_mod is window:
        s = s.masked_fill(~((j <= i) & (i - j < 2)), -INF)
    return s


def reference(q, k, v, hq, hkv, score_mod, mask_mod, slopes, scale):
    s = reference_scores(q, k, hq, hkv, score_mod, mask_mod, slopes, scale)
    return s.softmax(-1) @ v.repeat_interleave(hq // hkv, 1)


def reference_forward(ctx, spec, *tensors):
    """``(o, lse)`` of ``spec``'s definition by the float64 reference, with what the
    backward needs kept on ``ctx``."""
    outs, ins = attention_definition(spec)
    feeds = {p.name: t.detach().numpy() for p, t in zip(ins, tensors)}
    o, lse = evaluate_unfused(outs, feeds)
    ctx.program, ctx.feeds, ctx.o, ctx.lse = (outs, ins), feeds, o, lse
    return torch.from_numpy(o), torch.from_numpy(lse)


class ReferenceAttention(torch.autograd.Function):
    """The definition and its derived backward, evaluated by the float64 reference."""

    @staticmethod
    def forward(ctx, spec, q, k, v, *bufs):
        return reference_forward(ctx, spec, q, k, v, *bufs)[0]

    @staticmethod
    def backward(ctx, d_out):
        bw = attention_backward(*ctx.program)
        # a row with no key: the kernel writes lse = -inf, the reference NaN (0 * log 0)
        lse = np.where(np.isfinite(ctx.lse), ctx.lse, INF)
        feeds = dict(ctx.feeds, o=ctx.o, d_o=d_out.numpy(), lse=lse)
        names = {p.name for p in bw.inputs}
        got = evaluate_unfused(list(bw.grads), {k: v for k, v in feeds.items() if k in names})
        return (None, *(torch.from_numpy(g) for g in got), *[None] * (len(ctx.feeds) - 3))


def _spec(case: str, scale: float = 0.7) -> AttentionSpec:
    hq, hkv, sm, mm, bufs = CASES[case]
    return AttentionSpec(dtype="float32", q_heads=hq, kv_heads=hkv, head_dim=D,
                         v_head_dim=D, scale=scale, score_mod=sm, mask_mod=mm, lse=True,
                         buffers=(("slopes", (hq,), "float32"),) if bufs else ())


def _inputs(case: str, dtype=torch.float64, seed: int = 0, n: int = N, m: int = M,
            d: int = D):
    hq, hkv, *_ = CASES[case]
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, s, d, generator=gen, dtype=dtype)
               for h, s in ((hq, n), (hkv, m), (hkv, m)))
    slopes = torch.rand(hq, generator=gen, dtype=dtype) + 0.25
    return q, k, v, slopes


@pytest.mark.parametrize("case", sorted(CASES))
def test_derived_backward_passes_gradcheck_in_float64(case):
    spec = _spec(case)
    q, k, v, slopes = _inputs(case)
    bufs = (slopes,) if spec.buffers else ()
    args = [t.requires_grad_() for t in (q, k, v)]
    assert torch.autograd.gradcheck(
        lambda *a: ReferenceAttention.apply(spec, *a, *bufs), args, eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", ["gqa", "alibi"])
def test_derived_backward_equals_torch_autograd_in_float64(case):
    spec = _spec(case)
    hq, hkv, sm, mm, _ = CASES[case]
    q, k, v, slopes = _inputs(case, seed=3)
    d_o = torch.randn(B, hq, N, D, dtype=torch.float64)
    bufs = (slopes,) if spec.buffers else ()
    want = [t.requires_grad_() for t in (q, k, v)]
    reference(*want, hq, hkv, sm, mm, slopes, spec.scale).backward(d_o)
    got = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ReferenceAttention.apply(spec, *got, *bufs).backward(d_o)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.grad, w.grad, rtol=1e-10, atol=1e-12)


def test_derived_programs_are_flashattention_2(golden):
    """Soft-cap's derived backward, printed: P recomputed from lse, delta = rowsum(dO * O),
    dS = P * (dP - delta), the cap's 1 - tanh^2 applied with the scale."""
    bw = attention_backward(*attention_definition(_spec("softcap", scale=0.5)))
    d_qk = next(t for t in tensors_in_order(list(bw.grads)) if t.name == "d_qk")
    golden("attention_softcap_backward.txt", program_str([d_qk, *bw.grads]) + "\n")


# --------------------------------------------------------------- nf.attention, autograd


def _attention(case: str, q, k, v, slopes, cache, n_rows: int):
    hq, hkv, sm, mm, bufs = CASES[case]
    return nf.attention(q, k, v, score_mod=sm, mask_mod=mm, scale=0.7, enable_gqa=hq != hkv,
                        buffers={"slopes": slopes} if bufs else None, cache=cache,
                        q_offset="end" if n_rows == 1 else None)


KD = 3    # the kernels' head dim: below any tile, so its masks are exercised


@pytest.mark.parametrize("case,n", [("plain", 8), ("gqa", 8), ("softcap", 8),
                                    ("alibi", 8), ("window", 8), ("gqa", 1)])
def test_attention_gradients_float32_against_float64(case, n):
    hq, hkv, sm, mm, _ = CASES[case]
    cache = AttentionCache(store=False)
    q, k, v, slopes = _inputs(case, dtype=torch.float32, seed=5, n=n, m=8, d=KD)
    got = [t.clone().requires_grad_() for t in (q, k, v)]
    o = _attention(case, *got, slopes, cache, n)
    assert o.grad_fn is not None
    # saved: q, k, v, o and the row lse -- never a rows x keys tensor
    saved = o.grad_fn.saved_tensors
    assert max(t.numel() for t in saved) <= max(t.numel() for t in (q, k, v, o))
    d_o = torch.randn_like(o)
    o.backward(d_o)
    want = [t.double().requires_grad_() for t in (q, k, v)]
    ref = reference(*want, hq, hkv, sm, mm, slopes.double(), 0.7)
    torch.testing.assert_close(o.detach().double(), ref.detach(), rtol=1e-5, atol=1e-5)
    ref.backward(d_o.double())
    for name, g, w in zip("qkv", got, want):
        torch.testing.assert_close(g.grad.double(), w.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, name=name: f"d_{name}: {m}")


def test_causal_gradients_at_lengths_on_and_off_the_tile_multiple():
    """The d_k, d_v kernel is compiled per class of lengths (``static_sizes``) and runs
    its ragged-tail loop only when the query length is not a multiple of BLOCK_N
    (``LOOP_EVEN``): one cache serves 64 (a multiple of every tile) and 70 correctly."""
    cache = AttentionCache(store=False)
    for n in (64, 70, 64):
        q, k, v, slopes = _inputs("causal", dtype=torch.float32, seed=n, n=n, m=n, d=KD)
        got = [t.clone().requires_grad_() for t in (q, k, v)]
        o = _attention("causal", *got, slopes, cache, n)
        d_o = torch.randn_like(o)
        o.backward(d_o)
        want = [t.double().requires_grad_() for t in (q, k, v)]
        hq, hkv, sm, mm, _ = CASES["causal"]
        ref = reference(*want, hq, hkv, sm, mm, slopes.double(), 0.7)
        ref.backward(d_o.double())
        for name, g, w in zip("qkv", got, want):
            torch.testing.assert_close(g.grad.double(), w.grad, rtol=1e-4, atol=1e-5,
                                       msg=lambda m, name=name, n=n: f"n={n} d_{name}: {m}")


def test_gradients_when_the_value_head_dim_differs():
    """Values narrower than queries and keys (as in multi-head latent attention): d_k and
    d_v have different widths, which one rolling kernel cannot hold, so they run as two
    kernels (frontend/attention_grad._Apart). Before, the backward raised a CodegenError
    ("members depend on different axes"). Causal GQA, float32 against float64."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 20, 32, generator=g)
    k = torch.randn(2, 2, 20, 32, generator=g)
    v = torch.randn(2, 2, 20, 16, generator=g)
    got = [t.clone().requires_grad_() for t in (q, k, v)]
    o = nf.attention(*got, mask_mod=ops.Causal(), enable_gqa=True)
    d_o = torch.randn(o.shape, generator=g)
    o.backward(d_o)
    want = [t.double().requires_grad_() for t in (q, k, v)]
    kk, vv = (t.repeat_interleave(2, dim=1) for t in want[1:])
    s = (want[0] @ kk.transpose(-1, -2)) * 32 ** -0.5
    s = s.masked_fill(torch.ones(20, 20, dtype=torch.bool).triu(1), float("-inf"))
    (torch.softmax(s, -1) @ vv).backward(d_o.double())
    for name, a, b in zip("qkv", got, want):
        torch.testing.assert_close(a.grad.double(), b.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, name=name: f"d_{name}: {m}")


def test_a_fully_masked_row_gets_zero_gradient():
    """Row 0 has no key: lse = -inf, passed as +inf, so p = 0 and no gradient flows. (On
    the reference: the compiled backward of this mask crashes the CPU interpreter today,
    docs/autodiff.md.)"""
    spec = AttentionSpec(dtype="float32", q_heads=2, kv_heads=2, head_dim=D, v_head_dim=D,
                         scale=0.7, mask_mod=lambda b, h, i, j: (j <= i) & (i > 0), lse=True)
    got = [t.requires_grad_() for t in _inputs("causal", seed=7)[:3]]
    o = ReferenceAttention.apply(spec, *got)
    o.backward(torch.randn_like(o))
    assert torch.all(got[0].grad[:, :, 0] == 0) and torch.any(got[0].grad[:, :, 1:] != 0)
    assert torch.isfinite(got[1].grad).all() and torch.isfinite(got[2].grad).all()


def test_a_buffer_that_requires_grad_is_refused():
    q, k, v, slopes = _inputs("alibi", dtype=torch.float32)
    with pytest.raises(nf.FeedError, match="buffer 'slopes' requires grad, but buffers "
                                           "get no gradient"):
        nf.attention(q.requires_grad_(), k, v, score_mod=alibi, mask_mod=causal,
                     buffers={"slopes": slopes.requires_grad_()},
                     cache=AttentionCache(store=False))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_attention_gradients_half_precision_against_float64(dtype):
    """Half-precision inputs: the backward reads them widened to float32 (products summed
    in float32), writes gradients in the inputs' dtype.

    The error scales with the largest gradient, not with each element: the forward's
    output is rounded to ``dtype`` and the backward's ``delta = rowsum(dO * O)`` subtracts
    it from every score's ``dP``, so a small gradient element inherits an error of order
    ``eps * max|grad|``. Measured over 40 draws of ``dO`` (2026-12-03): at most 0.9 eps
    (float16, eps = 2^-10) and 1.7 eps (bfloat16, eps = 2^-7) of the largest gradient;
    the bound is 4 eps."""
    hq, hkv, sm, mm, _ = CASES["gqa"]
    q, k, v, slopes = _inputs("gqa", dtype=torch.float32, seed=9, n=8, m=8, d=16)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    got = [t.clone().requires_grad_() for t in (q, k, v)]
    o = nf.attention(*got, score_mod=softcap, mask_mod=mm, scale=0.7, enable_gqa=True,
                     cache=AttentionCache(store=False))
    d_o = torch.randn(o.shape, generator=torch.Generator().manual_seed(10)).to(dtype)
    o.backward(d_o)
    want = [t.double().requires_grad_() for t in (q, k, v)]
    reference(*want, hq, hkv, softcap, mm, None, 0.7).backward(d_o.double())
    eps = torch.finfo(dtype).eps
    for name, g, w in zip("qkv", got, want):
        assert g.grad.dtype == dtype
        tol = 4 * eps * float(w.grad.abs().max())
        torch.testing.assert_close(g.grad.double(), w.grad, rtol=0, atol=tol,
                                   msg=lambda m, name=name: f"d_{name}: {m}")


def test_attention_backward_of_a_fully_masked_row_is_zero():
    cache = AttentionCache(store=False)
    q, k, v, _ = _inputs("causal", dtype=torch.float32, seed=7, n=4, m=4, d=KD)
    got = [t.clone().requires_grad_() for t in (q, k, v)]
    o = nf.attention(*got, mask_mod=lambda b, h, i, j: (j <= i) & (i > 0), cache=cache)
    o.backward(torch.randn_like(o))
    assert torch.all(got[0].grad[:, :, 0] == 0) and torch.any(got[0].grad[:, :, 1:] != 0)
    assert torch.isfinite(got[1].grad).all() and torch.isfinite(got[2].grad).all()


@pytest.mark.parametrize("case", ["gqa", "alibi"])
def test_a_compiled_training_step_through_the_op(case, monkeypatch):
    """torch.compile(fullgraph=True) of a loss over nf.attention, then backward: the
    neptune_fusion::attention op gives the output and its lse, and its registered
    autograd runs the backward op on both (the derived kernels; the forward kernel runs
    once, not again in the backward); gradients against float64."""
    from triton.runtime import interpreter
    launched = []   # the Triton kernels run on the interpreter, by name
    plain = interpreter.GridExecutor.__call__

    def counting(self, *args, **kw):
        launched.append(self.fn.__name__)
        return plain(self, *args, **kw)
    monkeypatch.setattr(interpreter.GridExecutor, "__call__", counting)
    hq, hkv, sm, mm, _ = CASES[case]
    cache = AttentionCache(store=False)
    q, k, v, slopes = _inputs(case, dtype=torch.float32, seed=9, n=8, m=8, d=KD)
    got = [t.clone().requires_grad_() for t in (q, k, v)]
    d_o = torch.randn(q.shape[0], hq, 8, KD, generator=torch.Generator().manual_seed(3))

    def loss(q, k, v):
        return (_attention(case, q, k, v, slopes, cache, 8) * d_o).sum()
    torch._dynamo.reset()
    torch.compile(loss, fullgraph=True, backend="aot_eager")(*got).backward()
    if os.environ.get("TRITON_INTERPRET") == "1":   # launches are counted there
        assert launched.count("attention") == 1, launched
        assert any(n.startswith("attention_backward") for n in launched), launched
    want = [t.double().requires_grad_() for t in (q, k, v)]
    (reference(*want, hq, hkv, sm, mm, slopes.double(), 0.7) * d_o.double()).sum().backward()
    for name, g, w in zip("qkv", got, want):
        torch.testing.assert_close(g.grad.double(), w.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, name=name: f"d_{name}: {m}")
