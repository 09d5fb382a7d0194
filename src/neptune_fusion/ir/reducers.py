"""Every reducer of the IR, defined once: the table each backend reads.

One frozen :class:`Reducer` row per ``op`` of ``Reduce(op, body, axes)``:

* ``identity``: the value of an empty reduction, where every state starts;
* ``combine``: the IR binary op that merges two partial results (the kernels' per-tile
  update and split-k combine); ``ufunc`` (NumPy: the reference interpreter, the fused
  reference) and ``torch`` (``merge_partials``) are the same operation on arrays;
  ``formula`` is its readable form in a plan's update rules;
* ``safe``: a consumer reads this producer's running value through a guard: the
  identity, where it is infinite (the ``-inf`` of an empty or fully masked ``max``, the
  ``+inf`` of a ``min``), as 0, every other value as it is. ``exp(s - (-inf))`` would
  poison the consumer with NaN before its first real element: this is FlashAttention's
  guard for fully masked rows, derived. The other infinity and NaN pass: a ``+inf``
  maximum gives ``exp(x - inf) = 0`` and ``exp(inf - inf) = NaN``, as the reference and
  PyTorch do. A row that *ends* at the identity was read at 0 where the reference reads
  the identity: :func:`settled_expr` is the test for the one more repair it needs (the
  code generator's ``codegen/settle.py``, the fused reference's ``GroupRunner.settle``).
  ``sum`` and ``prod`` start at finite identities and read their running values as they
  are (a running mean of ``-inf`` gives ``(-inf - -inf)^2 = NaN`` in a variance, as the
  reference does);
* ``running``: how a producer's *running* value (what a consumer reads inside the fused
  loop) follows from its state over ``seen`` of the axis's ``n`` elements: ``"state"``
  (a running max is the max so far) or ``"extrapolated"`` (a running sum is scaled to
  the whole axis, ``state * n / seen``, so the consumers of a mean are centred on the
  running mean: Welford-like updates, stable in float32). The repair makes the result
  exact for any running value; the rule only decides the rounding.

The last two rules are built below once for IR (the kernels) and once for arrays (NumPy
and torch share the functions they need). ``tests/test_op_tables.py`` checks that every
reducer of the IR has a row and every backend can evaluate each row's ``combine``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from .dtypes import float32, int64
from .nodes import Binary, Cast, Const, Expr, Where

STATE = "state"                 # the running value is the state itself
EXTRAPOLATED = "extrapolated"   # the state scaled to the whole axis: state * n / seen


@dataclass(frozen=True, slots=True)
class Reducer:
    """One reducer (see module docstring)."""

    name: str
    identity: float
    combine: str        # IR binary op: combine(a, b)
    ufunc: np.ufunc     # the same on NumPy arrays (ufunc.reduce reduces an axis)
    torch: str          # the same as a torch function name
    formula: str        # readable combine over ``{a}`` and ``{b}``
    safe: bool          # consumers read the (infinite) identity as 0
    running: str        # STATE | EXTRAPOLATED


INF = math.inf
REDUCERS = MappingProxyType({r.name: r for r in (
    #       name    ident IR op      NumPy        torch      readable         safe   running
    Reducer("sum",  0.0,  "add",     np.add,      "add",     "{a} + {b}",     False, EXTRAPOLATED),
    Reducer("max",  -INF, "maximum", np.maximum,  "maximum", "max({a}, {b})", True,  STATE),
    Reducer("min",  INF,  "minimum", np.minimum,  "minimum", "min({a}, {b})", True,  STATE),
    Reducer("prod", 1.0,  "mul",     np.multiply, "mul",     "{a} * {b}",     False, STATE),
)})


def reducer(op: str) -> Reducer:
    """The row of reducer ``op``."""
    got = REDUCERS.get(op)
    if got is None:
        raise KeyError(f"no reducer {op!r}; the reducers are {', '.join(REDUCERS)}")
    return got


def combined_with(op: str, method: str | None) -> str:
    """The reducer that combines the state components of a member reducing with ``op``
    whose repair uses ``method`` (``None``: a plain member). The inversion method keeps the
    member's own reducer (its repair is proved to distribute over it); the augmented state
    is a vector repaired linearly, so its components add."""
    return op if method in (None, "inversion") else "sum"


# ------------------------------------------------------------- the rules, for IR


def safe_expr(op: str, x: Expr) -> Expr:
    """How a consumer reads running value ``x`` of an ``op`` producer, in IR: 0 where
    ``x`` is the reducer's infinite identity, else ``x`` (NaN and the other infinity
    included). One comparison and one select per row, as the old ``|x| < inf`` test."""
    if not reducer(op).safe:
        return x
    return Where(settled_expr(op, x), Const(0.0, float32), x)


def settled_expr(op: str, x: Expr) -> Expr | None:
    """Whether final value ``x`` of an ``op`` producer is the identity its consumers read
    as 0 (:func:`safe_expr`): ``x == identity``; None for a reducer without the guard.
    Where it holds over a nonempty axis, a consumer's state, built at 0, must be repaired
    to the identity itself to give what the reference gives (``sum_j exp(x_j - m)`` of
    a row of ``-inf``: ``0 * exp(0 - (-inf)) = NaN``, not 0)."""
    if not reducer(op).safe:
        return None
    return Binary("eq", x, Const(reducer(op).identity, float32))


def running_expr(op: str, value: Expr, seen: Expr, n: Expr, started: bool = False) -> Expr:
    """The running value of an ``op`` producer whose state ``value`` covers ``seen`` of
    ``n`` elements (integer IR); before any element (``seen = 0``) it is the state itself.
    ``started``: ``seen > 0`` is known, so no select is needed."""
    if reducer(op).running == STATE:
        return value
    scaled = Binary("mul", value, Binary("div", Cast(n, float32), Cast(seen, float32)))
    return scaled if started else Where(Binary("gt", seen, Const(0, int64)), scaled, value)


# ---------------------------------------------------------- the rules, for arrays


def safe_array(op: str, x, xp):
    """:func:`safe_expr` on an array; ``xp`` is ``numpy`` or ``torch``."""
    if not reducer(op).safe:
        return x
    return xp.where(x == reducer(op).identity, xp.zeros((), dtype=x.dtype), x)


def settled_array(op: str, x):
    """:func:`settled_expr` on an array (NumPy or torch): ``x == identity``, or None."""
    if not reducer(op).safe:
        return None
    return x == reducer(op).identity


def running_array(op: str, value, seen: int, n: int):
    """:func:`running_expr` on an array (NumPy or torch) with known counts; with nothing
    or everything seen, the state itself."""
    if reducer(op).running == EXTRAPOLATED and 0 < seen < n:
        return value * (n / seen)
    return value


__all__ = ["EXTRAPOLATED", "REDUCERS", "STATE", "Reducer", "combined_with", "reducer",
           "running_array", "running_expr", "safe_array", "safe_expr",
           "settled_array", "settled_expr"]
