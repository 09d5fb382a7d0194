"""A mask's derivative that the probabilities already apply: dropped.

Reverse mode gives a masked score ``s = where(c, x, -inf)`` the cotangent
``where(c, d_s, 0)``. In attention ``d_s = (d_p - delta) * p`` with ``p = exp(s - lse)``:
where ``c`` fails, ``s = -inf`` and ``p = 0``, so ``d_s`` is already 0 there and the
select is redundant. Before and after (causal)::

    d_qk[i, j] = where(j <= i, d_s[i, j], 0.0) * 0.125   ->   d_qk[i, j] = d_s[i, j] * 0.125

Kept, the kernel's masked tiles computed ``p`` twice (one ``exp2`` over the tile for
``d_k``, where the select had been folded into the exponent, one for ``d_v``) and anded
the mask with itself.

Legality (:func:`zero_unless`): ``x`` in ``where(c, x, 0)`` is a product with a factor
that is 0 wherever ``c`` fails -- ``exp(e)`` with ``e = -inf`` there: ``where(c, ., -inf)``,
less the saved ``lse`` (never ``-inf``: the caller passes ``+inf`` for a row with no key,
docs/autodiff.md), times a positive constant -- read through loads of computes; the other
factors finite (cotangents of finite inputs).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..ir.fold import is_const
from ..ir.graph import tensors_in_order
from ..ir.nodes import (
    Binary,
    Cast,
    Compute,
    Const,
    Expr,
    Load,
    Placeholder,
    Tensor,
    Unary,
    Where,
    fresh_uid,
)
from ..ir.traverse import rewrite, substitute

INF = float("inf")


def _inlined(e: Load) -> Expr | None:
    t = e.tensor
    if not isinstance(t, Compute):
        return None
    return substitute(t.body, dict(zip(t.axes, e.indices)))


def _seen_through(e: Expr) -> Expr | None:
    """What a float cast or a load of a compute stands for (the value ``e`` has), else
    None: both predicates below look through them."""
    if isinstance(e, Cast) and e.dtype.is_float:
        return e.x
    return _inlined(e) if isinstance(e, Load) else None


def neg_inf_unless(e: Expr, c: Expr, lse: Placeholder) -> bool:
    """Whether ``e`` is ``-inf`` wherever ``c`` is false."""
    if isinstance(e, Where):
        return e.cond == c and isinstance(e.b, Const) and e.b.value == -INF
    inner = _seen_through(e)
    if inner is not None:
        return neg_inf_unless(inner, c, lse)
    if isinstance(e, Binary) and e.op == "sub":
        return (isinstance(e.b, Load) and e.b.tensor is lse
                and neg_inf_unless(e.a, c, lse))
    if isinstance(e, Binary) and e.op == "mul":
        return (isinstance(e.b, Const) and e.b.value > 0 and neg_inf_unless(e.a, c, lse))
    return False


def zero_unless(e: Expr, c: Expr, lse: Placeholder) -> bool:
    """Whether ``e`` is 0 wherever ``c`` is false (module docstring)."""
    if isinstance(e, Unary) and e.op == "exp":
        return neg_inf_unless(e.x, c, lse)
    inner = _seen_through(e)
    if inner is not None:
        return zero_unless(inner, c, lse)
    if isinstance(e, Binary) and e.op == "mul":
        return zero_unless(e.a, c, lse) or zero_unless(e.b, c, lse)
    return False


def drop_implied_masks(outputs: Sequence[Compute], lse: Placeholder) -> list[Compute]:
    """``outputs`` with every ``where(c, x, 0)`` whose ``x`` is already 0 where ``c``
    fails replaced by ``x`` (module docstring); the computes rebuilt only where changed."""
    new: dict[Tensor, Tensor] = {}

    def step(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.tensor in new and new[e.tensor] is not e.tensor:
            return Load(new[e.tensor], e.indices)
        if isinstance(e, Where) and is_const(e.b, 0.0) and zero_unless(e.a, e.cond, lse):
            return e.a
        return None
    for t in tensors_in_order(list(outputs)):
        if isinstance(t, Compute):
            body = rewrite(t.body, step)
            new[t] = t if body is t.body else Compute(t.name, t.shape, t.axes, body,
                                                      fresh_uid())
    return [new[o] for o in outputs]
