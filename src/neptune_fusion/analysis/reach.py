"""Index ranges checked at the call: an axis that indexes a dimension bare (``w[j]``)
must not range past it.

``nf.compute`` checks a bare index variable against its dimension when both extents are
numbers, and refuses two different symbolic sizes (:func:`~neptune_fusion.ir.build.load`).
Where one side is symbolic -- a buffer of 4 entries read as ``w[j]`` over the key axis
``M``, or an axis of 8 over a dimension ``N`` -- the sizes are known only at the call. A
kernel there would read past the tensor (the reference gives NaN). :func:`reaches` lists
those pairs once per operator; :func:`check_reaches` compares them when a call binds its
sizes (once per input signature), raising a :class:`~neptune_fusion.FeedError` that names
the tensor, the dimension and the axis.

A load that is the taken branch of ``where(cond, w[j], 0.0)`` with ``j`` in ``cond``
is left out: the kernels load it under ``cond`` (a masked load) and the guard is the
program's. An arithmetic index (``i - 1``, ``h // group``) is not checked here either,
as :func:`~neptune_fusion.ir.build.load` documents.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import FeedError
from ..ir.graph import tensors_in_order
from ..ir.nodes import Compute, Const, Expr, IndexVar, Load, Size, Where


@dataclass(frozen=True)
class Reach:
    """Axis ``axis`` indexes dimension ``dim`` of tensor ``tensor`` (extent ``extent``)."""

    axis: IndexVar
    tensor: str
    dim: int
    extent: object   # int or Size


def reaches(outputs) -> tuple[Reach, ...]:
    """The bare indices of the program under ``outputs`` whose range and dimension are not
    both numbers (nor the same size)."""
    found: dict = {}
    for t in tensors_in_order(list(outputs)):
        if not isinstance(t, Compute):
            continue
        seen: set = set()
        stack: list[tuple[Expr, bool]] = [(t.body, False)]
        while stack:
            e, masked = stack.pop()
            if (id(e), masked) in seen:
                continue
            seen.add((id(e), masked))
            if isinstance(e, Load):
                for d, idx in enumerate(e.indices):
                    if isinstance(idx, IndexVar) and not masked:
                        _note(found, idx, e.tensor, d)
                stack.extend((i, False) for i in e.indices)
            elif isinstance(e, Where):
                stack.extend(((e.cond, False), (e.a, _masked(e)), (e.b, False)))
            else:
                stack.extend((c, False) for c in e.children())
    return tuple(found.values())


def _masked(e: Where) -> bool:
    """Whether ``e`` is ``where(cond, x[..., j, ...], 0.0)`` with ``j`` in ``cond``: the
    kernels load ``x`` under ``cond`` (codegen.tiles.masked_load takes at least these)."""
    return isinstance(e.a, Load) and isinstance(e.b, Const) and e.b.value == 0 and \
        e.dtype.is_float and bool(e.cond.free_vars & set(e.a.indices))


def _note(found: dict, axis: IndexVar, tensor, dim: int) -> None:
    extent = tensor.shape[dim]
    if axis.extent is extent or not (isinstance(axis.extent, Size) or isinstance(extent, Size)):
        return
    found.setdefault((axis, tensor.name, dim), Reach(axis, tensor.name, dim, extent))


def check_reaches(name: str, found: tuple[Reach, ...], sizes: dict) -> None:
    """Every reach of operator ``name`` under ``sizes`` (each size's name to its value)."""
    for r in found:
        n, m = (sizes.get(x.name) if isinstance(x, Size) else x
                for x in (r.axis.extent, r.extent))
        if isinstance(n, int) and isinstance(m, int) and n > m:
            over = f"{r.axis.extent.name} = {n}" if isinstance(r.axis.extent, Size) else n
            raise FeedError(
                f"{name}: tensor {r.tensor!r} has {m} entries along dimension {r.dim}, but "
                f"axis {r.axis.name!r} reads it over {over} values at this call (it would "
                f"read past the tensor); pass a {r.tensor!r} with at least {n} entries there")
