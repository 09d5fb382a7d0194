"""A load's indices solved for the loaded tensor's coordinates.

The forward reads ``t[idx(axes)]``; the backward must write, for each element ``x`` of
``t``, the sum of the cotangents of every read of ``x``. With ``x`` as the new compute's
axes that is a gather again when each index is invertible:

* an axis ``v`` of the same extent as the dimension: ``v := x_d``;
* ``v // G`` (grouped-query attention's key/value head, ``h // group``) with ``v``'s
  extent ``G`` times the dimension's: ``v := x_d * G + g``, ``g`` a new summed axis of
  extent ``G`` (the group's gradients summed into the shared head).

Every other variable of the cotangent is summed. Anything else (a constant index, an axis
used twice, a shifted index) raises :class:`~neptune_fusion.errors.DerivativeError`
naming the tensor and the index.
"""

from __future__ import annotations

from ..errors import DerivativeError
from ..ir.nodes import Binary, Const, Expr, IndexVar, Load, Size, fresh_uid


def same_extent(a, b) -> bool:
    if isinstance(a, Size) or isinstance(b, Size):
        return a is b
    return a == b


def invert(load: Load, xs: tuple[IndexVar, ...]) -> tuple[dict[Expr, Expr], list[IndexVar]]:
    """``(mapping, summed)``: the substitution putting the forward's variables in terms of
    ``xs`` (the loaded tensor's coordinates) and the new axes it introduced."""
    t = load.tensor
    mapping: dict[Expr, Expr] = {}
    summed: list[IndexVar] = []
    for d, (idx, x) in enumerate(zip(load.indices, xs)):
        extent = t.shape[d]
        if isinstance(idx, IndexVar) and idx not in mapping:
            if not same_extent(idx.extent, extent):
                raise DerivativeError(
                    f"cannot derive the gradient of {t.name!r}: index {d} is the axis "
                    f"{idx.name!r} of extent {idx.extent}, but the dimension has extent "
                    f"{extent}")
            mapping[idx] = x
            continue
        if isinstance(idx, Binary) and idx.op == "floordiv" and isinstance(idx.a, IndexVar) \
                and isinstance(idx.b, Const) and idx.a not in mapping \
                and isinstance(idx.a.extent, int) and isinstance(extent, int) \
                and idx.a.extent == idx.b.value * extent:
            g = IndexVar(idx.a.name + "g", int(idx.b.value), "reduce", fresh_uid())
            mapping[idx.a] = x * int(idx.b.value) + g
            summed.append(g)
            continue
        raise DerivativeError(
            f"cannot derive the gradient of {t.name!r}: index {d} of {load} is {idx}, "
            "which is not an axis of the dimension's extent nor axis // group (an axis "
            "used twice, a constant or a shifted index has no gather-form adjoint yet)")
    return mapping, summed
