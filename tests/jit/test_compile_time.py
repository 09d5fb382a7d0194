"""Compiles a fuzzing session found to take minutes through the backend (4 x 16 float32 on
the CPU): SymPy's cost grew with a constant's size (``softmax(x - 1e9)``), and a max
consumer's proof simplified an expression of some 1700 operations (``tanh`` of a
log-softmax over its absolute maximum). Each now compiles in seconds, matches float64
and (where float32 can) eager PyTorch; a synthesis past its budget leaves the chain to
the rest of the compiler, with the reason."""

from __future__ import annotations

import time

import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.algebra import synth

TOL = 2e-5


def _run(fn, x):
    torch._dynamo.reset()
    g = nf.jit(fn, rest="eager")
    start = time.perf_counter()
    with torch.no_grad():
        got = g(x)
        seconds = time.perf_counter() - start
        return got, g.explain(x), seconds


def _err(a, b) -> float:
    return float((a.double() - b.double()).abs().max())


@pytest.mark.parametrize("shift", [1e3, 1e9])
def test_softmax_of_a_shifted_input(shift):
    x = torch.randn(4, 16)

    def fn(x):
        return torch.softmax(x - shift, -1)
    got, ex, seconds = _run(fn, x)
    assert seconds < 60, f"took {seconds:.1f} s"
    (fused,) = ex.fused
    assert "every chain fused" in fused.plan, str(ex)
    assert _err(got, fn(x.double())) <= TOL
    if shift == 1e3:
        assert _err(got, fn(x)) <= 2 * TOL + 1e-4   # float32 rounds x - 1000 to 6e-5
    else:   # float32 rounds x - 1e9 to -1e9: eager's rows are uniform (docs/algebra.md)
        assert _err(fn(x), torch.full_like(x, 1 / 16)) == 0


def test_tanh_of_log_softmax_over_its_absolute_maximum():
    x = torch.randn(4, 16)

    def fn(x):
        y = torch.tanh(torch.log_softmax(x, -1))
        return y / y.abs().amax(-1, keepdim=True)
    got, ex, seconds = _run(fn, x)
    assert seconds < 60, f"took {seconds:.1f} s"
    (fused,) = ex.fused   # the log-softmax fused; the max of |tanh| a pass of its own
    assert "FusionPlan" in fused.plan and "inversion" in fused.plan
    assert "synthesis budget" not in fused.plan, str(ex)   # proved or refused, not stopped
    assert _err(got, fn(x.double())) <= TOL
    assert _err(got, fn(x)) <= 2 * TOL


def test_a_synthesis_past_its_budget_leaves_the_region_with_the_reason(monkeypatch):
    real = synth._derive

    def slow(*args):   # only a budget stops it (a warm SymPy may derive in milliseconds)
        end = time.perf_counter() + 60.0
        while time.perf_counter() < end:
            pass
        return real(*args)
    monkeypatch.setattr(synth, "_derive", slow)
    monkeypatch.setenv("NEPTUNE_FUSION_SYNTH_BUDGET", "0.05")
    synth.clear_memo()   # else the softmax derived by an earlier test is reused

    def fn(x):
        return torch.softmax(x, -1) * 2.0
    x = torch.randn(4, 16)
    try:
        got, ex, seconds = _run(fn, x)
    finally:
        synth.clear_memo()
    assert seconds < 30
    assert not ex.fused, str(ex)
    assert any("NEPTUNE_FUSION_SYNTH_BUDGET" in x.reason for x in ex.left), str(ex)
    assert _err(got, fn(x)) <= 1e-6
