"""The on-disk schedule store: round trips, distrust of bad files, atomic concurrent writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from neptune_fusion.runtime import disk_cache as store_mod
from neptune_fusion.runtime.disk_cache import DiskCache
from neptune_fusion.settings import cache_root

KEY = {"op": "attention", "shape": [1, 8, 128, 64], "dtype": "float16", "device": "H200"}
RECORD = {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 2, "time_ms": 0.125}


@pytest.fixture
def store(tmp_path: Path) -> DiskCache:
    return DiskCache(tmp_path / "cache")


def _envelope(path: Path) -> dict:
    return json.loads(path.read_text())


def _rewrite(path: Path, doc: dict) -> None:
    path.write_text(json.dumps(doc))


def _temp_files(store: DiskCache) -> list[str]:
    return [n for n in os.listdir(store.directory) if n.startswith(".tmp-")]


# -- round trips ------------------------------------------------------------------------------


def test_round_trip(store: DiskCache) -> None:
    path = store.put(KEY, RECORD)
    assert path == store.path(KEY)
    assert path.parent == store.root / "schedules"
    assert store.get(KEY) == RECORD
    assert store.last_miss is None
    doc = _envelope(path)
    assert doc["format"] == 1 and doc["key"] == KEY and doc["record"] == RECORD
    assert set(doc) == {"format", "key", "record", "checksum"}


def test_missing_key(store: DiskCache) -> None:
    assert store.get(KEY) is None
    assert store.last_miss == "missing"


def test_two_keys_two_files(store: DiskCache) -> None:
    other = {**KEY, "dtype": "bfloat16"}
    p1, p2 = store.put(KEY, RECORD), store.put(other, {"block_m": 128})
    assert p1 != p2 and p1.exists() and p2.exists()
    assert store.get(KEY) == RECORD
    assert store.get(other) == {"block_m": 128}


def test_key_order_does_not_matter(store: DiskCache) -> None:
    reordered = dict(reversed(list(KEY.items())))
    assert store.path(reordered) == store.path(KEY)
    store.put(KEY, RECORD)
    assert store.get(reordered) == RECORD


def test_path_is_32_hex_digits(store: DiskCache) -> None:
    name = store.path(KEY).name
    assert name.endswith(".json") and len(name) == 32 + len(".json")
    int(name[:32], 16)


def test_put_overwrites(store: DiskCache) -> None:
    store.put(KEY, RECORD)
    store.put(KEY, {"block_m": 16})
    assert store.get(KEY) == {"block_m": 16}


def test_tuples_round_trip_as_lists(store: DiskCache) -> None:
    key = {**KEY, "shape": (1, 8, 128, 64)}
    store.put(key, {"grid": (4, 2)})
    assert store.get(KEY) == {"grid": [4, 2]}  # same canonical key


# -- corrupt and untrusted files ----------------------------------------------------------------


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(b"\x00\xff\xfe garbage \x80\x81")


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _wrong_checksum(path: Path) -> None:
    doc = _envelope(path)
    doc["record"]["block_m"] = 128  # tampered record, stale checksum
    _rewrite(path, doc)


def _wrong_format(path: Path) -> None:
    doc = _envelope(path)
    doc["format"] = 2
    _rewrite(path, doc)


def _collision(path: Path) -> None:
    """Another key's valid entry stored under this key's path."""
    other = {"op": "something else"}
    doc = _envelope(path)
    doc["key"] = other
    doc["checksum"] = store_mod._checksum(other, doc["record"])
    _rewrite(path, doc)


def _not_an_object(path: Path) -> None:
    path.write_text("[1, 2, 3]")


def _nan_inside(path: Path) -> None:
    path.write_text(path.read_text().replace("0.125", "NaN"))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_truncate, "corrupt: JSONDecodeError"),
        (_garbage, "corrupt: UnicodeDecodeError"),
        (_empty, "corrupt: empty file"),
        (_wrong_checksum, "checksum mismatch"),
        (_wrong_format, "stale format"),
        (_collision, "key mismatch"),
        (_not_an_object, "corrupt: not a JSON object"),
        (_nan_inside, "corrupt: ValueError"),
    ],
)
def test_damaged_file_is_a_miss_then_rewritten(store: DiskCache, damage, reason) -> None:
    path = store.put(KEY, RECORD)
    damage(path)
    assert store.get(KEY) is None
    assert store.last_miss == reason
    assert store.put(KEY, RECORD) == path
    assert store.get(KEY) == RECORD
    assert store.last_miss is None


def test_directory_in_place_of_file_is_a_miss(store: DiskCache) -> None:
    store.path(KEY).mkdir(parents=True)
    assert store.get(KEY) is None
    assert store.last_miss.startswith("unreadable: ")
    assert store.put(KEY, RECORD) is None  # cannot replace a directory: skipped, not raised
    assert _temp_files(store) == []


def test_last_miss_is_per_thread(store: DiskCache) -> None:
    store.put(KEY, RECORD)
    store.get({"op": "absent"})
    seen = []
    worker = threading.Thread(target=lambda: seen.append((store.get(KEY), store.last_miss)))
    worker.start()
    worker.join()
    assert seen == [(RECORD, None)]
    assert store.last_miss == "missing"


# -- bad data -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "record",
    [{"f": object()}, {"s": {1, 2}}, {"b": b"bytes"}, {"x": float("nan")}, {"x": float("inf")}],
)
def test_non_json_record_raises(store: DiskCache, record) -> None:
    with pytest.raises((TypeError, ValueError)):
        store.put(KEY, record)
    assert not store.path(KEY).exists()


def test_nan_in_key_raises(store: DiskCache) -> None:
    with pytest.raises(ValueError):
        store.put({"x": float("nan")}, RECORD)


def test_record_must_be_a_mapping(store: DiskCache) -> None:
    with pytest.raises(TypeError):
        store.put(KEY, [1, 2, 3])


# -- unwritable caches --------------------------------------------------------------------------


def test_root_under_a_regular_file(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    store = DiskCache(blocker / "cache")
    assert store.put(KEY, RECORD) is None
    assert store.get(KEY) is None
    assert store.last_miss is not None
    assert store.entries() == [] and store.clear() == 0


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="root ignores directory permissions")
def test_read_only_directory(store: DiskCache) -> None:
    store.put(KEY, RECORD)
    store.directory.chmod(0o555)
    try:
        assert store.put({"other": 1}, RECORD) is None
        assert store.get(KEY) == RECORD
    finally:
        store.directory.chmod(0o755)


def test_failed_replace_leaves_no_temp_file(store: DiskCache, monkeypatch) -> None:
    store.put(KEY, RECORD)

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(store_mod.os, "replace", failing_replace)
    assert store.put(KEY, {"block_m": 1}) is None
    monkeypatch.undo()
    assert _temp_files(store) == []
    assert store.get(KEY) == RECORD  # the old entry is intact


# -- cache_root ---------------------------------------------------------------------------------


def test_cache_root_env_override(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NEPTUNE_FUSION_CACHE_DIR", str(tmp_path / "nf"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "nf"
    assert DiskCache().directory == tmp_path / "nf" / "schedules"


def test_cache_root_xdg(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NEPTUNE_FUSION_CACHE_DIR", "")  # empty counts as unset
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "neptune-fusion"


def test_cache_root_home(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NEPTUNE_FUSION_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_root() == tmp_path / ".cache" / "neptune-fusion"


# -- concurrency --------------------------------------------------------------------------------

PUTS = 200
PAYLOAD = 2000

_WRITER = """
import sys
from neptune_fusion.runtime.disk_cache import DiskCache
root, writer, puts, payload = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
store = DiskCache(root)
key = {"op": "concurrent", "shape": [4, 4]}
for i in range(puts):
    record = {"writer": writer, "i": i,
              "payload": [writer * 1_000_000 + i * payload + j for j in range(payload)]}
    assert store.put(key, record) is not None
"""


def _expected(writer: int, i: int) -> dict:
    return {"writer": writer, "i": i,
            "payload": [writer * 1_000_000 + i * PAYLOAD + j for j in range(PAYLOAD)]}


def _check_read(record: dict | None, miss: str | None, seen_hit: bool) -> bool:
    """Assert one concurrent read is sane; whether a hit has been seen so far."""
    if record is None:
        assert miss == "missing" and not seen_hit, miss
        return seen_hit
    assert miss is None
    assert record == _expected(record["writer"], record["i"])
    assert record["writer"] in (1, 2) and 0 <= record["i"] < PUTS
    return True


def test_concurrent_process_writers(tmp_path: Path) -> None:
    store = DiskCache(tmp_path)
    key = {"shape": [4, 4], "op": "concurrent"}
    src = str(Path(store_mod.__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(tmp_path), str(w), str(PUTS), str(PAYLOAD)],
            env=env, stderr=subprocess.PIPE,
        )
        for w in (1, 2)
    ]
    seen_hit, hits, deadline = False, 0, time.monotonic() + 60
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        record = store.get(key)
        seen_hit = _check_read(record, store.last_miss, seen_hit)
        hits += record is not None
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()
    final = store.get(key)
    assert final is not None and final == _expected(final["writer"], PUTS - 1)
    assert hits > 0
    assert _temp_files(store) == []
    assert len(store.entries()) == 1


def test_concurrent_thread_writers(store: DiskCache) -> None:
    key = {"op": "threads"}
    records = [{"t": t, "payload": list(range(t, t + PAYLOAD))} for t in range(4)]

    def write(record: dict) -> None:
        for _ in range(25):
            assert store.put(key, record) is not None

    threads = [threading.Thread(target=write, args=(r,)) for r in records]
    for t in threads:
        t.start()
    for _ in range(200):
        got = store.get(key)
        assert got is None and store.last_miss == "missing" or got in records
    for t in threads:
        t.join()
    assert store.get(key) in records
    assert _temp_files(store) == []


# -- entries and clear --------------------------------------------------------------------------


def test_entries_and_clear(store: DiskCache) -> None:
    keys = [{**KEY, "shape": [n, 64]} for n in (1, 2, 3)]
    for n, key in enumerate(keys):
        store.put(key, {"block_m": 16 << n})
    _garbage(store.path(keys[0]))
    (store.directory / ".tmp-leftover.json").write_text("{}")
    (store.directory / "notes.txt").write_text("not a record")
    misplaced = store.directory / ("0" * 32 + ".json")  # valid content, wrong file name
    misplaced.write_bytes(store.path(keys[1]).read_bytes())

    entries = store.entries()
    assert sorted(json.dumps(e, sort_keys=True) for e in entries) == sorted(
        json.dumps({"key": k, "record": {"block_m": 16 << n}}, sort_keys=True)
        for n, k in enumerate(keys) if n > 0
    )
    assert store.clear() == 4  # two valid, the corrupt one, the misplaced one
    assert store.entries() == []
    assert sorted(os.listdir(store.directory)) == [".tmp-leftover.json", "notes.txt"]
    assert store.get(keys[1]) is None and store.last_miss == "missing"


def test_entries_of_missing_directory(store: DiskCache) -> None:
    assert store.entries() == []
    assert store.clear() == 0
