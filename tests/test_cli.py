"""The command line: --version, --help, the demo, cache, bench, show, and
``python -m neptune_fusion``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
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
    assert "warps=" in out and "unreadable" not in out
    assert cli.main(["cache", "--dir", str(tmp_path), "--clear"]) == 0
    out = capsys.readouterr().out
    assert "removed 1 tuned schedule(s) and" in out and "stored kernel record(s)" in out
    assert cli.main(["cache", "--dir", str(tmp_path)]) == 0
    assert "0 tuned schedule(s)" in capsys.readouterr().out


# ------------------------------------------------------------------ bench (a subcommand)


def test_bench_help_is_the_harness_help(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: neptune-fusion bench")
    for flag in ("--ops", "--seqs", "--dtype", "--providers", "--out", "--cpu-smoke",
                 "--warmup-ms", "--rep-ms", "--no-plots"):
        assert flag in out


def test_bench_bad_values_are_usage_errors(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "--seqs", "64,abc"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: neptune-fusion bench" in err and "--seqs wants integers" in err


# ------------------------------------------------------------------ show

SOFTMAX = cli.SHOW_EXAMPLE  # the program of `show --help`, written to a file below


@pytest.fixture
def program(tmp_path):
    path = tmp_path / "prog.py"
    path.write_text(textwrap.dedent(SOFTMAX) + textwrap.dedent('''
        def attention():
            from neptune_fusion.frontend.examples import plain_attention
            return plain_attention("N", "M", 16)   # ([o], [q, k, v])

        def raises():
            raise RuntimeError("boom\\nsecond line")

        def not_a_program():
            return 3

        NOT_CALLABLE = 1
        '''))
    return path


def show(capsys, *args):
    code = cli.main(["show", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_show_plan_of_an_operator(capsys):
    code, out, err = show(capsys, "PF-Causal", "--plan")
    assert code == 0 and err == ""
    assert out.startswith("FusionPlan: 1 group(s) in 1 pass(es), every chain fused")
    assert "o_sum' = o_sum*exp(m - m')" in out and "proved: h(x + y) = h(x) + h(y)" in out
    code, default, _ = show(capsys, "pf-causal")  # any case; no view: the plan
    assert code == 0 and default == out


def test_show_schedule_is_the_auto_schedulers_pick(capsys):
    import torch
    code, out, err = show(capsys, "DC-GQA", "--schedule", "--shape", "S=2048", "--top", "3")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "# DC-GQA (float16) at B=1* M=2048 (* default)"
    picked = nf.Schedule.from_dict(json.loads("\n".join(
        ln for ln in lines if not ln.startswith("#"))))
    ranked = [ln for ln in lines if ln.startswith("#  ")]
    assert len(ranked) == 3 and all(ln.rstrip().endswith(("ms", "<- chosen")) for ln in ranked)
    if not torch.cuda.is_available():
        assert "chosen by the cost model alone" in out
        # what the auto-scheduler really does at the first call of these sizes (packed GQA)
        [o], ins = nf.ops.definition("DC-GQA", packed=True)
        q = torch.empty(128).expand(1, 8, 8, 128).half()
        k = torch.empty(128).half().expand(1, 8, 2048, 128)
        assert nf.compile(o, ins, cache=False).schedule_for(q, k, k) == picked


def test_show_source_prints_every_kernel_of_split_k(capsys, program):
    code, out, err = show(capsys, f"{program}:attention", "--source", "--shape", "N=77")
    assert code == 0 and err == ""
    assert "schedule: split " in out.splitlines()[0]
    assert "kernel 1 of 2" in out and "kernel 2 of 2" in out
    assert out.count('"""Generated by neptune-fusion') == 2   # a module per kernel


def test_show_program_from_a_file(capsys, program):
    code, out, err = show(capsys, f"{program}:softmax", "--ir", "--plan", "--schedule",
                          "--shape", "M=4096")
    assert code == 0 and err == ""
    assert "m[i] = max(x[i, j], j)" in out                      # --ir
    assert "s' = s*exp(m - m')" in out                          # --plan
    assert "# " + f"{program}:softmax at N=128* M=4096 (* default)" in out  # --schedule


@pytest.mark.parametrize("args, text", [
    (["PF-Nope"], "unknown operator 'PF-Nope'; choose from PF-Global, PF-Causal"),
    (["{dir}/missing.py:f"], "no such file: "),
    (["{prog}:nothing"], "defines no function 'nothing'"),
    (["{prog}:NOT_CALLABLE"], "defines no function 'NOT_CALLABLE'"),
    (["{prog}:raises"], "raises() raised RuntimeError: boom"),
    (["{prog}:not_a_program"], "must return nf tensors made by nf.compute"),
    (["{prog}"], "a program is named FILE.py:FUNCTION"),
    (["PF-Causal", "--shape", "S=abc"], "bad --shape 'S=abc': want NAME=POSITIVE_INT"),
    (["PF-Causal", "--shape", "S=0"], "bad --shape 'S=0'"),
    (["PF-Causal", "--shape", "Q=3"], "--shape Q: an operator's sizes are S, B, N, M"),
    (["PF-Causal", "--shape", "S=64,M=64"], "give S (the sequence length) or N and M"),
    (["{prog}:softmax", "--shape", "S=64"], "not a size of"),
    (["{prog}:softmax", "--dtype", "float16"], "--dtype applies to operators"),
    (["PF-Causal", "--dtype", "int8"], "--dtype 'int8': choose from float16"),
])
def test_show_errors_are_one_line(capsys, program, args, text):
    args = [a.format(dir=program.parent, prog=program) for a in args]
    code, out, err = show(capsys, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("neptune-fusion show: error: ")
    assert text in err
