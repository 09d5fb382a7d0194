"""The per-op lowering table: IR operators -> Triton expressions.

Each entry is a format string over the (already lowered, parenthesised as needed)
operands and the precedence of the result, so the emitter prints ``a * (b + c)`` and
never ``a * b + c``. Python's precedence, low to high: comparisons < ``|`` < ``&`` <
``+ -`` < ``* / // %`` < unary ``- ~`` < atoms (names, calls, subscripts).

Operators that need more than a format string (``tanh`` with its CUDA fast path,
``pow``) are handled by the lowerer; see :mod:`neptune_fusion.codegen.exprs`.
``tests/test_op_tables.py`` checks that every op of the IR is in one of these tables.
"""

from __future__ import annotations

import math

from ..ir.dtypes import DType

CMP, OR, AND, ADD, MUL, UNARY, ATOM = 1, 2, 3, 4, 5, 6, 9

# op -> (template, result precedence, minimum precedence of each operand)
TL_UNARY: dict[str, tuple[str, int, int]] = {
    "neg": ("-{0}", UNARY, UNARY),
    "not": ("~{0}", UNARY, UNARY),
    "exp": ("tl.exp({0})", ATOM, 0),
    "exp2": ("tl.exp2({0})", ATOM, 0),
    "log": ("tl.log({0})", ATOM, 0),
    "log2": ("tl.log2({0})", ATOM, 0),
    "sqrt": ("tl.sqrt({0})", ATOM, 0),
    "rsqrt": ("tl.rsqrt({0})", ATOM, 0),
    "abs": ("tl.abs({0})", ATOM, 0),
    "sigmoid": ("tl.sigmoid({0})", ATOM, 0),
    "erf": ("tl.math.erf({0})", ATOM, 0),
}

# op -> (template, result precedence, left operand min precedence, right operand min)
TL_BINARY: dict[str, tuple[str, int, int, int]] = {
    "add": ("{0} + {1}", ADD, ADD, ADD),
    "sub": ("{0} - {1}", ADD, ADD, ADD + 1),
    "mul": ("{0} * {1}", MUL, MUL, MUL),
    "div": ("{0} / {1}", MUL, MUL, MUL + 1),
    # integer index arithmetic: Triton's // and % truncate toward zero, the IR's floor
    # (Python's rule); the two agree for a nonnegative value over a positive constant
    # (h // group), else the lowerer corrects the truncated result (Lowerer.floored)
    "floordiv": ("{0} // {1}", MUL, MUL, MUL + 1),
    "mod": ("{0} % {1}", MUL, MUL, MUL + 1),
    "maximum": ("tl.maximum({0}, {1})", ATOM, 0, 0),
    "minimum": ("tl.minimum({0}, {1})", ATOM, 0, 0),
    "lt": ("{0} < {1}", CMP, CMP + 1, CMP + 1),
    "le": ("{0} <= {1}", CMP, CMP + 1, CMP + 1),
    "gt": ("{0} > {1}", CMP, CMP + 1, CMP + 1),
    "ge": ("{0} >= {1}", CMP, CMP + 1, CMP + 1),
    "eq": ("{0} == {1}", CMP, CMP + 1, CMP + 1),
    "ne": ("{0} != {1}", CMP, CMP + 1, CMP + 1),
    "and": ("{0} & {1}", AND, AND, AND + 1),
    "or": ("{0} | {1}", OR, OR, OR + 1),
}

# NaN propagates through a float maximum or minimum and through a max or min reduction,
# as in PyTorch (relu(nan) = nan, amax of a row holding NaN = nan) and the reference
# interpreter (np.maximum): Triton's tl.maximum/tl.minimum default to PropagateNan.NONE
# and tl.max/tl.min drop NaN too (they return the other operand). One helper per op, the
# elementwise one doubling as the reductions' combine, so this is the one place to change
# (or to switch per path); integers keep TL_BINARY's entries. A module defines the helpers
# it calls (:func:`nan_helpers`: codegen/source.py, codegen/gluon.py); a call costs
# nothing on the GPU (Triton inlines it) and each op is one instruction there
# (``max.NaN.f32``), as tl.maximum's is. ``triton.language`` is spelled in full: a Gluon
# module binds ``tl`` to Gluon's language, which has no PropagateNan. Under the
# interpreter a custom combine runs element by element (the kernels ran 4x slower), so
# there a reduction is NumPy's (which drops NaN) made NaN where the row holds one.
TL_FLOAT_BINARY: dict[str, tuple[str, int, int, int]] = {
    "maximum": ("_nf_maximum({0}, {1})", ATOM, 0, 0),
    "minimum": ("_nf_minimum({0}, {1})", ATOM, 0, 0),
}
NAN_HELPERS: dict[str, tuple[str, ...]] = {
    f"_nf_{op}imum": (
        "@triton.jit",
        f"def _nf_{op}imum(a, b):",
        f"    return tl.{op}imum(a, b, propagate_nan=triton.language.PropagateNan.ALL)",
    ) for op in ("max", "min")
} | {
    f"_nf_{op}": (
        "@triton.jit",
        f"def _nf_{op}(x, axis: tl.constexpr, INTERPRET: tl.constexpr):",
        "    if INTERPRET:  # NumPy's reduction, which drops NaN; NaN where a row holds one",
        "        nans = tl.sum(tl.where(x == x, 0.0, 1.0), axis)",
        f"        return tl.where(nans > 0.0, float(\"nan\"), tl.{op}(x, axis))",
        f"    return tl.reduce(x, axis, _nf_{op}imum)",
    ) for op in ("max", "min")
}


def nan_helpers(body: str, decorator: str = "@triton.jit") -> list[str]:
    """The definitions of the :data:`NAN_HELPERS` that ``body`` (kernel source) calls,
    a reduction's combine with it, each followed by two blank lines; ``decorator``
    replaces ``@triton.jit`` (Gluon's ``@gluon.jit``)."""
    used = {n for n in NAN_HELPERS if f"{n}(" in body}
    used |= {n + "imum" for n in used if n in ("_nf_max", "_nf_min")}
    return [decorator if line == "@triton.jit" else line
            for n in NAN_HELPERS if n in used for line in (*NAN_HELPERS[n], "", "")]


# lowered by methods of the Lowerer, not by a template: tanh (its CUDA fast path) and
# pow (constant exponents only)
LOWERED_BY_METHOD = frozenset({"tanh", "pow"})

REDUCE_OPS = {"sum": "tl.sum", "max": "_nf_max", "min": "_nf_min", "prod": "_nf_prod"}
# reducers of the IR that have no tile lowering: lowering one raises a CodegenError
NOT_LOWERED: frozenset = frozenset()
# Triton has no product reduction: a module that uses one defines it (codegen/source.py)
PROD_HELPERS = (
    "@triton.jit",
    "def _nf_mul(a, b):",
    "    return a * b",
    "",
    "",
    "@triton.jit",
    "def _nf_prod(x, axis: tl.constexpr):",
    "    return tl.reduce(x, axis, _nf_mul)",
)

# tanh(x) = 1 - 2 / (exp(2x) + 1): exact at +-inf, absolute error ~1e-7 near 0
TANH_PORTABLE = "1.0 - 2.0 / (tl.exp2({0} * " + repr(2.0 / math.log(2.0)) + ") + 1.0)"
TANH_PTX = ('tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [{0}], '
            "dtype=tl.float32, is_pure=True, pack=1)")

_TL_DTYPE = {"float16": "tl.float16", "bfloat16": "tl.bfloat16", "float32": "tl.float32",
             "float64": "tl.float64", "int32": "tl.int32", "int64": "tl.int64",
             "bool": "tl.int1"}
KIND = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64",
        "int32": "i32", "int64": "i64", "bool": "bool"}
KIND_TL = {"f16": "tl.float16", "bf16": "tl.bfloat16", "f32": "tl.float32",
           "f64": "tl.float64", "i32": "tl.int32", "i64": "tl.int64", "bool": "tl.int1"}


def tl_dtype(d: DType) -> str:
    return _TL_DTYPE[d.name]


def literal(value) -> tuple[str, int]:
    """A Python literal for a constant, and its precedence."""
    if isinstance(value, bool):
        return ("True" if value else "False"), ATOM
    if isinstance(value, int):
        return str(value), (UNARY if value < 0 else ATOM)
    if math.isinf(value):
        return ('float("inf")' if value > 0 else 'float("-inf")'), ATOM
    if math.isnan(value):
        return 'float("nan")', ATOM
    text = repr(float(value))
    return text, (UNARY if value < 0 else ATOM)


def wrap(code: str, prec: int, least: int) -> str:
    """``code`` in parentheses when its precedence is below ``least``."""
    return f"({code})" if prec < least else code
