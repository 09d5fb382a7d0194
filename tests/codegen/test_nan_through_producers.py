"""A NaN that reaches a consumer only through its producer's value: ``max_k(p - y)`` and
``sum_k exp(y - p)`` with ``p = max_k x`` and the NaN in ``x`` alone. The consumer read
a non-finite running maximum as 0 (the guard was ``|p| < inf``), so these rows came back
finite where the reference and eager PyTorch give NaN (a fuzzing find, 2026-12-04, on
5576c83; the guard now reads only the identity as 0: ir/reducers.safe_expr). Every
schedule, and through the torch.compile backend."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.dynamo import Backend
from neptune_fusion.schedule.schedule import Schedule

D = 24
SCHEDULES = {"one_tile": dict(schedule=Schedule(block_m=2, block_n=32, num_warps=1,
                                                num_stages=1)),
             "looped": dict(schedule=Schedule(block_m=2, block_n=8, num_warps=1,
                                              num_stages=1)),
             "split": dict(strategy="split", splits=3, block_m=16, block_n=8)}
CHAINS = {"max(p - y)": (lambda p, y, k: nf.max(p - y, k),
                         lambda x, y: (x.amax(-1, keepdim=True) - y).amax(-1)),
          "sum exp(y - p)": (lambda p, y, k: nf.sum(nf.exp(y - p), k),
                             lambda x, y: torch.exp(y - x.amax(-1, keepdim=True)).sum(-1))}


def _inputs():
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(4, D, generator=gen), torch.randn(4, D, generator=gen)
    x[1, 5] = float("nan")   # row 1: NaN in the producer's input only
    x[3, :] = float("nan")
    return x, y


@pytest.mark.parametrize("sched", sorted(SCHEDULES))
@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_a_nan_producer_makes_its_consumers_row_nan(chain, sched):
    N = nf.size("N")
    x, y = nf.placeholder((N, D), name="x"), nf.placeholder((N, D), name="y")
    k1, k2 = nf.reduce_axis(D, "k"), nf.reduce_axis(D, "k")
    p = nf.compute((N,), lambda i: nf.max(x[i, k1], k1), name="p")
    out = nf.compute((N,), lambda i: CHAINS[chain][0](p[i], y[i, k2], k2), name="out")
    kern = nf.compile(out, [x, y], cache=False, **SCHEDULES[sched])
    xs, ys = _inputs()
    got = kern(xs, ys)
    want = nf.evaluate(out, {"x": xs.double().numpy(), "y": ys.double().numpy()})
    assert np.array_equal(got.isnan().numpy(), np.isnan(want)), (got, want)
    assert got[[1, 3]].isnan().all() and not got[[0, 2]].isnan().any()
    np.testing.assert_allclose(got[[0, 2]].double().numpy(), want[[0, 2]], rtol=1e-5)


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_through_the_backend(chain):
    fn = CHAINS[chain][1]
    x, y = _inputs()
    torch._dynamo.reset()
    backend = Backend(rest="eager")
    with torch.no_grad():
        got = torch.compile(fn, backend=backend)(x, y)
    assert backend.reports[0].fused, backend.reports[0]
    torch.testing.assert_close(got.double(), fn(x.double(), y.double()), equal_nan=True)
