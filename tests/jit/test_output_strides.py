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


DYNAMIC = {
    "t": (lambda x: torch.softmax(x, -1).t(), ((8, 40), (6, 50), (5, 33))),
    "transpose-4d": (lambda x: torch.log_softmax(x, -1).transpose(1, 2),
                     ((2, 3, 5, 16), (3, 4, 6, 20), (2, 5, 3, 24))),
    "permute-3d-map": (lambda x: torch.softmax(x, -1).permute(2, 0, 1) * 2.0,
                       ((2, 4, 32), (3, 5, 40), (4, 3, 36))),
}


@pytest.mark.parametrize("rest", ["eager", "inductor"])
@pytest.mark.parametrize("dynamic", [True, None])
@pytest.mark.parametrize("name", list(DYNAMIC))
def test_dynamic_graph_outputs_keep_eagers_strides(name, dynamic, rest):
    """A dynamic graph (``dynamic=True``, or the graph ``dynamic=None`` compiles at the
    second size) writes a permuted output in memory order too: its symbolic strides are
    compared as expressions of the sizes (rewrite._memory_order). It came back
    contiguous (the 2026-12-04 evening fuzzing session)."""
    fn, shapes = DYNAMIC[name]
    gen = torch.Generator().manual_seed(len(name))
    torch._dynamo.reset()
    backend = Backend(rest=rest)
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    for shape in shapes:
        x = torch.randn(*shape, generator=gen)
        with torch.no_grad():
            y = compiled(x)
        e = fn(x)
        assert y.shape == e.shape and y.stride() == e.stride(), (shape, y.stride(),
                                                                 e.stride())
        torch.testing.assert_close(y.double(), fn(x.double()), rtol=1e-5, atol=1e-6)
    assert backend.reports[-1].dynamic, backend.reports[-1]   # the dynamic graph served
    assert all(r.fused for r in backend.reports), backend.reports


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


def test_memory_order_of_a_symbolic_value():
    """Symbolic strides: the order in which the strides are contiguous for every value
    of the sizes, found without guarding (no SymInt compared)."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    env = ShapeEnv()

    def size(n, name):
        src = ConstantSource(name)
        return env.create_symintnode(env.create_symbol(n, src, dynamic_dim=DimDynamic.DYNAMIC),
                                     hint=n, source=src)
    with FakeTensorMode(shape_env=env):
        t = torch.empty(size(4, "a"), size(6, "b"), size(5, "c"))
        assert not isinstance(t.stride(0), int)
        assert _memory_order(t) is None
        assert _memory_order(t.permute(2, 0, 1)) == (1, 2, 0)
        assert _memory_order(t.transpose(0, 1)) == (1, 0, 2)
        assert _memory_order(t[:, ::2]) is None
    assert not env.guards
