"""Float constants beyond float32's range: the kernels compute in float32, and Triton
types a Python float it cannot hold as float32 as float64. A float mask filled with
float32's minimum (transformers' eager attention) scaled by log2(e) for ``exp2`` became
``-4.9e38``: a float64 score tile met a float32 ``tl.dot`` operand and the kernel failed
(Llama's eager attention through the torch.compile backend, 2026-12-03). Such a
constant saturates at float32's finite extreme (codegen/exprs.py)."""

from __future__ import annotations

import torch

import neptune_fusion as nf

F32_MIN = torch.finfo(torch.float32).min


def _masked_attention():
    N, M, D = nf.sizes("N M D")
    q, k = nf.placeholder((N, D), name="q"), nf.placeholder((M, D), name="k")
    v, keep = nf.placeholder((M, D), name="v"), nf.placeholder((N, M), name="keep")
    j, c = nf.reduce_axis(M, "j"), nf.reduce_axis(D, "c")

    def body(i, e):
        s = nf.sum(q[i, c] * k[j, c], c) * 0.25 + nf.where(keep[i, j] > 0.5, 0.0, F32_MIN)
        w = nf.exp(s - nf.max(s, j))
        return nf.sum(w * v[j, e], j) / nf.sum(w, j)
    return nf.compute((N, D), body, name="o"), [q, k, v, keep]


def test_a_float_mask_of_float32s_minimum_runs_and_matches_float64():
    out, ins = _masked_attention()
    kern = nf.compile(out, ins, cache=False)
    gen = torch.Generator().manual_seed(11)
    n, m, d = 19, 37, 16
    q, k, v = (torch.randn(r, d, generator=gen) for r in (n, m, m))
    keep = (torch.rand(n, m, generator=gen) > 0.4).float()
    keep[3] = 0.0   # a row with every key masked: eager softmax makes it uniform
    got = kern(q, k, v, keep)
    s = (q.double() @ k.double().T) * 0.25 + torch.where(keep > 0.5, 0.0, F32_MIN).double()
    want = torch.softmax(s, -1) @ v.double()
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(got[3].double(), v.double().mean(0), rtol=2e-5, atol=2e-5)
    src = "\n".join(x.source for x in kern.kernels())
    assert "e+38" in src and "4.9" not in src.split("e+38")[0][-12:]
