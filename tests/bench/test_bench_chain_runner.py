"""The chain suite's loop, gate, comparisons and results document, with fake providers."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
import torch
from rich.console import Console

from neptune_fusion.bench.chain_report import (
    CHAIN_COMPARISON_KEYS,
    CHAIN_TOP_KEYS,
    _rounds_note,
    build_chain_document,
    chain_markdown,
    compare_chains,
    render_chains,
)
from neptune_fusion.bench.chain_runner import (
    CHAIN_RECORD_KEYS,
    TF32_THRESHOLD,
    ChainRecord,
    chain_threshold,
    gate_outputs,
    run_chains,
)
from neptune_fusion.bench.chains import CHAINS, reference
from neptune_fusion.bench.providers.base import Prepared, RunContext, Unsupported
from neptune_fusion.bench.providers.chains import EAGER, ChainProvider, select_chain_providers
from neptune_fusion.bench.results import environment, write_json
from neptune_fusion.bench.timing import Ceilings, wall_timer
from neptune_fusion.errors import CodegenError

CTX = RunContext(torch.device("cpu"), torch.float32, wall_timer(), smoke=True)

# Written out literally: renaming a key must fail here (and bump schema_version).
EXPECTED_TOP = ["schema", "schema_version", "suite", "date", "mode", "environment", "config",
                "providers", "ceilings", "records", "comparisons", "summary"]
EXPECTED_RECORD = ["chain", "dtype", "sizes", "single_pass", "bound", "provider", "group",
                   "status", "ms", "compile_ms", "error", "threshold", "throughput", "unit",
                   "fraction_of_ceiling", "reason", "note", "ms_spread", "sm_mhz_min",
                   "sm_mhz_max", "power_capped"]


def fake(name, prepare, group="neptune"):
    return ChainProvider(name, name, group, f"test provider {name}", prepare)


def exact(chain, tensors, ctx):
    ref = reference(chain, tensors)
    return Prepared(lambda: tuple(r.to(ctx.dtype) for r in ref) if len(ref) > 1
                    else ref[0].to(ctx.dtype), "float64 reference, rounded")


def off_by_one_percent(chain, tensors, ctx):
    ref = reference(chain, tensors)
    return Prepared(lambda: (ref[0] * 1.01).to(ctx.dtype))


def fails_to_compile(chain, tensors, ctx):
    raise CodegenError("no schedule of the search space fits NVIDIA H200\nsecond line")


def cannot(chain, tensors, ctx):
    return Unsupported("not in this test")


def test_each_failure_becomes_a_record_and_the_run_goes_on():
    providers = [fake("good", exact), fake("wrong", off_by_one_percent),
                 fake("broken", fails_to_compile), fake("na", cannot), EAGER]
    chains = [CHAINS["logsumexp"], CHAINS["layer-stats"]]
    recs = run_chains(chains, [torch.float32, torch.bfloat16], providers, CTX,
                      Ceilings(None, None))
    assert len(recs) == 2 * 2 * 5
    by = {(r.chain, r.dtype, r.provider): r for r in recs}
    good = by["logsumexp", "float32", "good"]
    assert good.status == "ok" and good.ms is not None and good.compile_ms is not None
    assert good.error < 1e-6 and good.unit == "TB/s" and good.sizes == {"N": 5, "M": 33}
    wrong = by["logsumexp", "float32", "wrong"]
    assert wrong.status == "wrong" and wrong.ms is None
    assert wrong.error == pytest.approx(0.01, rel=1e-3) and "exceeds 0.001" in wrong.reason
    # two outputs: a provider returning one of them is wrong, naming the count
    assert "1 output(s), the reference has 2" in by["layer-stats", "float32", "wrong"].reason
    broken = by["logsumexp", "bfloat16", "broken"]
    assert broken.status == "error"
    assert broken.reason == "CodegenError: no schedule of the search space fits NVIDIA H200"
    assert by["layer-stats", "bfloat16", "na"].status == "unsupported"
    assert by["layer-stats", "bfloat16", "torch-eager"].status == "ok"


def test_rounds_time_every_right_provider_and_keep_their_spread():
    """With rounds, each right provider is timed once per round (the median counts, the
    spread is kept and the report names the widest); failures are never timed."""
    calls = []

    def timer(fn):
        calls.append(fn)
        return [3.0, 1.0, 2.0][sum(f is fn for f in calls) - 1]
    ctx = RunContext(torch.device("cpu"), torch.float32, timer, smoke=True)
    providers = [fake("good", exact), fake("wrong", off_by_one_percent), EAGER]
    recs = run_chains([CHAINS["logsumexp"]], [torch.float32], providers, ctx,
                      Ceilings(None, None), rounds=3)
    by = {r.provider: r for r in recs}
    assert len(calls) == 2 * 3 and by["wrong"].ms is None and by["wrong"].ms_spread is None
    for name in ("good", "torch-eager"):
        assert by[name].ms == 2.0 and by[name].ms_spread == pytest.approx(1.0)
    assert "widest spread between a provider's rounds: 100.0 %" in _rounds_note(
        {"rounds": 3}, recs)


def test_gate_checks_every_output_and_the_tf32_bound():
    ref = (torch.ones(4, dtype=torch.float64), torch.full((4,), 2.0, dtype=torch.float64))
    ok = gate_outputs((torch.ones(4), torch.full((4,), 2.0)), ref, torch.float32, 1e-3)
    assert ok.passed and ok.error == 0.0
    bad = gate_outputs((torch.ones(4), torch.full((4,), 2.1)), ref, torch.float32, 1e-3)
    assert not bad.passed and bad.reason.startswith("output 1: relative error")
    assert chain_threshold(CHAINS["rmsnorm-matmul"], torch.float32) == TF32_THRESHOLD
    assert chain_threshold(CHAINS["rmsnorm-matmul"], torch.bfloat16) == 2e-2
    assert chain_threshold(CHAINS["logsumexp"], torch.float32) == 1e-3
    with pytest.raises(ValueError, match="float16"):
        chain_threshold(CHAINS["logsumexp"], torch.float16)


def rec(chain, provider, ms, *, single=True, status="ok", dtype="float32", reason=""):
    return ChainRecord(chain=chain, dtype=dtype, sizes={"N": 8, "M": 16}, single_pass=single,
                       bound="memory", provider=provider,
                       group="neptune" if provider == "neptune" else "compiler",
                       status=status, ms=ms if status == "ok" else None, compile_ms=1500.0,
                       reason=reason, fraction_of_ceiling=0.5 if status == "ok" else None)


def test_summary_geomean_covers_single_pass_chains_only(tmp_path):
    records = [rec("a", "neptune", 1.0), rec("a", "torch-compile", 2.0),
               rec("b", "neptune", 2.0), rec("b", "torch-compile", 1.0),
               rec("c", "neptune", 1.0), rec("c", "torch-compile", 8.0),
               rec("t", "neptune", 4.0, single=False), rec("t", "torch-compile", 2.0,
                                                             single=False),
               rec("m", "neptune", None, status="error", reason="CodegenError: too big"),
               rec("m", "torch-compile", 1.0)]
    comps = compare_chains(records)
    assert [c.chain for c in comps] == ["a", "b", "c", "t", "m"]
    assert comps[0].vs_torch_compile == 2.0 and comps[4].vs_torch_compile is None
    doc = build_chain_document(date=datetime(2026, 1, 2, tzinfo=timezone.utc), mode="gpu",
                               env=environment(torch.device("cpu")),
                               config={"dtypes": ["float32"]},
                               providers=select_chain_providers(None),
                               ceilings=Ceilings(700.0, 4.0), records=records,
                               comparisons=comps)
    s = doc["summary"]["float32"]
    assert s["geomean_vs_torch_compile"] == pytest.approx(2.0)  # (2 * 0.5 * 8) ** (1/3)
    assert s["points"] == 3 and s["below_1x"] == ["b"]
    assert s["multi_pass_vs_torch_compile"] == {"t": 0.5}
    assert s["neptune_not_ok"] == {"m": "error: CodegenError: too big"}
    path = tmp_path / "results.json"
    write_json(doc, path)
    loaded = json.loads(path.read_text())
    assert list(loaded) == EXPECTED_TOP == list(CHAIN_TOP_KEYS)
    assert loaded["suite"] == "chains"
    assert list(loaded["records"][0]) == EXPECTED_RECORD == list(CHAIN_RECORD_KEYS)
    assert list(loaded["comparisons"][0]) == list(CHAIN_COMPARISON_KEYS)
    report = chain_markdown(doc, records, comps)
    assert "| a | float32 |" in report and "| 2.00x | — |" in report
    assert "geometric mean 2.00x vs torch.compile over 3 single-pass chain(s)" in report
    assert "multi-pass: t 0.50x" in report
    assert "| 50% / 50% | 1.50 / 1.50 |" in report
    assert "* m float32 neptune: error: CodegenError: too big" in report
    console = Console(record=True, width=250)
    render_chains(console, comps, records, smoke=False)
    text = console.export_text()
    assert "2.00x" in text and "error m float32 neptune: CodegenError: too big" in text
