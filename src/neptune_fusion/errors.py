"""The error hierarchy. Every user-facing error is a :class:`NeptuneError`.

Messages name the offending tensor, axis, size or parameter and say what to fix.
"""

from __future__ import annotations


class NeptuneError(Exception):
    """Base class of every error neptune-fusion raises on bad input."""


class DTypeError(NeptuneError, TypeError):
    """An unknown dtype, or an operation on operands of an unsupported dtype."""


class ExprError(NeptuneError, TypeError):
    """An expression built wrongly: a non-constant exponent, a non-boolean condition, ..."""


class ShapeError(NeptuneError, ValueError):
    """Wrong number of indices, mismatched extents, or a bad shape."""


class IndexBoundsError(ShapeError):
    """An index that is statically known to leave a tensor's declared extent."""


class AxisError(NeptuneError, ValueError):
    """A reduction axis that is misused (not a reduce axis, unused by its body, ...)."""


class FeedError(NeptuneError, ValueError):
    """A missing, unknown, or ill-shaped input given to an evaluator or kernel."""


class SizeBindingError(FeedError):
    """A symbolic size bound to two different values."""


class VerificationError(NeptuneError):
    """The IR is not well formed (a bug in a transform or an invalid hand-built node)."""


class FusionError(NeptuneError):
    """A chain of reductions that cannot be fused the way that was required."""


class ScheduleError(NeptuneError, ValueError):
    """A schedule that breaks one of its invariants (block sizes, warps, stages, ...)."""


class CodegenError(NeptuneError):
    """A plan the code generator cannot lower to a kernel; the message names the reason."""


class UnschedulableError(ScheduleError, CodegenError):
    """A schedule's strategy the plan does not allow (rolling for a chain that is not one
    fused loop, split-k for a running-sum producer). Both a schedule and a codegen error."""


class DerivativeError(NeptuneError):
    """A gradient that cannot be derived (an index with no gather-form adjoint, an output
    the backward does not support); raised when the backward is built, naming why."""


class DistributedError(NeptuneError, ValueError):
    """Ranks of a process group that disagree (shapes, dtypes, overlapping shards), or a
    bad argument of :mod:`neptune_fusion.distributed`; every rank raises it alike."""
