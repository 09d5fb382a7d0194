"""Two distinct index variables with one name in one kernel (a derived program's ``c`` as
rows and as a contraction) get distinct identifiers in the source (lower._named_apart)."""

from __future__ import annotations

import torch

import neptune_fusion as nf


def test_rows_and_an_inner_contraction_sharing_a_name(rng):
    N, D = nf.sizes("N D")
    x = nf.placeholder((N, D), name="x")
    w = nf.placeholder((D,), name="w")
    i = nf.reduce_axis(N, "i")
    c2 = nf.reduce_axis(D, "c")   # named like the output's rows below
    y = nf.compute((D,), lambda c: nf.sum(x[i, c] * nf.exp(nf.sum(x[i, c2] * w[c2], c2)),
                                          i), name="y")
    kern = nf.compile(y, cache=False)
    t = torch.tensor(rng.standard_normal((7, 3)), dtype=torch.float32)
    tw = torch.tensor(rng.standard_normal(3) * 0.3, dtype=torch.float32)
    got = kern(t, tw)   # before: offs_c named both axes (a shape error, or a wrong store)
    xd, wd = t.double(), tw.double()
    want = (xd * torch.exp(xd @ wd)[:, None]).sum(0)
    assert float((got.double() - want).abs().max() / want.abs().max()) < 1e-5
    src = kern.kernel_for(t, tw).source
    assert "offs_c = " in src and "offs_c_2 = " in src
