"""Auto-scheduling on the GPU: cold and warm compile times, and auto vs exhaustive search.

Usage on a GPU:
    PYTHONPATH=src python benchmarks/autotune_check.py --ops PF-Global,DC-GQA --seq 16384 \
        --out results/dir [--no-exhaustive]

Per operator (fp16, the shapes of BENCHMARKS.md):

* cold: a fresh process with an empty schedule store *and* an empty Triton cache times its
  first ``ops.attention`` call (plan, lowering, candidates compiled, checked, measured);
* warm: another fresh process with both caches as the cold one left them times its first
  call (plan derivation, the stored schedule, Triton's cached binary), and then a second
  shape class-equal ``nf.compile``-to-result in the same process (in-memory memos warm);
* auto vs exhaustive: every schedule of the same search space is compiled and timed
  (CUDA-graph replay, median) in this process; the auto choice's time over the best one.

Every timed output is checked against the float64 reference first. Writes
``autotune.json`` and ``autotune.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
t_start = time.perf_counter()
import torch
from neptune_fusion import ops
from neptune_fusion.bench.workloads import attention_options, make_inputs, select_operators
(op,) = select_operators([sys.argv[1]])
seq = int(sys.argv[2])
dev = torch.device("cuda")
q, k, v = make_inputs(op, seq, torch.float16, dev)
kw = attention_options(op, seq, dev)
import triton, triton.language as tl
@triton.jit
def _floor(x_ptr, N: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, N), tl.load(x_ptr + tl.arange(0, N)) + 1.0)
torch.cuda.synchronize()
tf = time.perf_counter()
_floor[(1,)](torch.zeros(16, device=dev), N=16)   # Triton's own first launch in a process
torch.cuda.synchronize()
floor_s = time.perf_counter() - tf
prof = None
if len(sys.argv) > 3:       # profile mode: where the first call's time goes
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
t0 = time.perf_counter()
out = ops.attention(q, k, v, **kw)
torch.cuda.synchronize()
t1 = time.perf_counter()
if prof is not None:
    import pstats
    prof.disable()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("cumtime").print_stats(30)
from neptune_fusion.frontend.attention import AttentionCache
t2 = time.perf_counter()
out2 = ops.attention(q, k, v, cache=AttentionCache(), **kw)
torch.cuda.synchronize()
t3 = time.perf_counter()
print("RESULT", json.dumps({"first_s": t1 - t0, "again_s": t3 - t2, "import_s": t0 - t_start,
                            "triton_first_launch_s": floor_s,
                            "same": bool(torch.equal(out, out2))}))
"""


def child(op: str, seq: int, env: dict, profile: bool = False) -> dict:
    t0 = time.perf_counter()
    script = Path(tempfile.mkdtemp(prefix="nf-child-")) / "child.py"   # triton.jit needs
    script.write_text(CHILD)                                              # a source file
    run = subprocess.run([sys.executable, str(script), op, str(seq)]
                         + (["profile"] if profile else []), env=env,
                         capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t0
    for line in run.stdout.splitlines():
        if line.startswith("RESULT "):
            got = json.loads(line[7:])
            got["process_s"] = wall
            got["log"] = run.stderr[-6000:]
            return got
    raise RuntimeError(f"child failed ({run.returncode}): {run.stderr[-2000:]}")


def kernel_tensors(q, k, v, slopes):
    """The tensors ``nf.attention`` hands its kernel (decode GQA packs the group)."""
    b, hq, n, d = q.shape
    hkv = k.shape[1]
    packed = n == 1 and hq != hkv
    qin = q.reshape(b, hkv, hq // hkv, d) if packed else q
    return [qin, k, v] + ([slopes.float().contiguous()] if slopes is not None else [])


def exhaustive(op, seq: int, auto_store: str, only: list | None = None) -> dict:
    import torch

    from neptune_fusion import ops
    from neptune_fusion.bench.gate import relative_error
    from neptune_fusion.bench.reference import reference_attention
    from neptune_fusion.bench.timing import graph_timer
    from neptune_fusion.bench.workloads import attention_options, make_inputs
    from neptune_fusion.frontend.attention import AttentionCache
    from neptune_fusion.runtime.disk_cache import DiskCache
    dev = torch.device("cuda")
    q, k, v = make_inputs(op, seq, torch.float16, dev)
    kw = attention_options(op, seq, dev)
    slopes = kw["alibi_slopes"]
    cache = AttentionCache(store=DiskCache(auto_store))
    out = ops.attention(q, k, v, cache=cache, **kw)       # the stored (cold run's) choice
    ref = reference_attention(op, q, k, v)
    err = relative_error(out, ref)
    (auto,) = cache.kernels()
    tensors = kernel_tensors(q, k, v, slopes)
    chosen = auto.schedule_for(*tensors)
    problem, device, space = auto.space_for(*tensors)
    if only is not None:   # --best-from: the recorded best schedules, timed next to auto
        from neptune_fusion.schedule.schedule import Schedule
        # older records carry the removed split-k "merge" field (always "kernel" there)
        recorded = [Schedule.from_dict({k: v for k, v in d.items() if k != "merge"})
                    for d in only]
        space = [chosen] + [s for s in recorded if s != chosen]
    rows = []
    want = out
    for s in space:
        t0 = time.perf_counter()
        try:
            kern = auto.kernel_of(s)
            got = kern(*tensors)
            got = got.reshape(out.shape)
            e = (got.double() - want.double()).abs().max().item()
            if not e < 2e-2 * max(1.0, want.double().abs().max().item()):
                raise RuntimeError(f"disagrees with the auto output by {e:.3g}")
            ms = graph_timer(rep_ms=20)(lambda kk=kern: kk.launch(*tensors))
            rows.append({"schedule": s.to_dict(), "ms": ms,
                         "compile_s": time.perf_counter() - t0})
        except Exception as exc:  # noqa: BLE001 - a schedule that fails is reported
            rows.append({"schedule": s.to_dict(), "ms": None,
                         "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"})
        print(f"    {s.strategy} {s.block_m}x{s.block_n} k{s.splits} w{s.num_warps} "
              f"st{s.num_stages}: {rows[-1].get('ms') or rows[-1].get('error')}", flush=True)
    auto_ms = graph_timer(rep_ms=50)(lambda: auto.kernel_of(chosen).launch(*tensors))
    ok = [r for r in rows if r["ms"] is not None]
    best = min(ok, key=lambda r: r["ms"])
    trials = [{"schedule": t.schedule.to_dict(), "model_ms": t.predicted_s * 1e3,
               "measured_ms": None if t.measured_s is None else t.measured_s * 1e3,
               "error": t.error} for t in (auto.last_choice.trials or ())]
    return {"rel_error": err, "auto": chosen.to_dict(), "auto_ms": auto_ms,
            "best": best["schedule"], "best_ms": best["ms"], "ratio": auto_ms / best["ms"],
            "space": len(space), "failed": len(rows) - len(ok), "rows": rows,
            "choice_source": auto.last_choice.source, "trials": trials,
            "problem": problem.__dict__ if hasattr(problem, "__dict__") else str(problem)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="PF-Global,PF-Causal,PF-GQA,PF-ALiBi,PF-SoftCap,"
                    "PF-Window,DC-Causal,DC-GQA,DC-ALiBi,DC-SoftCap")
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--out", default="autotune-out")
    ap.add_argument("--no-exhaustive", action="store_true")
    ap.add_argument("--profile-warm", action="store_true",
                    help="a third process profiles its warm first call (cProfile in the log)")
    ap.add_argument("--best-from", nargs="*", default=None, metavar="JSON",
                    help="instead of the whole space, time the auto choice next to the best "
                    "schedules recorded in these earlier autotune.json files (same process)")
    args = ap.parse_args()
    import torch
    import triton

    from neptune_fusion.bench.workloads import select_operators
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": triton.__version__, "seq": args.seq}
    recorded: dict[str, list] = {}
    for f in args.best_from or ():
        for r in json.loads(Path(f).read_text())["results"]:
            if r.get("best"):
                recorded.setdefault(r["op"], []).append(r["best"])
    results = []
    for op in select_operators(args.ops.split(",")):
        root = Path(tempfile.mkdtemp(prefix="nf-autotune-"))
        env = dict(os.environ, NEPTUNE_FUSION_CACHE_DIR=str(root / "nf"),
                   TRITON_CACHE_DIR=str(root / "triton"), NEPTUNE_FUSION_LOG="1")
        print(f"== {op.name}", flush=True)
        row = {"op": op.name}
        try:
            row["cold"] = child(op.name, args.seq, env)
            print(row["cold"]["log"][-4000:], flush=True)
            row["warm"] = child(op.name, args.seq, env)
            print(f"  cold {row['cold']['first_s']:.2f} s, warm {row['warm']['first_s']:.3f}"
                  f" s (in-process again {row['warm']['again_s'] * 1e3:.1f} ms)", flush=True)
            print(f"  Triton's own first launch of a cached trivial kernel in the warm "
                  f"process: {row['warm']['triton_first_launch_s'] * 1e3:.1f} ms", flush=True)
            if args.profile_warm:
                row["profiled"] = child(op.name, args.seq, env, profile=True)
                print(row["profiled"]["log"][-5000:], flush=True)
            if not args.no_exhaustive:
                only = None if args.best_from is None else recorded.get(op.name, [])
                row.update(exhaustive(op, args.seq, str(root / "nf"), only))
                print(f"  auto {row['auto_ms']:.4f} ms vs best {row['best_ms']:.4f} ms: "
                      f"{row['ratio']:.3f} (space {row['space']}, failed {row['failed']}), "
                      f"rel err {row['rel_error']:.2e}", flush=True)
        except Exception as exc:  # noqa: BLE001 - one operator's failure is reported
            row["error"] = f"{type(exc).__name__}: {exc}"[:3000]
            print("  FAILED", row["error"], flush=True)
        results.append(row)
        (out / "autotune.json").write_text(json.dumps({"meta": meta, "results": results},
                                                      indent=1))
    lines = [f"# Auto-scheduling check, {meta['gpu']}, {meta['date']}",
             f"torch {meta['torch']}, Triton {meta['triton']}, S={args.seq}, fp16", "",
             "| op | cold s | warm first call s | warm again ms | auto ms | best ms | "
             "auto/best | space |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r and "cold" not in r:
            lines.append(f"| {r['op']} | failed: {r['error'][:80]} |||||||")
            continue
        c, w = r.get("cold", {}), r.get("warm", {})
        lines.append(
            f"| {r['op']} | {c.get('first_s', float('nan')):.2f} | "
            f"{w.get('first_s', float('nan')):.3f} | {w.get('again_s', float('nan')) * 1e3:.1f}"
            f" | {r.get('auto_ms', float('nan')):.4f} | {r.get('best_ms', float('nan')):.4f} | "
            f"{r.get('ratio', float('nan')):.3f} | {r.get('space', '')} |")
    (out / "autotune.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
