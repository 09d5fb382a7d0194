"""The float64 NumPy interpreter of expressions: the living specification.

Arrays are *right-aligned* over a context of index variables: inside ``f(i, j)`` evaluated
in context ``(j, i)`` an array has axis 0 for ``j`` and axis 1 for ``i``; a subexpression
that does not use ``j`` is a 1-d array over ``i`` and broadcasts. A reduction prepends its
axes to the context and reduces them away again.

Semantics worth knowing:
* every float computes in float64; casts to float dtypes do not round;
* a load whose (arithmetic) index leaves the tensor reads NaN, so an unguarded
  out-of-range read poisons the result instead of silently wrapping;
* an empty reduction yields the reducer's identity.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import FeedError
from ..ir.nodes import (
    Binary,
    Cast,
    Compute,
    Const,
    Expr,
    IndexVar,
    Load,
    Param,
    Reduce,
    Size,
    Tensor,
    Unary,
    Where,
)
from ..ir.reducers import reducer

# The NumPy function of every elementwise op of the IR (tests/test_op_tables.py checks
# that each op has a row; reductions are in neptune_fusion.ir.reducers).
UNARY = {
    "neg": np.negative, "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2,
    "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x), "tanh": np.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "abs": np.abs, "not": np.logical_not,
    "erf": np.vectorize(math.erf, otypes=[np.float64]),
}
BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "floordiv": np.floor_divide, "mod": np.mod, "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum,
    "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
    "eq": np.equal, "ne": np.not_equal, "and": np.logical_and, "or": np.logical_or,
}


def numeric(dtype, ftype: type = np.float64) -> type:
    """The NumPy type the reference computes a dtype in (floats: ``ftype``)."""
    if dtype.is_float:
        return ftype
    return np.int64 if dtype.is_int else np.bool_


def position(ctx: tuple[IndexVar, ...], v: IndexVar) -> int:
    """Index of ``v`` in ``ctx`` by identity (``==`` on expressions builds comparisons)."""
    for p, u in enumerate(ctx):
        if u is v:
            return p
    raise KeyError(f"index variable {v.name} is not bound here")


def reduce_array(op: str, arr: np.ndarray, axis: tuple[int, ...]) -> np.ndarray:
    """Reduce with the reducer's identity for empty extents (NumPy knows those of
    ``add`` and ``multiply``; ``maximum`` and ``minimum`` have none, so it is given)."""
    r = reducer(op)
    if r.ufunc.identity is None:
        return r.ufunc.reduce(arr, axis=axis, initial=r.identity)
    return r.ufunc.reduce(arr, axis=axis)


class Interpreter:
    """Evaluates expressions over the index space of their free variables.

    ``arrays`` caches tensor values (inputs are given; computes are materialised on first
    use); ``sizes`` binds symbolic sizes; ``params`` binds :class:`Param` leaves to arrays
    aligned like any other value; ``ranges`` overrides the values an index variable takes
    (the fused reference uses it to evaluate one tile of a reduction axis). ``ftype`` is the
    float type of the arithmetic (float64, or float32 to study the stability of a plan).
    """

    def __init__(self, arrays: dict[Tensor, np.ndarray], sizes: dict[Size, int],
                 params: dict[Param, np.ndarray] | None = None,
                 ranges: dict[IndexVar, np.ndarray] | None = None,
                 ftype: type = np.float64):
        self.ftype = ftype
        self.arrays = arrays
        self.sizes = sizes
        self.params = params or {}
        self.ranges = ranges or {}
        self._memo: dict[tuple, np.ndarray] = {}

    # -- helpers -------------------------------------------------------------------
    def extent(self, e) -> int:
        return e if isinstance(e, int) else self.size(e)

    def size(self, s: Size) -> int:
        """The value of symbolic size ``s``, bound from the shapes of the inputs."""
        got = self.sizes.get(s)
        if got is None:
            raise FeedError(
                f"size {s.name} is not bound: no input the outputs read has a dimension "
                f"of size {s.name}; use a concrete extent or add such an input")
        return got

    def values(self, v: IndexVar) -> np.ndarray:
        r = self.ranges.get(v)
        return r if r is not None else np.arange(self.extent(v.extent), dtype=np.int64)

    def tensor(self, t: Tensor) -> np.ndarray:
        """The full value of tensor ``t`` (a compute is evaluated once and cached)."""
        arr = self.arrays.get(t)
        if arr is None:
            assert isinstance(t, Compute), f"no value for input {t.name}"
            base = self if not (self.ranges or self.params) else \
                Interpreter(self.arrays, self.sizes, ftype=self.ftype)
            shape = tuple(self.extent(s) for s in t.shape)
            val = base.eval(t.body, tuple(t.axes))
            arr = np.array(np.broadcast_to(val, shape), dtype=numeric(t.dtype, self.ftype))
            self.arrays[t] = arr
        return arr

    # -- evaluation ----------------------------------------------------------------
    def eval(self, e: Expr, ctx: tuple[IndexVar, ...]) -> np.ndarray:
        """Value of ``e`` right-aligned over ``ctx`` (which must bind its free variables)."""
        start = len(ctx)
        for v in e.free_vars:
            start = min(start, position(ctx, v))
        sub = ctx[start:]
        key = (e, sub)
        got = self._memo.get(key)
        if got is None:
            with np.errstate(all="ignore"):
                got = self._eval(e, sub)
            self._memo[key] = got
        return got

    def _eval(self, e: Expr, ctx: tuple[IndexVar, ...]) -> np.ndarray:
        if isinstance(e, Const):
            return np.asarray(e.value, dtype=numeric(e.dtype, self.ftype))
        if isinstance(e, IndexVar):
            p = position(ctx, e)
            vals = self.values(e)
            return vals.reshape((len(vals),) + (1,) * (len(ctx) - p - 1))
        if isinstance(e, Size):
            return np.asarray(self.size(e), dtype=np.int64)
        if isinstance(e, Param):
            return self.params[e]
        if isinstance(e, Load):
            return self._load(e, ctx)
        if isinstance(e, Unary):
            return UNARY[e.op](self.eval(e.x, ctx))
        if isinstance(e, Binary):
            a, b = self.eval(e.a, ctx), self.eval(e.b, ctx)
            if e.op == "div":
                a, b = a.astype(self.ftype), b.astype(self.ftype)
            return BINARY[e.op](a, b)
        if isinstance(e, Where):
            return np.where(self.eval(e.cond, ctx), self.eval(e.a, ctx), self.eval(e.b, ctx))
        if isinstance(e, Cast):
            x = self.eval(e.x, ctx)
            if e.dtype.is_float:
                return x.astype(self.ftype)
            if e.dtype.is_int:
                return np.trunc(x).astype(np.int64) if x.dtype.kind == "f" else \
                    x.astype(np.int64)
            return x != 0
        if isinstance(e, Reduce):
            inner = tuple(e.axes) + ctx
            body = self.eval(e.body, inner)
            body = body.reshape((1,) * (len(inner) - body.ndim) + body.shape)
            k = len(e.axes)
            full = tuple(len(self.values(a)) for a in e.axes) + body.shape[k:]
            body = np.broadcast_to(body, full)
            return reduce_array(e.op, body, tuple(range(k)))
        raise TypeError(f"cannot evaluate {type(e).__name__}")  # pragma: no cover

    def _load(self, e: Load, ctx) -> np.ndarray:
        arr = self.tensor(e.tensor)
        idx = [self.eval(i, ctx).astype(np.int64) for i in e.indices]
        idx = np.broadcast_arrays(*idx) if idx else []
        bad = None
        clipped = []
        for d, ix in enumerate(idx):
            n = arr.shape[d]
            out = (ix < 0) | (ix >= n)
            if out.any():
                bad = out if bad is None else (bad | out)
                ix = np.clip(ix, 0, max(n - 1, 0))
            clipped.append(ix)
        if arr.size == 0:   # nothing to read: every index is out of range
            shape = np.broadcast_shapes(*(i.shape for i in clipped)) if clipped else ()
            return np.full(shape, np.nan if arr.dtype.kind == "f" else 0, dtype=arr.dtype)
        val = arr[tuple(clipped)] if clipped else arr[()]
        if bad is not None:
            val = np.where(bad, np.nan if val.dtype.kind == "f" else 0, val)
        return val
