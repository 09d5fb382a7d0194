"""The fused regions' calls in a compiled graph (runtime/torch_ops.KernelEntry): bound once
per input signature, the ``neptune_fusion::fused`` op, and what never binds -- each
result checked against float64 on fresh inputs."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.bench.providers.compiled import plain_attention
from neptune_fusion.errors import FeedError
from neptune_fusion.ops import OPERATORS
from neptune_fusion.runtime import torch_ops
from runtime.test_staged import SMALL, two_lengths


def _entry(kernel):
    return torch_ops.entry(torch_ops.handle(torch_ops.KernelEntry,
                                            torch_ops.constant_key(kernel)))


def _rel(got, want) -> float:
    return float((got.double() - want).norm() / want.norm())


@pytest.mark.parametrize("name", ["DC-GQA", "DC-SoftCap", "PF-Causal"])
def test_a_graph_called_again_takes_the_bound_launch(name):
    op = dataclasses.replace(OPERATORS[name], q_heads=4, kv_heads=2, head_dim=16)
    seq = 11
    fn = plain_attention(op, seq)
    torch._dynamo.reset()
    g = nf.jit(fn, rest="eager")
    outs = []
    for _ in range(3):   # fresh inputs of one signature each call
        q = torch.randn(1, op.q_heads, op.q_len(seq), op.head_dim)
        k, v = (torch.randn(1, op.kv_heads, seq, op.head_dim) for _ in range(2))
        with torch.no_grad():
            got = g(q, k, v)
        assert _rel(got, fn(q.double(), k.double(), v.double())) < 1e-5
        outs.append(got)
    # each call's result is its own tensor (a bound launch allocates fresh outputs)
    assert len({o.data_ptr() for o in outs}) == 3
    (fused,) = [f for r in g.backend.reports for f in r.fused]
    assert _entry(fused.kernel).hits == 2   # the second call binds, the third launches it


def test_a_region_reading_a_modules_parameters_takes_the_bound_launch():
    """``nn.InstanceNorm2d``'s region reads its weight and bias themselves: parameters,
    which require grad in inference too. Under ``no_grad`` they bind like plain tensors
    (the general path ran every call before: 147 against Inductor's 48 us of host time
    on the H200); with grad mode on, a binding made without it is not used."""
    m = torch.nn.InstanceNorm2d(3, affine=True).eval()
    with torch.no_grad():
        m.weight.normal_(generator=torch.Generator().manual_seed(1))
    m64 = copy.deepcopy(m).double()
    torch._dynamo.reset()
    g = nf.jit(lambda x: m(x), rest="eager")
    for call in range(3):
        x = torch.randn(2, 3, 5, 5, generator=torch.Generator().manual_seed(call)) * 2 + 1
        with torch.no_grad():
            got = g(x)
            want = m64(x.double())
        assert _rel(got, want) < 1e-5
    (fused,) = [f for r in g.backend.reports for f in r.fused]
    entry = _entry(fused.kernel)
    assert entry.hits == 2 and m.weight.requires_grad
    assert entry._bound and not any(key[0] for key in entry._bound)   # no_grad bindings


def test_the_rewritten_graph_calls_the_fused_op():
    seen = []

    def softmax(x):
        return torch.softmax(x, -1)
    torch._dynamo.reset()
    backend = nf.dynamo.Backend(rest="eager")
    backend._rest = lambda gm, ex, kwargs: (seen.extend(
        n.target for n in gm.graph.nodes if n.op == "call_function"), _boxed(gm))[1]
    x = torch.randn(5, 7)
    got = torch.compile(softmax, backend=backend)(x)
    assert _rel(got, torch.softmax(x.double(), -1)) < 1e-6
    assert torch.ops.neptune_fusion.fused.default in seen


def _boxed(gm):
    from torch._functorch.aot_autograd import make_boxed_func
    return make_boxed_func(gm.forward)


def _two_outputs():
    """A row's log-sum-exp and its centred values: two outputs of one chain."""
    N, M = nf.sizes("N M")
    x = nf.placeholder((N, M), name="x")
    j = nf.reduce_axis(M, "j")
    top = nf.compute((N,), lambda i: nf.max(x[i, j], j), name="top")
    lse = nf.compute((N,), lambda i: top[i] + nf.log(nf.sum(nf.exp(x[i, j] - top[i]), j)),
                     name="lse")
    return [lse, nf.compute((N, M), lambda i, c: x[i, c] - lse[i], name="y")]


def test_two_outputs_bound_as_the_general_path_returns_them():
    kern = nf.compile(_two_outputs(), cache=False)
    entry = torch_ops.KernelEntry(kern)
    # a signature's first call takes the general path, its second binds (and launches
    # the binding), later ones launch it; a signature seen once (9) is never bound
    for n in (6, 6, 6, 9):
        x = torch.randn(n, 13)
        lse, y = entry.run([x])
        want = torch.logsumexp(x.double(), 1)
        assert _rel(lse, want) < 1e-6 and _rel(y, x.double() - want[:, None]) < 1e-6
    assert entry.hits == 2 and len(entry._bound) == 1


def test_inputs_that_require_grad_are_refused_by_the_fused_op():
    kern = nf.compile(_two_outputs(), cache=False)
    h = torch_ops.handle(torch_ops.KernelEntry, torch_ops.constant_key(kern))
    x = torch.randn(4, 5, requires_grad=True)
    with pytest.raises(FeedError, match="requires grad"):
        torch.ops.neptune_fusion.fused([x], h)
    with torch.no_grad():   # grad mode off: the kernel runs (not bound: requires_grad)
        lse, y = torch.ops.neptune_fusion.fused([x], h)
    assert _rel(lse, torch.logsumexp(x.detach().double(), 1)) < 1e-6
    assert _entry(kern).hits == 0


def test_a_multi_pass_operator_runs_its_general_path():
    staged = nf.compile(two_lengths(), schedule=SMALL, cache=False)
    entry = torch_ops.KernelEntry(staged)
    shapes = {"x": (7, 13), "z": (7, 29)}
    for _ in range(2):
        a, b = (torch.randn(*shapes[p.name]) for p in staged.inputs)
        got, = entry.run([a, b])
        assert torch.equal(got, staged.run((a, b))[0])
    assert entry.hits == 0 and not entry._bound


def test_the_fused_op_takes_inputs_whose_rows_are_strided():
    # Inductor does not hold a Tensor[] element to its traced layout: the op copies
    kern = nf.compile(_two_outputs(), cache=False)
    h = torch_ops.handle(torch_ops.KernelEntry, torch_ops.constant_key(kern))
    x = torch.randn(13, 6).t()   # strides (1, 6)
    lse, y = torch.ops.neptune_fusion.fused([x], h)
    want = torch.logsumexp(x.double(), 1)
    assert _rel(lse, want) < 1e-6 and _rel(y, x.double() - want[:, None]) < 1e-6
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:   # the fake takes them too
        got = torch.ops.neptune_fusion.fused([mode.from_tensor(x)], h)
    assert [tuple(g.shape) for g in got] == [(6,), (6, 13)]


def test_inductor_lays_out_the_fused_ops_inputs_with_unit_rows(monkeypatch):
    """A graph that hands the ``fused`` op a transposed view of a value Inductor computes:
    the backend's layout constraint (inductor.unit_rows) makes Inductor write unit-stride
    rows, so the kernel is called once, with them (no retry through the op's own copy,
    torch_ops.unit_rows). (Inductor held no element of the op's ``Tensor[]`` to its
    traced layout in torch 2.11 and passed ``nn.MultiheadAttention``'s head split
    transposed on the H200.)"""
    from torch._subclasses.fake_tensor import is_fake
    from torch.fx.experimental.proxy_tensor import make_fx

    from neptune_fusion.dynamo.inductor import compile_rest
    from neptune_fusion.runtime import torch_ops
    kern = nf.compile(_two_outputs(), cache=False)
    h = torch_ops.handle(torch_ops.KernelEntry, torch_ops.constant_key(kern))

    def fn(x):
        return torch.ops.neptune_fusion.fused([(x * 2.0).permute(1, 0)], h)
    x = torch.randn(13, 6, generator=torch.Generator().manual_seed(4))
    gm = make_fx(fn, tracing_mode="fake")(x)
    seen, real = [], torch_ops.KernelEntry.run

    def spy(self, tensors):   # the calls that run (Inductor's lowering runs the fake)
        if not any(is_fake(t) for t in tensors):
            seen.append([t.stride(-1) for t in tensors])
        return real(self, tensors)
    monkeypatch.setattr(torch_ops.KernelEntry, "run", spy)
    with torch.no_grad():
        lse, y = compile_rest(gm, [x], {}, {})([x])
    want = torch.logsumexp(2.0 * x.double().t(), 1)
    assert torch.allclose(lse.double(), want, atol=1e-5)
    assert torch.allclose(y.double(), 2.0 * x.double().t() - want[:, None], atol=1e-5)
    assert seen and all(s == 1 for call in seen for s in call), seen
