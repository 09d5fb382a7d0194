"""Float64 reference attention and the additive score bias shared with the plain baselines.

The reference upcasts the (fp16/bf16) inputs to float64 on their own device and evaluates
the score semantics of :mod:`neptune_fusion.ops` literally, one query head and
one block of query rows at a time so that S = 16384 fits in memory.
"""

from __future__ import annotations

import torch

from ..ops import OpSpec

# Largest score block materialised at once (float64 elements): 2^27 x 8 B = 1 GiB.
MAX_BLOCK_ELEMENTS = 1 << 27


def additive_bias(op: OpSpec, seq: int, *, dtype: torch.dtype, device: torch.device | str,
                  heads: slice | None = None, rows: tuple[int, int] | None = None,
                  ) -> torch.Tensor | None:
    """The additive score bias (ALiBi plus -inf where masked), shape (h, r, S).

    ``heads`` selects query heads (all by default; the head axis has extent 1 when there is
    no ALiBi), ``rows`` a [start, stop) range of query rows (all by default). Returns None
    when the operator adds nothing at this length (no ALiBi and no masked pair).
    """
    if not op.alibi and not op.needs_mask(seq):
        return None
    r0, r1 = rows if rows is not None else (0, op.q_len(seq))
    i = torch.arange(r0, r1, device=device)[:, None] + op.q_start(seq)
    j = torch.arange(seq, device=device)[None, :]
    if op.alibi:
        # float64 for the reference, float32 otherwise (then rounded to ``dtype``).
        work = torch.float64 if dtype == torch.float64 else torch.float32
        slopes = op.alibi_slopes(device).to(work)[heads or slice(None)]
        bias = (slopes[:, None, None] * (j - i).to(work)).to(dtype)
    else:
        bias = torch.zeros((1, r1 - r0, seq), dtype=dtype, device=device)
    if op.needs_mask(seq):
        keep = torch.ones((r1 - r0, seq), dtype=torch.bool, device=device)
        if op.causal:
            keep &= j <= i
        if op.window is not None:
            keep &= (i - j) < op.window
        bias = bias.masked_fill(~keep, float("-inf"))
    return bias


def dense_bias(op: OpSpec, seq: int, *, dtype: torch.dtype,
               device: torch.device | str) -> torch.Tensor | None:
    """The full (1, H or 1, Sq, S) bias, built one head at a time to bound peak memory."""
    if not op.alibi:
        bias = additive_bias(op, seq, dtype=dtype, device=device)
        return None if bias is None else bias[None]
    out = torch.empty((1, op.q_heads, op.q_len(seq), seq), dtype=dtype, device=device)
    for h in range(op.q_heads):
        out[0, h] = additive_bias(op, seq, dtype=dtype, device=device, heads=slice(h, h + 1))[0]
    return out


def reference_attention(op: OpSpec, q: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor, heads: list[int] | None = None) -> torch.Tensor:
    """Float64 attention of ``op`` on (B, H, S, D) inputs, on the inputs' device.

    ``heads`` restricts it to those query heads: the result is (B, len(heads), S, D).
    """
    batch, q_heads, q_len, head_dim = q.shape
    seq = k.shape[2]
    if q_heads != op.q_heads or k.shape[1] != op.kv_heads or q_len != op.q_len(seq):
        raise ValueError(f"{op.name}: inputs q{tuple(q.shape)} k{tuple(k.shape)} do not match "
                         f"the operator ({op.q_heads} q heads, {op.kv_heads} kv heads)")
    heads = list(range(q_heads)) if heads is None else list(heads)
    out = torch.empty((batch, len(heads), q_len, head_dim), dtype=torch.float64,
                      device=q.device)
    block = row_block(batch, seq)
    for slot, h in enumerate(heads):
        kh = k[:, h // op.group].to(torch.float64)
        vh = v[:, h // op.group].to(torch.float64)
        for r0 in range(0, q_len, block):
            r1 = min(q_len, r0 + block)
            out[:, slot, r0:r1] = block_attention(op, q[:, h, r0:r1].to(torch.float64), kh,
                                                  vh, h, (r0, r1))
    return out


def row_block(batch: int, seq: int) -> int:
    """Query rows per block, so that a (batch, rows, seq) float64 score block stays within
    :data:`MAX_BLOCK_ELEMENTS`."""
    return max(1, MAX_BLOCK_ELEMENTS // max(1, batch * seq))


def block_attention(op: OpSpec, qb: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor,
                    h: int, rows: tuple[int, int]) -> torch.Tensor:
    """Attention of query head ``h``'s rows ``[r0, r1)`` (``qb``: (B, r, D)) over one kv
    head's ``kh``, ``vh`` ((B, S, D)), in their dtype (float64 for the references); plain
    torch ops, so autograd differentiates it (the backward suite's reference)."""
    seq = kh.shape[-2]
    s = (qb @ kh.transpose(-1, -2)) * op.scale
    if op.softcap is not None:
        s = op.softcap * torch.tanh(s / op.softcap)
    bias = additive_bias(op, seq, dtype=qb.dtype, device=qb.device, heads=slice(h, h + 1),
                         rows=rows)
    if bias is not None:
        s = s + bias
    return torch.softmax(s, dim=-1) @ vh
