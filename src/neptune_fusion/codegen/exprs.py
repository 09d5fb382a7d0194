"""Lowering IR expressions to Triton expressions over tiles.

A lowered value (:class:`Val`) is Triton code plus the tile axes it spans, in layout
order: ``()`` a scalar, ``("row",)`` a ``[BLOCK_M]`` vector, ``("row", "loop")`` a
``[BLOCK_M, BLOCK_N]`` tile, and so on. Operands of an elementwise op are broadcast to the
result's axes explicitly (``x[:, None]``). Every float computes in fp32; loads keep their
storage dtype until an elementwise op needs fp32 or a ``tl.dot`` takes them as they are.

Values are bound to names by the emitter's CSE (keyed on the IR node and layout) when they
are loads, reductions, named, long, or used more than once; loop-invariant values are
hoisted to the prologue. A division by a value over fewer tile axes (``o / l`` with a
per-row ``l``) is a multiply by its reciprocal, computed once per row.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..errors import CodegenError
from ..ir.dtypes import int64
from ..ir.fold import fconst, nonneg
from ..ir.nodes import Binary, Cast, Const, Expr, IndexVar, Load, Param, Reduce, Size, Unary, Where
from ..ir.traverse import walk
from .emitter import Block
from .patterns import canonical, match_contraction
from .program import INDEX_PARAMS, TILE_START, TileProgram
from .tiles import TileOps, Val, masked_load
from .triton_ops import (
    ADD,
    ATOM,
    KIND_TL,
    MUL,
    TANH_PORTABLE,
    TANH_PTX,
    TL_BINARY,
    TL_FLOAT_BINARY,
    TL_UNARY,
    literal,
    wrap,
)


def count_uses(roots: Iterable[Expr]) -> dict[Expr, int]:
    """How many distinct parents reference each node under ``roots``."""
    uses: dict[Expr, int] = {}
    seen: set[int] = set()
    for r in roots:
        for node in walk(r):
            if id(node) in seen:
                continue
            seen.add(id(node))
            for c in set(node.children()):
                uses[c] = uses.get(c, 0) + 1
    return uses


class Lowerer(TileOps):
    """Lowers expressions of one block (a loop body, the prologue or the epilogue)."""

    def __init__(self, prog: TileProgram, env: dict[Expr, Val], block: Block,
                 hoist: Block | None, variant: frozenset, guard: bool = False,
                 uses: dict | None = None, hints: dict | None = None,
                 columns: tuple[str, int] | None = None) -> None:
        self.prog, self.env, self.block, self.hoist = prog, env, block, hoist
        # the tile's column indices (an arange over BLOCK_N) and the period above which
        # their bits are one constant per register in every thread (``column_float``)
        self.columns = columns
        self.variant_leaves, self.guard = variant, guard
        self.uses, self.hints = uses or {}, hints or {}
        self.roles = {a.var: a for a in prog.axes}
        self.args = {t.tensor: t for t in prog.inputs + tuple(o.arg for o in prog.outputs)}
        self._variant: dict[Expr, bool] = {}
        self._roles: dict[Expr, frozenset[str]] = {}
        self._twins: dict[IndexVar, IndexVar] = {}
        self.cur = block  # where the value being lowered is emitted

    # ------------------------------------------------------------------ helpers
    def role_of(self, v: IndexVar) -> str | None:
        a = self.roles.get(v)
        return None if a is None else a.role

    def is_variant(self, e: Expr) -> bool:
        """Whether ``e`` changes inside the block (reads the loop axis or the state)."""
        got = self._variant.get(e)
        if got is None:
            got = (e in self.variant_leaves or self.prog.loop.var in e.free_vars
                   or any(self.is_variant(c) for c in e.children()))
            self._variant[e] = got
        return got

    def tile_roles(self, e: Expr) -> frozenset[str]:
        """The tile axes ``e`` spans: its index variables' and its state values'."""
        got = self._roles.get(e)
        if got is None:
            if isinstance(e, Param):
                v = self.env.get(e)
                got = frozenset(v.axes) if v is not None else frozenset()
            elif isinstance(e, IndexVar):
                r = self.role_of(e)
                got = frozenset((r,)) if r is not None and r != "grid" else frozenset()
            else:
                got = frozenset().union(*(self.tile_roles(c) for c in e.children()))
                if isinstance(e, Reduce):
                    got -= {self.role_of(a) for a in e.axes}
            self._roles[e] = got
        return got

    def axes(self, e: Expr, order: tuple[str, ...] | None = None) -> tuple[str, ...]:
        roles = self.tile_roles(e)
        inner = sorted((v for v in e.free_vars if isinstance(v, IndexVar)
                        and self.role_of(v) == "inner"), key=lambda v: v.uid)
        if len(inner) > 1:
            # one tile dimension holds the inner axis: two of them would be paired element
            # by element (an attention inlined into a sum over its rows did that, wrong)
            raise CodegenError(
                f"{e} spans two inner axes ({', '.join(v.name for v in inner)}) at once; "
                "a tile holds one (materialise the inner compute: compile it separately)")
        if len(roles) > 2:
            raise CodegenError(
                f"{e} spans the tile axes {', '.join(canonical(roles))}: more than two, and "
                "it is not a contraction (a sum of a product) that tl.dot can take")
        if order is not None and set(order) == roles:
            return order
        return canonical(roles)

    def f32(self, v: Val) -> Val:
        if v.kind == "f32":
            return v
        if v.code.lstrip("-").isdigit():  # an integer literal
            return Val(repr(float(v.code)), v.axes, "f32", v.prec)
        return self.convert(v, "f32")

    def convert(self, v: Val, kind: str) -> Val:
        # scalars may be plain Python ints (loop indices under the interpreter): tl.cast
        if not v.axes:
            return Val(f"tl.cast({v.code}, {KIND_TL[kind]})", (), kind, ATOM)
        return Val(f"{wrap(v.code, v.prec, ATOM)}.to({KIND_TL[kind]})", v.axes, kind, ATOM)

    def expand(self, v: Val, axes: tuple[str, ...]) -> str:
        """``v``'s code broadcast to ``axes`` (as a primary expression when it changes)."""
        if v.axes == axes or not v.axes:
            return v.code
        if len(v.axes) == 1 and len(axes) == 2 and v.axes[0] in axes:
            sub = "[:, None]" if axes.index(v.axes[0]) == 0 else "[None, :]"
            return wrap(v.code, v.prec, ATOM) + sub
        if sorted(v.axes) == sorted(axes):
            return f"tl.trans({v.code})"
        raise CodegenError(f"cannot broadcast a value over {v.axes} to {axes}")

    def operand(self, v: Val, axes, least: int) -> str:
        code = self.expand(v, axes)
        return code if code != v.code else wrap(code, v.prec, least)

    # ------------------------------------------------------------------ entry points
    def value(self, e: Expr, order: tuple[str, ...] | None = None) -> Val:
        """``e`` with floats in fp32."""
        v = self.lower(e, order)
        return self.f32(v) if v.kind in ("f16", "bf16") else v

    def lower(self, e: Expr, order: tuple[str, ...] | None = None, force: str = "") -> Val:
        """``e`` as a Val; loads keep their storage dtype. ``force`` binds to that name."""
        axes = self.axes(e, order)
        key = ("v", e, axes)
        hoisted = self.hoist is not None and not self.is_variant(e)
        block = self.hoist if hoisted else self.block
        got = block.lookup(key)
        if got is not None:
            return got
        prev, self.cur = self.cur, block
        try:
            val = self.dispatch(e, axes)
        finally:
            self.cur = prev
        # a value hoisted out of a loop is bound there, or the loop would recompute it
        val = self.bind(e, val, block, force, always=hoisted and prev is not block)
        block.remember(key, val)
        return val

    def bind(self, e: Expr, val: Val, block: Block, force: str = "",
             always: bool = False) -> Val:
        if isinstance(e, Const) or val.code.isidentifier():
            return val
        heavy = isinstance(e, (Load, Reduce)) or val.code.startswith(("tl.dot(", "tl.load("))
        hint = force or self.hints.get(e)
        if always or hint or heavy or self.uses.get(e, 0) > 1 or len(val.code) > 72:
            name = block.bind(hint or self.default_hint(e, val), val.code)
            return Val(name, val.axes, val.kind, ATOM)
        return val

    def default_hint(self, e: Expr, val: Val) -> str:
        ld = masked_load(e)   # where(c, x[...], 0): named after x, as a load
        e = e if ld is None else ld
        if isinstance(e, Load):
            arg = self.args[e.tensor]
            return arg.name + ("T" if val.axes != canonical(val.axes) else "")
        if val.code.startswith("tl.dot("):
            names = [x.tensor.name for x in walk(e) if isinstance(x, Load)]
            return "".join(names) if 0 < len(names) <= 3 else "dot"
        if isinstance(e, Unary) and e.op in ("exp", "exp2"):
            return "p"
        if e.dtype.is_float and val.axes == ("row", "loop"):
            return "s"
        if isinstance(e, Binary) and e.op == "lt" and isinstance(e.a, IndexVar):
            return f"{e.a.name}_in"
        if e.dtype.is_bool:
            return "mask"
        return "t"

    # ------------------------------------------------------------------ dispatch
    def dispatch(self, e: Expr, axes: tuple[str, ...]) -> Val:
        if isinstance(e, Const):
            code, prec = literal(_finite_f32(e.value) if e.dtype.is_float else e.value)
            kind = "f32" if e.dtype.is_float else "bool" if e.dtype.is_bool else "i32"
            return Val(code, (), kind, prec)
        if isinstance(e, (Size, IndexVar, Param)):
            got = self.env.get(e)
            if got is None:
                raise CodegenError(f"{e} is not available in the kernel here")
            return got
        if isinstance(e, Load):
            return self.load(e, axes)
        if isinstance(e, Unary):
            return self.unary(e, axes)
        if isinstance(e, Binary):
            return self.binary(e, axes)
        if isinstance(e, Where):
            ld = masked_load(e)
            # a masked load, unless the block reads the load unmasked too (then the tile
            # loaded once and a select: softmax's max and sum over one tile of x)
            if ld is not None and self.tile_roles(e.cond) <= self.tile_roles(ld) \
                    and self.uses.get(ld, 1) <= 1:
                return self.load(ld, axes, e.cond)
            c, a, b = (self.value(x, axes) for x in (e.cond, e.a, e.b))
            a, b = (self.f32(x) if e.dtype.is_float else x for x in (a, b))
            code = f"tl.where({self.expand(c, axes)}, {self.expand(a, axes)}, " \
                   f"{self.expand(b, axes)})"
            return Val(code, axes, a.kind if e.dtype.is_float else b.kind)
        if isinstance(e, Cast):
            return self.cast(e, axes)
        if isinstance(e, Reduce):
            return self.reduce(e, axes)
        raise CodegenError(f"no lowering for {type(e).__name__} {e}")  # pragma: no cover

    def _kind(self, e: Expr, vals: list[Val]) -> str:
        if e.dtype.is_bool:
            return "bool"
        if e.dtype.is_float:
            return "f32"
        return "i64" if any(v.kind == "i64" for v in vals) else "i32"

    def unary(self, e: Unary, axes) -> Val:
        x = self.value(e.x, axes)
        if e.dtype.is_float:
            x = self.f32(x)
        if e.op == "tanh":
            return self.tanh(x)
        tpl, prec, least = TL_UNARY[e.op]
        return Val(tpl.format(wrap(x.code, x.prec, least)), x.axes, self._kind(e, [x]), prec)

    def tanh(self, x: Val) -> Val:
        if x.prec != ATOM or not x.code.isidentifier():
            x = Val(self.cur.bind("x", x.code), x.axes, x.kind)
        portable = TANH_PORTABLE.format(x.code)
        if not self.prog.schedule.fast_tanh:
            return Val(portable, x.axes, "f32", ADD)
        name = self.cur.names.fresh("tanh")
        with self.cur.nested("if INTERPRET:") as b:
            b.emit(f"{name} = {portable}")
        with self.cur.nested("else:") as b:
            b.emit(f"{name} = {TANH_PTX.format(x.code)}")
        return Val(name, x.axes, "f32")

    def binary(self, e: Binary, axes) -> Val:
        if e.op == "add":
            for r, other in ((e.b, e.a), (e.a, e.b)):
                if isinstance(r, Reduce) and self.axes(other) == axes:
                    c = match_contraction(r, self.role_of, self.tile_roles)
                    if c is not None:
                        return self.dot(c, self.value(other, axes), self.hints.get(e))
        if e.op == "pow":
            return self.power(e, axes)
        if e.op == "div" and e.dtype.is_float and not isinstance(e.b, Const) \
                and self.tile_roles(e.b) < self.tile_roles(e.a):
            # x / l = x * (1 / l) for l over fewer tile axes (a per-row l): one reciprocal
            # per row, then a multiply per element (fp32: within 2 ulp of the division)
            return self.binary(Binary("mul", e.a, Binary("div", fconst(1.0), e.b)), axes)
        a, b = self.value(e.a, axes), self.value(e.b, axes)
        if e.dtype.is_float or (a.kind in ("f32", "f64")) != (b.kind in ("f32", "f64")):
            if e.op not in ("and", "or"):
                a, b = self.f32(a), self.f32(b)
        if e.op in ("floordiv", "mod") and not (nonneg(e.a, INDEX_PARAMS)
                                                 and nonneg(e.b, INDEX_PARAMS)):
            return self.floored(e, a, b, axes)
        floats = a.kind in ("f16", "bf16", "f32", "f64")
        tpl, prec, la, lb = (TL_FLOAT_BINARY if floats and e.op in TL_FLOAT_BINARY
                             else TL_BINARY)[e.op]
        if e.op == "mul" and not e.dtype.is_float and isinstance(e.b, Binary) \
                and e.b.op in ("mul", "floordiv", "mod"):
            lb = prec + 1  # a * (b // c * d) is not a * b // c * d on integers
        code = tpl.format(self.operand(a, axes, la), self.operand(b, axes, lb))
        return Val(code, axes if (a.axes or b.axes) else (), self._kind(e, [a, b]), prec)

    def floored(self, e: Binary, a: Val, b: Val, axes) -> Val:
        """``a // b`` or ``a % b`` rounded toward minus infinity (the IR's rule, Python's)
        from Triton's, which truncate toward zero: where the truncated remainder is not 0
        and its sign differs from the divisor's, the quotient is one less and the
        remainder one divisor more (``(j - i) // 4`` of a mask: -1 // 4 is -1, not 0)."""
        x, y = (self.named_operand(v, axes, hint) for v, hint in ((a, "num"), (b, "den")))
        rem = self.cur.bind("rem", f"{x} % {y}")
        if isinstance(e.b, Const) and e.b.value > 0:
            off = f"{rem} < 0"
        else:
            off = f"({rem} != 0) & (({rem} < 0) != ({y} < 0))"
        code = (f"tl.where({off}, {x} // {y} - 1, {x} // {y})" if e.op == "floordiv"
                else f"tl.where({off}, {rem} + {y}, {rem})")
        return Val(code, axes if (a.axes or b.axes) else (), self._kind(e, [a, b]), ATOM)

    def named_operand(self, v: Val, axes, hint: str) -> str:
        """``v`` broadcast to ``axes``, bound to a name unless a name or a literal."""
        code = self.operand(v, axes, ATOM)
        name = code.split("[", 1)[0]   # a name, or a name broadcast (``offs_j[None, :]``)
        if code.lstrip("-").isdigit() or name.isidentifier() and (
                name == code or code.endswith("]")):
            return code
        return self.cur.bind(hint, code)

    def power(self, e: Binary, axes) -> Val:
        if not isinstance(e.b, Const):
            raise CodegenError(f"{e}: only constant exponents are lowered")
        x, n = self.f32(self.value(e.a, axes)), e.b.value
        if n == 0.5:
            return Val(f"tl.sqrt({x.code})", x.axes, "f32")
        if n == -0.5:
            return Val(f"tl.rsqrt({x.code})", x.axes, "f32")
        if float(n).is_integer() and 1 <= abs(n) <= 4:
            if not x.code.isidentifier():
                x = Val(self.cur.bind("x", x.code), x.axes, "f32")
            prod = " * ".join([x.code] * int(abs(n)))
            return Val(prod if n > 0 else f"1.0 / ({prod})", x.axes, "f32", MUL)
        return Val(f"tl.exp2({float(n)!r} * tl.log2({x.code}))", x.axes, "f32")

    def cast(self, e: Cast, axes) -> Val:
        d = e.x
        got = self.column_float(e)
        if got is not None:
            return got
        if e.dtype.is_float and isinstance(d, Binary) and d.op in ("add", "sub") \
                and not d.dtype.is_float and self.tile_roles(d.a) < self.tile_roles(d) \
                and self.tile_roles(d.b) < self.tile_roles(d):
            # float(a +- b) as float(a) +- float(b) for a row and a column value (ALiBi's
            # distance j - i): a conversion per row and per column, not per element, where
            # conversions share the exponential's throughput. The same value while |a|,
            # |b| < 2**24 (both convert exactly; one rounding of the exact result)
            return self.binary(Binary(d.op, Cast(d.a, e.dtype), Cast(d.b, e.dtype)), axes)
        x = self.value(e.x, axes)
        if e.dtype.is_float:
            return self.f32(x) if x.kind != "f64" else x
        if e.dtype.is_bool:
            return Val(f"{wrap(x.code, x.prec, 2)} != 0", x.axes, "bool", 1)
        kind = "i64" if e.dtype == int64 else "i32"
        return x if x.kind == kind else self.convert(x, kind)

    def column_float(self, e: Cast) -> Val | None:
        """``float(j +- s)`` for the loop index ``j`` and a per-tile scalar ``s``
        (ALiBi's ``j - i_first``) where the dialect names its column layout
        (``columns``: the in-tile index ``c`` and a period ``P``): ``float(c & -P) +
        float((c & (P - 1)) + (j0 +- s))``. In a layout whose thread holds the columns
        ``P k + r`` (Hopper's MMA accumulator: ``P = 8``, ``r`` from the lane and one
        register bit), the first part is a constant per register and the second takes two
        values per thread, so the per-column integer add and conversion are gone. The
        same value while every magnitude is below ``2**24`` (both parts convert exactly
        and their sum is exact); None where the form does not apply."""
        d = e.x
        if self.columns is None or not e.dtype.is_float or d.dtype.is_float \
                or not isinstance(d, Binary) or d.op not in ("add", "sub"):
            return None
        loop, start = self.prog.loop.var, self.env.get(TILE_START)
        if d.a is loop:
            op, s = d.op, d.b
        elif d.b is loop and d.op == "add":
            op, s = "add", d.a
        else:
            return None
        if start is None or self.tile_roles(s):
            return None
        cols, period = self.columns
        sv = self.value(s, ())
        if sv.kind not in ("i32", "i64"):
            return None
        sign = "+" if op == "add" else "-"
        base = f"{start.code} {sign} {wrap(sv.code, sv.prec, MUL)}"
        hi = f"({cols} & {-period}).to(tl.float32)"
        lo = f"(({cols} & {period - 1}) + ({base})).to(tl.float32)"
        return Val(f"{hi} + {lo}", ("loop",), "f32", ADD)


_F32_MAX = 3.4028234663852886e38


def _finite_f32(v: float) -> float:
    """A finite float constant within float32's range: the kernels compute in float32,
    and Triton types a Python float beyond it as float64 (which then meets a float32
    ``tl.dot`` operand: an error). Scaling folds make such constants -- a float mask
    filled with float32's minimum, scaled by log2(e) for ``exp2`` -- and the saturated
    value keeps what the finite one meant: far below every score, never ``-inf``."""
    if math.isfinite(v) and abs(v) > _F32_MAX:
        return math.copysign(_F32_MAX, v)
    return v
