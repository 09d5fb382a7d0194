"""The plan as an API: JSON round trip, stage dumps, shared reductions across outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.frontend.examples import plain_attention
from neptune_fusion.ir.graph import tensors_in_order


def test_to_dict_is_json_and_mirrors_the_plan():
    (o,), _ = plain_attention()
    plan = nf.plan(o)
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["single_pass"] is True and d["unfused"] == []
    (g,) = d["groups"]
    assert g["extents"] == ["M"] and g["axes"] == ["j"]
    assert g["producers"] == ["m"] and sorted(g["consumers"]) == ["l", "o_sum"]
    repairs = {m["name"]: m["repair"] for m in g["members"]}
    assert repairs["m"] is None and repairs["l"]["method"] == "inversion"
    assert d["outputs"] == [{"name": "o", "definition": "o_sum / l"}]


def test_outputs_share_their_reductions(rng):
    """Attention and its log-sum-exp read the same m and l: one group computes them once."""
    (o,), _ = plain_attention(d=8)
    by_name = {t.name: t for t in tensors_in_order([o])}
    mx, l = by_name["m"], by_name["l"]  # noqa: E741
    lse = nf.compute((nf.size("N"),), lambda i: mx[i] + nf.log(l[i]), name="lse")
    plan = nf.plan([o, lse])
    (g,) = plan.groups
    assert sorted(m.name for m in g.members) == ["l", "m", "o_sum"]
    feeds = {"q": rng.standard_normal((5, 8)), "k": rng.standard_normal((9, 8)),
             "v": rng.standard_normal((9, 8))}
    want = nf.evaluate([o, lse], feeds)
    got = nf.evaluate([o, lse], feeds, mode="split", splits=2)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_dump_prints_the_requested_stages(monkeypatch, capsys):
    monkeypatch.setenv("NEPTUNE_FUSION_DUMP", "graph,plan")
    (o,), _ = plain_attention()
    nf.plan(o)
    err = capsys.readouterr().err
    assert "after graph" in err and "l <- m" in err and "after plan" in err
    assert "after normalize" not in err


def test_bad_fused_evaluation_options_are_named(rng):
    (o,), _ = plain_attention(d=4)
    feeds = {"q": rng.standard_normal((2, 4)), "k": rng.standard_normal((3, 4)),
             "v": rng.standard_normal((3, 4))}
    for kw, word in (({"tile": 0}, "tile"), ({"mode": "split", "splits": 0}, "splits"),
                     ({"mode": "sideways"}, "mode")):
        try:
            nf.evaluate(o, feeds, **({"mode": "rolling"} | kw))
        except nf.NeptuneError as err:
            assert word in str(err)
        else:
            raise AssertionError(f"{kw} accepted")


def test_nested_reductions_over_one_axis_get_distinct_binders():
    """Canonical binders are named by height, so a max over k inside a sum over k inside a
    max over k (one user axis, inlined three times) binds three different variables."""
    from neptune_fusion.analysis.canon import SpatialVars, canonical_output
    from neptune_fusion.ir.nodes import Reduce
    from neptune_fusion.ir.traverse import walk
    n = nf.size("N")
    x = nf.placeholder((n, 8), name="x")
    k = nf.reduce_axis(8, "k")
    r1 = nf.compute((n,), lambda i: nf.max(x[i, k], k), name="r1")
    r2 = nf.compute((n,), lambda i: nf.sum(nf.exp(x[i, k] - r1[i]), k), name="r2")
    out = nf.compute((n,), lambda i: nf.max(nf.exp(x[i, k] - r1[i]) / r2[i], k), name="out")
    body, _ = canonical_output(out, SpatialVars(), {})
    binders = {id(r.axes[0]) for r in walk(body) if isinstance(r, Reduce)}
    assert len(binders) == 3


def test_the_verifier_runs_between_the_planner_passes(monkeypatch):
    """With NEPTUNE_FUSION_VERIFY=1 (the suite's setting) a pass that breaks the IR is
    named: here a normalisation that leaves an index variable nothing binds."""
    from neptune_fusion.fusion import plan as planner
    from neptune_fusion.ir.dtypes import float32
    from neptune_fusion.ir.nodes import Binary, Cast, IndexVar
    loose = IndexVar("z", 3, "spatial", 10**9 + 7)
    monkeypatch.setattr(planner, "normalize", lambda b: Binary("add", b, Cast(loose, float32)))
    (o,), _ = plain_attention(d=8)
    with pytest.raises(nf.VerificationError,
                       match="after normalize: output 'o': uses index variable\\(s\\) z"):
        nf.plan(o)
    monkeypatch.setenv("NEPTUNE_FUSION_VERIFY", "0")
    nf.plan(o)  # verification off: the pass is not checked


def test_one_maximum_however_its_copies_are_named_or_widened():
    """SDPA in bf16 through the backend: the softmax's ``max(cast(s, float32))`` over
    ``r_amax`` and the empty-row guard's ``max(s)`` over ``r_amax_1`` planned as two
    running maxima (the second one kept the H200 kernel off the Gluon path: 0.83 ms for
    Llama-1B's 8192-token layer against 0.68 ms for ``nf.attention``). Binders are named
    by their height, position and extent across the program, and a float cast moves out
    of a maximum: one member."""
    N, M = nf.sizes("N M")
    x = nf.placeholder((N, M), "bfloat16", name="x")
    a, b, c = nf.reduce_axis(M, "a"), nf.reduce_axis(M, "b"), nf.reduce_axis(M, "c")

    def body(i):
        guard = nf.max(x[i, a], a)
        m = nf.max(nf.cast(x[i, b], "float32"), b)
        s = nf.sum(nf.exp(nf.cast(x[i, c], "float32") - m), c)
        return nf.where(guard == float("-inf"), 0.0, s)
    p = nf.plan(nf.compute((N,), body, name="o"))
    members = [m.name for g in p.groups for m in g.members]
    assert len(members) == 2, str(p)
    kern = nf.compile(nf.compute((N,), body, name="o"), [x], cache=False)
    xs = (torch.randn(5, 33, generator=torch.Generator().manual_seed(2)) * 3)
    xs = xs.to(torch.bfloat16)
    xs[1] = float("-inf")
    xd = xs.double()
    want = torch.exp(xd - xd.max(1, keepdim=True).values).sum(1)
    want[1] = 0.0
    torch.testing.assert_close(kern(xs).double(), want, rtol=1e-5, atol=1e-5)
