"""Memory and reductions of the lowerer: loads, stores' addresses, tile reductions and
contractions to ``tl.dot``.

A mixin of :class:`neptune_fusion.codegen.exprs.Lowerer`, which provides ``value``,
``lower``, ``f32``, ``expand``, ``operand``, ``tile_roles``, ``role_of``, ``is_variant``
and the blocks (``cur``, ``hoist``) these methods emit into.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..analysis.masks import conjuncts
from ..errors import CodegenError
from ..ir.dtypes import int32, int64
from ..ir.fold import fconst, fold, is_const
from ..ir.nodes import Binary, Cast, Const, Expr, IndexVar, Load, Reduce, Where
from ..ir.reducers import reducer
from ..ir.traverse import factors, product, substitute, walk
from .patterns import loaded, match_contraction
from .program import Axis, extent_expr
from .tma import descriptor_load
from .triton_ops import ADD, ATOM, KIND, KIND_TL, MUL, REDUCE_OPS, wrap


def index_range(e: Expr) -> tuple[int, int] | None:
    """The smallest and largest value of integer index ``e`` over its variables' constant
    extents (interval arithmetic); None when an extent is symbolic or an operation is not
    covered."""
    if isinstance(e, Const) and isinstance(e.value, int):
        return e.value, e.value
    if isinstance(e, IndexVar):
        return (0, e.extent - 1) if isinstance(e.extent, int) and e.extent > 0 else None
    if isinstance(e, Cast):
        return index_range(e.x)
    if isinstance(e, Binary) and e.op == "mod" and isinstance(e.b, Const) \
            and isinstance(e.b.value, int) and e.b.value > 0 and isinstance(e.a, IndexVar):
        return 0, e.b.value - 1   # a bare variable is >= 0: x % c lies in [0, c)
    if isinstance(e, Binary) and e.op in ("add", "sub", "mul", "floordiv"):
        a, b = index_range(e.a), index_range(e.b)
        if a is None or b is None:
            return None
        if e.op == "add":
            return a[0] + b[0], a[1] + b[1]
        if e.op == "sub":
            return a[0] - b[1], a[1] - b[0]
        if e.op == "mul":
            ends = [x * y for x in a for y in b]
            return min(ends), max(ends)
        if b[0] == b[1] and b[0] > 0:
            return a[0] // b[0], a[1] // b[0]
    return None


INT32_MAX = 2 ** 31 - 1


def _clamped(idx: Expr, extent) -> Expr:
    """A gathered index clamped into ``[0, extent - 1]``, as int64. A 32-bit index (a
    page table's entry) is clamped in 32 bits, then widened: the same value, since no
    int32 exceeds the top ``min(extent - 1, 2**31 - 1)`` that replaces ``extent - 1``
    (a scalar, once per program), where the 64-bit clamp took two compare-and-select
    pairs per key (sm_90 SASS of the paged decode: 622 -> 593 instructions per tile,
    docs/serving.md)."""
    top = Binary("sub", extent_expr(extent), Const(1, int64))
    if idx.dtype != int32:
        return Binary("minimum", Binary("maximum", fold(Cast(idx, int64)), Const(0, int64)),
                      fold(top))
    top = fold(Cast(Binary("minimum", top, Const(INT32_MAX, int64)), int32))
    return Cast(Binary("minimum", Binary("maximum", idx, Const(0, int32)), top), int64)


def gatherable(idx: Expr) -> bool:
    """Whether a tile-spanning index may be gathered per element: built from bare
    variables, ``//`` and ``%`` by positive constants, casts and loads (an index read from
    another tensor), and choices among such (``where(t[i] != -100, t[i], 0)``: a
    cross-entropy's ignored targets; ``minimum``/``maximum``: a clamp), and a loaded index
    plus an extent free of the tile axes (a negative index wrapped as PyTorch does, the
    extent static or symbolic). ``x[i + 1]`` is
    not: a shifted tile would need its own bounds."""
    if isinstance(idx, (IndexVar, Load, Const)):
        return True
    if isinstance(idx, Cast):
        return gatherable(idx.x)
    if isinstance(idx, Where):
        return gatherable(idx.a) and gatherable(idx.b)
    if isinstance(idx, Binary) and idx.op in ("minimum", "maximum"):
        return gatherable(idx.a) and gatherable(idx.b)
    if isinstance(idx, Binary) and idx.op == "add":
        # an index read from a tensor shifted by a dimension's extent: PyTorch's wrap of
        # a negative index, ``where(t < 0, t + n, t)`` (clamped like any gathered index)
        for a, b in ((idx.a, idx.b), (idx.b, idx.a)):
            if not b.free_vars and not any(isinstance(x, Load) for x in walk(b)) \
                    and gatherable(a) and any(isinstance(x, Load) for x in walk(a)):
                return True
    return (isinstance(idx, Binary) and idx.op in ("floordiv", "mod")
            and isinstance(idx.b, Const) and isinstance(idx.b.value, int)
            and idx.b.value > 0 and gatherable(idx.a))


def masked_load(e: Expr) -> Load | None:
    """The load of ``where(c, x[...], 0.0)`` (a float load, or a float cast of one) whose
    condition does not read that load: read as a masked ``tl.load`` keeping the storage
    dtype; None for anything else (``where(|x| < inf, x, 0)`` needs ``x`` loaded first)."""
    if isinstance(e, Where) and is_const(e.b, 0.0) and e.dtype.is_float:
        ld = loaded(e.a)
        if ld is not None and not any(x is ld for x in walk(e.cond)):
            return ld
    return None


def _same_extent(e: Expr, ext) -> bool:
    return e == ext if not isinstance(ext, int) else (
        isinstance(e, Const) and e.value == ext)


def scaled_extreme(e: Reduce) -> Expr | None:
    """``max_k(x * c) = max_k(x) * c`` (and ``min``) for a constant ``c > 0``; None for
    anything else. Exact: rounding (and a widening cast) is monotonic, so the largest
    rounded product is the rounded product of the largest. A scaled score's tile
    maximum then costs one multiply per row instead of one per element; the scaled tile
    is still formed where ``exp2`` reads it, and there the multiply fuses with the
    subtraction into one FMA."""
    if e.op not in ("max", "min") or not isinstance(e.body, Binary) or e.body.op != "mul":
        return None
    for x, c in ((e.body.a, e.body.b), (e.body.b, e.body.a)):
        if isinstance(c, Const) and c.dtype.is_float and c.value > 0 \
                and c.value != float("inf"):
            return Binary("mul", Reduce(e.op, x, e.axes), c)
    return None


def sum_of(terms: list[Expr]) -> Expr:
    out = terms[0]
    for t in terms[1:]:
        out = Binary("add", out, t)
    return out


@dataclass(frozen=True)
class Val:
    """A lowered value: Triton code, the tile axes it spans (layout order), its kind
    (f32 f16 bf16 f64 i32 i64 bool) and the precedence of its code."""

    code: str
    axes: tuple[str, ...]
    kind: str
    prec: int = ATOM


class TileOps:
    """Loads, addresses, masks, tile reductions and contractions (see module docstring)."""

    # ------------------------------------------------------------------ memory
    def needs_mask(self, ax: Axis) -> bool:
        ext = ax.extent
        if ax.role == "loop":
            return self.guard
        if ax.role == "row":
            return not (isinstance(ext, int) and ext % self.prog.schedule.block_m == 0)
        cover = ax.block_size
        if ax.programs:     # column tiles across programs: the last one may be partial
            return not (isinstance(ext, int) and ext % cover == 0)
        if cover and ax.role == "col" and self.prog.split is not None and ax.chunk is None:
            cover *= self.prog.split.col_blocks     # a combine cut over columns: all of them
        return not (isinstance(ext, int) and ext == cover)

    def address(self, tensor, indices, axes: tuple[str, ...] | None = None
                ) -> tuple[str, Expr, Expr | None]:
        """``tensor[indices]`` as a base pointer (the scalar indices folded in, int64),
        a tile offset (IR, invariant part first) and a mask (IR, or None).

        With ``axes`` (a load's layout), gathered indices (paged KV's
        ``k[table[b, j // 16], h, j % 16, c]``) go into the base instead: a pointer per
        element of the axes they span (``k_rows``, one 64-bit product per key, not per
        element of the tile), broadcast to ``axes``; the tile offset stays 32-bit, as a
        contiguous tile's does (about 3 % of the paged decode kernel on the H200)."""
        arg = self.args[tensor]
        scalar: list[Expr] = []
        inv: list[Expr] = []
        var: list[Expr] = []
        gath: list[Expr] = []
        mask: Expr | None = None
        last = len(indices) - 1
        for d, idx in enumerate(indices):
            whole = idx
            idx, shift = self._split_index(idx, tensor.shape[d])
            if shift is not None:   # ``scalar + tile variable``: the scalar goes to the base
                term = fold(Cast(shift, int64))
                scalar.append(term if d == last else Binary("mul", term, arg.stride(d)))
                if not isinstance(tensor.shape[d], int):   # in range unless it is smaller
                    cond = Binary("lt", whole, extent_expr(tensor.shape[d]))
                    mask = cond if mask is None else Binary("and", mask, cond)
            ax = self.roles.get(idx) if isinstance(idx, IndexVar) else None
            if ax is not None and ax.role != "grid":
                term = idx if d == last else Binary("mul", idx, arg.stride(d))
                (var if self.is_variant(term) else inv).append(term)
                if self.needs_mask(ax):
                    ext = extent_expr(ax.extent)
                    cond = Binary("lt", idx, ext)
                    mask = cond if mask is None else Binary("and", mask, cond)
            elif self.tile_roles(idx):
                if not gatherable(idx):
                    raise CodegenError(
                        f"index {idx} of {tensor.name!r} mixes tile axes in arithmetic; "
                        "index tiles with bare variables (or gather: a load, // or % by "
                        "a constant)")
                # a gathered index (paged KV: ``k[table[b, j // 16], h, j % 16, c]``):
                # a per-element offset; one that may fall outside the dimension is
                # clamped into it (an element of the tensor is read, never one past it:
                # a bad page id cannot fault; the reference calls such a read undefined)
                for x in sorted(idx.free_vars, key=lambda x: x.uid):
                    xa = self.roles.get(x)    # a tile past its axis' end (boundary tiles)
                    if xa is not None and xa.role != "grid" and self.needs_mask(xa):
                        cond = Binary("lt", x, extent_expr(xa.extent))
                        mask = cond if mask is None else Binary("and", mask, cond)
                term = fold(Cast(idx, int64))
                rng = index_range(idx)
                ext = tensor.shape[d]
                if rng is None or not isinstance(ext, int) or rng[0] < 0 or rng[1] >= ext:
                    term = _clamped(idx, ext)
                gath.append(term if d == last else Binary("mul", term, arg.stride(d)))
            else:
                # 64-bit: batch * stride overflows int32 on large tensors
                term = fold(Cast(idx, int64))
                scalar.append(term if d == last else Binary("mul", term, arg.stride(d)))
        base = f"{arg.name}_ptr"
        if scalar:
            off = self.value(sum_of(scalar))
            key = ("base", arg.name, sum_of(scalar))
            blk = self.hoist if (self.hoist is not None
                                 and not self.is_variant(sum_of(scalar))) else self.cur
            got = blk.lookup(key)
            if got is None:
                got = blk.bind(f"{arg.name}_base", f"{base} + {off.code}")
                blk.remember(key, got)
            base = got
        if gath and axes is not None and len(self.tile_roles(sum_of(gath))) < len(axes):
            base = self._gathered_base(arg.name, base, sum_of(gath), axes)
        else:
            for term in gath:
                (var if self.is_variant(term) else inv).append(term)
        return base, fold(sum_of(inv + var) if inv or var else Const(0, int64)), mask

    def _gathered_base(self, name: str, base: str, rows: Expr, axes) -> str:
        """``base + rows`` bound once as a tensor of pointers over the axes ``rows``
        spans, broadcast to ``axes`` (see :meth:`address`)."""
        rows = fold(rows)
        blk = self.hoist if (self.hoist is not None and not self.is_variant(rows)) \
            else self.cur
        prev, self.cur = self.cur, blk
        try:
            off = self.value(rows)
            key = ("rows", base, rows)
            got = blk.lookup(key)
            if got is None:
                got = blk.bind(f"{name}_rows", f"{base} + {wrap(off.code, off.prec, ADD)}")
                blk.remember(key, got)
        finally:
            self.cur = prev
        return self.expand(Val(got, off.axes, "i64"), axes)

    def _split_index(self, idx: Expr, extent) -> tuple[Expr, Expr | None]:
        """``(tile variable, scalar)`` when ``idx`` is a sum of one bare tile variable and
        terms free of tile axes (packed GQA decode reads a per-head buffer at
        ``h * group + row``) whose values lie in a known range (static extents) that is
        provably inside a static ``extent``, or non-negative where ``extent`` is a size
        argument: :meth:`address` then masks the load by ``idx < extent`` (the last row
        of a static graph's sequence, ``x[i + 8191]`` over a row of one: the LM head of
        ``logits_to_keep=1``; a smaller tensor reads zeros, where the reference is
        undefined). Else ``(idx, None)``, which :meth:`address` rejects as before
        (``x[i + 1]`` over symbolic rows)."""
        if isinstance(idx, IndexVar) or not self.tile_roles(idx):
            return idx, None
        rng = index_range(idx)
        if rng is None or rng[0] < 0 or (isinstance(extent, int) and rng[1] >= extent):
            return idx, None
        terms, stack = [], [idx]
        while stack:
            t = stack.pop()
            if isinstance(t, Binary) and t.op == "add":
                stack.extend((t.a, t.b))
            else:
                terms.append(t)
        tiles = [t for t in terms if self.tile_roles(t)]
        if len(tiles) != 1 or not isinstance(tiles[0], IndexVar):
            return idx, None
        rest = [t for t in terms if t is not tiles[0]]
        return tiles[0], sum_of(rest)

    def twin(self, v: IndexVar) -> IndexVar:
        """The first column or inner axis of the kernel whose tiles cover exactly what
        ``v``'s do (same extent, tile size and masking; not tiled across programs, not
        chunked): ``v`` itself when there is none before it. A derived program reads
        ``k[j, c]`` for a dot over ``c`` and ``k[j, c']`` for one that outputs ``c'``:
        over equal tiles of ``c`` and ``c'`` that is one tile of ``k``."""
        got = self._twins.get(v)
        if got is None:
            got, ax = v, self.roles.get(v)
            if ax is not None and ax.role in ("col", "inner"):
                got = next(a.var for a in self.prog.axes if self._same_tiles(a, ax))
            self._twins[v] = got
        return got

    def _same_tiles(self, a: Axis, b: Axis) -> bool:
        if a is b:
            return True
        return (a.role in ("col", "inner") and a.extent == b.extent
                and a.block_size == b.block_size and a.chunk is None and b.chunk is None
                and not a.programs and not b.programs and self.needs_mask(a) == self.needs_mask(b))

    def shared_tile(self, e: Load, axes) -> tuple[object, tuple[IndexVar, ...]] | None:
        """``(key, variable order)`` of a 2-d tile load whose indices are bare tile
        variables (or free of tile axes), the variables replaced by their :meth:`twin`:
        two loads with one key read the same elements, in that order or transposed."""
        if len(axes) != 2:
            return None
        by_role: dict[str, IndexVar] = {}
        for idx in e.indices:
            roles = self.tile_roles(idx)
            if not roles:
                continue
            if not isinstance(idx, IndexVar) or self.role_of(idx) in by_role:
                return None
            by_role[self.role_of(idx)] = idx
        if set(by_role) != set(axes):
            return None
        order = tuple(self.twin(by_role[r]) for r in axes)
        if order[0] == order[1]:
            return None
        same = {v: self.twin(v) for v in by_role.values() if self.twin(v) is not v}
        return ("tile", substitute(e, same) if same else e), order

    def load(self, e: Load, axes, where: Expr | None = None) -> Val:
        """``e`` as a ``tl.load``; ``where``: a condition under which it reads 0 instead
        (``where(c, x[...], 0)`` is a masked load: not dereferenced where ``c`` fails).

        A 2-d tile already loaded here under another name of its axes (:meth:`twin`), or
        in the other layout, is read from that load (``tl.trans`` of it when transposed,
        a free view for ``tl.dot``) instead of being loaded twice."""
        addressed = None
        if where is not None:
            addressed = self.address(e.tensor, e.indices, axes)
            if addressed[2] is not None and \
                    set(conjuncts(where)) <= set(conjuncts(addressed[2])):
                # the address's own mask already reads 0 there (a boundary tile's
                # ``j < n`` folded in twice): the plain load, which another read shares
                where = None
        shared = self.shared_tile(e, axes) if where is None else None
        if shared is not None:
            got = self.cur.lookup(shared[0])
            if got is not None:
                name, order, kind = got
                if order == shared[1]:
                    return Val(name, axes, kind)
                return Val(f"tl.trans({name})", axes, kind)
        base, offset, mask = addressed or self.address(e.tensor, e.indices, axes)
        off = self.value(offset, axes)
        mask_code = None if mask is None else self.expand(self.value(mask, axes), axes)
        if where is not None:
            w = self.value(where, axes)
            if w.axes:
                mask_code = self.expand(w if mask is None else self.value(
                    Binary("and", mask, where), axes), axes)
            else:
                # a scalar condition (``extent > 0``) selects the mask: the interpreter's
                # ``tl.load`` refuses a Python bool, or ``t & c`` of one (an int32 tensor)
                mask_code = f"tl.where({w.code}, {mask_code or 'True'}, False)"
        code = f"tl.load({base} + {self.operand(off, axes, ADD + 1)}"
        if mask_code is not None:
            code += f", mask={mask_code}, other=0.0"
        val = Val(code + ")", axes, KIND[e.tensor.dtype.name])
        by_desc = descriptor_load(self, e, axes) if where is None else None
        if by_desc is not None:   # both loads, chosen by the kernel's constexpr TMA
            name = self.cur.names.fresh(self.default_hint(e, val))
            with self.cur.nested("if TMA:") as br:
                br.emit(f"{name} = {by_desc}")
            with self.cur.nested("else:") as br:
                br.emit(f"{name} = {val.code}")
            val = Val(name, axes, val.kind)
        if shared is None:
            return val
        name = val.code if by_desc is not None else \
            self.cur.bind(self.default_hint(e, val), val.code)
        self.cur.remember(shared[0], (name, shared[1], val.kind))
        return Val(name, axes, val.kind)

    # ------------------------------------------------------------------ reductions
    def reduce(self, e: Reduce, axes) -> Val:
        c = match_contraction(e, self.role_of, self.tile_roles)
        if c is not None:
            return self.dot(c, None)
        if len(e.axes) != 1:
            raise CodegenError(f"{e}: a reduction over several axes is not lowered")
        hoisted = self.factor_out(e)
        if hoisted is None:
            hoisted = scaled_extreme(e)
        if hoisted is not None:
            return self.value(hoisted, axes)
        role = self.role_of(e.axes[0])
        body = self.f32(self.value(self.padded(e)))
        if role not in body.axes:
            # constant along the tile, every element of which is inside the axis here (a
            # boundary tile's guard makes the body vary): a sum counts, max/min keep it
            if role != "loop" or e.op not in ("sum", "max", "min"):
                raise CodegenError(f"{e}: the body does not vary along {e.axes[0].name}")
            if e.op != "sum":
                return body
            return Val(f"{wrap(body.code, body.prec, MUL)} * BLOCK_N", body.axes, "f32", MUL)
        out = tuple(a for a in body.axes if a != role)
        # max and min propagate NaN (triton_ops.NAN_HELPERS): their helper takes INTERPRET
        flag = ", INTERPRET" if e.op in ("max", "min") else ""
        return Val(f"{REDUCE_OPS[e.op]}({body.code}, {body.axes.index(role)}{flag})", out,
                   "f32")

    def padded(self, e: Reduce) -> Expr:
        """``e``'s body, its elements past the end of a reduced column or inner axis (a
        tile wider than a symbolic or odd extent) the reducer's identity: a masked load
        reads 0 there, which only a sum of terms that vanish with their loads would
        ignore (``max_c x[r, c]`` of negative rows, ``sum_c exp(x[r, c])``). The loop
        axis's boundary tiles carry their own guards (the loop partition)."""
        ax = self.roles.get(e.axes[0])
        if ax is None or ax.role not in ("col", "inner") or not self.needs_mask(ax):
            return e.body
        ident = reducer(e.op).identity
        if not e.body.dtype.is_float:
            if math.isinf(ident):   # an integer max/min: no identity to fill with
                raise CodegenError(f"{e}: an integer {e.op} over a tile wider than "
                                   f"{e.axes[0].name}'s extent is not lowered")
            ident = int(ident)
        return Where(Binary("lt", e.axes[0], extent_expr(ax.extent)), e.body,
                     Const(ident, e.body.dtype))

    def factor_out(self, e: Reduce) -> Expr | None:
        """``sum_k(a * b) = a * sum_k(b)`` for the factors ``a`` constant along ``k``, when
        the body spans three tile axes and so cannot be lowered as it is (a probability
        constant along the keys -- a score that does not depend on them -- times ``v``:
        ``sum_j(p[i] * v[j, e]) = p[i] * sum_j(v[j, e])``); None otherwise. A boundary
        guard stays on the rest: ``where(c, a * b, 0) = a * where(c, b, 0)`` (a finite)."""
        role = self.role_of(e.axes[0])
        if e.op != "sum" or len(self.tile_roles(e.body)) <= 2:
            return None
        body, cond = e.body, None
        if isinstance(body, Where) and is_const(body.b, 0.0):
            body, cond = body.a, body.cond
        fs = factors(body)
        out = [f for f in fs if role not in self.tile_roles(f)]
        if not out or len(out) == len(fs):
            return None
        rest = product([f for f in fs if role in self.tile_roles(f)])
        if cond is not None:
            rest = Where(cond, rest, fconst(0.0))
        return Binary("mul", product(out), Reduce("sum", rest, e.axes))

    def dot_operand(self, e: Expr, order: tuple[str, ...]) -> Val:
        # where(guard, a * b, 0) with a factor the guard already masks to zero (a boundary
        # tile's x * w of RMSNorm): the product is zero outside without the select
        if isinstance(e, Where) and is_const(e.b, 0.0) and \
                any(self.zero_outside(f, e.cond) for f in factors(e.a)):
            e = e.a
        if masked_load(e) is not None:   # where(c, x, 0): a masked load, dtype kept
            return self.lower(e, order)
        ld = loaded(e)
        return self.lower(ld, order) if ld is not None else self.value(e, order)

    def zero_outside(self, e: Expr, cond: Expr) -> bool:
        """Whether ``e`` reads zero wherever ``cond`` is false: ``cond`` is the boundary
        guard ``j < extent`` and ``e`` a load indexed by the loop variable itself, which
        the guarded tile loads with ``other=0.0`` -- or such a load under a select to zero
        (``where(j < kv_lens, v[j], 0)``: a masked load, zero outside as well)."""
        loop = self.prog.loop
        ld = loaded(e)
        ld = masked_load(e) if ld is None else ld
        return (ld is not None and self.guard and loop.var in ld.indices
                and isinstance(cond, Binary) and cond.op == "lt" and cond.a == loop.var
                and _same_extent(cond.b, loop.extent))

    def dot(self, c, acc: Val | None, hint: str | None = None) -> Val:
        k = self.role_of(c.k)
        lhs, rhs = c.lhs, c.rhs
        if c.mask is not None and not (self.zero_outside(lhs, c.mask)
                                       or self.zero_outside(rhs, c.mask)):
            # where(m, a * b, 0) = where(m, a, 0) * b (a, b finite): the side m spans,
            # the computed one when m spans k alone
            if c.x in self.tile_roles(c.mask) or (
                    c.y not in self.tile_roles(c.mask) and loaded(lhs) is None):
                lhs = Where(c.mask, lhs, fconst(0.0))
            else:
                rhs = Where(c.mask, rhs, fconst(0.0))
        a = self.dot_operand(lhs, (c.x, k))
        b = self.dot_operand(rhs, (k, c.y))
        narrow = {"f16", "bf16"}
        if a.kind == b.kind and a.kind in narrow | {"f32"}:
            kind = a.kind
        elif {a.kind, b.kind} <= narrow | {"f32"} and len({a.kind, b.kind} & narrow) == 1:
            kind = ({a.kind, b.kind} & narrow).pop()
            a, b = (x if x.kind == kind else Val(f"{wrap(x.code, x.prec, ATOM)}.to("
                                                   f"{KIND_TL[kind]})", x.axes, kind)
                    for x in (a, b))
        else:
            kind, a, b = "f32", self.f32(a), self.f32(b)
        tail = "" if acc is None else f", acc={acc.code}"
        if kind == "f32":
            tail += f', input_precision="{self.prog.schedule.fp32_precision}"'
        code = f"tl.dot({a.code}, {b.code}{tail})"
        if kind != "bf16":
            return Val(code, (c.x, c.y), "f32")
        # The Triton interpreter multiplies bfloat16 as raw integers: upcast there.
        name = self.cur.names.fresh(hint or "dot")
        with self.cur.nested("if INTERPRET:") as br:
            br.emit(f"{name} = tl.dot({self.f32(a).code}, {self.f32(b).code}{tail})")
        with self.cur.nested("else:") as br:
            br.emit(f"{name} = {code}")
        return Val(name, (c.x, c.y), "f32")
