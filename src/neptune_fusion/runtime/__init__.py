"""Kernels on torch tensors: ``compile`` a plain operator into a :class:`Kernel`.

See :mod:`neptune_fusion.runtime.pipeline` (the stages, ``compile``),
:mod:`neptune_fusion.runtime.kernel` (launching) and docs/codegen.md.
"""

from __future__ import annotations

from .kernel import GeneratedKernel, Kernel, LaunchResult
from .pipeline import compile  # noqa: A004

__all__ = ["compile", "Kernel", "GeneratedKernel", "LaunchResult"]
