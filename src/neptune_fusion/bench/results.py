"""``results.json``: the stable, documented schema of a benchmark run.

Top-level keys (:data:`TOP_KEYS`): ``schema``, ``schema_version``, ``date`` (ISO 8601,
UTC), ``mode`` (``gpu`` or ``cpu-smoke``), ``environment``, ``config``, ``providers``,
``ceilings``, ``records`` (one per (op, seq, provider), keys :data:`RECORD_KEYS`),
``comparisons`` (one per (op, seq), keys :data:`COMPARISON_KEYS`) and ``summary``
(per phase, keys :data:`SUMMARY_KEYS`). Adding a key bumps nothing; renaming or removing
one bumps ``schema_version``.
"""

from __future__ import annotations

import json
import platform
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import torch

from .metrics import Comparison, phase_summary
from .providers.base import Provider
from .record import RECORD_KEYS, Record
from .timing import Ceilings

SCHEMA = "neptune-fusion-bench"
SCHEMA_VERSION = 1
TOP_KEYS: tuple[str, ...] = ("schema", "schema_version", "date", "mode", "environment",
                             "config", "providers", "ceilings", "records", "comparisons",
                             "summary")
ENVIRONMENT_KEYS: tuple[str, ...] = ("gpu", "device", "torch", "triton", "python", "cuda",
                                     "platform", "neptune_fusion")
CEILING_KEYS: tuple[str, ...] = ("matmul_tflops", "copy_tbps", "matmul_shape", "copy_bytes")
COMPARISON_KEYS: tuple[str, ...] = ("op", "phase", "seq", "neptune_ms", "baseline",
                                    "baseline_ms", "vs_baseline", "compiler", "compiler_ms",
                                    "vs_compiler")
SUMMARY_KEYS: tuple[str, ...] = ("geomean_vs_baseline", "points_vs_baseline",
                                 "geomean_vs_compiler", "points_vs_compiler")
__all__ = ["RECORD_KEYS", "TOP_KEYS", "build_document", "environment", "write_json"]


def environment(device: torch.device) -> dict:
    """Versions and the device name (keys :data:`ENVIRONMENT_KEYS`)."""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    try:
        from .._version import __version__ as nf_version
    except ImportError:
        nf_version = None
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"gpu": gpu, "device": str(device), "torch": torch.__version__,
            "triton": triton_version, "python": platform.python_version(),
            "cuda": torch.version.cuda, "platform": f"{sys.platform}-{platform.machine()}",
            "neptune_fusion": nf_version}


def comparison_json(c: Comparison) -> dict:
    """A comparison as a dict with keys :data:`COMPARISON_KEYS`."""
    return {"op": c.op, "phase": c.phase, "seq": c.seq, "neptune_ms": c.neptune_ms,
            "baseline": c.baseline, "baseline_ms": c.baseline_ms, "vs_baseline": c.vs_baseline,
            "compiler": c.compiler, "compiler_ms": c.compiler_ms, "vs_compiler": c.vs_compiler}


def build_document(*, date: datetime, mode: str, env: dict, config: dict,
                   providers: Sequence[Provider], ceilings: Ceilings,
                   records: Sequence[Record], comparisons: Sequence[Comparison]) -> dict:
    """The whole results document, keys in :data:`TOP_KEYS` order."""
    doc = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "date": date.isoformat(timespec="seconds"),
        "mode": mode,
        "environment": env,
        "config": config,
        "providers": {p.name: {"label": p.label, "group": p.group,
                               "description": p.description} for p in providers},
        "ceilings": {"matmul_tflops": ceilings.matmul_tflops, "copy_tbps": ceilings.copy_tbps,
                     "matmul_shape": list(ceilings.matmul_shape),
                     "copy_bytes": ceilings.copy_bytes},
        "records": [r.to_json() for r in records],
        "comparisons": [comparison_json(c) for c in comparisons],
        "summary": phase_summary(comparisons),
    }
    assert tuple(doc) == TOP_KEYS
    return doc


def write_json(doc: dict, path: Path) -> None:
    """Write ``doc`` as indented JSON (NaN/inf are not valid JSON: they become null)."""
    def clean(x):
        if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x
    path.write_text(json.dumps(clean(doc), indent=2, allow_nan=False) + "\n")
