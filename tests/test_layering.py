"""Layering: no import circle among the package's modules outside ``ir/``.

Every module is parsed with :mod:`ast`; an edge ``a -> b`` is any import of ``b`` in ``a``,
at module level or inside a function (a deferred import is still a dependency), with
relative imports resolved. ``from pkg import name`` is an edge to ``pkg.name`` when that
is a module, else to ``pkg``. Modules of ``neptune_fusion.ir`` may import each other
(one small IR, defined together); the rest of the package must form a DAG.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src"
PKG = "neptune_fusion"
IR = PKG + ".ir"

# Edges left out on purpose, each with the reason (and a test below that it still exists,
# so the list cannot rot).
SHIMS: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / PKG).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """``module -> modules of the package it imports`` (see module docstring)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                for a in node.names:
                    full = f"{base}.{a.name}"
                    targets.append(full if full in mods else base)
            for t in targets:
                # `import a.b.c` of a package module: the longest known prefix
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def _in_ir(m: str) -> bool:
    return m == IR or m.startswith(IR + ".")


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as ``[a, b, ..., a]``, or None (depth-first search)."""
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycle_outside_ir():
    graph = import_graph()
    outside = {m: {n for n in deps if not (_in_ir(m) and _in_ir(n))
                   and (m, n) not in SHIMS}
               for m, deps in graph.items()}
    cycle = find_cycle(outside)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_shims_still_needed():
    graph = import_graph()
    for (a, b), why in SHIMS.items():
        assert b in graph[a], f"{a} no longer imports {b}; remove it from SHIMS ({why})"


def test_cycles_are_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
