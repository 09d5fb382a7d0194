"""A softmax through the backend computes one exponential per element in its one-tile
kernel, as the same chain written in the language does (codegen/reuse.py): the
translated graph reads a 16-bit maximum through a widening cast, which the rule reads
through (before 2026-12-05 it did not, and bf16 softmax through the backend ran at
0.92x the language's kernel on an H100). Against float64."""

from __future__ import annotations

import pytest
import torch

import neptune_fusion as nf


def _branch(src: str) -> str:
    """The masked one-tile branch of a kernel's source (all of it when it has no
    ``ONE_TILE`` branches)."""
    if "ONE_TILE == 1:" not in src:
        return src
    start = src.index("ONE_TILE == 1:")
    end = src.find("\n    else:", start)
    return src[start:end if end > 0 else None]


def _plain(x):   # the chain suite's spelling (bench/chains.py)
    xf = x.float()
    p = torch.exp(xf - xf.amax(dim=-1, keepdim=True))
    return (p / p.sum(dim=-1, keepdim=True)).to(x.dtype)


FORMS = {"chain-suite": _plain,
         "torch.softmax": lambda x: torch.softmax(x, -1),
         "float32 softmax cast back": lambda x: torch.softmax(x.float(), -1).to(x.dtype)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_softmax_through_the_backend_computes_one_exponential_per_element(dtype, form,
                                                                          grad):
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(6, 40, generator=g) * 4).to(dtype)
    fn = nf.jit(FORMS[form])
    torch._dynamo.reset()
    with torch.set_grad_enabled(grad):
        got = fn(x.clone().requires_grad_(grad))
    want = torch.softmax(x.double(), -1)
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-3)
    [report] = fn.backend.reports
    [fused] = report.fused
    kernel = fused.kernel
    src = (kernel.kernel_for(x) if hasattr(kernel, "kernel_for") else kernel).source
    one = _branch(src)
    assert "tl.exp(" not in one, one
    assert one.count("tl.exp2(") == 1, one

