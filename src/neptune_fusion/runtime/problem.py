"""A kernel at a shape, as the cost model sees it (:class:`~..schedule.space.Problem`)."""

from __future__ import annotations

import math

from ..codegen.program import TileProgram, extent_value
from ..ir.nodes import Size


def problem_of(prog: TileProgram, inputs, tensors, sizes: dict, splittable: bool = True,
               visits: bool = True):
    """The :class:`Problem` of tile program ``prog`` on ``tensors`` (bound ``sizes``).

    Rows, loop length, programs (the grid), contraction and output widths come from the
    program's axes; the streamed bytes are those of the inputs with a dimension of the
    loop axis's extent (k and v), so shared key/value heads count once. With ``visits``,
    the share of loop tiles the loop partition visits per tile shape, from the program's
    own loop bounds (a few ms; only the auto-scheduler's ranking needs it). A program whose
    row and loop tiles feed no ``tl.dot`` is a row reduction (``contraction`` false): the
    bytes of its inputs and outputs are what it reads and writes once, plus what it reads
    again when no tile covers the row (``reread_bytes``: a later phase, an epilogue that
    loads). ``lengths``: :func:`data_lengths` (a ragged KV cache's batch).
    """
    from ..codegen.lower import dot_roles
    from ..codegen.patterns import gathers
    from ..codegen.visits import visited_fraction
    from ..ir.nodes import Load
    from ..ir.traverse import walk
    from ..schedule.space import Problem, tile_shapes
    loop_ext = prog.loop.extent
    streamed = 0
    sizes_of_streamed = []   # (bytes, element size) of each streamed input
    along = 0     # bytes of the inputs with a dimension of the loop axis's extent
    for p, t in zip(inputs, tensors):
        if any(d is loop_ext or (isinstance(d, int) and d == loop_ext) for d in p.shape):
            along += t.numel() * t.element_size()
        if any(d is loop_ext for d in p.shape):
            streamed += t.numel() * t.element_size()
            sizes_of_streamed.append((t.numel() * t.element_size(), t.element_size()))
    # what the kernel reads again after the first loop unless one tile covers the row
    loads_after = any(isinstance(x, Load) for o in prog.outputs for x in walk(o.body))
    rereads = prog.phases - 1 + int(loads_after)
    # the element size of what the loop streams most of (k, v): a small float32 side
    # buffer such as ALiBi slopes, or a float32 row vector streamed beside fp16 tiles (the
    # backward's log-sum-exp), must not make fp16 attention look like fp32 to the model
    itemsize = max(sizes_of_streamed)[1] if sizes_of_streamed else max(
        [t.element_size() for t in tensors if t.is_floating_point()] or [2])
    rows = extent_value(prog.row.extent, sizes)
    contraction = bool(dot_roles(prog) & {"row", "loop"})
    out_bytes = sum(math.prod(extent_value(d, sizes) for d in o.arg.tensor.shape)
                    * o.arg.tensor.dtype.bits // 8 for o in prog.outputs)
    return Problem(
        rows=rows, loop=extent_value(loop_ext, sizes),
        programs=math.prod(extent_value(a.extent, sizes) for a in prog.grid),
        # several inner axes are several dots (the backward: q.k over c, d_o.v over e),
        # each streaming its own tile: their widths add up
        inner=sum(extent_value(a.extent, sizes) for a in prog.inner) if prog.inner else 1,
        col=extent_value(prog.col.extent, sizes) if prog.col is not None else 1,
        itemsize=itemsize, streamed=streamed if isinstance(loop_ext, Size) else 0,
        splittable=splittable, fp32=itemsize >= 4, contraction=contraction,
        tensor_bytes=sum(t.numel() * t.element_size() for t in tensors) + out_bytes,
        visits=tuple((bm, bn, visited_fraction(prog, sizes, bm, bn))
                     for bm, bn in tile_shapes(rows)) if visits and contraction else (),
        reread_bytes=0 if contraction else rereads * along,
        lengths=data_lengths(prog, sizes), gathers=gathers(prog),
        col_states=max(1, sum("col" in s.roles for s in prog.state)),
        col_chunk=(prog.col.chunk or 0) if prog.col is not None else 0)


def data_lengths(prog: TileProgram, sizes: dict) -> int:
    """How many instances read their own loop bound from device data: the product of
    the grid axes that a tensor load in a loop bound is indexed by (``kv_lens[b]``: B);
    0 when no bound reads a tensor per instance (static lengths, or one value for all)."""
    from ..ir.nodes import IndexVar, Load
    from ..ir.traverse import walk
    grid = {a.var: a for a in prog.grid}
    axes = {}
    for _, e in prog.bounds:
        for x in walk(e):
            if isinstance(x, Load):
                for i in x.indices:
                    for v in walk(i):
                        if isinstance(v, IndexVar) and v in grid:
                            axes[v] = grid[v]
    return math.prod(extent_value(a.extent, sizes) for a in axes.values()) if axes else 0
