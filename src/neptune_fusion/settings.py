"""Every environment variable neptune-fusion reads, in one table.

In the style of Triton's ``knobs``: one :class:`Setting` row per variable, with its
default and what it does; the accessors below read the environment *when called* (no
module-level state, so a test or a user may change a variable between calls). No other
module of the package reads or writes ``os.environ``; ``docs/settings.md`` lists the same
rows (a test keeps the two equal).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Setting:
    """One environment variable: its name, its default (as text) and what it does."""

    env: str
    default: str
    doc: str


SETTINGS: tuple[Setting, ...] = (
    Setting("NEPTUNE_FUSION_CACHE_DIR", "",
            "Root of the disk cache (tuned schedules, kernel specs with their generated "
            "source). Empty: `$XDG_CACHE_HOME/neptune-fusion`, else "
            "`~/.cache/neptune-fusion`. Created with mode 0700; a directory another user "
            "owns or can write is not used (a warning, then no disk cache: "
            "[cache.md](cache.md))."),
    Setting("XDG_CACHE_HOME", "",
            "Read only when `NEPTUNE_FUSION_CACHE_DIR` is empty: the cache root's parent."),
    Setting("NEPTUNE_FUSION_LOG", "0",
            "`1`: print to stderr how each shape class got its schedule (cache hit, cost "
            "model, measured candidates with their times), and what the torch.compile "
            "backend fused in each graph ([jit.md](jit.md)). `nf.compile(log=...)` and "
            "`nf.jit(log=...)` override."),
    Setting("NEPTUNE_FUSION_DUMP", "",
            "Comma-separated stage names (or `all`): print the IR after each named stage "
            "to stderr. Stages: `canon`, `normalize`, `graph`, `plan`, `lower`, `exp2`, "
            "`partition`, `separate`, `defer`, `split`, `source`."),
    Setting("NEPTUNE_FUSION_SYNTH_BUDGET", "10",
            "Seconds one repair derivation may take (SymPy has no time limit of its "
            "own). A chain whose repair is not derived in time is not fused by a repair: "
            "`nf.compile` plans it in several passes, the torch.compile backend leaves it "
            "to the rest of the compiler, both with the reason "
            "([algebra.md](algebra.md)). `0`: no limit."),
    Setting("NEPTUNE_FUSION_VERIFY", "0",
            "`1`: check invariants between passes (the IR verifier after canonicalise and "
            "normalise, `TileProgram.check()` after lowering). The test suite turns it on."),
    Setting("NEPTUNE_FUSION_VALIDATE", "0",
            "`1`: `nf.attention` checks the values of `kv_lens` and `block_table` on CUDA "
            "tensors too (a length above the cache, a page outside the pool: a host sync "
            "per call, not for CUDA-graph capture). CPU tensors are always checked."),
    Setting("NEPTUNE_FUSION_DIRECT_LAUNCH", "1",
            "`0`: always launch through Triton's dispatcher instead of calling the compiled "
            "kernel's launcher directly after the first call (for debugging)."),
    Setting("NEPTUNE_FUSION_GLUON", "1",
            "On Hopper-class GPUs (sm_90) with Triton 3.6, the auto-scheduler also "
            "measures the Gluon dialect's schedules (`Schedule.dialect`, "
            "[hopper.md](hopper.md)) for attention-shaped programs and keeps one when it "
            "is fastest; a call such a kernel cannot take (CPU tensors, an address or "
            "stride off the 16-byte grid) runs the same tile in the Triton dialect. `0`: "
            "the Triton dialect only (a first compile a few seconds shorter)."),
    Setting("CUDA_VISIBLE_DEVICES", "",
            "CUDA's own variable, only read: the benchmark's clock watch maps the GPU it "
            "times to `nvidia-smi`'s id through it ([benchmarks.md](benchmarks.md), "
            "\"Timing\")."),
    Setting("TRITON_INTERPRET", "0",
            "Triton's own variable. neptune-fusion sets it only while it imports or runs a "
            "kernel under the interpreter (CPU tensors); the benchmark refuses to time with "
            "it set."),
)

_FALSE = ("", "0", "false", "no", "off")
_INTERPRET_LOCK = threading.RLock()


def _raw(env: str) -> str:
    row = next((s for s in SETTINGS if s.env == env), None)
    if row is None:  # a programming error: every variable read must have a row
        raise KeyError(f"{env} is not in neptune_fusion.settings.SETTINGS")
    return os.environ.get(env, row.default)


def _flag(env: str) -> bool:
    return _raw(env).strip().lower() not in _FALSE


def cache_root() -> Path:
    """``$NEPTUNE_FUSION_CACHE_DIR``, else ``$XDG_CACHE_HOME/neptune-fusion``, else
    ``~/.cache/neptune-fusion``: only a path; whether it may be used is decided by
    :mod:`neptune_fusion.runtime.disk_cache` (private to the user, see docs/cache.md)."""
    env = _raw("NEPTUNE_FUSION_CACHE_DIR")
    if env:
        return Path(env)
    base = _raw("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "neptune-fusion"


def log_enabled(flag: bool | None = None) -> bool:
    """``flag`` when given, else ``$NEPTUNE_FUSION_LOG``."""
    return bool(flag) if flag is not None else _flag("NEPTUNE_FUSION_LOG")


def dump_wanted(stage: str) -> bool:
    """Whether ``$NEPTUNE_FUSION_DUMP`` names ``stage`` (or is ``all``)."""
    want = [w.strip() for w in _raw("NEPTUNE_FUSION_DUMP").split(",")]
    return stage in want or "all" in want


def dump(stage: str, text: str | Callable[[], str]) -> None:
    """Print ``text`` (called only if wanted) to stderr when ``stage`` is to be dumped."""
    if dump_wanted(stage):
        print(f"--- neptune-fusion: after {stage} ---\n{text() if callable(text) else text}",
              file=sys.stderr)


def synth_budget() -> float:
    """``$NEPTUNE_FUSION_SYNTH_BUDGET``: seconds per repair derivation (``0``: no limit,
    returned as infinity)."""
    raw = _raw("NEPTUNE_FUSION_SYNTH_BUDGET").strip()
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:   # negative, NaN or not a number
        from .errors import NeptuneError
        raise NeptuneError(f"NEPTUNE_FUSION_SYNTH_BUDGET={raw!r}: give the seconds one "
                           "repair derivation may take (0: no limit)")
    return seconds or float("inf")


def verify_enabled() -> bool:
    """``$NEPTUNE_FUSION_VERIFY``: check invariants between passes."""
    return _flag("NEPTUNE_FUSION_VERIFY")


def validate_enabled() -> bool:
    """``$NEPTUNE_FUSION_VALIDATE``: check KV-cache values on CUDA tensors too."""
    return _flag("NEPTUNE_FUSION_VALIDATE")


def direct_launch() -> bool:
    """``$NEPTUNE_FUSION_DIRECT_LAUNCH`` (default on)."""
    return _flag("NEPTUNE_FUSION_DIRECT_LAUNCH")


def gluon_enabled() -> bool:
    """``$NEPTUNE_FUSION_GLUON``: the auto-scheduler offers the Gluon dialect."""
    return _flag("NEPTUNE_FUSION_GLUON")


def cuda_visible_devices() -> str:
    """``$CUDA_VISIBLE_DEVICES`` as set (empty when unset)."""
    return _raw("CUDA_VISIBLE_DEVICES")


def triton_interpret() -> bool:
    """Whether ``TRITON_INTERPRET`` is set now (to anything but off)."""
    return _flag("TRITON_INTERPRET")


@contextlib.contextmanager
def triton_interpret_as(on: bool) -> Iterator[None]:
    """``TRITON_INTERPRET`` set to ``on`` while the block runs, then restored. Triton reads
    it when ``@triton.jit`` runs and, under the interpreter, again during a launch; a lock
    keeps concurrent users from seeing each other's setting."""
    with _INTERPRET_LOCK:
        old = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1" if on else "0"
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = old


def set_triton_interpret() -> None:
    """Turn the interpreter on for the rest of the process (``bench --cpu-smoke``: Triton
    reads it when a provider's kernels are defined, before any launch)."""
    os.environ["TRITON_INTERPRET"] = "1"


def table_markdown() -> str:
    """The settings as the Markdown table of ``docs/settings.md``."""
    rows = ["| variable | default | what it does |", "|---|---|---|"]
    rows += [f"| `{s.env}` | {('`' + s.default + '`') if s.default else '(empty)'} | {s.doc} |"
             for s in SETTINGS]
    return "\n".join(rows)
