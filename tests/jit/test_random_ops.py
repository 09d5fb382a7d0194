"""Random ops through the backend (a fuzzing find of 2026-12-04: with Inductor as the
rest they raised a ``LoweringException``, the graph's ``aten.rand`` never made Inductor's
random prims: dynamo/inductor.native_random). Random values cannot be compared with
eager PyTorch's; their statistics and what they leave unchanged can: dropout's fraction
of zeros and the scaling of what it keeps, the gradient through the same mask, and the
chains beside them, against float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neptune_fusion.dynamo import Backend

P = 0.3
RESTS = ["inductor", "eager"]


def _compiled(fn, rest):
    torch._dynamo.reset()
    backend = Backend(rest=rest)
    return torch.compile(fn, backend=backend), backend


def _positive(shape, seed=0):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) + 1.0


def _assert_dropout_of(y, x, p=P):
    """``y`` is ``x`` with about ``p`` of its elements zeroed and the rest scaled by
    ``1 / (1 - p)`` (``x`` has no zeros of its own)."""
    kept = y != 0
    assert abs(float(1.0 - kept.double().mean()) - p) < 0.02, float(kept.double().mean())
    torch.testing.assert_close(y[kept].double(), x[kept].double() / (1 - p),
                               rtol=1e-6, atol=0)


@pytest.mark.parametrize("rest", RESTS)
def test_dropout_zeroes_its_fraction_and_scales_the_rest(rest):
    x = _positive((128, 256))
    fn, _ = _compiled(lambda x: F.dropout(x, P, training=True), rest)
    first, second = fn(x), fn(x)
    _assert_dropout_of(first, x)
    _assert_dropout_of(second, x)
    assert not torch.equal(first != 0, second != 0)   # a new mask per call


@pytest.mark.parametrize("rest", RESTS)
def test_rand_like_is_uniform_and_follows_the_seed(rest):
    x = torch.zeros(256, 256)
    fn, _ = _compiled(lambda x: torch.rand_like(x) + x, rest)
    torch.manual_seed(7)
    u = fn(x)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.double().mean()) - 0.5) < 0.01
    assert abs(float(u.double().var()) - 1 / 12) < 0.01
    torch.manual_seed(7)
    assert torch.equal(fn(x), u)
    assert not torch.equal(fn(x), u)


@pytest.mark.parametrize("rest", RESTS)
def test_chains_beside_and_after_dropout_are_fused_and_exact(rest):
    """A softmax chain whose epilogue adds the dropout's result, and a chain over that
    result: fused, and each equal to float64 eager PyTorch of the values it read."""
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))

    def fn(x):
        h = F.dropout(x, 0.5, training=True)
        return torch.softmax(x, -1) + h, torch.log_softmax(h, -1), h
    g, backend = _compiled(fn, rest)
    with torch.no_grad():
        beside, after, h = g(x)
    kept = h != 0
    torch.testing.assert_close(h[kept].double(), x[kept].double() * 2, rtol=1e-6, atol=0)
    assert 0.4 < float(1.0 - kept.double().mean()) < 0.6
    x64, h64 = x.double(), h.double()
    torch.testing.assert_close(beside.double(), torch.softmax(x64, -1) + h64,
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(after.double(), torch.log_softmax(h64, -1),
                               rtol=1e-5, atol=1e-5)
    [report] = backend.reports
    fused = [set(f.ops) for f in report.fused]
    assert any({"amax", "exp", "sum", "add"} <= ops for ops in fused), report
    assert any("log" in ops for ops in fused), report


@pytest.mark.parametrize("rest", RESTS)
def test_dropout_gradient_goes_through_the_same_mask(rest):
    x = _positive((64, 128), seed=2).requires_grad_()
    fn, _ = _compiled(lambda x: F.dropout(x, P, training=True) * 3.0, rest)
    y = fn(x)
    d_y = torch.randn(y.shape, generator=torch.Generator().manual_seed(3))
    y.backward(d_y)
    _assert_dropout_of(y.detach() / 3.0, x.detach())
    torch.testing.assert_close(x.grad, (y.detach() != 0) * d_y * 3.0 / (1 - P),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rest", RESTS)
def test_sdpa_with_dropout_drops_the_attention_weights(rest):
    """With the identity as values, SDPA's output is its dropped attention weights:
    zero or the float64 softmax of the scores over ``1 - p``."""
    gen = torch.Generator().manual_seed(4)
    q, k = (torch.randn(2, 4, 64, 16, generator=gen) for _ in range(2))
    v = torch.eye(64).expand(2, 4, 64, 64)
    fn, _ = _compiled(lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, dropout_p=P), rest)
    with torch.no_grad():
        out = fn(q, k, v)
    weights = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 4.0, -1)
    kept = out != 0
    assert abs(float(1.0 - kept.double().mean()) - P) < 0.02
    torch.testing.assert_close(out[kept].double(), weights[kept] / (1 - P),
                               rtol=1e-5, atol=1e-7)
