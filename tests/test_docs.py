"""The documentation's examples run, and the README keeps exactly two set-up commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", path.read_text(), flags=re.S | re.M)


@pytest.mark.parametrize("doc", ["README.md", "docs/language.md", "docs/serving.md"])
def test_python_examples_run(doc):
    code = blocks(ROOT / doc, "python")
    assert code, f"{doc} has no python example"
    namespace: dict = {}
    for block in code:  # in order, sharing one namespace, as a reader would run them
        exec(compile(block, doc, "exec"), namespace)


def test_language_doc_shows_the_printed_program(capsys):
    namespace: dict = {}
    code = blocks(ROOT / "docs/language.md", "python")
    for block in code[:4]:
        exec(compile(block, "language.md", "exec"), namespace)
    capsys.readouterr()
    printed = namespace["nf"].show(namespace["o"])
    shown = [ln[2:] for ln in code[4].splitlines() if ln.startswith("# ")]
    assert printed.splitlines() == shown


def test_readme_has_exactly_two_setup_commands():
    cmds = blocks(ROOT / "README.md", "bash")
    assert len(cmds) == 2
    for cmd in cmds:
        assert cmd.count("\n") == 1  # one copy-pasteable line each
        assert cmd.startswith("python -m venv .venv && . .venv/bin/activate && "
                              "pip install torch==2.13.0 && pip install -e ")
    assert cmds[0].strip().endswith("neptune-fusion demo")
    assert re.search(r"&& pytest( -[-a-z0-9 ]*)?$", cmds[1].strip())



def test_ci_runs_the_readme_test_command():
    # .ci/run greps this pattern out of the README and runs what it finds
    ci = (ROOT / ".ci" / "run").read_text()
    pattern = re.search(r"grep -E '(.*?)' README.md", ci).group(1)
    found = [ln for ln in (ROOT / "README.md").read_text().splitlines()
             if re.search(pattern, ln)]
    assert found == [blocks(ROOT / "README.md", "bash")[1].strip()]
