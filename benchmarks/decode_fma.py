"""Issue 17's last point: a decode partial kernel without ``tl.dot``, measured as an edit.

At B = 1 (one sequence, 32/32 heads: one query per program) the split-k partial kernel
pads its one query row to a 16-row ``tl.dot`` and loads K and V through a ``cp.async``
shared-memory ring, where a pure reader that streams the same bytes into registers
reads 3 % faster once two programs share a multiprocessor (docs/serving.md, "The
question answered"; benchmarks/results/2026-12-06-h100-b1-decode). The edit here takes
the emitter's own partial kernel and replaces both contractions by multiply-and-sum
over one row (``BLOCK_M`` = 1):

* ``fma``: the scores ``sum_c q[c] k[j, c]`` and the output ``sum_j p[j] v[j, e]``
  reduced every key tile;
* ``defer``: the scores as above, the output kept as a ``BLOCK_N x BLOCK_E`` tile
  updated element by element (rescaled by ``alpha``) and summed over keys once after
  the loop (codegen.md's deferred tile reductions, applied to the value side).

The edited kernel is loaded in place of the generated one (``load_kernel_module``
hooked while the call is prepared), so it runs through ``nf.attention``'s own prepared
call and combine; the unedited auto call, explicit schedules and cuDNN (contiguous)
are timed beside it by CUDA-graph replay, every output checked against float64.
Phase 1 times a grid once; phase 2 times each variant's best, the auto call and cuDNN
in ``--rounds`` interleaved rounds.

Usage (GPU): ``PYTHONPATH=src:benchmarks python benchmarks/decode_fma.py --out f.jsonl``;
``--smoke`` runs a tiny case on the interpreter (TRITON_INTERPRET=1).
"""
import argparse
import itertools
import re

import jsonl
import torch
from decode_splits import layouts

from neptune_fusion import ops
from neptune_fusion.frontend.attention import AttentionCache
from neptune_fusion.runtime import kernel as kernel_mod
from neptune_fusion.schedule.schedule import Schedule

_SCORES = re.compile(r"tl\.dot\((q\w*), (\w+)\)")
_VALUES = re.compile(r"tl\.dot\((\w+)\.to\(tl\.\w+\), (\w+), acc=(\w+) \* (\w+)\[:, None\]\)")


def edit(source: str, variant: str) -> str:
    """The partial kernel ``source`` with its contractions as multiply-and-sum."""
    head, body = source.split("INTERPRET: tl.constexpr,\n", 1)
    body = re.sub(r"\bBLOCK_M\b", "1", body)
    n_scores = len(_SCORES.findall(body))
    body = _SCORES.sub(r"tl.sum(tl.trans(\1).to(tl.float32) * \2.to(tl.float32), 0, "
                       r"keep_dims=True)", body)
    if variant == "fma":
        body, n_values = _VALUES.subn(
            r"\3 * \4[:, None] + tl.sum(tl.trans(\1) * \2.to(tl.float32), 0, "
            r"keep_dims=True)", body)
    else:
        body, n_values = _VALUES.subn(r"\3 * \4[:, None] + tl.trans(\1) * \2.to(tl.float32)",
                                      body)
        acc = re.search(r"\n    (\w+) = tl\.full\(\[1, BLOCK_E\], 0\.0, tl\.float32\)", body)
        body = body.replace(acc.group(0), acc.group(0).replace("[1, BLOCK_E]",
                                                               "[BLOCK_N, BLOCK_E]"))
        body = body.replace("    # epilogue", f"    {acc.group(1)} = tl.sum({acc.group(1)}, 0, "
                            "keep_dims=True)\n    # epilogue", 1)
    if n_scores != n_values or not n_scores or "tl.dot(" in body:
        raise ValueError(f"the partial kernel has a contraction the edit does not know:\n"
                         f"{source}")
    return head + "INTERPRET: tl.constexpr,\n" + body


def prepared(q, k, v, opts, sched, variant):
    """``ops.prepare``'s call, its partial kernel edited to ``variant`` ("mma": as is)."""
    plain = kernel_mod.load_kernel_module

    def load(source, name, interpret):
        if name.endswith("_partial"):
            source = edit(source, variant)
        return plain(source, name, interpret)
    if variant != "mma":
        kernel_mod.load_kernel_module = load
    try:
        run = ops.prepare(q, k, v, schedule=sched, cache=AttentionCache(store=False), **opts)
        out = run(q, k, v)
    finally:
        kernel_mod.load_kernel_module = plain
    return run, out


def schedule(splits, bn, w, st, deep) -> Schedule:
    return Schedule(strategy="split", splits=splits, block_m=16, block_n=bn, num_warps=w,
                    num_stages=st, gather_stages=2 * st - 1 if deep and st >= 2 else 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=31090)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--splits", default="8,16,32")
    ap.add_argument("--tiles", default="32,64,128")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--stages", default="1,2")
    ap.add_argument("--variants", default="fma,defer", help="edited variants over the grid")
    ap.add_argument("--mma", default="4x128/4/3,8x128/4/3,8x64/4/3",
                    help="schedules of the unedited kernel timed beside the auto pick")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--top", type=int, default=2, help="schedules per variant in phase 2")
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    dev = "cpu" if args.smoke else "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    d = 128
    keys, heads = (300, 2) if args.smoke else (args.keys, args.heads)
    q = torch.randn(1, heads, 1, d, device=dev, dtype=torch.float16, generator=gen)
    lens = torch.tensor([keys], device=dev, dtype=torch.int32)
    ints = lambda s: [int(x) for x in s.split(",")]   # noqa: E731
    grid = [(2, 32, 4, 2), (3, 64, 4, 1)] if args.smoke else list(itertools.product(
        ints(args.splits), ints(args.tiles), ints(args.warps), ints(args.stages)))
    sms = 1 if args.smoke else torch.cuda.get_device_properties(0).multi_processor_count
    every = layouts(keys, heads, d, args.page, dev, gen)
    k0, v0 = every["contiguous"][:2]
    s = (q.double() @ k0.double().transpose(-1, -2)) * d ** -0.5
    ref = torch.softmax(s, -1) @ v0.double()
    kw = dict(scale=d ** -0.5, causal=True, q_start=keys - 1, kv_lens=lens)

    def err(out) -> float:
        return float((out.double() - ref).norm() / ref.norm())

    def timed(fn):
        if args.smoke:
            return None
        from triton.testing import do_bench_cudagraph
        fn()
        torch.cuda.synchronize()
        return round(do_bench_cudagraph(fn, rep=60, return_mode="median"), 5)

    def emit(rec):
        if not args.smoke:
            rec["gpu"] = torch.cuda.get_device_name()
        jsonl.emit(rec, args.out)

    runs = {}     # (layout, label) -> the prepared call
    cudnn = None
    if not args.smoke:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k0, v0)
    for name, (k, v, table) in every.items():
        opts = dict(kw, block_table=table)
        best = {}
        mma = [] if args.smoke else [tuple(int(x) for x in re.split("[x/]", t))
                                     for t in args.mma.split(",")]
        cands = [("mma", None)] + [("mma", g) for g in mma] + [
            (var, g) for var in args.variants.split(",") for g in grid]
        for variant, g in cands:
            deep = g is not None and table is not None and heads * g[0] <= sms
            label = f"{variant} " + ("auto" if g is None else
                                     "{}x{}/{}/{}".format(*g) + (" deep" if deep else ""))
            try:
                run, out = prepared(q, k, v, opts, g and schedule(*g, deep), variant)
            except Exception as e:  # noqa: BLE001 - a schedule that does not build
                emit({"layout": name, "label": label, "error": str(e)[:300]})
                continue
            e = err(out)
            ms = timed(lambda r=run, k=k, v=v: r(q, k, v))
            emit({"layout": name, "label": label, "ms": ms, "err": e})
            assert e < 2e-3, f"{name} {label}: error {e} against float64"
            runs[(name, label)] = run
            if g is not None and ms is not None:
                best.setdefault(variant, []).append((ms, label))
        if args.smoke:
            continue
        finals = ["mma auto"] + [lab for v in best.values()
                                  for _, lab in sorted(v)[:args.top]]
        for r in range(args.rounds):
            rec = {"layout": name, "round": r, "cudnn_ms": timed(cudnn)}
            for lab in finals:
                run = runs[(name, lab)]
                rec[lab] = timed(lambda r=run, k=k, v=v: r(q, k, v))
            emit(rec)


if __name__ == "__main__":
    main()
