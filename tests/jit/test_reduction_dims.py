"""Reductions over torch's edge-case dimension lists match eager: ``dim=[]`` / ``()``
reduces every dimension, and a 0-d tensor's ``dim=0`` or ``-1`` is the tensor itself
(a fuzzing find of 2026-12-04: inf, unreduced results and ZeroDivisionError); the
log-sum-exp of integers and booleans (in the default dtype) and over an empty dimension
(-inf); a float16 layer norm's backward on the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import neptune_fusion as nf

X = torch.randn(4, 7, 16, generator=torch.Generator().manual_seed(0))
S = torch.tensor(1.5)
CASES = {
    "var dim=[]": (lambda x: x.var(dim=[]), X),
    "std_mean dim=()": (lambda x: torch.std_mean(x, dim=()), X),
    "bool amax ()": (lambda x: (x > 0).amax(()), X),
    "bool amin ()": (lambda x: (x > 0).amin(()), X),
    "softmax 0-d": (lambda s: torch.softmax(s, 0), S),
    "log_softmax 0-d": (lambda s: torch.log_softmax(s, -1), S),
    "logsumexp 0-d": (lambda s: torch.logsumexp(s, 0), S),
    "amax 0-d": (lambda s: s.amax(0), S),
    "var_mean 0-d": (lambda s: torch.var_mean(s, 0, correction=0), S),
    "logsumexp of bool": (lambda b: torch.logsumexp(b, -1), X > 0),
    "logsumexp of int": (lambda t: torch.logsumexp(t, 1), torch.arange(12).reshape(3, 4) % 5),
    "logsumexp over nothing": (lambda t: torch.logsumexp(t, -1), torch.randn(4, 0)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_edge_dimension_lists_match_eager(name):
    fn, arg = CASES[name]
    torch._dynamo.reset()
    with torch.no_grad():
        got, want = nf.jit(fn, rest="eager")(arg), fn(arg.double() if arg.is_floating_point()
                                                      else arg)
    got, want = (v if isinstance(v, tuple) else (v,) for v in (got, want))
    for g, w in zip(got, want):
        assert g.shape == w.shape, (g.shape, w.shape)
        torch.testing.assert_close(g.double(), w.double(), rtol=1e-5, atol=1e-5,
                                   equal_nan=True)


def test_a_half_layer_norm_differentiates_on_the_cpu():
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1)).half().requires_grad_()
    torch._dynamo.reset()
    nf.jit(lambda t: F.layer_norm(t, (16,)), rest="eager")(x).float().square().sum().backward()
    ref = x.detach().double().requires_grad_()
    F.layer_norm(ref, (16,)).square().sum().backward()
    torch.testing.assert_close(x.grad.double(), ref.grad, rtol=2e-2, atol=2e-2)
