"""Kernels on torch tensors: ``compile`` a plain operator into a :class:`Kernel`.

See :mod:`neptune_fusion.runtime.kernel` and docs/codegen.md.
"""

from __future__ import annotations

from .kernel import GeneratedKernel, Kernel, Launch, compile  # noqa: A004

__all__ = ["compile", "Kernel", "GeneratedKernel", "Launch"]
