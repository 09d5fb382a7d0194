"""Dynamic sizes: Dynamo's symbolic ints as the IR's sizes, without guards.

A graph compiled with dynamic shapes (``torch.compile(dynamic=True)``, or the second
shape of a function under ``dynamic=None``) carries ``SymInt`` extents. The translation
reads each as its sympy expression (``x.node.expr``): comparing or converting the
``SymInt`` itself would *guard* on it (specialise the graph to the example's value),
which is what dynamic shapes exist to avoid. A plain symbol ``s69`` becomes the IR size
``dyn_s69``, bound from an input's shape at call time like any size of ``nf.compile``;
an expression of symbols (``4*s25`` for a batch merged with the heads, ``s69 - 1`` for
a mask's offset) may appear inside the program -- in a merged view, as a scalar -- but
not as the extent of an axis, which must be bound by an input dimension.

Where an order is needed (pairing a view's dimensions), the example's values (the shape
environment's *hints*) choose, and the symbolic products are then checked equal.
"""

from __future__ import annotations

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


def size_name(sym) -> str:
    """The IR size of Dynamo's symbol ``sym``: ``dyn_s69`` (apart from the static sizes
    ``s<value>`` of translate.py)."""
    return f"dyn_{sym}"


def hints_of(values) -> dict:
    """The example value of every symbol (the shape environment's hints) of the first
    symbolic int found among ``values`` (tensor values or ints), or ``{}``."""
    for v in values:
        for x in (*getattr(v, "shape", ()), v):
            env = getattr(getattr(x, "node", None), "shape_env", None)
            if env is not None:   # backed_var_to_val: torch 2.13's name of var_to_val
                table = getattr(env, "backed_var_to_val", None) or env.var_to_val
                return {s: int(n) for s, n in table.items()}
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
    symbol -> IR size). Sums and products of bound symbols and integers only."""
    if static(expr):
        return expr
    if expr.is_Integer:
        return int(expr)
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
    raise Refused(f"dynamic size expression {expr} ({type(expr).__name__}) is not a sum "
                  "or product of sizes")


def same(a, b) -> bool:
    """Whether two dimensions are equal for every value of their symbols."""
    if static(a) and static(b):
        return a == b
    return sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0
