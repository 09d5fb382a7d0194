"""The benchmark's workloads of the ten operators: batch, smoke sizes, inputs, work counts.

The operators themselves -- heads, causal, ALiBi, soft-cap, window, head dim and the score
semantics every provider implements -- are :data:`neptune_fusion.ops.OPERATORS`; this
module adds only what a benchmark run needs: the batch (1), the CPU smoke run's smaller
variants, seeded inputs, the keyword arguments of the harness's entry point, and the FLOP
and byte counts behind the throughput columns.
"""

from __future__ import annotations

import dataclasses
import zlib

import torch

from ..ops import OPERATORS, OpSpec, operator

BATCH = 1
SMOKE_HEAD_DIVISOR = 8
SMOKE_WINDOW = 32


def operator_names() -> tuple[str, ...]:
    """Names of the ten operators, in table order."""
    return tuple(OPERATORS)


def select_operators(names: list[str] | None) -> tuple[OpSpec, ...]:
    """The operators named (case-insensitive), in table order; all of them for None."""
    if not names:
        return tuple(OPERATORS.values())
    unknown = []
    wanted = set()
    for n in names:
        try:
            wanted.add(operator(n).name)
        except ValueError:
            unknown.append(n)
    if unknown:
        raise ValueError(f"unknown operator(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(operator_names())}")
    return tuple(op for op in OPERATORS.values() if op.name in wanted)


def smoke_variant(op: OpSpec) -> OpSpec:
    """A tiny version for the CPU smoke run: heads / 8 (same GQA ratio), window 32."""
    window = None if op.window is None else min(op.window, SMOKE_WINDOW)
    return dataclasses.replace(op, q_heads=max(1, op.q_heads // SMOKE_HEAD_DIVISOR),
                               kv_heads=max(1, op.kv_heads // SMOKE_HEAD_DIVISOR),
                               window=window)


def attention_options(op: OpSpec, seq: int, device: torch.device | str = "cpu") -> dict:
    """The keyword arguments of :func:`neptune_fusion.ops.attention` for ``op`` at key
    length ``seq`` (scale, causal, query start, ALiBi slopes on ``device``, soft-cap,
    window)."""
    return dict(scale=op.scale, causal=op.causal, q_start=op.q_start(seq),
                alibi_slopes=op.alibi_slopes(device), softcap=op.softcap, window=op.window)


def visited_pairs(op: OpSpec, seq: int) -> int:
    """Exact number of (query, key) pairs a prefill operator with a sliding window visits."""
    if op.window is None:
        raise ValueError(f"{op.name}: visited_pairs is only used for windowed operators")
    w = op.window
    if seq <= w:
        return seq * (seq + 1) // 2
    return w * (w + 1) // 2 + (seq - w) * w


def prefill_flops(op: OpSpec, seq: int) -> int:
    """FLOP of a prefill operator: 4 H S^2 D, halved for causal, exact pair count for a window."""
    if op.phase != "PF":
        raise ValueError(f"{op.name}: FLOP counts are reported for prefill operators only")
    per_pair = 4 * BATCH * op.q_heads * op.head_dim
    if op.window is not None:
        return per_pair * visited_pairs(op, seq)
    full = per_pair * seq * seq
    return full // 2 if op.causal else full


def decode_bytes(op: OpSpec, seq: int, elem_size: int) -> int:
    """Bytes a decode operator must read: K and V once, 2 Hkv S D elem_size."""
    if op.phase != "DC":
        raise ValueError(f"{op.name}: byte counts are reported for decode operators only")
    return 2 * BATCH * op.kv_heads * seq * op.head_dim * elem_size


def input_seed(op: OpSpec, seq: int) -> int:
    """A stable seed per (operator, sequence length), independent of run order."""
    return zlib.crc32(f"{op.name}/{seq}".encode())


def make_inputs(op: OpSpec, seq: int, dtype: torch.dtype,
                device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh N(0, 1) q, k, v in layout (B, H, S, D): q (B, Hq, Sq, D), k and v (B, Hkv, S, D)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(input_seed(op, seq))

    def randn(heads: int, length: int) -> torch.Tensor:
        shape = (BATCH, heads, length, op.head_dim)
        return torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(dtype)

    return randn(op.q_heads, op.q_len(seq)), randn(op.kv_heads, seq), randn(op.kv_heads, seq)
