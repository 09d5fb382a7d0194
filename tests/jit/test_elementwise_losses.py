"""Elementwise losses and compound maps after a chain, through the backend with the rest
run eagerly: ops of their own that no rule takes, they cut the chain until our table
decomposed them (decomp.ELEMENTWISE, as Inductor's does). Each case's value and
gradients against float64; the fused chain holds the loss's own arithmetic."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neptune_fusion.dynamo import Backend


def _p(x):   # probabilities, strictly inside (0, 1)
    return torch.softmax(x, -1)


def _logp(x):
    return x - torch.logsumexp(x, -1, keepdim=True)


CASES = {
    "bce-with-logits": lambda x, y, s: F.binary_cross_entropy_with_logits(
        _logp(x), y, reduction="none"),
    "bce": lambda x, y, s: F.binary_cross_entropy(_p(x), y, reduction="none"),
    "huber": lambda x, y, s: F.huber_loss(_logp(x), y, reduction="none", delta=0.7),
    "smooth-l1": lambda x, y, s: F.smooth_l1_loss(_logp(x), y, reduction="none",
                                                  beta=0.5),
    "mse": lambda x, y, s: F.mse_loss(_p(x), y, reduction="none"),
    "soft-margin": lambda x, y, s: F.soft_margin_loss(_logp(x), s, reduction="none"),
    "hinge-embedding": lambda x, y, s: F.hinge_embedding_loss(_logp(x) + 4.0, s,
                                                              reduction="none"),
    "margin-ranking": lambda x, y, s: F.margin_ranking_loss(_logp(x), y, s,
                                                            reduction="none"),
    "rsub": lambda x, y, s: 1.0 - _p(x),
    "addcmul": lambda x, y, s: torch.addcmul(x, _p(x), y, value=0.5),
    "addcdiv": lambda x, y, s: torch.addcdiv(x, _p(x), y + 1.0, value=-2.0),
    "lerp": lambda x, y, s: torch.lerp(y, _p(x), 0.3),
    "xlogy": lambda x, y, s: torch.xlogy(y, _p(x)),
    "logit": lambda x, y, s: torch.logit(_p(x)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_loss_after_a_chain_fuses_with_it(case):
    fn = CASES[case]
    gen = torch.Generator().manual_seed(len(case))
    x, y = torch.randn(6, 40, generator=gen) * 2.0, torch.rand(6, 40, generator=gen)
    sign = torch.randint(0, 2, (6, 40), generator=gen).float() * 2.0 - 1.0
    torch._dynamo.reset()
    backend = Backend(rest="eager")
    xg = x.clone().requires_grad_()
    got = torch.compile(fn, backend=backend)(xg, y, sign)
    got.backward(y)   # fresh weights on every element
    x64 = x.double().requires_grad_()
    want = fn(x64, y.double(), sign.double())
    want.backward(y.double())
    torch.testing.assert_close(got.double(), want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xg.grad.double(), x64.grad, rtol=1e-4, atol=1e-5)
    [report] = backend.reports
    assert report.fused, report
    assert not [x for x in report.left if "cuts a chain" in x.reason], report
