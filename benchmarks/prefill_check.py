"""Correctness and speed of the generated prefill kernels against torch SDPA, on one GPU.

For each of the six prefill operators of BENCHMARKS.md (batch 1, head dim 128, fp16) and
each sequence length, it runs ``neptune_fusion.ops.attention`` (one generated Triton
kernel per operator), checks it against a float64 reference on a few query heads, and
times it and the SDPA backends (FlashAttention-2, cuDNN, memory-efficient) with
``triton.testing.do_bench`` in the same run. It prints a table and writes
``<out>/prefill_check.json``.

    PYTHONPATH=src python benchmarks/prefill_check.py --out results/prefill_check
    PYTHONPATH=src python benchmarks/prefill_check.py --out /tmp/pc --seqs 4096 --ops PF-Causal

Runs with torch 2.11 / Triton 3.6 (the H200 machine) and newer; needs a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch

from neptune_fusion import ops
from neptune_fusion.bench.gate import relative_error, threshold_for
from neptune_fusion.bench.providers.base import Prepared, RunContext
from neptune_fusion.bench.providers.sdpa import CUDNN, EFFICIENT, FLASH
from neptune_fusion.bench.reference import reference_attention
from neptune_fusion.bench.timing import gpu_timer, synchronize, wall_timer
from neptune_fusion.bench.workloads import (
    attention_options,
    make_inputs,
    prefill_flops,
    smoke_variant,
)
from neptune_fusion.frontend.attention import AttentionCache
from neptune_fusion.schedule.schedule import default_schedule

PREFILL = [ops.OPERATORS[name] for name in ops.PREFILL]
SDPA = (FLASH, CUDNN, EFFICIENT)


def run_neptune(op, q, k, v, cache: AttentionCache):
    opts = attention_options(op, k.shape[2], q.device)
    return lambda: ops.attention(q, k, v, cache=cache, **opts)


def measure(op, seq: int, dtype, timer, check_heads: int, sdpa: bool,
            device: torch.device) -> dict:
    q, k, v = make_inputs(op, seq, dtype, device)
    cache = AttentionCache()
    call = run_neptune(op, q, k, v, cache)
    t0 = time.perf_counter()
    out = call()
    synchronize(device)
    compile_s = time.perf_counter() - t0
    heads = sorted({0, 1, op.q_heads // 2, op.q_heads - 1})[:max(1, check_heads)]
    ref = reference_attention(op, q, k, v, heads)
    err = relative_error(out[:, heads], ref)
    del ref
    ms = timer(call)
    (kernel,) = cache.kernels()
    args = [q, k, v] + ([op.alibi_slopes(device).float()] if op.alibi else [])
    kernel_ms = timer(lambda: kernel(*args))  # the launch alone, no attention() checks
    flops = prefill_flops(op, seq)
    rec = {"op": op.name, "seq": seq, "dtype": str(dtype).removeprefix("torch."),
           "neptune": {"ms": ms, "kernel_ms": kernel_ms, "tflops": flops / (ms * 1e-3) / 1e12,
                       "first_call_s": compile_s, "rel_err": err, "checked_heads": heads,
                       "ok": err <= threshold_for(dtype),
                       "schedule": default_schedule(op.head_dim, seq).to_dict()},
           "sdpa": {}}
    if sdpa:
        ctx = RunContext(device=device, dtype=dtype, timer=timer)
        for prov in SDPA:
            try:
                got = prov.prepare(op, q, k, v, ctx)
                if isinstance(got, Prepared):
                    rec["sdpa"][prov.name] = {"ms": timer(got.fn), "note": got.note}
                else:
                    rec["sdpa"][prov.name] = {"ms": None, "note": got.reason}
            except Exception as exc:  # noqa: BLE001 - report and go on
                rec["sdpa"][prov.name] = {"ms": None, "note": f"error: {exc}".splitlines()[0]}
            if device.type == "cuda":
                torch.cuda.empty_cache()
    best = min(((p, r["ms"]) for p, r in rec["sdpa"].items() if r["ms"]), key=lambda x: x[1],
               default=(None, None))
    rec["best_sdpa"] = {"provider": best[0], "ms": best[1],
                        "speedup": (best[1] / ms) if best[1] else None}
    return rec


def table(records: list[dict]) -> str:
    head = (f"{'operator':<11} {'S':>6} {'neptune ms':>11} {'TFLOP/s':>8} {'rel err':>9} "
            f"{'ok':>3} {'best SDPA':>15} {'ms':>8} {'SDPA/nf':>8}")
    lines = [head, "-" * len(head)]
    for r in records:
        n, b = r["neptune"], r["best_sdpa"]
        sp = f"{b['speedup']:.2f}x" if b["speedup"] else "-"
        bms = f"{b['ms']:.3f}" if b["ms"] else "-"
        lines.append(f"{r['op']:<11} {r['seq']:>6} {n['ms']:>11.3f} {n['tflops']:>8.1f} "
                     f"{n['rel_err']:>9.2e} {'yes' if n['ok'] else 'NO':>3} "
                     f"{(b['provider'] or 'n/a'):>15} {bms:>8} {sp:>8}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for prefill_check.json")
    p.add_argument("--seqs", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--ops", nargs="+", default=[op.name for op in PREFILL],
                   choices=[op.name for op in PREFILL])
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    p.add_argument("--check-heads", type=int, default=4,
                   help="query heads checked against float64 (default 4)")
    p.add_argument("--no-sdpa", action="store_true", help="time neptune-fusion only")
    p.add_argument("--warmup", type=int, default=25, help="do_bench warm-up ms")
    p.add_argument("--rep", type=int, default=100, help="do_bench repetition ms")
    p.add_argument("--smoke", action="store_true",
                   help="CPU dry run of this script: Triton interpreter, heads / 8, window "
                        "32, wall-clock times that mean nothing (default --seqs 80)")
    args = p.parse_args(argv)
    if args.smoke:
        device, timer = torch.device("cpu"), wall_timer()
        seqs = args.seqs if "--seqs" in (argv or sys.argv) else [80]
    elif torch.cuda.is_available():
        device, timer, seqs = torch.device("cuda"), gpu_timer(args.warmup, args.rep), args.seqs
    else:
        print("prefill_check: needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    import triton
    dtype = getattr(torch, args.dtype)
    by_name = {op.name: smoke_variant(op) if args.smoke else op for op in PREFILL}
    records = []
    for name in args.ops:
        for seq in seqs:
            rec = measure(by_name[name], seq, dtype, timer, args.check_heads,
                          not args.no_sdpa, device)
            records.append(rec)
            print(table([rec]).splitlines()[-1], flush=True)
    print()
    print(table(records))
    ok = all(r["neptune"]["ok"] for r in records)
    speedups = [r["best_sdpa"]["speedup"] for r in records if r["best_sdpa"]["speedup"]]
    if speedups:
        gm = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
        print(f"\ngeomean SDPA/neptune over {len(speedups)} points: {gm:.3f}x "
              "(above 1: neptune-fusion faster)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {"torch": torch.__version__, "triton": triton.__version__,
           "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (smoke)",
           "python": platform.python_version()}
    (out / "prefill_check.json").write_text(json.dumps(
        {"environment": env, "all_correct": ok, "records": records}, indent=2))
    print(f"wrote {out / 'prefill_check.json'}; all correct: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
