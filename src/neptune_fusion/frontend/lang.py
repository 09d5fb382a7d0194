"""The tensor-expression language users write operators in.

Example (attention scores, the way they are written on paper; the rest of attention is in
:func:`neptune_fusion.frontend.examples.plain_attention`)::

    N, M, D = nf.sizes("N M D")
    q = nf.placeholder((N, D), "float16", name="q")
    k = nf.placeholder((M, D), "float16", name="k")
    d = nf.reduce_axis(D, "d")
    s = nf.compute((N, M), lambda i, j: nf.sum(q[i, d] * k[j, d], d) * scale)
"""

from __future__ import annotations

import inspect
import numbers

from ..errors import AxisError, ExprError, ShapeError
from ..ir import build
from ..ir.dtypes import as_dtype
from ..ir.nodes import Compute, Expr, Extent, IndexVar, Placeholder, Size, fresh_uid

_DEFAULT_AXIS_NAMES = "ijklmnopqrstuvwxyzabcdefgh"


def size(name: str) -> Size:
    """A symbolic size, bound from the shapes of the inputs at evaluation or call time."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ShapeError(f"size name {name!r} must be an identifier such as 'N'")
    return Size(name)


def sizes(names: str) -> tuple[Size, ...]:
    """Several symbolic sizes from a space-separated string: ``N, D = nf.sizes("N D")``."""
    return tuple(size(n) for n in names.split())


def _check_extent(e, what: str) -> Extent:
    if isinstance(e, Size):
        return e
    if isinstance(e, numbers.Integral) and not isinstance(e, bool):
        if e < 0:
            raise ShapeError(f"{what} is {e}; extents must be >= 0")
        return int(e)
    raise ShapeError(f"{what} is {e!r}; use an int or a size from nf.size('N')")


def _check_shape(shape, what: str) -> tuple[Extent, ...]:
    if isinstance(shape, (numbers.Integral, Size)):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        raise ShapeError(f"shape of {what} must be a tuple of extents, got {shape!r}")
    return tuple(_check_extent(s, f"dimension {d} of {what}") for d, s in enumerate(shape))


def placeholder(shape, dtype="float32", name: str | None = None) -> Placeholder:
    """An input tensor of the given shape (ints or symbolic sizes) and dtype."""
    uid = fresh_uid()
    name = name if name is not None else f"in{uid}"
    return Placeholder(name, _check_shape(shape, f"placeholder {name!r}"),
                       as_dtype(dtype, f"dtype of placeholder {name!r}"), uid)


def reduce_axis(extent, name: str | None = None) -> IndexVar:
    """A reduction axis ranging over ``[0, extent)``."""
    uid = fresh_uid()
    name = name if name is not None else f"r{uid}"
    return IndexVar(name, _check_extent(extent, f"extent of reduce axis {name!r}"),
                    "reduce", uid)


def _axis_names(fcompute, ndim: int, tname: str) -> list[str]:
    try:
        params = list(inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature
        params = []
    if any(p.kind == p.VAR_POSITIONAL for p in params) or not params:
        return [_DEFAULT_AXIS_NAMES[d % 26] + ("" if d < 26 else str(d)) for d in range(ndim)]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                  and p.default is p.empty]
    if len(positional) != ndim:
        raise ShapeError(
            f"compute {tname!r} has {ndim} dimension(s) but its function takes "
            f"{len(positional)} index argument(s)")
    return [p.name for p in positional]


def _check_bound(body: Expr, axes: tuple[IndexVar, ...], name: str) -> None:
    # The verifier would catch this too, but as an internal VerificationError.
    for v in sorted(body.free_vars - frozenset(axes), key=lambda v: v.name):
        if v.kind == "reduce":
            raise AxisError(
                f"compute {name!r} uses reduce axis {v.name!r} outside any reduction over "
                f"it: wrap that part in nf.sum(..., {v.name}) (or max, min, prod)")
        raise AxisError(
            f"compute {name!r} uses axis {v.name!r} of another compute; index with the "
            "arguments of this compute's own function")


def compute(shape, fcompute, name: str | None = None, dtype=None) -> Compute:
    """A tensor whose element at index ``(i, j, ...)`` is ``fcompute(i, j, ...)``.

    ``dtype`` casts the result (default: the expression's own dtype).
    """
    uid = fresh_uid()
    name = name if name is not None else f"t{uid}"
    shp = _check_shape(shape, f"compute {name!r}")
    if not callable(fcompute):
        raise ExprError(f"compute {name!r}: fcompute must be a function of the indices")
    axes = tuple(IndexVar(n, e, "spatial", fresh_uid())
                 for n, e in zip(_axis_names(fcompute, len(shp), name), shp))
    body = fcompute(*axes)
    try:
        body = build.as_expr(body)
    except ExprError as err:
        raise ExprError(f"compute {name!r}: {err}") from None
    if dtype is not None:
        body = build.cast(body, dtype)
    _check_bound(body, axes, name)
    t = Compute(name, shp, axes, body, uid)
    from ..ir.verify import verify
    verify(t)
    return t


# ----------------------------------------------------------------- reductions


def sum(expr, axis) -> Expr:  # noqa: A001 - the natural name
    """Sum of ``expr`` over ``axis`` (a reduce axis or a tuple of them)."""
    return build.reduce("sum", expr, axis)


def max(expr, axis) -> Expr:  # noqa: A001
    """Maximum of ``expr`` over ``axis``."""
    return build.reduce("max", expr, axis)


def min(expr, axis) -> Expr:  # noqa: A001
    """Minimum of ``expr`` over ``axis``."""
    return build.reduce("min", expr, axis)


def prod(expr, axis) -> Expr:
    """Product of ``expr`` over ``axis``."""
    return build.reduce("prod", expr, axis)


# ----------------------------------------------------------------- elementwise


def exp(x) -> Expr:
    """``e ** x``."""
    return build.unary("exp", x)


def exp2(x) -> Expr:
    """``2 ** x``."""
    return build.unary("exp2", x)


def log(x) -> Expr:
    """Natural logarithm."""
    return build.unary("log", x)


def log2(x) -> Expr:
    """Base-2 logarithm."""
    return build.unary("log2", x)


def sqrt(x) -> Expr:
    """Square root."""
    return build.unary("sqrt", x)


def rsqrt(x) -> Expr:
    """``1 / sqrt(x)``."""
    return build.unary("rsqrt", x)


def tanh(x) -> Expr:
    """Hyperbolic tangent."""
    return build.unary("tanh", x)


def sigmoid(x) -> Expr:
    """``1 / (1 + exp(-x))``."""
    return build.unary("sigmoid", x)


def erf(x) -> Expr:
    """The error function (exact GELU: ``x / 2 * (1 + erf(x / sqrt(2)))``)."""
    return build.unary("erf", x)


def abs(x) -> Expr:  # noqa: A001
    """Absolute value."""
    return build.unary("abs", x)


def maximum(a, b) -> Expr:
    """Elementwise maximum of two expressions."""
    return build.binary("maximum", a, b)


def minimum(a, b) -> Expr:
    """Elementwise minimum of two expressions."""
    return build.binary("minimum", a, b)


def where(cond, a, b) -> Expr:
    """``a`` where the boolean ``cond`` holds, else ``b``."""
    return build.where(cond, a, b)


def cast(x, dtype) -> Expr:
    """``x`` converted to ``dtype``."""
    return build.cast(x, dtype)


def const(value, dtype=None) -> Expr:
    """A constant of the given dtype (default: float32 for floats, int64 for ints)."""
    return build.const(value, dtype)
