"""How fast can any kernel read a paged KV cache? A read-only roofline for issue 17.

Issue 17's last open point: at B = 1 (one sequence, 32/32 heads) our paged decode reads
4.07-4.13 TB/s where cuDNN, reading the same keys as one contiguous sequence, reads
4.27-4.35 (docs/serving.md). This script asks whether the gap is the kernel's or the
layout's: a Triton kernel that does nothing but read K and V (a sum a program, so the
loads cannot be dropped) walks the same bytes three ways -- a contiguous (1, H, L, D)
cache, a page pool in page order, and the pool through a shuffled block table (pages of
``--pages``) -- over a grid of programs (heads x splits), tiles, warps and stages, and
reports the best read bandwidth of each layout. If the shuffled pool's best is below the
contiguous cache's by what separates our paged decode from cuDNN, the gap belongs to the
memory system, not to the decode kernel. Every kernel here is timed the same way: the
median of CUDA-graph replays (``do_bench_cudagraph``), GPU time alone. (Answered on an
H100 on 2026-12-06: the layout cost the reader nothing; docs/serving.md.)

Beside each layout's roofline our own decode (``nf.attention`` with ``kv_lens``, and
``block_table`` for a pool; DC-Causal's shape, one query a head) is timed in GPU time
over the same cache (``decode_ms``, ``decode_of_roofline``), its output compared with
the contiguous cache's (``--no-decode`` skips it), and cuDNN's SDPA over the contiguous
cache -- issue 17's comparison -- once (``cudnn_ms``, ``decode_of_cudnn``).

Usage (GPU): ``PYTHONPATH=src python benchmarks/paged_roofline.py --out f.jsonl
[--keys 31090] [--heads 32] [--pages 16,64]``; ``--smoke`` runs a tiny case on the
interpreter (TRITON_INTERPRET=1) and checks the sums against torch and our decode's
output through each layout against the contiguous one.
"""
import argparse
import itertools
import json

import torch
import triton
import triton.language as tl
from jsonl import emit


@triton.jit
def _read(k_ptr, v_ptr, table_ptr, out_ptr, L, s_page, s_head, PAGE: tl.constexpr,
          D: tl.constexpr, BLOCK: tl.constexpr, SPLIT: tl.constexpr, PAGED: tl.constexpr):
    h, sp = tl.program_id(0), tl.program_id(1)
    span = tl.cdiv(tl.cdiv(L, SPLIT), BLOCK) * BLOCK
    lo = sp * span
    hi = tl.minimum(lo + span, L)
    d = tl.arange(0, D)
    acc = tl.zeros([BLOCK, D], tl.float32)
    for j0 in tl.range(lo, hi, BLOCK):
        j = j0 + tl.arange(0, BLOCK)
        ok = j < hi
        if PAGED:
            page = tl.load(table_ptr + j // PAGE, mask=ok, other=0)
            row = page.to(tl.int64) * s_page + h * s_head + (j % PAGE) * D
        else:
            row = h.to(tl.int64) * s_head + j.to(tl.int64) * D
        ptrs = row[:, None] + d[None, :]
        acc += tl.load(k_ptr + ptrs, mask=ok[:, None], other=0.0).to(tl.float32)
        acc += tl.load(v_ptr + ptrs, mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(out_ptr + h * SPLIT + sp, tl.sum(tl.sum(acc, 1), 0))


def layouts(keys: int, heads: int, d: int, page: int, dev, gen):
    """``{name: (k, v, table, s_page, s_head, paged)}`` holding the same keys."""
    k = torch.randn(1, heads, keys, d, device=dev, dtype=torch.float16, generator=gen)
    v = torch.randn(1, heads, keys, d, device=dev, dtype=torch.float16, generator=gen)
    n = triton.cdiv(keys, page)
    pad = n * page - keys

    def pool(t):   # (pages, heads, page, d), key j of the sequence in page j // page
        t = torch.nn.functional.pad(t[0], (0, 0, 0, pad))
        return t.view(heads, n, page, d).transpose(0, 1).contiguous()
    kp, vp = pool(k), pool(v)
    order = torch.arange(n, device=dev, dtype=torch.int32)
    shuffle = torch.randperm(n, device=dev, generator=gen).to(torch.int32)
    ks, vs = torch.empty_like(kp), torch.empty_like(vp)
    ks[shuffle.long()], vs[shuffle.long()] = kp, vp   # logical page i lives at shuffle[i]
    return {"contiguous": (k, v, order, 0, keys * d, False),
            f"pages of {page} in order": (kp, vp, order, heads * page * d, page * d, True),
            f"pages of {page} shuffled": (ks, vs, shuffle, heads * page * d, page * d, True)}


def run(layout, keys, heads, d, page, split, block, warps, stages):
    k, v, table, s_page, s_head, paged = layout
    out = torch.empty(heads * split, device=k.device, dtype=torch.float32)
    _read[(heads, split)](k, v, table, out, keys, s_page, s_head, PAGE=page, D=d,
                          BLOCK=block, SPLIT=split, PAGED=paged, num_warps=warps,
                          num_stages=stages)
    return out


def decode(layout, keys: int, heads: int, d: int, q):
    """Our decode over ``layout`` (``nf.attention`` with ``kv_lens``, and ``block_table``
    for a pool): the call, for timing, and its output."""
    from neptune_fusion.frontend.attention import attention
    k, v, table, _, _, paged = layout
    lens = torch.tensor([keys], device=q.device, dtype=torch.int32)
    tab = table[None] if paged else None

    def call():
        return attention(q, k, v, kv_lens=lens, block_table=tab)
    return call, call()


def cudnn_ms(layout, q, base) -> dict:
    """cuDNN's SDPA over the contiguous cache, GPU time (graph replay), and whether its
    output agrees with our decode's (``base``); an empty dict where it cannot run."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench_cudagraph
    k, v = layout[:2]

    def call():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)
    try:
        out = call()
        torch.cuda.synchronize()
        ms = do_bench_cudagraph(call, rep=100, return_mode="median")
    except RuntimeError as e:   # no cuDNN attention on this build or device
        return {"cudnn_error": str(e).splitlines()[0][:200]}
    agrees = None if base is None else bool(torch.allclose(out.float(), base.float(),
                                                            atol=2e-3))
    return {"cudnn_ms": round(ms, 5), "cudnn_agrees": agrees}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=31090)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--pages", default="16,64")
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--every", action="store_true",
                    help="print every configuration's time, not only each layout's best")
    ap.add_argument("--no-decode", action="store_true",
                    help="skip timing our decode (nf.attention) over each layout")
    args = ap.parse_args()
    dev = "cpu" if args.smoke else "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    d = 128
    keys, heads = (100, 2) if args.smoke else (args.keys, args.heads)
    grid = list(itertools.product((1, 2) if args.smoke else (4, 8, 16, 32),
                                  (16,) if args.smoke else (64, 128), (4,) if args.smoke
                                  else (4, 8), (2,) if args.smoke else (3, 4)))
    q = torch.randn(1, heads, 1, d, device=dev, dtype=torch.float16, generator=gen)
    pages = [int(p) for p in args.pages.split(",")]
    first = pages[0]
    cudnn: dict = {}
    for page in pages:
        every = layouts(keys, heads, d, page, dev, gen)
        contiguous = every["contiguous"][:2]
        base = None if args.no_decode else decode(every["contiguous"], keys, heads, d, q)[1]
        for name, lay in every.items():
            if name == "contiguous" and page != first and not args.smoke:
                continue   # the same bytes as for the first page size
            if args.smoke:   # each program's sum against its keys of the sequence
                split, block = 2, 16
                got = run(lay, keys, heads, d, page, split, block, 4, 2).view(heads, split)
                span = triton.cdiv(triton.cdiv(keys, split), block) * block
                k, v = contiguous
                for h, sp in itertools.product(range(heads), range(split)):
                    rows = slice(sp * span, min(sp * span + span, keys))
                    want = (k[0, h, rows].float().sum() + v[0, h, rows].float().sum()).item()
                    assert abs(got[h, sp].item() - want) <= 1e-3 * abs(want) + 1e-2, name
                if base is not None:   # our decode reads the same keys through the layout
                    out = decode(lay, keys, heads, d, q)[1]
                    assert torch.allclose(out.float(), base.float(), atol=1e-3), name
                print(json.dumps({"layout": name, "ok": True}))
                continue
            from triton.testing import do_bench_cudagraph
            best = None
            for split, block, warps, stages in grid:
                cfg = (lay, keys, heads, d, page, split, block, warps, stages)
                run(*cfg)   # compiled before the capture
                ms = do_bench_cudagraph(lambda c=cfg: run(*c), rep=50, return_mode="median")
                if args.every:
                    print(json.dumps({"layout": name, "ms": round(ms, 5), "tb_s": round(
                        4 * keys * heads * d / ms / 1e9, 3), "splits": split, "block": block,
                        "warps": warps, "stages": stages}), flush=True)
                if best is None or ms < best[0]:
                    best = (ms, split, block, warps, stages)
            ms, split, block, warps, stages = best
            rec = {"layout": name, "keys": keys, "heads": heads, "ms": round(ms, 5),
                   "tb_s": round(4 * keys * heads * d / ms / 1e9, 3), "splits": split,
                   "block": block, "warps": warps, "stages": stages,
                   "gpu": torch.cuda.get_device_name()}
            if name == "contiguous":
                cudnn = cudnn_ms(lay, q, base)
                rec.update(cudnn)
            if base is not None:   # ours over the same bytes, GPU time (graph replay)
                call, out = decode(lay, keys, heads, d, q)
                torch.cuda.synchronize()
                ours = do_bench_cudagraph(call, rep=100, return_mode="median")
                rec.update(decode_ms=round(ours, 5), decode_tb_s=round(
                    4 * keys * heads * d / ours / 1e9, 3), decode_of_roofline=round(
                    ms / ours, 3), decode_agrees=bool(torch.allclose(
                        out.float(), base.float(), atol=2e-3)))
                if cudnn.get("cudnn_ms"):
                    rec["decode_of_cudnn"] = round(cudnn["cudnn_ms"] / ours, 3)
            emit(rec, args.out)


if __name__ == "__main__":
    main()
