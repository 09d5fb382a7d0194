"""Attention providers: the baselines and neptune-fusion behind one interface
(:mod:`.base`).

Provider modules (and torch, Triton) are imported on demand by :func:`all_providers`, so
that a caller can set ``TRITON_INTERPRET=1`` (CPU smoke run) before any Triton kernel is
defined, and so that the command line can list the names without loading them. The
baseline kernel written for the benchmark lives here too: :mod:`.baseline_fa2`.
"""

from __future__ import annotations

PROVIDER_NAMES: tuple[str, ...] = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "flex",
                                   "triton-fa2", "torch-compile", "neptune-jit", "neptune")
OPT_IN: tuple[str, ...] = ("neptune-jit",)
"""Providers run only when named (``neptune-jit`` compiles each operator through the
torch.compile backend: seconds per operator and length)."""


def all_providers() -> tuple:
    """Every :class:`~.base.Provider`, in report order (importing their modules)."""
    from .compiled import COMPILED, JIT
    from .fa2 import FA2
    from .flex import FLEX
    from .neptune import NEPTUNE
    from .sdpa import CUDNN, EFFICIENT, FLASH
    return (FLASH, CUDNN, EFFICIENT, FLEX, FA2, COMPILED, JIT, NEPTUNE)


def select_providers(names: list[str] | None) -> tuple:
    """The providers named, in report order; all but :data:`OPT_IN` for None or an
    empty list."""
    if names:
        unknown = [n for n in names if n not in PROVIDER_NAMES]
        if unknown:
            raise ValueError(f"unknown provider(s) {', '.join(unknown)}; "
                             f"choose from {', '.join(PROVIDER_NAMES)}")
    wanted = set(names or [n for n in PROVIDER_NAMES if n not in OPT_IN])
    return tuple(p for p in all_providers() if p.name in wanted)


__all__ = ["OPT_IN", "PROVIDER_NAMES", "all_providers", "select_providers"]
