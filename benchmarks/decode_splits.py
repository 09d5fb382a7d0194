"""Issue 17's last point, by explicit schedules: B = 1 decode over a long cache.

At B = 1 (one sequence, 32/32 heads) our paged decode sat at 0.96-0.98x cuDNN, and the
read-only roofline (benchmarks/paged_roofline.py, H100, 2026-12-06) read the same bytes
3-5 % faster than our decode through every layout -- shuffled pages of 16 within 0.2 %
of the contiguous cache -- so the gap is the kernel's. This script times our decode
(DC-Causal's shape, fp16) over a grid of explicit split-k schedules beside the
auto-scheduler's pick and cuDNN (contiguous), each as the median of CUDA-graph replays,
every output checked against the contiguous auto call; then one profile of the auto pick
and of the grid's best, kernel by kernel (the partial kernel against the combine).

Usage (GPU): ``PYTHONPATH=src python benchmarks/decode_splits.py --out f.jsonl``;
``--smoke`` runs two schedules of a tiny case on the interpreter.
"""
import argparse
import itertools

import jsonl
import torch

from neptune_fusion import ops
from neptune_fusion.schedule.schedule import Schedule


def layouts(keys: int, heads: int, d: int, page: int, dev, gen):
    """``{name: (k, v, block_table or None)}`` holding the same keys (as paged_roofline)."""
    k = torch.randn(1, heads, keys, d, device=dev, dtype=torch.float16, generator=gen)
    v = torch.randn(1, heads, keys, d, device=dev, dtype=torch.float16, generator=gen)
    n = -(-keys // page)

    def pool(t):
        t = torch.nn.functional.pad(t[0], (0, 0, 0, n * page - keys))
        return t.view(heads, n, page, d).transpose(0, 1).contiguous()
    shuffle = torch.randperm(n, device=dev, generator=gen).to(torch.int32)
    ks, vs = torch.empty_like(pool(k)), torch.empty_like(pool(v))
    ks[shuffle.long()], vs[shuffle.long()] = pool(k), pool(v)
    return {"contiguous": (k, v, None), f"pages of {page} shuffled": (ks, vs, shuffle[None])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=31090)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--schedules", default=None,
                    help="comma-separated 'splits x tile / warps / stages', a trailing 'd' "
                    "for the deep gathered loop (gather_stages = 2 stages - 1) whatever "
                    "the program count; default: a grid of 40")
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    dev = "cpu" if args.smoke else "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    d = 128
    keys, heads = (300, 2) if args.smoke else (args.keys, args.heads)
    q = torch.randn(1, heads, 1, d, device=dev, dtype=torch.float16, generator=gen)
    lens = torch.tensor([keys], device=dev, dtype=torch.int32)
    grid = [(2, 64, 4, 3), (4, 64, 4, 3)] if args.smoke else list(
        itertools.product((4, 8, 16, 32, 33), (64, 128), (4, 8), (3, 4)))
    deep = set()    # indices into grid of the schedules forced to the deep loop
    if args.schedules:
        grid = []
        for text in args.schedules.split(","):
            ks, w, st = text.rstrip("d").split("/")
            if text.endswith("d"):
                deep.add(len(grid))
            grid.append((*(int(x) for x in ks.split("x")), int(w), int(st)))
    sms = 1 if args.smoke else torch.cuda.get_device_properties(0).multi_processor_count
    every = layouts(keys, heads, d, args.page, dev, gen)
    kw = dict(scale=d ** -0.5, causal=True, q_start=keys - 1, kv_lens=lens)
    base = ops.prepare(q, *every["contiguous"][:2], **kw)(q, *every["contiguous"][:2])

    def timed(fn):
        if args.smoke:
            return None
        from triton.testing import do_bench_cudagraph
        fn()
        torch.cuda.synchronize()
        return round(do_bench_cudagraph(fn, rep=60, return_mode="median"), 5)

    def emit(rec):
        jsonl.emit(rec, args.out)

    cudnn = None
    if not args.smoke:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        k, v = every["contiguous"][:2]

        def sdpa():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v)
        cudnn = timed(sdpa)
        emit({"layout": "contiguous", "provider": "cudnn", "ms": cudnn,
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__})
    for name, (k, v, table) in every.items():
        opts = dict(kw, block_table=table)
        runs = [("auto", None)]
        for at, (splits, bn, w, st) in enumerate(grid):
            gathers = table is not None and st >= 3 and (heads * splits <= sms or at in deep)
            runs.append((f"split {splits} x {bn} w{w} s{st}" + (" deep" if gathers else ""),
                         Schedule(strategy="split", splits=splits, block_m=16, block_n=bn,
                                  num_warps=w, num_stages=st,
                                  gather_stages=2 * st - 1 if gathers else 0)))
        best = None
        for label, sched in runs:
            try:
                run = ops.prepare(q, k, v, schedule=sched, **opts)
                out = run(q, k, v)
            except Exception as e:  # noqa: BLE001 - a schedule that does not build
                emit({"layout": name, "schedule": label, "error": str(e)[:200]})
                continue
            ok = bool(torch.allclose(out.float(), base.float(), atol=2e-3, rtol=1e-2))
            ms = timed(lambda r=run, k=k, v=v: r(q, k, v))
            rec = {"layout": name, "schedule": label, "chosen": run.schedule.brief(),
                   "ms": ms, "agrees": ok}
            if ms and cudnn:
                rec["of_cudnn"] = round(cudnn / ms, 3)
            emit(rec)
            assert ok, f"{name} {label}: the output differs from the contiguous auto call"
            if sched is not None and ms is not None and (best is None or ms < best[0]):
                best = (ms, label, run)
        if not args.smoke:   # where the time goes: the kernels of the auto pick and the best
            from torch.profiler import ProfilerActivity, profile
            for label, run in (("auto", ops.prepare(q, k, v, **opts)), best[1:]):
                for _ in range(3):
                    run(q, k, v)
                torch.cuda.synchronize()
                try:
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        for _ in range(20):
                            run(q, k, v)
                        torch.cuda.synchronize()
                    kernels = {e.key[:60]: round(e.device_time_total / e.count / 1e3, 5)
                               for e in prof.key_averages() if e.device_time_total > 0}
                    emit({"layout": name, "profile": label, "kernels_ms": kernels})
                except Exception as e:  # noqa: BLE001 - the timings above stand
                    emit({"layout": name, "profile": label, "error": str(e)[:200]})


if __name__ == "__main__":
    main()
