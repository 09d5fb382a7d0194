"""Baseline: a hand-written Triton FlashAttention-2 forward kernel (the algorithm of
Triton's fused-attention tutorial), timed by the ``triton-fa2`` provider (:mod:`.fa2`).
Not part of neptune-fusion's compiler: it is what the generated kernels are measured
against.

One program computes a BLOCK_M tile of query rows of one (batch, query head) and streams
the keys in BLOCK_N tiles with the online softmax: running max ``m``, running sum ``l`` and
output accumulator ``acc`` in fp32, rescaled by ``exp2(m_old - m_new)`` when the max grows.
``log2(e)`` is folded into the softmax scale so the exponentials are ``exp2``.

Causal attention runs in two phases: key tiles strictly left of the diagonal block without
any mask, then the diagonal block with the ``j <= i`` mask; tiles right of the diagonal are
never visited. GQA reads kv head ``h // group``. Sequence lengths must be multiples of both
block sizes and BLOCK_M a multiple of BLOCK_N; decode (one query row) is not supported.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@dataclass(frozen=True, slots=True)
class BlockConfig:
    """Tile sizes and launch parameters of one kernel variant."""

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _tile_loop(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, lo, hi, qk_scale,
               offs_m, offs_n, MASKED: tl.constexpr, BLOCK_N: tl.constexpr):
    """Fold key tiles [lo, hi) into (acc, l_i, m_i); MASKED applies j <= i."""
    k_ptrs += lo * stride_kn
    v_ptrs += lo * stride_vn
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = tl.load(k_ptrs)
        qk = tl.dot(q, k) * qk_scale
        if MASKED:
            keep = offs_m[:, None] >= (start_n + offs_n)[None, :]
            # A finite "minus infinity": every row of the first diagonal tile keeps its own
            # key, so m stays finite and masked entries underflow to exactly 0.
            qk = tl.where(keep, qk, -1.0e6)
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptrs)
        acc = tl.dot(p.to(v.dtype), v, acc=acc * alpha[:, None])
        m_i = m_new
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return acc, l_i, m_i


@triton.jit
def _fa2_forward(Q, K, V, Out, qk_scale, seq_len,
                 stride_qb, stride_qh, stride_qm,
                 stride_kb, stride_kh, stride_kn,
                 stride_vb, stride_vh, stride_vn,
                 stride_ob, stride_oh, stride_om,
                 q_heads, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Grid (seq_len / BLOCK_M, batch * q_heads); inputs (B, H, S, D) with unit last stride."""
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // q_heads
    off_h = off_bh % q_heads
    off_kvh = off_h // GROUP

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = (Q + off_b * stride_qb + off_h * stride_qh
              + offs_m[:, None] * stride_qm + offs_d[None, :])
    # K is read transposed, (HEAD_DIM, BLOCK_N), so q @ k needs no in-register transpose.
    k_ptrs = (K + off_b * stride_kb + off_kvh * stride_kh
              + offs_n[None, :] * stride_kn + offs_d[:, None])
    v_ptrs = (V + off_b * stride_vb + off_kvh * stride_vh
              + offs_n[:, None] * stride_vn + offs_d[None, :])

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    q = tl.load(q_ptrs)

    if CAUSAL:
        diag = start_m * BLOCK_M
        acc, l_i, m_i = _tile_loop(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn,
                                   0, diag, qk_scale, offs_m, offs_n, False, BLOCK_N)
        acc, l_i, m_i = _tile_loop(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn,
                                   diag, diag + BLOCK_M, qk_scale, offs_m, offs_n, True, BLOCK_N)
    else:
        acc, l_i, m_i = _tile_loop(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn,
                                   0, seq_len, qk_scale, offs_m, offs_n, False, BLOCK_N)

    out = acc / l_i[:, None]
    o_ptrs = (Out + off_b * stride_ob + off_h * stride_oh
              + offs_m[:, None] * stride_om + offs_d[None, :])
    tl.store(o_ptrs, out.to(Out.dtype.element_ty))


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: BlockConfig) -> str:
    """Why (q, k, v) cannot run with ``cfg`` ("" when they can)."""
    if q.dim() != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        return f"expected (B, H, S, D) inputs, got q{tuple(q.shape)} k{tuple(k.shape)}"
    batch, q_heads, q_len, head_dim = q.shape
    seq = k.shape[2]
    if q_len != seq:
        return f"query length {q_len} != key length {seq} (decode is not supported)"
    if q_heads % k.shape[1]:
        return f"{q_heads} query heads are not a multiple of {k.shape[1]} kv heads"
    if head_dim & (head_dim - 1) or head_dim < 16:
        return f"head dim {head_dim} is not a power of two >= 16"
    if cfg.block_m % cfg.block_n:
        return f"BLOCK_M {cfg.block_m} is not a multiple of BLOCK_N {cfg.block_n}"
    if seq % cfg.block_m or seq % cfg.block_n:
        return f"sequence length {seq} is not a multiple of the blocks {cfg.block_m}x{cfg.block_n}"
    return ""


def fa2_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                scale: float | None = None, cfg: BlockConfig = BlockConfig()) -> torch.Tensor:
    """Attention of (B, Hq, S, D) q over (B, Hkv, S, D) k, v; returns (B, Hq, S, D).

    Raises ``ValueError`` for shapes the kernel does not cover (see :func:`check_shapes`),
    and ``RuntimeError`` for CPU tensors unless the kernel was built under TRITON_INTERPRET=1.
    """
    why = check_shapes(q, k, v, cfg)
    if why:
        raise ValueError(f"fa2_forward: {why}")
    if q.device.type == "cpu" and type(_fa2_forward).__name__ != "InterpretedFunction":
        raise RuntimeError("fa2_forward: CPU tensors need TRITON_INTERPRET=1 set before "
                           "neptune_fusion.bench.providers.baseline_fa2 is imported")
    launch = contextlib.nullcontext()
    if q.device.type == "cpu":   # Triton 3.6's interpreter under NumPy 2.4 (runtime/loader)
        from ...runtime.loader import interpreted_launch, mend_interpreter_index
        mend_interpreter_index()
        # the interpreter's nested calls (tl.max, tl.sum) leave triton.language patched,
        # and a GPU kernel compiled later in the process fails: restored after the launch
        launch = interpreted_launch()
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    batch, q_heads, seq, head_dim = q.shape
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    grid = (seq // cfg.block_m, batch * q_heads)
    with launch:
        _fa2_forward[grid](
            q, k, v, out, scale * LOG2E, seq,
            q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            q_heads, GROUP=q_heads // k.shape[1], HEAD_DIM=head_dim,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out
