"""Written-out attention in a training graph becomes one SDPA call
(dynamo/written_attention.py): its kernel and backward save no probabilities. Each form
a model writes, its output and gradients against float64; the forms it must leave alone
(a finite fill, the probabilities read elsewhere) stay as they are, and an inference
graph keeps fusing the written form. A live dropout becomes SDPA's ``dropout_p``: the
same distribution (checked by its mean), SDPA's random numbers."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import neptune_fusion as nf
from neptune_fusion.dynamo.written_attention import (
    causal_masks_to_is_causal,
    written_attention_to_sdpa,
)

MADE = "made SDPA's call"


def _causal(n, m):
    return torch.arange(m)[None, :] <= torch.arange(n)[:, None] + (m - n)


def _gpt2(q, k, v):   # transformers' eager attention: an additive float mask
    s = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    mask = torch.where(_causal(q.shape[-2], k.shape[-2]), torch.zeros((), dtype=q.dtype),
                       torch.finfo(q.dtype).min)
    p = F.softmax(s + mask, dim=-1).type(v.dtype)
    return torch.matmul(F.dropout(p, p=0.0, training=True), v)


def _masked_fill(q, k, v):
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~_causal(q.shape[-2], k.shape[-2]), float("-inf"))
    return s.softmax(-1) @ v


def _where(q, k, v):
    s = torch.where(_causal(q.shape[-2], k.shape[-2]), q @ k.mT, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _plain(q, k, v):
    return torch.softmax(0.3 * (q @ k.mT), -1) @ v


def _two_masks(q, k, v):
    bias = torch.linspace(-1.0, 1.0, k.shape[-2])
    pad = torch.zeros(k.shape[-2]).masked_fill(torch.arange(k.shape[-2]) > 9, -1e9)
    return torch.softmax(q @ k.mT * 0.25 + bias + pad, -1) @ v


FORMS = {"gpt2": _gpt2, "masked_fill": _masked_fill, "where": _where, "plain": _plain,
         "two-masks": _two_masks}


def _qkv(gen, shape=(2, 3, 12, 16), m=20):
    q = torch.randn(*shape, generator=gen)
    k, v = (torch.randn(*shape[:-2], m, shape[-1], generator=gen) for _ in range(2))
    return q, k, v


def _step_against_float64(fn, args, gen):
    """One training step of ``fn`` through the backend (the rest eager): the output and
    the three gradients against float64 autograd; the graph's report."""
    cot = torch.randn(args[0].shape, generator=gen)
    torch._dynamo.reset()
    g = nf.jit(fn, rest="eager")
    xs = [a.clone().requires_grad_() for a in args]
    out = g(*xs)
    (out * cot).sum().backward()
    ref = [a.double().requires_grad_() for a in args]
    want = fn(*ref)
    (want * cot.double()).sum().backward()
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-5)
    for a, r in zip(xs, ref):
        torch.testing.assert_close(a.grad.double(), r.grad, rtol=1e-4, atol=1e-5)
    [report] = g.backend.reports
    return report


@pytest.mark.parametrize("form", list(FORMS))
def test_written_attention_in_training_becomes_sdpa(form):
    gen = torch.Generator().manual_seed(len(form))
    report = _step_against_float64(FORMS[form], _qkv(gen), gen)
    assert any(MADE in x.reason for x in report.left), report


def _traced(fn, args):
    got = []

    def backend(gm, example):
        got.append(written_attention_to_sdpa(gm))
        return gm.forward
    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend)(*args)
    return got[0], out


def test_the_rewritten_graph_computes_the_same():
    """The Dynamo graph rewritten, run as it is: 3-d inputs too, and an attention
    returned from the graph (made contiguous, as the product's result was)."""
    gen = torch.Generator().manual_seed(3)
    for shape in ((2, 3, 12, 16), (4, 12, 16)):
        args = _qkv(gen, shape)
        for fn in FORMS.values():
            made, out = _traced(fn, args)
            assert made == 1, fn.__name__
            assert out.is_contiguous()
            torch.testing.assert_close(out, fn(*args), rtol=1e-5, atol=1e-5)


def _finite_fill(q, k, v):   # a row masked everywhere: uniform here, not under SDPA
    s = torch.where(_causal(q.shape[-2], k.shape[-2]), q @ k.mT, -1e4)
    return torch.softmax(s, -1) @ v


def _probabilities_too(q, k, v):
    p = torch.softmax(q @ k.mT, -1)
    return p @ v, p


def _upcast_no_cast_back(q, k, v):   # float32 probabilities times 16-bit values
    return torch.softmax(q @ k.mT, -1, dtype=torch.float32) @ v.float()


def _widened(q, k, v):   # the mask makes the scores bigger than q @ k^T
    return torch.softmax(q @ k.mT + torch.zeros(5, 1, 1, 1, 1), -1) @ v


@pytest.mark.parametrize("fn", [_finite_fill, _probabilities_too,
                                _upcast_no_cast_back, _widened])
def test_forms_left_alone(fn):
    args = _qkv(torch.Generator().manual_seed(4))
    if fn is _upcast_no_cast_back:
        args = tuple(a.bfloat16() for a in args)
    made, _ = _traced(fn, args)
    assert made == 0


def test_an_inference_graph_fuses_the_written_form():
    args = _qkv(torch.Generator().manual_seed(5))
    torch._dynamo.reset()
    g = nf.jit(_gpt2, rest="eager")
    with torch.no_grad():
        out = g(*args)
    torch.testing.assert_close(out.double(), _gpt2(*[a.double() for a in args]),
                               rtol=1e-5, atol=1e-5)
    [report] = g.backend.reports
    assert report.fused and not any(MADE in x.reason for x in report.left), report


class _NanoAttention(torch.nn.Module):
    """nanoGPT's attention without flash: a causal buffer compared with 0, ``-inf``, an
    ``nn.Dropout`` of 0, projections before and after."""

    def __init__(self, d=32, heads=4, n=16):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.drop = torch.nn.Dropout(0.0)
        self.register_buffer("bias", torch.tril(torch.ones(n, n)).view(1, 1, n, n))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(x).split(c, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        y = self.drop(F.softmax(att, dim=-1)) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


def test_a_nanogpt_attention_module_trains_through_sdpa():
    torch.manual_seed(0)
    m = _NanoAttention().train()
    m64 = _NanoAttention().double().train()
    m64.load_state_dict(m.state_dict())
    x = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    g = nf.jit(m, rest="eager")
    out = g(x)
    out.square().sum().backward()
    want = m64(x.double())
    want.square().sum().backward()
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(m.named_parameters(), m64.parameters()):
        torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda e, name=name: f"{name}: {e}")
    [report] = g.backend.reports
    assert any(MADE in x.reason for x in report.left), report


def test_a_learned_bias_gets_its_gradient():
    """A bias that requires grad (T5's relative positions, learned): SDPA's mask takes
    its gradient too."""
    gen = torch.Generator().manual_seed(6)
    q, k, v = _qkv(gen)
    bias = torch.randn(3, 12, 20, generator=gen) * 0.5

    def fn(q, k, v, bias):
        return torch.softmax(q @ k.mT * 0.25 + bias, -1) @ v
    torch._dynamo.reset()
    g = nf.jit(fn, rest="eager")
    xs = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    g(*xs).square().sum().backward()
    ref = [t.double().requires_grad_() for t in (q, k, v, bias)]
    fn(*ref).square().sum().backward()
    for a, r in zip(xs, ref):
        torch.testing.assert_close(a.grad.double(), r.grad, rtol=1e-4, atol=1e-5)
    assert any(MADE in x.reason for x in g.backend.reports[0].left)


def _dropped(q, k, v):
    return F.dropout(torch.softmax(q @ k.mT * 0.25, -1), p=0.3, training=True) @ v


def test_a_live_dropout_becomes_sdpas_and_keeps_its_mean():
    """The rewritten graph is SDPA with ``dropout_p`` (the same numbers as SDPA's own
    call under the same seed), and its mean over many draws is the attention without
    dropout (inverted dropout keeps the expectation), within four standard errors."""
    gen = torch.Generator().manual_seed(7)
    q, k, v = _qkv(gen, (1, 2, 6, 8), m=5)
    made, _ = _traced(_dropped, (q, k, v))
    assert made == 1
    torch._dynamo.reset()
    g = nf.jit(_dropped, rest="eager")
    xs = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(11)
    got = g(*xs)
    torch.manual_seed(11)
    want = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, scale=0.25)
    torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-6)
    got.sum().backward()   # a backward runs
    assert all(torch.isfinite(t.grad).all() for t in xs)
    draws = torch.stack([g(*xs).detach() for _ in range(400)])   # the training graph
    assert len(g.backend.reports) == 1   # no other graph compiled for the draws
    exact = torch.softmax(q.double() @ k.double().mT * 0.25, -1) @ v.double()
    err = (draws.double().mean(0) - exact).abs()
    assert (err <= 4 * draws.double().std(0) / 20 + 1e-6).all(), float(err.max())


def _llama(q, k, v):   # transformers' eager attention: the softmax in float32, cast back
    s = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5
    s = s + torch.where(_causal(q.shape[-2], k.shape[-2]), 0.0,
                        torch.full((), torch.finfo(q.dtype).min, dtype=q.dtype))
    p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(F.dropout(p, p=0.0, training=True), v)


def _dot_float(q, k, v):
    return torch.softmax((q @ k.mT * 0.25).float(), -1).to(v.dtype) @ v


@pytest.mark.parametrize("fn", [_llama, _dot_float])
def test_a_float32_softmax_of_16_bit_scores_becomes_sdpa(fn):
    """Llama's eager attention in bfloat16 takes its softmax in float32 and casts the
    probabilities back: SDPA's kernels do the same inside. Output and gradients against
    float64 within bfloat16's tolerance."""
    gen = torch.Generator().manual_seed(8)
    args = [a.bfloat16() for a in _qkv(gen)]
    cot = torch.randn(2, 3, 12, 16, generator=gen)
    torch._dynamo.reset()
    g = nf.jit(fn, rest="eager")
    xs = [a.clone().requires_grad_() for a in args]
    out = g(*xs)
    (out.float() * cot).sum().backward()
    ref = [a.double().requires_grad_() for a in args]
    want = fn(*ref)
    (want * cot.double()).sum().backward()
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), want, rtol=3e-2, atol=3e-2)
    for a, r in zip(xs, ref):
        torch.testing.assert_close(a.grad.double(), r.grad, rtol=5e-2, atol=5e-2)
    assert any(MADE in x.reason for x in g.backend.reports[0].left)


def _sdpa_kwargs(fn, args) -> list:
    """The keyword arguments of each SDPA call the rewrite made in ``fn``'s graph."""
    got = []

    def backend(gm, example):
        written_attention_to_sdpa(gm)
        causal_masks_to_is_causal(gm)
        got.extend({"is_causal": False, **n.kwargs} for n in gm.graph.nodes
                   if n.target is F.scaled_dot_product_attention)
        return gm.forward
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(fn, backend=backend)(*args), fn(*args),
                               rtol=1e-5, atol=1e-5)
    return got


def _tril_fill(q, k, v):   # a boolean mask from torch.ones(...).tril()
    keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    return (q @ k.mT).masked_fill(keep.logical_not(), float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("form", ["gpt2", "masked_fill", "where", "tril"])
def test_a_causal_mask_from_positions_becomes_is_causal(form):
    """Queries and keys of one length: the mask, built from positions alone, is the
    causal pattern, so SDPA's call takes ``is_causal=True`` (flash attention, no mask
    saved) instead of the tensor; output and gradients against float64."""
    fn = _tril_fill if form == "tril" else FORMS[form]
    gen = torch.Generator().manual_seed(7)
    args = _qkv(gen, (2, 3, 12, 16), m=12)
    [kw] = _sdpa_kwargs(fn, args)
    assert kw["is_causal"] is True and kw["attn_mask"] is None, kw
    _step_against_float64(fn, args, gen)


class _BufferMask(torch.nn.Module):   # nanoGPT's: a registered buffer is data
    def __init__(self, n):
        super().__init__()
        self.register_buffer("bias", torch.ones(n, n).tril().view(1, 1, n, n))

    def forward(self, q, k, v):
        n = q.shape[-2]
        s = (q @ k.mT).masked_fill(self.bias[:, :, :n, :n] == 0, float("-inf"))
        return s.softmax(-1) @ v


def _shifted(q, k, v):   # the diagonal itself masked: not SDPA's causal pattern
    j, i = torch.arange(k.shape[-2])[None, :], torch.arange(q.shape[-2])[:, None]
    keep = (j < i) | (j == 0)
    return torch.softmax((q @ k.mT).masked_fill(~keep, float("-inf")), -1) @ v


def _shallow(q, k, v):   # masked entries at -1e4: their weight is not exactly 0
    mask = torch.where(_causal(q.shape[-2], k.shape[-2]), 0.0, -1e4)
    return torch.softmax(q @ k.mT + mask, -1) @ v


def _biased(q, k, v):   # causal, but the kept entries carry a bias
    mask = torch.where(_causal(q.shape[-2], k.shape[-2]), 0.5, float("-inf"))
    return torch.softmax(q @ k.mT + mask, -1) @ v


@pytest.mark.parametrize("form", ["buffer", "bottom-right", "shifted", "shallow", "biased"])
def test_other_masks_stay_masks(form):
    """A mask read from a tensor (a buffer can change), a causal mask aligned at the
    bottom right (12 queries over 20 keys: SDPA's ``is_causal`` is top-left), the
    diagonal masked, masked entries at -1e4, kept entries with a bias: each call keeps
    its mask."""
    gen = torch.Generator().manual_seed(8)
    m = 20 if form == "bottom-right" else 12
    args = _qkv(gen, (2, 3, 12, 16), m=m)
    fn = {"buffer": _BufferMask(12), "bottom-right": FORMS["gpt2"], "shifted": _shifted,
          "shallow": _shallow, "biased": _biased}[form]
    [kw] = _sdpa_kwargs(fn, args)
    assert kw["is_causal"] is False and kw["attn_mask"] is not None, kw


def _sdpa_tril(q, k, v, diagonal=0):   # SDPA called with a causal mask of its own
    keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(diagonal)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=0.3)


def _sdpa_bottom_right(q, k, v):
    return _sdpa_tril(q, k, v, k.shape[-2] - q.shape[-2])


def test_an_sdpa_call_with_a_causal_mask_from_positions_takes_is_causal():
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=tril)`` in training: the mask
    is the causal pattern, so the call takes ``is_causal=True`` (the report says so);
    output and gradients against float64. Aligned at the bottom right (12 queries over
    20 keys) the mask is not SDPA's top-left pattern and stays."""
    gen = torch.Generator().manual_seed(9)
    report = _step_against_float64(_sdpa_tril, _qkv(gen, (2, 3, 12, 16), m=12), gen)
    assert any("is_causal=True" in x.reason for x in report.left), report
    [kw] = _sdpa_kwargs(_sdpa_bottom_right, _qkv(gen, (2, 3, 12, 16), m=20))
    assert kw["is_causal"] is False and kw["attn_mask"] is not None, kw
