"""Edit the generated attention source and time the edits, beside the unedited kernel.

A measurement tool for code-generation decisions (docs/hopper.md): each *form* rewrites
the Triton source the emitter produced for an operator and schedule before it is loaded,
and the edited kernel is timed against the automatic choice in the same process, its
output compared with the automatic choice's. Forms (combine with ``+``):

* ``asis``: no edit;
* ``noguard``: the interior loop's running-maximum guard ``where(|m| < inf, m, 0)``
  replaced by ``m`` (only right when no row is fully masked so far);
* ``swap``: the boundary (masked) loop moved before the interior one;
* ``drop``: the boundary loop deleted (only right when the key length is a multiple of
  BLOCK_N and there is no mask, as for PF-Global at the sizes run);
* ``spec``: the sizes specialised (``static_sizes``: no ``do_not_specialize``);
* ``iflast``: the last boundary loop inside ``if lo < hi:`` (backward_variants.py);
* ``ws``: the interior loop warp-specialised, ``tl.range(..., warp_specialize=True)``
  (needs ``--tma``, the schedule's tensor-descriptor loads);
* ``heavy``: row blocks launched last to first (now what the emitter does for causal
  grids: ``codegen/source.heaviest_first``; ``light`` undoes it);
* ``strides``: every stride argument a compile-time constant (the probe's kernel has its
  row stride as the constexpr head dim).

Usage (GPU): ``python benchmarks/source_variants.py --ops PF-Global,PF-Causal
--forms asis,drop,drop+ws --tiles 128x128x4x2,128x128x8x3 --tma --out DIR``.
"""
from __future__ import annotations

import argparse
import json
import os
import re

GUARD = 'm_run = tl.where(tl.abs(m_new) < float("inf"), m_new, 0.0)'
FORWARD = "pid_row = tl.program_id(0)"
REVERSE = "pid_row = tl.num_programs(0) - 1 - tl.program_id(0)"


def edit(src: str, form: str) -> str:
    """``src`` rewritten by every part of ``form`` (see the module docstring)."""
    parts = set(form.split("+")) - {"asis"}
    if not parts:
        return src
    if "noguard" in parts:
        src = src.replace(GUARD, "m_run = m_new", 1)
    if "spec" in parts:
        src = re.sub(r"@triton\.jit\(do_not_specialize=\[[^\]]*\]\)", "@triton.jit", src)
    if "iflast" in parts:
        from backward_variants import wrap_last_loop
        src = wrap_last_loop(src)
    if "heavy" in parts:
        src = src.replace(FORWARD, REVERSE)
    if "light" in parts:
        src = src.replace(REVERSE, FORWARD)
    if "strides" in parts:
        src = re.sub(r"\b(\w+_s\d+)(?=[,\n])(?!: tl)", r"\1: tl.constexpr",
                     src[:src.index("):\n")]) + src[src.index("):\n"):]
    if parts & {"swap", "drop"}:
        i0, i1 = src.index("    # interior tiles"), src.index("    # boundary tiles")
        i2 = src.index("    # epilogue")
        inner, bound = src[i0:i1], src[i1:i2]
        src = src[:i0] + (bound + inner if "swap" in parts else inner) + src[i2:]
    if "ws" in parts:
        head = src.index("    for j0 in range(")
        end = src.index(":\n", head)
        args = src[head + len("    for j0 in range("):end - 1]
        src = src[:head] + f"    for j0 in tl.range({args}, warp_specialize=True)" + src[end:]
    return src + f"\n# form {form}\n"


def main() -> None:
    import torch
    from triton.testing import do_bench

    from neptune_fusion import ops
    from neptune_fusion.frontend.attention import AttentionCache
    from neptune_fusion.runtime import kernel as kernel_module
    from neptune_fusion.schedule.schedule import Schedule

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default="PF-Global,PF-Causal")
    p.add_argument("--forms", default="asis,heavy")
    p.add_argument("--tiles", default="128x128x8x3,128x64x8x3",
                   help="block_m x block_n x warps x stages, comma-separated")
    p.add_argument("--seqs", default="4096,16384")
    p.add_argument("--tma", action="store_true", help="schedules with tma=True")
    p.add_argument("--head-dim", type=int, default=0, help="head dim (default: the op's)")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "source_variants.jsonl"), "a")
    current = {"form": "asis"}
    load = kernel_module.load_kernel_module

    def patched(src, name, interpret):
        return load(edit(src, current["form"]), name, interpret)
    kernel_module.load_kernel_module = patched

    def timed(fn, *a, **kw):
        return do_bench(lambda: fn(*a, **kw))
    for name in args.ops.split(","):
        op = ops.OPERATORS[name]
        for seq in map(int, args.seqs.split(",")):
            torch.manual_seed(seq)
            d = args.head_dim or op.head_dim
            # the op's heads at its own head dim; as many heads again per halving of it
            hq, hkv = (op.q_heads * op.head_dim // d, op.kv_heads * op.head_dim // d)
            q = torch.randn(1, hq, seq, d, device="cuda", dtype=torch.float16)
            k, v = (torch.randn(1, hkv, seq, d, device="cuda", dtype=torch.float16)
                    for _ in range(2))
            current["form"] = "asis"
            ref = ops.run(name, q, k, v)
            t_auto = timed(ops.run, name, q, k, v)
            if name in ("PF-Global", "PF-Causal") and hq == hkv:   # cuDNN, same process
                from torch.nn.attention import SDPBackend, sdpa_kernel
                from torch.nn.functional import scaled_dot_product_attention as sdpa
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    t_cudnn = timed(sdpa, q, k, v, is_causal=name == "PF-Causal")
                line = json.dumps(dict(op=name, seq=seq, head_dim=d, cudnn_ms=t_cudnn,
                                       auto_ms=t_auto))
                print(line, flush=True)
                log.write(line + "\n")
            for tile in args.tiles.split(","):
                bm, bn, w, st = map(int, tile.split("x"))
                s = Schedule(block_m=bm, block_n=bn, num_warps=w, num_stages=st,
                             tma=args.tma)
                for form in args.forms.split(","):
                    current["form"] = form
                    cache = AttentionCache()   # a fresh kernel: the edit applies
                    rec = dict(op=name, seq=seq, head_dim=d, tile=tile, tma=args.tma,
                               form=form, auto_ms=t_auto)
                    try:
                        out = ops.run(name, q, k, v, schedule=s, cache=cache)
                        err = (out.float() - ref.float()).abs().max().item()
                        rec["max_abs_err_vs_auto"] = err
                        rec["ms"] = timed(ops.run, name, q, k, v, schedule=s, cache=cache)
                    except Exception as err:   # a form that does not compile: recorded
                        rec["error"] = repr(err)[:200]
                    print(json.dumps(rec), flush=True)
                    log.write(json.dumps(rec) + "\n")
                    log.flush()


if __name__ == "__main__":
    main()
