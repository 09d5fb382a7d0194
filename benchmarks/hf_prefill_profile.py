"""Where a Hugging Face prefill spends its GPU time, per attention backend.

A measurement tool (docs/transformers.md, "Speed"): the Llama-1B-shaped model of
``hf_models.py`` (bf16, random weights, a static cache), eager, one prefill of
``--prompt`` tokens per backend after two warm-ups (which compile and tune), timed with
CUDA events (median of five) and then profiled once with ``torch.profiler``; writes the
top CUDA kernels of each backend (``--out``/``prefill-<impl>.txt``) and prints the
times. Also per backend: the host's enqueue time of one prefill (the call's wall time
before any synchronisation: near the GPU time means the host bounds it), the operations
that synchronise with the host (``torch.cuda.set_sync_debug_mode``, each with the
innermost frames of its stack) and, with ``--trace``, the profile as a gzipped Chrome
trace (``prefill-<impl>.json.gz``) to find where the GPU idles.
Usage (GPU): ``PYTHONPATH=src:benchmarks python benchmarks/hf_prefill_profile.py
--out DIR``; ``--smoke`` runs a tiny model on CPU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def main(argv=None) -> None:
    from hf_models import Run, config, timed
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompt", type=int, default=8192)
    ap.add_argument("--impls", default="sdpa,neptune_fusion")
    ap.add_argument("--out", default=".")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--trace", action="store_true", help="write gzipped Chrome traces")
    args = ap.parse_args(argv)
    import transformers

    from neptune_fusion.integrations.transformers import register
    register()
    dev = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    cfg = config("llama", args.smoke)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(dev, dtype).eval()
    n = 16 if args.smoke else args.prompt
    prompt = torch.randint(0, cfg.vocab_size, (1, n), device=dev)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for impl in args.impls.split(","):
        model.set_attn_implementation(impl)
        run = Run(model, cfg, prompt, 8, "eager")
        with torch.no_grad():
            run.prefill()
            run.prefill()
            times = sorted(timed(run.prefill, dev)[1] for _ in range(5))
            host = sorted(enqueue_ms(run.prefill, dev) for _ in range(5))
            syncs = synchronising_calls(run.prefill, dev)
            acts = [torch.profiler.ProfilerActivity.CPU]
            if dev.type == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            with torch.profiler.profile(activities=acts) as prof:
                run.prefill()
        key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
        text = prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=90)
        (out / f"prefill-{impl}.txt").write_text(text)
        if args.trace:
            import gzip
            import tempfile
            with tempfile.TemporaryDirectory() as tmp:
                prof.export_chrome_trace(f"{tmp}/t.json")
                data = Path(f"{tmp}/t.json").read_bytes()
            (out / f"prefill-{impl}.json.gz").write_bytes(gzip.compress(data))
        rows.append({"impl": impl, "prefill_ms": times[2], "all_ms": times,
                     "enqueue_ms": host[2], "syncs": syncs})
        print(json.dumps(rows[-1]), flush=True)
    (out / "prefill.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def enqueue_ms(fn, dev) -> float:
    """Wall milliseconds until ``fn`` returns, the GPU idle before it (no sync inside)."""
    import time
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    ms = (time.perf_counter() - t0) * 1e3
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return ms


def synchronising_calls(fn, dev) -> list[str]:
    """The innermost frames of each operation that synchronises with the host in ``fn``."""
    import traceback
    import warnings
    if dev.type != "cuda":
        return []
    found: list[str] = []

    def show(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-2]
                  if "warnings" not in f.filename][-4:]
        found.append(" <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}"
                                 for f in reversed(frames)))
    old = warnings.showwarning
    warnings.showwarning = show
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = old
    return found


if __name__ == "__main__":
    main()
