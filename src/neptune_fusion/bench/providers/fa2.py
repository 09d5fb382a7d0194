"""The baseline Triton FlashAttention-2 kernel of this repository (:mod:`.baseline_fa2`).

Covers Global, Causal and GQA prefill (causal with GQA included); ALiBi, soft-cap, sliding
window and decode are reported unsupported. On a GPU ``prepare`` tries a few tile configs
(tutorial-sized for head dim 128 on Hopper), times each with the run's timer and keeps the
fastest; the tuning time is part of the reported compile time. Under the CPU smoke run one
small config runs in the Triton interpreter.
"""

from __future__ import annotations

import torch

from ...ops import OpSpec
from .base import Prepared, Provider, RunContext, Unsupported
from .baseline_fa2 import BlockConfig, check_shapes, fa2_forward

GPU_CONFIGS: tuple[BlockConfig, ...] = (
    BlockConfig(128, 64, num_warps=4, num_stages=3),
    BlockConfig(128, 64, num_warps=8, num_stages=3),
    BlockConfig(128, 128, num_warps=8, num_stages=2),
    BlockConfig(64, 64, num_warps=4, num_stages=3),
)
SMOKE_CONFIG = BlockConfig(32, 16, num_warps=4, num_stages=1)


def _why_unsupported(op: OpSpec) -> str:
    if op.phase == "DC":
        return "decode (one query row) is not covered by this FA2 kernel"
    extras = [name for name, on in (("ALiBi", op.alibi), ("soft-cap", op.softcap is not None),
                                    ("sliding window", op.window is not None)) if on]
    return f"{' and '.join(extras)} not covered by this FA2 kernel" if extras else ""


def prepare(op: OpSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            ctx: RunContext) -> Prepared | Unsupported:
    """Pick the fastest tile config that fits the shape and return the launch closure."""
    why = _why_unsupported(op)
    if why:
        return Unsupported(why)
    if ctx.smoke and q.dtype == torch.bfloat16:
        # Seen with Triton 3.9: the interpreter's bf16 tl.dot returns garbage.
        return Unsupported("bf16 tl.dot is not reliable under the Triton interpreter")
    configs = (SMOKE_CONFIG,) if ctx.smoke else GPU_CONFIGS
    fitting = [c for c in configs if not check_shapes(q, k, v, c)]
    if not fitting:
        return Unsupported(check_shapes(q, k, v, configs[0]))

    def launcher(cfg: BlockConfig):
        return lambda: fa2_forward(q, k, v, causal=op.causal, scale=op.scale, cfg=cfg)

    if len(fitting) == 1:
        best = fitting[0]
    else:
        timed: list[tuple[float, BlockConfig]] = []
        failures: list[str] = []
        for cfg in fitting:
            try:
                timed.append((ctx.timer(launcher(cfg)), cfg))
            except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory: skip config
                failures.append(f"{cfg}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        if not timed:
            raise RuntimeError("every FA2 config failed: " + "; ".join(failures))
        best = min(timed, key=lambda t: t[0])[1]
    note = (f"BLOCK_M={best.block_m} BLOCK_N={best.block_n} warps={best.num_warps} "
            f"stages={best.num_stages}")
    return Prepared(launcher(best), note)


FA2 = Provider("triton-fa2", "Triton FA2", "compiler",
               "this repo's Triton FlashAttention-2 forward kernel (Global/Causal/GQA prefill)",
               prepare)
