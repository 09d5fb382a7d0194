"""Hugging Face models end to end: prefill and greedy decode tokens/s per attention backend.

Usage on a GPU (random weights from a config: nothing is downloaded):
    PYTHONPATH=src python benchmarks/hf_models.py --model llama --out DIR \
        [--prompt 8192] [--steps 256] [--impls sdpa,flex_attention,neptune_fusion] \
        [--modes eager,compile]
    PYTHONPATH=src python benchmarks/hf_models.py --smoke      # CPU: tiny, checks the script

Models (bf16, batch 1, a static cache of prompt + steps slots):
* ``llama``: Llama-3.2-1B-shaped (hidden 2048, 16 layers, 32/8 heads of 64, MLP 8192,
  vocabulary 128256, tied embeddings): about 1.2 B parameters.
* ``gemma2``: Gemma2-shaped at about the same size (hidden 2048, 18 layers, 8/4 heads of
  128, MLP 8192, vocabulary 32000, logit soft-cap 50, a 4096-token window on every other
  layer, final soft-cap 30). Head dim 128 rather than Gemma2-2B's 256. SDPA cannot serve
  soft-capping; its baseline is transformers' eager attention.

Per (backend, mode): the prefill of ``--prompt`` random tokens (CUDA events, median of
three after one warm-up that also compiles/tunes) and ``--steps`` greedy decode steps
(each step's token fed back; the whole loop timed once after a warm-up loop of 8 steps).
Progress lines with the elapsed time go to stderr.
``compile`` is ``torch.compile(model.forward)``, ``graphs`` the same with
``mode="reduce-overhead"`` (CUDA graphs, a graph step per call), ``backend``
``torch.compile(model.forward, backend="neptune_fusion")`` (issue 19: meant with ``--impls
sdpa``, the chains it finds fused, the rest Inductor's; its ratios and checks are against
the baseline's ``compile`` row, Inductor), ``backend-graphs`` the same with
``mode="reduce-overhead"`` (against the ``graphs`` row). A backend that fails
there is recorded with its error, not fatal. Checks against the first backend: the
prefill's last-token logits (relative error, bf16), the logits of four decode steps fed
fixed tokens after a prefill (relative error: greedy tokens alone hid a wrong decode
mask), and the share of decoded tokens equal to the first backend's (random weights make
near-ties, so once one token differs the rest follow another path).

FlexAttention through transformers is run with its mask's offsets copied when the mask
is built (:func:`snapshot_flex_mask`): transformers' flex mask (5.24 on the CPU) closes
over a static cache's live ``cumulative_length`` tensor, which each layer advances in
place before its attention reads the mask, so every call after the first read a mask
shifted by the new tokens (prefill logits 2.5e-1 and decode logits 3e-1 from SDPA's on
the smoke model; 1.6e-7 with the copy).

Each run appends its rows to ``--out``/``hf_models-<model>.jsonl`` (run backends in
separate processes to bound each one's time); ``--report`` rewrites ``hf_models-<model>.md``
from them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import traceback
from pathlib import Path

import torch


def config(name: str, smoke: bool):
    import transformers
    if name == "llama":
        kw = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=64, intermediate_size=8192,
                  vocab_size=128256, tie_word_embeddings=True, rope_theta=500000.0,
                  max_position_embeddings=131072)
        small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, intermediate_size=96, vocab_size=97)
        return transformers.LlamaConfig(**(kw | small if smoke else kw))
    if name == "gemma2":
        kw = dict(hidden_size=2048, num_hidden_layers=18, num_attention_heads=8,
                  num_key_value_heads=4, head_dim=128, intermediate_size=8192,
                  vocab_size=32000, attn_logit_softcapping=50.0,
                  final_logit_softcapping=30.0, sliding_window=4096,
                  query_pre_attn_scalar=128, max_position_embeddings=131072)
        small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, intermediate_size=96, vocab_size=97,
                     sliding_window=6, query_pre_attn_scalar=16)
        return transformers.Gemma2Config(**(kw | small if smoke else kw))
    raise SystemExit(f"unknown --model {name!r}: llama or gemma2")


def snapshot_flex_mask(eager_block_mask: bool = False) -> None:
    """Register transformers' flex mask builder again, with tensor ``q_offset`` /
    ``kv_offset`` arguments copied when the mask is built (see the module docstring).
    ``eager_block_mask``: build the block mask without compiling it (``_compile=False``)."""
    try:
        from transformers import masking_utils
        from transformers.masking_utils import AttentionMaskInterface, flex_attention_mask
    except ImportError:   # an older transformers without the mask interface
        return
    if eager_block_mask and hasattr(masking_utils, "create_block_mask"):
        build = masking_utils.create_block_mask

        def create_block_mask(*args, **kw):
            return build(*args, **(kw | {"_compile": False}))
        masking_utils.create_block_mask = create_block_mask

    def mask(*args, **kw):
        for key in ("q_offset", "kv_offset"):
            if isinstance(kw.get(key), torch.Tensor):
                kw[key] = kw[key].clone()
        return flex_attention_mask(*args, **kw)
    AttentionMaskInterface.register("flex_attention", mask)


def static_cache(model, cfg, length: int, device, dtype):
    from transformers import StaticCache
    try:
        return StaticCache(config=cfg, max_cache_len=length)
    except TypeError:   # transformers 4.5x
        return StaticCache(config=cfg, max_batch_size=1, max_cache_len=length, device=device,
                           dtype=dtype)


class Run:
    """One backend in one mode over one model: prefill, then greedy decode."""

    def __init__(self, model, cfg, prompt, steps: int, mode: str):
        self.model, self.cfg, self.prompt, self.steps = model, cfg, prompt, steps
        self.dev, self.dtype = prompt.device, next(model.parameters()).dtype
        self.cache = static_cache(model, cfg, prompt.shape[1] + steps + 8, self.dev, self.dtype)
        self.fwd = model.forward
        if mode == "compile":
            self.fwd = torch.compile(model.forward)
        elif mode == "backend":   # the whole model through neptune-fusion's backend
            self.fwd = torch.compile(model.forward, backend="neptune_fusion")
        elif mode in ("graphs", "backend-graphs"):
            # the cache's tensors made outside the compiled call, so transformers marks
            # them static addresses (it does not while tracing): CUDA graphs then update
            # them in place instead of skipping the mutated inputs or copying them
            with torch.no_grad():
                model(input_ids=prompt[:, :1], past_key_values=self.cache, use_cache=True,
                      cache_position=torch.zeros(1, dtype=torch.long, device=self.dev))
            self.cache.reset()
            compiled = torch.compile(model.forward, mode="reduce-overhead",
                                     backend="neptune_fusion" if mode != "graphs" else "inductor")

            def fwd(**kw):   # a new CUDA-graph step per call; outputs copied out of the pool
                torch.compiler.cudagraph_mark_step_begin()
                return compiled(**kw).logits.clone()
            self.fwd = fwd

    def prefill(self):
        self.cache.reset()
        n = self.prompt.shape[1]
        pos = torch.arange(n, device=self.dev)
        out = self.fwd(input_ids=self.prompt, past_key_values=self.cache, cache_position=pos,
                       use_cache=True, logits_to_keep=1)
        return logits_of(out)[:, -1].float()

    def check_decode(self, tokens):
        """The logits of one decode step per fixed token after a prefill: comparable
        across backends whatever their greedy tokens."""
        self.prefill()
        n, out = self.prompt.shape[1], []
        for t in range(tokens.shape[1]):
            pos = torch.tensor([n + t], device=self.dev)
            out.append(logits_of(self.fwd(input_ids=tokens[:, t:t + 1],
                                          past_key_values=self.cache, cache_position=pos,
                                          use_cache=True))[:, -1].float())
        return torch.stack(out, 1)

    def decode(self, steps: int, first):
        tok, n, toks = first, self.prompt.shape[1], []
        for t in range(steps):
            pos = torch.tensor([n + t], device=self.dev)
            logits = logits_of(self.fwd(input_ids=tok, past_key_values=self.cache,
                                        cache_position=pos, use_cache=True))
            tok = logits[:, -1:].argmax(-1)
            toks.append(tok)
        return torch.cat(toks, dim=1)


def logits_of(out):
    return out if isinstance(out, torch.Tensor) else out.logits


def timed(fn, dev):
    if dev.type != "cuda":
        t0 = time.perf_counter()
        out = fn()
        return out, (time.perf_counter() - t0) * 1e3
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    out = fn()
    b.record()
    torch.cuda.synchronize()
    return out, a.elapsed_time(b)


def measure(model, cfg, prompt, steps: int, impl: str, mode: str) -> tuple[dict, Run]:
    """Warm-up, prefill, decode and logits of one backend in one mode (its first round)."""
    model.set_attn_implementation(impl)
    run = Run(model, cfg, prompt, steps, mode)
    t0 = time.perf_counter()
    with torch.no_grad():
        logits = run.prefill()                    # warm-up: compiles, tunes
        sync(prompt.device)
        note(f"{impl} {mode}: prefill warm-up done", t0)
        pre = sorted(timed(run.prefill, prompt.device)[1] for _ in range(3))[1]
        note(f"{impl} {mode}: prefill {pre:.2f} ms", t0)
        first = logits.argmax(-1, keepdim=True)
        run.decode(8, first)                      # decode warm-up (compiles its graph)
        sync(prompt.device)
        warm_s = time.perf_counter() - t0
        note(f"{impl} {mode}: decode warm-up done", t0)
        logits = run.prefill()
        toks, dec = timed(lambda: run.decode(steps, logits.argmax(-1, keepdim=True)),
                          prompt.device)
        note(f"{impl} {mode}: decode {steps / dec * 1e3:.1f} tok/s", t0)
        checked = run.check_decode(prompt[:, :4])
    n = prompt.shape[1]
    return {"impl": impl, "mode": mode, "warmup_s": round(warm_s, 2), "prefill_ms": pre,
            "prefill_tok_s": n / pre * 1e3, "decode_ms": dec, "decode_tok_s": steps / dec * 1e3,
            "logits": logits, "tokens": toks, "decode_logits": checked}, run


def again(model, run: Run, row: dict) -> None:
    """One more round of an eager row (already warm): its prefill and decode times are
    appended to the row's lists, and the row's times become the lists' medians."""
    model.set_attn_implementation(row["impl"])
    with torch.no_grad():
        pre = timed(run.prefill, run.dev)[1]
        logits = run.prefill()
        dec = timed(lambda: run.decode(run.steps, logits.argmax(-1, keepdim=True)),
                    run.dev)[1]
    row.setdefault("prefill_ms_rounds", [row["prefill_ms"]]).append(pre)
    row.setdefault("decode_ms_rounds", [row["decode_ms"]]).append(dec)
    n = run.prompt.shape[1]
    row["prefill_ms"] = statistics.median(row["prefill_ms_rounds"])
    row["decode_ms"] = statistics.median(row["decode_ms_rounds"])
    row["prefill_tok_s"] = n / row["prefill_ms"] * 1e3
    row["decode_tok_s"] = run.steps / row["decode_ms"] * 1e3


def note(text: str, t0: float) -> None:
    """A progress line on stderr: where a slow backend spends its time (a run killed by
    its time limit still says how far it got)."""
    import sys
    print(f"[{time.perf_counter() - t0:7.1f} s] {text}", file=sys.stderr, flush=True)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


# the row a mode's ratios and checks are against
BASE_MODE = {"backend": "compile", "backend-graphs": "graphs"}


def table(rows: list[dict], base: str) -> str:
    ref = {r["mode"]: r for r in rows if r["impl"] == base and "error" not in r}
    lines = ["| backend | mode | warm-up s | prefill ms | prefill tok/s | x base | "
             "decode tok/s | x base | logits rel. err | decode logits rel. err | "
             "same tokens |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['impl']} | {r['mode']} | failed: {r['error'][:90]} |"
                         " | | | | | | | |")
            continue
        b = ref.get(BASE_MODE.get(r["mode"], r["mode"]))
        xp = f"{r['prefill_tok_s'] / b['prefill_tok_s']:.2f}" if b else "-"
        xd = f"{r['decode_tok_s'] / b['decode_tok_s']:.2f}" if b else "-"
        lines.append(f"| {r['impl']} | {r['mode']} | {r['warmup_s']} | {r['prefill_ms']:.1f} "
                     f"| {r['prefill_tok_s']:.0f} | {xp} | {r['decode_tok_s']:.1f} | {xd} | "
                     f"{r.get('logits_err', float('nan')):.2e} | "
                     f"{r.get('decode_err', float('nan')):.2e} | {r.get('same_tokens', 0):.2f} |")
    return "\n".join(lines)


_TENSORS = ("logits", "tokens", "decode_logits")   # saved per row, compared by report()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama")
    ap.add_argument("--prompt", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--impls", default=None)
    ap.add_argument("--modes", default=None,
                    help="eager, compile, graphs, backend, backend-graphs "
                         "(default eager,compile; smoke: eager)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--stacks", type=float, default=0.0, metavar="SECONDS",
                    help="print every thread's Python stack to stderr every SECONDS "
                         "(where a slow warm-up spends its time; default off). faulthandler "
                         "crashed the process once (SIGSEGV) when it fired while "
                         "Inductor's compile threads ran: a diagnostic, not for timings")
    ap.add_argument("--flex-eager-mask", action="store_true",
                    help="build FlexAttention's block mask without compiling it: on the H200 "
                         "(Triton 3.6) transformers' compiled create_block_mask for an "
                         "8192-token prompt did not finish compiling in 240 s (2026-12-03)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="eager mode: measure every backend this many times, the backends "
                         "taking turns, and report the medians (an eager decode is "
                         "host-bound, and one host's speed drifts by up to 1.7x within a "
                         "minute: H200 host, 2026-12-03; default 1)")
    ap.add_argument("--report", action="store_true",
                    help="only write the table from the rows earlier runs left in --out")
    a = ap.parse_args(argv)
    if a.report:
        return report(Path(a.out), a.model)
    if a.stacks > 0:
        import faulthandler
        faulthandler.dump_traceback_later(a.stacks, repeat=True)
    # registers backend="neptune_fusion" also where the package is not installed (its
    # entry point missing: the device runs from src/)
    import neptune_fusion.dynamo  # noqa: F401
    from neptune_fusion.integrations.transformers import register
    register()
    snapshot_flex_mask(a.flex_eager_mask)
    import transformers
    smoke = a.smoke or not torch.cuda.is_available()
    dev = torch.device("cpu" if smoke else "cuda")
    dtype = torch.float32 if smoke else torch.bfloat16
    prompt_len, steps = (12, 4) if smoke else (a.prompt, a.steps)
    default = ("sdpa,flex_attention,neptune_fusion" if a.model == "llama"
               else "eager,flex_attention,neptune_fusion")
    impls = (a.impls or (default.replace(",flex_attention", "") if smoke else default)).split(",")
    modes = (a.modes or ("eager" if smoke else "eager,compile")).split(",")
    cfg = config(a.model, smoke)
    torch.manual_seed(0)
    with torch.device(dev):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, prompt_len), device=dev)
    rows, eager = [], []
    for mode in modes:
        for impl in impls:
            torch._dynamo.reset()
            try:
                row, run = measure(model, cfg, prompt, steps, impl, mode)
                rows.append(row)
                if mode == "eager":
                    eager.append((run, row))
            except Exception as err:   # one failing backend must not lose the others
                traceback.print_exc()
                rows.append({"impl": impl, "mode": mode,
                             "error": f"{type(err).__name__}: {err}".replace("\n", " ")})
            print(rows[-1].get("error") or {k: v for k, v in rows[-1].items()
                                             if k not in _TENSORS}, flush=True)
    t0 = time.perf_counter()
    for r in range(1, a.rounds):   # the eager backends take turns
        for run, row in eager:
            again(model, run, row)
        note(f"eager round {r + 1} of {a.rounds} done", t0)
    out = Path(a.out or "/tmp/hf_models")
    out.mkdir(parents=True, exist_ok=True)
    tensors = Path("/tmp/hf_models_tensors")
    tensors.mkdir(exist_ok=True)
    with open(out / f"hf_models-{a.model}.jsonl", "a") as f:
        for r in rows:
            if "error" not in r:
                torch.save({k: r.pop(k).cpu() for k in _TENSORS},
                           tensors / f"{a.model}-{r['impl']}-{r['mode']}.pt")
            r |= {"prompt": prompt_len, "steps": steps,
                  "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
                  "torch": torch.__version__, "transformers": transformers.__version__,
                  "date": time.strftime("%Y-%m-%d")}
            f.write(json.dumps(r) + "\n")
    report(out, a.model)


def report(out: Path, model: str) -> None:
    """The table of every row in ``out/hf_models-<model>.jsonl`` (one line per backend and
    mode, possibly from several processes), checked against the first row's backend."""
    rows = [json.loads(x) for x in (out / f"hf_models-{model}.jsonl").read_text().splitlines()]
    tensors = Path("/tmp/hf_models_tensors")
    base = rows[0]["impl"]
    for r in rows:
        mine = tensors / f"{model}-{r['impl']}-{r['mode']}.pt"
        ref = tensors / f"{model}-{base}-{BASE_MODE.get(r['mode'], r['mode'])}.pt"
        if "error" not in r and mine.exists() and ref.exists():
            a, b = torch.load(mine), torch.load(ref)
            r["logits_err"] = float((a["logits"] - b["logits"]).norm() / b["logits"].norm())
            if "decode_logits" in a and "decode_logits" in b:
                d, e = a["decode_logits"], b["decode_logits"]
                r["decode_err"] = float((d - e).norm() / e.norm())
            r["same_tokens"] = float((a["tokens"] == b["tokens"]).float().mean())
    r0 = rows[0]
    text = (f"# {model}: prefill {r0['prompt']} tokens, {r0['steps']} greedy decode steps\n\n"
            f"{r0['device']}, torch {r0['torch']}, transformers {r0['transformers']}, "
            f"{r0['date']}; baseline: {base}\n\n{table(rows, base)}\n")
    spread = [f"| {r['impl']} | {len(r['decode_ms_rounds'])} | "
              f"{min(r['prefill_ms_rounds']):.1f}-{max(r['prefill_ms_rounds']):.1f} | "
              f"{r['steps'] / max(r['decode_ms_rounds']) * 1e3:.1f}-"
              f"{r['steps'] / min(r['decode_ms_rounds']) * 1e3:.1f} |"
              for r in rows if "decode_ms_rounds" in r]
    if spread:   # --rounds: the table holds medians; the ranges say how far they moved
        text += ("\nEager rows are medians over rounds in which the backends took turns:\n\n"
                 "| backend | rounds | prefill ms, range | decode tok/s, range |\n"
                 "|---|---|---|---|\n" + "\n".join(spread) + "\n")
    print(text)
    (out / f"hf_models-{model}.md").write_text(text)

if __name__ == "__main__":
    main()
