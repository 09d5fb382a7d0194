"""The chain suite's loop: chains x dtypes x providers, one :class:`ChainRecord` each.

Per (chain, dtype) the inputs are drawn fresh and the float64 reference computed once;
each provider is prepared and called once (timed together: the cold compile time), every
output gated against float64, and only a correct provider is timed. Any fault of a
provider (a chain neptune-fusion cannot compile yet, out of memory) becomes a record with
the error's first line; the run goes on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields

import torch

from .chains import Chain, Sizes, as_outputs, make_inputs, reference
from .gate import GateResult, check
from .providers.base import RunContext
from .providers.chains import ChainProvider, dtype_name
from .record import Checked, Status
from .runner import Point, classify_failure, measure_points, release_memory
from .timing import Ceilings

TF32_THRESHOLD = 5e-3
"""float32 gate of the chains with a projection: TF32 tensor cores round both operands to
10 mantissa bits (about 1e-3 relative error at K = 4096, both sides alike)."""
CHAIN_THRESHOLDS: dict[torch.dtype, float] = {torch.float32: 1e-3, torch.bfloat16: 2e-2}
UNITS = {"memory": "TB/s", "compute": "TFLOP/s"}


def chain_threshold(chain: Chain, dtype: torch.dtype) -> float:
    """The relative-error bound of ``chain``'s outputs at input ``dtype``."""
    if dtype not in CHAIN_THRESHOLDS:
        raise ValueError(f"chain suite: dtype {dtype} is not one of "
                         f"{', '.join(map(dtype_name, CHAIN_THRESHOLDS))}")
    if chain.contraction and dtype == torch.float32:
        return TF32_THRESHOLD
    return CHAIN_THRESHOLDS[dtype]


@dataclass(frozen=True, slots=True)
class ChainRecord(Checked):
    """One (chain, dtype, provider) point; fields documented in docs/benchmarks.md."""

    chain: str
    dtype: str
    sizes: dict
    single_pass: bool
    bound: str
    provider: str
    group: str
    status: Status
    ms: float | None = None
    compile_ms: float | None = None
    error: float | None = None
    threshold: float | None = None
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


CHAIN_RECORD_KEYS: tuple[str, ...] = tuple(f.name for f in fields(ChainRecord))


def gate_outputs(out: object, ref: Sequence[torch.Tensor], dtype: torch.dtype,
                 threshold: float) -> GateResult:
    """Every output against its float64 reference; the worst one decides."""
    outs = as_outputs(out)
    if len(outs) != len(ref):
        return GateResult(False, None, f"{len(outs)} output(s), the reference has {len(ref)}")
    worst = GateResult(True, 0.0)
    for k, (o, r) in enumerate(zip(outs, ref)):
        g = check(o, r, dtype)
        if g.error is not None and g.error > threshold:
            g = GateResult(False, g.error, f"relative error {g.error:.3g} exceeds "
                                           f"{threshold:g} ({dtype_name(dtype)})")
        elif g.error is not None:
            g = GateResult(True, g.error)
        if not g.passed:
            prefix = f"output {k}: " if len(ref) > 1 else ""
            return GateResult(False, g.error, prefix + g.reason)
        worst = GateResult(True, max(worst.error or 0.0, g.error or 0.0))
    return worst


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """TF32 matmuls for torch while the block runs (neptune-fusion gets
    ``fp32_precision="tf32"`` for the same chains: providers/chains.py)."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled or old
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def rate(chain: Chain, sizes: Sizes, ms: float, elem_size: int) -> float:
    """TB/s of the bytes moved once (memory-bound) or TFLOP/s (compute-bound)."""
    if ms <= 0:
        raise ValueError(f"rate: time must be positive, got {ms} ms")
    work = chain.bytes_moved(sizes, elem_size) if chain.bound == "memory" \
        else chain.flops(sizes)
    return work / (ms * 1e-3) / 1e12


def chain_points(providers: Sequence[ChainProvider], chain: Chain, sizes: Sizes,
                 tensors: Sequence[torch.Tensor], ref: Sequence[torch.Tensor],
                 ctx: RunContext, ceilings: Ceilings) -> list[Point]:
    """Each provider on one chain as a :class:`~.runner.Point`: prepared cold, gated,
    rated by the chain's bytes or FLOPs."""
    limit = chain_threshold(chain, ctx.dtype)

    def make_of(provider):
        base = dict(chain=chain.name, dtype=dtype_name(ctx.dtype), sizes=dict(sizes),
                    single_pass=chain.single_pass, bound=chain.bound,
                    provider=provider.name, group=provider.group, threshold=limit,
                    unit=UNITS[chain.bound])
        return lambda **f: ChainRecord(**base, **f)

    def rated(ms: float) -> tuple[float, float | None]:
        value = rate(chain, sizes, ms, ctx.dtype.itemsize)
        ceiling = ceilings.copy_tbps if chain.bound == "memory" else ceilings.matmul_tflops
        return value, value / ceiling if ceiling else None
    return [Point(f"{chain.name} {dtype_name(ctx.dtype)}: {p.name}", make_of(p),
                  lambda p=p: p.prepare(chain, tensors, ctx),
                  lambda out: gate_outputs(out, ref, ctx.dtype, limit), rated)
            for p in providers]


def run_chains(chains: Sequence[Chain], dtypes: Sequence[torch.dtype],
               providers: Sequence[ChainProvider], ctx: RunContext, ceilings: Ceilings,
               on_start: Callable[[str], None] = lambda desc: None,
               on_record: Callable[[ChainRecord], None] = lambda rec: None,
               rounds: int = 1) -> list[ChainRecord]:
    """Every (chain, dtype, provider) point, in that order; each (chain, dtype)'s
    providers timed in ``rounds`` interleaved rounds (:func:`~.runner.measure_points`)."""
    records: list[ChainRecord] = []
    for chain in chains:
        sizes = chain.smoke if ctx.smoke else chain.sizes
        for dtype in dtypes:
            dctx = RunContext(ctx.device, dtype, ctx.timer, ctx.smoke)
            on_start(f"{chain.name} {dtype_name(dtype)}: inputs and float64 reference")
            try:
                tensors = make_inputs(chain, sizes, dtype, ctx.device)
                ref = reference(chain, tensors)
            except Exception as exc:  # noqa: BLE001 - e.g. out of memory
                _, reason = classify_failure(exc)
                release_memory(ctx.device)
                for p in providers:
                    rec = ChainRecord(chain=chain.name, dtype=dtype_name(dtype),
                                      sizes=dict(sizes), single_pass=chain.single_pass,
                                      bound=chain.bound, provider=p.name, group=p.group,
                                      status="error", unit=UNITS[chain.bound],
                                      reason="inputs/reference failed: " + reason)
                    records.append(rec)
                    on_record(rec)
                continue
            with tf32(chain.contraction and dtype == torch.float32):
                points = chain_points(providers, chain, sizes, tensors, ref, dctx, ceilings)
                for rec in measure_points(points, dctx.timer, ctx.device, rounds, on_start,
                                          f"{chain.name} {dtype_name(dtype)}"):
                    records.append(rec)
                    on_record(rec)
            del tensors, ref
            release_memory(ctx.device)
    return records
