"""The harness is an extra: the core package loads none of it, nor its plotting or table
libraries, and ``pip install neptune-fusion[bench]`` brings what it needs beyond the core."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS_ONLY = ("rich.table", "matplotlib", "neptune_fusion.bench")


@pytest.mark.parametrize("module", ["neptune_fusion", "neptune_fusion.ops"])
def test_core_imports_no_harness(module):
    code = (f"import sys, {module}\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'\n"
            f"             or m.startswith({HARNESS_ONLY!r})))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                               if p]))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", f"import {module} loaded {run.stdout.strip()}"


def test_extras():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    # one test extra (no 'dev' twin); 'transformers': docs/transformers.md
    assert set(extras) == {"test", "bench", "transformers"}
    assert not any(d.startswith("transformers") for d in project["dependencies"])
    assert any(d.startswith("matplotlib") for d in extras["bench"])
    core = project["dependencies"]
    assert not any(d.startswith("matplotlib") for d in core)
    assert any(d.startswith("rich") for d in core)     # the tuner's progress bar, the CLI
