"""The sign analysis that gives producers their SymPy assumptions."""

import neptune_fusion as nf
from neptune_fusion.algebra.sign import sign_of


def test_signs():
    x = nf.placeholder((4,), name="x")
    k = nf.reduce_axis(4, "k")
    assert sign_of(nf.sum(nf.exp(x[k]), k)) == "positive"
    assert sign_of(nf.sum(x[k] ** 2, k)) == "nonnegative"
    assert sign_of(nf.sum(nf.abs(x[k]) * 2.0, k)) == "nonnegative"
    assert sign_of(nf.max(x[k], k)) == "real"
    assert sign_of(nf.sum(x[k] ** 3, k)) == "real"
    assert sign_of(nf.maximum(x[0], nf.exp(x[1]))) == "positive"
    assert sign_of(nf.where(x[0] > 0, nf.exp(x[0]), 0.0)) == "nonnegative"
