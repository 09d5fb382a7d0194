"""results.json keeps its documented keys."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone

import torch

from neptune_fusion.bench.metrics import compare
from neptune_fusion.bench.providers.base import Provider
from neptune_fusion.bench.record import Record
from neptune_fusion.bench.results import (
    COMPARISON_KEYS,
    SCHEMA_VERSION,
    TOP_KEYS,
    build_document,
    environment,
    write_json,
)
from neptune_fusion.bench.timing import Ceilings

# Written out literally: renaming a key must fail here and bump SCHEMA_VERSION.
EXPECTED_TOP = ["schema", "schema_version", "date", "mode", "environment", "config",
                "providers", "ceilings", "records", "comparisons", "summary"]
EXPECTED_RECORD = ["op", "phase", "seq", "provider", "group", "status", "ms", "compile_ms",
                   "error", "throughput", "unit", "fraction_of_ceiling", "reason", "note",
                   "ms_spread", "sm_mhz_min", "sm_mhz_max", "power_capped"]
EXPECTED_COMPARISON = ["op", "phase", "seq", "neptune_ms", "baseline", "baseline_ms",
                       "vs_baseline", "compiler", "compiler_ms", "vs_compiler"]
EXPECTED_SUMMARY = ["geomean_vs_baseline", "points_vs_baseline", "geomean_vs_compiler",
                    "points_vs_compiler"]
EXPECTED_ENV = ["gpu", "device", "torch", "triton", "python", "cuda", "platform",
                "neptune_fusion"]
EXPECTED_CEILINGS = ["matmul_tflops", "copy_tbps", "matmul_shape", "copy_bytes"]


def document(tmp_path):
    records = [
        Record("PF-Causal", "PF", 64, "flex", "compiler", "ok", ms=1.0, error=1e-4,
               throughput=2.0, unit="TFLOP/s"),
        Record("PF-Causal", "PF", 64, "neptune", "neptune", "wrong", error=math.inf,
               reason="relative error inf exceeds 0.01"),
    ]
    provider = Provider("flex", "FlexAttention", "compiler", "d", lambda *a: None)
    doc = build_document(date=datetime(2026, 1, 2, tzinfo=timezone.utc), mode="gpu",
                         env=environment(torch.device("cpu")), config={"dtype": "float16"},
                         providers=[provider], ceilings=Ceilings(700.0, 4.0),
                         records=records, comparisons=compare(records))
    path = tmp_path / "results.json"
    write_json(doc, path)
    return json.loads(path.read_text())


def test_top_level_keys_are_stable(tmp_path):
    doc = document(tmp_path)
    assert list(doc) == EXPECTED_TOP == list(TOP_KEYS)
    assert doc["schema_version"] == SCHEMA_VERSION == 1
    assert doc["date"] == "2026-01-02T00:00:00+00:00"
    assert list(doc["environment"]) == EXPECTED_ENV
    assert list(doc["ceilings"]) == EXPECTED_CEILINGS
    assert doc["providers"]["flex"] == {"label": "FlexAttention", "group": "compiler",
                                        "description": "d"}


def test_record_comparison_and_summary_keys_are_stable(tmp_path):
    doc = document(tmp_path)
    for record in doc["records"]:
        assert list(record) == EXPECTED_RECORD
    assert [list(c) for c in doc["comparisons"]] == [EXPECTED_COMPARISON]
    assert EXPECTED_COMPARISON == list(COMPARISON_KEYS)
    assert set(doc["summary"]) == {"PF", "DC"}
    for phase in doc["summary"].values():
        assert list(phase) == EXPECTED_SUMMARY


def test_non_finite_numbers_become_null(tmp_path):
    doc = document(tmp_path)
    assert doc["records"][1]["error"] is None
    assert doc["records"][0]["ms"] == 1.0
