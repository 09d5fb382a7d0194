"""The synthesis' time budget: a derivation past it is stopped, the chain is left unfused
with the reason naming the setting, and nothing of the stopped derivation leaks out."""

from __future__ import annotations

import time

import numpy as np
import pytest
import sympy as sp
import torch

import neptune_fusion as nf
from neptune_fusion import settings
from neptune_fusion.algebra import synth
from neptune_fusion.algebra.budget import TimedOut, within

from .chains import softmax


def _spin(seconds: float) -> int:
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        n += 1
    return n


def test_within_stops_python_and_sympy_past_the_budget():
    start = time.perf_counter()
    got = within(0.2, lambda: _spin(30.0))
    assert isinstance(got, TimedOut) and got.seconds == 0.2
    assert time.perf_counter() - start < 5
    # SymPy's own work is stopped too: an expansion of about 40,000 terms (8 s alone).
    # (What made compiles take minutes was ``solve(Eq(t, exp(c - r + 10**6)), c)``
    # building a polynomial of degree 10**6; after tests/runtime in the same process it
    # answers at once, so it cannot stand for "slow" here.)
    c, r, t = sp.symbols("c r t", real=True)
    sp.core.cache.clear_cache()
    start = time.perf_counter()
    got = within(0.3, lambda: sp.expand((c + r + t + 1) ** 60))
    assert isinstance(got, TimedOut)
    assert time.perf_counter() - start < 3
    assert sp.Add(1, 1) == 2   # SymPy evaluates as before (its global switches restored)


def test_within_returns_the_result_and_leaves_no_exception_behind():
    assert within(0.2, lambda: 42) == 42
    time.sleep(0.4)             # past the budget: the cancelled timer raises nothing
    assert within(float("inf"), lambda: "no limit") == "no limit"
    assert isinstance(within(0, lambda: 1), TimedOut)


@pytest.fixture
def slow_algebra(monkeypatch):
    """Every derivation spins for a minute before it derives: only a budget stops it (a
    real derivation may finish within a tiny budget once SymPy's caches are warm)."""
    real = synth._derive

    def slow(*args):
        _spin(60.0)
        return real(*args)
    monkeypatch.setattr(synth, "_derive", slow)
    synth.clear_memo()   # an earlier test's derivation would be reused, not re-run
    yield lambda: monkeypatch.setattr(synth, "_derive", real)
    synth.clear_memo()


def test_a_derivation_past_its_budget_leaves_the_chain_unfused_and_says_so(slow_algebra):
    outputs, _ = softmax()
    start = time.perf_counter()
    plan = nf.plan(outputs, budget=0.05)
    assert time.perf_counter() - start < 10
    assert not plan.single_pass
    (u,) = plan.unfused
    assert u.timed_out and plan.timed_out == (u,)
    assert "synthesis budget" in u.reason and "NEPTUNE_FUSION_SYNTH_BUDGET" in u.reason
    assert "NEPTUNE_FUSION_SYNTH_BUDGET" in str(plan)
    assert plan.to_dict()["unfused"][0]["timed_out"] is True
    with pytest.raises(nf.FusionError, match="NEPTUNE_FUSION_SYNTH_BUDGET"):
        nf.plan(outputs, require_single_pass=True, budget=0.05)
    # the stopped derivation is remembered with its budget: a larger one tries again
    slow_algebra()   # (and derives at its real speed)
    plan = nf.plan(outputs, budget=60)
    assert plan.single_pass and not plan.timed_out
    assert nf.plan(outputs, budget=0.05).single_pass   # a result is kept for good


def test_a_plan_past_its_budget_evaluates_in_passes(slow_algebra, monkeypatch, rng):
    monkeypatch.setenv("NEPTUNE_FUSION_SYNTH_BUDGET", "0.05")
    outputs, feeds = softmax()
    assert nf.plan(outputs).timed_out
    f = feeds(rng)   # unfused, the plan still evaluates right, in two passes
    np.testing.assert_allclose(nf.evaluate(outputs, f, mode="rolling", tile=4),
                               nf.evaluate(outputs, f), rtol=1e-12)


def test_nf_compile_falls_back_to_passes_and_require_single_pass_names_the_setting(
        slow_algebra, monkeypatch, rng):
    monkeypatch.setenv("NEPTUNE_FUSION_SYNTH_BUDGET", "0.05")
    (y,), feeds = softmax()
    f = feeds(rng)
    kern = nf.compile(y, cache=False)
    assert kern.plan.timed_out
    got = kern(torch.tensor(f["x"], dtype=torch.float32))
    np.testing.assert_allclose(got.double().numpy(), nf.evaluate(y, f), rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(nf.NeptuneError, match="NEPTUNE_FUSION_SYNTH_BUDGET"):
        nf.compile(y, cache=False, require_single_pass=True)
    slow_algebra()
    monkeypatch.setenv("NEPTUNE_FUSION_SYNTH_BUDGET", "60")
    assert nf.compile(y, cache=False).plan.single_pass


def test_the_setting_default(monkeypatch):
    monkeypatch.delenv("NEPTUNE_FUSION_SYNTH_BUDGET", raising=False)
    assert settings.synth_budget() == 10.0


@pytest.mark.parametrize("raw, want", [("2.5", 2.5), ("0", float("inf")), (" 7 ", 7.0)])
def test_the_setting_values(monkeypatch, raw, want):
    monkeypatch.setenv("NEPTUNE_FUSION_SYNTH_BUDGET", raw)
    assert settings.synth_budget() == want


@pytest.mark.parametrize("raw", ["-1", "soon", "nan"])
def test_a_bad_setting_is_named(monkeypatch, raw):
    monkeypatch.setenv("NEPTUNE_FUSION_SYNTH_BUDGET", raw)
    with pytest.raises(nf.NeptuneError, match="NEPTUNE_FUSION_SYNTH_BUDGET"):
        settings.synth_budget()
