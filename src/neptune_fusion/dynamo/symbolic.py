"""Dynamic sizes: Dynamo's symbolic ints as the IR's sizes, without guards.

A graph compiled with dynamic shapes (``torch.compile(dynamic=True)``, or the second
shape of a function under ``dynamic=None``) carries ``SymInt`` extents. The translation
reads each as its sympy expression (``x.node.expr``): comparing or converting the
``SymInt`` itself would *guard* on it (specialise the graph to the example's value),
which is what dynamic shapes exist to avoid. A plain symbol ``s69`` becomes the IR size
``dyn_s69``, bound from an input's shape at call time like any size of ``nf.compile``;
an expression of symbols (``4*s25`` for a batch merged with the heads, ``s69 - 1`` for
a mask's offset) may appear inside the program -- in a merged view, as a scalar. An
axis's extent must be bound by an input dimension: a symbol, or an expression that is
itself an input's dimension (a group norm's ``(N, G, C/G*H*W)`` view taken outside the
kernel has ``4*s0*s1`` as its last dimension). Such an expression gets a size of its own
(``dyn_4_x_s0_x_s1``), bound from that input like a symbol; the values at a call agree
with its symbols' because both come from the same tensors' shapes.

Where an order is needed (pairing a view's dimensions), the example's values (the shape
environment's *hints*) choose, and the symbolic products are then checked equal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import sympy

from .refused import Refused


def dim(x):
    """An extent or scalar of a graph as an int or a sympy expression (never guards)."""
    if isinstance(x, int):
        return x
    expr = getattr(getattr(x, "node", None), "expr", None)
    if expr is None:
        raise Refused(f"size {x!r} is neither an int nor a symbolic int")
    return int(expr) if expr.is_Integer else expr


def shape_of(val) -> tuple:
    """A tensor value's shape as :func:`dim` s."""
    return tuple(dim(n) for n in val.shape)


def static(d) -> bool:
    return isinstance(d, int)


def is_scalar_value(val) -> bool:
    """Whether a graph value is a (symbolic) int rather than a tensor: a ``SymInt``
    placeholder of a dynamic graph, or arithmetic on one (``s69 - 1``)."""
    return isinstance(val, int) or type(val).__name__ == "SymInt"


def is_float_scalar(val) -> bool:
    """Whether a graph value is a 0-d float64 tensor: a Python float of a dynamic graph
    (Dynamo passes a ``SymFloat`` argument -- a scale, a shift -- as one, and computes on
    it in float64 before casting it to the tensor's dtype). Kernels compute in float32 at
    most, so such values and their casts run with the rest; the kernel reads the cast
    result, a 0-d tensor, at each call (partition.why_not_fusible)."""
    import torch
    return isinstance(val, torch.Tensor) and val.dim() == 0 and val.dtype == torch.float64


_SPELL = (("**", "_pow_"), ("*", "_x_"), ("+", "_p_"), ("-", "_m_"), ("/", "_d_"))


def size_name(sym) -> str:
    """The IR size of Dynamo's symbol ``sym``: ``dyn_s69`` (apart from the static sizes
    ``s<value>`` of translate.py); of an expression an input's dimension is, its
    operators spelled out: ``4*s0*s1`` -> ``dyn_4_x_s0_x_s1``."""
    name = str(sym).replace(" ", "")
    for op, word in _SPELL:
        name = name.replace(op, word)
    return "dyn_" + re.sub(r"\W", "_", name)


def unbound_scalars(inputs) -> list:
    """The symbolic-int inputs of a region whose value no tensor input's shape gives (a
    symbol that is no tensor input's dimension: a static cache's decode position, a
    sliding window's first key ``Max(0, s - w + 1)``). The kernel cannot compute those
    from its sizes, so each is passed as a 0-d int64 tensor (translate.py, rewrite.py)."""
    bound = set()
    for n in inputs:
        v = n.meta.get("val")
        if not is_scalar_value(v):
            bound.update(d for d in shape_of(v) if not static(d) and d.is_Symbol)
    return [n for n in inputs if is_scalar_value(v := n.meta.get("val"))
            and not static(dim(v)) and not dim(v).free_symbols <= bound]


def arg_shape(node) -> tuple:
    """The shape of a region input as passed to its kernel: a tensor's, or ``()`` for a
    symbolic int (passed as a 0-d tensor when passed at all)."""
    v = node.meta["val"]
    return () if is_scalar_value(v) else shape_of(v)


def hints_of(values) -> dict:
    """The example value of every symbol (the shape environment's hints) of the first
    symbolic int found among ``values`` (tensor values or ints), or ``{}``."""
    for v in values:
        for x in (*getattr(v, "shape", ()), v):
            env = getattr(getattr(x, "node", None), "shape_env", None)
            if env is not None:   # backed_var_to_val: torch 2.13's name of var_to_val
                table = getattr(env, "backed_var_to_val", None) or env.var_to_val
                # a Python float's symbol (``zf69``) is no size
                return {s: int(n) for s, n in table.items() if not n.is_Float}
    return {}


def hint(d, hints: Mapping) -> int:
    """The example value of a dimension."""
    if static(d):
        return d
    try:
        return int(d.xreplace({s: sympy.Integer(hints[s]) for s in d.free_symbols}))
    except KeyError as err:
        raise Refused(f"size {d} has no example value") from err


def to_ir(expr, sizes: Mapping):
    """A sympy expression of symbols as an IR expression of their sizes (``sizes``:
    symbol, or expression an input's dimension is -> IR size): sums, products, maxima
    and minima of bound symbols and integers (a sliding window's first key
    ``Max(0, s - w + 1)``)."""
    if static(expr):
        return expr
    if expr.is_Integer:
        return int(expr)
    if expr in sizes:   # a symbol, or an expression an input's dimension binds
        return sizes[expr]
    if expr.is_Symbol:
        if expr not in sizes:
            raise Refused(f"dynamic size {expr} is no input's dimension, so no call "
                          "can bind it")
        return sizes[expr]
    if expr.is_Add or expr.is_Mul:
        parts = [to_ir(a, sizes) for a in expr.args]
        out = parts[0]
        for p in parts[1:]:
            out = out + p if expr.is_Add else out * p
        return out
    kind = type(expr).__name__   # sympy's Max/Min or torch's own (torch.utils._sympy)
    if kind in ("Max", "Min"):
        from ..ir import build  # the IR's own elementwise max/min of int values
        op = "maximum" if kind == "Max" else "minimum"
        parts = [to_ir(a, sizes) for a in expr.args]
        out = parts[0]
        for p in parts[1:]:
            out = build.binary(op, out, p)
        return out
    raise Refused(f"dynamic size expression {expr} ({type(expr).__name__}) is not a sum, "
                  "product, maximum or minimum of sizes")


def same(a, b) -> bool:
    """Whether two dimensions are equal for every value of their symbols."""
    if static(a) and static(b):
        return a == b
    return sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0
