"""The loop partition evaluated on the host: how many tiles each program visits.

It evaluates the very loop bounds the kernel computes (:attr:`TileProgram.bounds`, the
same IR the emitter prints) for every program of a launch, so tests can compare the
kernel's own count (``Schedule(count_visits=True)``) with the partition, and both with a
brute-force count of the tiles the mask leaves non-empty.
"""

from __future__ import annotations

from ..analysis.masks import DataDependentBound, evaluate
from ..ir.nodes import Expr, IndexVar, Size
from .program import BLOCK_N, I_FIRST, I_LAST, TileProgram, extent_value


def _row_block_tiles(prog: TileProgram, sizes: dict, bm: int, bn: int, pid_row: int,
                     rest: int, extents: list[int]) -> tuple[int, int]:
    """``(masked, interior)`` tiles row block ``pid_row`` of grid point ``rest`` visits
    with tiles ``bm`` x ``bn`` (the bounds are IR in ``I_FIRST``, ``I_LAST``, ``BLOCK_N``)."""
    rows = extent_value(prog.row.extent, sizes)
    first = pid_row * bm
    env: dict[Expr, int] = {I_FIRST: first, I_LAST: min(first + bm, rows) - 1, BLOCK_N: bn}
    env.update(sizes)
    for a, e in zip(prog.grid, extents):  # innermost first, as the kernel
        env[a.var] = rest % e
        rest //= e
    b = evaluate(dict(prog.bounds), env)
    masked = interior = 0
    for seg in prog.segments:
        n = len(range(b[seg.lo], b[seg.hi], bn))
        if seg.masked:
            masked += n
        else:
            interior += n
    return masked, interior


def tile_visits(prog: TileProgram, sizes: dict[Size, int]) -> list[tuple[int, int]]:
    """``(masked, interior)`` tiles visited by each program, in the kernel's order
    (``pid_row * programs(1) + pid_grid``)."""
    bm, bn = prog.schedule.block_m, prog.schedule.block_n
    rows = extent_value(prog.row.extent, sizes)
    extents = [extent_value(a.extent, sizes) for a in prog.grid]
    total = 1
    for e in extents:
        total *= e
    return [_row_block_tiles(prog, sizes, bm, bn, pid_row, pid_grid, extents)
            for pid_row in range(-(-rows // bm)) for pid_grid in range(total)]


def visited_fraction(prog: TileProgram, sizes: dict[Size, int], bm: int, bn: int,
                     samples: int = 8) -> float:
    """The share of all (row block, loop tile) pairs the loop partition visits with tiles
    ``bm`` x ``bn``: 1 for full attention, about 1/2 for causal, little for a sliding
    window -- where smaller tiles waste less. Evaluated at grid point 0 on up to
    ``samples`` evenly spaced row blocks (the cost model's estimate, not a count)."""
    rows = extent_value(prog.row.extent, sizes)
    loop = extent_value(prog.loop.extent, sizes)
    blocks = -(-rows // bm)
    tiles = -(-loop // bn)
    extents = [extent_value(a.extent, sizes) for a in prog.grid]
    if blocks == 0 or tiles == 0 or 0 in extents:   # an empty launch (B = 0, N = 0, ...)
        return 1.0
    n = min(samples, blocks)
    picks = sorted({round(k * (blocks - 1) / max(n - 1, 1)) for k in range(n)})
    try:
        seen = sum(sum(_row_block_tiles(prog, sizes, bm, bn, r, 0, extents)) for r in picks)
    except DataDependentBound:   # a bound that reads tensor data: unknown on the host
        if not _per_instance_lengths(prog):
            return 1.0           # an offset in a buffer: priced as every tile
        # a device length (kv_lens[b]): priced at the capacity, as the cost model's
        # ragged terms are -- a causal prefill over a cache keeps its causal skip
        full = _at_capacity(prog, loop)
        try:
            seen = sum(sum(_row_block_tiles(full, sizes, bm, bn, r, 0, extents))
                       for r in picks)
        except DataDependentBound:
            return 1.0
    return min(1.0, seen / (len(picks) * tiles))


def _per_instance_lengths(prog: TileProgram) -> bool:
    """Whether every tensor read in a loop bound is indexed by grid axes alone: a
    per-instance length (``kv_lens[b]``, as :func:`..runtime.problem.data_lengths`)."""
    from ..ir.nodes import Load
    from ..ir.traverse import walk
    grid = {a.var for a in prog.grid}
    loads = [x for _, e in prog.bounds for x in walk(e) if isinstance(x, Load)]
    index_vars = [{v for i in x.indices for v in walk(i) if isinstance(v, IndexVar)}
                  for x in loads]
    return bool(loads) and all(vs and vs <= grid for vs in index_vars)


def _at_capacity(prog: TileProgram, loop: int) -> TileProgram:
    """``prog`` with every tensor read in its loop bounds replaced by ``loop``."""
    import dataclasses

    from ..ir.fold import iconst
    from ..ir.nodes import Load
    from ..ir.traverse import rewrite
    bounds = tuple((name, rewrite(e, lambda x: iconst(loop) if isinstance(x, Load) else None))
                   for name, e in prog.bounds)
    return dataclasses.replace(prog, bounds=bounds)
