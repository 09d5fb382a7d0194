"""The loop partition evaluated on the host: how many tiles each program visits.

It evaluates the very loop bounds the kernel computes (:attr:`TileProgram.bounds`, the
same IR the emitter prints) for every program of a launch, so tests can compare the
kernel's own count (``Schedule(count_visits=True)``) with the partition, and both with a
brute-force count of the tiles the mask leaves non-empty.
"""

from __future__ import annotations

from ..ir.nodes import Expr, Size
from ..schedule.partition import evaluate
from .program import BLOCK_N, I_FIRST, I_LAST, TileProgram


def _value(ext, sizes: dict[Size, int]) -> int:
    return sizes[ext] if isinstance(ext, Size) else int(ext)


def tile_visits(prog: TileProgram, sizes: dict[Size, int]) -> list[tuple[int, int]]:
    """``(masked, interior)`` tiles visited by each program, in the kernel's order
    (``pid_row * programs(1) + pid_grid``)."""
    bm, bn = prog.schedule.block_m, prog.schedule.block_n
    rows = _value(prog.row.extent, sizes)
    extents = [_value(a.extent, sizes) for a in prog.grid]
    total = 1
    for e in extents:
        total *= e
    out = []
    for pid_row in range(-(-rows // bm)):
        first = pid_row * bm
        for pid_grid in range(total):
            env: dict[Expr, int] = {I_FIRST: first, I_LAST: min(first + bm, rows) - 1,
                                    BLOCK_N: bn}
            env.update(sizes)
            rest = pid_grid
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
            out.append((masked, interior))
    return out
