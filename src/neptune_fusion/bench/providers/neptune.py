"""neptune-fusion's own kernels, through the harness's entry point
:func:`neptune_fusion.ops.attention` (semantics of :mod:`neptune_fusion.ops`)::

    attention(q, k, v, *, scale: float, causal: bool, q_start: int = 0,
              alibi_slopes: torch.Tensor | None = None,   # (Hq,) float32
              softcap: float | None = None,
              window: int | None = None) -> torch.Tensor   # (B, Hq, Sq, D), q.dtype

q is (B, Hq, Sq, D), k and v (B, Hkv, S, D) with Hq a multiple of Hkv (GQA: kv head
h // (Hq / Hkv)); ``q_start`` is the absolute position of query row 0 (S - 1 in decode).
The first call may compile and tune (timed as compile time). Raising
``NotImplementedError`` marks the operator unsupported with the exception's message.
"""

from __future__ import annotations

import torch

from ...ops import OpSpec, attention
from ...ops import prepare as prepare_call
from ..workloads import attention_options
from .base import Prepared, Provider, RunContext, Unsupported

ENTRY_POINT = "neptune_fusion.ops.attention"


def prepare(op: OpSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            ctx: RunContext) -> Prepared | Unsupported:
    """Bind the operator's options to neptune-fusion's attention entry point."""
    options = attention_options(op, k.shape[2], q.device)

    def chosen() -> str:   # the kernel the first call chose, as the report names it
        return f"schedule: {prepare_call(q, k, v, **options).schedule.brief()}"
    return Prepared(lambda: attention(q, k, v, **options), ENTRY_POINT, chosen)


NEPTUNE = Provider("neptune", "neptune-fusion", "neptune",
                   f"neptune-fusion generated kernels ({ENTRY_POINT})", prepare)
