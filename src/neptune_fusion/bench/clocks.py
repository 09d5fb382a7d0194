"""The GPU's clock and power cap while each provider is timed.

On an H100 SXM (700 W) the prefill kernels of every provider draw the board to its power
limit; the driver then lowers the SM clock (1170-1980 MHz was seen within one second,
2026-12-06), and one kernel's time moved 5-18 % between a run's rounds while a slower,
cooler one's stayed within 1 %. A ratio read off such a run carries that noise, so the
bench says when it happened: ``nvidia-smi`` samples the SM clock, the power draw and the
active clock-event reasons in the background (:class:`ClockSampler`, one process for the
run), and :class:`WatchedTimer` keeps the samples of each timing call's window. Each
record then carries the SM clock range over its rounds and whether the power cap (or a
thermal or hardware slowdown) was active (``sm_mhz_min``, ``sm_mhz_max``,
``power_capped``); the report shows them in its ``SM MHz`` column. Without ``nvidia-smi``
(or on the CPU) nothing is sampled and the fields stay empty.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

QUERY = "clocks.sm,power.draw,clocks_throttle_reasons.active"
PERIOD_MS = 100
# clock-event reasons (nvidia-smi -q's "Clocks Event Reasons") that lower the clock under
# load: the software power cap, hardware slowdown, software and hardware thermal
# slowdown, the hardware power brake
SLOWDOWN = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


@dataclass(frozen=True, slots=True)
class Sample:
    """One ``nvidia-smi`` line: when (``time.monotonic``), SM MHz, watts, reason bits."""

    t: float
    mhz: int
    watts: float | None
    reasons: int


@dataclass(frozen=True, slots=True)
class ClockWindow:
    """The samples of one or more timing windows, summarised."""

    mhz_min: int
    mhz_max: int
    capped: bool      # a slowdown reason (:data:`SLOWDOWN`) was active in some sample
    samples: int

    def merge(self, other: ClockWindow | None) -> ClockWindow:
        if other is None:
            return self
        return ClockWindow(min(self.mhz_min, other.mhz_min), max(self.mhz_max, other.mhz_max),
                           self.capped or other.capped, self.samples + other.samples)


def parse_line(line: str, t: float) -> Sample | None:
    """A ``--format=csv,noheader,nounits`` line of :data:`QUERY`, or None when it is not
    one (a header, a warning, ``[N/A]`` for the clock)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 3:
        return None
    try:
        mhz = int(float(parts[0]))
        reasons = int(parts[2], 16)
    except ValueError:
        return None
    try:
        watts = float(parts[1])
    except ValueError:
        watts = None
    return Sample(t, mhz, watts, reasons)


def summarize(samples: Sequence[Sample]) -> ClockWindow | None:
    """The window of ``samples`` (None when there are none)."""
    if not samples:
        return None
    return ClockWindow(min(s.mhz for s in samples), max(s.mhz for s in samples),
                       any(s.reasons & SLOWDOWN for s in samples), len(samples))


class ClockSampler:
    """``nvidia-smi`` sampling the GPU ``gpu`` (its ``--id``: an index, a UUID or a PCI
    bus id) every ``period_ms`` into memory, from a reader thread, until :meth:`close`.
    ``command`` replaces the ``nvidia-smi`` command line (tests)."""

    def __init__(self, gpu: str = "0", period_ms: int = PERIOD_MS,
                 command: Sequence[str] | None = None) -> None:
        cmd = list(command) if command is not None else [
            "nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
            "-lms", str(period_ms), "-i", gpu]
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            s = parse_line(line, time.monotonic())
            if s is not None:
                with self._lock:
                    self._samples.append(s)

    def window(self, t0: float, t1: float) -> ClockWindow | None:
        """The samples taken between ``t0`` and ``t1`` (``time.monotonic``), summarised."""
        with self._lock:
            got = [s for s in self._samples if t0 <= s.t <= t1]
        return summarize(got)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._thread.join(timeout=5)

    def __enter__(self) -> ClockSampler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class WatchedTimer:
    """A timer (``fn -> ms``) that keeps the clock window of its last call in ``last``."""

    def __init__(self, timer: Callable[[Callable[[], object]], float],
                 sampler: ClockSampler) -> None:
        self.timer, self.sampler = timer, sampler
        self.last: ClockWindow | None = None

    def __call__(self, fn: Callable[[], object]) -> float:
        self.last = None
        t0 = time.monotonic()
        ms = self.timer(fn)
        self.last = self.sampler.window(t0, time.monotonic())
        return ms


def nvidia_smi_id(index: int, visible: str | None) -> str:
    """nvidia-smi's ``--id`` of CUDA device ``index`` under ``CUDA_VISIBLE_DEVICES =
    visible`` (which renumbers the GPUs CUDA sees; nvidia-smi ignores it)."""
    if not visible:
        return str(index)
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    return ids[index] if index < len(ids) else str(index)


def start_sampler(device) -> ClockSampler | None:
    """A sampler of ``device`` (a CUDA ``torch.device``) when ``nvidia-smi`` is on the
    PATH, else None."""
    if device.type != "cuda" or shutil.which("nvidia-smi") is None:
        return None
    import torch

    from ..settings import cuda_visible_devices
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        return ClockSampler(nvidia_smi_id(index, cuda_visible_devices()))
    except OSError:
        return None


@contextmanager
def watched(timer: Callable[[Callable[[], object]], float], device, smoke: bool = False
            ) -> Iterator[Callable[[Callable[[], object]], float]]:
    """``timer`` watched by a sampler of ``device`` for the ``with`` block (``timer``
    itself in the smoke run or where nothing can be sampled)."""
    sampler = None if smoke else start_sampler(device)
    try:
        yield timer if sampler is None else WatchedTimer(timer, sampler)
    finally:
        if sampler is not None:
            sampler.close()


def window_fields(windows: Sequence[ClockWindow | None]) -> dict:
    """A record's clock fields from its rounds' windows (empty when none was sampled)."""
    got = None
    for w in windows:
        got = w if got is None else got.merge(w)
    if got is None:
        return {}
    return {"sm_mhz_min": got.mhz_min, "sm_mhz_max": got.mhz_max,
            "power_capped": got.capped}


def mhz_text(mhz_min: int | None, mhz_max: int | None, capped: bool | None) -> str:
    """The report's ``SM MHz`` cell: ``1980``, ``1170-1980 cap`` or ``—``."""
    if mhz_min is None or mhz_max is None:
        return "—"
    span = f"{mhz_min}" if mhz_min == mhz_max else f"{mhz_min}-{mhz_max}"
    return span + (" cap" if capped else "")


def _field(record, key: str):
    return record.get(key) if isinstance(record, dict) else getattr(record, key, None)


def clock_lines(records: Sequence) -> list[str]:
    """A report's paragraph on the clocks its timings ran at (empty when none was
    sampled): the SM clock range over every timing, and how many ran power-capped.
    ``records``: dataclass records or the serving suite's dicts."""
    seen = [(_field(r, "sm_mhz_min"), _field(r, "sm_mhz_max"), _field(r, "power_capped"))
            for r in records if _field(r, "sm_mhz_min") is not None]
    if not seen:
        return []
    lo = min(r[0] for r in seen)
    hi = max(r[1] for r in seen)
    capped = [r for r in seen if r[2]]
    if not capped:
        return [f"SM clock {lo}-{hi} MHz while timing; no power cap or slowdown was "
                "active (nvidia-smi, sampled every 100 ms).", ""]
    return [f"**The GPU ran power-capped** (or slowed down) in {len(capped)} of {len(seen)} "
            f"timed points: the SM clock went down to {min(r[0] for r in capped)} "
            f"MHz (range {lo}-{hi} over the run; nvidia-smi, sampled every 100 ms). A "
            "kernel's time follows the clock, so ratios from such a run carry that noise: "
            "see each provider's spread between rounds, and time again with more "
            "`--rounds`.", ""]


def print_clock_line(console, records: Sequence) -> None:
    """:func:`clock_lines`' paragraph on the console (rich), when there is one."""
    for line in clock_lines(records)[:1]:
        console.print(f"[yellow]clock:[/] {line.replace('**', '')}")
