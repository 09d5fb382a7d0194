"""What programmatic dependent launch (PDL) gains split-k's combine, measured as an edit.

A split-k decode is two launches: the partial kernel, then the combine that merges the
splits' states. At B = 1 over 31090 keys (H100, 2026-12-06) the partial kernel alone was
level with cuDNN's whole call and the combine plus the gap between the launches cost our
call 2-3 % (benchmarks/results/2026-12-06-h100-b1-decode). With PDL (sm_90 and later) the
combine is launched with ``cudaLaunchAttributeProgrammaticStreamSerialization`` (Triton:
the compile option ``launch_pdl=True``), its programs start once the partial kernel's
programs have triggered (``gdc_launch_dependents``, emitted at the partial kernel's
start here) and wait at ``gdc_wait`` -- which returns when the partial kernel has
finished and its stores are visible -- before reading the workspace: the combine's launch
and prologue overlap the partial kernel's tail.

The partial and combine sources are the emitter's own for an explicit schedule
(``fused_combine.generated``), edited as text, and launched by hand with the same grids
as the unedited pair (``fused_combine.launches``); ``nf.attention``'s own call is timed
beside them, every output checked against float64, each as the median of CUDA-graph
replays, over ``--rounds`` interleaved rounds.

Usage (GPU, sm_90+): ``PYTHONPATH=src:benchmarks python benchmarks/pdl_combine.py``.
"""
import argparse
import functools

import torch
from fused_combine import err, generated, launches, reference
from jsonl import emit

from neptune_fusion.frontend.attention import AttentionCache, attention
from neptune_fusion.runtime.loader import load_kernel_module
from neptune_fusion.schedule.schedule import Schedule


def with_call(source: str, name: str, call: str) -> str:
    """``source`` with ``call`` as the first statement of kernel ``name``'s body."""
    at = source.index(f"def {name}(")
    body = source.index("):\n", at) + 3
    return source[:body] + f"    {call}\n" + source[body:]


def pdl_launch(sources: dict, splits: int, q, k, v, warps: int, stages: int, block_n: int):
    """``() -> o``: the edited pair launched by hand (fused_combine's grids), the combine
    a programmatic dependent of the partial kernel."""
    part = load_kernel_module(
        with_call(sources["attention_partial"], "attention_partial",
                  "tl.extra.cuda.gdc_launch_dependents()"),
        "attention_partial", False).attention_partial
    comb = load_kernel_module(
        with_call(sources["attention_combine"], "attention_combine", "tl.extra.cuda.gdc_wait()"),
        "attention_combine", False).attention_combine
    b, h, n, d = q.shape
    m = k.shape[2]
    ws_m = torch.empty(splits, h, b, n, device="cuda", dtype=torch.float32)
    ws_l = torch.empty_like(ws_m)
    ws_o = torch.empty(splits, h, b, n, d, device="cuda", dtype=torch.float32)
    o = torch.empty_like(q)
    consts = dict(BLOCK_M=16, BLOCK_N=block_n, BLOCK_E=d, INTERPRET=False)
    wss = [ws_m, *ws_m.stride()[:3], ws_l, *ws_l.stride()[:3], ws_o, *ws_o.stride()[:4]]

    def pdl():
        o.fill_(float("nan"))   # a launch that writes nothing cannot pass the check
        part[(1, b * h, splits)](q, *q.stride()[:3], k, *k.stride()[:3], v, *v.stride()[:3],
                                 *wss, b, n, m, BLOCK_C=d, **consts, num_warps=warps,
                                 num_stages=stages)
        comb[(1, b * h, 1)](*wss, o, *o.stride()[:3], b, n, m, **consts, num_warps=warps,
                            launch_pdl=True)
        return o
    return pdl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", default="4096,31090")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--schedules", default="4x128/4/3,8x128/4/3")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from triton.testing import do_bench_cudagraph
    gen = torch.Generator(device="cuda").manual_seed(0)
    for m in [int(x) for x in args.keys.split(",")]:
        q, k, v = (torch.randn(1, args.heads, n, 128, device="cuda", dtype=torch.float16,
                               generator=gen) for n in (1, m, m))
        ref = reference(q, k, v)
        for text in args.schedules.split(","):
            ks, w, st = text.split("/")
            splits, bn = (int(x) for x in ks.split("x"))
            sched = Schedule(strategy="split", splits=splits, block_m=16, block_n=bn,
                             num_warps=int(w), num_stages=int(st))
            cache = AttentionCache(store=False)
            sources, _ = generated(q, k, v, sched, cache)
            two, _, _, _ = launches(sources, splits, q, k, v, int(w), int(st), bn)
            pdl = pdl_launch(sources, splits, q, k, v, int(w), int(st), bn)
            ours = functools.partial(attention, q, k, v, schedule=sched, cache=cache)
            fns = {"nf_ms": ours, "two_ms": two, "pdl_ms": pdl}
            rec = {"keys": m, "heads": args.heads, "schedule": text}
            for name, fn in fns.items():
                rec[name.replace("_ms", "_err")] = err(fn().clone(), ref)
            assert all(rec[e] < 2e-3 for e in ("nf_err", "two_err", "pdl_err")), rec
            for r in range(args.rounds):
                for name, fn in fns.items():
                    fn()
                    torch.cuda.synchronize()
                    rec[name] = round(do_bench_cudagraph(fn, rep=100,
                                                         return_mode="median"), 5)
                rec["round"] = r
                rec["pdl_err_after"] = err(pdl().clone(), ref)
                rec["gpu"] = torch.cuda.get_device_name()
                emit(dict(rec), args.out)


if __name__ == "__main__":
    main()
