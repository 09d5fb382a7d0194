"""The correctness gate and the runner's handling of wrong, unsupported and failing providers."""

from __future__ import annotations

import math

import pytest
import torch
from bench_helpers import SEQ, correct_prepare, fake, inputs, tiny, unsupported_prepare

from neptune_fusion.bench.gate import check, relative_error, threshold_for
from neptune_fusion.bench.providers.base import Prepared, RunContext, UnsupportedError
from neptune_fusion.bench.reference import reference_attention
from neptune_fusion.bench.runner import run_point, run_providers
from neptune_fusion.bench.timing import Ceilings


class CountingTimer:
    """A timer that records how often it was asked to time something."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fn) -> float:
        self.calls += 1
        fn()
        return 1.0


def run(provider, op_name: str = "PF-Causal"):
    op = tiny(op_name)
    q, k, v, ref = inputs(op)
    timer = CountingTimer()
    ctx = RunContext(torch.device("cpu"), torch.float16, timer, smoke=True)
    return run_point(provider, op, SEQ, q, k, v, ref, ctx, Ceilings(None, None)), timer


def test_forgetting_the_causal_mask_is_wrong_and_not_timed():
    def no_mask(op, q, k, v, ctx):
        global_op = tiny("PF-Global")
        return Prepared(lambda: reference_attention(global_op, q, k, v).to(q.dtype))

    rec, timer = run(fake("no-mask", no_mask))
    assert rec.status == "wrong"
    assert rec.ms is None and rec.throughput is None
    assert timer.calls == 0
    assert rec.error > 0.1 and "exceeds" in rec.reason


def test_a_correct_provider_passes_and_is_timed_once():
    rec, timer = run(fake("ref", correct_prepare))
    assert rec.status == "ok", rec.reason
    assert rec.error < 1e-3 and rec.ms == 1.0 and rec.compile_ms is not None
    assert rec.unit == "TFLOP/s" and rec.throughput > 0
    assert timer.calls == 1


@pytest.mark.parametrize("prepare, status, text", [
    (unsupported_prepare, "unsupported", "only exists in tests"),
    (lambda *a: (_ for _ in ()).throw(NotImplementedError("no ALiBi yet")), "unsupported",
     "no ALiBi yet"),
    (lambda *a: (_ for _ in ()).throw(UnsupportedError("no window")), "unsupported",
     "no window"),
    (lambda *a: (_ for _ in ()).throw(ValueError("bad tile")), "error", "ValueError: bad tile"),
    (lambda op, q, k, v, ctx: Prepared(lambda: q[..., :8]), "wrong", "shape"),
    (lambda op, q, k, v, ctx: Prepared(lambda: "not a tensor"), "wrong", "not a tensor"),
])
def test_unsupported_and_failing_providers_are_reported(prepare, status, text):
    rec, timer = run(fake("odd", prepare))
    assert rec.status == status
    assert text in rec.reason
    assert rec.ms is None and timer.calls == 0


def test_relative_error_and_thresholds():
    ref = torch.ones(4, dtype=torch.float64)
    assert relative_error(ref.to(torch.float16), ref) == 0.0
    assert relative_error(torch.full((4,), float("nan")), ref) == math.inf
    assert threshold_for(torch.float16) < threshold_for(torch.bfloat16)
    with pytest.raises(ValueError, match="no correctness threshold"):
        threshold_for(torch.int32)
    assert not check(torch.zeros(4), ref, torch.float16).passed


def test_describe_adds_to_the_note_and_a_failing_one_costs_nothing():
    def described(note_of):
        def prepare(op, q, k, v, ctx):
            p = correct_prepare(op, q, k, v, ctx)
            return Prepared(p.fn, "plain", note_of)
        return prepare

    rec, _ = run(fake("said", described(lambda: "schedule: rolling 16x16")))
    assert rec.status == "ok" and rec.note == "plain; schedule: rolling 16x16"
    rec, _ = run(fake("mute", described(lambda: 1 / 0)))
    assert rec.status == "ok" and rec.note == "plain"


class ScriptedTimer:
    """A timer whose answer depends on the provider it times and on the round: the order
    of calls is kept, and ``fail`` names a provider whose timing raises in round 2."""

    def __init__(self, fns: dict, times: dict, fail: str | None = None) -> None:
        self.fns, self.times, self.fail, self.order = fns, times, fail, []

    def __call__(self, fn) -> float:
        name = next(n for n, f in self.fns.items() if f is fn)
        self.order.append(name)
        k = self.order.count(name) - 1
        if name == self.fail and k == 1:
            raise RuntimeError("the device went away")
        return self.times[name][k]


def test_rounds_interleave_the_providers_and_keep_the_median():
    """Providers are gated first, then timed round by round, the order turned each round;
    a provider's time is the median of its rounds, its spread (max - min) / median; a
    wrong or unsupported one is never timed; one whose timing fails becomes an error."""
    op = tiny("PF-Causal")
    q, k, v, ref = inputs(op)
    fns = {}

    def keep(name):
        def prepare(op, q, k, v, ctx):
            fns[name] = lambda: reference_attention(op, q, k, v).to(q.dtype)
            return Prepared(fns[name], name)
        return fake(name, prepare)

    def wrong(op, q, k, v, ctx):
        return Prepared(lambda: torch.zeros_like(q))

    providers = (keep("a"), fake("odd", unsupported_prepare), keep("b"), fake("bad", wrong),
                 keep("c"), keep("d"))
    timer = ScriptedTimer(fns, {"a": [1.0, 3.0, 2.0], "b": [2.0, 2.0, 2.2],
                                "c": [5.0, 4.0, 6.0], "d": [1.0, 1.0, 1.0]}, fail="d")
    ctx = RunContext(torch.device("cpu"), torch.float16, timer, smoke=True)
    recs = run_providers(providers, op, SEQ, q, k, v, ref, ctx, Ceilings(None, None),
                         rounds=3)
    assert [r.provider for r in recs] == ["a", "odd", "b", "bad", "c", "d"]
    assert [r.status for r in recs] == ["ok", "unsupported", "ok", "wrong", "ok", "error"]
    assert timer.order == ["a", "b", "c", "d", "b", "c", "d", "a", "c", "a", "b"]
    a, b, c = recs[0], recs[2], recs[4]
    assert (a.ms, b.ms, c.ms) == (2.0, 2.0, 5.0)
    assert a.ms_spread == pytest.approx(1.0) and b.ms_spread == pytest.approx(0.1)
    assert c.ms_spread == pytest.approx(0.4) and recs[5].ms is None
    assert "while timing: RuntimeError: the device went away" in recs[5].reason
    assert recs[1].ms_spread is None and recs[3].ms is None
    one = run_providers(providers[:1], op, SEQ, q, k, v, ref,
                        RunContext(torch.device("cpu"), torch.float16, CountingTimer(),
                                   smoke=True), Ceilings(None, None))
    assert one[0].status == "ok" and one[0].ms_spread is None
