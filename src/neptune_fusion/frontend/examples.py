"""Operators written plainly in the language, shared by the CLI demo, tests and docs."""

from __future__ import annotations

import math

from ..ir.nodes import Compute, Expr, Extent, Placeholder, Size
from . import lang as nf


def _extent(e: Extent | str) -> Extent:
    return nf.size(e) if isinstance(e, str) else e


def plain_attention(n: Extent | str = "N", m: Extent | str = "M", d: Extent | str = "D",
                    dtype: str = "float32", scale: float | None = None
                    ) -> tuple[list[Compute], list[Placeholder]]:
    """Single-head attention ``softmax(q k^T * scale) v``, written as it reads on paper.

    ``n`` queries and ``m`` keys of width ``d``: each an int or a size name. ``scale``
    defaults to ``1/sqrt(d)``. Returns ``([o], [q, k, v])``::

        s[i, j] = sum(q[i, c] * k[j, c], c) * scale
        m[i]    = max(s[i, j], j)
        l[i]    = sum(exp(s[i, j] - m[i]), j)
        o[i, e] = sum(exp(s[i, j] - m[i]) * v[j, e], j) / l[i]

    ``l`` and ``o`` read the final value of the reduction before them, the chain
    the fusion derives online softmax from.
    """
    N, M, D = _extent(n), _extent(m), _extent(d)
    q = nf.placeholder((N, D), dtype, name="q")
    k = nf.placeholder((M, D), dtype, name="k")
    v = nf.placeholder((M, D), dtype, name="v")
    sc: Expr | float
    if scale is not None:
        sc = scale
    elif isinstance(D, Size):
        sc = nf.rsqrt(nf.cast(D, dtype))
    else:
        sc = 1.0 / math.sqrt(D)
    c = nf.reduce_axis(D, "c")
    s = nf.compute((N, M), lambda i, j: nf.sum(q[i, c] * k[j, c], c) * sc, name="s")
    j = nf.reduce_axis(M, "j")
    mx = nf.compute((N,), lambda i: nf.max(s[i, j], j), name="m")
    l = nf.compute((N,), lambda i: nf.sum(nf.exp(s[i, j] - mx[i]), j), name="l")  # noqa: E741
    o = nf.compute((N, D), lambda i, e: nf.sum(nf.exp(s[i, j] - mx[i]) * v[j, e], j) / l[i],
                   name="o")
    return [o], [q, k, v]
