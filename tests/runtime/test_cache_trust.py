"""The kernel cache never runs code someone else could have written (issue 15, finding 6).

Each test plays the attacker of docs/cache.md -- another user who can write where the
cache lives, or a file swapped in at the wrong moment -- and asserts that the planted code
did not run (it would write a marker file) and that the kernel still computes the float64
reference. Where an earlier version kept kernel files (``<cache>/kernels/NAME_HASH.py``,
imported at the first call), the tests plant there too.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import py_compile
import stat
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion import cli
from neptune_fusion.errors import CodegenError
from neptune_fusion.frontend.attention import AttentionCache, attention
from neptune_fusion.runtime import disk_cache
from neptune_fusion.runtime.loader import load_kernel_module

EXPLICIT = {"block_m": 16, "block_n": 16}


def definition():
    """Plain attention over (N, D) rows: ``([o], [q, k, v])``."""
    N, M, D = nf.sizes("N M D")
    q, k, v = (nf.placeholder(s, name=n) for s, n in (((N, D), "q"), ((M, D), "k"),
                                                     ((M, D), "v")))
    c, j = nf.reduce_axis(D, "c"), nf.reduce_axis(M, "j")
    s = nf.compute((N, M), lambda i, jj: nf.sum(q[i, c] * k[jj, c], c) * 0.25, name="s")
    m = nf.compute((N,), lambda i: nf.max(s[i, j], j), name="m")
    l = nf.compute((N,), lambda i: nf.sum(nf.exp(s[i, j] - m[i]), j), name="l")  # noqa: E741
    o = nf.compute((N, 16), lambda i, e: nf.sum(nf.exp(s[i, j] - m[i]) * v[j, e], j) / l[i],
                   name="o")
    return o, [q, k, v]


def run_checked(kernel, ins, rng) -> None:
    """Run ``kernel`` on fresh random data and compare with the float64 reference."""
    feeds = {"q": rng.standard_normal((5, 16)), "k": rng.standard_normal((19, 16)),
             "v": rng.standard_normal((19, 16))}
    want = nf.evaluate(kernel.outputs[0], feeds)
    got = kernel(*[torch.tensor(feeds[p.name], dtype=torch.float32) for p in ins])
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-4, atol=1e-5)


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    """The cache root for this test (also what $NEPTUNE_FUSION_CACHE_DIR names)."""
    path = tmp_path / "cache"
    monkeypatch.setenv("NEPTUNE_FUSION_CACHE_DIR", str(path))
    return path


@pytest.fixture
def mark(tmp_path) -> Path:
    return tmp_path / "planted-code-ran"


def payload(mark: Path) -> str:
    return f"\nimport pathlib as _p\n_p.Path({str(mark)!r}).write_text('ran')\n"


def old_kernel_file(root: Path, kernel) -> Path:
    """Where an earlier version kept (and imported) the kernel's source file."""
    spec = kernel.specs[0]
    digest = hashlib.sha256(spec.source.encode()).hexdigest()[:16]
    return root / "kernels" / f"{spec.name}_{digest}.py"


def spec_files(root: Path) -> list[Path]:
    """The stored kernel-spec records under ``root``."""
    return [p for p in sorted((root / "specs").glob("*.json"))
            if "specs" in json.loads(p.read_text())["record"]]


def tamper(path: Path, change) -> None:
    """Apply ``change`` to the first kernel spec of a record and recompute its checksum,
    as anyone able to write the file can."""
    doc = json.loads(path.read_text())
    change(doc["record"]["specs"][0])
    doc["checksum"] = disk_cache._checksum(doc["key"], doc["record"])
    path.write_text(json.dumps(doc))


def files_under(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


# -- a stored spec's source ---------------------------------------------------------------


def test_spec_planted_with_a_recomputed_checksum_does_not_run(root, mark, rng):
    """A spec file another user could write (mode 0666) with code appended and the
    checksum recomputed: refused, rebuilt, the planted code never runs."""
    o, ins = definition()
    nf.compile(o, ins, cache=str(root), **EXPLICIT)
    [path] = spec_files(root)
    tamper(path, lambda spec: spec.update(source=spec["source"] + payload(mark)))
    path.chmod(0o666)
    kernel = nf.compile(o, ins, cache=str(root), **EXPLICIT)
    run_checked(kernel, ins, rng)
    assert not mark.exists()
    assert not kernel.from_cache  # rebuilt from the definition


@pytest.mark.parametrize("how", ["world-writable", "foreign owner"])
def test_unsafe_cache_directory_is_refused(root, mark, rng, monkeypatch, how):
    """A cache root another user owns or can write: a warning, then no disk cache at all
    (nothing read, nothing written)."""
    o, ins = definition()
    nf.compile(o, ins, cache=str(root), **EXPLICIT)
    [path] = spec_files(root)
    tamper(path, lambda spec: spec.update(source=spec["source"] + payload(mark)))
    if how == "world-writable":
        root.chmod(0o777)
    else:
        monkeypatch.setattr(disk_cache, "_euid", lambda: os.geteuid() + 1)
    before = files_under(root)
    with pytest.warns(disk_cache.UnsafeCacheWarning, match="does not use the cache"):
        kernel = nf.compile(o, ins, cache=str(root), **EXPLICIT)
        run_checked(kernel, ins, rng)
        auto = nf.compile(o, ins, cache=str(root))  # the auto-scheduler's store too
        run_checked(auto, ins, rng)
    assert not mark.exists() and not kernel.from_cache
    assert files_under(root) == before


def test_cache_directories_are_created_private(tmp_path):
    old = os.umask(0o022)
    try:
        store = disk_cache.DiskCache(tmp_path / "new" / "cache")
        assert store.put({"k": 1}, {"v": 2}) is not None
    finally:
        os.umask(old)
    for d in (store.root, store.directory):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    assert stat.S_IMODE(store.path({"k": 1}).stat().st_mode) == 0o600


def test_group_writable_record_file_is_refused(tmp_path):
    store = disk_cache.DiskCache(tmp_path)
    path = store.put({"k": 1}, {"v": 2})
    path.chmod(0o620)
    assert store.get({"k": 1}) is None
    assert store.last_miss.startswith("refused: writable by group or others")


# -- kernel files: nothing on disk is imported ---------------------------------------------


def test_planted_bytecode_does_not_run(root, mark, rng):
    """An unchecked-hash ``.pyc`` next to a matching kernel source file: not run."""
    o, ins = definition()
    kernel = nf.compile(o, ins, cache=str(root), **EXPLICIT)
    src = old_kernel_file(root, kernel)
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(kernel.specs[0].source)
    evil = src.with_name("evil.py")
    evil.write_text(kernel.specs[0].source + payload(mark))
    py_compile.compile(str(evil), cfile=importlib.util.cache_from_source(str(src)),
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    run_checked(kernel, ins, rng)
    assert not mark.exists()


def test_file_swapped_between_build_and_first_call_does_not_run(root, mark, rng):
    o, ins = definition()
    kernel = nf.compile(o, ins, cache=str(root), **EXPLICIT)   # built, not yet called
    path = old_kernel_file(root, kernel)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(kernel.specs[0].source + payload(mark))
    run_checked(kernel, ins, rng)
    assert not mark.exists()


def test_non_utf8_kernel_file_is_harmless(root, rng):
    o, ins = definition()
    path = old_kernel_file(root, nf.compile(o, ins, cache=False, **EXPLICIT))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\xff\xfe\x00 not UTF-8 \x80")
    run_checked(nf.compile(o, ins, cache=str(root), **EXPLICIT), ins, rng)


def test_source_is_compiled_from_memory(tmp_path):
    """The module is compiled from the given text; Triton's ``inspect`` look-ups get that
    text from linecache, whatever a file of a similar name holds."""
    import inspect
    source = "def nf_probe(x):\n    return x + 1\n"
    module = load_kernel_module(source, "nf_probe", interpret=True)
    assert module.nf_probe(1) == 2
    assert inspect.getsource(module.nf_probe) == source
    assert module.nf_probe.__code__.co_filename.startswith("<neptune-fusion kernel nf_probe_")


# -- no shared fallback, nothing written without a store -----------------------------------


def test_unwritable_cache_has_no_shared_fallback(tmp_path, monkeypatch, rng):
    """An unusable cache directory means no disk cache: nothing goes to a fixed folder of
    the system temporary directory (where another user could have planted files)."""
    o, ins = definition()
    systmp = tmp_path / "systmp"
    systmp.mkdir()
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("NEPTUNE_FUSION_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(systmp))
    for kernel in (nf.compile(o, ins, **EXPLICIT), nf.compile(o, ins)):
        run_checked(kernel, ins, rng)
    assert files_under(systmp) == set()


def test_store_false_writes_nothing(tmp_path, monkeypatch, rng):
    root = tmp_path / "cache"
    monkeypatch.setenv("NEPTUNE_FUSION_CACHE_DIR", str(root))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "systmp"))
    (tmp_path / "systmp").mkdir()
    q, k, v = (torch.randn(1, 2, 21, 16, generator=torch.Generator().manual_seed(s))
               for s in range(3))
    out = attention(q, k, v, cache=AttentionCache(store=False))
    want = torch.softmax(q.double() @ k.double().transpose(-1, -2) * 0.25, -1) @ v.double()
    assert float((out.double() - want).abs().max()) < 1e-4
    o, ins = definition()
    run_checked(nf.compile(o, ins, cache=False), ins, rng)
    assert not root.exists()
    assert files_under(tmp_path / "systmp") == set()


# -- names --------------------------------------------------------------------------------


def test_spec_name_with_a_path_is_rebuilt(root, tmp_path, rng):
    """A stored spec named ``../../x``: malformed, so rebuilt; nothing is written outside
    the cache directory."""
    o, ins = definition()
    nf.compile(o, ins, cache=str(root), **EXPLICIT)
    [path] = spec_files(root)
    tamper(path, lambda spec: spec.update(name="../../x"))
    before = files_under(tmp_path)
    kernel = nf.compile(o, ins, cache=str(root), **EXPLICIT)
    run_checked(kernel, ins, rng)
    assert not kernel.from_cache
    assert {f for f in files_under(tmp_path) - before if not f.startswith("cache")} == set()


def test_loader_refuses_a_name_that_is_not_an_identifier():
    with pytest.raises(CodegenError, match="not a Python identifier"):
        load_kernel_module("x = 1\n", "../../x", interpret=True)


# -- corrupt files and clearing -------------------------------------------------------------


def _stale_checksum(path: Path) -> None:
    doc = json.loads(path.read_text())
    doc["record"]["specs"][0]["block_m"] = 32
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("damage", [
    lambda p: p.write_bytes(b"\xff\xfe\x80 not UTF-8"),
    lambda p: p.write_bytes(p.read_bytes()[:40]),
    _stale_checksum,
], ids=["not-utf8", "truncated", "checksum"])
def test_corrupt_spec_record_is_rebuilt(root, rng, damage):
    o, ins = definition()
    nf.compile(o, ins, cache=str(root), **EXPLICIT)
    [path] = spec_files(root)
    damage(path)
    kernel = nf.compile(o, ins, cache=str(root), **EXPLICIT)
    run_checked(kernel, ins, rng)
    assert not kernel.from_cache
    again = nf.compile(o, ins, cache=str(root), **EXPLICIT)   # rewritten: warm again
    assert again.from_cache
    run_checked(again, ins, rng)


def test_cache_clear_removes_everything_it_wrote(root, rng, capsys):
    o, ins = definition()
    run_checked(nf.compile(o, ins, cache=str(root)), ins, rng)         # schedules, specs
    old = root / "kernels"                              # what earlier versions wrote
    (old / "__pycache__").mkdir(parents=True)
    (old / "attention_0123456789abcdef.py").write_text("x = 1\n")
    (old / "__pycache__" / "attention_0123456789abcdef.cpython-311.pyc").write_bytes(b"")
    (root / "specs" / ".tmp-leftover.json").write_text("{")
    assert cli.main(["cache", "--dir", str(root), "--clear"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "removed 1 tuned schedule(s) and" in out
    assert "2 kernel file(s) of an earlier version" in out
    assert files_under(root) == set()
