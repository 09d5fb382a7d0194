"""The benchmark loop: inputs, reference, gate, timing, one :class:`Record` per point.

For each operator and sequence length the inputs are drawn fresh and the float64
reference computed once; then every provider is prepared (timed as compile time together
with its first call) and gated against the reference; the correct ones are then timed,
in interleaved rounds (``--rounds``). A failing provider never stops the run: its
exception becomes an ``error`` (or ``unsupported``) record and GPU memory is released
before the next one.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..ops import OpSpec
from .clocks import window_fields
from .gate import check
from .metrics import UNITS, fraction_of_ceiling, throughput
from .providers.base import NO_KERNEL_MARKERS, Provider, RunContext, Unsupported, UnsupportedError
from .record import Record
from .reference import reference_attention
from .timing import Ceilings, synchronize
from .workloads import make_inputs, smoke_variant


@dataclass(frozen=True, slots=True)
class Plan:
    """What to run: operators x sequence lengths x providers."""

    ops: tuple[OpSpec, ...]
    seqs: tuple[int, ...]
    providers: tuple[Provider, ...]

    @property
    def steps(self) -> int:
        """Number of (op, seq, provider) points."""
        return len(self.ops) * len(self.seqs) * len(self.providers)


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (messages from compilers run for pages)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def classify_failure(exc: BaseException) -> tuple[str, str]:
    """(status, reason) for an exception raised by a provider."""
    if isinstance(exc, (UnsupportedError, NotImplementedError)):
        return "unsupported", str(exc) or type(exc).__name__
    if isinstance(exc, RuntimeError) and any(m in str(exc) for m in NO_KERNEL_MARKERS):
        return "unsupported", first_line(exc)
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return "error", "out of memory: " + first_line(exc)
    return "error", first_line(exc)


def release_memory(device: torch.device, collect: bool = True) -> None:
    """Return cached GPU memory to the allocator; with ``collect``, first drop cyclic garbage
    (a full collection costs ~0.3 s with torch loaded, so it runs per point, not per call)."""
    if collect:
        gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _described(prepared) -> str:
    """The prepared note and what ``describe()`` adds (nothing if it fails: a note never
    fails a point)."""
    extra, describe = "", getattr(prepared, "describe", None)   # a backward Step has none
    if describe is not None:
        try:
            extra = describe()
        except Exception:  # noqa: BLE001 - the note is a courtesy, the record stands
            extra = ""
    return "; ".join(x for x in (prepared.note, extra) if x)


@dataclass(frozen=True, slots=True)
class Ready:
    """A provider prepared, its first output gated and right: what its timing needs."""

    prepared: object
    compile_ms: float
    error: float
    note: str


def ready_point(make: Callable[..., object], prepare: Callable[[], object],
                gate: Callable[[object], object], device: torch.device):
    """``prepare()`` and the first call (cold, timed together as the compile time), then
    the first output gated (``gate(out)``): a :class:`Ready`, or the point's final record
    (``make(**fields)``) when it is unsupported, wrong or fails -- every fault a record,
    never a raise."""
    note = ""
    try:
        t0 = time.perf_counter()
        prepared = prepare()
        if isinstance(prepared, Unsupported):
            return make(status="unsupported", reason=prepared.reason)
        note = prepared.note
        out = prepared.fn()
        synchronize(device)
        compile_ms = (time.perf_counter() - t0) * 1e3
        result = gate(out)
        del out
        note = _described(prepared)
    except Exception as exc:  # noqa: BLE001 - any provider fault becomes a record
        status, reason = classify_failure(exc)
        return make(status=status, reason=reason, note=note)
    if not result.passed:
        return make(status="wrong", compile_ms=compile_ms, error=result.error,
                    reason=result.reason, note=note)
    return Ready(prepared, compile_ms, result.error, note)


def timed_record(make: Callable[..., object], ready: Ready, times: list[float],
                 rate: Callable[[float], tuple[float, float | None]], **extra):
    """The record of a :class:`Ready` point timed ``times`` (ms; their median counts)."""
    ms = statistics.median(times)
    value, share = rate(ms)
    return make(status="ok", ms=ms, compile_ms=ready.compile_ms, error=ready.error,
                throughput=value, fraction_of_ceiling=share, note=ready.note, **extra)


def timing_failed(make: Callable[..., object], ready: Ready, exc: BaseException):
    """The record of a :class:`Ready` point whose timing raised ``exc``."""
    status, reason = classify_failure(exc)
    return make(status=status, compile_ms=ready.compile_ms, error=ready.error,
                reason="while timing: " + reason, note=ready.note)


@dataclass(frozen=True, slots=True)
class Point:
    """One provider at one benchmark point, as :func:`measure_points` takes it:
    ``prepare()`` gives the prepared call, ``gate(out)`` judges its first output,
    ``rate(ms)`` gives the throughput and its share of the ceiling, ``make(**fields)``
    builds the record; ``label`` is what the progress display says while preparing."""

    label: str
    make: Callable[..., object]
    prepare: Callable[[], object]
    gate: Callable[[object], object]
    rate: Callable[[float], tuple[float, float | None]]


def measure_points(points, timer, device: torch.device, rounds: int = 1,
                   on_start: Callable[[str], None] = lambda desc: None,
                   title: str = "") -> list:
    """The providers of one benchmark point, a record each, in order; never raises for
    provider faults. Each is prepared and gated first (:func:`ready_point`); then the
    right ones are timed in ``rounds`` rounds, one ``timer`` call each per round, the
    order turned by one each round (``p0 p1 p2``, ``p1 p2 p0``, ...), so a drift of the
    GPU's speed over the point (clocks, temperature: cuDNN's own time moved 2-4 %
    between back-to-back runs on the H100, 2026-12-05) reaches every provider alike;
    the median of its rounds is a provider's time and ``ms_spread`` their (max - min)
    / median (with more than one round). A :class:`~.clocks.WatchedTimer` adds the SM
    clock range of the provider's rounds and whether the power cap was active."""
    out: list = []
    for p in points:
        on_start(p.label)
        got = ready_point(p.make, p.prepare, p.gate, device)
        if not isinstance(got, Ready):   # a record (some suites build theirs as dicts)
            status = got["status"] if isinstance(got, dict) else got.status
            release_memory(device, collect=status == "error")
        out.append(got)
    times: dict[int, list[float]] = {i: [] for i, r in enumerate(out) if isinstance(r, Ready)}
    clocks: dict[int, list] = {i: [] for i in times}   # a WatchedTimer's windows
    order = list(times)
    for r in range(rounds if order else 0):
        if rounds > 1:
            on_start(f"{title}: timing, round {r + 1} of {rounds}")
        for i in order[r % len(order):] + order[:r % len(order)]:
            if i not in times:   # failed in an earlier round
                continue
            try:
                times[i].append(timer(out[i].prepared.fn))
                clocks[i].append(getattr(timer, "last", None))
            except Exception as exc:  # noqa: BLE001
                out[i] = timing_failed(points[i].make, out[i], exc)
                del times[i]
                release_memory(device)
    for i, ms in times.items():
        extra = {"ms_spread": (max(ms) - min(ms)) / statistics.median(ms)} \
            if len(ms) > 1 else {}
        extra.update(window_fields(clocks[i]))
        out[i] = timed_record(points[i].make, out[i], ms, points[i].rate, **extra)
    return out


def measure_point(make: Callable[..., object], prepare: Callable[[], object],
                  gate: Callable[[object], object], timer, device: torch.device,
                  rate: Callable[[float], tuple[float, float | None]]):
    """One provider at one point, timed once (:func:`measure_points`)."""
    return measure_points([Point("", make, prepare, gate, rate)], timer, device)[0]


def run_point(provider: Provider, op: OpSpec, seq: int, q: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor, ref: torch.Tensor, ctx: RunContext, ceilings: Ceilings) -> Record:
    """Prepare, gate and time one provider on one point; never raises for provider faults."""
    return run_providers((provider,), op, seq, q, k, v, ref, ctx, ceilings)[0]


def run_providers(providers, op: OpSpec, seq: int, q: torch.Tensor, k: torch.Tensor,
                  v: torch.Tensor, ref: torch.Tensor, ctx: RunContext, ceilings: Ceilings,
                  rounds: int = 1, on_start: Callable[[str], None] = lambda desc: None
                  ) -> list[Record]:
    """Every provider on one attention point, timed in ``rounds`` interleaved rounds
    (:func:`measure_points`)."""
    def make_of(provider):
        base = dict(op=op.name, phase=op.phase, seq=seq, provider=provider.name,
                    group=provider.group, unit=UNITS[op.phase])
        return lambda **f: Record(**base, **f)

    def rate(ms: float) -> tuple[float, float | None]:
        value = throughput(op, seq, ms, ctx.dtype.itemsize)
        return value, fraction_of_ceiling(op.phase, value, ceilings.matmul_tflops,
                                          ceilings.copy_tbps)
    points = [Point(f"{op.name} S={seq}: {p.name}", make_of(p),
                    lambda p=p: p.prepare(op, q, k, v, ctx),
                    lambda o: check(o, ref, ctx.dtype), rate) for p in providers]
    return measure_points(points, ctx.timer, ctx.device, rounds, on_start,
                          f"{op.name} S={seq}")


def run_plan(plan: Plan, ctx: RunContext, ceilings: Ceilings,
             on_start: Callable[[str], None] = lambda desc: None,
             on_record: Callable[[Record], None] = lambda rec: None,
             rounds: int = 1) -> list[Record]:
    """Run every point of ``plan``, its providers timed in ``rounds`` interleaved rounds
    (:func:`run_providers`); ``on_start``/``on_record`` drive a progress display."""
    records: list[Record] = []
    for full_op in plan.ops:
        op = smoke_variant(full_op) if ctx.smoke else full_op
        for seq in plan.seqs:
            on_start(f"{op.name} S={seq}: inputs and float64 reference")
            try:
                q, k, v = make_inputs(op, seq, ctx.dtype, ctx.device)
                ref = reference_attention(op, q, k, v)
            except Exception as exc:  # noqa: BLE001 - e.g. out of memory at S = 32768
                _, reason = classify_failure(exc)
                release_memory(ctx.device)
                for p in plan.providers:
                    rec = Record(op=op.name, phase=op.phase, seq=seq, provider=p.name,
                                 group=p.group, status="error", unit=UNITS[op.phase],
                                 reason="inputs/reference failed: " + reason)
                    records.append(rec)
                    on_record(rec)
                continue
            for rec in run_providers(plan.providers, op, seq, q, k, v, ref, ctx, ceilings,
                                     rounds, on_start):
                records.append(rec)
                on_record(rec)
            del q, k, v, ref
            release_memory(ctx.device)
    return records

