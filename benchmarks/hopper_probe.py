"""Which Triton features move a FlashAttention-shaped forward on a Hopper-class GPU.

A measurement tool (docs/hopper.md), not a kernel of the library: one forward kernel of
the shape the emitter generates (rolling update in the exp2 domain; for causal masks an
unmasked off-diagonal loop and a masked diagonal one) in variants -- loads through
pointers (LOADS=0), host tensor descriptors (1) or device-side descriptors (2); the key
loop warp-specialised or not (``tl.range(..., warp_specialize=...)``); QK^T pipelined by
hand (the product of tile j+1 issued before tile j's softmax) or not -- times six tiles,
timed with ``do_bench`` beside cuDNN's SDPA and ``nf`` in the same process, each output
checked against cuDNN's. Writes ``hopper_probe.jsonl`` under ``--out``.

Usage (GPU): ``python benchmarks/hopper_probe.py --out DIR [--budget 470] [--bf16]``.
"""
import itertools
import json
import os
import time

import torch
import triton
import triton.language as tl
from triton.testing import do_bench
from triton.tools.tensor_descriptor import TensorDescriptor

LOG = []


def rec(**kw):
    print(json.dumps(kw), flush=True)
    LOG[0].write(json.dumps(kw) + "\n")
    LOG[0].flush()


@triton.jit
def _update(acc, den, m, qk, v, offs_m, start_n, offs_n, qk_scale, MASK: tl.constexpr,
            dtype: tl.constexpr):
    if MASK:
        keep = offs_m[:, None] >= (start_n + offs_n[None, :])
        qk = tl.where(keep, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
    else:
        m_new = tl.maximum(m, tl.max(qk, 1) * qk_scale)
        p = tl.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.exp2(m - m_new)
    den = den * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(dtype), v, acc * alpha[:, None])
    return acc, den, m_new


@triton.jit
def _load_kt(K, dk, kbase, row0, start_n, offs_n, offs_d, D: tl.constexpr, LOADS: tl.constexpr):
    if LOADS == 0:
        return tl.load(K + kbase + offs_d[:, None] + (start_n + offs_n)[None, :] * D)
    else:
        return dk.load([row0 + start_n, 0]).T


@triton.jit
def _load_v(V, dv, kbase, row0, start_n, offs_n, offs_d, D: tl.constexpr, LOADS: tl.constexpr):
    if LOADS == 0:
        return tl.load(V + kbase + (start_n + offs_n)[:, None] * D + offs_d[None, :])
    else:
        return dv.load([row0 + start_n, 0])


@triton.jit
def _loop(acc, den, m, q, K, V, dk, dv, kbase, row0, lo, hi, offs_m, offs_n, offs_d, qk_scale,
          D: tl.constexpr, BN: tl.constexpr, LOADS: tl.constexpr, WS: tl.constexpr,
          MASK: tl.constexpr, dtype: tl.constexpr):
    for start_n in tl.range(lo, hi, BN, warp_specialize=WS):
        start_n = tl.multiple_of(start_n, BN)
        kt = _load_kt(K, dk, kbase, row0, start_n, offs_n, offs_d, D, LOADS)
        qk = tl.dot(q, kt)
        v = _load_v(V, dv, kbase, row0, start_n, offs_n, offs_d, D, LOADS)
        acc, den, m = _update(acc, den, m, qk, v, offs_m, start_n, offs_n, qk_scale, MASK, dtype)
    return acc, den, m


@triton.jit
def _loop_pipe(acc, den, m, q, K, V, dk, dv, kbase, row0, lo, hi, offs_m, offs_n, offs_d, qk_scale,
               D: tl.constexpr, BN: tl.constexpr, LOADS: tl.constexpr, dtype: tl.constexpr):
    # unmasked only; hi - lo >= BN
    kt = _load_kt(K, dk, kbase, row0, lo, offs_n, offs_d, D, LOADS)
    qk = tl.dot(q, kt)
    for start_n in range(lo, hi - BN, BN):
        start_n = tl.multiple_of(start_n, BN)
        kt_next = _load_kt(K, dk, kbase, row0, start_n + BN, offs_n, offs_d, D, LOADS)
        qk_next = tl.dot(q, kt_next)
        v = _load_v(V, dv, kbase, row0, start_n, offs_n, offs_d, D, LOADS)
        acc, den, m = _update(acc, den, m, qk, v, offs_m, start_n, offs_n, qk_scale, False, dtype)
        qk = qk_next
    v = _load_v(V, dv, kbase, row0, hi - BN, offs_n, offs_d, D, LOADS)
    acc, den, m = _update(acc, den, m, qk, v, offs_m, hi - BN, offs_n, qk_scale, False, dtype)
    return acc, den, m


@triton.jit
def fa_fwd(Q, K, V, Out, dq, dk, dv, do, H, N, qk_scale,
           D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, LOADS: tl.constexpr,
           WS: tl.constexpr, PIPE: tl.constexpr, CAUSAL: tl.constexpr, HEAVY_FIRST: tl.constexpr):
    dtype: tl.constexpr = Q.dtype.element_ty
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    if CAUSAL and HEAVY_FIRST:
        pid = tl.num_programs(0) - 1 - pid
    row0 = bh * N                      # first row of this head in the (B*H*N, D) view
    kbase = tl.cast(bh, tl.int64) * N * D
    offs_m = pid * BM + tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    if LOADS == 2:
        dq = tl.make_tensor_descriptor(Q + kbase, shape=[N, D], strides=[D, 1], block_shape=[BM, D])
        dk = tl.make_tensor_descriptor(K + kbase, shape=[N, D], strides=[D, 1], block_shape=[BN, D])
        dv = tl.make_tensor_descriptor(V + kbase, shape=[N, D], strides=[D, 1], block_shape=[BN, D])
        do = tl.make_tensor_descriptor(Out + kbase, shape=[N, D], strides=[D, 1],
                                       block_shape=[BM, D])
        row0 = 0
    if LOADS == 0:
        q = tl.load(Q + kbase + offs_m[:, None] * D + offs_d[None, :])
    else:
        q = dq.load([row0 + pid * BM, 0])
    m = tl.full([BM], float("-inf"), tl.float32)
    den = tl.full([BM], 0.0, tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    if CAUSAL:
        acc, den, m = _loop(acc, den, m, q, K, V, dk, dv, kbase, row0, 0, pid * BM, offs_m, offs_n,
                          offs_d, qk_scale, D, BN, LOADS, WS, False, dtype)
        acc, den, m = _loop(acc, den, m, q, K, V, dk, dv, kbase, row0, pid * BM, pid * BM + BM,
                          offs_m, offs_n, offs_d, qk_scale, D, BN, LOADS, False, True, dtype)
    elif PIPE:
        acc, den, m = _loop_pipe(acc, den, m, q, K, V, dk, dv, kbase, row0, 0, N, offs_m, offs_n,
                               offs_d, qk_scale, D, BN, LOADS, dtype)
    else:
        acc, den, m = _loop(acc, den, m, q, K, V, dk, dv, kbase, row0, 0, N, offs_m, offs_n, offs_d,
                          qk_scale, D, BN, LOADS, WS, False, dtype)
    o = (acc * (1.0 / den)[:, None]).to(dtype)
    if LOADS == 0:
        tl.store(Out + kbase + offs_m[:, None] * D + offs_d[None, :], o)
    else:
        do.store([row0 + pid * BM, 0], o)


def alloc(size, align, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def run_probe(q, k, v, o, cfg, causal):
    B, H, N, D = q.shape
    BM, BN, w, s, loads, ws, pipe = cfg
    if loads == 1:
        def d(t, bs):
            return TensorDescriptor(t.view(B * H * N, D), [B * H * N, D], [D, 1], bs)
        descs = (d(q, [BM, D]), d(k, [BN, D]), d(v, [BN, D]), d(o, [BM, D]))
    else:
        descs = (q, k, v, o)
    grid = (N // BM, B * H)
    fa_fwd[grid](q, k, v, o, *descs, H, N, D ** -0.5 * 1.4426950408889634, D=D, BM=BM, BN=BN,
                 LOADS=loads, WS=ws, PIPE=pipe, CAUSAL=causal, HEAVY_FIRST=True,
                 num_warps=w, num_stages=s)


def main():
    import argparse
    p = argparse.ArgumentParser(description="Triton feature probe of an FA forward (GPU)")
    p.add_argument("--out", default=".")
    p.add_argument("--budget", type=float, default=470.0, help="seconds before stopping")
    p.add_argument("--bf16", action="store_true", help="bfloat16 as well as float16")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    LOG.append(open(os.path.join(args.out, "hopper_probe.jsonl"), "a"))
    triton.set_allocator(alloc)   # device-side descriptors' scratch (this script only)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from neptune_fusion import ops
    F = torch.nn.functional

    def timed(fn, *a, **kw):
        return do_bench(lambda: fn(*a, **kw))
    dtypes = [torch.float16, torch.bfloat16] if args.bf16 else [torch.float16]
    seqs = [4096, 16384]
    tiles = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3),
             (128, 64, 4, 4), (128, 128, 4, 2)]
    feats = [(0, False, False), (0, True, False), (1, False, False), (1, True, False),
             (2, False, False), (2, True, False), (0, False, True), (1, False, True)]
    t_start = time.time()
    for dtype, D, causal in itertools.product(dtypes, [128, 64], [False, True]):
        H = 32 if D == 128 else 64
        for S in seqs:
            if time.time() - t_start > args.budget:
                rec(note="budget reached")
                return
            torch.manual_seed(S)
            q, k, v = (torch.randn(1, H, S, D, device="cuda", dtype=dtype) for _ in range(3))
            flops = 4 * H * S * S * D * (0.5 if causal else 1.0)
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                t_cudnn = timed(F.scaled_dot_product_attention, q, k, v, is_causal=causal)
            base = dict(dtype=str(dtype)[6:], D=D, H=H, S=S, causal=causal)
            rec(**base, impl="cudnn", ms=t_cudnn, tflops=flops / t_cudnn / 1e9)
            try:
                o_nf = ops.attention(q, k, v, scale=D ** -0.5, causal=causal)
                err = (o_nf.float() - ref.float()).abs().max().item()
                t_nf = timed(ops.attention, q, k, v, scale=D ** -0.5, causal=causal)
                rec(**base, impl="nf", ms=t_nf, tflops=flops / t_nf / 1e9,
                    vs_cudnn=t_cudnn / t_nf, err=err)
            except Exception as e:
                rec(**base, impl="nf", error=repr(e)[:300])
            best = None
            for tile in tiles:
                for loads, ws, pipe in feats:
                    if causal and pipe:
                        continue
                    cfg = tile + (loads, ws, pipe)
                    o = torch.empty_like(q)
                    try:
                        t0 = time.time()
                        run_probe(q, k, v, o, cfg, causal)
                        torch.cuda.synchronize()
                        ct = time.time() - t0
                        err = (o.float() - ref.float()).abs().max().item()
                        t = timed(run_probe, q, k, v, o, cfg, causal)
                        r = dict(**base, impl="probe", cfg=cfg, ms=t, tflops=flops / t / 1e9,
                                 vs_cudnn=t_cudnn / t, err=err, compile_s=round(ct, 2))
                        rec(**r)
                        if err < 5e-2 and (best is None or t < best["ms"]):
                            best = r
                    except Exception as e:
                        rec(**base, impl="probe", cfg=cfg, error=repr(e)[:300])
            rec(**base, impl="best", best=best)


if __name__ == "__main__":
    main()
