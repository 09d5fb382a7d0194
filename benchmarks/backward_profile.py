"""Where forward + backward attention spends its GPU time, per kernel, per provider.

For backward-suite points (default PF-Causal and PF-GQA at S = 4096, fp16, head dim 128),
in one process: each provider's forward + ``out.backward(dout)`` (the suite's own
``Step``: neptune-fusion, FlexAttention, SDPA), its gradients gated against float64
first, its eager time (``do_bench`` with the L2 flushed, as the suite times it) and the
GPU time of every kernel it launches (torch.profiler, mean per call); for
neptune-fusion also the registers and spills of each compiled Triton kernel.

Usage (GPU): ``python benchmarks/backward_profile.py [--ops PF-Causal,PF-GQA]
[--seqs 4096] [--providers neptune,flex,sdpa] [--json OUT.jsonl]``.
Results: benchmarks/results/2026-12-02-h200-backward.
"""
from __future__ import annotations

import argparse
import gc
import json

import torch
from decode_profile import kernel_times  # a sibling script: benchmarks/ is on the path

from neptune_fusion.bench.backward import (
    bound,
    check_gradients,
    make_grad_inputs,
    reference_gradients,
    select_operators,
)
from neptune_fusion.bench.providers.backward import PREPARE
from neptune_fusion.bench.providers.base import RunContext
from neptune_fusion.bench.timing import gpu_timer
from neptune_fusion.runtime.kernel import Kernel


def compiled_kernels() -> list[dict]:
    """Registers and spills of every Triton kernel neptune-fusion compiled so far."""
    out = []
    for obj in gc.get_objects():
        # type(), not isinstance: a dead weakref.proxy among the objects raises on
        # attribute access (ReferenceError)
        if issubclass(type(obj), Kernel):
            for ck in obj._compiled.values():
                out.append({"kernel": ck.name, "schedule": str(obj.schedule),
                            "regs": getattr(ck, "n_regs", None),
                            "spills": getattr(ck, "n_spills", None),
                            "smem": getattr(getattr(ck, "metadata", None), "shared", None)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", default="PF-Causal,PF-GQA")
    ap.add_argument("--seqs", default="4096")
    ap.add_argument("--providers", default="neptune,flex,sdpa")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    dtype = torch.float16
    timer = gpu_timer(25, 100)
    ctx = RunContext(device=torch.device("cuda"), dtype=dtype, timer=timer, smoke=False)
    rows = []
    for op in select_operators(a.ops.split(",")):
        for seq in (int(s) for s in a.seqs.split(",")):
            x = make_grad_inputs(op, seq, dtype, "cuda")
            ref = reference_gradients(op, x)
            flex_error = None
            names = [n for n in ("flex", "sdpa", "neptune") if n in a.providers.split(",")]
            for name in names:
                step = PREPARE[name](op, x, ctx)
                if not hasattr(step, "fn"):
                    print(f"{op.name} {seq} {name}: unsupported ({step})", flush=True)
                    continue
                verdict = check_gradients(step.fn(), ref, dtype, bound(dtype, flex_error,
                                                                        name))
                if name == "flex":
                    flex_error = verdict.error
                ms = timer(step.fn)
                fwd = timer(step.forward)
                kt = kernel_times(step.fn, calls=10)
                row = {"op": op.name, "seq": seq, "provider": name, "ms": ms, "fwd_ms": fwd,
                       "ok": verdict.passed, "errors": verdict.errors, "kernels_us": kt}
                if name.startswith("neptune"):
                    row["compiled"] = compiled_kernels()
                rows.append(row)
                print(f"\n{op.name} S={seq} {name}: fwd+bwd {ms:.4f} ms, fwd {fwd:.4f} ms, "
                      f"ok={verdict.passed} {verdict.errors} {verdict.reason}", flush=True)
                for k, us in sorted(kt.items(), key=lambda t: -t[1]):
                    print(f"    {us:9.1f} us  {k}")
                for c in row.get("compiled", []):
                    print(f"    {c['kernel']}: regs {c['regs']} spills {c['spills']} "
                          f"smem {c['smem']} ({c['schedule']})")
                x.clear_grads()
            del x, ref
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r, default=str) + "\n")


if __name__ == "__main__":
    main()
