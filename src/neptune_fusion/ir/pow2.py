"""Powers of two: tile sizes, size buckets (no dependencies, so any layer may import it)."""

from __future__ import annotations


def next_pow2(n: int, least: int = 1) -> int:
    """The smallest power of two that is >= ``n`` and >= ``least``."""
    n = int(n)
    return max(least, 1 if n <= 1 else 1 << (n - 1).bit_length())


TILE_MIN = 16  # tl.dot needs every dimension of a tile to be at least 16


def tile_extent(n: int) -> int:
    """The tile size that covers an axis of extent ``n`` whole: a power of two, at least
    :data:`TILE_MIN`."""
    return next_pow2(n, TILE_MIN)
