"""Where a Hugging Face decode step spends its time, per attention backend and mode.

A measurement tool for the backend's decode (issue 19: Llama-1B through
``backend="neptune_fusion"`` decoded at 0.76x Inductor on 2026-12-03, not diagnosed).
The Llama-1B-shaped model of ``hf_models.py`` (bf16, random weights, a static cache),
per ``--runs`` entry ``impl:mode`` (``sdpa:compile``, ``sdpa:backend``,
``neptune_fusion:eager``, ``neptune_fusion:compile``, ...): a prefill
of ``--prompt`` tokens and ``--steps`` greedy decode steps to warm up (compile, tune,
both decode graphs), then for ``--steps`` more steps: the wall time per step (CUDA
events), the host's enqueue time of one step (its wall time before any
synchronisation), and a ``torch.profiler`` profile of them: the GPU's busy time per step
(the kernels' own time summed), the kernel launches per step, the calls of
neptune-fusion's ops per step, and the top kernels and CPU ops
(``--out``/``decode-<impl>-<mode>.txt``). Wall near busy: the GPU bounds the step;
wall near enqueue: the host does.

Usage (GPU): ``PYTHONPATH=src:benchmarks python benchmarks/hf_decode_profile.py
--out DIR``; ``--smoke`` runs a tiny model on CPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import threading
import time
from pathlib import Path

import torch


def main(argv=None) -> None:
    from hf_models import Run, config, snapshot_flex_mask
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompt", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--runs", default="sdpa:compile,sdpa:backend")
    ap.add_argument("--out", default=".")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--python", action="store_true",
                    help="also profile the decode steps' Python (cProfile): the functions "
                         "with the most own time, to --out/decode-<impl>-<mode>-python.txt")
    ap.add_argument("--rounds", type=int, default=0,
                    help="then time the decode of every --runs entry this many times, the "
                         "entries taking turns in one process, and report each one's wall "
                         "ms per step and their median (one host's speed drifts within a "
                         "minute: H200, 2026-12-04; default 0, off)")
    args = ap.parse_args(argv)
    import transformers

    import neptune_fusion.dynamo  # noqa: F401  (registers the backend without the package)
    from neptune_fusion.integrations.transformers import register
    register()   # attn_implementation="neptune_fusion" in --runs
    snapshot_flex_mask(eager_block_mask=True)   # flex_attention in --runs: see hf_models
    dev = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    cfg = config("llama", args.smoke)
    torch.manual_seed(0)
    with torch.device(dev):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    n = 12 if args.smoke else args.prompt
    steps = min(args.steps, 4) if args.smoke else args.steps
    prompt = torch.randint(0, cfg.vocab_size, (1, n), device=dev)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = {}
    if args.rounds:   # every entry's compiled graphs stay alive for the rounds
        torch._dynamo.config.cache_size_limit = 64
    for spec in args.runs.split(","):
        impl, mode = spec.split(":")
        if not args.rounds:
            torch._dynamo.reset()
        model.set_attn_implementation(impl)
        run = runs[spec] = Run(model, cfg, prompt, 2 * steps, mode)
        with torch.no_grad():
            first = run.prefill().argmax(-1, keepdim=True)
            run.decode(steps, first)                   # warm-up: both decode graphs
            row = profile_steps(run, first, steps, dev, out / f"decode-{impl}-{mode}.txt")
            if args.python:
                python_profile(run, first, steps, dev,
                               out / f"decode-{impl}-{mode}-python.txt")
        row.update(impl=impl, mode=mode, prompt=n, steps=steps,
                   device=torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
                   torch=torch.__version__)
        print(json.dumps(row), flush=True)
        with open(out / "decode_profile.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
    if args.rounds:
        taking_turns(runs, args.rounds, steps, dev, out)


def taking_turns(runs: dict, rounds: int, steps: int, dev, out: Path) -> None:
    """Each run's wall ms per decode step, ``rounds`` times, the runs taking turns."""
    import statistics
    walls: dict = {spec: [] for spec in runs}
    with torch.no_grad():
        firsts = {}
        for spec, r in runs.items():
            impl, mode = spec.split(":")
            if mode == "eager":
                r.model.set_attn_implementation(impl)
            firsts[spec] = r.prefill().argmax(-1, keepdim=True)
        for _ in range(rounds):
            for spec, r in runs.items():
                impl, mode = spec.split(":")
                if mode == "eager":   # an eager model calls whatever was set last
                    r.model.set_attn_implementation(impl)
                r.prefill()
                sync(dev)
                t0 = time.perf_counter()
                r.decode(steps, firsts[spec])
                sync(dev)
                walls[spec].append((time.perf_counter() - t0) * 1e3 / steps)
    row = {"rounds": {s: [round(w, 3) for w in ws] for s, ws in walls.items()},
           "median_ms_per_step": {s: statistics.median(ws) for s, ws in walls.items()}}
    print(json.dumps(row), flush=True)
    with open(out / "decode_profile.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def profile_steps(run, first, steps: int, dev, table: Path) -> dict:
    """Wall, enqueue and GPU-busy milliseconds per decode step after a fresh prefill."""
    run.prefill()
    sync(dev)
    t0 = time.perf_counter()
    run.decode(1, first)
    enqueue = (time.perf_counter() - t0) * 1e3
    sync(dev)
    run.prefill()
    sync(dev)
    gcs = [g["collections"] for g in gc.get_stats()]
    t0 = time.perf_counter()
    run.decode(steps, first)
    sync(dev)
    wall = (time.perf_counter() - t0) * 1e3 / steps
    gcs = [g["collections"] - n for g, n in zip(gc.get_stats(), gcs)]
    run.prefill()   # the same with the collector off: does collection bound the step?
    sync(dev)
    gc.disable()
    try:
        t0 = time.perf_counter()
        run.decode(steps, first)
        sync(dev)
        wall_gc_off = (time.perf_counter() - t0) * 1e3 / steps
    finally:
        gc.enable()
    run.prefill()
    sync(dev)
    hits = bound_calls()
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        run.decode(steps, first)
        sync(dev)
    hits = bound_calls() - hits
    events = prof.key_averages()
    busy = sum(e.self_device_time_total for e in events) / 1e3 / steps
    launches = sum(e.count for e in events if e.device_type.name == "CUDA") / steps
    ours = sum(e.count for e in events if e.key.startswith("neptune_fusion::")) / steps
    key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    table.write_text(events.table(sort_by=key, row_limit=30, max_name_column_width=90)
                     + "\n" + events.table(sort_by="cpu_time_total", row_limit=30,
                                           max_name_column_width=90))
    return {"wall_ms_per_step": wall, "wall_ms_per_step_gc_off": wall_gc_off,
            "gc_collections_per_generation": gcs, "gc_objects": len(gc.get_objects()),
            "threads": [t.name for t in threading.enumerate()], "enqueue_ms_first_step": enqueue,
            "gpu_busy_ms_per_step": busy, "gpu_events_per_step": launches,
            "neptune_ops_per_step": ours, "bound_calls_per_step": hits / steps}


def bound_calls() -> int:
    """The calls of the backend's fused ops so far that took a bound launch
    (``runtime/torch_ops.KernelEntry.hits``); the rest took the general path."""
    from neptune_fusion.runtime import torch_ops
    return sum(getattr(e, "hits", 0) for e in torch_ops._ENTRIES)


def python_profile(run, first, steps: int, dev, table: Path) -> None:
    """The decode steps under cProfile: the 40 functions with the most own time, and the
    40 with the most time under them."""
    import cProfile
    import io
    import pstats
    run.prefill()
    sync(dev)
    prof = cProfile.Profile()
    prof.enable()
    run.decode(steps, first)
    sync(dev)
    prof.disable()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(40)
    table.write_text(text.getvalue())


def sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
