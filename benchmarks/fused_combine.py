"""What folding split-k's combine into the partial kernel would gain, measured as an edit.

A split-k decode launches two kernels: the partial kernel (each split's state to a
workspace) and the combine (the states merged, the output written). At B = 1 over 31090
keys the combine took 1.9-2.9 us of a 167 us call (H100, 2026-12-06,
benchmarks/results/2026-12-06-h100-b1-decode), plus the gap between the launches. The
edit here folds it into the partial kernel: after storing its state each program takes a
ticket from a per-row counter (``tl.atomic_add``, acquire-release, after a CTA barrier
so that every thread's stores come first), and the program that draws the last ticket
resets the counter and runs the combine's own generated body (made a ``@triton.jit``
function of the row and grid ids; its workspace loads bypass L1, where a line of other
heads' states may be stale). Both kernels are the emitter's output for the same
explicit schedule (``nf.attention``, no mask: one query over every key), the edit a
text edit of them, launched directly; the unedited pair is launched the same way and
``nf.attention`` beside them, every output checked against float64, then each timed
as the median of CUDA-graph replays. Measured on an H100 on 2026-12-06
(benchmarks/results/2026-12-06-h100-b1-decode): the fold beats the pair launched by hand
by 0.5-3 % but not ``nf.attention``'s own call, whose combine spreads a row's columns
over programs -- it does not pay (docs/serving.md).

Usage (GPU): ``PYTHONPATH=src python benchmarks/fused_combine.py --out f.jsonl``;
``--smoke`` runs a small case on the interpreter (TRITON_INTERPRET=1): both launches
against float64, the tickets back at zero after each call.
"""
import argparse
import functools
import re

import torch
from jsonl import emit

from neptune_fusion.frontend.attention import AttentionCache, attention
from neptune_fusion.runtime import kernel as kernel_mod
from neptune_fusion.runtime.loader import load_kernel_module
from neptune_fusion.schedule.schedule import Schedule


def generated(q, k, v, schedule, cache) -> tuple[dict, torch.Tensor]:
    """The partial and combine sources ``nf.attention`` generates (and its output)."""
    got = {}
    plain = kernel_mod.load_kernel_module

    def load(source, name, interpret):
        got[name] = source
        return plain(source, name, interpret)
    kernel_mod.load_kernel_module = load
    try:
        out = attention(q, k, v, schedule=schedule, cache=cache)
    finally:
        kernel_mod.load_kernel_module = plain
    return got, out


def _params(source: str, name: str) -> list[str]:
    sig = source[source.index(f"def {name}(") + len(name) + 5:]
    sig = sig[:sig.index("):")]
    return [p.split(":")[0].strip() for p in sig.split(",") if p.strip()]


def fuse(partial: str, combine: str, splits: int) -> str:
    """The partial kernel's module with the combine folded in (``attention_fused``)."""
    tail = combine[combine.index("@triton.jit(do_not_specialize"):]
    tail = re.sub(r"@triton\.jit\(do_not_specialize=\[[^\]]*\]\)\ndef attention_combine\(",
                  "@triton.jit\ndef _nf_combine_tail(\n    pid_row_in, pid_grid_in,", tail)
    tail = tail.replace("pid_row = tl.program_id(0)", "pid_row = pid_row_in")
    tail = tail.replace("pid_grid = tl.program_id(1)", "pid_grid = pid_grid_in")
    tail = tail.replace("pid_col = tl.program_id(2)", "pid_col = 0")
    tail = tail.replace("other=0.0)", 'other=0.0, cache_modifier=".cg")')
    args = _params(combine, "attention_combine")
    extra = [a for a in args if a not in _params(partial, "attention_partial")]
    fused = partial.replace("def attention_partial(", "def attention_fused(")
    fused = fused.replace("    B, N, M,\n", "    " + ", ".join(extra) +
                          ", tickets_ptr,\n    B, N, M,\n", 1)
    body = ("    # fused: the last split of this row to finish merges them\n"
            "    tl.debug_barrier()\n"
            "    slot = tickets_ptr + pid_grid * tl.num_programs(0) + pid_row\n"
            "    ticket = tl.atomic_add(slot, 1, sem=\"acq_rel\", scope=\"gpu\")\n"
            f"    if ticket == {splits - 1}:\n"
            "        tl.store(slot, 0)\n"
            f"        _nf_combine_tail(pid_row, pid_grid, {', '.join(args)})\n")
    head = fused.index("@triton.jit(do_not_specialize")
    return fused[:head] + tail.rstrip() + "\n\n\n" + fused[head:].rstrip() + "\n" + body


def launches(sources: dict, splits: int, q, k, v, warps: int, stages: int, block_n: int):
    """``two()`` (the partial, then the combine) and ``fused()`` over the same inputs,
    each writing the output ``o``; and the tickets."""
    interpret = q.device.type == "cpu"
    part = load_kernel_module(sources["attention_partial"], "attention_partial",
                              interpret).attention_partial
    comb = load_kernel_module(sources["attention_combine"], "attention_combine",
                              interpret).attention_combine
    fused_src = fuse(sources["attention_partial"], sources["attention_combine"], splits)
    fused = load_kernel_module(fused_src, "attention_fused", interpret).attention_fused
    b, h, n, d = q.shape
    m = k.shape[2]
    ws_m = torch.empty(splits, h, b, n, device=q.device, dtype=torch.float32)
    ws_l = torch.empty_like(ws_m)
    ws_o = torch.empty(splits, h, b, n, d, device=q.device, dtype=torch.float32)
    o = torch.empty_like(q)
    rows = -(-n // 16)
    tickets = torch.zeros(rows * b * h, device=q.device, dtype=torch.int32)
    io = [q, *q.stride()[:3], k, *k.stride()[:3], v, *v.stride()[:3],
          ws_m, *ws_m.stride()[:3], ws_l, *ws_l.stride()[:3], ws_o, *ws_o.stride()[:4]]
    out = [o, *o.stride()[:3]]
    consts = dict(BLOCK_M=16, BLOCK_N=block_n, BLOCK_E=d, INTERPRET=interpret)
    opts = dict(num_warps=warps, num_stages=stages)

    def two():
        o.fill_(float("nan"))   # a launch that writes nothing cannot pass the check
        part[(rows, b * h, splits)](*io, b, n, m, BLOCK_C=d, **consts, **opts)
        comb[(rows, b * h, 1)](ws_m, *ws_m.stride()[:3], ws_l, *ws_l.stride()[:3], ws_o,
                               *ws_o.stride()[:4], *out, b, n, m, **consts, num_warps=warps)
        return o

    def one():
        o.fill_(float("nan"))
        fused[(rows, b * h, splits)](*io, *out, tickets, b, n, m, BLOCK_C=d, **consts,
                                     **opts)
        return o
    return two, one, tickets, fused_src


def reference(q, k, v):
    s = (q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(s, -1) @ v.double()


def err(o, ref) -> float:
    return float((o.double() - ref).norm() / ref.norm())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", default="4096,31090")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--schedules", default="4x128/4/3,8x128/4/3,8x64/4/3",
                    help="splits x key tile / warps / stages, comma-separated")
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    dev = "cpu" if args.smoke else "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    heads = 2 if args.smoke else args.heads
    keys = [300] if args.smoke else [int(x) for x in args.keys.split(",")]
    scheds = ["2x64/4/2", "3x64/4/2"] if args.smoke else args.schedules.split(",")
    for m in keys:
        q = torch.randn(1, heads, 1, 128, device=dev, dtype=torch.float16, generator=gen)
        k = torch.randn(1, heads, m, 128, device=dev, dtype=torch.float16, generator=gen)
        v = torch.randn(1, heads, m, 128, device=dev, dtype=torch.float16, generator=gen)
        ref = reference(q, k, v)
        for text in scheds:
            ks, w, st = text.split("/")
            splits, bn = (int(x) for x in ks.split("x"))
            sched = Schedule(strategy="split", splits=splits, block_m=16, block_n=bn,
                             num_warps=int(w), num_stages=int(st))
            cache = AttentionCache(store=False)
            sources, ours = generated(q, k, v, sched, cache)
            two, one, tickets, _ = launches(sources, splits, q, k, v, int(w), int(st), bn)
            rec = {"keys": m, "heads": heads, "schedule": text,
                   "nf_err": err(ours, ref), "two_err": err(two().clone(), ref)}
            for _ in range(3):   # the counter goes back to zero after every call
                rec["fused_err"] = err(one().clone(), ref)
                assert int(tickets.abs().sum()) == 0, "a ticket counter was left non-zero"
            assert all(rec[e] < 2e-3 for e in ("nf_err", "two_err", "fused_err")), rec
            if not args.smoke:
                from triton.testing import do_bench_cudagraph
                ours = functools.partial(attention, q, k, v, schedule=sched, cache=cache)
                for name, fn in (("nf_ms", ours), ("two_ms", two), ("fused_ms", one)):
                    fn()
                    torch.cuda.synchronize()
                    rec[name] = round(do_bench_cudagraph(fn, rep=100,
                                                         return_mode="median"), 5)
                rec["fused_err_after"] = err(one().clone(), ref)
                rec["gpu"] = torch.cuda.get_device_name()
            emit(rec, args.out)


if __name__ == "__main__":
    main()
