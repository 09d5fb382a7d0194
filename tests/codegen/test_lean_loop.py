"""The lean element loop: one exponential per element where the math has one, repair
factors per row, a per-row reciprocal instead of a division per element; every kernel
still matches the float64 reference."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.codegen.exp2 import canonical_arg
from neptune_fusion.ir.fold import fconst
from neptune_fusion.ir.nodes import Binary, Param, Unary
from neptune_fusion.runtime.pipeline import compile as nf_compile

F = fconst(0).dtype


def test_canonical_exp2_argument_is_one_node_for_equal_math():
    s, m, m2 = (Param(n, F) for n in ("s", "m", "m2"))
    c = fconst(0.5)
    spelled = [Binary("mul", Binary("sub", s, m), c),
               Binary("sub", Binary("mul", s, c), Binary("mul", m, c)),
               Binary("add", Binary("mul", fconst(-0.5), m), Binary("mul", s, c)),
               Binary("div", Binary("sub", s, m), fconst(2.0))]
    assert len({canonical_arg(e) for e in spelled}) == 1
    # the rescale exp(m - m2) and a repair factor's exp(-(m2 - m)) agree too
    assert canonical_arg(Unary("neg", Binary("sub", m2, m))) == canonical_arg(
        Binary("sub", m, m2)) == Binary("sub", m, m2)
    assert canonical_arg(Binary("sub", s, fconst(float("inf")))).op == "sub"  # unchanged


def _softmax_chains(kind: str):
    N, D = nf.sizes("N D")
    x = nf.placeholder((N, D), name="x")
    k = nf.reduce_axis(D, "k")
    t = 0.5
    m = nf.compute((N,), lambda i: nf.max(x[i, k], k), name="m")
    if kind == "temperature":   # exp((x - m) * t) and exp(x * t - m * t): one exponential
        l = nf.compute((N,), lambda i: nf.sum(nf.exp((x[i, k] - m[i]) * t), k), name="l")  # noqa: E741
        return [nf.compute((N,), lambda i: nf.sum(
            nf.exp(x[i, k] * t - m[i] * t) * x[i, k], k) / l[i], name="e")]
    l = nf.compute((N,), lambda i: nf.sum(nf.exp(x[i, k] - m[i]), k), name="l")  # noqa: E741
    if kind == "entropy":   # the repair factor exp(m - m') is the rescale's exponential
        return [nf.compute((N,), lambda i: nf.sum(nf.exp(x[i, k] - m[i]) / l[i] * (
            x[i, k] - m[i] - nf.log(l[i])), k), name="e")]
    return [nf.compute((N, D), lambda i, j: nf.exp(x[i, j] - m[i]) / l[i], name="y")]


def _loop(src: str) -> str:
    return src.split("# epilogue")[0].split("for ", 1)[1]


@pytest.mark.parametrize("kind", ["temperature", "entropy", "softmax"])
@pytest.mark.parametrize("shape", [(1, 33), (29, 29), (5, 64)])
def test_one_exponential_per_element_and_float64(kind, shape, rng):
    outs = _softmax_chains(kind)
    kernel = nf_compile(outs, block_m=16, block_n=16)
    x = torch.tensor(rng.standard_normal(shape) * 3, dtype=torch.float32)
    want = nf.evaluate(outs, {"x": x.double().numpy()})[0]
    [got] = [g.double().numpy() for g in kernel(x)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    for loop in kernel.source.split("# interior")[1:] + kernel.source.split("# boundary")[1:]:
        body = loop.split("# ")[0]
        # per element (a [BLOCK_M, BLOCK_N] tile): one exp2; per row: one exp2 (the rescale)
        assert body.count("tl.exp2(") == 2, body


def test_per_row_division_is_a_reciprocal_once_per_row(rng):
    [y] = _softmax_chains("softmax")
    kernel = nf_compile(y, block_m=16, block_n=16)
    epilogue = kernel.source.split("# epilogue")[1]
    # the reciprocal of l (settled: codegen/settle.py) once per row, broadcast
    assert re.search(r"\(1\.0 / tl\.where\([^\n]*, l\)\)\[:, None\]", epilogue), epilogue
    assert "/ l[:, None]" not in epilogue
    x = torch.tensor(rng.standard_normal((7, 29)) * 3, dtype=torch.float32)
    want = nf.evaluate(y, {"x": x.double().numpy()})
    np.testing.assert_allclose(kernel(x).double().numpy(), want, rtol=1e-5, atol=1e-7)


def test_canonical_exp2_argument_keeps_the_value(rng):
    """reference(before) == reference(after): each spelling, evaluated by constant folding
    at random points, equals its canonical form."""
    from neptune_fusion.ir.fold import fold
    from neptune_fusion.ir.traverse import substitute
    s, m, l2 = (Param(n, F) for n in ("s", "m", "l"))
    exprs = [Binary("mul", Binary("sub", Binary("add", s, fconst(1.5)), m), fconst(-0.3)),
             Unary("neg", Binary("sub", Binary("mul", fconst(2.0), m), Unary("neg", l2))),
             Binary("div", Binary("sub", Binary("mul", s, fconst(0.7)), m), fconst(4.0)),
             Binary("sub", Binary("add", s, Unary("log", l2)), Binary("mul", s, fconst(0.25)))]
    for e in exprs:
        c = canonical_arg(e)
        for _ in range(5):
            at = {p: fconst(v) for p, v in zip((s, m, l2), rng.uniform(0.5, 3.0, 3))}
            a, b = fold(substitute(e, at)), fold(substitute(c, at))
            assert abs(a.value - b.value) <= 1e-12 * max(1.0, abs(a.value)), (e, c)


def test_a_distance_converts_per_row_and_per_column_not_per_element(rng):
    """ALiBi's ``slope * float(j - i)``: the distance is recentred on the block's first
    row and its two parts leave the element work (stage ``separate``): ``float(j - i0)``
    per column, ``float(i - i0)`` per row, the per-row term added to the tile maximum and
    to the exponential's per-row part."""
    N, M = nf.sizes("N M")
    x = nf.placeholder((N, M), name="x")
    j = nf.reduce_axis(M, "j")
    m = nf.compute((N,), lambda i: nf.max(x[i, j] - 0.25 * nf.cast(j - i, "float32"), j),
                   name="m")
    y = nf.compute((N,), lambda i: nf.sum(nf.exp(x[i, j] - 0.25 * nf.cast(j - i, "float32")
                                                  - m[i]), j), name="y")
    kernel = nf_compile(y, block_m=16, block_n=16)
    assert "(offs_j - i_first).to(tl.float32))[None, :]" in kernel.source, kernel.source
    assert "offs_i[:, None]).to(" not in kernel.source, kernel.source
    x_ = torch.tensor(rng.standard_normal((37, 45)) * 3, dtype=torch.float32)
    want = nf.evaluate(y, {"x": x_.double().numpy()})
    np.testing.assert_allclose(kernel(x_).double().numpy(), want, rtol=1e-5)
