"""The backward suite's providers: forward + backward through ``torch.autograd``.

``prepare(op, x, ctx) -> Step | Unsupported``, ``x`` the point's
:class:`~neptune_fusion.bench.backward.Inputs` (q, k, v leaves requiring grad, the
cotangent ``dout``). A :class:`Step`'s ``fn`` clears the leaves' gradients, runs the
forward and one ``out.backward(dout)``, and returns ``(o, q.grad, k.grad, v.grad)``;
``forward`` runs the forward alone (grad mode on: what it saves for the backward
included). What each provider runs:

* ``neptune``: :func:`neptune_fusion.ops.attention` with the operator's options (the
  forward kernel writes the row log-sum-exp; the backward is the derived kernels).
* ``flex``: ``torch.compile(flex_attention, dynamic=False, fullgraph=True)`` with the
  forward suite's score_mod and block mask (:mod:`.flex`); its backward is the one
  FlexAttention generates. It has no backward on CPU: unsupported in the smoke run.
* ``sdpa``: ``F.scaled_dot_product_attention`` on the first backend whose forward and
  backward both take the problem, in the order cuDNN, flash, memory-efficient (the math
  backend only in the CPU smoke run); the note says which ran. Soft-cap: unsupported.
  GQA: ``enable_gqa=True``, else K and V repeated inside the timed call (their
  gradients summed back by autograd). ALiBi / window: a dense additive bias.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...ops import OpSpec
from ..backward import Inputs
from .base import RunContext, Unsupported

REASON_CHARS = 60   # of each refusal kept in the note


@dataclass(frozen=True, slots=True)
class Step:
    """A prepared provider: ``fn`` (forward + backward; returns ``(o, dq, dk, dv)``),
    ``forward`` (the forward alone) and a note on how it ran."""

    fn: Callable[[], tuple]
    forward: Callable[[], torch.Tensor]
    note: str = ""


def step(forward: Callable[[], torch.Tensor], x: Inputs, note: str) -> Step:
    """Wrap a forward over ``x``'s leaves into forward + ``out.backward(dout)``."""
    def fn() -> tuple:
        x.clear_grads()
        o = forward()
        o.backward(x.dout)
        return o, x.q.grad, x.k.grad, x.v.grad
    return Step(fn, forward, note)


def prepare_neptune(op: OpSpec, x: Inputs, ctx: RunContext) -> Step | Unsupported:
    from ...ops import attention
    from ..workloads import attention_options
    options = attention_options(op, x.k.shape[2], x.q.device)
    return step(lambda: attention(x.q, x.k, x.v, **options), x,
                "neptune_fusion.ops.attention under autograd (derived backward kernels)")


def prepare_flex(op: OpSpec, x: Inputs, ctx: RunContext) -> Step | Unsupported:
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as exc:
        return Unsupported(f"torch {torch.__version__} has no FlexAttention ({exc})")
    if x.q.device.type == "cpu":
        return Unsupported("FlexAttention has no backward on CPU")
    from ._compile import raise_recompile_limits
    from .flex import mask_mod_for, score_mod_for
    raise_recompile_limits()
    seq = x.k.shape[2]
    score_mod = score_mod_for(op, seq, x.q.device)
    mask_mod = mask_mod_for(op, seq)
    block_mask = None if mask_mod is None else create_block_mask(
        mask_mod, None, None, op.q_len(seq), seq, device=x.q.device)
    compiled = torch.compile(flex_attention, dynamic=False, fullgraph=True)
    gqa = op.group > 1

    def forward() -> torch.Tensor:
        return compiled(x.q, x.k, x.v, score_mod=score_mod, block_mask=block_mask,
                        scale=op.scale, enable_gqa=gqa)
    parts = [n for n, p in (("score_mod", score_mod), ("block_mask", block_mask)) if p]
    return step(forward, x, "torch.compile(flex_attention), its backward; "
                + (" + ".join(parts) or "no score_mod, no block_mask"))


def sdpa_backends(device: torch.device) -> tuple:
    """SDPA backends tried in order (the math backend only on CPU: the smoke run)."""
    from torch.nn.attention import SDPBackend
    order = (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
             SDPBackend.EFFICIENT_ATTENTION)
    return order + ((SDPBackend.MATH,) if device.type == "cpu" else ())


def prepare_sdpa(op: OpSpec, x: Inputs, ctx: RunContext) -> Step | Unsupported:
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    from ..reference import dense_bias
    if op.softcap is not None:
        return Unsupported("SDPA cannot express a soft-cap")
    seq = x.k.shape[2]
    bias = dense_bias(op, seq, dtype=x.q.dtype, device=x.q.device) if (
        op.alibi or op.window is not None) else None
    causal = bias is None and op.needs_mask(seq)

    def make(backend, gqa_flag: bool) -> Callable[[], torch.Tensor]:
        def forward() -> torch.Tensor:
            k, v = x.k, x.v
            if op.group > 1 and not gqa_flag:   # in the timed call: autograd sums back
                k = k.repeat_interleave(op.group, dim=1)
                v = v.repeat_interleave(op.group, dim=1)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(
                    x.q, k, v, attn_mask=bias, is_causal=causal, scale=op.scale,
                    enable_gqa=gqa_flag)
        return forward

    refused = []
    for backend in sdpa_backends(x.q.device):
        for gqa_flag in ((True, False) if op.group > 1 else (False,)):
            forward = make(backend, gqa_flag)
            try:
                step(forward, x, "").fn()   # forward and backward: both must take it
            except (RuntimeError, NotImplementedError) as exc:
                text = str(exc).strip().splitlines()
                why = (text[0] if text else type(exc).__name__)[:REASON_CHARS]
                refused.append(f"{backend.name}{' enable_gqa' if gqa_flag else ''}: {why}")
                continue
            finally:
                x.clear_grads()
            notes = [f"backend {backend.name}"]
            if op.group > 1:
                notes.append("GQA via enable_gqa=True" if gqa_flag
                             else "GQA by K, V repeated in the call")
            if bias is not None:
                notes.append(f"dense additive bias {tuple(bias.shape)}")
            if refused:
                notes.append("refused first: " + "; ".join(refused))
            return step(forward, x, ", ".join(notes))
    return Unsupported("no SDPA backend takes forward + backward: " + "; ".join(refused))


PREPARE: dict[str, Callable[[OpSpec, Inputs, RunContext], Step | Unsupported]] = {
    "flex": prepare_flex, "sdpa": prepare_sdpa, "neptune": prepare_neptune}
GROUPS = {"flex": "compiler", "sdpa": "library", "neptune": "neptune"}
