"""The command line: --version, --help, the demo, and ``python -m neptune_fusion``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import neptune_fusion as nf
from neptune_fusion import cli


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"neptune-fusion {nf.__version__}"


def test_help_lists_the_demo(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--help"])
    assert info.value.code == 0
    assert "demo" in capsys.readouterr().out


def test_no_command_prints_help_and_fails(capsys):
    assert cli.main([]) == 2
    assert "usage: neptune-fusion" in capsys.readouterr().out


def test_demo(capsys):
    assert cli.main(["demo", "--n", "5", "--m", "9", "--d", "4", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "m[i] = max(s[i, j], j)" in out
    assert "o[i, e] = sum(exp(s[i, j] - m[i]) * v[j, e], j) / l[i]" in out
    assert "N=5 M=9 D=4" in out
    err = float(out.split("NumPy attention:")[1].split()[0])
    assert err <= cli.DEMO_TOLERANCE
    assert "OK" in out


def test_demo_fails_when_the_check_fails(capsys, monkeypatch):
    wrong = lambda q, k, v, scale: np.zeros((q.shape[0], v.shape[1]))
    monkeypatch.setattr(cli, "numpy_attention", wrong)
    assert cli.main(["demo", "--n", "2", "--m", "3", "--d", "2"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_demo_rejects_bad_sizes(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["demo", "--d", "0"])
    assert info.value.code == 2
    assert "at least 1" in capsys.readouterr().err


def test_python_dash_m():
    src = str(Path(nf.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [src] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    run = subprocess.run([sys.executable, "-m", "neptune_fusion", "--version"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"neptune-fusion {nf.__version__}"


def test_demo_compiles_and_runs_the_kernel(capsys):
    assert cli.main(["demo", "--n", "7", "--m", "21", "--d", "8", "--source"]) == 0
    out = capsys.readouterr().out
    assert "FusionPlan:" in out and "o_sum' = o_sum*exp(m - m')" in out
    assert "# interior tiles, no masks" in out and "# boundary tiles, masked" in out
    assert "@triton.jit" in out  # --source prints the kernel
    err = float(out.split("kernel vs the float64 reference:")[1].split()[0])
    assert err <= cli.KERNEL_TOLERANCE
    assert "OK: kernel within" in out


def test_bench_is_forwarded_and_refuses_without_a_gpu(capsys):
    import pytest
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the no-GPU refusal does not apply")
    from neptune_fusion.cli import main
    assert main(["bench", "--ops", "PF-Global"]) == 2
    assert "--cpu-smoke" in capsys.readouterr().out


def test_cache_list_and_clear(tmp_path, capsys):
    import torch

    from neptune_fusion import ops
    [o], ins = ops.definition("PF-Causal", "float32", 32, 2, 2)
    nf.compile(o, ins, cache=str(tmp_path))(*[torch.randn(1, 2, 30, 32) for _ in range(3)])
    assert cli.main(["cache", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1 tuned schedule(s)" in out and "N<=32" in out and "(model)" in out
    assert cli.main(["cache", "--dir", str(tmp_path), "--clear"]) == 0
    out = capsys.readouterr().out
    assert "removed 1 tuned schedule(s) and" in out and "stored kernel record(s)" in out
    assert cli.main(["cache", "--dir", str(tmp_path)]) == 0
    assert "0 tuned schedule(s)" in capsys.readouterr().out
