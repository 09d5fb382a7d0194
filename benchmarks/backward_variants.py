"""Edit the generated backward kernels' source and time the edits beside the unedited one.

A measurement tool for the backward's code generation (docs/autodiff.md): for an
attention operator it derives the backward as ``nf.attention`` does, builds the ``d_q``
and ``d_k, d_v`` kernels at each ``--tiles`` schedule, rewrites their Triton source by
each *form* and times every edited kernel on the same random inputs, its outputs compared
with the unedited kernel's. It also prints the registers, spills and shared memory of
each compiled kernel and, with ``--ir``, writes its TTGIR next to the log. Forms
(combine with ``+``):

* ``asis``: no edit;
* ``spec``: the sizes specialised (no ``do_not_specialize``: Triton learns whether each
  length is 1 or a multiple of 16, as for a static shape);
* ``nolast``: the last boundary loop deleted (empty when the loop length is a multiple
  of BLOCK_N, as at the sizes run; only right there);
* ``iflast``: the last boundary loop run inside ``if lo < hi:`` (no pipeline prologue
  when it is empty);
* ``dorows``: ``d_o`` loaded row-major (``[i, e]``) and transposed for the dot that
  wants ``d_oT`` (the emitter loads it ``[e, i]`` and transposes for the other dot);
* ``qrows``: the same for ``q``;
* ``noguard``: the masked tiles' ``where(i < N, ., -inf)`` on the exponent dropped (only
  right when N is a multiple of BLOCK_N).

Usage (GPU): ``python benchmarks/backward_variants.py PF-Causal --kernels dkv
--forms asis,spec,dorows,spec+nolast+dorows --tiles 128x64x8x3,128x64x8x2 --out DIR``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re

from backward_source import _forward, _inputs  # a sibling script: benchmarks/ on the path

_JIT = re.compile(r"@triton\.jit\(do_not_specialize=\[[^\]]*\]\)")


def _rows(src: str, name: str, col: str, stride: str) -> str:
    """Load ``name`` as ``[i, col]`` and transpose for the use that wants ``nameT``."""
    load = re.compile(
        rf"(?P<ind> +){name}T(?P<sfx>_\d+)? = tl\.load\({name}_base \+ "
        rf"\({col}\[:, None\] \+ \(offs_i \* {stride}\)\[None, :\]\)"
        rf"(?P<mask>, mask=\(offs_i < N\)\[None, :\], other=0\.0)?\)\n")

    def repl(m):
        ind, sfx, mask = m["ind"], m["sfx"] or "", m["mask"] or ""
        mask = mask.replace("[None, :]", "[:, None]")
        return (f"{ind}{name}{sfx} = tl.load({name}_base + ((offs_i * {stride})[:, None]"
                f" + {col}[None, :]){mask})\n{ind}{name}T{sfx} = tl.trans({name}{sfx})\n")
    src, n = load.subn(repl, src)
    if not n:
        raise ValueError(f"no transposed load of {name} to edit")
    return re.sub(rf" +{name}(_\d+)? = tl\.trans\({name}T(_\d+)?\)\n", "", src)


def wrap_last_loop(src: str) -> str:
    """The last boundary loop ``for x in range(lo, hi, BLOCK_N)`` inside ``if lo < hi:``
    (a loop that may run zero times then skips its pipeline prologue too)."""
    start = [m.start() for m in re.finditer(r"    # boundary tiles", src)][-1]
    end = src.index("    # epilogue")
    block = src[start:end]
    m = re.search(r"\n    for \w+ in range\((?P<lo>[^,]+), (?P<hi>[^,]+), BLOCK_N\):", block)
    head, loop = block[:m.start() + 1], block[m.start() + 1:]
    loop = "".join("    " + ln if ln.strip() else ln for ln in loop.splitlines(True))
    return src[:start] + head + f"    if {m['lo']} < {m['hi']}:\n" + loop + src[end:]


def edit(src: str, form: str) -> str:
    """``src`` rewritten by every part of ``form`` (see the module docstring)."""
    parts = set(form.split("+")) - {"asis"}
    if "spec" in parts:
        src = _JIT.sub("@triton.jit", src)
    if "nolast" in parts:
        marks = [m.start() for m in re.finditer(r"    # boundary tiles", src)]
        end = src.index("    # epilogue")
        src = src[:marks[-1]] + src[end:]
    if "iflast" in parts:
        src = wrap_last_loop(src)
    if "dorows" in parts:
        src = _rows(src, "d_o", "offs_e", "d_o_s2")
    if "qrows" in parts:
        src = _rows(src, "q", "offs_c_2", "q_s2")
    if "noguard" in parts:
        src = re.sub(r"tl\.where\(\(offs_i < N\)\[None, :\], (.*), float\(\"-inf\"\)\)\n",
                     r"\1\n", src)
    return src + f"\n# form {form}\n"


def _variant(base, form: str):
    """A fresh kernel like ``base`` whose single generated kernel has the edited source."""
    from neptune_fusion.runtime.kernel import Kernel
    spec = base.specs[0]
    sizes = tuple(a[1] for a in spec.args if a[0] == "size")
    new = dataclasses.replace(
        spec, source=edit(spec.source, form),
        specialized=sizes if "spec" in form.split("+") else spec.specialized)
    return Kernel(base.outputs, base.inputs, (new,), base.schedule, base._single,
                  base._lowered)


def main() -> None:
    from triton.testing import do_bench

    from neptune_fusion.frontend.attention_grad import build_backward
    from neptune_fusion.schedule.schedule import Schedule

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("operator", nargs="?", default="PF-Causal")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--kernels", default="dkv", help="dq, dkv or both (dq,dkv)")
    p.add_argument("--forms", default="asis,spec")
    p.add_argument("--tiles", default="128x64x8x3",
                   help="block_m x block_n x warps x stages, comma-separated")
    p.add_argument("--ir", action="store_true", help="write each kernel's TTGIR")
    p.add_argument("--out", default=".")
    p.add_argument("--device", default="cuda", help="cpu: the interpreter, untimed (a check)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "backward_variants.jsonl"), "a")
    kernels, _ = build_backward(_forward(args.operator, args.dtype, args.head_dim), False)
    for kname in args.kernels.split(","):
        k = getattr(kernels, kname)
        tensors = _inputs(k, args.seq, 1, args.device)
        for tile in args.tiles.split(","):
            bm, bn, w, st = map(int, tile.split("x"))
            base = k.kernel_of(Schedule(block_m=bm, block_n=bn, num_warps=w,
                                        num_stages=st))
            base._check_resources = lambda *a: None   # let Triton decide what fits
            ref = None
            for form in args.forms.split(","):
                rec = dict(op=args.operator, seq=args.seq, kernel=kname, tile=tile,
                           form=form)
                try:
                    kern = _variant(base, form)
                    outs = kern(*tensors)
                    outs = outs if isinstance(outs, (list, tuple)) else [outs]
                    if ref is None:
                        ref = [o.float() for o in outs]
                    rec["max_abs_diff_vs_first"] = max(
                        (o.float() - r).abs().max().item() for o, r in zip(outs, ref))
                    if args.device == "cpu":
                        print(json.dumps(rec), flush=True)
                        continue
                    rec["ms"] = do_bench(lambda kern=kern, ts=tensors: kern(*ts), warmup=50,
                                         rep=300)
                    for ck in kern._compiled.values():
                        rec.update(regs=ck.n_regs, spills=ck.n_spills,
                                   smem=ck.metadata.shared)
                        if args.ir:
                            path = os.path.join(args.out, f"{kname}-{tile}-{form}.ttgir")
                            with open(path, "w") as f:
                                f.write(ck.asm["ttgir"])
                except Exception as err:   # a form that does not compile: recorded
                    rec["error"] = repr(err)[:300]
                print(json.dumps(rec), flush=True)
                log.write(json.dumps(rec) + "\n")
                log.flush()


if __name__ == "__main__":
    main()
