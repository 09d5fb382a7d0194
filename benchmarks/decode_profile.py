"""Where split-k decode time goes: per-kernel GPU time for chosen schedules.

Usage on a GPU:
    PYTHONPATH=src python benchmarks/decode_profile.py --ops DC-GQA --seqs 16384 \
        --splits 8,16,32 --out results/dir

For each decode operator and length: the auto-scheduled kernel, then the same schedule with
each split count (and any ``--variants``). Every variant is checked against the float64 reference
(relative Frobenius error), timed as CUDA-graph replay (median GPU time of the whole call)
and profiled with ``torch.profiler`` (mean GPU time per generated kernel over 20 calls), so
the partial kernel, the combine kernel and the gap between them can be told apart. Also
prints the device-to-device copy ceiling measured in the same process. Writes
``decode_profile.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
import triton

from neptune_fusion import ops
from neptune_fusion.bench.gate import relative_error
from neptune_fusion.bench.reference import reference_attention
from neptune_fusion.bench.timing import copy_tbps, graph_timer
from neptune_fusion.bench.workloads import attention_options, make_inputs, select_operators
from neptune_fusion.frontend.attention import AttentionCache

_graph = graph_timer(rep_ms=50)   # GPU time of the whole call: CUDA-graph replay


def kernel_times(fn, calls: int = 20) -> dict[str, float]:
    """Mean GPU microseconds per call of every CUDA kernel ``fn`` launches."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t and e.count:
            out[e.key[:60]] = t / calls
    return out


def variant(s, **kw):
    """``s`` with the fields ``kw`` replaced."""
    return replace(s, **kw)


def measure(call, ref, kv_bytes: int, ceiling: float) -> dict:
    """Error against the float64 reference, graph-replay time, per-kernel times."""
    got = call()
    row = {"rel_error": relative_error(got, ref)}
    for _ in range(50):     # a racy merge shows up as a changing result
        if not torch.equal(call(), got):
            raise RuntimeError("result changed between identical calls")
    row["graph_ms"] = _graph(call)
    row["kernels_us"] = kernel_times(call)
    row["tbps"] = kv_bytes / (row["graph_ms"] * 1e-3) / 1e12
    row["of_ceiling"] = row["tbps"] / ceiling
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="DC-Causal,DC-GQA,DC-ALiBi,DC-SoftCap")
    ap.add_argument("--seqs", default="16384")
    ap.add_argument("--splits", default="", help="split counts to try besides auto's")
    ap.add_argument("--variants", default="", help="more schedules besides auto's tiles: "
                    "comma-separated block_n:warps:stages:splits")
    ap.add_argument("--out", default="decode-profile-out")
    args = ap.parse_args()
    dev = torch.device("cuda")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ceiling = copy_tbps(_graph, dev)   # 1 GiB device copy, read + write
    meta = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": triton.__version__,
            "copy_tbps": ceiling}
    print(f"copy ceiling {ceiling:.3f} TB/s", flush=True)
    rows = []
    for op in select_operators(args.ops.split(",")):
        for seq in (int(s) for s in args.seqs.split(",")):
            q, k, v = make_inputs(op, seq, torch.float16, dev)
            kw = attention_options(op, seq, dev)
            ref = reference_attention(op, q, k, v)
            cache = AttentionCache()
            ops.attention(q, k, v, cache=cache, **kw)
            (auto,) = cache.kernels()
            chosen = auto.last_choice.schedule
            variants = [("auto", None)]
            for n in [int(x) for x in args.splits.split(",") if x]:
                variants.append((f"k{n}", variant(chosen, splits=n)))
            for text in (x for x in args.variants.split(",") if x):
                bn, w, st, n = text.split(":")
                variants.append((text, variant(chosen, block_n=int(bn), num_warps=int(w),
                                            num_stages=int(st), splits=int(n))))
            kv_bytes = 2 * k.numel() * k.element_size()
            for label, sched in variants:
                row = {"op": op.name, "seq": seq, "variant": label,
                       "schedule": (sched or chosen).to_dict()}
                try:
                    call = partial(ops.attention, q, k, v, cache=cache, schedule=sched, **kw)
                    row.update(measure(call, ref, kv_bytes, ceiling))
                    print(f"{op.name} S={seq} {label:16s} {row['graph_ms'] * 1e3:7.1f} us "
                          f"{row['of_ceiling']:5.1%} err {row['rel_error']:.1e} "
                          + " ".join(f"{n.split('(')[0][-24:]}={t:.1f}"
                                     for n, t in row["kernels_us"].items()), flush=True)
                except Exception as exc:  # noqa: BLE001 - a failing variant is reported
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
                    print(f"{op.name} S={seq} {label}: FAILED {row['error']}", flush=True)
                rows.append(row)
            (out / "decode_profile.json").write_text(
                json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
