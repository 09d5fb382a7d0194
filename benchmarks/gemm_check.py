"""Column-tiled (GEMM-like) kernels of a norm followed by a matmul, tile by tile, on a GPU.

For a plain matmul (``out = x @ W``, written with ``nf.compute``) and RMSNorm -> matmul at
N = D = K = 4096, times neptune-fusion under explicit column-tiled schedules (``block_col``)
next to torch (cuBLAS) and torch.compile of the same plain PyTorch, bf16 and float32 with
TF32 on both sides; every output checked against float64 first. Prints one line per point
and writes JSON to ``--out``: where a fused chain loses to torch, the plain matmul's line
says whether the GEMM itself or the fused prologue is the cause.

    python benchmarks/gemm_check.py --out gemm.json

``GEMM_SIZE`` (default 4096), ``GEMM_DTYPES`` (``bfloat16,float32``) and ``GEMM_PROGRAMS``
(default all: matmul, scaled-matmul, rmsnorm-matmul, layernorm-matmul) narrow the run.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl

import neptune_fusion as nf

N = D = K = int(os.environ.get("GEMM_SIZE", "4096"))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TILES = ((128, 64, 256, 8, 3), (128, 32, 256, 8, 4), (128, 64, 256, 8, 2))


def matmul(dtype):
    x = nf.placeholder((N, D), dtype, name="x")
    w = nf.placeholder((D, K), dtype, name="W")
    c = nf.reduce_axis(D, "c")
    out = nf.compute((N, K), lambda i, o: nf.sum(x[i, c] * w[c, o], c), name="out")
    return out, [x, w], lambda x, w: x @ w


def scaled_matmul(dtype):
    x = nf.placeholder((N, D), dtype, name="x")
    g = nf.placeholder((D,), dtype, name="g")
    w = nf.placeholder((D, K), dtype, name="W")
    c = nf.reduce_axis(D, "c")
    out = nf.compute((N, K), lambda i, o: nf.sum(x[i, c] * g[c] * w[c, o], c), name="out")
    return out, [x, g, w], lambda x, g, w: (x.float() * g.float()).to(x.dtype) @ w


def rmsnorm_matmul(dtype):
    x = nf.placeholder((N, D), dtype, name="x")
    g = nf.placeholder((D,), dtype, name="g")
    w = nf.placeholder((D, K), dtype, name="W")
    c = nf.reduce_axis(D, "c")
    ms = nf.compute((N,), lambda i: nf.sum(x[i, c] * x[i, c], c) / D, name="ms")
    y = nf.compute((N, D), lambda i, e: x[i, e] * nf.rsqrt(ms[i] + 1e-6) * g[e], name="y")
    out = nf.compute((N, K), lambda i, o: nf.sum(y[i, c] * w[c, o], c), name="out")

    def plain(x, g, w):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * g.float()
        return y.to(x.dtype) @ w
    return out, [x, g, w], plain


def layernorm_matmul(dtype):
    x = nf.placeholder((N, D), dtype, name="x")
    g = nf.placeholder((D,), dtype, name="g")
    b = nf.placeholder((D,), dtype, name="b")
    w = nf.placeholder((D, K), dtype, name="W")
    c = nf.reduce_axis(D, "c")
    mu = nf.compute((N,), lambda i: nf.sum(x[i, c], c) / D, name="mu")
    var = nf.compute((N,), lambda i: nf.sum((x[i, c] - mu[i]) * (x[i, c] - mu[i]), c) / D,
                     name="var")
    y = nf.compute((N, D), lambda i, e: (x[i, e] - mu[i]) * nf.rsqrt(var[i] + 1e-5) * g[e]
                   + b[e], name="y")
    out = nf.compute((N, K), lambda i, o: nf.sum(y[i, c] * w[c, o], c), name="out")

    def plain(x, g, b, w):
        y = torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), g.float(), b.float())
        return y.to(x.dtype) @ w
    return out, [x, g, b, w], plain


def kernel_times(fn) -> str:
    """GPU time per kernel of ``fn`` (torch profiler, 10 calls), for a multi-pass plan."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    return "; ".join(f"{e.key[:40]} {e.device_time_total / e.count / 1e3:.4f} ms x{e.count}"
                     for e in prof.key_averages() if e.device_time_total > 0)


def instructions(kernel) -> str:
    """The matrix instructions of ``kernel``'s compiled code (wgmma, mma.sync or none:
    FMA), its registers and spills, from Triton's compiled kernels."""
    out = []
    for ck in getattr(kernel, "_compiled", {}).values():
        ptx = ck.asm.get("ptx", "")
        kind = "wgmma" if "wgmma.mma_async" in ptx else "mma.sync" if "mma.sync" in ptx \
            else "fma"
        out.append(f"{kind} regs={getattr(ck, 'n_regs', '?')} "
                   f"spills={getattr(ck, 'n_spills', '?')}")
    return ", ".join(out)


@triton.jit
def _probe_mm(a_ptr, b_ptr, c_ptr, n, BM: tl.constexpr, BN: tl.constexpr,
              BK: tl.constexpr, TRANS: tl.constexpr):
    """A plain TF32 matmul probe: the right operand loaded as ``[BK, BN]`` or, with
    ``TRANS``, as ``[BN, BK]`` and transposed (K-major in shared memory)."""
    pid = tl.program_id(0)
    tiles = tl.cdiv(n, BN)
    rm = pid // tiles * BM + tl.arange(0, BM)
    rn = pid % tiles * BN + tl.arange(0, BN)
    acc = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, n, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + rm[:, None] * n + rk[None, :])
        if TRANS:
            bt = tl.load(b_ptr + rk[None, :] * n + rn[:, None])
            acc = tl.dot(a, tl.trans(bt), acc, input_precision="tf32")
        else:
            b = tl.load(b_ptr + rk[:, None] * n + rn[None, :])
            acc = tl.dot(a, b, acc, input_precision="tf32")
    tl.store(c_ptr + rm[:, None] * n + rn[None, :], acc)


def tf32_probe() -> None:
    """Whether the right operand's layout decides the TF32 matmul's speed."""
    a = torch.randn(N, N, device="cuda")
    b = torch.randn(N, N, device="cuda")
    c = torch.empty(N, N, device="cuda")
    ref = a.double() @ b.double()
    for trans in (False, True):
        for bm, bn, bk, w, st in ((128, 128, 32, 8, 3), (128, 256, 32, 8, 3),
                                  (128, 128, 64, 8, 2)):
            grid = (triton.cdiv(N, bm) * triton.cdiv(N, bn),)
            try:
                def run(grid=grid, bm=bm, bn=bn, bk=bk, trans=trans, w=w, st=st):
                    _probe_mm[grid](a, b, c, N, bm, bn, bk, trans, num_warps=w,
                                    num_stages=st)
                run()
                err = float((c.double() - ref).norm() / ref.norm())
                ms = triton.testing.do_bench(run, warmup=50, rep=300)

                print(f"tf32 probe trans={trans} {bm}x{bn}x{bk} w{w} s{st}: {ms:.4f} ms "
                      f"{2 * N ** 3 / ms / 1e9:.1f} TFLOP/s err {err:.1e}", flush=True)
            except Exception as exc:  # noqa: BLE001 - report and go on
                print(f"tf32 probe trans={trans} {bm}x{bn}x{bk}: failed {exc}"[:300])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gemm.json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    if DEVICE == "cuda":
        tf32_probe()
    rows = []
    dtypes = os.environ.get("GEMM_DTYPES", "bfloat16,float32").split(",")
    programs = os.environ.get("GEMM_PROGRAMS", "").split(",")
    for dtype in dtypes:
        tdt = getattr(torch, dtype)
        for name, build in (("matmul", matmul), ("scaled-matmul", scaled_matmul),
                            ("rmsnorm-matmul", rmsnorm_matmul),
                            ("layernorm-matmul", layernorm_matmul)):
            if programs != [""] and name not in programs:
                continue
            out, ins, plain = build(dtype)
            gen = torch.Generator(device=DEVICE).manual_seed(0)
            ts = [torch.randn(tuple(int(s) for s in p.shape), generator=gen, device=DEVICE,
                              dtype=tdt) for p in ins]
            ref = plain(*[t.double() for t in ts])
            comp = torch.compile(plain, dynamic=False) if DEVICE == "cuda" else plain
            points = [("torch", lambda plain=plain, ts=ts: plain(*ts)),
                      ("torch.compile", lambda comp=comp, ts=ts: comp(*ts))]
            kernels = []
            for bm, bn, bc, w, st in TILES:
                try:
                    k = nf.compile(out, ins, cache=False, block_m=bm, block_n=bn,
                                   block_col=bc, num_warps=w, num_stages=st,
                                   fp32_precision="tf32")
                    points.append((f"nf {bm}x{bn}x{bc} w{w} s{st}", lambda k=k, ts=ts: k(*ts)))
                    kernels.append((points[-1][0], k))
                except nf.NeptuneError as err:
                    print(name, dtype, bm, bn, bc, "error:", err)
            auto = nf.compile(out, ins, cache=False, fp32_precision="tf32")
            points.append(("nf auto", lambda auto=auto, ts=ts: auto(*ts)))
            for label, fn in points:
                try:
                    got = fn()
                    err = float((got.double() - ref).norm() / ref.norm())
                    ms = triton.testing.do_bench(fn, warmup=50, rep=300) if DEVICE == "cuda" \
                        else 1.0
                except Exception as exc:  # noqa: BLE001 - report and go on
                    print(f"{name:15s} {dtype:9s} {label:28s} failed: {exc}"[:300])
                    continue
                tf = 2 * N * D * K / ms / 1e9
                rows.append({"program": name, "dtype": dtype, "point": label, "ms": ms,
                             "tflops": tf, "rel_error": err})
                print(f"{name:15s} {dtype:9s} {label:28s} {ms:8.4f} ms {tf:7.1f} TFLOP/s "
                      f"err {err:.1e}", flush=True)
            if DEVICE == "cuda":
                print("   kernels of nf auto:", kernel_times(points[-1][1]))
            for label, k in kernels:
                print(f"   {label}: {instructions(k)}")
    env = {"gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
           "torch": torch.__version__, "triton": triton.__version__}
    with open(args.out, "w") as f:
        json.dump({"environment": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
