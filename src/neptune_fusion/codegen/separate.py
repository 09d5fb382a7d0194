"""Per-row terms out of the per-element work (stage ``separate``).

A score is often a sum of a part that varies along the loop axis and a part that does
not: ALiBi's ``slope * (j - i)`` holds ``-slope * i``, one value per row. The softmax
reads the score twice, in the tile maximum and in the exponential, and both can take
a per-row term ``R`` outside the tile:

* ``max_j(A + R) = max_j(A) + R`` (and ``min``): **exact** -- rounding is monotonic,
  so the largest rounded sum is the rounded sum of the largest ``A``; through the
  boundary tile's select too: ``where(c, A + R, -inf) = where(c, A, -inf) + R``;
* ``exp2(A + R - m) = exp2(A + (R - m))``: ``R - m`` is computed once per row.

So an element costs what ``A`` costs, the maximum and one subtraction, instead of
forming ``A + R`` as well (ALiBi in the loop: from five FMA-pipe operations an element
to three; causal attention has two).

To find ``R``, a float expression is read as signed terms (:func:`split`): sums and
differences are flattened; a product of a factor that does not vary along the loop
with a sum that has both kinds of terms is distributed (``t * (a - b) = t*a - t*b``);
and a conversion to float of the integer distance of a loop index and a row position is
recentred on the position ``p0`` of the program's first row: ``float(j - p) = float(j -
p0) - float(p - p0)``, which is exact (every magnitude is below ``2**24``). The
recentring is what keeps the distributed form as accurate as the original: ``t *
float(j - p0)`` is as large as ``t * (|j - p| + BLOCK_M)``, never ``t * j``, so the one
extra rounding is at most an ulp of that -- where ``t * |j - p|`` is large the element's
weight ``2**-(t|j - p|)`` is negligible anyway. (Recentred on row 0 instead, a decode at
position 3000 lost two decimal digits in fp32: the test pins it.)

Legality: the select's else-branch must be the reducer's identity (``-inf`` for max,
the exponential's masked form), and ``R`` is assumed finite; a per-row ``+inf`` would
make the score ``+inf`` everywhere, whose softmax is NaN in the reference as well.
Nothing is rewritten where no per-row term is found, so programs without one (plain,
causal, soft-capped attention; row reductions) keep their source.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.nodes import Binary, Cast, Const, Expr, IndexVar, Reduce, Unary, Where
from ..ir.traverse import rewrite, substitute
from .program import I_FIRST, TileProgram

Terms = list[tuple[int, Expr]]   # (sign, term)


class _Split:
    """The signed terms of expressions, A (reading the loop variable) and R (not)."""

    def __init__(self, loop: IndexVar, row: IndexVar, variant: frozenset = frozenset()
                 ) -> None:
        self.loop, self.row, self.variant = loop, row, variant
        self.moved = False          # a term was taken out of a product, cast or select
        self._read: dict[int, bool] = {}   # _reads by node (bodies share subtrees)

    def varies(self, e: Expr) -> bool:
        return self.loop in e.free_vars or bool(self.variant) and self._reads(e)

    def _reads(self, e: Expr) -> bool:
        """Whether ``e`` reads a ``variant`` leaf outside a reduction over the loop."""
        got = self._read.get(id(e))
        if got is None:
            got = e in self.variant or not (isinstance(e, Reduce) and self.loop in e.axes) \
                and any(self._reads(c) for c in e.children())
            self._read[id(e)] = got
        return got

    def terms(self, e: Expr, sign: int = 1) -> tuple[Terms, Terms]:
        if not self.varies(e):
            return [], [(sign, e)]
        if e.dtype.is_float and isinstance(e, Binary) and e.op in ("add", "sub"):
            a1, r1 = self.terms(e.a, sign)
            a2, r2 = self.terms(e.b, sign if e.op == "add" else -sign)
            return a1 + a2, r1 + r2
        if isinstance(e, Unary) and e.op == "neg" and e.dtype.is_float:
            return self.terms(e.x, -sign)
        if isinstance(e, Binary) and e.op == "mul" and e.dtype.is_float:
            for f, x in ((e.a, e.b), (e.b, e.a)):
                if self.varies(f):
                    continue
                moved = self.moved
                a, r = self.terms(x, sign)
                if r:
                    self.moved = True
                    return ([(s, Binary("mul", f, t)) for s, t in a],
                            [(s, Binary("mul", f, t)) for s, t in r])
                self.moved = moved
            return [(sign, e)], []
        if isinstance(e, Cast) and e.dtype.is_float:
            got = self.distance(e)
            if got is not None:
                self.moved = True
                (sa, col), (sr, rest) = got
                return [(sign * sa, col)], [(sign * sr, rest)]
        if isinstance(e, Where) and isinstance(e.b, Const) and e.b.value == -float("inf"):
            moved = self.moved
            a, r = self.terms(e.a)
            if a and r:
                self.moved = True
                return [(sign, Where(e.cond, total(a), e.b))], [(sign * s, t) for s, t in r]
            self.moved = moved
        return [(sign, e)], []

    def distance(self, e: Cast) -> tuple[tuple[int, Expr], tuple[int, Expr]] | None:
        """``float(a - b)`` of a loop index ``a`` and a row position ``b`` (either order):
        the signed terms ``float(a - b0)`` and ``float(b - b0)``, ``b0`` the position of
        the program's first row (``b`` at ``i = i0``: a decode's query offset cancels)."""
        d = e.x
        if not (isinstance(d, Binary) and d.op == "sub" and not d.dtype.is_float):
            return None
        for a, b, sa in ((d.a, d.b, 1), (d.b, d.a, -1)):
            if self.varies(a) and self.row not in a.free_vars \
                    and self.row in b.free_vars and not self.varies(b):
                origin = substitute(b, {self.row: I_FIRST})   # b at the block's first row
                return ((sa, Cast(Binary("sub", a, origin), e.dtype)),
                        (-sa, Cast(Binary("sub", b, origin), e.dtype)))
        return None


def total(terms: Terms) -> Expr:
    """The signed terms as one sum, in their order."""
    (s, out), rest = terms[0], terms[1:]
    out = out if s > 0 else Unary("neg", out)
    for s, t in rest:
        out = Binary("add" if s > 0 else "sub", out, t)
    return out


def separate_expr(e: Expr, loop: IndexVar, row: IndexVar,
                  variant: frozenset = frozenset()) -> Expr:
    """``e`` with the per-row terms of its tile maxima/minima and exponentials moved
    outside the per-element work (module docstring). ``variant``: leaves that vary
    along the loop though they do not name it (the Gluon dialect's contraction with its
    column term, :mod:`.mma_bias`: what is left of the term is one value a tile, taken
    out as a per-row one is)."""
    def fn(node: Expr) -> Expr | None:
        if isinstance(node, Reduce) and node.op in ("max", "min") and node.axes == (loop,):
            body, select = node.body, None
            ident = -float("inf") if node.op == "max" else float("inf")
            if isinstance(body, Where) and isinstance(body.b, Const) \
                    and body.b.value == ident:
                body, select = body.a, body
            if not body.dtype.is_float:
                return None
            a, r = _Split(loop, row, variant).terms(body)
            if not a or not r:
                return None
            inner = total(a) if select is None else Where(select.cond, total(a), select.b)
            return Binary("add", Reduce(node.op, inner, node.axes), total(r))
        if isinstance(node, Unary) and node.op in ("exp", "exp2"):
            arg, factor = node.x, None
            if isinstance(arg, Binary) and arg.op == "mul" and isinstance(arg.b, Const):
                arg, factor = arg.a, arg.b   # exp2's factored (x - m) * c: kept whole
            sp = _Split(loop, row, variant)
            a, r = sp.terms(arg)
            if not a or not r or not (sp.moved or len(r) > 1):
                return None
            got = Binary("add", total(a), total(r))
            return Unary(node.op, got if factor is None else Binary("mul", got, factor))
        return None
    return rewrite(e, fn)


def separate(prog: TileProgram) -> TileProgram:
    """Stage ``separate``: every loop segment's body through :func:`separate_expr`."""
    loop, row = prog.loop.var, prog.row.var
    segments = tuple(replace(seg, body=tuple((s, separate_expr(e, loop, row))
                                             for s, e in seg.body))
                     for seg in prog.segments)
    if segments == prog.segments:
        return prog
    return replace(prog, segments=segments,
                   rules=prog.rules + ("per-row terms out of the tile maximum and the "
                                       "exponential",))
