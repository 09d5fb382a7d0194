"""The ten attention operators of BENCHMARKS.md as plain data, with inputs and workload sizes.

Every operator has batch 1, head dim 128 and scale 1/sqrt(128). Prefill (``PF``) has query
length = key length = S; decode (``DC``) has one query at absolute position S - 1, so a
causal decode query sees every key and needs no mask.

Score semantics shared by the reference and every provider, for query row ``i`` (absolute
position) and key ``j``::

    s = scale * q_i . k_j
    s = cap * tanh(s / cap)                 # soft-cap, when ``softcap`` is set
    s = s + slope_h * (j - i)               # ALiBi, slope_h = 2^(-8 (h + 1) / H)
    s = -inf where j > i (causal) or i - j >= window (sliding window)
    out_i = softmax_j(s) @ v
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from dataclasses import dataclass
from typing import Literal

import torch

Phase = Literal["PF", "DC"]

HEAD_DIM = 128
BATCH = 1
SMOKE_HEAD_DIVISOR = 8
SMOKE_WINDOW = 32


@dataclass(frozen=True, slots=True)
class Operator:
    """One benchmark operator: attention of a given phase, head layout and score variant."""

    name: str
    phase: Phase
    q_heads: int
    kv_heads: int
    causal: bool
    alibi: bool = False
    softcap: float | None = None
    window: int | None = None
    batch: int = BATCH
    head_dim: int = HEAD_DIM

    def __post_init__(self) -> None:
        if self.phase not in ("PF", "DC"):
            raise ValueError(f"{self.name}: phase must be 'PF' or 'DC', got {self.phase!r}")
        if self.q_heads % self.kv_heads:
            raise ValueError(f"{self.name}: q_heads {self.q_heads} is not a multiple of "
                             f"kv_heads {self.kv_heads}")
        if self.window is not None and not self.causal:
            raise ValueError(f"{self.name}: a sliding window is only defined for causal attention")

    @property
    def scale(self) -> float:
        """Softmax scale 1/sqrt(head_dim)."""
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def group(self) -> int:
        """Query heads per kv head (1 without GQA); kv head of query head h is h // group."""
        return self.q_heads // self.kv_heads

    def q_len(self, seq: int) -> int:
        """Number of query rows at key length ``seq``."""
        return seq if self.phase == "PF" else 1

    def q_start(self, seq: int) -> int:
        """Absolute position of the first query row."""
        return 0 if self.phase == "PF" else seq - 1

    def needs_mask(self, seq: int) -> bool:
        """True when some (i, j) pair is masked out (decode at S - 1 sees every key)."""
        if self.window is not None and self.window < seq:
            return True
        return self.causal and self.phase == "PF" and seq > 1

    def alibi_slopes(self, device: torch.device | str = "cpu") -> torch.Tensor | None:
        """Per-query-head ALiBi slopes 2^(-8 (h + 1) / H) in float32, or None."""
        if not self.alibi:
            return None
        h = torch.arange(1, self.q_heads + 1, dtype=torch.float64, device=device)
        return torch.exp2(-8.0 * h / self.q_heads).to(torch.float32)


OPERATORS: tuple[Operator, ...] = (
    Operator("PF-Global", "PF", 32, 32, causal=False),
    Operator("PF-Causal", "PF", 32, 32, causal=True),
    Operator("PF-GQA", "PF", 64, 8, causal=True),
    Operator("PF-ALiBi", "PF", 32, 32, causal=True, alibi=True),
    Operator("PF-SoftCap", "PF", 32, 16, causal=True, softcap=50.0),
    Operator("PF-Window", "PF", 32, 8, causal=True, softcap=50.0, window=4096),
    Operator("DC-Causal", "DC", 32, 32, causal=True),
    Operator("DC-GQA", "DC", 64, 8, causal=True),
    Operator("DC-ALiBi", "DC", 32, 32, causal=True, alibi=True),
    Operator("DC-SoftCap", "DC", 32, 16, causal=True, softcap=50.0),
)


def operator_names() -> tuple[str, ...]:
    """Names of the ten operators, in table order."""
    return tuple(op.name for op in OPERATORS)


def select_operators(names: list[str] | None) -> tuple[Operator, ...]:
    """The operators named (case-insensitive), in table order; all of them for None."""
    if not names:
        return OPERATORS
    by_name = {op.name.lower(): op for op in OPERATORS}
    unknown = [n for n in names if n.lower() not in by_name]
    if unknown:
        raise ValueError(f"unknown operator(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(operator_names())}")
    wanted = {n.lower() for n in names}
    return tuple(op for op in OPERATORS if op.name.lower() in wanted)


def smoke_variant(op: Operator) -> Operator:
    """A tiny version for the CPU smoke run: heads / 8 (same GQA ratio), window 32."""
    window = None if op.window is None else min(op.window, SMOKE_WINDOW)
    return dataclasses.replace(op, q_heads=max(1, op.q_heads // SMOKE_HEAD_DIVISOR),
                               kv_heads=max(1, op.kv_heads // SMOKE_HEAD_DIVISOR),
                               window=window)


def visited_pairs(op: Operator, seq: int) -> int:
    """Exact number of (query, key) pairs a prefill operator with a sliding window visits."""
    if op.window is None:
        raise ValueError(f"{op.name}: visited_pairs is only used for windowed operators")
    w = op.window
    if seq <= w:
        return seq * (seq + 1) // 2
    return w * (w + 1) // 2 + (seq - w) * w


def prefill_flops(op: Operator, seq: int) -> int:
    """FLOP of a prefill operator: 4 H S^2 D, halved for causal, exact pair count for a window."""
    if op.phase != "PF":
        raise ValueError(f"{op.name}: FLOP counts are reported for prefill operators only")
    per_pair = 4 * op.batch * op.q_heads * op.head_dim
    if op.window is not None:
        return per_pair * visited_pairs(op, seq)
    full = per_pair * seq * seq
    return full // 2 if op.causal else full


def decode_bytes(op: Operator, seq: int, elem_size: int) -> int:
    """Bytes a decode operator must read: K and V once, 2 Hkv S D elem_size."""
    if op.phase != "DC":
        raise ValueError(f"{op.name}: byte counts are reported for decode operators only")
    return 2 * op.batch * op.kv_heads * seq * op.head_dim * elem_size


def input_seed(op: Operator, seq: int) -> int:
    """A stable seed per (operator, sequence length), independent of run order."""
    return zlib.crc32(f"{op.name}/{seq}".encode())


def make_inputs(op: Operator, seq: int, dtype: torch.dtype,
                device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh N(0, 1) q, k, v in layout (B, H, S, D): q (B, Hq, Sq, D), k and v (B, Hkv, S, D)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(input_seed(op, seq))

    def randn(heads: int, length: int) -> torch.Tensor:
        shape = (op.batch, heads, length, op.head_dim)
        return torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(dtype)

    return randn(op.q_heads, op.q_len(seq)), randn(op.kv_heads, seq), randn(op.kv_heads, seq)
