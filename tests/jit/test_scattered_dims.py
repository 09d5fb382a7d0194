"""Reductions over dimensions that are not adjacent stay with the rest, said.

A batch norm's statistics reduce ``(N, C, H, W)`` over ``(0, 2, 3)``; the rule table
reduces over one axis. From 2026-12-04 (late) to 2026-12-05 the decomposition moved the
reduced dimensions last and merged them, read as index arithmetic on the input; on the
H200 that ran at 0.07x of Inductor for ``F.batch_norm`` in training (the normalised
output written over the merged axis by 64 programs) and 0.80x for ``var_mean`` alone
(docs/jit.md), so such reductions are left to the rest again: the report names each with
the reason, and the results are eager's. Adjacent dimensions (an instance norm's
``(0, 2, 3)`` of ``(1, N*C, H, W)``) still merge (test_reduction_dims.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neptune_fusion.dynamo import Backend

CASES = {
    "var_mean (0, 2, 3)": lambda x: torch.var_mean(x, dim=(0, 2, 3), keepdim=True),
    "batch-norm statistics": lambda x: (x - x.mean((0, 2, 3), keepdim=True))
    / x.std((0, 2, 3), keepdim=True),
    "logsumexp (0, 2)": lambda x: torch.logsumexp(x, dim=(0, 2)),
    "softmax over (1, 3)": lambda x: torch.exp(x - x.amax((1, 3), keepdim=True)).sum((1, 3)),
}


def _tuple(t):
    return t if isinstance(t, tuple) else (t,)


def _run(fn, x, dynamic=False):
    torch._dynamo.reset()
    backend = Backend(rest="eager")
    with torch.no_grad():
        got = _tuple(torch.compile(fn, backend=backend, dynamic=dynamic)(x))
    want = _tuple(fn(x.double()))
    for g, w, e in zip(got, want, _tuple(fn(x))):
        assert g.shape == e.shape and g.dtype == e.dtype
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-5)
    return backend.reports


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_scattered_reductions_are_left_out_with_the_reason(name, dynamic):
    x = torch.randn(4, 6, 5, 7, generator=torch.Generator().manual_seed(4)) * 2 + 0.5
    (report,) = _run(CASES[name], x, dynamic)
    assert not report.fused, str(report)
    assert any("not adjacent" in left.reason for left in report.left), str(report)


def test_batch_norm_in_training_keeps_its_op():
    """``F.batch_norm(training=True)`` of a batch of several: its op stays whole for the
    rest (the statistics are over (0, 2, 3)); nothing fused, eager's results."""
    x = torch.randn(4, 6, 5, 7, generator=torch.Generator().manual_seed(4)) * 2 + 0.5
    (report,) = _run(lambda t: F.batch_norm(t, None, None, training=True), x)
    assert not report.fused, str(report)
    assert any("batch norm" in left.reason for left in report.left), str(report)


def test_batch_norm_module_in_training_updates_its_running_statistics():
    gen = torch.Generator().manual_seed(5)
    ours, eager = torch.nn.BatchNorm2d(6), torch.nn.BatchNorm2d(6)
    x = torch.randn(3, 6, 5, 4, generator=gen) * 3 + 1
    torch._dynamo.reset()
    backend = Backend(rest="eager")
    with torch.no_grad():
        got = torch.compile(ours, backend=backend)(x)
        want = eager(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.running_mean, eager.running_mean)
    torch.testing.assert_close(ours.running_var, eager.running_var)
    assert not backend.reports[0].fused, str(backend.reports[0])
    assert any("batch norm" in left.reason for left in backend.reports[0].left), \
        str(backend.reports[0])


@pytest.mark.parametrize("dims", [(0, 3), (1, 2)], ids=["scattered", "adjacent"])
def test_an_empty_input_merges_without_an_ambiguous_extent(dims):
    """A reduction over two dimensions of an empty tensor: the merge's ``-1`` extent was
    ambiguous (reshape raised inside the compile, where eager gives an empty result)."""
    x = torch.randn(5, 4, 1, 5, 0, generator=torch.Generator().manual_seed(6))
    fns = {"mean": lambda t: t.mean(dims), "var": lambda t: t.var(dims, keepdim=True)}
    for name, fn in fns.items():
        torch._dynamo.reset()
        with torch.no_grad():
            got = torch.compile(fn, backend=Backend(rest="eager"))(x)
        want = fn(x.double())
        assert got.shape == want.shape, name
        torch.testing.assert_close(got.double(), want, equal_nan=True)


def test_a_staged_maximum_returned_twice_is_two_tensors():
    """A training graph returns a scattered amax and its detach (saved for the backward):
    one intermediate of a staged kernel, returned twice as the same tensor, which
    AOTAutograd refused as an aliasing op (RuntimeError at the first call)."""
    def fn(x):
        x = x.transpose(0, -1)
        m = x.amax((0, 1, 3), keepdim=True)
        return x.amax((0, 1, 3)), torch.exp(x - m).sum((0, 1, 3))

    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, 5, 4, 1, generator=gen) * 2 + 0.5
    cots = [torch.randn(4, generator=gen) for _ in range(2)]
    torch._dynamo.reset()
    leaf = x.clone().requires_grad_()
    got = torch.compile(fn, backend=Backend(rest="eager"))(leaf)
    sum((g * c).sum() for g, c in zip(got, cots)).backward()
    ref = x.double().requires_grad_()
    want = fn(ref)
    sum((w * c.double()).sum() for w, c in zip(want, cots)).backward()
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(leaf.grad.double(), ref.grad, rtol=1e-5, atol=1e-5)
