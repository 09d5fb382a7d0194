"""Norm -> matmul chains stay contractions at ragged reduction lengths: the boundary
tile's guard masks an operand (or nothing, when a load is already masked), the per-row
factor leaves the sum, and the sum lowers to ``tl.dot``; results match float64."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.runtime.pipeline import compile as nf_compile

KOUT = 6


def norm_matmul(kind: str, d, weight: bool = True):
    """``out = norm(x) @ W`` with ``x`` of ``N x d`` rows (``d`` an int or a size name)."""
    N = nf.size("N")
    D = nf.size(d) if isinstance(d, str) else d
    x = nf.placeholder((N, D), name="x")
    w = nf.placeholder((D,), name="w")
    W = nf.placeholder((D, KOUT), name="W")
    b = nf.placeholder((D,), name="b")
    c = nf.reduce_axis(D, "c")
    dd = nf.cast(D, "float32") if isinstance(d, str) else float(d)
    scale = (lambda e: w[e]) if weight else (lambda e: 1.0)
    if kind == "rms":
        ms = nf.compute((N,), lambda i: nf.sum(x[i, c] * x[i, c], c) / dd, name="ms")
        y = nf.compute((N, D), lambda i, e: x[i, e] * nf.rsqrt(ms[i] + 1e-6) * scale(e),
                       name="y")
    elif kind == "l2":
        ss = nf.compute((N,), lambda i: nf.sum(x[i, c] ** 2, c), name="ss")
        y = nf.compute((N, D), lambda i, e: x[i, e] / nf.sqrt(ss[i]) * scale(e), name="y")
    else:
        mu = nf.compute((N,), lambda i: nf.sum(x[i, c], c) / dd, name="mean")
        var = nf.compute((N,), lambda i: nf.sum((x[i, c] - mu[i]) ** 2, c) / dd, name="var")
        y = nf.compute((N, D), lambda i, e: (x[i, e] - mu[i]) * nf.rsqrt(var[i] + 1e-5)
                       * scale(e) + b[e], name="y")
    return nf.compute((N, KOUT), lambda i, o: nf.sum(y[i, c] * W[c, o], c), name="out")


def check(out, n: int, d: int, rng, **options):
    kernel = nf_compile(out, fp32_precision="ieee", **options)
    feeds = {"x": rng.standard_normal((n, d)) + 0.5, "w": rng.standard_normal(d),
             "W": rng.standard_normal((d, KOUT)), "b": rng.standard_normal(d)}
    tensors = [torch.tensor(feeds[p.name], dtype=torch.float32) for p in kernel.inputs]
    want = nf.evaluate(out, {p.name: t.double().numpy()
                             for p, t in zip(kernel.inputs, tensors)})
    got = kernel(*tensors).double().numpy()
    assert got.shape == want.shape == (n, KOUT)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    assert "tl.dot(" in kernel.source
    return kernel.source


@pytest.mark.parametrize("kind", ["rms", "l2", "layer"])
@pytest.mark.parametrize("d", [29, 33])
def test_norm_matmul_ragged_k(kind, d, rng):
    src = check(norm_matmul(kind, d), 29 if d == 29 else 1, d, rng, block_m=16, block_n=16)
    if kind != "layer":   # x * w: the guard-masked load x makes the product zero outside
        dots = [ln for ln in src.splitlines() if "tl.dot(" in ln]
        assert len(dots) == 2 and not any("tl.where" in ln for ln in dots), dots


@pytest.mark.parametrize("kind", ["rms", "l2"])
def test_norm_matmul_symbolic_k_without_weight(kind, rng):
    # out = sum(x * W) * r: the guard wraps a product of two loads (it used to hide the
    # contraction); the loads are masked already, so the dot takes them as they are
    src = check(norm_matmul(kind, "D", weight=False), 29, 29, rng, block_m=16, block_n=16)
    dots = [ln.strip() for ln in src.splitlines() if "tl.dot(" in ln]
    assert len(dots) == 2 and not any("tl.where" in ln for ln in dots), dots
    assert "rsqrt" in src.split("epilogue")[1] or "sqrt" in src.split("epilogue")[1]


def test_one_masked_loop_without_partition(rng):
    check(norm_matmul("rms", "D", weight=False), 5, 33, rng, block_m=16, block_n=16,
          partition=False)


@pytest.mark.parametrize("cond", ["k", "row"])
def test_user_mask_over_the_product_masks_one_operand(cond, rng):
    N, D = nf.sizes("N D")
    x = nf.placeholder((N, D), name="x")
    W = nf.placeholder((D, KOUT), name="W")
    c = nf.reduce_axis(D, "c")
    keep = (lambda i: c % 3 != 1) if cond == "k" else (lambda i: c <= i)
    ss = nf.compute((N,), lambda i: nf.sum(x[i, c] ** 2, c), name="ss")
    out = nf.compute((N, KOUT), lambda i, o: nf.sum(
        nf.where(keep(i), x[i, c] * W[c, o], 0.0), c) / nf.sqrt(ss[i]), name="out")
    kernel = nf_compile(out, fp32_precision="ieee", block_m=16, block_n=16)
    xs = torch.tensor(rng.standard_normal((21, 29)), dtype=torch.float32)
    Ws = torch.tensor(rng.standard_normal((29, KOUT)), dtype=torch.float32)
    want = nf.evaluate(out, {"x": xs.double().numpy(), "W": Ws.double().numpy()})
    got = kernel(xs, Ws).double().numpy()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    lines = kernel.source.splitlines()
    dots = [ln for ln in lines if "tl.dot(" in ln]
    # the boundary tile masks one operand: a select in the dot, or a masked load (the
    # user's where(c, load, 0) as tl.load(..., mask=c): the load is not even read)
    named = re.match(r".*tl\.dot\((\w+), (\w+)", dots[-1])
    names = named.groups() if named else ()
    text = "% 3 != 1" if cond == "k" else "<="
    loads = [ln for ln in lines for n in names if ln.strip().startswith(f"{n} = tl.load(")]
    assert "tl.where(" in dots[-1] or any(text in ln.split("mask=")[-1]
                                         or "mask=mask" in ln for ln in loads), \
        dots + loads


def test_per_row_divisor_leaves_the_sum():
    """sum(p * (b_j / a) * q, j) = sum(p * b_j * q, j) / a, for a free of j."""
    from neptune_fusion.analysis.canon import SpatialVars, canonical_output
    from neptune_fusion.analysis.normalize import normalize
    from neptune_fusion.ir.nodes import Binary, Reduce
    from neptune_fusion.ir.traverse import walk
    inlined, _ = canonical_output(norm_matmul("l2", 8), SpatialVars(), {})
    [r] = [x for x in walk(inlined) if isinstance(x, Reduce) and x.op == "sum"
           and any(isinstance(d, Binary) and d.op == "div" for d in walk(x.body))]
    got = normalize(r)
    assert isinstance(got, Binary) and got.op == "div" and isinstance(got.a, Reduce)
    assert not any(isinstance(x, Binary) and x.op == "div" for x in walk(got.a))
