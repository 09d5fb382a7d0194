"""A graph output that eager PyTorch gives as a permuted layout -- ``softmax(x).t()``, a
map of it -- comes back from the backend with eager's strides: the kernel writes it in
memory order and the graph returns a permuted view (rewrite.output_orders). It came back
contiguous (a fuzzing find, 2026-12-04). Values against float64, strides against eager."""

from __future__ import annotations

import pytest
import torch

from neptune_fusion.dynamo import Backend
from neptune_fusion.dynamo.rewrite import _memory_order

CASES = {
    "t": (lambda x: torch.softmax(x, -1).t(), (8, 32)),
    "t-over-rows": (lambda x: torch.softmax(x, 0).t(), (8, 32)),
    "t-then-map": (lambda x: torch.softmax(x, -1).t() * 2.0 + 1.0, (8, 32)),
    "permute-3d": (lambda x: torch.softmax(x, -1).permute(2, 0, 1), (2, 4, 32)),
    "transpose-4d": (lambda x: torch.log_softmax(x, -1).transpose(1, 2), (2, 3, 5, 16)),
    "both": (lambda x: (torch.softmax(x, -1).t(), torch.softmax(x, -1)), (8, 32)),
}


def _outputs(y):
    return y if isinstance(y, tuple) else (y,)


@pytest.mark.parametrize("rest", ["eager", "inductor"])
@pytest.mark.parametrize("name", list(CASES))
def test_graph_outputs_keep_eagers_strides(name, rest):
    fn, shape = CASES[name]
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(len(name)))
    torch._dynamo.reset()
    backend = Backend(rest=rest)
    with torch.no_grad():
        got = _outputs(torch.compile(fn, backend=backend)(x))
    eager, want = _outputs(fn(x)), _outputs(fn(x.double()))
    assert backend.reports[0].fused, backend.reports[0]
    for y, e, w in zip(got, eager, want):
        assert y.shape == e.shape and y.stride() == e.stride(), (y.stride(), e.stride())
        torch.testing.assert_close(y.double(), w, rtol=1e-5, atol=1e-6)


def test_an_intermediate_keeps_the_kernels_order():
    """A permuted value read only inside the graph (by a ``cumsum``, which has no
    rule) is written as the region computes it: only graph outputs take eager's
    layout."""
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(5))
    torch._dynamo.reset()
    backend = Backend(rest="inductor")
    with torch.no_grad():
        got = torch.compile(lambda x: torch.softmax(x, -1).t().cumsum(-1),
                            backend=backend)(x)
    torch.testing.assert_close(got.double(), torch.softmax(x.double(), -1).t().cumsum(-1),
                               rtol=1e-5, atol=1e-6)
    [fused] = backend.reports[0].fused
    assert [tuple(map(int, o.shape)) for o in fused.kernel.outputs] == [(32, 8)]


def test_a_training_graph_with_permuted_outputs_gives_float64s_gradients():
    """A training forward's outputs include what the backward reads (the transposed
    probabilities the matmul saves); written in eager's order, the gradients still
    match float64."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(8, 32, generator=gen, requires_grad=True)
    w = torch.randn(8, 16, generator=gen)

    def fn(x, w):
        return torch.softmax(x, -1).t() @ w, torch.softmax(x, -1).t() * 3.0
    torch._dynamo.reset()
    got = torch.compile(fn, backend=Backend(rest="inductor"))(x, w)
    x64 = x.detach().double().requires_grad_()
    want = fn(x64, w.double())
    assert got[1].stride() == fn(x, w)[1].stride()
    sum(o.sum() for o in got).backward()
    sum(o.sum() for o in want).backward()
    for y, e in zip(got, want):
        torch.testing.assert_close(y.double(), e.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-6)


def test_memory_order_of_a_value():
    t = torch.empty(4, 6, 5)
    assert _memory_order(t) is None                       # contiguous
    assert _memory_order(t.permute(2, 0, 1)) == (1, 2, 0)
    assert _memory_order(t.transpose(0, 1)) == (1, 0, 2)
    assert _memory_order(t[:, ::2]) is None               # not dense: contiguous then
    assert _memory_order(torch.empty(4, 1).expand(4, 3)) is None
    assert _memory_order(torch.empty(1, 6).t()) is None   # contiguous but for extent 1
