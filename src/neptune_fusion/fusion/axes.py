"""Reductions over several axes at once, split into reductions over one axis each.

The code generator lowers one reduction axis per loop, so :func:`split_axes` rewrites
every ``Reduce(op, body, (a_1, ..., a_n))`` (sum, max, min, prod) of a program before it
is planned: the innermost axis ``a_n`` (the last written: usually the contiguous one) is
reduced by a compute of its own over the coordinates its body needs, and the other axes
reduce that compute; repeated until one axis is left::

    s[i] = sum(x[i, j, k], (j, k))
        ->  sum_k[i, j] = sum(x[i, j, k], k);   s[i] = sum(sum_k[i, j], j)

A sum keeps the factors that do not depend on the inner axis outside the inner compute
(as ``autodiff/split.py`` does for gradients), so the partial sums need fewer
coordinates; max, min and prod reduce their body whole. Max and min are exact; a sum or
product is reassociated (rounding only). Partial results of a 16-bit body are kept in
float32, and the reduction is cast back to its own dtype. :func:`axis_staging` makes
each partial compute an intermediate with a pass of its own, so the code generator never
sees a reduction nested in another over a third tile axis; the passes run as any
multi-pass plan's do (``runtime/staged.py``, docs/codegen.md). A chain over two axes (a
softmax normaliser over ``(j, k)``) takes four passes: the partial maxima, the maximum,
the partial sums, the sum.
"""

from __future__ import annotations

from ..ir import build
from ..ir.dtypes import float32
from ..ir.graph import placeholders, tensors_in_order
from ..ir.nodes import Compute, Expr, IndexVar, Load, Placeholder, Reduce, fresh_uid
from ..ir.traverse import factors, product, rewrite, substitute
from .stages import Pass, Staging, fresh_name

_OPS = ("sum", "max", "min", "prod")
_NARROW = ("float16", "bfloat16")


def has_multi_axis(outputs) -> bool:
    """Whether any compute reachable from ``outputs`` reduces over several axes at once."""
    from ..ir.traverse import walk
    return any(isinstance(e, Reduce) and len(e.axes) > 1
               for t in tensors_in_order(list(outputs)) if isinstance(t, Compute)
               for e in walk(t.body))


def rebuilder(hook):
    """``compute(t)``: ``t`` rebuilt bottom-up with ``hook(node)`` (a replacement or
    None) applied to every node of its body and, through loads, of the computes it reads
    (each rebuilt once; unchanged computes are returned as they are)."""
    memo: dict[int, Compute] = {}

    def compute(t: Compute) -> Compute:
        got = memo.get(id(t))
        if got is None:
            body = rewrite(t.body, node)
            got = t if body is t.body else Compute(t.name, t.shape, t.axes, body, fresh_uid())
            memo[id(t)] = got
        return got

    def node(e: Expr) -> Expr | None:
        got = hook(e)
        if got is not None or not (isinstance(e, Load) and isinstance(e.tensor, Compute)):
            return got
        t = compute(e.tensor)
        return None if t is e.tensor else Load(t, e.indices)
    return compute


def split_axes(outputs: list[Compute]) -> tuple[list[Compute], list[Compute]]:
    """``(outputs, partials)``: ``outputs`` with every multi-axis reduction split (module
    docstring) -- computes that hold none, and read none that does, are returned as they
    are -- and the partial computes made, in the order made."""
    taken = {t.name for t in tensors_in_order(list(outputs))}
    partials: list[Compute] = []

    def hook(e: Expr) -> Expr | None:
        if isinstance(e, Reduce) and len(e.axes) > 1 and e.op in _OPS:
            return _split(e, taken, partials)
        return None
    compute = rebuilder(hook)
    return [compute(o) for o in outputs], partials


def axis_staging(outputs: list[Compute]) -> Staging:
    """The passes of a program with multi-axis reductions: each partial compute of
    :func:`split_axes` is an intermediate filled by a pass of its own (after the passes
    it reads), and a last pass computes the outputs from them. Each pass program reduces
    over one axis per reduction (it may still need several passes of its own: the
    pipeline plans it like any program)."""
    outs, partials = split_axes(outputs)
    holders = {id(p): Placeholder(p.name, p.shape, p.dtype, fresh_uid()) for p in partials}

    def hook(e: Expr) -> Expr | None:
        if isinstance(e, Load) and id(e.tensor) in holders:
            return Load(holders[id(e.tensor)], e.indices)
        return None
    compute = rebuilder(hook)
    programs = {id(p): compute(Compute(p.name, p.shape, p.axes, p.body, fresh_uid()))
                for p in partials}
    order: list[Compute] = []
    placed: set[int] = set()
    by_holder = {id(holders[id(p)]): p for p in partials}

    def place(p: Compute) -> None:
        if id(p) in placed:
            return
        placed.add(id(p))
        for ph in placeholders([programs[id(p)]]):
            dep = by_holder.get(id(ph))
            if dep is not None:
                place(dep)
        order.append(p)
    for p in partials:
        place(p)
    passes, inter = [], []
    for k, p in enumerate(order):
        prog = programs[id(p)]
        passes.append(Pass(k, (prog,), tuple(placeholders([prog]))))
        inter.append((holders[id(p)], k, 0))
    last = [compute(o) for o in outs]
    passes.append(Pass(len(order), tuple(last), tuple(placeholders(last))))
    return Staging(tuple(passes), tuple(inter),
                   tuple((len(order), n) for n in range(len(last))))


def _split(e: Reduce, taken: set[str], partials: list[Compute]) -> Expr:
    dtype = e.dtype
    while len(e.axes) > 1:
        a = e.axes[-1]
        fs = factors(e.body) if e.op == "sum" else [e.body]
        dep = [f for f in fs if a in f.free_vars] or fs
        rest = [f for f in fs if f not in dep]
        inner: Expr = Reduce(e.op, product(dep), (a,))
        if inner.dtype.name in _NARROW:
            inner = build.cast(inner, float32)
        coords = sorted(inner.free_vars, key=lambda v: (v.name, v.uid))
        xs = tuple(IndexVar(v.name, v.extent, "spatial", fresh_uid()) for v in coords)
        t = Compute(fresh_name(f"{e.op}_{a.name}", taken),
                    tuple(v.extent for v in coords), xs,
                    substitute(inner, dict(zip(coords, xs))), fresh_uid())
        partials.append(t)
        e = Reduce(e.op, product(rest + [Load(t, tuple(coords))]), e.axes[:-1])
    return e if e.dtype == dtype else build.cast(e, dtype)
