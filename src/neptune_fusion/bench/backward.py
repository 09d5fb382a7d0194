"""The backward suite's workload (``neptune-fusion bench --backward``): inputs and the
output cotangent, the float64 autograd reference, the gradient gate, the work counted.

Each point is one operator at one key length. Inputs are the forward suite's seeded
q, k, v (:func:`.workloads.make_inputs`) plus a seeded N(0, 1) cotangent ``dout``; a
provider computes ``o = attention(q, k, v)`` and ``o.backward(dout)``. The reference is
torch autograd of the float64 reference attention (:func:`.reference.block_attention`,
one query head and one block of query rows at a time, the kv head's gradients summed over
its query heads and row blocks), on the inputs' device.

Gate (docs/benchmarks.md, "The backward suite"): the relative Frobenius error of each of
dq, dk, dv against float64, the worst counting, must be within :func:`bound`: the
dtype's gradient tolerance (:data:`GRAD_THRESHOLDS`) for every provider; neptune-fusion
passes also when it is within :data:`FLEX_FACTOR` times FlexAttention's own error at the
point (when FlexAttention ran). The output is gated as the forward suite gates it.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass

import torch

from ..ops import OpSpec
from .gate import relative_error, threshold_for
from .reference import block_attention, row_block
from .workloads import make_inputs, prefill_flops, smoke_variant

DEFAULT_OPS = ("PF-Causal", "PF-GQA", "PF-SoftCap", "PF-Window")
DEFAULT_SEQS = (4096, 16384)
SMOKE_SEQS = (64,)
SMOKE_HEAD_DIM = 32
PROVIDERS = ("flex", "sdpa", "neptune")   # run in this order: flex's error feeds our gate
GRAD_THRESHOLDS: dict[torch.dtype, float] = {
    torch.float16: 1e-2,
    torch.bfloat16: 5e-2,
    torch.float32: 1e-3,
}
FLEX_FACTOR = 2.0
# fwd + bwd FLOP = 3.5 x the forward's: the backward's five pair products (s, dp, dv,
# dq, dk) against the forward's two (s, o), as FlashAttention's benchmarks count.
FWD_BWD_FACTOR = 3.5
# Reference on every head while (query heads x S^2) stays within this many score
# elements (at most a few seconds of float64 work on an H200); beyond it, on the first
# and the last kv head (with their query heads): dq, dk, dv compared on those heads.
REFERENCE_BUDGET = 1 << 32


def grad_threshold(dtype: torch.dtype) -> float:
    """The relative-error tolerance of gradients for inputs of ``dtype``."""
    return threshold_for(dtype, GRAD_THRESHOLDS, "gradient")


def bound(dtype: torch.dtype, flex_error: float | None, provider: str) -> float:
    """The largest gradient error ``provider`` may show: the dtype's tolerance, and for
    neptune-fusion at least :data:`FLEX_FACTOR` x FlexAttention's error at the point."""
    tol = grad_threshold(dtype)
    if provider == "neptune" and flex_error is not None:
        return max(FLEX_FACTOR * flex_error, tol)
    return tol


def select_operators(names: list[str] | None) -> tuple[OpSpec, ...]:
    """The prefill operators named (default :data:`DEFAULT_OPS`), in table order."""
    from .workloads import select_operators as select
    ops = select(list(names) if names else list(DEFAULT_OPS))
    decode = [op.name for op in ops if op.phase != "PF"]
    if decode:
        raise ValueError(f"--backward takes prefill operators; {', '.join(decode)} "
                         "is decode")
    return ops


def smoke_op(op: OpSpec) -> OpSpec:
    """The CPU smoke run's variant: the forward suite's (heads / 8, window 32) with head
    dim :data:`SMOKE_HEAD_DIM`."""
    return dataclasses.replace(smoke_variant(op), head_dim=SMOKE_HEAD_DIM)


@dataclass(frozen=True, slots=True)
class Inputs:
    """One point's leaves (``q, k, v``, requiring grad) and the cotangent ``dout``."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor

    @property
    def leaves(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.q, self.k, self.v

    def clear_grads(self) -> None:
        for t in self.leaves:
            t.grad = None


def make_grad_inputs(op: OpSpec, seq: int, dtype: torch.dtype,
                     device: torch.device | str) -> Inputs:
    """The forward suite's seeded q, k, v as leaves requiring grad, and a seeded N(0, 1)
    ``dout`` shaped like the output."""
    q, k, v = (t.requires_grad_() for t in make_inputs(op, seq, dtype, device))
    gen = torch.Generator(device=device)
    gen.manual_seed(zlib.crc32(f"{op.name}/{seq}/dout".encode()))
    dout = torch.randn(q.shape, generator=gen, dtype=torch.float32, device=device).to(dtype)
    return Inputs(q, k, v, dout)


def gate_kv_heads(op: OpSpec, seq: int) -> tuple[int, ...]:
    """The kv heads the reference covers (every one within :data:`REFERENCE_BUDGET`)."""
    if op.q_heads * seq * seq <= REFERENCE_BUDGET or op.kv_heads <= 2:
        return tuple(range(op.kv_heads))
    return (0, op.kv_heads - 1)


@dataclass(frozen=True, slots=True)
class Reference:
    """Float64 ``o, dq`` on ``q_heads`` and ``dk, dv`` on ``kv_heads`` (head axis 1 holds
    the listed heads, in order)."""

    kv_heads: tuple[int, ...]
    q_heads: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]   # the full o, dq, dk, dv a provider returns
    o: torch.Tensor
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor


def query_heads(op: OpSpec, kv_heads: tuple[int, ...]) -> tuple[int, ...]:
    """The query heads reading the kv heads given (GQA: ``h // group``)."""
    return tuple(hk * op.group + g for hk in kv_heads for g in range(op.group))


def reference_gradients(op: OpSpec, x: Inputs, kv_heads: tuple[int, ...] | None = None
                        ) -> Reference:
    """Float64 autograd of the reference attention on ``x`` for ``kv_heads`` (default:
    :func:`gate_kv_heads`) and their query heads, one head and row block at a time."""
    q, k, v, dout = (t.detach() for t in (*x.leaves, x.dout))
    batch, _, q_len, _ = q.shape
    seq = k.shape[2]
    kv_heads = gate_kv_heads(op, seq) if kv_heads is None else tuple(kv_heads)
    heads = query_heads(op, kv_heads)
    f64 = dict(dtype=torch.float64, device=q.device)
    o = torch.empty((batch, len(heads), q_len, v.shape[3]), **f64)
    dq = torch.empty((batch, len(heads), q_len, q.shape[3]), **f64)
    dk = torch.zeros((batch, len(kv_heads), seq, k.shape[3]), **f64)
    dv = torch.zeros((batch, len(kv_heads), seq, v.shape[3]), **f64)
    block = row_block(batch, seq)
    with torch.enable_grad():
        for slot, h in enumerate(heads):
            kslot = slot // op.group
            kh = k[:, h // op.group].to(torch.float64).requires_grad_()
            vh = v[:, h // op.group].to(torch.float64).requires_grad_()
            for r0 in range(0, q_len, block):
                r1 = min(q_len, r0 + block)
                qb = q[:, h, r0:r1].to(torch.float64).requires_grad_()
                ob = block_attention(op, qb, kh, vh, h, (r0, r1))
                gq, gk, gv = torch.autograd.grad(ob, (qb, kh, vh),
                                                 dout[:, h, r0:r1].to(torch.float64))
                o[:, slot, r0:r1] = ob.detach()
                dq[:, slot, r0:r1] = gq
                dk[:, kslot] += gk
                dv[:, kslot] += gv
                del ob, gq, gk, gv, qb
    shapes = (tuple(q.shape[:3]) + (v.shape[3],), tuple(q.shape), tuple(k.shape),
              tuple(v.shape))
    return Reference(kv_heads, heads, shapes, o, dq, dk, dv)


@dataclass(frozen=True, slots=True)
class GradGate:
    """The gate's verdict on one provider: errors of o, dq, dk, dv, the bound applied."""

    passed: bool
    error: float | None          # the worst of dq, dk, dv
    errors: dict
    bound: float
    reason: str = ""


def check_gradients(got: object, ref: Reference, dtype: torch.dtype,
                    grad_bound: float) -> GradGate:
    """Gate ``got = (o, dq, dk, dv)`` (full tensors) against ``ref`` on its heads."""
    errors: dict = {"out_error": None, "dq_error": None, "dk_error": None, "dv_error": None}
    if not (isinstance(got, tuple) and len(got) == 4):
        return GradGate(False, None, errors, grad_bound,
                        "provider returned no (o, dq, dk, dv)")
    names = ("o", "dq", "dk", "dv")
    for name, t in zip(names, got):
        if not isinstance(t, torch.Tensor):
            return GradGate(False, None, errors, grad_bound,
                            f"no {name} (a {type(t).__name__}: did a leaf get no gradient?)")
    o, dq, dk, dv = got
    pairs = ((o, ref.o, ref.q_heads), (dq, ref.dq, ref.q_heads), (dk, ref.dk, ref.kv_heads),
             (dv, ref.dv, ref.kv_heads))
    for name, (t, want, heads), shape in zip(names, pairs, ref.shapes):
        if tuple(t.shape) != shape:
            return GradGate(False, None, errors, grad_bound,
                            f"{name} shape {tuple(t.shape)} != {shape}")
        key = "out_error" if name == "o" else f"{name}_error"
        errors[key] = relative_error(t.detach()[:, list(heads)], want)
    worst = max(errors["dq_error"], errors["dk_error"], errors["dv_error"])
    out_limit = threshold_for(dtype)
    if errors["out_error"] > out_limit:
        return GradGate(False, worst, errors, grad_bound,
                        f"output relative error {errors['out_error']:.3g} exceeds "
                        f"{out_limit:g} ({dtype})")
    if worst > grad_bound:
        which = max(("dq", "dk", "dv"), key=lambda n: errors[f"{n}_error"])
        return GradGate(False, worst, errors, grad_bound,
                        f"{which} relative error {worst:.3g} exceeds {grad_bound:.3g} "
                        f"({dtype})")
    return GradGate(True, worst, errors, grad_bound)


def fwd_bwd_flops(op: OpSpec, seq: int) -> float:
    """FLOP of forward + backward: :data:`FWD_BWD_FACTOR` x the forward's count."""
    return FWD_BWD_FACTOR * prefill_flops(op, seq)


__all__ = ["DEFAULT_OPS", "DEFAULT_SEQS", "GRAD_THRESHOLDS", "Inputs", "Reference", "bound",
           "check_gradients", "fwd_bwd_flops", "gate_kv_heads", "make_grad_inputs",
           "reference_gradients", "select_operators", "smoke_op"]
