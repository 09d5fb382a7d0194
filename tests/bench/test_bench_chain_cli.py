"""``neptune-fusion bench --suite chains``: the CPU smoke run end to end, usage errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neptune_fusion.bench import main

SRC = Path(__file__).resolve().parents[2] / "src"
# torch-compile is left out: Inductor's C++ build on CPU takes ~40 s per chain.
SMOKE = ["--suite", "chains", "--cpu-smoke", "--ops", "logsumexp,rmsnorm-matmul,tanh-sum",
         "--providers", "neptune,torch-eager"]


def test_chain_smoke_runs_end_to_end(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", COLUMNS="160",
               PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "neptune_fusion.bench", *SMOKE, "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["suite"] == "chains" and doc["mode"] == "cpu-smoke"
    assert doc["config"]["dtypes"] == ["float32", "bfloat16"]  # both by default
    assert doc["config"]["timer"] == "bench"
    status = {(r["chain"], r["dtype"], r["provider"]): r for r in doc["records"]}
    assert len(status) == 3 * 2 * 2
    for dtype in ("float32", "bfloat16"):
        for chain in ("logsumexp", "rmsnorm-matmul"):
            for provider in ("neptune", "torch-eager"):
                r = status[chain, dtype, provider]
                assert r["status"] == "ok", r
                assert 0 <= r["error"] <= r["threshold"] and r["compile_ms"] > 0
        # tanh-sum cannot fuse: until multi-pass plans compile it is an error record
        # with the exception's first line; either way the run went on.
        tanh = status["tanh-sum", dtype, "neptune"]
        assert tanh["single_pass"] is False
        assert tanh["status"] == "ok" or (tanh["status"] == "error" and "\n" not in
                                          tanh["reason"] and "Error" in tanh["reason"])
        assert status["tanh-sum", dtype, "torch-eager"]["status"] == "ok"
    report = (tmp_path / "report.md").read_text()
    assert "CPU smoke run" in report and "| logsumexp | float32 | 5x33 | 1 |" in report
    assert "| tanh-sum | bfloat16 | 5x33 | several |" in report
    assert "* times: median of triton's do_bench over eager calls" in report
    # No speed claims on the terminal.
    assert " ms" not in proc.stdout and "TB/s" not in proc.stdout
    assert "CPU smoke run" in proc.stdout


@pytest.mark.parametrize("args, text", [
    (["--ops", "nope"], "unknown chain(s) nope"),
    (["--providers", "flex"], "unknown chain provider(s) flex"),
    (["--dtype", "float16"], "the chain suite takes --dtype float32 or bfloat16"),
    (["--seqs", "64"], "--seqs is for the attention suite"),
    (["--timer", "graph"], "--timer graph needs a GPU"),
])
def test_chain_usage_errors(args, text, capsys):
    assert main(["--cpu-smoke", "--suite", "chains", *args]) == 2
    assert text in " ".join(capsys.readouterr().out.split())


def test_attention_suite_refuses_float32(capsys):
    assert main(["--cpu-smoke", "--dtype", "float32"]) == 2
    assert "the attention suite takes --dtype bfloat16 or float16" in capsys.readouterr().out


@pytest.mark.parametrize("suite", [["--suite", "serving"], ["--backward"]])
def test_timer_is_an_option_of_the_attention_forward_and_the_chain_suite(suite, capsys):
    assert main(["--cpu-smoke", *suite, "--timer", "bench"]) == 2
    assert "--timer is an option of the attention suite's forward and of the chain suite" \
        in " ".join(capsys.readouterr().out.split())


def test_attention_graph_timer_needs_a_gpu_and_reaches_the_session(capsys, monkeypatch):
    assert main(["--cpu-smoke", "--timer", "graph"]) == 2
    assert "--timer graph needs a GPU" in " ".join(capsys.readouterr().out.split())
    import torch

    from neptune_fusion.bench import session as session_mod
    from neptune_fusion.bench.workloads import select_operators
    monkeypatch.setattr(session_mod, "graph_timer", lambda rep_ms: ("graph", rep_ms))
    kw = dict(ops=select_operators(["DC-GQA"]), seqs=(64,), providers=(),
              dtype=torch.float16, device=torch.device("cpu"), rep_ms=7)
    assert session_mod.Session(smoke=False, timer_kind="graph", **kw).timer() == ("graph", 7)
    assert session_mod.Session(smoke=False, **kw).config()["timer"] == "bench"
    assert session_mod.Session(smoke=True, timer_kind="graph", **kw).timer() != ("graph", 7)
