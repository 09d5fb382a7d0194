"""neptune-fusion: plain reduction chains in, fused single-pass kernels out.

Write an operator the way it reads on paper (``max``, ``exp``, ``sum``, ``matmul``,
``divide``); neptune-fusion finds the reductions that read each other's final values,
derives and proves the repair that lets them run in one pass, and evaluates or compiles
the fused form.
"""

from __future__ import annotations

from ._version import __version__
from .api import evaluate, plan
from .errors import (AxisError, DTypeError, ExprError, FeedError, FusionError,
                     IndexBoundsError, NeptuneError, ShapeError, SizeBindingError,
                     VerificationError)
from .frontend.lang import (abs, cast, compute, const, exp, exp2, log, log2, max, maximum,
                            min, minimum, placeholder, prod, reduce_axis, rsqrt, sigmoid,
                            size, sizes, sqrt, sum, tanh, where)
from .ir.dtypes import DType, bfloat16, bool_, float16, float32, float64, int32, int64
from .ir.nodes import Compute, Expr, IndexVar, Placeholder, Size, Tensor
from .ir.printer import program_str as show
from .ir.verify import verify

_LAZY = {"FusionPlan", "FusedGroup", "Member", "Unfused"}


def __getattr__(name: str):
    # the plan types live with SymPy-backed code; import it only when asked for
    if name in _LAZY:
        from .fusion import plan as _plan_mod
        return getattr(_plan_mod, name)
    raise AttributeError(f"module 'neptune_fusion' has no attribute {name!r}")


__all__ = [
    "__version__", "evaluate", "verify", "show", "plan",
    "FusionPlan", "FusedGroup", "Member", "Unfused",
    "placeholder", "compute", "reduce_axis", "size", "sizes",
    "sum", "max", "min", "prod",
    "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "sigmoid", "abs",
    "maximum", "minimum", "where", "cast", "const",
    "DType", "float16", "bfloat16", "float32", "float64", "int32", "int64", "bool_",
    "Expr", "Tensor", "Placeholder", "Compute", "IndexVar", "Size",
    "NeptuneError", "DTypeError", "ExprError", "ShapeError", "IndexBoundsError",
    "AxisError", "FeedError", "SizeBindingError", "VerificationError", "FusionError",
]
