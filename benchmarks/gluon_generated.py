"""The generated Gluon kernels (codegen/gluon.py) of the prefill operators: compiled for
sm_90 on any machine, or run on a Hopper GPU against float64, cuDNN and ``nf.attention``.

A measurement tool for issue 18 (docs/hopper.md). For each operator and tile the tile
program is built as ``nf.compile`` builds it, printed by the Gluon emitter, loaded from
memory as the runtime loads kernels, and

* ``--compile-only``: compiled with Triton for sm_90 (no GPU needed; Triton's own
  ``ptxas`` reports registers and spills) -- the CPU machine's check of the source;
* otherwise, on the GPU: launched with the Triton kernel's own arguments (pointers,
  strides, sizes), its output compared with a float64 reference of the operator (the
  query heads of the first key/value head), then timed with ``do_bench`` beside cuDNN's
  SDPA (plain, causal and GQA operators) and ``nf.attention`` in the same process.

Writes ``gluon_generated.jsonl`` under ``--out``.
Usage: ``python benchmarks/gluon_generated.py --compile-only`` (Triton 3.6 on the path)
or ``python benchmarks/gluon_generated.py --out DIR`` (GPU).
"""
import argparse
import itertools
import json
import os
import re
import time

import torch

from neptune_fusion import ops
from neptune_fusion.codegen.gluon import LAUNCH_WARPS, generate, gluon_args
from neptune_fusion.fusion.plan import plan as make_plan
from neptune_fusion.ir.nodes import Size
from neptune_fusion.runtime.descriptors import maker, signature_type
from neptune_fusion.runtime.loader import load_kernel_module
from neptune_fusion.runtime.pipeline import build_programs
from neptune_fusion.schedule.schedule import Schedule

LOG = []
PREFILL = ("PF-Global", "PF-Causal", "PF-GQA", "PF-ALiBi", "PF-SoftCap", "PF-Window")
# block_m, block_n, stages[, row_programs: a persistent grid of that many programs per SM]
TILES = ((128, 128, 2), (128, 128, 3), (128, 64, 2), (128, 64, 3))


def rec(**kw):
    print(json.dumps(kw), flush=True)
    if LOG:
        LOG[0].write(json.dumps(kw) + "\n")
        LOG[0].flush()


def program(name, d, dtype, block_m, block_n, row_programs=0):
    [o], ins = ops.definition(name, dtype, head_dim=d)
    sched = Schedule(block_m=block_m, block_n=block_n, num_warps=block_m // 16, num_stages=2,
                     row_programs=row_programs, dialect="gluon")
    [prog] = build_programs(make_plan([o]), ins, sched, name="nf_o")
    return prog, ins


COLS = "(t_2 * (offs_j - i_first).to(tl.float32))"


def _magic_cvt(src: str) -> str:
    """ALiBi's column positions converted without I2F (which shares the exponential's
    throughput): ``float(d) = bits(d + 0x4B400000) - 1.5 * 2**23``, exact for ``|d| <
    2**22`` -- an experiment only, the emitter cannot assume that range."""
    return src.replace(COLS, "(t_2 * ((offs_j - i_first + 0x4B400000).to(tl.float32, "
                             "bitcast=True) - 12582912.0))")


def _hoisted_cols(src: str) -> str:
    """ALiBi's column positions as ``float(arange)`` bound once before the loop plus the
    tile's start converted once: no per-column conversion, one add per column."""
    out, start = [], None
    for line in src.splitlines():
        got = re.match(r"\s*offs_j = (\w+) \+ gl\.arange", line)
        if got:
            start = got.group(1)
        if line.strip().startswith("t_2 = ") and "cj =" not in src:
            pad = line[:len(line) - len(line.lstrip())]
            out.append(line)
            out.append(pad + "cj = t_2 * gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, "
                             "S_LAYOUT)).to(tl.float32)")
            continue
        out.append(line.replace(COLS, f"(cj + t_2 * tl.cast({start} - i_first, "
                                      "tl.float32))") if start else line)
    return "\n".join(out) + "\n"


def _no_store(src: str) -> str:
    """Diagnostic (its output is wrong, so it is timed unchecked): the epilogue's store
    behind a condition that is never true at run time, so nothing is removed but the
    store itself -- what the output's write costs."""
    out = []
    for line in src.splitlines():
        if line.lstrip().startswith("tl.store(o_base"):
            pad = line[:len(line) - len(line.lstrip())]
            out += [pad + "if M < 0:", "    " + line]
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def _swap_lines(src: str, old: tuple, new: list) -> str:
    """Each run of the lines ``old`` (stripped) replaced by ``new``, at its indentation;
    an error where the source has none (the edit does not apply to that tile)."""
    lines, out, i, hits = src.splitlines(), [], 0, 0
    while i < len(lines):
        if tuple(x.strip() for x in lines[i:i + len(old)]) == old:
            pad = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
            out += [pad + x for x in new]
            i, hits = i + len(old), hits + 1
        else:
            out.append(lines[i])
            i += 1
    if not hits:
        raise ValueError("the edit does not apply to this source")
    return "\n".join(out) + "\n"


def _block_order(group: int):
    """A program per row block, launched heads first in groups of ``group`` heads: the
    launch index ``L`` (x fastest) visits the heaviest row block of each head of a group,
    then the next heaviest, and so on, so the blocks dispatched last are the short ones
    (a causal mask's row blocks in reverse per head leave a wave of long ones at the
    end when the heads are the slow axis)."""
    def edit(src):
        return _swap_lines(src, ("pid_row = tl.num_programs(0) - 1 - tl.program_id(0)",
                                 "pid_grid = tl.program_id(1)"), [
            "_nb = tl.num_programs(0)",
            "_ng = tl.num_programs(1)",
            "_l = tl.program_id(1) * _nb + tl.program_id(0)",
            f"_g0 = (_l // ({group} * _nb)) * {group}",
            f"_gs = tl.minimum({group}, _ng - _g0)",
            "_r = _l - _g0 * _nb",
            "pid_row = _nb - 1 - _r // _gs",
            "pid_grid = _g0 + _r % _gs"])
    return edit


def _skip_rescale(lag: float | None):
    """The accumulator's rescale behind a warpgroup-wide vote, skipped where every row's
    factor is 1 (exact: a product by 1); with ``lag``, a row's running maximum moves only
    when a tile's exceeds it by more than ``lag`` (log2 units: the probabilities stay
    below ``2**lag``), so the vote almost always skips -- FlashAttention-4's conditional
    rescale, an experiment before the compiler does it."""
    def edit(src):
        out, hits = [], 0
        for line in src.splitlines():
            pad = line[:len(line) - len(line.lstrip())]
            got = re.match(r"\s*(\w+) = _nf_maximum\(m, (.+)\)$", line)
            if lag is not None and got:
                x = got.group(2)
                line = (f"{pad}{got.group(1)} = tl.where(({x}) <= m + {lag}, m, "
                        f"_nf_maximum(m, {x}))")
            got = re.match(r"\s*(\w+) = \1 \* gl\.convert_layout\((\w+), ", line)
            if got:
                hits += 1
                out.append(f"{pad}if tl.max(tl.where({got.group(2)} != 1.0, 1, 0), 0) > 0:")
                line = "    " + line
            out.append(line)
        if not hits:
            raise ValueError("the edit does not apply to this source")
        return "\n".join(out) + "\n"
    return edit


# ALiBi's column positions as Lowerer.column_float prints them: columns, tile start, row
SPLIT_COLS = (r"\((\w+) & -8\)\.to\(tl\.float32\) \+ \(\(\1 & 7\) \+ \((\w+) - (\w+)\)\)"
              r"\.to\(tl\.float32\)")


def _unsplit_cols(src: str) -> str:
    """ALiBi's column positions converted per column again, as before 878fba3: the
    split's A/B in one process."""
    got = re.sub(SPLIT_COLS, r"(\2 + \1 - \3).to(tl.float32)", src)
    if got == src:
        raise ValueError("the edit does not apply to this source")
    return got


def _mma_bias(src: str) -> str:
    """ALiBi's column term through the tensor cores: the slope (over the score scale, in
    three 16-bit parts) as one more 16-wide K block of ``q`` against a constant block of
    column offsets ``j - j0`` in shared memory (exact in fp16 and bf16 below 256), so
    ``q . k`` arrives with the term in it and the element work is PF-Causal's (the
    tile's ``t (j0 - i_first)`` is a scalar). An experiment before the emitter does it:
    PF-ALiBi on a program per row block (compiled at 128 x 128 and 128 x 64, fp16 and
    bf16; the persistent walk not tried), one more MMA step per tile (1/16 more work at
    head dim 128)."""
    lines, out = src.splitlines(), []
    dt = "tl.bfloat16" if "p.to(tl.bfloat16)" in src else "tl.float16"
    scores = {}      # the name of a branch's scores -> the scale
    for line in lines:
        pad = line[:len(line) - len(line.lstrip())]
        line = line.replace("v_smem, a_bar", "v_smem, x_smem, a_bar")
        got = re.fullmatch(r"\s*\w+ = " + SPLIT_COLS, line)
        if got and got.group(3) == "i_first":
            out.append(f"{pad}bt = t_2 * ({got.group(2)} - i_first).to(tl.float32)")
            continue
        got = re.match(r"\s*(\w+) = qk \* ([\d.e-]+) \+ \(t_2 \* \w+\)\[None, :\]$", line)
        if got:   # interior: the scores are not bound; max and exp read qk
            scores[got.group(1)] = got.group(2)
            continue
        line = re.sub(r"qk \* ([\d.e-]+) \+ \(t_2 \* \w+\)\[None, :\]", r"qk * \1 + bt", line)
        for name, c in scores.items():
            line = line.replace(f"_nf_max({name}, 1, INTERPRET)",
                                f"(_nf_max(qk, 1, INTERPRET) * {c} + bt)")
            line = re.sub(rf"tl\.exp2\({name} \+ \((.+)\)\[:, None\]\)",
                          rf"tl.exp2(qk * {c} + (bt + \1)[:, None])", line)
        out.append(line)
        if line.strip().startswith("t_5 = -(t_2 * (offs_i - i_first)"):
            out += [pad + x for x in (
                f"u = t_2 / {_scale(src)}",
                f"u_hi = u.to({dt}).to(tl.float32)",
                f"u_mid = (u - u_hi).to({dt}).to(tl.float32)",
                f"u_lo = (u - u_hi - u_mid).to({dt}).to(tl.float32)",
                "XB: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], "
                "threads_per_warp=[32, 1], warps_per_cta=[4, 1], order=[1, 0])",
                "kx = gl.arange(0, 16, layout=gl.SliceLayout(0, XB))",
                "ux = tl.where(kx == 0, u_hi, tl.where(kx == 1, u_mid, tl.where(kx == 2, u_lo, "
                "0.0)))",
                f"qx = (gl.zeros([WG_ROWS, 16], tl.float32, XB) + ux[None, :]).to({dt})",
                "qx_op = gl.convert_layout(qx, gl.DotOperandLayout(operand_index=0, "
                "parent=S_LAYOUT, k_width=2))")]
        if "= warpgroup_mma(q_half," in line:
            acc = line.split("=")[0].strip()
            tail = ", is_async=True)" if "is_async=True" in line else ")"
            out.append(f"{pad}{acc} = warpgroup_mma(qx_op, x_smem.permute((1, 0)), {acc}{tail}")
        if line.strip().startswith("v_smem = gl.allocate_shared_memory("):
            out += [pad + x for x in (
                f"x_smem = gl.allocate_shared_memory({dt}, [BLOCK_N, 16], "
                "gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=16, rank=2))",
                "XL: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], "
                "threads_per_warp=[32, 1], warps_per_cta=[4, 1], order=[1, 0])",
                "jx = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, XL))",
                "kx = gl.arange(0, 16, layout=gl.SliceLayout(0, XL))",
                "xv = tl.where((kx < 3)[None, :], jx[:, None].to(tl.float32) + "
                "gl.zeros([BLOCK_N, 16], tl.float32, XL), 0.0)",
                f"x_smem.store(xv.to({dt}))",
                "gl.thread_barrier()")]
    if not scores:
        raise ValueError("the edit does not apply to this source")
    return "\n".join(out) + "\n"


def _scale(src: str) -> str:
    got = re.search(r"qk \* ([\d.e-]+) \+ \(t_2 \*", src)
    if not got:
        raise ValueError("the edit does not apply to this source")
    return got.group(1)


# --edits: textual edits of the generated source, each timed beside the unedited kernel;
# a "diag-" edit changes the result and is timed without the float64 check. Since 58bab3d
# the emitter prints ALiBi's column term through the MMA itself (codegen/mma_bias.py), so
# "unsplit-cols" and "mma-bias" apply only to the sources of older trees (PYTHONPATH)
EDITS = {"none": lambda s: s, "magic-cvt": _magic_cvt, "hoisted-cols": _hoisted_cols,
         "diag-no-store": _no_store, "pb-heads2": _block_order(2),
         "pb-heads4": _block_order(4), "pb-heads8": _block_order(8),
         "pb-heads64": _block_order(64), "skip-rescale": _skip_rescale(None),
         "lazy-rescale": _skip_rescale(8.0),
         "unsplit-cols": _unsplit_cols, "mma-bias": _mma_bias}


def kernel_of(prog, edit: str = "none"):
    src = EDITS[edit](generate(prog))
    return src, getattr(load_kernel_module(src, prog.name, interpret=False), prog.name)


def arguments(prog, ins, tensors, out):
    """The kernel's arguments, in :func:`gluon_args` order, for torch ``tensors``."""
    by_tensor = dict(zip(ins, tensors))
    by_tensor[prog.outputs[0].arg.tensor] = out
    sizes = {}
    for ph, t in by_tensor.items():
        for ext, n in zip(ph.shape, t.shape):
            if isinstance(ext, Size):
                sizes[ext] = n
    vals = {}
    for a in gluon_args(prog):
        if a.kind == "tensor":
            vals[a.name] = by_tensor[a.ref.tensor]
        elif a.kind == "stride":
            t, d = a.ref
            vals[a.name] = by_tensor[t.tensor].stride(d)
        elif a.kind == "size":
            vals[a.name] = sizes[a.ref]
        elif a.kind == "block":
            vals[a.name] = a.ref.block_size
        elif a.kind == "flag":
            vals[a.name] = False
        elif a.kind == "desc":   # a host-side TMA descriptor, as the runtime makes it
            d = a.ref
            vals[a.name] = maker(d.block, d.swizzle, d.bits)(by_tensor[d.arg.tensor])
        else:
            raise ValueError(f"argument {a.name} ({a.kind}) is not supported here")
    grid = 1
    for ax in prog.grid:
        grid *= ax.extent if isinstance(ax.extent, int) else sizes[ax.extent]
    n = sizes[prog.row.extent] if isinstance(prog.row.extent, Size) else prog.row.extent
    blocks, rp = triton_cdiv(n, prog.schedule.block_m), prog.schedule.row_programs
    if rp:   # persistent: the programs walk the (row block, grid) items
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        return vals, (min(blocks * grid, rp * sms), 1)
    return vals, (blocks, grid)


def triton_cdiv(a, b):
    return -(-a // b)


def compile_only(args):
    from sm90 import compile_sm90, sass_counts, sass_paths

    for name, d, (bm, bn, st, *rp), edit in itertools.product(
            args.ops, args.head_dims or [128], args.tiles, args.edits):
        prog, _ = program(name, d, args.dtype, bm, bn, *rp)
        try:
            src, fn = kernel_of(prog, edit)
        except Exception as e:  # noqa: BLE001 - a probe records every failure
            rec(op=name, d=d, block_m=bm, block_n=bn, ok=False, stage="generate",
                error=f"{type(e).__name__}: {e}")
            continue
        if args.print:
            print(src)
        sig, consts = {}, {}
        ptr = "*bf16" if args.dtype == "bfloat16" else "*fp16"
        for a in gluon_args(prog):
            if a.kind == "tensor":
                sig[a.name] = ptr
            elif a.kind in ("stride", "size"):
                sig[a.name] = "i32"
            elif a.kind == "desc":
                sig[a.name] = signature_type(a.ref)
            else:
                sig[a.name] = "constexpr"
                consts[a.name] = a.ref.block_size if a.kind == "block" else False
        sig["STAGES"], consts["STAGES"] = "constexpr", st
        t0 = time.time()
        try:
            k, info = compile_sm90(fn, sig, consts, LAUNCH_WARPS)
        except Exception as e:  # noqa: BLE001
            rec(op=name, d=d, block_m=bm, block_n=bn, stages=st, ok=False, stage="compile",
                error=f"{type(e).__name__}: {str(e)[:600]}")
            continue
        rec(op=name, d=d, block_m=bm, block_n=bn, stages=st, row_programs=rp[0] if rp else 0,
            edit=edit, ok=True,
            shared=k.metadata.shared, s=round(time.time() - t0, 1), ptxas=info,
            sass=sass_counts(k), loops=[list(x) for x in sass_paths(k)])


def reference(op, q, k, v, scale):
    """float64 output of the query heads of the first key/value head."""
    from neptune_fusion.bench.reference import additive_bias

    g, n = q.shape[1] // k.shape[1], k.shape[2]
    s = q[:, :g].double() @ k[:, :1].double().transpose(-1, -2) * scale
    if op.softcap is not None:
        s = op.softcap * torch.tanh(s / op.softcap)
    bias = additive_bias(op, n, dtype=torch.float64, device=q.device, heads=slice(0, g))
    if bias is not None:
        s = s + bias
    return torch.softmax(s, -1) @ v[:, :1].double()


def case(name, d, n, dtype, t_end, gen, tiles, flex, edits=("none",)):
    """One operator and length: the references, then each tile of the generated kernel."""
    from functools import partial

    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from neptune_fusion.bench.workloads import attention_options

    op = ops.operator(name)
    hq, hkv = op.q_heads, op.kv_heads
    q = torch.randn(1, hq, n, d, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(1, hkv, n, d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(1, hkv, n, d, device="cuda", dtype=dtype, generator=gen)
    g = hq // hkv
    opts = attention_options(op, n, q.device)
    opts["scale"] = d ** -0.5    # as ops.definition scales at head dim d
    ref = reference(op, q, k, v, opts["scale"])

    def err_of(o):
        return ((o[:, :g].double() - ref).norm() / ref.norm()).item()

    ours = partial(ops.attention, q, k, v, **opts)
    base = dict(op=name, d=d, n=n, dtype=str(dtype)[6:])
    base.update(nf_err=err_of(ours()), nf_ms=round(do_bench(ours, warmup=50, rep=300), 4))
    if not op.alibi and op.softcap is None and op.window is None:
        kg, vg = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            cud = partial(torch.nn.functional.scaled_dot_product_attention, q, kg, vg,
                          is_causal=op.causal, scale=opts["scale"])
            base.update(cudnn_err=err_of(cud()),
                        cudnn_ms=round(do_bench(cud, warmup=50, rep=300), 4))
    if flex:
        from neptune_fusion.bench.providers.flex import FLEX
        fx = FLEX.prepare(op, q, k, v, None).fn
        base.update(flex_err=err_of(fx()), flex_ms=round(do_bench(fx, warmup=50, rep=300), 4))
    rec(**base)
    for (bm, bn, st, *rp), edit in itertools.product(tiles, edits):
        if time.time() > t_end:
            return
        kw = dict(block_m=bm, block_n=bn, stages=st, row_programs=rp[0] if rp else 0)
        if edit != "none":
            kw["edit"] = edit
        try:
            prog, ins = program(name, d, str(dtype)[6:], bm, bn, *rp)
            _, fn = kernel_of(prog, edit)
            out = torch.empty_like(q)
            vals, grid = arguments(prog, ins, (q, k, v), out)
            call = partial(fn[grid], **vals, STAGES=st, num_warps=LAUNCH_WARPS)
            call()
            torch.cuda.synchronize()
            err = err_of(out)
            if not err <= 3 * base["nf_err"] + 1e-3 and not edit.startswith("diag-"):
                rec(**base, **kw, ok=False, err=err, why="wrong")
                continue
            t = do_bench(call, warmup=50, rep=300)
            rec(**base, **kw, ok=True, err=err, ms=round(t, 4), vs_nf=round(base["nf_ms"] / t, 3),
                vs_cudnn=round(base["cudnn_ms"] / t, 3) if "cudnn_ms" in base else None,
                vs_flex=round(base["flex_ms"] / t, 3) if "flex_ms" in base else None)
        except Exception as e:  # noqa: BLE001 - a probe records every failure and goes on
            rec(**base, **kw, ok=False, error=f"{type(e).__name__}: {str(e)[:400]}")


def gpu(args):
    import triton

    os.makedirs(args.out, exist_ok=True)
    LOG.append(open(os.path.join(args.out, "gluon_generated.jsonl"), "a"))
    # the kernels build their TMA descriptors on the device, in a scratch buffer
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    t_end = time.time() + args.budget
    for name, n in itertools.product(args.ops, args.seqs):
        for d in args.head_dims or [ops.operator(name).head_dim]:
            if time.time() > t_end:
                rec(stopped="budget")
                return
            case(name, d, n, getattr(torch, args.dtype), t_end, gen, args.tiles, args.flex,
                 args.edits)
            torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile-only", action="store_true", help="compile for sm_90, no GPU")
    ap.add_argument("--print", action="store_true", help="print each generated source")
    ap.add_argument("--out", default="gluon-generated")
    ap.add_argument("--ops", type=lambda s: s.split(","), default=list(PREFILL))
    ap.add_argument("--head-dims", type=lambda s: [int(x) for x in s.split(",")],
                    default=None, help="head dims (default: the operators' own, 128)")
    ap.add_argument("--seqs", type=lambda s: [int(x) for x in s.split(",")],
                    default=[4096, 16384])
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--budget", type=float, default=300.0, help="seconds, then stop")
    ap.add_argument("--tiles", type=lambda s: [tuple(int(x) for x in t.split("x"))
                                               for t in s.split(",")], default=list(TILES),
                    help="block_m x block_n x stages[ x row_programs], comma-separated "
                         "(128x128x2,128x128x2x1,...; row_programs: a persistent grid)")
    ap.add_argument("--flex", action="store_true",
                    help="time FlexAttention too (compiled per operator and length)")
    ap.add_argument("--edits", type=lambda s: s.split(","), default=["none"],
                    help=f"source edits to time beside each other ({', '.join(EDITS)})")
    args = ap.parse_args()
    if args.compile_only:
        compile_only(args)
    else:
        gpu(args)


if __name__ == "__main__":
    main()
