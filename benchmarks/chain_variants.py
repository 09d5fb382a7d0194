"""Time a chain of the chain suite at explicit schedules, with edits of its source.

A measurement tool for row-reduction code generation (docs/codegen.md): for each chain
of ``neptune_fusion.bench.chains`` named, each dtype and each ``--tiles`` schedule
(rolling, rows x loop tile x warps x stages [x row programs per multiprocessor]), it
compiles the chain with that schedule,
rewrites the generated source by each *form*, checks the output against the unedited
kernel's and times it, beside torch.compile of the chain's plain PyTorch in the same
process. Prints registers and spills of every compiled kernel. Forms:

* ``asis``: no edit;

A tile of more than 16 warps (beyond the search space) is built at 16 and launched at
its own count.
* ``reusep``: in the one-tile (persistent) branch, the epilogue's ``exp(x - max)`` read
  from the exponential the sum computed (one exponential per element instead of two);
* ``constexpr``: the sizes ``N, M`` made compile-time constants (every mask against them
  can fold);
* ``nomask``: the one-tile branch's masks deleted (legal only when the tile is exactly
  the row and the rows divide the row tile, as in the suite's shapes);
* ``evict``: every line-ending ``tl.load`` marked ``eviction_policy="evict_first"``
  (Inductor marks its reductions' streamed loads so; measured: no effect,
  docs/codegen.md).

``--graph`` times by CUDA-graph replay (GPU time alone) instead of ``do_bench``.

Usage (GPU): ``python benchmarks/chain_variants.py --chains softmax,log-softmax
--dtypes float32,bfloat16 --tiles 1x32768x16x1,1x32768x32x1 --forms asis,reusep``.
"""
from __future__ import annotations

import argparse
import json
import re

_SUM = re.compile(r"(?P<ind> +)l_new = tl\.sum\((?P<p>tl\.exp2\(s - .*\)\[:, None\]\)), 1\)\n")
_EXP = re.compile(r"tl\.exp\(x - \(m \* 0\.6931471805599453\)\[:, None\]\)")


def edit(src: str, form: str) -> str:
    if form == "reusep":
        head, sep, tail = src.partition("    else:\n")
        m = _SUM.search(head)
        if not m or not _EXP.search(head):
            raise ValueError("no persistent sum and epilogue exponential to share")
        head = _SUM.sub(lambda m: f"{m['ind']}p_tile = {m['p']}\n"
                        f"{m['ind']}l_new = tl.sum(p_tile, 1)\n", head, count=1)
        src = _EXP.sub("p_tile", head, count=1) + sep + tail
    elif form == "constexpr":
        src = src.replace("(do_not_specialize=['N'])", "")
        src = src.replace("    N, M,\n", "    N: tl.constexpr, M: tl.constexpr,\n")
    elif form == "nomask":
        head, sep, tail = src.partition("    else:\n")
        head = head.replace(", mask=i_in[:, None] & (offs_k < M)[None, :], other=0.0)", ")")
        head = head.replace(", mask=i_in[:, None] & (offs_k < M)[None, :])", ")")
        head = re.sub(r"tl\.where\(\(offs_k < M\)\[None, :\], (.*), float\(\"-inf\"\)\)\n",
                      r"\1\n", head)
        src = head + sep + tail
    elif form == "evict":
        src = re.sub(r"(tl\.load\(.*)\)$", r'\1, eviction_policy="evict_first")', src,
                     flags=re.M)
    return src + f"\n# form {form}\n"


def _warps(base, w: int):
    """A fresh kernel like ``base`` launched with ``w`` warps."""
    import dataclasses

    from neptune_fusion.runtime.kernel import Kernel
    specs = tuple(dataclasses.replace(sp, num_warps=w) for sp in base.specs)
    return Kernel(base.outputs, base.inputs, specs, base.schedule, base._single,
                  base._lowered)


def main() -> None:
    import torch
    from triton.testing import do_bench

    import neptune_fusion as nf
    from neptune_fusion.bench.chains import make_inputs, select_chains
    from neptune_fusion.runtime import kernel as kernel_module
    from neptune_fusion.schedule.schedule import Schedule

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chains", default="softmax,log-softmax")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--tiles", default="1x32768x16x1")
    p.add_argument("--forms", default="asis")
    p.add_argument("--graph", action="store_true", help="time by CUDA-graph replay")
    args = p.parse_args()
    if args.graph:
        from triton.testing import do_bench_cudagraph as do_bench
    current = {"form": "asis"}
    load = kernel_module.load_kernel_module
    kernel_module.load_kernel_module = \
        lambda src, name, interp: load(edit(src, current["form"]), name, interp)
    for chain in select_chains(args.chains.split(",")):
        for dt in args.dtypes.split(","):
            dtype = getattr(torch, dt)
            xs = make_inputs(chain, chain.sizes, dtype, torch.device("cuda"))
            plain = torch.compile(chain.plain)
            want = plain(*xs)
            want = want if isinstance(want, (list, tuple)) else [want]
            t_compile = do_bench(lambda f=plain, a=xs: f(*a))
            outs, ins = chain.build(dt)
            for tile in args.tiles.split(","):
                bm, bn, w, st, *rp = map(int, tile.split("x"))
                # more warps than the space offers (16): built at 16, launched at w
                s = Schedule(block_m=bm, block_n=bn, num_warps=min(w, 16), num_stages=st,
                             row_programs=rp[0] if rp else 0)
                for form in args.forms.split(","):
                    current["form"] = form
                    rec = dict(chain=chain.name, dtype=dt, tile=tile, form=form,
                               compile_ms=t_compile)
                    try:
                        k = nf.compile(outs, ins, schedule=s, cache=False)
                        if w > 16:
                            k = _warps(k, w)
                        got = k(*xs)
                        got = got if isinstance(got, (list, tuple)) else [got]
                        rec["max_abs_diff_vs_compile"] = max(
                            (g.float() - r.float()).abs().max().item()
                            for g, r in zip(got, want))
                        rec["ms"] = do_bench(lambda k=k, a=xs: k(*a))
                        rec["vs_compile"] = t_compile / rec["ms"]
                        for ck in k._compiled.values():
                            rec.update(regs=ck.n_regs, spills=ck.n_spills)
                    except Exception as err:   # recorded, not fatal
                        rec["error"] = repr(err)[:300]
                    print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
