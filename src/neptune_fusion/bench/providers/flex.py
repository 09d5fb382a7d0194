"""FlexAttention (``torch.nn.attention.flex_attention``) compiled with ``torch.compile``.

``score_mod`` carries the soft-cap (``cap * tanh(s / cap)``) and ALiBi
(``s + slope[h] * (kv - q)``, q the absolute query position); ``create_block_mask`` carries
causality and the sliding window so fully masked blocks are skipped. Decode needs no block
mask (the query at S - 1 sees every key); its ALiBi uses q = S - 1. GQA via
``enable_gqa=True``. The function is compiled with ``dynamic=False, fullgraph=True`` after
raising the recompile limits, so it never silently falls back to the eager path.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...ops import OpSpec
from ._compile import raise_recompile_limits
from .base import Prepared, Provider, RunContext, Unsupported


def score_mod_for(op: OpSpec, seq: int, device: torch.device) -> Callable | None:
    """The score_mod for ``op`` (soft-cap first, then ALiBi), or None when scores are plain."""
    cap = op.softcap
    slopes = op.alibi_slopes(device)
    offset = op.q_start(seq)
    if cap is None and slopes is None:
        return None
    if slopes is None:
        def softcap(score, b, h, q_idx, kv_idx):
            return cap * torch.tanh(score / cap)
        return softcap
    if cap is None:
        def alibi(score, b, h, q_idx, kv_idx):
            return score + slopes[h] * (kv_idx - (q_idx + offset))
        return alibi

    def both(score, b, h, q_idx, kv_idx):
        score = cap * torch.tanh(score / cap)
        return score + slopes[h] * (kv_idx - (q_idx + offset))
    return both


def mask_mod_for(op: OpSpec, seq: int) -> Callable | None:
    """The mask_mod (causal, sliding window) in absolute positions, or None when unmasked."""
    if not op.needs_mask(seq):
        return None
    offset = op.q_start(seq)
    window = op.window
    if window is None:
        def causal(b, h, q_idx, kv_idx):
            return q_idx + offset >= kv_idx
        return causal

    def sliding(b, h, q_idx, kv_idx):
        i = q_idx + offset
        return (i >= kv_idx) & (i - kv_idx < window)
    return sliding


def prepare(op: OpSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            ctx: RunContext) -> Prepared | Unsupported:
    """Build the block mask and the compiled flex_attention call for ``op``."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as exc:
        return Unsupported(f"torch {torch.__version__} has no FlexAttention ({exc})")
    raise_recompile_limits()
    seq = k.shape[2]
    score_mod = score_mod_for(op, seq, q.device)
    mask_mod = mask_mod_for(op, seq)
    block_mask = None
    if mask_mod is not None:
        block_mask = create_block_mask(mask_mod, None, None, op.q_len(seq), seq,
                                       device=q.device)
    compiled = torch.compile(flex_attention, dynamic=False, fullgraph=True)
    gqa = op.group > 1

    def fn() -> torch.Tensor:
        return compiled(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=op.scale,
                        enable_gqa=gqa)

    parts = [name for name, part in (("score_mod", score_mod), ("block_mask", block_mask))
             if part is not None]
    return Prepared(fn, " + ".join(parts) or "no score_mod, no block_mask")


FLEX = Provider("flex", "FlexAttention", "compiler",
                "torch.compile(flex_attention) with score_mod and create_block_mask", prepare)
