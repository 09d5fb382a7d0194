"""Every chain of the catalogue: fused (rolling and split) equals the plain reference."""

from __future__ import annotations

import numpy as np
import pytest

import neptune_fusion as nf

from .chains import FUSABLE, tanh_chain

MODES = [("rolling", {"tile": 1}), ("rolling", {"tile": 7}), ("rolling", {"tile": 1000}),
         ("split", {"splits": 1}), ("split", {"splits": 2}), ("split", {"splits": 7})]


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", sorted(FUSABLE))
def test_fused_equals_unfused(name, rng):
    outputs, feeds = FUSABLE[name]()
    nf.verify(outputs)
    plan = nf.plan(outputs, require_single_pass=True)
    assert plan.single_pass
    assert len({g.stage for g in plan.groups}) == 1, str(plan)
    f = feeds(rng)
    want = nf.evaluate(outputs, f)
    for mode, kw in MODES:
        got = nf.evaluate(outputs, f, mode=mode, **kw)
        for g, w in zip(got, want):
            _close(g, w)


def test_attention_plan_reads_like_flash_attention():
    outputs, _ = FUSABLE["attention"]()
    text = str(nf.plan(outputs))
    assert "l' = l*exp(m - m') + sum_tile(" in text
    assert "m' = max(m, max_tile(" in text
    assert "o_sum' = o_sum*exp(m - m') + sum_tile(" in text
    assert "output o[" in text and "o_sum / l" in text


def test_attention_is_one_group_with_online_softmax_state():
    outputs, _ = FUSABLE["causal"]()
    plan = nf.plan(outputs)
    (g,) = plan.groups
    assert [m.name for m in g.producers] == ["m"]
    assert sorted(m.name for m in g.consumers) == ["l", "o_sum"]
    assert all(m.repair.method == "inversion" for m in g.consumers)
    assert sorted(g.state) == ["l", "m", "o_sum"]
    d = plan.to_dict()
    assert d["single_pass"] and d["groups"][0]["state"] == list(g.state)


def test_variance_uses_the_augmented_welford_state():
    outputs, _ = FUSABLE["variance"]()
    plan = nf.plan(outputs)
    (g,) = plan.groups
    (c,) = g.consumers
    assert c.repair.method == "augmented"
    assert len(c.repair.terms) == 3  # centred sum of squares, centred sum, count


def _layernorm_f32(f):
    """Plain two-pass float32 LayerNorm-then-matmul in NumPy: the float32 yardstick."""
    x, w, b, W = (f[k].astype(np.float32) for k in ("x", "w", "b", "W"))
    mu = x.mean(1, keepdims=True)
    var = ((x - mu) ** 2).mean(1, keepdims=True)
    return (((x - mu) / np.sqrt(var + np.float32(1e-5)) * w + b) @ W).astype(np.float64)


def test_layernorm_matmul_is_stable_in_float32(rng):
    """Mean 1e4, std 1, float32 data: the fused single pass is centred (Welford-like).

    In float64 the fused plan matches the plain reference to 1e-10. In float32 it is as
    accurate as a plain two-pass float32 LayerNorm (whose error is set by rounding
    x - mean at magnitude 1e4), while the uncentred one-pass formula loses all digits.
    """
    outputs, feeds = FUSABLE["layernorm_matmul"]()
    f = feeds(rng)
    f["x"] = (rng.standard_normal(f["x"].shape) + 1e4).astype(np.float32).astype(np.float64)
    want = nf.evaluate(outputs, f)[0]  # float64 on the same float32 data

    def rel(got):
        return np.linalg.norm(got - want) / np.linalg.norm(want)

    from neptune_fusion.fusion.reference import evaluate_fused
    assert rel(nf.evaluate(outputs, f, mode="rolling", tile=8)[0]) < 1e-10
    fused32 = rel(evaluate_fused(outputs, f, mode="rolling", tile=8, precision="float32")[0])
    split32 = rel(evaluate_fused(outputs, f, mode="split", splits=3, precision="float32")[0])
    two_pass = rel(_layernorm_f32(f))
    assert fused32 < max(3 * two_pass, 1e-4) and fused32 < 1e-3, (fused32, two_pass)
    assert split32 < max(3 * two_pass, 1e-4) and split32 < 1e-3, (split32, two_pass)
    x = f["x"].astype(np.float32)
    naive_var = (x * x).mean(1) - x.mean(1) ** 2  # the uncentred one-pass variance
    true_var = f["x"].var(1)
    assert np.max(np.abs(naive_var - true_var) / true_var) > 1e-2  # it really is unstable


def test_tanh_chain_is_not_fused_and_says_why(rng):
    outputs, feeds = tanh_chain()
    plan = nf.plan(outputs)
    assert not plan.single_pass
    (u,) = plan.unfused
    assert (u.consumer, u.producer) == ("t", "max0")
    assert "distribute" in u.reason or "close" in u.reason
    assert "unfused:" in str(plan)
    f = feeds(rng)
    want = nf.evaluate(outputs, f)
    for mode, kw in MODES:
        _close(nf.evaluate(outputs, f, mode=mode, **kw), want)


def test_require_single_pass_names_consumer_producer_and_condition():
    outputs, _ = tanh_chain()
    with pytest.raises(nf.FusionError) as err:
        nf.plan(outputs, require_single_pass=True)
    msg = str(err.value)
    assert "consumer t " in msg and "producer max0 " in msg
    assert "inversion" in msg and "augmented" in msg
