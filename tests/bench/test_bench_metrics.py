"""Workload counts, throughput, ratios and geometric means."""

from __future__ import annotations

import math

import pytest
from bench_helpers import tiny

from neptune_fusion.bench.metrics import (
    compare,
    fastest,
    fraction_of_ceiling,
    geomean,
    phase_summary,
    ratio,
    throughput,
)
from neptune_fusion.bench.record import Record
from neptune_fusion.bench.workloads import (
    decode_bytes,
    prefill_flops,
    select_operators,
    visited_pairs,
)
from neptune_fusion.ops import OPERATORS


def test_prefill_flops_match_benchmarks_md():
    # 4 * 32 * 16384^2 * 128 = 4.4 TFLOP, halved for causal.
    assert prefill_flops(OPERATORS["PF-Global"], 16384) == 4 * 32 * 16384**2 * 128
    assert prefill_flops(OPERATORS["PF-Causal"], 16384) == 2 * 32 * 16384**2 * 128
    assert prefill_flops(OPERATORS["PF-GQA"], 4096) == 2 * 64 * 4096**2 * 128


def test_decode_bytes_match_benchmarks_md():
    # DC-GQA at 16384 reads 67 MB of K and V in fp16.
    assert decode_bytes(OPERATORS["DC-GQA"], 16384, 2) == 2 * 8 * 16384 * 128 * 2 == 67108864
    with pytest.raises(ValueError, match="decode operators only"):
        decode_bytes(OPERATORS["PF-GQA"], 16384, 2)


@pytest.mark.parametrize("seq", [1, 5, 32, 33, 64, 100])
def test_window_pairs_are_counted_exactly(seq):
    op = tiny("PF-Window")  # window 32
    brute = sum(1 for i in range(seq) for j in range(seq) if 0 <= i - j < op.window)
    assert visited_pairs(op, seq) == brute
    assert prefill_flops(op, seq) == 4 * op.q_heads * op.head_dim * brute


def test_throughput_and_fraction():
    op = OPERATORS["PF-Global"]
    tflops = throughput(op, 16384, 6.0, 2)
    assert tflops == pytest.approx(4.398e12 / 6e-3 / 1e12, rel=1e-3)
    assert fraction_of_ceiling("PF", 500.0, 1000.0, 4.0) == 0.5
    assert fraction_of_ceiling("DC", 2.0, 1000.0, 4.0) == 0.5
    assert fraction_of_ceiling("DC", 2.0, 1000.0, None) is None
    with pytest.raises(ValueError, match="positive"):
        throughput(op, 16384, 0.0, 2)


def test_ratio_and_geomean():
    assert ratio(2.0, 1.0) == 2.0
    assert ratio(None, 1.0) is None and ratio(1.0, None) is None
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([0.5, 2.0, None]) == pytest.approx(1.0)
    assert geomean([]) is None and geomean([None]) is None
    assert geomean([3.0]) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="positive"):
        geomean([1.0, 0.0])


def rec(op: str, seq: int, provider: str, group: str, status: str = "ok",
        ms: float | None = None, phase: str = "PF") -> Record:
    return Record(op=op, phase=phase, seq=seq, provider=provider, group=group, status=status,
                  ms=ms)


RECORDS = [
    rec("PF-Causal", 4096, "sdpa-cudnn", "library", ms=0.27),
    rec("PF-Causal", 4096, "flex", "compiler", ms=0.40),
    rec("PF-Causal", 4096, "triton-fa2", "compiler", status="wrong"),
    rec("PF-Causal", 4096, "neptune", "neptune", ms=0.20),
    rec("PF-SoftCap", 4096, "sdpa-cudnn", "library", status="unsupported"),
    rec("PF-SoftCap", 4096, "flex", "compiler", ms=0.80),
    rec("PF-SoftCap", 4096, "neptune", "neptune", ms=0.40),
    rec("DC-GQA", 4096, "sdpa-flash", "library", ms=0.05, phase="DC"),
    rec("DC-GQA", 4096, "neptune", "neptune", status="error", phase="DC"),
]


def test_fastest_ignores_incorrect_and_other_groups():
    point = RECORDS[:4]
    assert fastest(point, ("library", "compiler")).provider == "sdpa-cudnn"
    assert fastest(point, ("compiler",)).provider == "flex"
    assert fastest(RECORDS[4:7], ("library",)) is None


def test_comparisons_and_phase_geomeans():
    comps = compare(RECORDS)
    assert [(c.op, c.seq) for c in comps] == [("PF-Causal", 4096), ("PF-SoftCap", 4096),
                                              ("DC-GQA", 4096)]
    causal, softcap, dc = comps
    assert causal.baseline == "sdpa-cudnn" and causal.vs_baseline == pytest.approx(1.35)
    assert causal.compiler == "flex" and causal.vs_compiler == pytest.approx(2.0)
    assert softcap.baseline == "flex" and softcap.vs_baseline == pytest.approx(2.0)
    assert dc.neptune_ms is None and dc.vs_baseline is None
    summary = phase_summary(comps)
    assert summary["PF"]["geomean_vs_baseline"] == pytest.approx(math.sqrt(1.35 * 2.0))
    assert summary["PF"]["points_vs_baseline"] == 2
    assert summary["PF"]["geomean_vs_compiler"] == pytest.approx(2.0)
    assert summary["DC"]["geomean_vs_baseline"] is None
    assert summary["DC"]["points_vs_baseline"] == 0


def test_operator_selection():
    assert len(OPERATORS) == 10
    # the harness reads the one operator table of neptune_fusion.ops
    assert select_operators(None) == tuple(OPERATORS.values())
    assert all(a is b for a, b in zip(select_operators(None), OPERATORS.values()))
    assert [op.name for op in select_operators(["dc-gqa", "PF-Global"])] == ["PF-Global",
                                                                             "DC-GQA"]
    with pytest.raises(ValueError, match="unknown operator"):
        select_operators(["PF-Nope"])
