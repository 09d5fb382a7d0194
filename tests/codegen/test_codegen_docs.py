"""docs/codegen.md's examples run, and its outline is the one the code prints."""

from __future__ import annotations

import re
from pathlib import Path

from neptune_fusion import ops
from neptune_fusion.codegen.outline import outline
from neptune_fusion.fusion.plan import plan
from neptune_fusion.runtime.pipeline import build_programs
from neptune_fusion.schedule.schedule import Schedule

DOC = Path(__file__).resolve().parents[2] / "docs" / "codegen.md"


def test_python_examples_run(capsys):
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
    assert blocks
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {})
    assert "def nf_o(" in capsys.readouterr().out


def test_outline_in_the_doc_is_current():
    [o], ins = ops.definition("PF-Window", "float16", 128)
    lines = [ln for ln in outline(*build_programs(plan(o), ins, Schedule(), "nf_o"))
             if not ln.startswith(("    ", "rule:"))]
    text = DOC.read_text()
    for line in lines:
        assert line in text, line
