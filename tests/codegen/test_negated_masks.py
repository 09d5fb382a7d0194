"""A mask written as the condition that hides (``where(~keep, -inf, s)``, with a
leftover ``& True``: how the torch.compile backend translates ``masked_fill(~tril)``)
partitions the loop as ``where(keep, s, -inf)`` does: the same tiles visited, the
hidden ones skipped, and the same values (float64 check on fresh random data)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.ir import build
from neptune_fusion.ir.fold import fold
from neptune_fusion.ir.nodes import Where


def _attention(form: str):
    N, D = nf.sizes("N D")
    q, k, v = (nf.placeholder((N, D), name=n) for n in "qkv")
    j, c = nf.reduce_axis(N, "j"), nf.reduce_axis(D, "c")

    def sc(i, jj):
        s = nf.sum(q[i, c] * k[jj, c], c) * 0.25
        if form == "keep":
            return nf.where(jj <= i, s, -math.inf)
        return nf.where(~((jj - i <= 0) & True), -math.inf, s)
    m = nf.compute((N,), lambda i: nf.max(sc(i, j), j), name="m")
    l_ = nf.compute((N,), lambda i: nf.sum(nf.exp(sc(i, j) - m[i]), j), name="l")
    return nf.compute((N, D), lambda i, d: nf.sum(nf.exp(sc(i, j) - m[i]) * v[j, d], j)
                      / l_[i], name="o")


def test_where_of_a_negation_swaps_its_branches():
    x = nf.placeholder((4,), name="x")
    i = nf.reduce_axis(4, "i")
    cond = build.binary("le", i, 2)
    got = fold(build.where(~cond, x[i], 0.0))
    assert isinstance(got, Where) and got.cond is cond and got.b.dtype == x.dtype


@pytest.mark.parametrize("n", [29, 48])
def test_hidden_tiles_skipped_for_both_forms(n):
    sched = nf.Schedule(block_m=16, block_n=16, count_visits=True)
    kernels = {f: nf.compile(_attention(f), schedule=sched, cache=False)
               for f in ("keep", "hide")}
    for f, kern in kernels.items():
        loops = [x.strip() for x in kern.source.splitlines() if x.strip().startswith("for ")]
        assert loops[-1].endswith("range(j_full_hi, j_hi, BLOCK_N):"), (f, loops)
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn((n, 8), generator=g) for _ in range(3))
    s = (q.double() @ k.double().T) * 0.25
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).tril().logical_not(), -np.inf)
    want = torch.softmax(s, -1) @ v.double()
    runs = {f: kern.launch(q, k, v) for f, kern in kernels.items()}
    for run in runs.values():
        torch.testing.assert_close(run.outputs[0].double(), want, rtol=1e-5, atol=1e-5)
    assert runs["keep"].visits.tolist() == runs["hide"].visits.tolist()
