"""``neptune-fusion bench --backward``: the CPU smoke run end to end, the float64 autograd
reference, the gradient gate (FlexAttention's error as a bound), the comparisons and the
GPU-mode report, usage errors."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch
from rich.console import Console

from neptune_fusion.bench import backward_session, main
from neptune_fusion.bench import reference as reference_module
from neptune_fusion.bench.backward import (
    Inputs,
    bound,
    check_gradients,
    gate_kv_heads,
    make_grad_inputs,
    reference_gradients,
    smoke_op,
)
from neptune_fusion.bench.backward_session import BackwardSession, compare, markdown, summary
from neptune_fusion.bench.providers.backward import Step
from neptune_fusion.bench.providers.base import RunContext
from neptune_fusion.bench.results import environment
from neptune_fusion.bench.timing import Ceilings, wall_timer
from neptune_fusion.ops import OPERATORS

SRC = Path(__file__).resolve().parents[2] / "src"


def test_backward_smoke_runs_end_to_end(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", COLUMNS="160",
               PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "neptune_fusion.bench", "--backward", "--cpu-smoke",
           "--ops", "PF-GQA,PF-Window", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["suite"] == "backward" and doc["mode"] == "cpu-smoke"
    got = {(r["op"], r["provider"]): r for r in doc["records"]}
    assert sorted(got) == sorted((o, p) for o in ("PF-GQA", "PF-Window")
                                 for p in ("flex", "sdpa", "neptune"))
    for op in ("PF-GQA", "PF-Window"):
        r = got[op, "neptune"]
        assert r["status"] == "ok", r
        assert all(0 < r[k] < 2e-3 for k in ("out_error", "dq_error", "dk_error", "dv_error"))
        assert got[op, "flex"]["status"] == "unsupported"   # no flex backward on CPU
    assert got["PF-GQA", "sdpa"]["status"] == "ok"
    assert "backend FLASH_ATTENTION" in got["PF-GQA", "sdpa"]["note"]
    assert got["PF-Window", "sdpa"]["status"] == "unsupported"   # the soft-cap
    report = (tmp_path / "report.md").read_text()
    assert "CPU smoke run" in report and "| PF-GQA | 64 | unsupported | ok (" in report
    assert " ms" not in proc.stdout and "TFLOP" not in proc.stdout


@pytest.mark.parametrize("args, text", [
    (["--suite", "chains"], "--backward is a flag of the attention suite"),
    (["--ops", "DC-GQA"], "--backward takes prefill operators"),
    (["--ops", "PF-Nope"], "unknown operator"),
    (["--providers", "triton-fa2"], "unknown --backward provider(s) triton-fa2"),
    (["--dtype", "float32"], "--backward takes --dtype bfloat16 or float16"),
])
def test_backward_usage_errors(args, text, capsys):
    assert main(["--cpu-smoke", "--backward", *args]) == 2
    assert text in capsys.readouterr().out.replace("\n", " ")


def _dense(op, q, k, v):
    """Attention of the whole (B, H, S, D) tensors at once, plainly (no blocks)."""
    g = op.group
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ kk.transpose(-1, -2) * op.scale
    if op.softcap is not None:
        s = op.softcap * torch.tanh(s / op.softcap)
    i = torch.arange(q.shape[2])[:, None]
    j = torch.arange(k.shape[2])[None, :]
    keep = (j <= i) if op.causal else torch.ones_like(i * j, dtype=torch.bool)
    if op.window is not None:
        keep = keep & (i - j < op.window)
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ vv


def test_reference_gradients_are_autograd_of_the_attention(monkeypatch):
    """Row blocks and heads one at a time (blocks of 8 rows forced here) give the gradients
    of the whole attention; a subset of kv heads gives those heads' slices."""
    op = dataclasses.replace(OPERATORS["PF-Window"], q_heads=4, kv_heads=2, head_dim=16,
                             softcap=2.0, window=5)
    x = make_grad_inputs(op, 24, torch.float32, "cpu")
    monkeypatch.setattr(reference_module, "MAX_BLOCK_ELEMENTS", 8 * 24)
    ref = reference_gradients(op, x)
    q, k, v = (t.detach().double().requires_grad_() for t in x.leaves)
    o = _dense(op, q, k, v)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), x.dout.double())
    for got, want in ((ref.o, o), (ref.dq, dq), (ref.dk, dk), (ref.dv, dv)):
        torch.testing.assert_close(got, want.detach(), rtol=1e-10, atol=1e-12)
    part = reference_gradients(op, x, kv_heads=(1,))
    assert part.q_heads == (2, 3)
    torch.testing.assert_close(part.dk, dk[:, 1:], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(part.dq, dq[:, 2:], rtol=1e-10, atol=1e-12)


def test_large_points_gate_the_first_and_last_kv_heads():
    assert gate_kv_heads(OPERATORS["PF-GQA"], 4096) == tuple(range(8))
    assert gate_kv_heads(OPERATORS["PF-GQA"], 16384) == (0, 7)
    assert gate_kv_heads(OPERATORS["PF-Causal"], 16384) == (0, 31)


def test_bound_neptune_may_be_twice_as_far_as_flex():
    assert bound(torch.float16, None, "neptune") == 1e-2
    assert bound(torch.float16, 1e-3, "neptune") == 1e-2           # the tolerance floor
    assert bound(torch.float16, 8e-3, "neptune") == pytest.approx(1.6e-2)
    assert bound(torch.float16, 8e-3, "flex") == 1e-2               # baselines: tolerance
    assert bound(torch.bfloat16, None, "sdpa") == 5e-2


def _noisy(ref, eps: float, seed: int):
    """The reference's o, dq, dk, dv in float16, the gradients with relative noise ``eps``."""
    gen = torch.Generator().manual_seed(seed)
    out = [ref.o.to(torch.float16)]
    for t in (ref.dq, ref.dk, ref.dv):
        noise = torch.randn(t.shape, generator=gen, dtype=torch.float64)
        out.append((t + eps * noise * t.norm() / noise.norm()).to(torch.float16))
    return tuple(out)


def _fake(result) -> Step:
    return Step(lambda: result, lambda: result[0], "fake")


def _session_point(monkeypatch, provs: dict):
    op = smoke_op(OPERATORS["PF-Causal"])
    x = make_grad_inputs(op, 32, torch.float16, "cpu")
    ref = reference_gradients(op, x)
    wrong = reference_gradients(dataclasses.replace(op, causal=False), x)
    made = {"exact": _noisy(ref, 0.0, 0), "8e-3": _noisy(ref, 8e-3, 1),
            "1.2e-2": _noisy(ref, 1.2e-2, 2), "noncausal": _noisy(wrong, 0.0, 3)}
    monkeypatch.setattr(backward_session, "PREPARE", {
        name: (lambda op, x, ctx, r=made[kind]: _fake(r)) for name, kind in provs.items()})
    monkeypatch.setattr(backward_session, "make_grad_inputs", lambda *a: x)
    session = BackwardSession(ops=(OPERATORS["PF-Causal"],), seqs=(32,),
                              providers=tuple(provs), dtype=torch.float16,
                              device=torch.device("cpu"), smoke=False)
    ctx = RunContext(torch.device("cpu"), torch.float16, wall_timer(), False)
    return session, session._point(op, 32, ctx, Ceilings(500.0, 4.0))


def test_flex_error_widens_neptunes_bound_and_a_dropped_mask_is_wrong(monkeypatch):
    session, recs = _session_point(monkeypatch, {"flex": "8e-3", "sdpa": "noncausal",
                                                 "neptune": "1.2e-2"})
    got = {r["provider"]: r for r in recs}
    assert [r["provider"] for r in recs] == ["flex", "sdpa", "neptune"]
    assert got["flex"]["status"] == "ok" and got["flex"]["bound"] == 1e-2
    assert got["flex"]["error"] == pytest.approx(8e-3, rel=0.1)
    # 1.2e-2 > the float16 tolerance, but within twice FlexAttention's error
    assert got["neptune"]["status"] == "ok"
    assert got["neptune"]["bound"] == pytest.approx(2 * got["flex"]["error"])
    assert got["neptune"]["fwd_ms"] is not None and got["neptune"]["throughput"] > 0
    # the gradients of unmasked attention: a semantic mistake is far above any bound
    assert got["sdpa"]["status"] == "wrong" and got["sdpa"]["error"] > 0.1
    assert "exceeds" in got["sdpa"]["reason"]


def test_without_flex_the_tolerance_decides(monkeypatch):
    _, recs = _session_point(monkeypatch, {"neptune": "1.2e-2"})
    [r] = recs
    assert r["status"] == "wrong" and r["bound"] == 1e-2
    assert r["reason"][:2] in ("dq", "dk", "dv") and "exceeds 0.01" in r["reason"]


def test_comparisons_targets_and_gpu_report(monkeypatch):
    session, recs = _session_point(monkeypatch, {"flex": "8e-3", "sdpa": "exact",
                                                 "neptune": "exact"})
    for r, ms in zip(recs, (2.0, 1.2, 1.0)):     # times made up: the report's arithmetic
        r["ms"] = ms
    recs[1]["note"] = "backend CUDNN_ATTENTION, GQA via enable_gqa=True"
    comps = compare(recs)
    [c] = comps
    assert c["vs_flex"] == 2.0 and c["vs_sdpa"] == pytest.approx(1.2)
    assert c["sdpa_backend"] == "CUDNN_ATTENTION"
    assert c["speed_target"] and c["error_target"] and c["cudnn_target"]
    s = summary(comps)
    assert s["geomean_vs_flex"] == 2.0 and s["speed_target"] == {"met": 1, "of": 1}
    doc = {"suite": "backward", "date": datetime.now(timezone.utc).isoformat(),
           "mode": "gpu", "environment": environment(torch.device("cpu")),
           "config": session.config(), "ceilings": backward_session.ceilings_json(
               Ceilings(500.0, 4.0)), "records": recs, "comparisons": comps, "summary": s}
    text = markdown(doc)
    assert "| PF-Causal | 32 | 1.000 | 2.000 | 1.200 (CUDNN_ATTENTION) | 2.00 | 1.20 |" in text
    assert "targets met: >= 1.0x FlexAttention 1/1" in text
    json.dumps(doc, allow_nan=False)
    console = Console(record=True, width=160)
    backward_session._print(console, doc)
    shown = console.export_text()
    assert "forward + backward (GPU time, ms" in shown and "2.00" in shown


def test_cudnn_target_only_for_plain_causal_on_cudnn():
    recs = [dict(op="PF-GQA", seq=64, provider="sdpa", status="ok", ms=1.0, error=1e-3,
                 note="backend CUDNN_ATTENTION"),
            dict(op="PF-GQA", seq=64, provider="neptune", status="ok", ms=1.0, error=1e-3),
            dict(op="PF-Causal", seq=64, provider="sdpa", status="ok", ms=1.0, error=1e-3,
                 note="backend FLASH_ATTENTION"),
            dict(op="PF-Causal", seq=64, provider="neptune", status="ok", ms=1.0, error=1e-3)]
    assert [c["cudnn_target"] for c in compare(recs)] == [None, None]


def test_gate_names_a_missing_gradient_and_a_wrong_shape():
    op = smoke_op(OPERATORS["PF-Causal"])
    x: Inputs = make_grad_inputs(op, 16, torch.float16, "cpu")
    ref = reference_gradients(op, x)
    o, dq, dk, dv = _noisy(ref, 0.0, 0)
    assert "no dk" in check_gradients((o, dq, None, dv), ref, torch.float16, 1e-2).reason
    bad = check_gradients((o, dq, dk[:, :1], dv), ref, torch.float16, 1e-2)
    assert not bad.passed and "dk shape" in bad.reason
    assert check_gradients((o, dq, dk, dv), ref, torch.float16, 1e-2).passed
