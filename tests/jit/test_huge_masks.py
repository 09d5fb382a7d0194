"""A mask filled with ``torch.finfo(dtype).min`` (how transformers masks) gives torch's
result, a row masked everywhere included (uniform weights, as torch computes them): in
base 2 the scores' ``s * log2 e`` overflowed to -inf there and the row came out NaN or 0
(a fuzzing find, 2026-12-04; ``codegen.exp2._huge_scores`` keeps such programs in base
e). A plain softmax of one input keeps base 2."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import neptune_fusion as nf

MIN = torch.finfo(torch.float32).min


def _bias(n, m):
    b = torch.zeros(n, m)
    b[0] = MIN                                   # a row masked everywhere
    b[1, 3:] = MIN                               # a row masked in part
    return b


CASES = {
    "softmax of x + bias": (lambda x, b: torch.softmax(x + b, -1),
                            lambda: (torch.randn(4, 8), _bias(4, 8))),
    "masked_fill with finfo.min": (
        lambda x, b: torch.softmax(x.masked_fill(b < 0, MIN), -1),
        lambda: (torch.randn(4, 8), _bias(4, 8))),
    "sdpa with a float mask": (
        lambda q, k, v, b: F.scaled_dot_product_attention(q, k, v, attn_mask=b),
        lambda: (torch.randn(1, 2, 4, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8),
                 _bias(4, 6))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_finfo_min_masks_match_torch(name):
    fn, make = CASES[name]
    torch.manual_seed(5)
    args = make()
    torch._dynamo.reset()
    with torch.no_grad():
        got = nf.jit(fn, rest="eager")(*args)
        want = fn(*(a.double() for a in args))
    assert not got.isnan().any(), got
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_a_softmax_of_one_input_stays_in_base_2():
    N, D = nf.sizes("N D")
    x = nf.placeholder((N, D), name="x")
    k = nf.reduce_axis(D, "k")
    m = nf.compute((N,), lambda i: nf.max(x[i, k], k), name="m")
    kk = nf.reduce_axis(D, "k")
    l_ = nf.compute((N,), lambda i: nf.sum(nf.exp(x[i, kk] - m[i]), kk), name="l")
    src = nf.compile(l_, schedule=nf.Schedule(block_m=16, block_n=16), cache=False).source
    assert "tl.exp2(" in src and "base e" not in src
