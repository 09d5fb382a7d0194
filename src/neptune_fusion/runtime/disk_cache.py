"""A persistent, process-safe on-disk store for tuned schedules (small JSON records).

Design:

* One file per key: ``<root>/schedules/<h>.json`` where ``h`` is the first 32 hex digits of
  the SHA-256 of the key's canonical JSON (sorted keys, no spaces, no NaN/Infinity), so the
  order of a key's fields never matters.
* A file holds ``{"format": 1, "key": ..., "record": ..., "checksum": ...}``; the checksum is
  the SHA-256 of the canonical JSON of ``[key, record]``. A file is trusted only if it parses,
  has format 1, stores exactly the requested key (guarding against hash collisions and stale
  layouts) and its checksum matches. Anything else, or an ``OSError`` on reading, is a miss:
  the caller re-tunes and :meth:`DiskCache.put` overwrites the file. The reason of the
  last miss ("missing", "corrupt: ...", "unreadable: ...", "stale format", "key mismatch",
  "checksum mismatch") is kept, per thread, in :attr:`DiskCache.last_miss` for logging.
* Writes are atomic: the file is written to a temporary file in the same directory, flushed,
  fsynced and moved over the final path with :func:`os.replace`. Readers therefore see either
  the old file or the new one, never a partial write, whichever threads or processes write
  concurrently; the last writer wins. No locks are needed.
* The cache is an optimisation, never a requirement: an unwritable cache directory makes
  ``put`` return ``None`` and any read error makes ``get`` miss. A key or record that is not
  plain JSON data is a programming error and raises ``TypeError``/``ValueError``.

Only JSON is ever read or written (no pickle), so a cache file cannot run code.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..settings import cache_root

FORMAT = 1
_TMP_PREFIX = ".tmp-"
_SUFFIX = ".json"


def canonical_json(obj: Any) -> str:
    """The one JSON text of ``obj``: sorted keys, compact; raises ``ValueError`` on NaN and
    ``TypeError`` on data JSON cannot hold (any :class:`Mapping` counts as an object)."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), allow_nan=False, default=_mapping_as_dict
    )


def _mapping_as_dict(obj: Any) -> dict:
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON data")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _checksum(key: Any, record: Any) -> str:
    return _sha256(canonical_json([key, record]))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


def _parse(data: bytes) -> Any:
    """Decode a file's bytes strictly (UTF-8, no NaN/Infinity); raises ``ValueError``."""
    return json.loads(data.decode("utf-8"), parse_constant=_reject_constant)


class _Miss(Exception):
    """An untrusted file; the message is the reason reported in ``last_miss``."""


def _validate(doc: Any) -> tuple[Any, dict]:
    """The ``(key, record)`` of a parsed file, or :class:`_Miss` saying why it is untrusted."""
    if not isinstance(doc, dict):
        raise _Miss("corrupt: not a JSON object")
    if doc.get("format") != FORMAT or isinstance(doc.get("format"), bool):
        raise _Miss("stale format")
    if not {"key", "record", "checksum"} <= doc.keys():
        raise _Miss("corrupt: missing field")
    key, record = doc["key"], doc["record"]
    if not isinstance(record, dict):
        raise _Miss("corrupt: record is not an object")
    if doc["checksum"] != _checksum(key, record):
        raise _Miss("checksum mismatch")
    return key, record


def _read(path: Path) -> Any:
    """The parsed content of ``path``; :class:`_Miss` if absent, unreadable or not JSON."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise _Miss("missing") from None
    except OSError as exc:
        raise _Miss(f"unreadable: {exc.__class__.__name__}") from None
    if not data:
        raise _Miss("corrupt: empty file")
    try:
        return _parse(data)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise _Miss(f"corrupt: {exc.__class__.__name__}") from None


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a fsynced temp file and :func:`os.replace`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_TMP_PREFIX, suffix=_SUFFIX)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a shared cache should stay readable
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class DiskCache:
    """Tuned-schedule records keyed by JSON-able mappings, one atomic file per key."""

    def __init__(self, root: Path | str | None = None, subdir: str = "schedules") -> None:
        self.root = Path(root) if root is not None else cache_root()
        self.directory = self.root / subdir
        self._local = threading.local()

    @property
    def last_miss(self) -> str | None:
        """Why this thread's last :meth:`get` missed (``None`` after a hit or before any)."""
        return getattr(self._local, "last_miss", None)

    @last_miss.setter
    def last_miss(self, reason: str | None) -> None:
        self._local.last_miss = reason

    def path(self, key: Mapping) -> Path:
        """The file that holds ``key``'s record (whether or not it exists)."""
        return self.directory / f"{_sha256(canonical_json(key))[:32]}{_SUFFIX}"

    def get(self, key: Mapping) -> dict | None:
        """The record stored for ``key``, or ``None`` (see :attr:`last_miss` for why)."""
        path = self.path(key)
        try:
            stored_key, record = _validate(_read(path))
            if canonical_json(stored_key) != canonical_json(key):
                raise _Miss("key mismatch")
        except _Miss as miss:
            self.last_miss = str(miss)
            return None
        self.last_miss = None
        return record

    def put(self, key: Mapping, record: Mapping) -> Path | None:
        """Store ``record`` for ``key`` atomically; the file's path, or ``None`` if the cache
        cannot be written. Raises ``TypeError``/``ValueError`` for non-JSON data."""
        if not isinstance(record, Mapping):
            raise TypeError(f"a schedule record must be a mapping, not {type(record).__name__}")
        key, record = _plain(key), _plain(record)
        text = canonical_json(
            {"format": FORMAT, "key": key, "record": record, "checksum": _checksum(key, record)}
        )
        path = self.path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_atomic(path, text)
        except OSError:
            return None
        return path

    def entries(self) -> list[dict]:
        """Every valid entry as ``{"key": ..., "record": ...}``, sorted by file name; temp
        files, corrupt files and files not at their key's path are skipped."""
        out = []
        for path in self._record_files():
            try:
                key, record = _validate(_read(path))
                if self.path(key) != path:
                    continue
            except (_Miss, TypeError, ValueError):
                continue
            out.append({"key": key, "record": record})
        return out

    def clear(self) -> int:
        """Delete every record file (valid or not); how many were deleted."""
        count = 0
        for path in self._record_files():
            try:
                path.unlink()
                count += 1
            except OSError:
                pass
        return count

    def _record_files(self) -> list[Path]:
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return []
        return [
            self.directory / name
            for name in names
            if name.endswith(_SUFFIX) and not name.startswith(_TMP_PREFIX)
        ]


def _plain(obj: Mapping) -> Any:
    """``obj`` as the plain JSON data it round-trips to (tuples become lists, ...); raises
    ``TypeError``/``ValueError`` for data JSON cannot hold."""
    return json.loads(canonical_json(obj))
