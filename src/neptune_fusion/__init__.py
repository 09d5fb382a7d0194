"""neptune-fusion: plain reduction chains in, fused single-pass kernels out.

Write an operator the way it reads on paper (``max``, ``exp``, ``sum``, ``matmul``,
``divide``); neptune-fusion finds the reductions that read each other's final values,
derives and proves the repair that lets them run in one pass, and evaluates or compiles
the fused form.
"""

from __future__ import annotations

from ._version import __version__
from .api import evaluate, plan
from .errors import (
    AxisError,
    CodegenError,
    DerivativeError,
    DTypeError,
    ExprError,
    FeedError,
    FusionError,
    IndexBoundsError,
    NeptuneError,
    ScheduleError,
    ShapeError,
    SizeBindingError,
    UnschedulableError,
    VerificationError,
)
from .frontend.lang import (
    abs,
    cast,
    compute,
    const,
    erf,
    exp,
    exp2,
    log,
    log2,
    max,
    maximum,
    min,
    minimum,
    placeholder,
    prod,
    reduce_axis,
    rsqrt,
    sigmoid,
    size,
    sizes,
    sqrt,
    sum,
    tanh,
    where,
)
from .ir.dtypes import DType, bfloat16, bool_, float16, float32, float64, int32, int64
from .ir.nodes import Compute, Expr, IndexVar, Placeholder, Size, Tensor
from .ir.printer import program_str as show
from .ir.verify import verify

# Names whose modules pull in SymPy, Triton or torch: imported on first use, so that
# `import neptune_fusion` stays fast.
_LAZY = {
    "FusionPlan": "fusion.plan", "FusedGroup": "fusion.plan", "Member": "fusion.plan",
    "Unfused": "fusion.plan", "compile": "runtime.pipeline", "Kernel": "runtime.kernel",
    "attention": "frontend.attention", "AttentionCache": "frontend.attention",
    "Schedule": "schedule", "DiskCache": "runtime.disk_cache", "AutoKernel": "runtime.auto",
    "merge_partials": "runtime.merge", "Partial": "runtime.merge",
    "StagedKernel": "runtime.staged", "prepare_attention": "frontend.prepared",
    "PreparedAttention": "frontend.prepared", "gradients": "autodiff.reverse",
    "jit": "dynamo",   # the torch.compile backend (docs/jit.md)
    "SlowKernelWarning": "runtime.tune",   # docs/scheduling.md
}


def __getattr__(name: str):
    import importlib
    if name == "ops":
        return importlib.import_module(".ops", __name__)
    where = _LAZY.get(name)
    if where is not None:
        return getattr(importlib.import_module(f".{where}", __name__), name)
    raise AttributeError(f"module 'neptune_fusion' has no attribute {name!r}")


__all__ = [
    "__version__", "evaluate", "verify", "show", "plan",
    "FusionPlan", "FusedGroup", "Member", "Unfused",
    "compile", "Kernel", "AutoKernel", "StagedKernel", "DiskCache", "attention", "AttentionCache",
    "prepare_attention", "PreparedAttention", "gradients",
    "Schedule", "ops", "jit",
    "merge_partials", "Partial",
    "placeholder", "compute", "reduce_axis", "size", "sizes",
    "sum", "max", "min", "prod",
    "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "abs",
    "maximum", "minimum", "where", "cast", "const",
    "DType", "float16", "bfloat16", "float32", "float64", "int32", "int64", "bool_",
    "Expr", "Tensor", "Placeholder", "Compute", "IndexVar", "Size",
    "NeptuneError", "DTypeError", "ExprError", "ShapeError", "IndexBoundsError",
    "AxisError", "FeedError", "SizeBindingError", "VerificationError", "FusionError",
    "ScheduleError", "CodegenError", "UnschedulableError", "DerivativeError",
    "SlowKernelWarning",
]
