import functools

__version__ = "0.1.0"


def code_version() -> str:
    """A hash of the package's own source files: part of every cache key, so a changed
    compiler (a fixed code generator, a new cost model) never reuses what an older one
    stored under the same version number. Computed once per process (a few ms)."""
    return _code_version()


def _hash_sources() -> str:
    import hashlib
    from pathlib import Path
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


_code_version = functools.cache(_hash_sources)
