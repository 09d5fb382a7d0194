"""Does a Hopper-shaped attention forward, written in Gluon, reach cuDNN on an H200?

A measurement tool for issue 18 (docs/hopper.md), not a kernel of the library. One
forward in Triton's Gluon dialect, shaped as FlashAttention-3 shapes its consumer:

* Q, K and V tiles arrive by TMA into shared memory, each K and V tile signalled by its
  own mbarrier, in a ring of ``STAGES`` buffers refilled as soon as the tile's last
  reader has finished;
* both products are asynchronous warpgroup MMAs (``wgmma``); the product ``Q K^T`` of
  tile ``t`` is issued before ``P V`` of tile ``t - 1``, and the softmax of tile ``t``
  runs while ``P V`` of tile ``t - 1`` is still on the tensor cores (FA3's intra-
  warpgroup overlap); ``P`` goes to the second product from registers;
* the rolling update in the exp2 domain with the scaled maximum (the generated kernel's
  algebra, docs/algebra.md); for a causal mask the tiles right of the diagonal are never
  loaded and only the diagonal tiles are masked.

``--compile-only`` compiles every variant for sm_90 with no GPU (Triton's own ``ptxas``):
that checks the source on the CPU machine. On the GPU each variant is checked against a
float64 reference, then timed with ``do_bench`` beside cuDNN's SDPA and ``nf.attention``
in the same process. Writes ``gluon_probe.jsonl`` under ``--out``.

Usage: ``python benchmarks/gluon_probe.py --compile-only`` (CPU, Triton 3.6 on the path)
or ``python benchmarks/gluon_probe.py --out DIR`` (GPU).
"""
import argparse
import itertools
import json
import math
import os
import time

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

LOG = []


def rec(**kw):
    print(json.dumps(kw), flush=True)
    if LOG:
        LOG[0].write(json.dumps(kw) + "\n")
        LOG[0].flush()


@gluon.jit
def _load(desc, row, bar, dst, pred):
    mbarrier.expect(bar, desc.block_type.nbytes, pred)
    tma.async_copy_global_to_shared(desc, [row, 0], bar, dst, pred)


@gluon.jit
def _softmax(s, m, den, qk_scale, t, row0, diag,
             BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
             s_layout: gl.constexpr):
    if CAUSAL:
        if t >= diag:
            rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
            cols = t * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            s = gl.where(cols[None, :] <= rows[:, None], s, float("-inf"))
    m_new = gl.maximum(m, gl.max(s, 1))
    alpha = gl.exp2((m - m_new) * qk_scale)
    p = gl.exp2(s * qk_scale - (m_new * qk_scale)[:, None])
    den = den * alpha + gl.sum(p, 1)
    return p, m_new, den, alpha


@gluon.jit
def attention_fwd(q_desc, k_desc, v_desc, o_desc, qk_scale, N_CTX, GROUP,
                  CAUSAL: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    pid_m = gl.program_id(0)
    if CAUSAL:
        start_m = gl.num_programs(0) - 1 - pid_m   # heaviest row blocks first
        n_tiles = gl.cdiv((start_m + 1) * BLOCK_M, BLOCK_N)
        diag = start_m * BLOCK_M // BLOCK_N
    else:
        start_m = pid_m
        n_tiles = N_CTX // BLOCK_N
        diag = n_tiles
    bh = gl.program_id(1)
    q_row = bh * N_CTX + start_m * BLOCK_M
    kv_row = (bh // GROUP) * N_CTX

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    fence_async_shared()

    _load(q_desc, q_row, q_bar, q_smem, True)
    for i in gl.static_range(STAGES):
        _load(k_desc, kv_row + i * BLOCK_N, k_bars.index(i), k_smem.index(i), i < n_tiles)
        _load(v_desc, kv_row + i * BLOCK_N, v_bars.index(i), v_smem.index(i), i < n_tiles)

    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    m = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    den = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False)
    p, m, den, alpha = _softmax(s, m, den, qk_scale, 0, start_m * BLOCK_M, diag, BLOCK_M,
                                BLOCK_N, CAUSAL, s_layout)
    acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)
    for t in range(1, n_tiles):
        buf = t % STAGES
        prev = (t - 1) % STAGES
        nxt = t - 1 + STAGES
        # K of tile t - 1 was read by a product every warp has waited for: refill it.
        gl.thread_barrier()
        _load(k_desc, kv_row + nxt * BLOCK_N, k_bars.index(prev), k_smem.index(prev), nxt < n_tiles)
        mbarrier.wait(k_bars.index(buf), (t // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(buf).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        mbarrier.wait(v_bars.index(prev), ((t - 1) // STAGES) & 1)
        p16 = gl.convert_layout(p.to(dtype), p_layout)
        acc_tok = warpgroup_mma(p16, v_smem.index(prev), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok, ))
        p, m, den, alpha = _softmax(s, m, den, qk_scale, t, start_m * BLOCK_M, diag,
                                    BLOCK_M, BLOCK_N, CAUSAL, s_layout)
        acc, p16 = warpgroup_mma_wait(0, deps=(acc_tok, p16))
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        gl.thread_barrier()
        _load(v_desc, kv_row + nxt * BLOCK_N, v_bars.index(prev), v_smem.index(prev), nxt < n_tiles)
    last = n_tiles - 1
    mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
    p16 = gl.convert_layout(p.to(dtype), p_layout)
    acc = warpgroup_mma(p16, v_smem.index(last % STAGES), acc)
    o = acc / gl.convert_layout(den, row_o)[:, None]
    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))
    q_smem.store(o.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [q_row, 0], q_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_full, v_full, k_empty,
              v_empty, q_row, kv_row, n_tiles, STAGES: gl.constexpr):
    """One warp: TMA loads only. A buffer is refilled once its consumer has arrived on its
    empty barrier (a fresh barrier passes the wait on parity 1)."""
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    _load(q_desc, q_row, q_bar, q_smem, True)
    for u in range(n_tiles):
        b = u % STAGES
        ph = ((u // STAGES) & 1) ^ 1
        mbarrier.wait(k_empty.index(b), ph)
        _load(k_desc, kv_row + u * BLOCK_N, k_full.index(b), k_smem.index(b), True)
        mbarrier.wait(v_empty.index(b), ph)
        _load(v_desc, kv_row + u * BLOCK_N, v_full.index(b), v_smem.index(b), True)


@gluon.jit
def _consumer(o_desc, q_smem, k_smem, v_smem, q_bar, k_full, v_full, k_empty, v_empty, qk_scale,
              q_row, start_m, n_tiles, diag, CAUSAL: gl.constexpr, STAGES: gl.constexpr,
              num_warps: gl.constexpr):
    dtype: gl.constexpr = o_desc.dtype
    BLOCK_M: gl.constexpr = o_desc.block_type.shape[0]
    HEAD_D: gl.constexpr = o_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_smem.type.shape[1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    m = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    den = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_full.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False)
    gl.thread_barrier()
    mbarrier.arrive(k_empty.index(0))
    p, m, den, alpha = _softmax(s, m, den, qk_scale, 0, start_m * BLOCK_M, diag, BLOCK_M,
                                BLOCK_N, CAUSAL, s_layout)
    acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)
    for t in range(1, n_tiles):
        buf = t % STAGES
        prev = (t - 1) % STAGES
        mbarrier.wait(k_full.index(buf), (t // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(buf).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        mbarrier.wait(v_full.index(prev), ((t - 1) // STAGES) & 1)
        p16 = gl.convert_layout(p.to(dtype), p_layout)
        acc_tok = warpgroup_mma(p16, v_smem.index(prev), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok, ))
        gl.thread_barrier()
        mbarrier.arrive(k_empty.index(buf))
        p, m, den, alpha = _softmax(s, m, den, qk_scale, t, start_m * BLOCK_M, diag,
                                    BLOCK_M, BLOCK_N, CAUSAL, s_layout)
        acc, p16 = warpgroup_mma_wait(0, deps=(acc_tok, p16))
        gl.thread_barrier()
        mbarrier.arrive(v_empty.index(prev))
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    last = n_tiles - 1
    mbarrier.wait(v_full.index(last % STAGES), (last // STAGES) & 1)
    p16 = gl.convert_layout(p.to(dtype), p_layout)
    acc = warpgroup_mma(p16, v_smem.index(last % STAGES), acc)
    o = acc / gl.convert_layout(den, row_o)[:, None]
    q_smem.store(o.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [q_row, 0], q_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def attention_fwd_ws(q_desc, k_desc, v_desc, o_desc, qk_scale, N_CTX, GROUP,
                     CAUSAL: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """The same forward with a producer warp (warp specialisation, FA3's load warp)."""
    dtype: gl.constexpr = q_desc.dtype
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    pid_m = gl.program_id(0)
    if CAUSAL:
        start_m = gl.num_programs(0) - 1 - pid_m
        n_tiles = gl.cdiv((start_m + 1) * BLOCK_M, BLOCK_N)
        diag = start_m * BLOCK_M // BLOCK_N
    else:
        start_m = pid_m
        n_tiles = N_CTX // BLOCK_N
        diag = n_tiles
    bh = gl.program_id(1)
    q_row = bh * N_CTX + start_m * BLOCK_M
    kv_row = (bh // GROUP) * N_CTX

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(v_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=1)
    fence_async_shared()
    gl.warp_specialize([
        (_consumer, (o_desc, q_smem, k_smem, v_smem, q_bar, k_full, v_full, k_empty, v_empty,
                     qk_scale, q_row, start_m, n_tiles, diag, CAUSAL, STAGES, num_warps)),
        (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_full, v_full,
                     k_empty, v_empty, q_row, kv_row, n_tiles, STAGES)),
    ], [1], [24])


@gluon.jit
def _producer_pp(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_full, v_full, k_empty,
                 v_empty, q_row, kv_row, n_tiles, STAGES: gl.constexpr):
    """One warp: both query halves, then K and V tiles as the two consumers free them."""
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    HALF: gl.constexpr = q_desc.block_type.shape[0]
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem.index(0))
    tma.async_copy_global_to_shared(q_desc, [q_row + HALF, 0], q_bar, q_smem.index(1))
    for u in range(n_tiles):
        b = u % STAGES
        ph = ((u // STAGES) & 1) ^ 1
        mbarrier.wait(k_empty.index(b), ph)
        _load(k_desc, kv_row + u * BLOCK_N, k_full.index(b), k_smem.index(b), True)
        mbarrier.wait(v_empty.index(b), ph)
        _load(v_desc, kv_row + u * BLOCK_N, v_full.index(b), v_smem.index(b), True)


@gluon.jit
def _consumer_pp(o_desc, q_smem, k_smem, v_smem, q_bar, k_full, v_full, k_empty, v_empty, turn,
                 qk_scale, q_row, row0, n_tiles, diag, WG: gl.constexpr, PINGPONG: gl.constexpr,
                 CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    """One warpgroup, 64 query rows. With PINGPONG the two warpgroups take turns to issue
    their products (an mbarrier each), so one's softmax runs under the other's MMAs."""
    dtype: gl.constexpr = o_desc.dtype
    HALF: gl.constexpr = o_desc.block_type.shape[0]
    HEAD_D: gl.constexpr = o_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_smem.type.shape[1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    mine = turn.index(WG)
    other = turn.index(1 - WG)
    qh = q_smem.index(WG)

    s_zero = gl.zeros([HALF, BLOCK_N], gl.float32, s_layout)
    m = gl.full([HALF], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    den = gl.zeros([HALF], gl.float32, gl.SliceLayout(1, s_layout))
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_full.index(0), 0)
    if PINGPONG:
        mbarrier.wait(mine, WG ^ 1)
    s_tok = warpgroup_mma(qh, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)
    if PINGPONG:
        mbarrier.arrive(other)
    s = warpgroup_mma_wait(0, deps=(s_tok, ))
    gl.thread_barrier()
    mbarrier.arrive(k_empty.index(0))
    p, m, den, alpha = _softmax(s, m, den, qk_scale, 0, row0, diag, HALF, BLOCK_N, CAUSAL,
                                s_layout)
    acc = gl.zeros([HALF, HEAD_D], gl.float32, o_layout)
    for t in range(1, n_tiles):
        buf = t % STAGES
        prev = (t - 1) % STAGES
        mbarrier.wait(k_full.index(buf), (t // STAGES) & 1)
        mbarrier.wait(v_full.index(prev), ((t - 1) // STAGES) & 1)
        p16 = gl.convert_layout(p.to(dtype), p_layout)
        if PINGPONG:
            mbarrier.wait(mine, (t & 1) ^ WG ^ 1)
        s_tok = warpgroup_mma(qh, k_smem.index(buf).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        acc_tok = warpgroup_mma(p16, v_smem.index(prev), acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(other)
        s = warpgroup_mma_wait(1, deps=(s_tok, ))
        gl.thread_barrier()
        mbarrier.arrive(k_empty.index(buf))
        p, m, den, alpha = _softmax(s, m, den, qk_scale, t, row0, diag, HALF, BLOCK_N, CAUSAL,
                                    s_layout)
        acc, p16 = warpgroup_mma_wait(0, deps=(acc_tok, p16))
        gl.thread_barrier()
        mbarrier.arrive(v_empty.index(prev))
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    last = n_tiles - 1
    mbarrier.wait(v_full.index(last % STAGES), (last // STAGES) & 1)
    p16 = gl.convert_layout(p.to(dtype), p_layout)
    if PINGPONG:
        mbarrier.wait(mine, (n_tiles & 1) ^ WG ^ 1)
    acc_tok = warpgroup_mma(p16, v_smem.index(last % STAGES), acc, is_async=True)
    if PINGPONG:
        mbarrier.arrive(other)
    acc, p16 = warpgroup_mma_wait(0, deps=(acc_tok, p16))
    o = acc / gl.convert_layout(den, row_o)[:, None]
    qh.store(o.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [q_row + WG * HALF, 0], qh)
    tma.store_wait(pendings=0)


@gluon.jit
def attention_fwd_pp(q_desc, k_desc, v_desc, o_desc, qk_scale, N_CTX, GROUP,
                     CAUSAL: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr):
    """Two consumer warpgroups of 64 rows each (a partition each) and a producer warp."""
    dtype: gl.constexpr = q_desc.dtype
    HALF: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = 2 * HALF
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    pid_m = gl.program_id(0)
    if CAUSAL:
        start_m = gl.num_programs(0) - 1 - pid_m
        n_tiles = gl.cdiv((start_m + 1) * BLOCK_M, BLOCK_N)
    else:
        start_m = pid_m
        n_tiles = N_CTX // BLOCK_N
    bh = gl.program_id(1)
    q_row = bh * N_CTX + start_m * BLOCK_M
    kv_row = (bh // GROUP) * N_CTX
    row0 = start_m * BLOCK_M
    diag0 = row0 // BLOCK_N
    diag1 = (row0 + HALF) // BLOCK_N
    if not CAUSAL:
        diag0 = n_tiles
        diag1 = n_tiles

    q_smem = gl.allocate_shared_memory(dtype, [2, HALF, HEAD_D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(v_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_empty.index(i), count=2)
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    fence_async_shared()
    gl.warp_specialize([
        (_consumer_pp, (o_desc, q_smem, k_smem, v_smem, q_bar, k_full, v_full, k_empty, v_empty,
                        turn, qk_scale, q_row, row0, n_tiles, diag0, 0, PINGPONG, CAUSAL, STAGES)),
        (_consumer_pp, (o_desc, q_smem, k_smem, v_smem, q_bar, k_full, v_full, k_empty, v_empty,
                        turn, qk_scale, q_row, row0 + HALF, n_tiles, diag1, 1, PINGPONG, CAUSAL,
                        STAGES)),
        (_producer_pp, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_full, v_full,
                        k_empty, v_empty, q_row, kv_row, n_tiles, STAGES)),
    ], [4, 1], [240, 24])


# kind -> (kernel, warps of the launch, extra constexprs); "pp" kinds: two warpgroup
# partitions of 64 rows each (4 warps in the launch: the default partition's)
KINDS = {
    "plain": (attention_fwd, None, {}),
    "ws": (attention_fwd_ws, None, {}),
    "pp": (attention_fwd_pp, 4, {"PINGPONG": True}),
    "pp0": (attention_fwd_pp, 4, {"PINGPONG": False}),
}


GL_DTYPE = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}


def descriptors(q, k, v, o, block_m, block_n):
    """2-d TMA descriptors over (B*H*N, D) views; N must be a multiple of both tiles."""
    d = q.shape[-1]
    gdt = GL_DTYPE[q.dtype]

    def desc(x, rows):
        flat = x.reshape(-1, d)
        layout = gl.NVMMASharedLayout.get_default_for([rows, d], gdt)
        return TensorDescriptor.from_tensor(flat, [rows, d], layout)

    return desc(q, block_m), desc(k, block_n), desc(v, block_n), desc(o, block_m)


def launch_args(kind, block_m, warps):
    """(kernel, rows of a q/o descriptor block, constexprs) of one variant."""
    kernel, fixed_warps, extra = KINDS[kind]
    q_rows = block_m if fixed_warps is None else block_m // 2
    return kernel, q_rows, dict(extra, num_warps=fixed_warps or warps)


def run(q, k, v, causal, block_m=128, block_n=128, stages=2, warps=8, kind="plain", scale=None):
    B, H, N, D = q.shape
    group = H // k.shape[1]
    o = torch.empty_like(q)
    scale = D ** -0.5 if scale is None else scale
    kernel, q_rows, consts = launch_args(kind, block_m, warps)
    qd, kd, vd, od = descriptors(q, k, v, o, q_rows, block_n)
    grid = (N // block_m, B * H)
    kernel[grid](qd, kd, vd, od, scale * math.log2(math.e), N, group,
                 CAUSAL=causal, STAGES=stages, **consts)
    return o


def variants(kinds=tuple(KINDS)):
    for d, causal, (bm, bn), stages, warps, kind in itertools.product(
            (128, 64), (False, True), ((128, 128), (128, 64), (64, 128)), (2, 3), (4, 8),
            kinds):
        if warps * 16 != bm:   # 64 rows per warpgroup; 128 rows on 4 warps spill
            continue
        if kind.startswith("pp") and bm != 128:
            continue
        smem = 2 * (bm * d + 2 * stages * bn * d)
        if smem > 227 * 1024:
            continue
        yield dict(d=d, causal=causal, block_m=bm, block_n=bn, stages=stages, warps=warps,
                   kind=kind)


def compile_only(kinds):
    """Compile every variant for sm_90 on a machine with no GPU; ptxas reports registers."""
    from sm90 import compile_sm90
    from triton.runtime.jit import mangle_type

    for var in variants(kinds):
        d = var["d"]
        kernel, q_rows, consts = launch_args(var["kind"], var["block_m"], var["warps"])
        x = torch.empty(1, 1, 256, d, dtype=torch.float16)
        qd, kd, vd, od = descriptors(x, x, x, x, q_rows, var["block_n"])
        sig = {"q_desc": mangle_type(qd), "k_desc": mangle_type(kd), "v_desc": mangle_type(vd),
               "o_desc": mangle_type(od), "qk_scale": "fp32", "N_CTX": "i32", "GROUP": "i32"}
        consts = dict(consts, CAUSAL=var["causal"], STAGES=var["stages"])
        warps = consts["num_warps"] if "num_warps" in kernel.arg_names else consts.pop("num_warps")
        sig.update({name: "constexpr" for name in consts})
        t0 = time.time()
        try:
            k, info = compile_sm90(kernel, sig, consts, warps)
        except Exception as e:  # noqa: BLE001 - a probe records every failure and goes on
            rec(**var, ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
            continue
        rec(**var, ok=True, shared=k.metadata.shared, s=round(time.time() - t0, 1), ptxas=info)


def reference(q, k, v, causal, scale):
    g = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(g, 1)
    v = v.double().repeat_interleave(g, 1)
    s = q.double() @ k.transpose(-1, -2) * scale
    if causal:
        n = s.shape[-1]
        above = torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(above, float("-inf"))
    return torch.softmax(s, -1) @ v


def rel_err(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


def bench_shape(d, causal, n, hq, hkv, dt, t_end, gen, kinds):
    """One shape: float64 check and timing of cuDNN, ``nf.attention`` and each variant."""
    from functools import partial

    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from neptune_fusion import ops

    q = torch.randn(1, hq, n, d, device="cuda", dtype=dt, generator=gen)
    k = torch.randn(1, hkv, n, d, device="cuda", dtype=dt, generator=gen)
    v = torch.randn(1, hkv, n, d, device="cuda", dtype=dt, generator=gen)
    scale = d ** -0.5
    hs = hq // hkv   # the float64 reference covers the query heads of the first kv head
    ref = reference(q[:, :hs], k[:, :1], v[:, :1], causal, scale)
    kg, vg = k.repeat_interleave(hs, 1), v.repeat_interleave(hs, 1)
    sdpa = partial(torch.nn.functional.scaled_dot_product_attention, q, kg, vg,
                   is_causal=causal, scale=scale)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o_c = sdpa()
        t_c = do_bench(sdpa, warmup=50, rep=300)
    ours = partial(ops.attention, q, k, v, causal=causal, scale=scale)
    o_nf = ours()
    t_nf = do_bench(ours, warmup=50, rep=300)
    flops = 4 * hq * n * n * d * (0.5 if causal else 1.0)
    base = dict(d=d, causal=causal, n=n, hq=hq, hkv=hkv, dtype=str(dt)[6:],
                cudnn_ms=round(t_c, 4), nf_ms=round(t_nf, 4),
                cudnn_err=rel_err(o_c[:, :hs], ref), nf_err=rel_err(o_nf[:, :hs], ref))
    rec(**base, cudnn_tflops=round(flops / t_c / 1e9, 1), nf_vs_cudnn=round(t_c / t_nf, 3))
    for var in variants(kinds):
        if var["d"] != d or var["causal"] != causal or time.time() > t_end:
            continue
        kw = {key: var[key] for key in ("block_m", "block_n", "stages", "warps", "kind")}
        call = partial(run, q, k, v, causal, scale=scale, **kw)
        try:
            o = call()
            torch.cuda.synchronize()
            err = rel_err(o[:, :hs], ref)
            if not err <= 3 * base["cudnn_err"] + 1e-3:
                rec(**base, **kw, ok=False, err=err, why="wrong")
                continue
            t = do_bench(call, warmup=50, rep=300)
            rec(**base, **kw, ok=True, err=err, ms=round(t, 4), tflops=round(flops / t / 1e9, 1),
                vs_cudnn=round(t_c / t, 3), vs_nf=round(t_nf / t, 3))
        except Exception as e:  # noqa: BLE001 - a probe records every failure and goes on
            rec(**base, **kw, ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")


def gpu(args):
    os.makedirs(args.out, exist_ok=True)
    LOG.append(open(os.path.join(args.out, "gluon_probe.jsonl"), "a"))
    dt = torch.bfloat16 if args.bf16 else torch.float16
    t_end = time.time() + args.budget
    gen = torch.Generator(device="cuda").manual_seed(0)
    # head dim 128: 32 heads (the bench's PF operators); 64: Llama-1B-like GQA 32/8
    shapes = [(128, 32, 32), (64, 32, 8)]
    for (d, hq, hkv), causal, n in itertools.product(shapes, (False, True), args.seqs):
        if time.time() > t_end:
            rec(stopped="budget")
            break
        bench_shape(d, causal, n, hq, hkv, dt, t_end, gen, args.kinds)
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile-only", action="store_true", help="compile for sm_90, no GPU")
    ap.add_argument("--out", default="gluon-probe", help="folder for gluon_probe.jsonl")
    ap.add_argument("--seqs", type=lambda s: [int(x) for x in s.split(",")], default=[4096, 16384])
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--kinds", type=lambda s: s.split(","), default=list(KINDS),
                    help=f"comma-separated, of {','.join(KINDS)}")
    ap.add_argument("--budget", type=float, default=400.0, help="seconds, then stop")
    args = ap.parse_args()
    if args.compile_only:
        compile_only(args.kinds)
    else:
        gpu(args)


if __name__ == "__main__":
    main()
