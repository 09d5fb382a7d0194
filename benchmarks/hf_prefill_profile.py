"""Where a Hugging Face prefill spends its GPU time, per attention backend.

A measurement tool (docs/transformers.md, "Speed"): the Llama-1B-shaped model of
``hf_models.py`` (bf16, random weights, a static cache), eager, one prefill of
``--prompt`` tokens per backend after two warm-ups (which compile and tune), timed with
CUDA events (median of five) and then profiled once with ``torch.profiler``; writes the
top CUDA kernels of each backend (``--out``/``prefill-<impl>.txt``) and prints the
times. Usage (GPU): ``PYTHONPATH=src:benchmarks python benchmarks/hf_prefill_profile.py
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
            acts = [torch.profiler.ProfilerActivity.CPU]
            if dev.type == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            with torch.profiler.profile(activities=acts) as prof:
                run.prefill()
        key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
        text = prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=90)
        (out / f"prefill-{impl}.txt").write_text(text)
        rows.append({"impl": impl, "prefill_ms": times[2], "all_ms": times})
        print(json.dumps(rows[-1]), flush=True)
    (out / "prefill.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
