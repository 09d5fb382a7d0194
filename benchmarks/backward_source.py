"""Print the generated backward kernels of an attention operator (docs/autodiff.md).

For a benchmark operator (PF-Causal, PF-GQA, PF-SoftCap, PF-Window, ...), a head dim and
a device's cost model, it derives the backward from the forward definition, builds the
``delta``, ``d_q`` and ``d_k, d_v`` kernels, ranks each one's schedules as the
auto-scheduler would for that device and prints the ranking and the Triton source of the
schedule ranked first (or of ``--pick``). Nothing runs: the shapes come from stand-in
tensors (no memory), so it works the same on a laptop and on the GPU machine.

    python benchmarks/backward_source.py PF-Causal --head-dim 128 --device h200
    python benchmarks/backward_source.py PF-GQA --device cuda --top 8   # the GPU's model
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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from neptune_fusion.frontend.attention_grad import build_backward
    from neptune_fusion.schedule import space
    from neptune_fusion.schedule.cost import rank
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
        for n, e in enumerate(ranked[:max(args.top, args.pick + 1)]):
            s = e.schedule
            print(f"# [{n}] {s.strategy} {s.block_m}x{s.block_n} warps={s.num_warps} "
                  f"stages={s.num_stages} est={e.seconds * 1e3:.4f} ms "
                  f"smem={e.resources.smem} regs={e.resources.regs}")
        if not ranked:
            continue
        chosen = ranked[min(args.pick, len(ranked) - 1)].schedule
        print(f"# source of: {chosen.to_json()}")
        for g in k.kernel_of(chosen).kernels:
            print(g.source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
