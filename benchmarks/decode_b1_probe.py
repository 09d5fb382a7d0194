"""Serving decode of one sequence (B = 1): where the time goes, and candidate fixes.

For serving-suite points (default the six B = 1 ones: 32/8 and 32/32 heads; contiguous,
pages of 16 and 64; fp16), in one process, every output checked against float64 first,
the auto schedule (or ``--schedule``'s) under each *mode*, timed by CUDA-graph replay
(twice), with each kernel's GPU time from the profiler (the rest is launch gaps):

* ``base``: the code as it is;
* ``flat``: every tile loop a plain ``range`` (no ``Schedule.gather_stages``);
* ``depth<n>``: a table-indexed loop pipelined ``n`` deep;
* ``static``: the combine kernel's key extent ``M`` a literal, as a paged cache's is;
* ``evict``: the partial kernel's K and V loads marked ``evict_first``;
* ``nomask``, ``i32``: page loads without the page-id bounds mask, or with 32-bit page
  offsets (both unsafe in general: probes only);
* ``pdl``, ``pdl-exit``: the combine kernel launched as a programmatic dependent of the
  partial kernel (``gdc_wait``), which lets it launch at its start (``pdl``) or as its
  programs exit; needs sm_90 and ``tl.extra.cuda.gdc_wait``.

Every mode but ``base``, ``flat`` and ``depth`` edits the generated text as it is loaded
(an experiment, as ``source_variants.py`` does). With ``--grid``, explicit split-k
schedules too (``--splits``, ``--tiles``, ``--ws``), in the ``base`` mode.

Usage (GPU): ``python benchmarks/decode_b1_probe.py [--modes base,flat] [--grid]
[--points B1,32/8]``; ``NEPTUNE_FUSION_LOG=1`` prints what the tuner measured.
Results: benchmarks/results/2026-12-01-h200-b1.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import re

import torch
import triton
from decode_profile import kernel_times  # a sibling script: benchmarks/ is on the path

from neptune_fusion.bench.gate import relative_error as rel
from neptune_fusion.bench.serving import make_inputs, points, reference
from neptune_fusion.codegen import source as src_mod
from neptune_fusion.errors import ScheduleError
from neptune_fusion.frontend.attention import AttentionCache, attention
from neptune_fusion.runtime import kernel as kernel_mod
from neptune_fusion.runtime import launcher as launcher_mod
from neptune_fusion.schedule.schedule import Schedule

_FIRST = "    pid_row = tl.program_id(0)\n"
_KV_LOAD = re.compile(r"(= tl\.load\((?:k|v)_base \+ .*)\)$", re.M)


def _edit(edit):
    """A loader that passes each compiled kernel's text through ``edit(text, name)``."""
    plain = kernel_mod.load_kernel_module

    def load(source, name, interpret):
        return plain(source if interpret else edit(source, name), name, interpret)
    return load


def _pdl(trigger: bool):
    """The combine kernel waits on the partial kernel's grid (``gdc_wait``); with
    ``trigger`` the partial kernel lets it launch at its start."""
    def edit(text, name):
        if name.endswith("_combine"):
            return text.replace(_FIRST, "    tl.extra.cuda.gdc_wait()\n" + _FIRST, 1)
        if trigger and name.endswith("_partial"):
            return text.replace(_FIRST, "    tl.extra.cuda.gdc_launch_dependents()\n" +
                                _FIRST, 1)
        return text
    return edit


def _evict(text, name):
    """K and V loads of the partial kernel marked ``evict_first`` (streamed once)."""
    if not name.endswith("_partial"):
        return text
    return _KV_LOAD.sub(r'\1, eviction_policy="evict_first")', text)


def _static_extent(value: int):
    """The combine kernel's key extent ``M`` a literal (as a paged cache's is)."""
    def edit(text, name):
        if not name.endswith("_combine"):
            return text
        return text.replace(_FIRST, f"    M = {value}\n" + _FIRST, 1)
    return edit


_PAGE_MASK = re.compile(r", mask=\(\(block_table >= 0\) & \(block_table < P\)\)"
                        r"\[(?:None, :|:, None)\], other=0\.0")


def _no_page_mask(text, name):
    """Interior tiles' page loads without the page-id bounds mask (unsafe: probe only)."""
    return _PAGE_MASK.sub("", text) if name.endswith("_partial") else text


def _int32_pages(text, name):
    """Page offsets in 32-bit arithmetic (wrong past 2**31 elements: probe only)."""
    if not name.endswith("_partial"):
        return text
    return "\n".join(ln.replace(".to(tl.int64)", "") if "block_table" in ln and
                     "block_table_base =" not in ln else ln for ln in text.split("\n"))


def _depth(n: int):
    """A table-indexed tile loop pipelined ``n`` deep."""
    plain = src_mod._loop_range

    def loop_range(prog, seg, lo, hi):
        got = plain(prog, seg, lo, hi)
        return re.sub(r"num_stages=\d+", f"num_stages={n}", got)
    return loop_range


@contextlib.contextmanager
def mode(name: str, extent: int = 0):
    """``base``, ``flat``, ``pdl``, ``pdl-exit``, ``evict``, ``static``, ``nomask``,
    ``i32`` or ``depth<n>`` (see above)."""
    saved = (kernel_mod.load_kernel_module, src_mod._loop_range, launcher_mod.Launcher.__init__)
    if name == "flat":
        src_mod._loop_range = lambda prog, seg, lo, hi: f"range({lo}, {hi}, BLOCK_N)"
    elif name == "evict":
        kernel_mod.load_kernel_module = _edit(_evict)
    elif name == "nomask":
        kernel_mod.load_kernel_module = _edit(_no_page_mask)
    elif name == "i32":
        kernel_mod.load_kernel_module = _edit(_int32_pages)
    elif name.startswith("depth"):
        src_mod._loop_range = _depth(int(name[5:]))
    elif name == "static":
        kernel_mod.load_kernel_module = _edit(_static_extent(extent))
    elif name.startswith("pdl"):
        kernel_mod.load_kernel_module = _edit(_pdl(name == "pdl"))
        init = saved[2]

        def pdl_init(self, fn, grid, opts, *a, **k):
            if getattr(fn, "__name__", "").endswith("_combine"):
                opts = dict(opts, launch_pdl=True)
            init(self, fn, grid, opts, *a, **k)
        launcher_mod.Launcher.__init__ = pdl_init
    try:
        yield
    finally:
        kernel_mod.load_kernel_module, src_mod._loop_range, \
            launcher_mod.Launcher.__init__ = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", action="store_true", help="explicit split-k schedules too")
    ap.add_argument("--points", default="B1", help="serving scenario tokens (default B1)")
    ap.add_argument("--modes", default="base,evict,static")
    ap.add_argument("--schedule", default="",
                    help="modes under this explicit split-k schedule, e.g. 4x128/4/3 "
                         "(splits x key tile / warps / stages) instead of the auto one")
    ap.add_argument("--grid-points", default="",
                    help="with --grid: only these point names get the grid")
    ap.add_argument("--splits", default="16,32", help="with --grid: split counts")
    ap.add_argument("--tiles", default="64,128", help="with --grid: key tiles")
    ap.add_argument("--ws", default="4/3,8/3,8/4", help="with --grid: warps/stages pairs")
    ap.add_argument("--gather", type=int, default=0,
                    help="Schedule.gather_stages of the explicit schedules (0: plain loops)")
    a = ap.parse_args()
    torch.manual_seed(0)
    for p in points(False, a.points.split(",")):
        x = make_inputs(p, torch.float16, "cuda")
        want = reference(x, p)
        fixed = None
        if a.schedule:
            ks, w, st = a.schedule.split("/")
            k, bn = ks.split("x")
            fixed = Schedule(block_m=16, block_n=int(bn), num_warps=int(w),
                             num_stages=int(st), strategy="split", splits=int(k),
                             gather_stages=a.gather)
        runs = [(m, fixed) for m in a.modes.split(",")]
        if a.grid and (not a.grid_points or p.name in a.grid_points.split(",")):
            ws = [tuple(int(v) for v in t.split("/")) for t in a.ws.split(",")]
            runs += [("base", Schedule(block_m=16, block_n=bn, num_warps=w, num_stages=st,
                                       strategy="split", splits=k, gather_stages=a.gather))
                     for k, bn, (w, st) in itertools.product(
                         [int(v) for v in a.splits.split(",")],
                         [int(v) for v in a.tiles.split(",")], ws)]
        for m, s in runs:
            with mode(m, x.k.shape[2] if x.block_table is None else 0):
                cache = AttentionCache(store=False)
                call = functools.partial(attention, x.q, x.k, x.v, kv_lens=x.kv_lens,
                                         block_table=x.block_table,
                                         enable_gqa=p.q_heads != p.kv_heads, cache=cache,
                                         schedule=s)
                try:
                    err = rel(call(), want)
                except ScheduleError as exc:
                    print(f"{p.name} {m} {s}: skipped ({str(exc)[:60]})", flush=True)
                    continue
                except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
                    print(f"{p.name} {m}: FAILED {type(exc).__name__}: {str(exc)[:300]}",
                          flush=True)
                    continue
                ms = triton.testing.do_bench_cudagraph(call, rep=200)
                ms2 = triton.testing.do_bench_cudagraph(call, rep=200)
                kt = kernel_times(call)
                k0 = cache.kernels()[0]
                picked = k0.last_choice.schedule if s is None else s
                label = "auto" if s is None else "explicit"
                ks = ", ".join(f"{k} {v:.1f}" for k, v in kt.items())
                print(f"{p.name} {m} {label} {picked.strategy} {picked.splits}x"
                      f"{picked.block_n} w{picked.num_warps} s{picked.num_stages}"
                      f" g{picked.gather_stages}: "
                      f"{ms * 1e3:.1f} / {ms2 * 1e3:.1f} us, error {err:.1e}; kernels (us): "
                      f"{ks}", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
