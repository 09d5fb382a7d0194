"""Reverse mode on two non-attention chains (issue 20's RMSNorm -> matmul and
log-sum-exp): the derived gradient programs, evaluated by the float64 reference, pass
``torch.autograd.gradcheck`` against the reference forward; the same chains compiled
with ``differentiable=True`` run the derivation's kernels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.autodiff.reverse import gradients
from neptune_fusion.ir.graph import placeholders
from neptune_fusion.reference.evaluate import evaluate_unfused


def _run(outputs, feeds):
    names = {p.name for p in placeholders(list(outputs))}
    return evaluate_unfused(list(outputs), {k: v for k, v in feeds.items() if k in names})


def differentiable(out, inputs):
    """``out`` of placeholders ``inputs`` as a torch function of float64 tensors: the
    reference forward, the derived gradients as its backward."""
    seed = nf.placeholder(out.shape, "float32", name="d_out")
    grads = gradients([out], [seed], inputs)

    class Chain(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *tensors):
            feeds = {p.name: t.detach().numpy() for p, t in zip(inputs, tensors)}
            ctx.feeds = feeds
            return torch.from_numpy(np.asarray(_run([out], feeds)[0]))

        @staticmethod
        def backward(ctx, d_out):
            feeds = dict(ctx.feeds, d_out=d_out.numpy())
            return tuple(torch.from_numpy(np.asarray(g)) for g in _run(grads, feeds))

    return Chain.apply, grads


def test_rmsnorm_then_matmul_passes_gradcheck():
    N, K, M = 3, 4, 2
    x = nf.placeholder((N, K), "float32", name="x")
    g = nf.placeholder((K,), "float32", name="g")
    w = nf.placeholder((K, M), "float32", name="w")
    k = nf.reduce_axis(K, "k")
    k2 = nf.reduce_axis(K, "k2")
    ms = nf.compute((N,), lambda i: nf.sum(x[i, k] * x[i, k], k) / K, name="ms")
    y = nf.compute((N, M), lambda i, n: nf.sum(
        x[i, k2] * nf.rsqrt(ms[i] + 1e-5) * g[k2] * w[k2, n], k2), name="y")
    fn, grads = differentiable(y, [x, g, w])
    assert all(d is not None for d in grads)
    gen = torch.Generator().manual_seed(0)
    args = [torch.randn(s, generator=gen, dtype=torch.float64, requires_grad=True)
            for s in ((N, K), (K,), (K, M))]
    assert torch.autograd.gradcheck(fn, args, eps=1e-6, atol=1e-7)


def _log_sum_exp(N, M):
    """``(lse, x)``: max, then log-sum-exp shifted by it, over rows of ``x`` (N, M)."""
    x = nf.placeholder((N, M), "float32", name="x")
    j = nf.reduce_axis(M, "j")
    j2 = nf.reduce_axis(M, "j2")
    m = nf.compute((N,), lambda i: nf.max(x[i, j], j), name="m")
    lse = nf.compute((N,), lambda i: m[i] + nf.log(nf.sum(nf.exp(x[i, j2] - m[i]), j2)),
                     name="lse")
    return lse, x


def test_log_sum_exp_passes_gradcheck():
    """The max is differentiated here (the indicator of the arg-max): its terms cancel,
    as log-sum-exp does not depend on the shift."""
    N, M = 3, 5
    lse, x = _log_sum_exp(N, M)
    fn, _ = differentiable(lse, [x])
    gen = torch.Generator().manual_seed(1)
    arg = torch.randn(N, M, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fn, [arg], eps=1e-6, atol=1e-7)
    torch.testing.assert_close(
        torch.autograd.grad(fn(arg).sum(), arg)[0], torch.softmax(arg, 1))


# ------------------------------------------------- compiled, nf.compile(differentiable=True)


def test_compiled_rmsnorm_matmul_is_differentiable():
    N = nf.size("N")
    x = nf.placeholder((N, 32), "float32", name="x")
    g = nf.placeholder((32,), "float32", name="g")
    w = nf.placeholder((32, 16), "float32", name="w")
    k = nf.reduce_axis(32, "k")
    k2 = nf.reduce_axis(32, "k2")
    ms = nf.compute((N,), lambda i: nf.sum(x[i, k] * x[i, k], k) / 32, name="ms")
    y = nf.compute((N, 16), lambda i, n: nf.sum(
        x[i, k2] * nf.rsqrt(ms[i] + 1e-5) * g[k2] * w[k2, n], k2), name="y")
    kern = nf.compile(y, differentiable=True, cache=False)
    gen = torch.Generator().manual_seed(2)
    args = [torch.randn(s, generator=gen).requires_grad_() for s in ((8, 32), (32,), (32, 16))]
    out = kern(*args)
    assert out.grad_fn is not None
    d_out = torch.randn(out.shape, generator=gen)
    out.backward(d_out)
    want = [a.detach().double().requires_grad_() for a in args]
    xd, gd, wd = want
    ((xd * torch.rsqrt((xd * xd).mean(1, keepdim=True) + 1e-5) * gd) @ wd).backward(
        d_out.double())
    for a, b in zip(args, want):
        torch.testing.assert_close(a.grad.double(), b.grad, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        assert kern(*args).grad_fn is None


def test_compiled_log_sum_exp_is_differentiable():
    lse, _ = _log_sum_exp(*nf.sizes("N M"))
    kern = nf.compile(lse, differentiable=True, cache=False)
    gen = torch.Generator().manual_seed(3)
    arg = torch.randn(6, 40, generator=gen).requires_grad_()
    out = kern(arg)
    d_out = torch.randn(out.shape, generator=gen)
    out.backward(d_out)
    want = arg.detach().double().requires_grad_()
    torch.logsumexp(want, 1).backward(d_out.double())
    torch.testing.assert_close(arg.grad.double(), want.grad, rtol=1e-5, atol=1e-6)


def test_compiled_chains_still_refuse_grad_unless_asked():
    x = nf.placeholder((3, nf.size("M")), "float32", name="x")
    j = nf.reduce_axis(x.shape[1], "j")
    kern = nf.compile(nf.compute((3,), lambda i: nf.sum(x[i, j], j), name="y"), cache=False)
    with pytest.raises(nf.FeedError, match="requires grad"):
        kern(torch.randn(3, 4).requires_grad_())


# ---------------------------------------- under torch.compile (the kernel_grad op)


def _masked_lse_and_double():
    """``(kernel, inputs order)``: each row's log-sum-exp over its first ``L[i]`` columns
    (an int32 input, no gradient) and ``2 x`` (a second output, unused by the loss)."""
    N, M = nf.sizes("N M")
    x = nf.placeholder((N, M), "float32", name="x")
    L = nf.placeholder((N,), "int32", name="L")
    j, j2 = nf.reduce_axis(M, "j"), nf.reduce_axis(M, "j2")
    m = nf.compute((N,), lambda i: nf.max(nf.where(j < L[i], x[i, j], -1e30), j), name="m")
    lse = nf.compute((N,), lambda i: m[i] + nf.log(nf.sum(
        nf.where(j2 < L[i], nf.exp(x[i, j2] - m[i]), 0.0), j2)), name="lse")
    y = nf.compute((N, M), lambda i, c: x[i, c] * 2.0, name="y")
    kern = nf.compile([lse, y], differentiable=True, cache=False)
    return kern, [p.name for p in kern.inputs]


def test_a_differentiable_chain_traces_as_one_op_with_its_backward():
    """torch.compile(fullgraph=True) of a loss over a differentiable compiled chain: the
    ``neptune_fusion::kernel_grad`` op (no graph break), whose registered backward runs
    the derived gradient kernels; an int input gets no gradient, an unused output a zero
    cotangent; values and gradients against float64."""
    kern, order = _masked_lse_and_double()
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(6, 9, generator=gen).requires_grad_()
    lens = torch.tensor([9, 3, 6, 2, 1, 5], dtype=torch.int32)
    w = torch.randn(6, generator=gen)
    graphs = []

    def capture(gm, example_inputs):
        graphs.append({str(n.target).removesuffix(".default") for n in gm.graph.nodes})
        from torch._dynamo.backends.debugging import aot_eager
        return aot_eager(gm, example_inputs)

    def loss(x, lens):
        got = {"x": x, "L": lens}
        lse, _ = kern(*(got[n] for n in order))
        return (lse * w).sum()
    torch._dynamo.reset()
    value = torch.compile(loss, fullgraph=True, backend=capture)(x, lens)
    value.backward()
    assert any("neptune_fusion.kernel_grad" in g for g in graphs), graphs
    xd = x.detach().double().requires_grad_()
    keep = torch.arange(9)[None, :] < lens[:, None]
    want = (torch.logsumexp(xd.masked_fill(~keep, float("-inf")), 1) * w.double()).sum()
    want.backward()
    torch.testing.assert_close(value.detach().double(), want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.double(), xd.grad, rtol=1e-5, atol=1e-6)


def test_a_compiled_rmsnorm_matmul_trains_under_torch_compile():
    N = nf.size("N")
    x = nf.placeholder((N, 32), "float32", name="x")
    g = nf.placeholder((32,), "float32", name="g")
    w = nf.placeholder((32, 16), "float32", name="w")
    k, k2 = nf.reduce_axis(32, "k"), nf.reduce_axis(32, "k2")
    ms = nf.compute((N,), lambda i: nf.sum(x[i, k] * x[i, k], k) / 32, name="ms")
    y = nf.compute((N, 16), lambda i, n: nf.sum(
        x[i, k2] * nf.rsqrt(ms[i] + 1e-5) * g[k2] * w[k2, n], k2), name="y")
    kern = nf.compile(y, differentiable=True, cache=False)
    order = [p.name for p in kern.inputs]
    gen = torch.Generator().manual_seed(5)
    args = {n: torch.randn(s, generator=gen).requires_grad_()
            for n, s in (("x", (8, 32)), ("g", (32,)), ("w", (32, 16)))}
    d_out = torch.randn(8, 16, generator=gen)
    torch._dynamo.reset()
    step = torch.compile(lambda *t: (kern(*t) * d_out).sum(), fullgraph=True,
                         backend="aot_eager")
    step(*(args[n] for n in order)).backward()
    want = {n: a.detach().double().requires_grad_() for n, a in args.items()}
    xd, gd, wd = want["x"], want["g"], want["w"]
    (((xd * torch.rsqrt((xd * xd).mean(1, keepdim=True) + 1e-5) * gd) @ wd)
     * d_out.double()).sum().backward()
    for n in args:
        torch.testing.assert_close(args[n].grad.double(), want[n].grad, rtol=1e-4,
                                   atol=1e-5, msg=lambda m, n=n: f"d_{n}: {m}")


def test_a_chain_without_a_backward_is_refused_by_name_under_torch_compile():
    """Traced, a chain compiled without ``differentiable=True`` refuses an input that
    requires grad as an eager call does, saying what to pass (not torch's "no autograd
    formula" at the backward's trace)."""
    x = nf.placeholder((3, nf.size("M")), "float32", name="x")
    j = nf.reduce_axis(x.shape[1], "j")
    kern = nf.compile(nf.compute((3,), lambda i: nf.sum(x[i, j], j), name="y"), cache=False)
    t = torch.randn(3, 4).requires_grad_()
    with pytest.raises(nf.FeedError, match="differentiable=True"):
        kern(t)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"argument 0 \('x'\) requires grad.*differentiable=True"):
        torch.compile(lambda t: kern(t).sum(), fullgraph=True, backend="aot_eager")(t)
    with torch.no_grad():   # forward-only: runs
        got = torch.compile(lambda t: kern(t), fullgraph=True, backend="aot_eager")(t)
    torch.testing.assert_close(got, t.detach().sum(1))
