"""``neptune-fusion bench --suite serving``: the CPU smoke run end to end, usage errors,
the scenarios and the bytes counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from neptune_fusion.bench import main
from neptune_fusion.bench.serving import (
    ServingPoint,
    bytes_read,
    make_inputs,
    points,
    reference,
    sequence_kv,
)

SRC = Path(__file__).resolve().parents[2] / "src"


def test_serving_smoke_runs_end_to_end(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", COLUMNS="160",
               PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "neptune_fusion.bench", "--suite", "serving", "--cpu-smoke",
           "--ops", "B8,32/8", "--dtype", "float16", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["suite"] == "serving" and doc["mode"] == "cpu-smoke"
    got = {(r["point"], r["provider"]): r for r in doc["records"]}
    names = ["B3-H4/2-ragged", "B3-H4/2-paged16", "B3-H4/2-paged64"]
    assert sorted({p for p, _ in got}) == sorted(names)
    for name in names:
        for provider in ("neptune", "neptune-split4", "flex", "sdpa-cudnn"):
            r = got[name, provider]
            assert r["status"] == "ok", r
            assert 0 <= r["error"] <= 1e-2
    report = (tmp_path / "report.md").read_text()
    assert "CPU smoke run" in report and "| B3-H4/2-paged64 | float16 | ok (" in report
    assert " ms" not in proc.stdout and "TB/s" not in proc.stdout


@pytest.mark.parametrize("args, text", [
    (["--ops", "B2"], "unknown serving scenario 'B2'"),
    (["--providers", "fa2"], "unknown serving provider(s) fa2"),
    (["--dtype", "float32"], "the serving suite takes --dtype bfloat16 or float16"),
    (["--seqs", "64"], "--seqs is for the attention suite"),
])
def test_serving_usage_errors(args, text, capsys):
    assert main(["--cpu-smoke", "--suite", "serving", *args]) == 2
    assert text in capsys.readouterr().out.replace("\n", " ")


def test_the_full_scenarios():
    """B in {1, 8, 64} x Hq/Hkv 32/8, 32/32 x ragged, pages of 16 and 64; lengths in
    [1024, 32768]; the filters intersect across facets."""
    pts = points(False)
    assert len(pts) == 18 and {p.batch for p in pts} == {1, 8, 64}
    assert {(p.q_heads, p.kv_heads) for p in pts} == {(32, 8), (32, 32)}
    assert {p.page for p in pts} == {0, 16, 64} and pts[0].lengths == (1024, 32768)
    assert [p.name for p in points(False, ["B64", "paged16", "32/8"])] == \
        ["B64-H32/8-paged16"]


def test_paged_inputs_hold_each_sequence_and_bytes_count_only_its_keys():
    p = ServingPoint(3, 4, 2, "paged16", head_dim=8, lengths=(1, 50))
    x = make_inputs(p, torch.float32, "cpu")
    assert x.k.shape[0] == sum(-(-n // 16) for n in x.lens)       # only the pages used
    used = sorted(int(t) for b, n in enumerate(x.lens) for t in x.block_table[b, :-(-n // 16)])
    assert used == list(range(x.k.shape[0])) and used != [int(t) for t in x.block_table[
        x.block_table < x.k.shape[0]]]                                  # shuffled
    assert sequence_kv(x, p, 1, x.k).shape == (2, x.lens[1], 8)
    assert bytes_read(x, p, torch.float32) == 2 * sum(x.lens) * 2 * 8 * 4 + 2 * 3 * 4 * 8 * 4 \
        + 3 * 4 + x.block_table.numel() * 4
    ref = reference(x, p)
    b = 1
    k, v = sequence_kv(x, p, b, x.k).double(), sequence_kv(x, p, b, x.v).double()
    s = x.q[b, 0].double() @ k[0].T / 8 ** 0.5
    torch.testing.assert_close(ref[b, 0], torch.softmax(s, -1) @ v[0])
