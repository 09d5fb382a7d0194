"""``torch.compile`` of attention written plainly in PyTorch.

``softmax(q @ k^T * scale [soft-capped] + bias) @ v`` with GQA by ``repeat_interleave`` of
K and V, the ALiBi bias and masks built from ``arange`` inside the compiled function (so
Inductor sees and may fuse them), as a user would write it. Decode adds no mask (the query
at S - 1 sees every key). Compiled with ``dynamic=False`` after raising the recompile limits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...ops import OpSpec
from ..reference import additive_bias
from ._compile import raise_recompile_limits
from .base import Prepared, Provider, RunContext, Unsupported


def plain_attention(op: OpSpec, seq: int) -> Callable[..., torch.Tensor]:
    """The uncompiled plain-PyTorch attention of ``op`` at key length ``seq``."""

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if op.group > 1:
            k = k.repeat_interleave(op.group, dim=1)
            v = v.repeat_interleave(op.group, dim=1)
        s = (q @ k.transpose(-2, -1)) * op.scale
        if op.softcap is not None:
            s = op.softcap * torch.tanh(s / op.softcap)
        bias = additive_bias(op, seq, dtype=torch.float32, device=q.device)
        if bias is not None:
            s = s + bias
        return torch.softmax(s, dim=-1).to(v.dtype) @ v

    return attention


def prepare(op: OpSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            ctx: RunContext) -> Prepared | Unsupported:
    """Compile the plain attention of ``op`` (compilation happens at the first call)."""
    raise_recompile_limits()
    compiled = torch.compile(plain_attention(op, k.shape[2]), dynamic=False)
    return Prepared(lambda: compiled(q, k, v), "plain PyTorch, torch.compile(dynamic=False)")


COMPILED = Provider("torch-compile", "torch.compile", "compiler",
                    "torch.compile of plain PyTorch attention (softmax(q k^T * scale + bias) v)",
                    prepare)


def prepare_jit(op: OpSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                ctx: RunContext) -> Prepared | Unsupported:
    """The same plain attention through neptune-fusion's torch.compile backend
    (``nf.jit``: the chain translated and compiled by us, the rest by Inductor)."""
    from ...dynamo import jit
    raise_recompile_limits()
    compiled = jit(plain_attention(op, k.shape[2]), dynamic=False)   # as torch-compile
    return Prepared(lambda: compiled(q, k, v),
                    "plain PyTorch, torch.compile(backend='neptune_fusion', dynamic=False)")


JIT = Provider("neptune-jit", "nf.jit", "compiler",
               "the same plain PyTorch attention through neptune-fusion's torch.compile "
               "backend (opt-in: --providers ...,neptune-jit)", prepare_jit)
