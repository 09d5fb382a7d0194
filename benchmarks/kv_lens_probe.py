"""A ragged cache's cost: ``nf.attention`` with ``kv_lens`` beside the same call without.

Two probes, each output checked before it is timed:

* ``llama``: the attention of a Llama-3.2-1B-shaped layer (32/8 heads of 64, bf16,
  causal) as the transformers integration calls it with a static cache -- ``kv_lens``
  over a cache 72 slots longer than the keys in use -- beside the ``q_offset="end"``
  call on the used keys and SDPA; a 4096-token prefill and a one-query decode at 4000
  keys (``do_bench``, eager). ``--grid`` also times 24 explicit prefill schedules.
* ``paged``: serving-suite points (default the B = 64, 32/8-head ones: ragged, pages of
  16 and 64, fp16; ``neptune_fusion.bench.serving``; ``--points B1`` for others) with the
  auto schedule and explicit split-k schedules of 64- and 128-key tiles (``--grid``:
  32-128-key tiles x 16 or 32 splits x three warp/stage pairs), CUDA-graph replay.

Usage (GPU): ``python benchmarks/kv_lens_probe.py llama [--grid]`` or
``python benchmarks/kv_lens_probe.py paged [--points B1] [--grid]``;
``NEPTUNE_FUSION_LOG=1`` prints what the tuner measured.
"""
from __future__ import annotations

import argparse
import functools
import itertools

import torch
import triton

from neptune_fusion.bench.gate import relative_error as rel
from neptune_fusion.errors import ScheduleError
from neptune_fusion.frontend.attention import AttentionCache, attention
from neptune_fusion.schedule.schedule import Schedule


def causal(b, h, i, j):
    return j <= i


def llama(grid: bool) -> None:
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    for n in (4096, 1):
        m = 4096 + 72
        q = torch.randn(1, 32, n, 64, device=dev, dtype=dt)
        k = torch.randn(1, 8, m, 64, device=dev, dtype=dt)
        v = torch.randn(1, 8, m, 64, device=dev, dtype=dt)
        used = n if n > 1 else 4000
        kl = torch.tensor([used], dtype=torch.int32, device=dev)
        ku, vu = k[:, :, :used], v[:, :, :used]

        sdpa = functools.partial(torch.nn.functional.scaled_dot_product_attention, q, ku, vu,
                                 is_causal=n > 1, enable_gqa=True)
        want = sdpa()
        print(f"N={n} sdpa: {triton.testing.do_bench(sdpa):.4f} ms", flush=True)
        for mode in ("end", "kv_lens"):
            cache = AttentionCache(store=False)
            call = functools.partial(attention, q, ku, vu, q_offset="end") if mode == "end" \
                else functools.partial(attention, q, k, v, kv_lens=kl)
            call = functools.partial(call, mask_mod=causal, scale=0.125, enable_gqa=True,
                                     cache=cache)
            err = rel(call(), want)
            picked = [str(x.schedule) for x in cache.kernels()[0].kernels()]
            print(f"N={n} {mode} auto: {triton.testing.do_bench(call):.4f} ms, error "
                  f"{err:.1e}, {picked}", flush=True)
            if n == 1 or not grid:
                continue
            for bm, bn, w, st in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3)):
                fixed = functools.partial(call, schedule=Schedule(
                    block_m=bm, block_n=bn, num_warps=w, num_stages=st))
                assert rel(fixed(), want) < 2e-2
                print(f"   {mode} {bm}x{bn} w{w} s{st}: {triton.testing.do_bench(fixed):.4f} ms",
                      flush=True)


def paged(only: list[str], grid: bool) -> None:
    from neptune_fusion.bench.serving import make_inputs, points, reference
    shapes = itertools.product((32, 64, 128), (16, 32), ((4, 3), (4, 5), (8, 3))) if grid \
        else ((bn, k, (4, 3)) for bn, k in ((64, 4), (128, 4), (128, 8), (128, 2)))
    for p in points(False, only):
        x = make_inputs(p, torch.float16, "cuda")
        want = reference(x, p)
        runs = [("auto", None)] + [
            (f"split {k} x {bn} w{w} s{st}", Schedule(
                block_m=16, block_n=bn, num_warps=w, num_stages=st, strategy="split",
                splits=k)) for bn, k, (w, st) in shapes]
        for name, s in runs:
            cache = AttentionCache(store=False)
            call = functools.partial(attention, x.q, x.k, x.v, kv_lens=x.kv_lens,
                                     block_table=x.block_table,
                                     enable_gqa=p.q_heads != p.kv_heads, cache=cache,
                                     schedule=s)
            try:
                err = rel(call(), want)
            except ScheduleError as exc:          # a tile that does not fit: skip it
                print(f"{p.name} {name}: skipped ({str(exc)[:60]})", flush=True)
                continue
            ms = triton.testing.do_bench_cudagraph(call, rep=200)
            picked = f" ({cache.kernels()[0].kernels()[0].schedule})" if s is None else ""
            print(f"{p.name} {name}: {ms:.4f} ms, error {err:.1e}{picked}", flush=True)
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("probe", choices=("llama", "paged"))
    ap.add_argument("--grid", action="store_true",
                    help="llama: 24 explicit prefill schedules too; paged: 18 split-k "
                         "schedules (32-128-key tiles x 16, 32 splits x warps/stages "
                         "4/3, 4/5, 8/3) instead of 4")
    ap.add_argument("--points", default="B64,32/8",
                    help="paged: serving-suite scenario tokens (default B64,32/8)")
    a = ap.parse_args()
    llama(a.grid) if a.probe == "llama" else paged(a.points.split(","), a.grid)


if __name__ == "__main__":
    main()
