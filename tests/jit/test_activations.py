"""Activations and losses around a chain join its kernel through the backend.

Before, ``softmax(leaky_relu(x))``, ``elu``, ``hardswish``, ``mish``, ``special.entr`` and
friends had no translation rule: the activation ran as a kernel of its own writing the
whole tensor, which the chain's kernel read again. torch's own decompositions bring them
to ``where`` / ``clamp`` / ``expm1`` / ``softplus`` / ``log1p`` (decomp.ACTIVATIONS), which
the rule table translates; ``expm1`` and ``log1p`` keep their accuracy near 0 (Kahan's
forms), so ``softplus`` is no longer 0 below -17 in float32. A cross-entropy over
``(N, C, H, W)`` (``nll_loss2d``) is the 2-d loss's gather along the class dimension.
Every output against float64 eager PyTorch; the report shows the op inside the chain.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neptune_fusion.dynamo import Backend

MAPS = {
    "leaky_relu": (lambda t: F.leaky_relu(t, 0.1), "where"),
    "elu": (F.elu, "expm1"),
    "celu": (lambda t: F.celu(t, 0.7), "expm1"),
    "selu": (F.selu, "expm1"),
    "hardswish": (F.hardswish, "clamp"),
    "hardsigmoid": (F.hardsigmoid, "clamp"),
    "relu6": (F.relu6, "clamp"),
    "hardtanh": (lambda t: F.hardtanh(t, -2.0, 2.5), "clamp"),
    "mish": (F.mish, "softplus"),
    "softplus": (lambda t: F.softplus(t * 8.0), "softplus"),
    "logsigmoid": (F.logsigmoid, "log1p"),
    "log1p": (lambda t: torch.log1p(t.abs() * 1e-6), "log1p"),
    "expm1": (lambda t: torch.expm1(t * 1e-5), "expm1"),
}


def _run(fn, *args):
    torch._dynamo.reset()
    backend = Backend(rest="eager")
    got = torch.compile(fn, backend=backend)(*args)
    [report] = backend.reports
    return got, report


@pytest.mark.parametrize("name", list(MAPS))
def test_an_activation_before_a_softmax_joins_its_kernel(name):
    act, op = MAPS[name]

    def fn(x):
        return torch.log_softmax(act(x) * 3.0, -1)
    gen = torch.Generator().manual_seed(len(name))
    x = torch.randn(5, 37, generator=gen) * 4.0
    x[0, :4] = torch.tensor([0.0, -30.0, 30.0, 1e-7])
    got, report = _run(fn, x)
    want = fn(x.double())
    torch.testing.assert_close(got.double(), want, rtol=2e-6, atol=2e-6)
    assert len(report.fused) == 1 and not report.left, report
    assert op in report.fused[0].ops, report


def test_entropy_through_special_entr():
    def fn(x):
        return torch.special.entr(torch.softmax(x, -1)).sum(-1)
    x = torch.randn(4, 50, generator=torch.Generator().manual_seed(1)) * 3.0
    got, report = _run(fn, x)
    torch.testing.assert_close(got.double(), fn(x.double()), rtol=1e-5, atol=1e-6)
    assert len(report.fused) == 1 and not report.left, report


def test_expm1_and_log1p_keep_their_accuracy_near_zero():
    """The plain forms (``exp(x) - 1``, ``log(1 + x)``) lose every digit at 1e-8."""
    def fn(x):
        return torch.softmax(x, -1) * torch.expm1(x * 1e-8) + torch.log1p(x.abs() * 1e-8)
    x = torch.randn(3, 20, generator=torch.Generator().manual_seed(2))
    got, _ = _run(fn, x)
    want = fn(x.double())
    assert ((got.double() - want).abs() <= 1e-6 * want.abs() + 1e-14).all()


@pytest.mark.parametrize("kw", [{}, {"reduction": "none"}, {"ignore_index": 3},
                                {"weight": True, "reduction": "sum"}])
def test_cross_entropy_over_pixels_is_one_chain(kw):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(3, 10, 4, 5, generator=gen)
    t = torch.randint(0, 10, (3, 4, 5), generator=gen)
    t[0, 0, :3] = 3
    w = torch.rand(10, generator=gen) + 0.5
    kw = {**kw, "weight": w} if kw.get("weight") else kw

    def fn(x, t):
        return F.cross_entropy(x, t, **kw)
    got, report = _run(fn, x, t)
    want = F.cross_entropy(x.double(), t, **{k: v.double() if torch.is_tensor(v) else v
                                             for k, v in kw.items()})
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    assert report.fused and "gather" in report.fused[0].ops, report
    assert all("nll_loss2d" not in " ".join(p.ops) for p in report.left), report


@pytest.mark.parametrize("rest", ["eager", "inductor"])
def test_gradients_through_decomposed_activations(rest):
    """A training graph: the activations decomposed in the forward, their backward ops
    as autograd recorded them (``log_sigmoid_backward`` reads the buffer the decomposed
    forward computes on the CPU); every gradient against float64 autograd."""
    def fn(x):
        y = F.logsigmoid(x) + F.elu(x) + F.mish(x) + F.hardswish(x) + F.leaky_relu(x, 0.2)
        return torch.log_softmax(y, -1)
    x0 = torch.randn(4, 19, generator=torch.Generator().manual_seed(3)) * 3.0
    torch._dynamo.reset()
    x = x0.clone().requires_grad_()
    got = torch.compile(fn, backend=Backend(rest=rest))(x)
    (got * torch.arange(19.0)).sum().backward()
    x64 = x0.double().requires_grad_()
    want = fn(x64)
    (want * torch.arange(19.0, dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(got.double(), want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-4, atol=1e-5)
