"""Smart constructors: every node users build goes through here and is checked.

Python scalars are *weakly typed*: ``x * 0.5`` keeps the dtype of ``x``.
"""

from __future__ import annotations

import math
import numbers

from ..errors import AxisError, DTypeError, ExprError, IndexBoundsError, ShapeError
from .dtypes import DType, as_dtype, bool_, float32, int64
from .nodes import (
    ARITH_OPS,
    CMP_OPS,
    LOGIC_OPS,
    REDUCE_OPS,
    UNARY_OPS,
    Binary,
    Cast,
    Const,
    Expr,
    IndexVar,
    Load,
    Reduce,
    Size,
    Tensor,
    Unary,
    Where,
)

_FLOAT_ONLY = {"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "sigmoid", "erf"}


def const(value, dtype=None) -> Const:
    """A constant; the dtype defaults from the Python type (float -> float32)."""
    if isinstance(value, Const):
        return value if dtype is None else Const(value.value, as_dtype(dtype))
    if dtype is None:
        if isinstance(value, bool):
            dtype = bool_
        elif isinstance(value, numbers.Integral):
            dtype = int64
        elif isinstance(value, numbers.Real):
            dtype = float32
        else:
            raise ExprError(f"cannot make a constant of {value!r} ({type(value).__name__})")
    d = as_dtype(dtype)
    if d.is_float:
        return Const(float(value), d)
    if d.is_int:
        if isinstance(value, float) and not float(value).is_integer():
            raise ExprError(f"constant {value!r} is not an integer but dtype is {d}")
        return Const(int(value), d)
    return Const(bool(value), d)


def as_expr(value, like: DType | None = None) -> Expr:
    """Wrap a Python scalar as a constant, weakly typed against ``like``."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, Tensor):
        raise ExprError(
            f"tensor {value.name!r} used as a scalar: index it, e.g. {value.name}[i, ...]")
    if isinstance(value, bool):
        return Const(value, bool_)
    if isinstance(value, numbers.Integral):
        if like is not None and (like.is_float or like.is_int):
            return const(value, like)
        return Const(int(value), int64)
    if isinstance(value, numbers.Real):
        if like is not None and like.is_float:
            return Const(float(value), like)
        return Const(float(value), float32)
    raise ExprError(f"{value!r} ({type(value).__name__}) is not a scalar expression")


def _operands(a, b) -> tuple[Expr, Expr]:
    if isinstance(a, Expr) and not isinstance(b, Expr):
        return a, as_expr(b, a.dtype)
    if isinstance(b, Expr) and not isinstance(a, Expr):
        return as_expr(a, b.dtype), b
    return as_expr(a), as_expr(b)


_FOLD = {
    "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
    "maximum": max, "minimum": min,
}


def binary(op: str, a, b) -> Expr:
    """``a op b`` with operand checks; constant arithmetic is folded."""
    assert op in ARITH_OPS or op in CMP_OPS or op in LOGIC_OPS, op
    a, b = _operands(a, b)
    if op in LOGIC_OPS:
        for x in (a, b):
            if not x.dtype.is_bool:
                raise DTypeError(
                    f"'{op}' needs boolean operands (comparisons), got {x} of dtype {x.dtype}")
    elif op in ARITH_OPS:
        for x in (a, b):
            if x.dtype.is_bool:
                raise DTypeError(
                    f"arithmetic '{op}' on the boolean {x}: use nf.where(cond, a, b) "
                    "or nf.cast(cond, dtype)")
        if op in ("floordiv", "mod") and not (a.dtype.is_int and b.dtype.is_int):
            raise DTypeError(f"'{op}' needs integer operands, got {a.dtype} and {b.dtype}")
    if (op in _FOLD and isinstance(a, Const) and isinstance(b, Const)
            and a.dtype == b.dtype):
        return const(_FOLD[op](a.value, b.value), a.dtype)
    return Binary(op, a, b)


def unary(op: str, x) -> Expr:
    """``op(x)``; transcendental functions of integers compute in float32."""
    assert op in UNARY_OPS, op
    x = as_expr(x)
    if op == "not":
        if not x.dtype.is_bool:
            raise DTypeError(f"'~' needs a boolean operand, got {x} of dtype {x.dtype}")
    elif x.dtype.is_bool:
        raise DTypeError(f"'{op}' of the boolean {x}: cast it first with nf.cast")
    elif op in _FLOAT_ONLY and not x.dtype.is_float:
        x = Cast(x, float32)
    if op == "neg" and isinstance(x, Const):
        return const(-x.value, x.dtype)
    return Unary(op, x)


def power(x, exponent) -> Expr:
    """``x ** exponent`` for a constant exponent."""
    x = as_expr(x)
    if isinstance(exponent, Expr) and not isinstance(exponent, Const):
        raise ExprError(
            f"exponent {exponent} of {x} must be a constant number; "
            "use nf.exp(y * nf.log(x)) for a variable exponent")
    e = exponent.value if isinstance(exponent, Const) else exponent
    if not isinstance(e, numbers.Real) or isinstance(e, bool) or not math.isfinite(e):
        raise ExprError(f"exponent of {x} must be a finite number, got {exponent!r}")
    if float(e).is_integer():
        e = int(e)
    if x.dtype.is_bool:
        raise DTypeError(f"'**' of the boolean {x}: cast it first with nf.cast")
    if x.dtype.is_int and isinstance(e, int) and e < 0:
        raise DTypeError(
            f"{x} ** {e}: an integer to a negative power is not an integer; "
            "cast the base to a float dtype first with nf.cast")
    return Binary("pow", x, const(e, x.dtype if x.dtype.is_float else
                                  (int64 if isinstance(e, int) else float32)))


def where(cond, a, b) -> Expr:
    """``a`` where ``cond`` holds, else ``b``."""
    cond = as_expr(cond)
    if not cond.dtype.is_bool:
        raise ExprError(
            f"nf.where condition must be boolean (a comparison), got {cond} of dtype "
            f"{cond.dtype}")
    a, b = _operands(a, b)
    return Where(cond, a, b)


def cast(x, dtype) -> Expr:
    """``x`` converted to ``dtype`` (float to int truncates toward zero)."""
    x = as_expr(x)
    d = as_dtype(dtype)
    return x if x.dtype == d else Cast(x, d)


def _extent_str(e) -> str:
    return str(e)


def _check_index(tensor: Tensor, dim: int, idx: Expr) -> None:
    extent = tensor.shape[dim]
    where_ = f"index {dim} of tensor {tensor.name!r}"
    if not idx.dtype.is_int:
        raise DTypeError(f"{where_} is {idx} of dtype {idx.dtype}; indices must be integers")
    # Only bare variables and constants are checked: an arithmetic index such as i - 1
    # may be guarded by an nf.where, which the reference honours.
    if isinstance(idx, Const):
        if idx.value < 0 or (isinstance(extent, int) and idx.value >= extent):
            raise IndexBoundsError(
                f"{where_} is the constant {idx.value}, outside the extent "
                f"{_extent_str(extent)}")
    elif isinstance(idx, IndexVar):
        ve = idx.extent
        if isinstance(ve, int) and isinstance(extent, int) and ve > extent:
            raise IndexBoundsError(
                f"{where_}: axis {idx.name!r} ranges over {ve} values but the dimension "
                f"has extent {extent}")
        if isinstance(ve, Size) and isinstance(extent, Size) and ve is not extent:
            raise ShapeError(
                f"{where_}: axis {idx.name!r} has extent {ve.name} but the dimension has "
                f"extent {extent.name}; mismatched extents")


def load(tensor: Tensor, idx) -> Load:
    """``tensor[idx...]`` with one integer index per dimension."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    if len(idx) != tensor.ndim:
        raise ShapeError(
            f"tensor {tensor.name!r} has {tensor.ndim} dimension(s) "
            f"[{', '.join(map(str, tensor.shape))}] but was indexed with {len(idx)} "
            f"index(es)")
    exprs = []
    for d, i in enumerate(idx):
        if isinstance(i, slice):
            raise ShapeError(
                f"index {d} of tensor {tensor.name!r} is a slice; index with variables "
                "from nf.compute or nf.reduce_axis")
        e = as_expr(i, int64)
        _check_index(tensor, d, e)
        exprs.append(e)
    return Load(tensor, tuple(exprs))


def reduce(op: str, body, axis) -> Reduce:
    """``op`` of ``body`` over ``axis`` (one reduce axis or a tuple of them)."""
    assert op in REDUCE_OPS, op
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    if not axes:
        raise AxisError(f"nf.{op} needs at least one reduce axis")
    for a in axes:
        if not isinstance(a, IndexVar) or a.kind != "reduce":
            what = f"the {a.kind} axis {a.name!r}" if isinstance(a, IndexVar) else repr(a)
            raise AxisError(
                f"nf.{op} reduces over {what}, which is not a reduce axis; "
                "make one with nf.reduce_axis(extent)")
    if len(set(axes)) != len(axes):
        raise AxisError(f"nf.{op} lists axis {axes[0].name!r} twice")
    body = as_expr(body)
    if body.dtype.is_bool:
        raise DTypeError(f"nf.{op} of the boolean {body}: cast it first with nf.cast")
    for a in axes:
        if a not in body.free_vars:
            raise AxisError(
                f"nf.{op} reduces over axis {a.name!r} but its body {body} does not use "
                f"{a.name!r}")
    return Reduce(op, body, tuple(axes))
