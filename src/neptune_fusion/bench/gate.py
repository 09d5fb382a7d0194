"""The correctness gate: a provider's output must match the float64 reference before timing.

The measure is the relative Frobenius error ``||out - ref|| / ||ref||`` over the whole
output, in float64. Thresholds are per input dtype, well above what a correct kernel with
fp32 accumulation shows on N(0, 1) inputs (fp16 ~5e-4, bf16 ~4e-3; a kernel that rounds the
scores to the input dtype, such as plain PyTorch attention, a few times more) and far below
what a semantic mistake shows (a dropped causal mask or ALiBi bias: 1e-1 and more).

Blind spot: with N(0, 1) inputs the scores are N(0, 1), where a soft-cap of 50 changes a
score by less than 1e-3 (50 tanh(s/50) = s - s^3/7500 + ...). The gate cannot tell a
missing soft-cap from rounding; the soft-cap is checked by construction, not by this gate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

THRESHOLDS: dict[torch.dtype, float] = {
    torch.float16: 1e-2,
    torch.bfloat16: 2e-2,
    torch.float32: 1e-3,
}


def threshold_for(dtype: torch.dtype, table: dict | None = None,
                  what: str = "correctness") -> float:
    """The relative-error threshold for inputs of ``dtype`` (from ``table``, default the
    outputs' :data:`THRESHOLDS`); a ValueError naming the known dtypes otherwise."""
    table = THRESHOLDS if table is None else table
    try:
        return table[dtype]
    except KeyError:
        raise ValueError(f"no {what} threshold for dtype {dtype}; "
                         f"known: {', '.join(str(d) for d in table)}") from None


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref||_F / ||ref||_F`` in float64 (inf when out is not finite)."""
    diff = torch.linalg.vector_norm(out.to(torch.float64) - ref)
    norm = torch.linalg.vector_norm(ref)
    err = float(diff / norm) if float(norm) > 0 else float(diff)
    return err if math.isfinite(err) else math.inf


@dataclass(frozen=True, slots=True)
class GateResult:
    """Outcome of the gate: whether it passed, the error measured, and why it failed."""

    passed: bool
    error: float | None
    reason: str = ""


def check(out: object, ref: torch.Tensor, dtype: torch.dtype) -> GateResult:
    """Compare a provider output with the reference; shape, dtype class and error checked."""
    if not isinstance(out, torch.Tensor):
        return GateResult(False, None, f"provider returned {type(out).__name__}, not a tensor")
    if tuple(out.shape) != tuple(ref.shape):
        return GateResult(False, None, f"output shape {tuple(out.shape)} != reference shape "
                                       f"{tuple(ref.shape)}")
    err = relative_error(out, ref)
    limit = threshold_for(dtype)
    if err > limit:
        return GateResult(False, err, f"relative error {err:.3g} exceeds {limit:g} ({dtype})")
    return GateResult(True, err)
