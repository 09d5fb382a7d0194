"""Throughput, ratios and geometric means: the arithmetic of the report, kept pure.

A speedup is ``other_ms / neptune_ms``: above 1 means neptune-fusion is faster. The
"fastest baseline" is the fastest correct non-neptune provider at that point (SDPA
backends and compilers); the "fastest compiler" is the fastest correct provider of the
``compiler`` group (FlexAttention, Triton FA2, torch.compile).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..ops import OpSpec
from .record import Record
from .workloads import decode_bytes, prefill_flops

UNITS = {"PF": "TFLOP/s", "DC": "TB/s"}


def throughput(op: OpSpec, seq: int, ms: float, elem_size: int) -> float:
    """TFLOP/s for prefill, TB/s of K+V read for decode, at ``ms`` milliseconds."""
    if ms <= 0:
        raise ValueError(f"throughput: time must be positive, got {ms} ms")
    work = prefill_flops(op, seq) if op.phase == "PF" else decode_bytes(op, seq, elem_size)
    return work / (ms * 1e-3) / 1e12


def fraction_of_ceiling(phase: str, value: float | None, matmul_tflops: float | None,
                        copy_tbps: float | None) -> float | None:
    """``value`` over the matching ceiling (matmul for PF, copy for DC); None if unknown."""
    ceiling = matmul_tflops if phase == "PF" else copy_tbps
    if value is None or not ceiling:
        return None
    return value / ceiling


def ratio(base_ms: float | None, ms: float | None) -> float | None:
    """``base_ms / ms`` (how many times faster ``ms`` is), None when either is missing."""
    if base_ms is None or ms is None or base_ms <= 0 or ms <= 0:
        return None
    return base_ms / ms


def geomean(values: Iterable[float | None]) -> float | None:
    """Geometric mean of the positive values given (None ignored); None when there are none."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    if any(v <= 0 for v in vals):
        raise ValueError(f"geomean: values must be positive, got {vals}")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def fastest(records: Iterable[Record], groups: Sequence[str]) -> Record | None:
    """The correct (status ok) record with the smallest time among ``groups``."""
    ok = [r for r in records if r.status == "ok" and r.group in groups and r.ms is not None]
    return min(ok, key=lambda r: r.ms) if ok else None


@dataclass(frozen=True, slots=True)
class Comparison:
    """neptune-fusion against the fastest baseline and the fastest compiler at one point."""

    op: str
    phase: str
    seq: int
    neptune_ms: float | None
    baseline: str | None
    baseline_ms: float | None
    compiler: str | None
    compiler_ms: float | None

    @property
    def vs_baseline(self) -> float | None:
        """Speedup of neptune-fusion over the fastest baseline."""
        return ratio(self.baseline_ms, self.neptune_ms)

    @property
    def vs_compiler(self) -> float | None:
        """Speedup of neptune-fusion over the fastest compiler."""
        return ratio(self.compiler_ms, self.neptune_ms)


def compare(records: Sequence[Record]) -> list[Comparison]:
    """One comparison per (op, seq), in the order the points first appear."""
    points: dict[tuple[str, int], list[Record]] = {}
    for r in records:
        points.setdefault((r.op, r.seq), []).append(r)
    out = []
    for (op, seq), recs in points.items():
        nf = fastest(recs, ("neptune",))
        base = fastest(recs, ("library", "compiler"))
        comp = fastest(recs, ("compiler",))
        out.append(Comparison(op, recs[0].phase, seq, nf.ms if nf else None,
                              base.provider if base else None, base.ms if base else None,
                              comp.provider if comp else None, comp.ms if comp else None))
    return out


def phase_summary(comparisons: Sequence[Comparison]) -> dict[str, dict[str, float | int | None]]:
    """Per phase: geometric-mean speedups and how many points each one covers."""
    summary: dict[str, dict[str, float | int | None]] = {}
    for phase in ("PF", "DC"):
        cs = [c for c in comparisons if c.phase == phase]
        vb = [c.vs_baseline for c in cs if c.vs_baseline is not None]
        vc = [c.vs_compiler for c in cs if c.vs_compiler is not None]
        summary[phase] = {"geomean_vs_baseline": geomean(vb), "points_vs_baseline": len(vb),
                          "geomean_vs_compiler": geomean(vc), "points_vs_compiler": len(vc)}
    return summary
