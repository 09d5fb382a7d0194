"""A Python float of a dynamic graph (a scale or shift argument under ``dynamic=True``, or
after ``dynamic=None`` recompiles for a new value) reaches the ATen graph as a 0-d
float64 tensor input, cast to float32 before the tensor arithmetic. Kernels take no
float64, so the arithmetic with it ran outside the fused kernel ("input ... is float64";
the chain fused from its result). The float64 scalar and its casts now run with the
rest and the kernel reads the float32 value, a 0-d tensor, at each call
(``partition.why_not_fusible``): one kernel serves every value, and no value is baked
into a kernel that a later call with another value would reuse. Values against float64
and eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neptune_fusion.dynamo import Backend


def scale_shift(x, scale, shift):
    return torch.softmax(x * scale + shift, -1)


def divided(x, scale):
    return torch.log_softmax(x / scale, -1) * scale


def attention(q, k, v, scale):
    return F.scaled_dot_product_attention(q, k, v, scale=scale)


VALUES = {
    scale_shift: ((0.125, 2.0), (-0.5, 30.0), (3.0, -7.0), (0.25, 0.0), (-2.0, 0.5)),
    divided: ((0.5,), (-3.0,), (2.0,), (0.1,), (7.0,)),
}


def _tensors(fn, gen):
    return (torch.randn(8, 40, generator=gen),)


@pytest.mark.parametrize("rest", ["eager", "inductor"])
@pytest.mark.parametrize("fn", list(VALUES), ids=lambda f: f.__name__)
def test_one_kernel_reads_every_value(fn, rest):
    """``dynamic=True``: one graph, its scalar arithmetic inside the fused region, each
    call's value read (the same shapes, so from the third call on the bound launch
    runs: the scalar is an input address, not a bound constant)."""
    gen = torch.Generator().manual_seed(len(fn.__name__))
    torch._dynamo.reset()
    backend = Backend(rest=rest)
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    tensors = _tensors(fn, gen)
    for values in VALUES[fn]:
        with torch.no_grad():
            got = compiled(*tensors, *values)
        want = fn(*(t.double() for t in tensors), *values)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got, fn(*tensors, *values), rtol=1e-5, atol=1e-5)
    [report] = backend.reports
    [fused] = report.fused
    assert not report.left, report
    assert {"mul", "div"} & set(fused.ops), fused.ops   # the scale inside the kernel
    assert all(not k.startswith("zf") for k in report.dynamic), report.dynamic


def test_a_value_change_recompiles_once_then_reads_the_value():
    """``dynamic=None``: the first graph has the float as a constant (Dynamo guards on
    it), the second reads it; each value's result is float64's."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(8, 40, generator=gen)
    torch._dynamo.reset()
    backend = Backend(rest="inductor")
    compiled = torch.compile(scale_shift, backend=backend)
    for values in VALUES[scale_shift]:
        with torch.no_grad():
            got = compiled(x, *values)
        torch.testing.assert_close(got.double(), scale_shift(x.double(), *values),
                                   rtol=1e-5, atol=1e-5)
    assert len(backend.reports) == 2
    assert all(len(r.fused) == 1 and not r.left for r in backend.reports), backend.reports
    assert len(backend.reports[1].fused[0].inputs) == 3   # x, the scale and the shift


def test_float64_scalar_arithmetic_stays_exact():
    """Arithmetic on the float itself (``scale * scale``, ``1 / scale``) is float64 in
    the graph, as in eager; the kernel reads its float32 cast."""
    gen = torch.Generator().manual_seed(8)

    def fn(x, scale):
        return torch.softmax(x * (scale * scale) + 1.0 / scale, -1)
    x = torch.randn(8, 40, generator=gen)
    torch._dynamo.reset()
    backend = Backend(rest="eager")
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    for scale in (0.3, 1.7, -0.9):
        with torch.no_grad():
            got = compiled(x, scale)
        torch.testing.assert_close(got, fn(x, scale), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(got.double(), fn(x.double(), scale), rtol=1e-5,
                                   atol=1e-6)
    assert len(backend.reports) == 1 and backend.reports[0].fused


@pytest.mark.parametrize("rest", ["eager", "inductor"])
def test_sdpa_scale_is_a_guarded_constant(rest):
    """SDPA's ``scale`` is an argument of the op, which Dynamo specialises even under
    ``dynamic=True``: a graph per value, the value a constant of its kernel, guarded.
    A value seen before after others gets its own graph's kernel back, never another
    value's (the constant is part of the program and of the memo's key)."""
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 3, 24, 8, generator=gen) for _ in range(3))
    torch._dynamo.reset()
    backend = Backend(rest=rest)
    compiled = torch.compile(attention, backend=backend, dynamic=True)
    for scale in (0.35, 0.1, -0.2, 0.35, 0.1):
        with torch.no_grad():
            got = compiled(q, k, v, scale)
        torch.testing.assert_close(got.double(), attention(q.double(), k.double(),
                                                           v.double(), scale),
                                   rtol=1e-5, atol=1e-5)
    assert any(r.fused for r in backend.reports)
