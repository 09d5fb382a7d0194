"""The chain suite's providers: neptune-fusion, torch eager and torch.compile.

``prepare(chain, tensors, ctx) -> Prepared | Unsupported`` as in :mod:`.base`, with a
:class:`~neptune_fusion.bench.chains.Chain` and its input tensors instead of an attention
operator. The runner times ``prepare`` plus the first call as the cold compile time, so
both compilers start cold: neptune-fusion compiles with its disk cache off, torch.compile
after ``torch._dynamo.reset()`` with Inductor's FX graph cache off. Triton's own kernel
cache (``~/.triton``) is left alone: both sides' kernels go through it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..chains import Chain
from ._compile import raise_recompile_limits
from .base import Group, Prepared, RunContext, Unsupported

ChainPrepareFn = Callable[[Chain, Sequence[torch.Tensor], RunContext], "Prepared | Unsupported"]
CHAIN_PROVIDER_NAMES: tuple[str, ...] = ("torch-eager", "torch-compile", "neptune-jit",
                                         "neptune")
CHAIN_OPT_IN: tuple[str, ...] = ("neptune-jit",)   # run only when named


@dataclass(frozen=True, slots=True)
class ChainProvider:
    """A named way to compute a chain, with its group (as :class:`.base.Provider`)."""

    name: str
    label: str
    group: Group
    description: str
    prepare: ChainPrepareFn


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def prepare_neptune(chain: Chain, tensors: Sequence[torch.Tensor],
                    ctx: RunContext) -> Prepared | Unsupported:
    """``nf.compile`` of the chain's program, auto schedule, no disk cache (cold). A float32
    chain with a projection uses TF32 ``tl.dot`` (``fp32_precision="tf32"``), as the
    runner lets torch use TF32 matmuls for it: both sides round alike."""
    import neptune_fusion as nf
    outputs, inputs = chain.build(dtype_name(ctx.dtype))
    rules = {"fp32_precision": "tf32"} if chain.contraction and \
        ctx.dtype == torch.float32 else {}
    kernel = nf.compile(outputs, inputs, cache=False, name=f"bench_{chain.name}", **rules)
    args = tuple(tensors)
    extra = ", fp32_precision='tf32'" if rules else ""
    return Prepared(lambda: kernel(*args), f"nf.compile(schedule='auto', cache=False{extra})")


def prepare_eager(chain: Chain, tensors: Sequence[torch.Tensor],
                  ctx: RunContext) -> Prepared | Unsupported:
    """The plain PyTorch form, run eagerly."""
    args = tuple(tensors)
    return Prepared(lambda: chain.plain(*args), "plain PyTorch, eager")


def prepare_compiled(chain: Chain, tensors: Sequence[torch.Tensor],
                     ctx: RunContext) -> Prepared | Unsupported:
    """torch.compile (Inductor, ``dynamic=False``) of the plain form, from a cold start."""
    import torch._inductor.config as inductor_config
    raise_recompile_limits()
    torch._dynamo.reset()
    inductor_config.fx_graph_cache = False
    compiled = torch.compile(chain.plain, dynamic=False)
    args = tuple(tensors)
    return Prepared(lambda: compiled(*args), "plain PyTorch, torch.compile(dynamic=False), cold")


def prepare_jit(chain: Chain, tensors: Sequence[torch.Tensor],
                ctx: RunContext) -> Prepared | Unsupported:
    """The plain form through neptune-fusion's torch.compile backend (``nf.jit``), cold:
    the chains it finds translated and compiled without the disk cache, the rest to
    Inductor (FX graph cache off)."""
    import torch._inductor.config as inductor_config

    from ...dynamo import jit
    raise_recompile_limits()
    torch._dynamo.reset()
    inductor_config.fx_graph_cache = False
    compiled = jit(chain.plain, dynamic=False)   # as the torch-compile provider
    args = tuple(tensors)
    return Prepared(lambda: compiled(*args), "plain PyTorch, torch.compile(backend="
                    "'neptune_fusion', dynamic=False), cold")


EAGER = ChainProvider("torch-eager", "torch eager", "library",
                      "the plain PyTorch chain, eager", prepare_eager)
COMPILED = ChainProvider("torch-compile", "torch.compile", "compiler",
                         "torch.compile (Inductor) of the plain PyTorch chain", prepare_compiled)
NEPTUNE = ChainProvider("neptune", "neptune-fusion", "neptune",
                        "nf.compile of the chain's program (auto schedule)", prepare_neptune)
JIT = ChainProvider("neptune-jit", "nf.jit", "compiler",
                    "the plain PyTorch chain through neptune-fusion's torch.compile backend "
                    "(opt-in)", prepare_jit)
CHAIN_PROVIDERS: tuple[ChainProvider, ...] = (EAGER, COMPILED, JIT, NEPTUNE)


def select_chain_providers(names: Sequence[str] | None) -> tuple[ChainProvider, ...]:
    """The chain providers named, in report order; all but :data:`CHAIN_OPT_IN` for
    None or empty."""
    if names:
        unknown = [n for n in names if n not in CHAIN_PROVIDER_NAMES]
        if unknown:
            raise ValueError(f"unknown chain provider(s) {', '.join(unknown)}; "
                             f"choose from {', '.join(CHAIN_PROVIDER_NAMES)}")
    wanted = set(names or [n for n in CHAIN_PROVIDER_NAMES if n not in CHAIN_OPT_IN])
    return tuple(p for p in CHAIN_PROVIDERS if p.name in wanted)
