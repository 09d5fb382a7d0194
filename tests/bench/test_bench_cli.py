"""The command line: the CPU smoke run end to end, the no-GPU refusal, bad arguments, plots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from neptune_fusion.bench import main
from neptune_fusion.bench.plots import have_matplotlib, plot_operators
from neptune_fusion.bench.record import Record

SRC = Path(__file__).resolve().parents[2] / "src"
SMOKE_OPS = "PF-Causal,PF-GQA,PF-SoftCap,DC-GQA"
SMOKE_PROVIDERS = "sdpa-flash,sdpa-efficient,triton-fa2,neptune"


def test_cpu_smoke_runs_end_to_end(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", COLUMNS="160",
               PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "neptune_fusion.bench", "--cpu-smoke", "--ops", SMOKE_OPS,
           "--providers", SMOKE_PROVIDERS, "--seqs", "64", "--out", str(tmp_path),
           "--no-plots"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["mode"] == "cpu-smoke"
    assert doc["ceilings"]["matmul_tflops"] is None
    assert doc["config"]["rounds"] == 1    # the smoke run times once (its times mean nothing)
    status = {(r["op"], r["provider"]): r["status"] for r in doc["records"]}
    assert len(status) == 4 * 4
    assert status["PF-Causal", "triton-fa2"] == "ok"
    assert status["PF-GQA", "triton-fa2"] == "ok"
    assert status["PF-GQA", "sdpa-flash"] == "ok"
    assert status["PF-SoftCap", "sdpa-flash"] == "unsupported"
    assert status["DC-GQA", "triton-fa2"] == "unsupported"
    assert all(r["status"] in ("ok", "unsupported") for r in doc["records"])
    # the note names the kernel the auto-scheduler chose for each point
    notes = {r["op"]: r["note"] for r in doc["records"] if r["provider"] == "neptune"}
    assert all("schedule: rolling" in n or "schedule: split" in n for n in notes.values()), notes
    report = (tmp_path / "report.md").read_text()
    assert "CPU smoke run" in report and "| PF-GQA | 64 | triton-fa2 | ok |" in report
    # No speed claims on the terminal.
    assert "TF/s" not in proc.stdout and "TB/s" not in proc.stdout and " ms" not in proc.stdout
    assert "CPU smoke run" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_without_gpu_and_without_smoke_it_refuses(capsys):
    assert main(["--ops", "PF-Global"]) == 2
    out = capsys.readouterr().out
    assert "No CUDA GPU" in out and "--cpu-smoke" in out


@pytest.mark.parametrize("args, text", [
    (["--ops", "PF-Nope"], "unknown operator"),
    (["--providers", "cublas"], "unknown provider"),
])
def test_bad_names_are_usage_errors(args, text, capsys):
    assert main(["--cpu-smoke", *args]) == 2
    assert text in capsys.readouterr().out


@pytest.mark.parametrize("args, text", [
    (["--suite", "serving", "--rounds", "2"], "--rounds is an option of the attention"),
    (["--backward", "--rounds", "2"], "--rounds is an option of the attention"),
    (["--rounds", "0"], "--rounds must be at least 1, not 0"),
])
def test_rounds_outside_the_attention_forward_are_usage_errors(args, text, capsys):
    assert main(["--cpu-smoke", *args]) == 2
    assert text in capsys.readouterr().out


def test_bad_seqs_are_rejected_by_the_parser():
    with pytest.raises(SystemExit):
        main(["--cpu-smoke", "--seqs", "64,abc"])


@pytest.mark.skipif(not have_matplotlib(), reason="matplotlib is optional")
def test_plots_one_png_per_operator(tmp_path):
    records = [Record("PF-Causal", "PF", s, p, "compiler", "ok", ms=s / 1000, throughput=1.0,
                      unit="TFLOP/s") for s in (1024, 4096) for p in ("flex", "neptune")]
    records.append(Record("DC-GQA", "DC", 1024, "flex", "compiler", "wrong"))
    paths, note = plot_operators(records, {"matmul_tflops": 700.0, "copy_tbps": 4.0},
                                 tmp_path, smoke=False)
    assert [p.name for p in paths] == ["PF-Causal.png"] and note == ""
    assert paths[0].read_bytes()[:4] == b"\x89PNG"
