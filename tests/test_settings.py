"""One place for settings: every environment variable is read in ``settings.py`` and
documented in ``docs/settings.md``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from neptune_fusion import settings

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "neptune_fusion"


def _reads_environment(tree: ast.AST) -> list[int]:
    """Lines that touch ``os.environ`` / ``os.getenv`` / ``os.putenv``."""
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv", "putenv")]


def test_no_other_module_reads_the_environment():
    offenders = {}
    for path in sorted(PKG.rglob("*.py")):
        if path.name == "settings.py" and path.parent == PKG:
            continue
        lines = _reads_environment(ast.parse(path.read_text()))
        if lines:
            offenders[str(path.relative_to(PKG))] = lines
    assert not offenders, f"environment read outside settings.py: {offenders}"


def test_docs_list_every_setting():
    doc = (ROOT / "docs" / "settings.md").read_text()
    assert settings.table_markdown() in doc, \
        "docs/settings.md is out of date: paste settings.table_markdown() into it"


def test_flags_read_the_environment_when_called(monkeypatch, tmp_path):
    monkeypatch.setenv("NEPTUNE_FUSION_LOG", "1")
    assert settings.log_enabled()
    assert not settings.log_enabled(False)
    monkeypatch.setenv("NEPTUNE_FUSION_LOG", "no")
    assert not settings.log_enabled()
    monkeypatch.setenv("NEPTUNE_FUSION_DIRECT_LAUNCH", "0")
    assert not settings.direct_launch()
    monkeypatch.delenv("NEPTUNE_FUSION_DIRECT_LAUNCH")
    assert settings.direct_launch()
    monkeypatch.setenv("NEPTUNE_FUSION_DUMP", "plan, source")
    assert settings.dump_wanted("source") and not settings.dump_wanted("lower")
    monkeypatch.setenv("NEPTUNE_FUSION_CACHE_DIR", str(tmp_path))
    assert settings.cache_root() == tmp_path


def test_dump_prints_only_wanted_stages(monkeypatch, capsys):
    monkeypatch.setenv("NEPTUNE_FUSION_DUMP", "plan")
    settings.dump("lower", lambda: pytest.fail("an unwanted dump must not be rendered"))
    settings.dump("plan", lambda: "the plan")
    assert "after plan ---\nthe plan" in capsys.readouterr().err


def test_interpret_override_restores(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with settings.triton_interpret_as(True):
        assert settings.triton_interpret()
    assert not settings.triton_interpret()


def test_an_unlisted_variable_is_a_programming_error():
    with pytest.raises(KeyError, match="not in neptune_fusion.settings.SETTINGS"):
        settings._raw("NEPTUNE_FUSION_NOT_A_SETTING")
