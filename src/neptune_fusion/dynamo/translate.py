"""One region of an ATen graph -> an nf program (outputs and placeholders).

Every node of the region becomes a :class:`Val`: its shape and a function from an index
tuple to the IR expression of that element. Elementwise ops and views compose these
functions; a reduction or contraction builds an ``nf.sum``/``nf.max``/... over a fresh
reduce axis at each index it is read at. Nothing is materialised but the region's
outputs (one ``nf.compute`` each): the compiler inlines computes before it analyses the
chain anyway, and an expression read through a view (``bmm``'s merged batch restored by
a later ``view``) keeps its plain indices (:class:`~.views.Merges`).

Sizes: every extent above :data:`STATIC_EXTENT_MAX` of an input becomes the symbolic size
``s<value>`` (equal values share one size, bound from the inputs at call time, as a
static graph's shapes are fixed); smaller extents -- head dims, head counts, groups -- and
extents no input has stay ints, as ``nf.attention``'s program has them: the Gluon
dialect holds a head dim in one tile and needs it as an int (a symbolic head dim kept the
translated prefill on the Triton kernel, 1.2-1.3x slower than ``nf.attention`` on the
H200, 2026-12-03), and a small extent never needs shrinking for the tuner's check. A
dynamic graph's symbol ``s69`` is the size ``dyn_s69`` (symbolic.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..frontend import lang as nf
from ..ir import build
from ..ir.dtypes import float32
from ..ir.index import int_const, simplify
from ..ir.nodes import Binary, Const, Expr, IndexVar
from .refused import Refused
from .symbolic import dim, is_scalar_value, shape_of, size_name, static, to_ir, unbound_scalars
from .views import Merges

KERNEL_DTYPES = ("float16", "bfloat16", "float32", "int32", "int64")
_NARROW = ("float16", "bfloat16")
STATIC_EXTENT_MAX = 256   # extents up to this stay ints (the module docstring says why)
_CASTS = frozenset({torch.ops.aten._to_copy.default,
                    torch.ops.prims.convert_element_type.default})


@dataclass(frozen=True)
class Val:
    """A translated tensor: its shape, dtype name and element function."""

    shape: tuple   # ints, and sympy expressions for dynamic sizes (symbolic.py)
    dtype: str
    load: Callable[[tuple], Expr]


def meta_of(node) -> tuple[tuple, str]:
    """A graph node's shape (ints, and sympy expressions for dynamic sizes: see
    symbolic.py) and dtype name (``Refused`` if absent)."""
    val = node.meta.get("val") if hasattr(node, "meta") else None
    if val is None or not hasattr(val, "shape"):
        raise Refused(f"{node}: no tensor metadata")
    return shape_of(val), str(val.dtype).removeprefix("torch.")


class Translator:
    """Translates the nodes of one region, in graph order, with the rule table."""

    def __init__(self, rules: dict, packed=None, hints=None, zeros=frozenset()) -> None:
        self.rules = rules
        self.zeros = zeros   # (input node, dim) of extent 1 read at index 0 everywhere
        self.unit_indices: dict = {}   # (input node, dim) of extent 1 -> indices read
        self.packed = packed   # a gqa.Packing: query heads of a group as rows, or None
        self.hints = hints or {}   # dynamic size symbol -> example value (symbolic.py)
        self.merges = Merges(self.size_expr)
        self.vals: dict = {}
        self.sizes: dict = {}   # static extent or dynamic symbol -> its IR size
        self.placeholders: list = []
        self.casts: dict = {}   # input node -> kernel dtype it is passed as (bool -> int32)
        # node -> {dim: ((start, extent), ...)}: the pieces of a concatenation along a
        # dimension, kept through elementwise ops (rules._cat, rules._reduction)
        self.cuts: dict = {}

    # -- inputs and sizes

    def extent(self, n):
        """The extent of an axis of length ``n``: ``s<n>`` if an input has static
        extent ``n``, the IR size of a dynamic symbol, else the int ``n``."""
        if static(n):
            return self.sizes.get(n, n)
        if n in self.sizes:   # a symbol or an expression an input's dimension is
            return self.sizes[n]
        raise Refused(f"an axis of dynamic length {n} is no input's dimension"
                      if n.is_Symbol else f"an axis of length {n}: an expression of "
                      "dynamic sizes that is no input's dimension")

    def size_expr(self, n):
        """A length as a value of the program (a mean's divisor, a mask's offset): a
        static one as its int (a constant the compiler folds), a dynamic one as an
        expression of the sizes."""
        return n if static(n) else to_ir(n, self.sizes)

    def add_input(self, node, passed: bool = False) -> None:
        """A region input; ``passed``: a symbolic int the kernel gets as a 0-d int64
        tensor, its symbols being no tensor input's dimension (symbolic.unbound_scalars)."""
        val = node.meta.get("val")
        if is_scalar_value(val) and passed:
            p = nf.placeholder((), "int64", name=f"in_{node.name}")
            self.placeholders.append(p)
            self.vals[node] = Val((), "int64", lambda idx, p=p: p[()])
            return
        if is_scalar_value(val):   # a dynamic graph's size, read from the shapes
            expr = dim(val)
            self.vals[node] = Val((), "int64", lambda idx, e=expr: self.size_expr(e))
            return
        shape, dtype = meta_of(node)
        if dtype == "bool":
            self.casts[node] = "int32"
        elif dtype not in KERNEL_DTYPES:
            raise Refused(f"input {node.name} is {dtype}; kernels take "
                          f"{', '.join(KERNEL_DTYPES)} (and bool)")
        pk = self.packed if self.packed is not None and node in self.packed.queries \
            else None
        kernel_shape = pk.input_shape(shape) if pk is not None else shape
        for d, n in enumerate(kernel_shape):
            # a size symbol is bound by a placeholder dimension; the packed rows are none
            if not static(n):   # a symbol, or an expression of them (symbolic.py)
                self.sizes.setdefault(n, nf.size(size_name(n)))
            elif n > STATIC_EXTENT_MAX and n not in self.sizes \
                    and not (pk is not None and d == 2):
                self.sizes[n] = nf.size(f"s{n}")
        # a packed query input's rows (group x query rows) stay an int extent: its
        # indices fold back (ir/index.py) only where the range is known
        p = nf.placeholder(tuple(n if pk is not None and d == 2 else self.extent(n)
                                 for d, n in enumerate(kernel_shape)),
                           self.casts.get(node, dtype), name=f"in_{node.name}")
        self.placeholders.append(p)
        as_bool = node in self.casts

        units = [d for d, n in enumerate(p.shape) if isinstance(n, int) and n == 1]

        def load(idx, p=p, pk=pk):
            idx = tuple(idx)
            if pk is not None:   # query head h, row n -> (h // g, (h % g) * N + n)
                h, n = idx[1], idx[2]
                idx = (idx[0], h // pk.group, (h % pk.group) * pk.rows + n, *idx[3:])
            if units:
                idx = tuple(0 if (node, d) in self.zeros else e for d, e in enumerate(idx))
                for d in units:
                    self.unit_indices.setdefault((node, d), set()).add(str(idx[d]))
            e = p[idx] if shape else p[()]
            return e != 0 if as_bool else e

        self.vals[node] = Val(shape, dtype, load)

    # -- nodes

    def arg(self, a):
        """A node argument as a :class:`Val`; other arguments as they are."""
        return self.vals[a] if a in self.vals else a

    def scalar(self, a):
        """A scalar argument: a number as it is, a symbolic int's node as its value."""
        v = self.vals.get(a) if hasattr(a, "op") else None
        if v is None:
            if hasattr(a, "op"):
                raise Refused(f"{a.name}: a scalar computed outside the region")
            return a
        return v.load(())

    def translate(self, node) -> None:
        rule = self.rules.get(node.target)
        if rule is None:
            raise Refused(f"{node.name}: no rule for {node.target}")
        shape, dtype = meta_of(node)
        load = rule.fn(self, node, shape)
        # a cast to 16 bits whose value only feeds matmuls (through views, which carry
        # it along) is left to the matmul, which rounds its operands to 16 bits itself:
        # softmax's probabilities then stay one float32 expression, and the compiler
        # moves their normalisation out of the sum (the division once per row, as in
        # nf.attention) instead of repairing it per tile; the rounding point moves from
        # p / l to p
        keep32 = dtype in _NARROW and (node.target in _CASTS or rule.kind == "view") \
            and self._only_into_dots(node)

        def typed(idx, load=load, dtype=dtype, keep32=keep32):
            e = build.as_expr(load(idx))
            if e.dtype.name == dtype or (keep32 and e.dtype.name == "float32"):
                return e
            if dtype == "float32" and e.dtype.name in _NARROW:
                return widened(e)
            return build.cast(e, dtype)

        self.vals[node] = Val(shape, dtype, typed)
        if rule.kind == "elementwise" and node not in self.cuts:
            self._carry_cuts(node, shape)

    # -- concatenations

    def pieces_of(self, node, d: int, extents) -> tuple:
        """``((start, extent), ...)`` of ``node``, a concatenation along ``d`` of parts
        of ``extents``; remembered as its cuts."""
        pieces, start = [], 0
        for n in extents:
            pieces.append((start, n))
            start = start + n
        self.cuts[node] = {d: tuple(pieces)}
        return tuple(pieces)

    def piece_at(self, pieces, e, node) -> tuple:
        """``(k, index in piece k)`` of index ``e`` along a concatenation: found from the
        index's structure (see rules._cat), or ``Refused``."""
        c = e if isinstance(e, int) else int_const(e)
        for k, (start, n) in enumerate(pieces):
            lo = build.as_expr(self.size_expr(start))
            if c is not None and static(start) and static(n) and start <= c < start + n:
                return k, c - start
            if n == 1 and build.as_expr(e) == lo:
                return k, 0
            if isinstance(e, IndexVar) and k == 0 and e.extent == self.extent(n):
                return 0, e
            if isinstance(e, Binary) and e.op == "add" and isinstance(e.a, IndexVar) \
                    and e.b == lo and e.a.extent == self.extent(n):
                return k, e.a
        raise Refused(f"{node.name}: a concatenation read at {e}, which is not known to "
                      "fall in one of its pieces")

    def _carry_cuts(self, node, shape) -> None:
        """An elementwise node's cuts: its operands', aligned by broadcasting (a
        dimension an operand broadcasts has none), dropped where two disagree."""
        got: dict = {}
        for a in node.all_input_nodes:
            cuts, v = self.cuts.get(a), self.vals.get(a)
            if not cuts or v is None:
                continue
            lead = len(shape) - len(v.shape)
            for d, pieces in cuts.items():
                if v.shape[d] == shape[d + lead]:
                    got[d + lead] = pieces if got.get(d + lead, pieces) == pieces else None
        got = {d: p for d, p in got.items() if p is not None}
        if got:
            self.cuts[node] = got

    def _only_into_dots(self, node) -> bool:
        """Whether every use of ``node``, through view ops, is a matmul operand."""
        users = list(node.users)
        while users:
            u = users.pop()
            rule = self.rules.get(u.target)
            if rule is not None and rule.kind == "view":
                users.extend(u.users)
            elif rule is None or rule.kind != "contraction":
                return False
        return bool(node.users)

    def reduce_axis(self, n, name: str):
        return nf.reduce_axis(self.extent(n), name)

    def output(self, node, name: str, order=None):
        """The ``nf.compute`` of ``node``'s value: an output of the program. ``order``
        (a permutation, rewrite.output_orders): the value's dimensions in that order,
        ``value.permute(order)``, which the graph permutes back as a view."""
        v = self.vals[node]
        if v.dtype not in KERNEL_DTYPES and v.dtype != "bool":
            raise Refused(f"output {node.name} is {v.dtype}; kernels write "
                          f"{', '.join(KERNEL_DTYPES)} and bool")
        pk = self.packed
        if pk is None and order is not None:
            at = {d: k for k, d in enumerate(order)}   # value dim d is output dim at[d]
            shape = tuple(self.extent(v.shape[d]) for d in order)
            return nf.compute(shape, lambda *idx: v.load(tuple(idx[at[d]] for d in
                                                               range(len(order)))),
                              name=name)
        if pk is None:
            shape = tuple(self.extent(n) for n in v.shape)
            return nf.compute(shape, lambda *idx: v.load(tuple(idx)), name=name)
        b, hq, n, dv = v.shape   # (B, Hq / g, g * N, Dv): row r is head hk * g + r // N

        def packed(b, hk, r, c):
            return simplify(v.load((b, hk * pk.group + r // pk.rows, r % pk.rows, c)))
        return nf.compute((self.extent(b), self.extent(hq // pk.group), pk.group * n,
                           self.extent(dv)), packed, name=name)


def widened(e: Expr) -> Expr:
    """``cast(e, float32)`` of a 16-bit float ``e``, moved inside products and quotients
    by constants: ``cast(x * c) -> cast(x) * c``. The kernels compute such a product in
    float32 anyway (a matmul accumulates in it), so only the program's form changes: the
    constant -- attention's scale, written ``(q @ k^T) * scale`` in 16 bits before the
    softmax's upcast -- meets the exp2 rewrite's log2(e) and the two fold into one
    multiply per score (inside the cast they had cost two more: the translated PF-Global
    ran at 1.06x ``nf.attention``'s time on the H200, 2026-12-03)."""
    if isinstance(e, Binary) and e.op in ("mul", "div") and _float_const(e.b):
        return Binary(e.op, widened(e.a), Const(float(e.b.value), float32))
    if isinstance(e, Binary) and e.op == "mul" and _float_const(e.a):
        return Binary("mul", Const(float(e.a.value), float32), widened(e.b))
    return build.cast(e, "float32")


def _float_const(e: Expr) -> bool:
    return isinstance(e, Const) and e.dtype.is_float


def translate_region(rules: dict, inputs: Sequence, nodes: Sequence, outputs: Sequence,
                     packed=None, hints=None, orders=None):
    """``(outputs, placeholders, casts)`` of a region: its input nodes, its nodes in
    graph order, and the nodes whose values leave it. ``Refused`` names what failed.
    ``packed`` (a :class:`~.gqa.Packing`): the query heads of a key/value group become
    rows (its query inputs and its one output take the packed shapes). ``hints``: the
    example values of a dynamic graph's size symbols (symbolic.py). ``orders``: per
    output, None or the order its dimensions are written in (``Translator.output``;
    not with ``packed``). The placeholders are
    those of the tensor inputs and of the symbolic ints no shape gives (0-d int64
    tensors), in order; any other symbolic int input is read from the sizes."""
    orders = orders or (None,) * len(outputs)
    tr, outs = _translate(rules, inputs, nodes, outputs, packed, hints, frozenset(), orders)
    # an extent-1 dimension read at 0 by one path (a view dropped it) and at an axis of
    # extent 1 by another (a broadcast kept it) reads one element, but the two loads
    # differ, and so do reductions that should be one (SDPA's empty-row guard and its
    # softmax's maximum over a (1, 1, N, M) mask): such dimensions are read at 0 always
    mixed = frozenset(k for k, seen in tr.unit_indices.items() if len(seen) > 1)
    if mixed:
        tr, outs = _translate(rules, inputs, nodes, outputs, packed, hints, mixed, orders)
    return outs, tr.placeholders, tr.casts


def _translate(rules, inputs, nodes, outputs, packed, hints, zeros, orders):
    tr = Translator(rules, packed, hints, zeros)
    passed = set(unbound_scalars(inputs))
    for node in inputs:
        tr.add_input(node, node in passed)
    for node in nodes:
        tr.translate(node)
    return tr, [tr.output(n, f"out_{n.name}", order) for n, order in zip(outputs, orders)]
