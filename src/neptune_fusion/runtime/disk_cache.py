"""A persistent, process-safe on-disk store for tuned schedules and kernel specs (small
JSON records), private to the user who runs it.

Design (the threat model is docs/cache.md):

* One file per key: ``<root>/<subdir>/<h>.json`` where ``h`` is the first 32 hex digits of
  the SHA-256 of the key's canonical JSON (sorted keys, no spaces, no NaN/Infinity), so the
  order of a key's fields never matters, and a file name is never taken from the data.
* **Private.** The root and the subdirectory are created with mode 0700. Before any read
  or write both must be directories owned by the effective user and not writable by
  group or others; otherwise the cache is *refused*: an :class:`UnsafeCacheWarning`
  (once per directory and reason), every ``get`` misses and ``put`` writes nothing. There
  is no fallback directory. A file is read only through a descriptor whose ``fstat``
  shows a regular file with the same owner and no group/other write bit, so nothing can
  be swapped in between that check and the read. This ownership check is the trust
  boundary: a kernel spec read here holds source code that is compiled and run.
* A file holds ``{"format": 1, "key": ..., "record": ..., "checksum": ...}``; the checksum is
  the SHA-256 of the canonical JSON of ``[key, record]``. It only detects corruption
  (a torn or damaged file); anyone able to write the file could recompute it, which is why
  it is not what the cache trusts. A file is used only if it passes the ownership check,
  parses, has format 1, stores exactly the requested key (guarding against hash
  collisions and stale layouts) and its checksum matches. Anything else, or an
  ``OSError`` on reading, is a miss: the caller rebuilds and :meth:`DiskCache.put`
  overwrites the file. The reason of the last miss ("missing", "refused: ...", "corrupt:
  ...", "unreadable: ...", "stale format", "key mismatch", "checksum mismatch") is kept,
  per thread, in :attr:`DiskCache.last_miss` for logging.
* Writes are atomic: the file is written to a temporary file (mode 0600) in the same
  directory, flushed, fsynced and moved over the final path with :func:`os.replace`.
  Readers therefore see either the old file or the new one, never a partial write,
  whichever threads or processes write concurrently; the last writer wins. No locks.
* The cache is an optimisation, never a requirement: an unwritable or refused directory
  makes ``put`` return ``None`` and any read error makes ``get`` miss. A key or record
  that is not plain JSON data is a programming error and raises ``TypeError``/``ValueError``.

Only JSON is ever read or written (no pickle); the one place its content becomes code is
a kernel spec's source, compiled from the text read here (runtime/loader.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..settings import cache_root

FORMAT = 1
_TMP_PREFIX = ".tmp-"
_SUFFIX = ".json"
SUBDIRS = ("schedules", "specs")   # what DiskCache writes under a root
LEGACY_SUBDIRS = ("kernels",)      # what earlier versions wrote there (kernel files)


class UnsafeCacheWarning(UserWarning):
    """A cache directory another user owns or can write: it is not used."""


def _euid() -> int | None:
    """The effective user id; None where the platform has none (no ownership check)."""
    return os.geteuid() if hasattr(os, "geteuid") else None


def unsafe(st: os.stat_result) -> str | None:
    """Why a directory or file with status ``st`` is not private to this user, or None:
    it must be owned by the effective user and not writable by group or others."""
    uid = _euid()
    if uid is None:
        return None
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not by you (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _check_dir(path: Path, create: bool) -> str | None:
    """None if ``path`` is a private directory (made with mode 0700 when ``create``);
    else why not: "missing", "unreadable: ..." or "refused: ..." (warned about)."""
    try:
        if create:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(path)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable: {exc.__class__.__name__}"
    why = "not a directory" if not stat.S_ISDIR(st.st_mode) else unsafe(st)
    if why is None:
        return None
    _warn(path, why)
    return f"refused: {why}"


def _warn(path: Path, why: str) -> None:
    # one call site: the warnings registry shows each (directory, reason) text once
    warnings.warn(f"neptune-fusion does not use the cache directory {path}: it is {why}. "
                  "Only a directory private to you is trusted (it holds code that runs); "
                  "fix it (chmod 700, or remove it) or set NEPTUNE_FUSION_CACHE_DIR; "
                  "until then there is no disk cache (see docs/cache.md)",
                  UnsafeCacheWarning, stacklevel=1)


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
    """The parsed content of ``path``; :class:`_Miss` if absent, unreadable, not private
    (checked on the open descriptor, so the bytes read are the ones checked) or not
    JSON."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise _Miss("missing") from None
    except OSError as exc:
        raise _Miss(f"unreadable: {exc.__class__.__name__}") from None
    try:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise _Miss("unreadable: not a regular file")
            why = unsafe(st)
            if why is not None:
                raise _Miss(f"refused: {why}")
            data = f.read()
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
        with os.fdopen(fd, "w", encoding="utf-8") as f:  # mode 0600 (mkstemp)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
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
        if subdir not in SUBDIRS:
            raise ValueError(f"subdir must be one of {SUBDIRS}, got {subdir!r}")
        self.root = Path(root) if root is not None else cache_root()
        self.directory = self.root / subdir
        self._local = threading.local()

    def _unusable(self, create: bool = False) -> str | None:
        """None if the root and the subdirectory are private (created if ``create``),
        else why not (see :func:`_check_dir`)."""
        return _check_dir(self.root, create) or _check_dir(self.directory, create)

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
            why = self._unusable()
            if why is not None:
                raise _Miss(why)
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
        if self._unusable(create=True) is not None:
            return None
        try:
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
        return sum(_unlink(path) for path in self._record_files())

    def _record_files(self) -> list[Path]:
        return [
            self.directory / name
            for name in _listdir(self.directory)
            if name.endswith(_SUFFIX) and not name.startswith(_TMP_PREFIX)
        ]


def clear_all(root: Path | str | None = None) -> dict[str, int]:
    """Remove everything neptune-fusion writes under ``root`` (default: the cache root):
    the records and leftover temporary files of every subdirectory, the ``kernels``
    directory earlier versions wrote generated sources (and Python's bytecode of them)
    to, and then those directories if empty. Files by the same names that are not ours
    (``notes.txt``) are left. Returns the number of files removed per subdirectory."""
    root = Path(root) if root is not None else cache_root()
    removed: dict[str, int] = {}
    for sub in SUBDIRS:
        store = DiskCache(root, sub)
        n = store.clear()
        for name in _listdir(store.directory):
            if name.startswith(_TMP_PREFIX) and name.endswith(_SUFFIX):
                n += _unlink(store.directory / name)
        removed[sub] = n
        _rmdir(store.directory)
    for sub in LEGACY_SUBDIRS:
        directory = root / sub
        removed[sub] = sum(len(files) for _, _, files in os.walk(directory))
        # symlinks inside are removed, never followed (shutil.rmtree's safe mode)
        shutil.rmtree(directory, ignore_errors=True)
        removed[sub] -= sum(len(files) for _, _, files in os.walk(directory))
    return removed


def _listdir(directory: Path) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except OSError:
        return []


def _unlink(path: Path) -> int:
    try:
        path.unlink()
        return 1
    except OSError:
        return 0


def _rmdir(directory: Path) -> None:
    try:
        directory.rmdir()   # only if empty
    except OSError:
        pass


def _plain(obj: Mapping) -> Any:
    """``obj`` as the plain JSON data it round-trips to (tuples become lists, ...); raises
    ``TypeError``/``ValueError`` for data JSON cannot hold."""
    return json.loads(canonical_json(obj))
