"""Probe: does a persistent grid over rows (programs loop over rows, the next row's load in
flight while this row computes) lift whole-row reductions towards the copy rate?

A measurement tool, not library code (docs/codegen.md, "A persistent grid walks the row
blocks"). Hand-written Triton kernels of four chains over a (rows, cols) block whose
whole row fits one tile: softmax, log-softmax, log-sum-exp (read only) and variance. Each
in three shapes:

* ``grid``: one program per row (what the generated kernel does today);
* ``loop``: a grid of ``k`` x the multiprocessors, each program looping over rows with
  ``tl.range(..., num_stages=s)`` (Triton's pipeliner may stage the load);
* ``prefetch``: the same loop with the next row loaded into registers before this row's
  arithmetic (a double buffer written out).

Every output is checked against float64 first; times beside torch.compile of the plain
PyTorch, in one process. Usage (GPU): ``python benchmarks/rows_persist_probe.py --out
f.jsonl``; on CPU add ``--small`` under ``TRITON_INTERPRET=1`` to check the kernels.
"""
from __future__ import annotations

import argparse
import functools
import json

import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def _row(x, CHAIN: tl.constexpr, NCOL: tl.constexpr):
    """The chain of one row ``x`` (fp32, padded with -inf / 0 as the chain needs)."""
    if CHAIN == 3:      # variance: mean then mean of squared deviations
        mean = tl.sum(x, 0) / NCOL
        cols = tl.arange(0, x.shape[0])
        d = tl.where(cols < NCOL, x - mean, 0.0)
        return tl.sum(d * d, 0) / NCOL
    s = x * 1.4426950408889634
    m = tl.max(s, 0)
    p = tl.exp2(s - m)
    den = tl.sum(p, 0)
    if CHAIN == 0:      # softmax
        return p * (1.0 / den)
    elif CHAIN == 1:    # log-softmax
        return x - (m + tl.log2(den)) * 0.6931471805599453
    else:               # log-sum-exp
        return (m + tl.log2(den)) * 0.6931471805599453


@triton.jit
def _load(x_ptr, row, rows, stride, NCOL: tl.constexpr, BLOCK: tl.constexpr,
          CHAIN: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    ok = (cols < NCOL) & ((cols * 0 + row) < rows)
    fill = 0.0 if CHAIN == 3 else float("-inf")
    return tl.load(x_ptr + row * stride + cols, mask=ok, other=fill)


@triton.jit
def _store(y_ptr, row, val, NCOL: tl.constexpr, BLOCK: tl.constexpr, CHAIN: tl.constexpr):
    if CHAIN < 2:
        cols = tl.arange(0, BLOCK)
        tl.store(y_ptr + row * NCOL + cols, val.to(y_ptr.dtype.element_ty),
                 mask=cols < NCOL)
    else:
        tl.store(y_ptr + row, val)


@triton.jit
def k_grid(x_ptr, y_ptr, rows, stride, NCOL: tl.constexpr, BLOCK: tl.constexpr,
           CHAIN: tl.constexpr):
    row = tl.program_id(0)
    x = _load(x_ptr, row, rows, stride, NCOL, BLOCK, CHAIN).to(tl.float32)
    _store(y_ptr, row, _row(x, CHAIN, NCOL), NCOL, BLOCK, CHAIN)


@triton.jit
def k_loop(x_ptr, y_ptr, rows, stride, NCOL: tl.constexpr, BLOCK: tl.constexpr,
           CHAIN: tl.constexpr, STAGES: tl.constexpr):
    for row in tl.range(tl.program_id(0), rows, tl.num_programs(0), num_stages=STAGES):
        x = _load(x_ptr, row, rows, stride, NCOL, BLOCK, CHAIN).to(tl.float32)
        _store(y_ptr, row, _row(x, CHAIN, NCOL), NCOL, BLOCK, CHAIN)


@triton.jit
def k_prefetch(x_ptr, y_ptr, rows, stride, NCOL: tl.constexpr, BLOCK: tl.constexpr,
               CHAIN: tl.constexpr):
    step = tl.num_programs(0)
    row = tl.program_id(0)
    raw = _load(x_ptr, row, rows, stride, NCOL, BLOCK, CHAIN)
    for _ in range(tl.program_id(0), rows, step):
        nxt = _load(x_ptr, row + step, rows, stride, NCOL, BLOCK, CHAIN)
        _store(y_ptr, row, _row(raw.to(tl.float32), CHAIN, NCOL), NCOL, BLOCK, CHAIN)
        raw = nxt
        row += step


CHAINS = {"softmax": 0, "log-softmax": 1, "logsumexp": 2, "variance": 3}


def plain(name):
    import torch
    if name == "softmax":
        return lambda x: torch.softmax(x.float(), -1).to(x.dtype)
    if name == "log-softmax":
        return lambda x: torch.log_softmax(x.float(), -1).to(x.dtype)
    if name == "logsumexp":
        return lambda x: torch.logsumexp(x.float(), -1)
    return lambda x: torch.var(x.float(), -1, correction=0)


def main() -> None:
    import torch
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chains", default="softmax,log-softmax,logsumexp,variance")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--warps", default="16,32")
    p.add_argument("--small", action="store_true", help="8 x 100 rows (interpreter)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    dev = "cpu" if args.small else "cuda"
    rows, ncol = (8, 100) if args.small else (4096, 32768)
    sms = 4 if args.small else torch.cuda.get_device_properties(0).multi_processor_count
    block = triton.next_power_of_2(ncol)
    sink = open(args.out, "a") if args.out else None
    from triton.testing import do_bench
    for name in args.chains.split(","):
        chain = CHAINS[name]
        for dt in args.dtypes.split(","):
            dtype = getattr(torch, dt)
            gen = torch.Generator(device=dev).manual_seed(0)
            x = torch.randn(rows, ncol, device=dev, dtype=torch.float32, generator=gen)
            x = (x * 3 + (100 if chain == 3 else 0)).to(dtype)
            ref = plain(name)(x.double())
            out_dt = dtype if chain < 2 else torch.float32
            shape = (rows, ncol) if chain < 2 else (rows,)
            comp = None if args.small else torch.compile(plain(name))
            base = None
            if comp is not None:
                comp(x)
                base = do_bench(functools.partial(comp, x))
            ws = [int(w) for w in args.warps.split(",")]
            variants = [("grid", w, 0, 0) for w in ws]
            variants += [("loop", w, g, st) for w in ws for g in (1, 2) for st in (1, 2)]
            variants += [("prefetch", w, g, 0) for w in ws for g in (1, 2)]
            if args.small:
                variants = [("grid", 4, 0, 0), ("loop", 4, 1, 2), ("prefetch", 4, 1, 0)]
            for form, w, g, st in variants:
                y = torch.empty(shape, device=dev, dtype=out_dt)
                n = rows if form == "grid" else min(rows, g * sms)
                common = dict(NCOL=ncol, BLOCK=block, CHAIN=chain, num_warps=w)
                if form == "loop":
                    common["STAGES"] = st
                kern = {"grid": k_grid, "loop": k_loop, "prefetch": k_prefetch}[form]
                fn = functools.partial(kern[(n,)], x, y, rows, x.stride(0), **common)
                rec = dict(chain=name, dtype=dt, form=form, warps=w, grid_per_sm=g,
                           stages=st)
                try:
                    fn()
                    err = ((y.double() - ref).norm() / ref.norm()).item()
                    rec["rel_err"] = err
                    if err > (2e-2 if dt == "bfloat16" else 1e-4):
                        rec["error"] = "wrong"
                    elif not args.small:
                        ms = do_bench(fn)
                        moved = x.numel() * x.element_size() + y.numel() * y.element_size()
                        rec.update(ms=ms, compile_ms=base, vs_compile=base / ms,
                                   tbps=moved / ms / 1e9)
                except Exception as e:   # recorded, not fatal
                    rec["error"] = repr(e)[:300]
                line = json.dumps(rec)
                print(line, flush=True)
                if sink:
                    sink.write(line + "\n")
                    sink.flush()


if __name__ == "__main__":
    main()
