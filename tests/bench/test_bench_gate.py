"""The correctness gate and the runner's handling of wrong, unsupported and failing providers."""

from __future__ import annotations

import math

import pytest
import torch
from bench_helpers import SEQ, correct_prepare, fake, inputs, tiny, unsupported_prepare

from neptune_fusion.bench.gate import check, relative_error, threshold_for
from neptune_fusion.bench.providers.base import Prepared, RunContext, UnsupportedError
from neptune_fusion.bench.reference import reference_attention
from neptune_fusion.bench.runner import run_point
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
