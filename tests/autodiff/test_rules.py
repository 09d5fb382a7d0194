"""The derivative tables cover every op of the IR, and each row is the derivative: the
gradient derived for ``y = op(x)`` (evaluated by the float64 reference) against central
differences of the reference forward, on fresh random data."""

from __future__ import annotations

import numpy as np
import pytest

import neptune_fusion as nf
from neptune_fusion.autodiff import rules
from neptune_fusion.autodiff.reverse import gradients
from neptune_fusion.ir import nodes
from neptune_fusion.ir.graph import placeholders
from neptune_fusion.ir.reducers import REDUCERS
from neptune_fusion.reference.evaluate import evaluate_unfused

N = 5


def run(outputs, feeds):
    """The reference's value of ``outputs`` fed the entries of ``feeds`` they read."""
    names = {p.name for p in placeholders(list(outputs))}
    return evaluate_unfused(list(outputs), {k: v for k, v in feeds.items() if k in names})


def test_every_elementwise_op_and_reducer_has_a_row():
    assert set(rules.UNARY) == set(nodes.UNARY_OPS)
    assert set(rules.BINARY) == set(nodes.ARITH_OPS + nodes.CMP_OPS + nodes.LOGIC_OPS)
    assert set(rules.REDUCE) == set(nodes.REDUCE_OPS) == set(REDUCERS)


def _check(build, n_inputs: int, low: float = -2.0, high: float = 2.0, seed: int = 0):
    """``build(*placeholders) -> expr over i``; the derived gradients against central
    differences of the reference."""
    xs = [nf.placeholder((N,), "float32", name=f"x{k}") for k in range(n_inputs)]
    y = nf.compute((N,), lambda i: build(*[x[i] for x in xs]), name="y")
    dy = nf.placeholder((N,), "float32", name="d_y")
    grads = gradients([y], [dy], xs)
    rng = np.random.default_rng(seed)
    feeds = {f"x{k}": rng.uniform(low, high, N) for k in range(n_inputs)}
    feeds["d_y"] = rng.standard_normal(N)
    got = run([g for g in grads if g is not None], feeds)
    h = 1e-6
    for k, g in enumerate(grads):
        assert g is not None, f"no gradient for x{k}"
        want = np.zeros(N)
        for e in range(N):
            up, dn = dict(feeds), dict(feeds)
            up[f"x{k}"] = feeds[f"x{k}"].copy()
            dn[f"x{k}"] = feeds[f"x{k}"].copy()
            up[f"x{k}"][e] += h
            dn[f"x{k}"][e] -= h
            f_up = run([y], up)[0] @ feeds["d_y"]
            f_dn = run([y], dn)[0] @ feeds["d_y"]
            want[e] = (f_up - f_dn) / (2 * h)
        np.testing.assert_allclose(got.pop(0), want, rtol=1e-5, atol=1e-6)


UNARY = {op: getattr(nf, op) for op in ("exp", "exp2", "tanh", "sigmoid", "erf", "abs")}
UNARY["neg"] = lambda x: -x


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_rule_is_the_derivative(op):
    _check(UNARY[op], 1)


@pytest.mark.parametrize("op", ["log", "log2", "sqrt", "rsqrt"])
def test_unary_rule_on_positive_inputs(op):
    _check(getattr(nf, op), 1, low=0.5, high=3.0)


BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / (nf.abs(b) + 1.0), "maximum": nf.maximum,
    "minimum": nf.minimum, "where": lambda a, b: nf.where(a > b, a * b, a - b),
}


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_rule_is_the_derivative(op):
    _check(BINARY[op], 2, seed=1)


def test_pow_with_a_constant_exponent():
    _check(lambda x: x ** 3 + x ** 0.5 * 0.0 + x ** 1, 1, low=0.5, high=2.0)


def test_reductions_sum_max_prod():
    M = 4
    x = nf.placeholder((N, M), "float32", name="x")
    j = nf.reduce_axis(M, "j")
    y = nf.compute((N,), lambda i: nf.sum(x[i, j], j) * nf.max(x[i, j], j)
                   + nf.prod(x[i, j], j), name="y")
    dy = nf.placeholder((N,), "float32", name="d_y")
    [dx] = gradients([y], [dy], [x])
    rng = np.random.default_rng(2)
    feeds = {"x": rng.uniform(0.5, 2.0, (N, M)), "d_y": rng.standard_normal(N)}
    import torch
    t = torch.tensor(feeds["x"], requires_grad=True)
    (t.sum(1) * t.amax(1) + t.prod(1)).backward(torch.tensor(feeds["d_y"]))
    np.testing.assert_allclose(run([dx], feeds)[0], t.grad.numpy(), rtol=1e-12)


def test_printed_gradients_of_a_matmul_read_as_on_paper():
    N_, M_ = nf.sizes("N M")
    x = nf.placeholder((N_, M_), "float32", name="x")
    w = nf.placeholder((M_,), "float32", name="w")
    j = nf.reduce_axis(M_, "j")
    y = nf.compute((N_,), lambda i: nf.sum(x[i, j] * w[j], j), name="y")
    dx, dw = gradients([y], [nf.placeholder((N_,), "float32", name="d_y")], [x, w])
    assert str(dx).splitlines()[-1].startswith("d_x[i, j] = d_y[i] * w[j]")
    assert str(dw).splitlines()[-1].startswith("d_w[j] = sum(d_y[i] * x[i, j], i)")


def test_an_index_without_a_gather_form_adjoint_is_refused():
    x = nf.placeholder((6,), "float32", name="x")
    y = nf.compute((5,), lambda i: x[i + 1] * 2.0, name="y")
    with pytest.raises(nf.DerivativeError, match=r"gradient of 'x': index 0 .* i \+ 1"):
        gradients([y], [nf.placeholder((5,), "float32", name="d_y")], [x])
