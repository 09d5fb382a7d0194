"""The opt-in ``neptune-jit`` provider: the bench's plain PyTorch attention through the
torch.compile backend, gated against float64 like every provider."""

from __future__ import annotations

import json

from neptune_fusion.bench.cli import main
from neptune_fusion.bench.providers import OPT_IN, select_providers


def test_opt_in_only_when_named():
    assert "neptune-jit" in OPT_IN
    assert "neptune-jit" not in [p.name for p in select_providers(None)]
    assert [p.name for p in select_providers(["neptune-jit"])] == ["neptune-jit"]


def test_jit_provider_smoke(tmp_path):
    rc = main(["--cpu-smoke", "--ops", "PF-ALiBi", "--providers", "neptune,neptune-jit",
               "--no-plots", "--out", str(tmp_path)])
    assert rc == 0
    rows = json.loads((tmp_path / "results.json").read_text())
    got = [r for r in rows["records"] if r["provider"] == "neptune-jit"]
    assert got and all(r["status"] == "ok" for r in got), got


def test_chain_jit_provider_smoke(tmp_path):
    from neptune_fusion.bench.providers.chains import CHAIN_OPT_IN, select_chain_providers
    assert "neptune-jit" in CHAIN_OPT_IN
    assert "neptune-jit" not in [p.name for p in select_chain_providers(None)]
    rc = main(["--suite", "chains", "--cpu-smoke", "--ops", "logsumexp", "--providers",
               "neptune,neptune-jit,torch-compile", "--no-plots", "--out", str(tmp_path)])
    assert rc == 0
    report = (tmp_path / "report.md").read_text()
    assert "## Through the torch.compile backend (neptune-jit)" in report
    assert "| logsumexp | float32 |" in report.split("neptune-jit)")[1]
