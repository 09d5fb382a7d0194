"""Tile loads through tensor descriptors (TMA on Hopper-class GPUs): ``Schedule.tma``.

A 2-d tile load ``x[..., a, b]`` whose last two indices are bare tile variables and whose
other indices are free of tile axes (attention's q, k and v; a norm's x) reads a box of
the matrix ``x[..., :, :]``: the copy engine can fetch it (``tl.make_tensor_descriptor`` in
the kernel, then ``desc.load([a0, b0])``), without a register address per element and
with the boundary handled by the hardware: elements past the descriptor's shape read 0,
which is exactly the masked load's ``other=0.0`` when the shape is the axes' extents.

The kernel gets a constexpr ``TMA`` and emits both loads, the descriptor one under
``if TMA:``; the runtime passes ``TMA=True`` only when the copy engine's rules hold for
the call (every input 16-byte aligned, every stride but the last a multiple of 16 bytes:
``runtime/kernel.py``), so an unaligned view runs the pointer loads, never a fault.
The descriptors are built once per program in the prologue (Triton writes them to a
global scratch buffer the launch allocates: ``runtime/launcher.py``).

Which loads qualify (:func:`descriptor_load`; anything else keeps ``tl.load``):
* no condition other than the tile bounds (a ``where``-masked load stays a pointer load);
* each of the two axes starts its tile at a known index (rows at ``i_first``, the loop at
  the current tile's start, a column or inner axis covered by one tile at 0);
* each box side at most 256 elements and the inner side at least 16 bytes (the copy
  engine's limits).
"""

from __future__ import annotations

from ..ir.nodes import IndexVar
from .program import I_FIRST, TILE_START, extent_expr

MAX_BOX = 256        # elements per side of one copy-engine box
MIN_INNER_BYTES = 16  # the box's contiguous side


def _start(low, ax) -> str | None:
    """The first index of ``ax``'s tile in this program, as code; None when unknown."""
    if ax.role == "row":
        got = low.env.get(I_FIRST)
    elif ax.role == "loop":
        got = low.env.get(TILE_START)
    elif ax.role in ("col", "inner") and ax.chunk is None and not ax.programs:
        return "0"   # one tile covers it (split-k programs never get here)
    else:
        return None
    return None if got is None else got.code


def _box(low, ax) -> int | None:
    s = low.prog.schedule
    return {"row": s.block_m, "loop": s.block_n}.get(ax.role, ax.block_size)


def descriptor_load(low, e, axes) -> str | None:
    """``e`` (a :class:`~neptune_fusion.ir.nodes.Load`) as ``desc.load([...])`` in the
    layout ``axes``, its descriptor bound once in the prologue; None when the schedule
    has no ``tma`` or the load does not qualify (module docstring)."""
    prog = low.prog
    if not prog.schedule.tma or prog.split is not None or len(axes) != 2 \
            or len(e.indices) < 2 or any(low.tile_roles(i) for i in e.indices[:-2]):
        return None
    dims = []
    for idx in e.indices[-2:]:
        ax = low.roles.get(idx) if isinstance(idx, IndexVar) else None
        if ax is None or ax.role == "grid" or ax.block is None:
            return None
        start, box = _start(low, ax), _box(low, ax)
        if start is None or box is None or box > MAX_BOX:
            return None
        dims.append((ax, start))
    order = tuple(ax.role for ax, _ in dims)
    if set(order) != set(axes) or order[0] == order[1] \
            or _box(low, dims[1][0]) * e.tensor.dtype.bits // 8 < MIN_INNER_BYTES:
        return None
    base, _, _ = low.address(e.tensor, e.indices)
    blk = low.hoist if low.hoist is not None else low.cur
    key = ("desc", base, order)
    desc = blk.lookup(key)
    if desc is None:
        arg = low.args[e.tensor]
        shape = ", ".join(low.value(extent_expr(ax.extent)).code for ax, _ in dims)
        stride = low.value(arg.stride(len(e.indices) - 2)).code
        boxes = ", ".join(ax.block for ax, _ in dims)
        desc = blk.names.fresh(f"{arg.name}_desc")
        with blk.nested("if TMA:") as br:
            br.emit(f"{desc} = tl.make_tensor_descriptor({base}, shape=[{shape}], "
                    f"strides=[{stride}, 1], block_shape=[{boxes}])")
        blk.remember(key, desc)
    code = f"{desc}.load([{dims[0][1]}, {dims[1][1]}])"
    return code if order == tuple(axes) else f"tl.trans({code})"
