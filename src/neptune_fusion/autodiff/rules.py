"""The derivative of every elementwise op and the adjoint of every reducer: rule tables.

Each row of :data:`UNARY` maps ``(x, y, g)`` -- the operand, the node's value and the
cotangent arriving at the node -- to the operand's cotangent. Each row of :data:`BINARY`
maps ``(a, b, y, g)`` to the pair of operand cotangents. ``None`` means "no gradient"
(boolean and integer results: comparisons, logic, index arithmetic). A Where passes the
cotangent to the branch taken; a float Cast passes it through. Each row's comment is the
identity it applies.

:data:`REDUCE` maps ``(body, node, g)`` -- a reduction's body (its axes free), the
reduction itself and its cotangent -- to the body's cotangent (the axes free again: the
caller sums them where the body's loads do not name them). A softmax's max and sum are
never differentiated in attention: the saved log-sum-exp replaces both (:mod:`.softmax`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..ir import build
from ..ir.nodes import Expr

LN2 = math.log(2.0)
TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _exp(x) -> Expr:
    return build.unary("exp", x)


def _where(cond, a, b) -> Expr:
    return build.where(cond, a, b)


UNARY: dict[str, Callable | None] = {
    "neg": lambda x, y, g: -g,                          # d(-x) = -dx
    "exp": lambda x, y, g: g * y,                       # d exp(x) = exp(x) dx
    "exp2": lambda x, y, g: g * y * LN2,                # d 2^x = ln2 2^x dx
    "log": lambda x, y, g: g / x,                       # d log(x) = dx / x
    "log2": lambda x, y, g: g / (x * LN2),              # d log2(x) = dx / (x ln2)
    "sqrt": lambda x, y, g: g * 0.5 / y,                # d sqrt(x) = dx / (2 sqrt(x))
    "rsqrt": lambda x, y, g: g * -0.5 * y / x,          # d x^-1/2 = -x^-3/2 / 2 dx
    "tanh": lambda x, y, g: g * (1.0 - y * y),          # d tanh(x) = (1 - tanh^2) dx
    "sigmoid": lambda x, y, g: g * y * (1.0 - y),       # d sig(x) = sig (1 - sig) dx
    "erf": lambda x, y, g: g * TWO_OVER_SQRT_PI * _exp(-(x * x)),   # d erf = 2/sqrt(pi) e^-x^2
    "abs": lambda x, y, g: _where(x < 0, -g, g),        # d |x| = sign(x) dx (sign(0) = 1)
    "not": None,                                        # boolean: no gradient
}


def _pow(a, b, y, g):
    # d a^c = c a^(c-1) da  (the exponent is a constant: nf's ``**`` takes only those)
    c = b.value
    return (g * c * a ** (c - 1) if c != 1 else g), None


BINARY: dict[str, Callable | None] = {
    "add": lambda a, b, y, g: (g, g),                               # d(a+b) = da + db
    "sub": lambda a, b, y, g: (g, -g),                              # d(a-b) = da - db
    "mul": lambda a, b, y, g: (g * b, g * a),                       # d(ab) = b da + a db
    "div": lambda a, b, y, g: (g / b, -(g * y) / b),                # d(a/b) = da/b - a/b db/b
    "pow": _pow,
    # ties go to the first operand, as in the forward's choice
    "maximum": lambda a, b, y, g: (_where(a >= b, g, 0.0), _where(a >= b, 0.0, g)),
    "minimum": lambda a, b, y, g: (_where(a <= b, g, 0.0), _where(a <= b, 0.0, g)),
    "floordiv": None, "mod": None,                                  # integer: no gradient
    "lt": None, "le": None, "gt": None, "ge": None, "eq": None, "ne": None,
    "and": None, "or": None,
}


def _extremum(body, node, g):
    # d max_j x_j = [x_j == max] dx_j  (the indicator of the arg-extremum; ties share)
    return _where(body == node, g, 0.0)


REDUCE: dict[str, Callable] = {
    "sum": lambda body, node, g: g,                     # d sum_j x_j = sum_j dx_j
    "max": _extremum,
    "min": _extremum,
    "prod": lambda body, node, g: g * node / body,      # d prod = prod / x_j dx_j (x_j != 0)
}
