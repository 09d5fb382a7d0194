"""The uniform provider interface: ``prepare(op, q, k, v, ctx) -> Prepared | Unsupported``.

``prepare`` does everything that is set-up rather than attention (compiling, tuning,
building a block mask or a bias) and returns a zero-argument callable that computes the
(B, Hq, Sq, D) output from the captured inputs. The runner times ``prepare`` plus the first
call as compile/tune time, gates the output against the float64 reference, then times the
callable. A provider that cannot express an operator returns :class:`Unsupported` (or
raises :class:`UnsupportedError` / ``NotImplementedError``); any other exception is recorded
as an error of that provider and the run goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from ...ops import OpSpec

Timer = Callable[[Callable[[], object]], float]
"""Times a zero-argument callable; returns milliseconds (median)."""

NO_KERNEL_MARKERS: tuple[str, ...] = ("No available kernel", "No viable backend")
"""Texts of SDPA's RuntimeError when no enabled backend accepts the inputs (CUDA, CPU)."""

Group = Literal["library", "compiler", "neptune"]
"""``library``: fixed kernels (SDPA backends); ``compiler``: FlexAttention, Triton,
torch.compile; ``neptune``: the kernels under test."""


class UnsupportedError(Exception):
    """Raised by a provider (at prepare or first call) for an operator it cannot express."""


@dataclass(frozen=True, slots=True)
class Unsupported:
    """The provider cannot run this operator; ``reason`` says why, for the report."""

    reason: str


@dataclass(frozen=True, slots=True)
class Prepared:
    """A ready-to-time callable and a note on how the operator was expressed;
    ``describe()``, called after the first call, adds to the note what only that call
    decided (the kernel the auto-scheduler chose)."""

    fn: Callable[[], torch.Tensor]
    note: str = ""
    describe: Callable[[], str] | None = None


@dataclass(frozen=True, slots=True)
class RunContext:
    """What a provider may need besides the inputs: device, dtype, a timer for tuning."""

    device: torch.device
    dtype: torch.dtype
    timer: Timer
    smoke: bool = False


PrepareFn = Callable[[OpSpec, torch.Tensor, torch.Tensor, torch.Tensor, RunContext],
                     "Prepared | Unsupported"]


@dataclass(frozen=True, slots=True)
class Provider:
    """A named way to compute attention, with its group for the speedup columns."""

    name: str
    label: str
    group: Group
    description: str
    prepare: PrepareFn
