"""Host time of a Hugging Face model's attention modules per decode step, per backend.

Wraps the model's attention module class (``LlamaAttention``, ``Gemma2Attention``) in a
wall-clock timer (no synchronisation: in an eager decode loop the host is the bottleneck,
so this is the host's time, projections included) and runs 32 greedy decode steps after
a 4096-token prefill and 8 warm-up steps, with the static cache of
``benchmarks/hf_models.py``. Prints the step time and the attention modules' time per
step, split into sliding-window and full layers.

Usage (GPU): ``python benchmarks/hf_host.py --model gemma2 --impls eager,neptune_fusion``
"""
from __future__ import annotations

import argparse
import importlib
import time

import torch
import transformers
from hf_models import Run, config

from neptune_fusion.integrations.transformers import register

CLASSES = {"llama": ("llama", "LlamaAttention"), "gemma2": ("gemma2", "Gemma2Attention")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma2", choices=sorted(CLASSES))
    ap.add_argument("--impls", default="eager,neptune_fusion")
    ap.add_argument("--prompt", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=32)
    a = ap.parse_args()
    register()
    pkg, cls_name = CLASSES[a.model]
    cls = getattr(importlib.import_module(f"transformers.models.{pkg}.modeling_{pkg}"),
                  cls_name)
    spent: dict[str, float] = {}
    forward = cls.forward

    def timed(self, *args, **kw):
        t0 = time.perf_counter()
        out = forward(self, *args, **kw)
        key = "sliding" if getattr(self, "sliding_window", None) else "full"
        spent[key] = spent.get(key, 0.0) + time.perf_counter() - t0
        return out
    cls.forward = timed
    cfg = config(a.model, False)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, a.prompt), device="cuda")
    for impl in a.impls.split(","):
        model.set_attn_implementation(impl)
        run = Run(model, cfg, prompt, a.steps + 8, "eager")
        with torch.no_grad():
            first = run.prefill().argmax(-1, keepdim=True)
            run.decode(8, first)
            torch.cuda.synchronize()
            spent.clear()
            t0 = time.perf_counter()
            run.decode(a.steps, first)
            torch.cuda.synchronize()
            step = (time.perf_counter() - t0) / a.steps
        parts = ", ".join(f"{k} layers {v / a.steps * 1e3:.2f} ms" for k, v in spent.items())
        print(f"{a.model} {impl}: decode step {step * 1e3:.2f} ms; attention modules per "
              f"step: {parts}", flush=True)


if __name__ == "__main__":
    main()
