"""One measurement: a provider on an operator at one sequence length."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Literal

Status = Literal["ok", "wrong", "unsupported", "error"]
STATUSES: tuple[str, ...] = ("ok", "wrong", "unsupported", "error")


class Checked:
    """What every suite's record shares: a known status, a time when ``ok``, and its
    JSON form. Mixed into frozen dataclasses with ``status`` and ``ms`` fields."""

    __slots__ = ()

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.status not in STATUSES:
            raise ValueError(f"{name}: status {self.status!r} is not one of {STATUSES}")
        if self.status == "ok" and self.ms is None:
            raise ValueError(f"{name}: an ok record needs a time")

    def to_json(self) -> dict:
        """The record as a JSON-ready dict (keys: the dataclass fields, in order)."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Record(Checked):
    """The outcome of one (op, seq, provider) point; see docs/benchmarks.md for each field.

    ``ms`` and ``throughput`` are set only for ``ok``; ``error`` (relative Frobenius error
    against the float64 reference) whenever the output was compared; ``reason`` explains
    ``wrong``, ``unsupported`` and ``error``.
    """

    op: str
    phase: str
    seq: int
    provider: str
    group: str
    status: Status
    ms: float | None = None
    compile_ms: float | None = None
    error: float | None = None
    throughput: float | None = None
    unit: str = ""
    fraction_of_ceiling: float | None = None
    reason: str = ""
    note: str = ""
    ms_spread: float | None = None    # (max - min) / median of the timing rounds
    # the SM clock over the timing rounds, and whether a power cap or slowdown was active
    # (bench/clocks.py; None where nothing was sampled)
    sm_mhz_min: int | None = None
    sm_mhz_max: int | None = None
    power_capped: bool | None = None


RECORD_KEYS: tuple[str, ...] = tuple(f.name for f in fields(Record))
