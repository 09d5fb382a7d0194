"""Print the generated backward kernels of an attention operator (docs/autodiff.md).

For a benchmark operator (PF-Causal, PF-GQA, PF-SoftCap, PF-Window, ...), a head dim and
a device's cost model, it derives the backward from the forward definition, builds the
``delta``, ``d_q`` and ``d_k, d_v`` kernels, ranks each one's schedules as the
auto-scheduler would for that device and prints the ranking and the Triton source of the
schedule ranked first (or of ``--pick``). Nothing runs: the shapes come from stand-in
tensors (no memory), so it works the same on a laptop and on the GPU machine.

    python benchmarks/backward_source.py PF-Causal --head-dim 128 --device h200
    python benchmarks/backward_source.py PF-GQA --device cuda --top 8   # the GPU's model
    python benchmarks/backward_source.py PF-Causal --device cuda --top 12 --time --quiet

``--time`` runs each listed schedule of each kernel on random inputs of the shapes (CUDA
tensors with ``--device cuda``; else the CPU interpreter, slow: small ``--seq`` only)
and prints its time: whether the cost model ranks the fastest among the few the
auto-scheduler measures. A schedule that fails to compile or launch prints the error.
"""

from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("operator", nargs="?", default="PF-Causal",
                   help="benchmark operator (neptune_fusion.ops), default PF-Causal")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--seq", type=int, default=4096, help="query and key length (4096)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    p.add_argument("--device", default="h200", choices=("h200", "cuda", "cpu"),
                   help="whose cost model ranks the schedules: the H200's description, "
                        "the current CUDA device's, or the CPU interpreter's")
    p.add_argument("--top", type=int, default=4, help="ranked schedules to list (4)")
    p.add_argument("--pick", type=int, default=0,
                   help="print the source of the schedule ranked PICK (0: the first)")
    p.add_argument("--kernel", choices=("all", "delta", "dq", "dkv"), default="all")
    p.add_argument("--time", action="store_true",
                   help="run and time each listed schedule on random inputs (CUDA with "
                        "--device cuda, else the CPU interpreter: small --seq only)")
    p.add_argument("--quiet", action="store_true", help="no source, only the ranking")
    p.add_argument("--all", action="store_true",
                   help="list (and time) every candidate, those the model finds "
                        "infeasible last, with why (timed anyway: the model's refusal "
                        "bypassed, Triton's out-of-resources error decides)")
    return p


def _forward(name: str, dtype: str, head_dim: int):
    """A stand-in for the forward kernel: what ``build_backward`` reads (its definition,
    with the row log-sum-exp output the forward saves)."""
    from neptune_fusion.frontend.attention import AttentionSpec, attention_definition
    from neptune_fusion.ops import Alibi, operator, score_mod_of
    op = operator(name)
    if op.phase == "DC":
        raise SystemExit(f"{name}: a decode operator; the backward is measured on prefill")
    spec = AttentionSpec(
        dtype=dtype, q_heads=op.q_heads, kv_heads=op.kv_heads, head_dim=head_dim,
        v_head_dim=head_dim, scale=head_dim ** -0.5,
        score_mod=score_mod_of(op.softcap, Alibi(op.q_heads) if op.alibi else None),
        mask_mod=op.mask_mod(), q_offset=0, lse=True)

    class Forward:
        outputs, inputs = attention_definition(spec)
    return Forward()


def _stand_ins(kernel, seq: int, batch: int, device: str):
    """Zero-stride tensors of the kernel's input shapes (no memory behind them)."""
    import torch
    dev = "cuda" if device == "cuda" else "cpu"
    out = []
    for p in kernel.inputs:
        shape = [d if isinstance(d, int) else (batch if d.name == "B" else seq)
                 for d in p.shape]
        row = torch.empty(shape[-1:], dtype=getattr(torch, p.dtype.name), device=dev)
        out.append(row.expand(shape))
    return out


def _inputs(kernel, seq: int, batch: int, device: str):
    """Random inputs of the kernel's shapes (never zeros): ``lse``, ``delta`` finite."""
    import torch
    dev = "cuda" if device == "cuda" else "cpu"
    gen = torch.Generator(device=dev).manual_seed(0)
    out = []
    for p in kernel.inputs:
        shape = [d if isinstance(d, int) else (batch if d.name == "B" else seq)
                 for d in p.shape]
        dtype = getattr(torch, p.dtype.name)
        t = torch.randn(shape, generator=gen, device=dev, dtype=torch.float32)
        if p.name == "lse":   # a row's log-sum-exp is at least its largest score
            t = t.abs() + 4.0
        out.append(t.to(dtype))
    return out


def _time(kernel, tensors, device: str) -> str:
    """The kernel's time on ``tensors``, or why it did not run."""
    import time

    import torch
    try:
        kernel(*tensors)    # compile and warm up
        if device != "cuda":
            t0 = time.perf_counter()
            kernel(*tensors)
            return f"{(time.perf_counter() - t0) * 1e3:.1f} ms (CPU interpreter)"
        from triton.testing import do_bench
        return f"{do_bench(lambda: kernel(*tensors)):.4f} ms"
    except Exception as exc:   # noqa: BLE001 -- a report, not a recovery
        torch.cuda.synchronize() if device == "cuda" else None
        return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from neptune_fusion.frontend.attention_grad import build_backward
    from neptune_fusion.schedule import space
    from neptune_fusion.schedule.cost import estimate, rank
    kernels, group = build_backward(_forward(args.operator, args.dtype, args.head_dim),
                                    False)
    print(f"# {args.operator}, head dim {args.head_dim}, {args.dtype}, B={args.batch}, "
          f"S={args.seq}; group {group} (d_k, d_v summed over it "
          f"{'in torch' if group > 1 else '-'})")
    for name, k in (("delta", kernels.delta), ("dq", kernels.dq), ("dkv", kernels.dkv)):
        if k is None or args.kernel not in ("all", name):
            continue
        problem, device, cands = k.space_for(*_stand_ins(k, args.seq, args.batch,
                                                         args.device))
        if args.device == "h200":
            device = space.H200
            cands = space.candidates(problem, device, k.base)
        ranked = rank(problem, cands, device)
        print(f"\n##### {name}: {device.name}; {len(ranked)} of {len(cands)} candidates fit")
        print(f"# {problem}")
        tensors = _inputs(k, args.seq, args.batch, args.device) if args.time else None
        listed = ranked[:max(args.top, args.pick + 1)]
        if args.all:
            kept = {e.schedule for e in ranked}
            listed = ranked + [x for x in (estimate(problem, c, device) for c in cands)
                               if x.schedule not in kept]
        for n, e in enumerate(listed):
            s = e.schedule
            took = ""
            if args.time:
                try:
                    kern = k.kernel_of(s)
                    if e.why:   # let the device decide: Triton reports what does not fit
                        kern._check_resources = lambda *a: None
                    took = f" -> {_time(kern, tensors, args.device)}"
                except Exception as exc:   # noqa: BLE001 -- building it failed: report
                    took = f" -> not built: {type(exc).__name__}: {exc}"[:160]
            why = f" INFEASIBLE ({e.why})" if e.why else ""
            print(f"# [{n}] {s.strategy} {s.block_m}x{s.block_n} warps={s.num_warps} "
                  f"stages={s.num_stages} est={e.seconds * 1e3:.4f} ms "
                  f"smem={e.resources.smem} regs={e.resources.regs}{why}{took}")
        if not ranked or args.quiet:
            continue
        chosen = ranked[min(args.pick, len(ranked) - 1)].schedule
        print(f"# source of: {chosen.to_json()}")
        for g in k.kernel_of(chosen).kernels:
            print(g.source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
