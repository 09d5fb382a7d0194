"""neptune-fusion's own kernels, through its public attention entry point.

The entry point is looked up at ``prepare`` time, first ``neptune_fusion.ops.attention``,
then ``neptune_fusion.attention``; when neither exists the operator is reported
unsupported ("neptune-fusion code generation not available in this version") and the run
goes on. The assumed signature (keyword-only options; semantics of
:mod:`neptune_fusion.bench.operators`)::

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

import importlib
from collections.abc import Callable

import torch

from ..operators import Operator
from .base import Prepared, Provider, RunContext, Unsupported

NOT_AVAILABLE = "neptune-fusion code generation not available in this version"


def find_entry_point() -> tuple[Callable[..., torch.Tensor] | None, str]:
    """(the attention function, its dotted name), or (None, "") when there is none."""
    try:
        ops = importlib.import_module("neptune_fusion.ops")
    except ModuleNotFoundError as exc:
        if exc.name != "neptune_fusion.ops":
            raise
        ops = None
    if ops is not None and callable(getattr(ops, "attention", None)):
        return ops.attention, "neptune_fusion.ops.attention"
    root = importlib.import_module("neptune_fusion")
    if callable(getattr(root, "attention", None)):
        return root.attention, "neptune_fusion.attention"
    return None, ""


def prepare(op: Operator, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            ctx: RunContext) -> Prepared | Unsupported:
    """Bind the operator's options to neptune-fusion's attention entry point."""
    entry, name = find_entry_point()
    if entry is None:
        return Unsupported(NOT_AVAILABLE)
    seq = k.shape[2]
    options = dict(scale=op.scale, causal=op.causal, q_start=op.q_start(seq),
                   alibi_slopes=op.alibi_slopes(q.device), softcap=op.softcap,
                   window=op.window)
    return Prepared(lambda: entry(q, k, v, **options), name)


NEPTUNE = Provider("neptune", "neptune-fusion", "neptune",
                   "neptune-fusion generated kernels (neptune_fusion.ops.attention)", prepare)
