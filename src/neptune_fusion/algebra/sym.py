"""The bridge between IR expressions and SymPy.

A consumer body ``g`` is abstracted to a SymPy expression in three kinds of symbols:

* ``r0, r1, ...``: the producers' values (the part the repair must move);
* ``c0, c1, ...``: maximal producer-free subterms that vary along the loop (``s[i, j]``,
  ``v[j, d]``): opaque, since the repair must hold for *every* value they take;
* ``p0, p1, ...`` and sizes: producer-free subterms that are constant along the loop,
  and every constant but a few small exact ones (:data:`SMALL`), with its sign.

Constants are symbols so that the derivation's cost does not depend on their values:
kept exact, ``exp(c - r + 10**9)`` made ``solve`` build a polynomial of degree ``10**9``.
A repair proved for every value of a signed symbol holds for the constant it stands for.

The abstraction is canonical (symbols numbered in first-use order), so structurally equal
chains give equal SymPy expressions and share one memoised derivation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import sympy as sp

from ..ir import build
from ..ir.dtypes import float32
from ..ir.nodes import Binary, Cast, Const, Expr, IndexVar, Load, Param, Reduce, Size, Unary, Where
from ..ir.traverse import walk


class Unsupported(Exception):
    """The body uses a producer in a way the algebra does not model; the text says how."""


SMALL = 16
"""A constant stays an exact SymPy number only if it is a rational whose numerator and
denominator are at most this (``2``, ``-1``, ``0.5``, ``0.125``); any other is a signed
symbol. Small numbers keep their exact cancellations and cost nothing."""


def small_number(v) -> sp.Expr | None:
    """``v`` as an exact SymPy number (``oo`` for an infinity, ``nan`` for a NaN) when it
    is small (:data:`SMALL`), else ``None``."""
    if isinstance(v, bool):
        return sp.Integer(int(v))
    if isinstance(v, float) and math.isnan(v):
        return sp.nan   # sp.Rational(nan) is 0: a NaN must not be read as zero
    if isinstance(v, float) and math.isinf(v):
        return sp.oo if v > 0 else -sp.oo
    frac = sp.Rational(v)
    return frac if abs(frac.p) <= SMALL and frac.q <= SMALL else None


@dataclass
class Abstraction:
    """A consumer body as SymPy, and what each opaque symbol stands for."""

    producers: tuple[Param, ...]
    outer: frozenset[IndexVar]
    signs: tuple[str, ...] = ()
    r_syms: tuple[sp.Symbol, ...] = ()
    c_syms: list[sp.Symbol] = field(default_factory=list)
    p_syms: list[sp.Symbol] = field(default_factory=list)
    meaning: dict[sp.Symbol, Expr] = field(default_factory=dict)
    _by_node: dict[int, sp.Symbol] = field(default_factory=dict)
    _by_const: dict[Const, sp.Symbol] = field(default_factory=dict)
    _has_r: dict[int, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.r_syms = producer_symbols(len(self.producers), self.signs)[0]
        for p, s in zip(self.producers, self.r_syms):
            self.meaning[s] = p

    def has_producer(self, e: Expr) -> bool:
        got = self._has_r.get(id(e))
        if got is None:
            got = any(x is p for x in walk(e) for p in self.producers)
            self._has_r[id(e)] = got
        return got

    def _opaque(self, e: Expr) -> sp.Expr:
        if isinstance(e, Const):
            v = small_number(e.value)
            if v is not None:
                return v
            # any other constant (1e-5, 1/sqrt(d), 1e9) is a signed symbol: float noise
            # would defeat the exact proofs, a huge exact number makes them slow, and the
            # constant is just a parameter to them. Equal constants are one symbol.
            s = self._by_const.get(e)
            if s is None:
                sign = {"positive": True} if e.value > 0 else {"negative": True}
                s = sp.Symbol(f"p{len(self.p_syms)}", **sign)
                self.p_syms.append(s)
                self._by_const[e] = s
                self.meaning[s] = e
            return s
        s = self._by_node.get(id(e))
        if s is not None:
            return s
        if isinstance(e, Size):
            s = sp.Symbol(e.name, positive=True)
        elif e.free_vars <= self.outer:
            s = sp.Symbol(f"p{len(self.p_syms)}", real=True)
            self.p_syms.append(s)
        else:
            s = sp.Symbol(f"c{len(self.c_syms)}", real=True)
            self.c_syms.append(s)
        self._by_node[id(e)] = s
        self.meaning[s] = e
        return s

    def to_sympy(self, e: Expr) -> sp.Expr:
        """Translate ``e``; raises :class:`Unsupported` for what the algebra cannot model."""
        for k, p in enumerate(self.producers):
            if e is p:
                return self.r_syms[k]
        if not self.has_producer(e):
            return self._opaque(e)
        go = self.to_sympy
        if isinstance(e, Unary):
            x = go(e.x)
            table = {"neg": lambda: -x, "exp": lambda: sp.exp(x), "exp2": lambda: 2 ** x,
                     "log": lambda: sp.log(x), "log2": lambda: sp.log(x) / sp.log(2),
                     "sqrt": lambda: sp.sqrt(x), "rsqrt": lambda: 1 / sp.sqrt(x),
                     "tanh": lambda: sp.tanh(x), "sigmoid": lambda: 1 / (1 + sp.exp(-x)),
                     "erf": lambda: sp.erf(x), "abs": lambda: sp.Abs(x)}
            if e.op in table:
                return table[e.op]()
        elif isinstance(e, Binary):
            if e.op in ("add", "sub", "mul", "div", "maximum", "minimum"):
                a, b = go(e.a), go(e.b)
                return {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
                        "div": lambda: a / b, "maximum": lambda: sp.Max(a, b),
                        "minimum": lambda: sp.Min(a, b)}[e.op]()
            if e.op == "pow" and isinstance(e.b, Const):
                return go(e.a) ** self._opaque(e.b)
            raise Unsupported(f"a producer appears under '{e.op}' in {e}")
        elif isinstance(e, Cast) and e.dtype.is_float:
            return go(e.x)
        elif isinstance(e, Where):
            raise Unsupported(f"a producer appears in the condition of {e}")
        elif isinstance(e, Reduce):
            raise Unsupported(f"a producer is used inside the nested reduction {e}")
        elif isinstance(e, Load):
            raise Unsupported(f"a producer is used as an index in {e}")
        raise Unsupported(f"a producer appears under {type(e).__name__} in {e}")


def producer_symbols(n: int, signs: tuple[str, ...] = ()):
    """Symbols ``r_k`` and ``r_k_new`` for ``n`` producers, with their known signs."""
    signs = tuple(signs) + ("real",) * (n - len(signs))

    def make(name: str, sign: str) -> sp.Symbol:
        if sign == "positive":
            return sp.Symbol(name, positive=True)
        if sign == "nonnegative":
            return sp.Symbol(name, nonnegative=True)
        return sp.Symbol(name, real=True)
    r = tuple(make(f"r{k}", signs[k]) for k in range(n))
    rn = tuple(make(f"r{k}_new", signs[k]) for k in range(n))
    return r, rn


def where_branches(e: Expr, has_producer) -> list[Expr]:
    """``e`` with each ``where`` whose branches hold a producer replaced by one branch.

    Returns every combination (at most 8); the repair must hold on each.
    """
    sites = [w for w in walk(e) if isinstance(w, Where) and has_producer(w)
             and not has_producer(w.cond)]
    if len(sites) > 3:
        raise Unsupported(f"{len(sites)} data-dependent choices around producers (max 3)")
    out = [e]
    from ..ir.traverse import substitute
    for w in sites:
        nxt = []
        for x in out:
            nxt.append(substitute(x, {w: w.a}))
            nxt.append(substitute(x, {w: w.b}))
        out = nxt
    return out


def to_ir(x: sp.Expr, env: dict[sp.Symbol, Expr]) -> Expr:
    """Translate a SymPy expression back to IR; ``env`` gives each symbol's meaning."""
    if x.is_Symbol:
        return env[x]
    if x.is_Number or x in (sp.oo, -sp.oo):
        return build.const(float(x), float32)
    if x == sp.E:
        return build.unary("exp", build.const(1.0, float32))
    args = [to_ir(a, env) for a in x.args] if not x.is_Pow else None
    if x.is_Add:
        out = args[0]
        for a in args[1:]:
            out = out + a
        return out
    if x.is_Mul:
        num, den = [], []
        for a in x.args:
            if a.is_Pow and a.exp.is_Number and a.exp < 0:
                den.append(to_ir(a.base ** -a.exp, env))
            else:
                num.append(to_ir(a, env))
        out = num[0] if num else build.const(1.0, float32)
        for a in num[1:]:
            out = out * a
        for a in den:
            out = out / a
        return out
    if x.is_Pow:
        base, e = x.base, x.exp
        if e.is_Number:
            b = to_ir(base, env)
            if e == sp.Rational(1, 2):
                return build.unary("sqrt", b)
            if e == sp.Rational(-1, 2):
                return build.unary("rsqrt", b)
            if e.is_Integer and e < 0:
                return build.const(1.0, float32) / build.power(b, int(-e))
            return build.power(b, int(e) if e.is_Integer else float(e))
        if base.is_Number:
            if base == 2:
                return build.unary("exp2", to_ir(e, env))
            return build.unary("exp", to_ir(e * sp.log(base), env))
        value = _constant_value(e, env)
        if value is not None:   # an exponent made of abstracted constants: its value
            return build.power(to_ir(base, env), value)
        raise Unsupported(f"cannot lower the power {x}")
    fn = {sp.exp: "exp", sp.log: "log", sp.tanh: "tanh", sp.Abs: "abs",
          sp.erf: "erf"}.get(x.func)
    if fn is not None:
        return build.unary(fn, args[0])
    if x.func in (sp.Max, sp.Min):
        op = "maximum" if x.func is sp.Max else "minimum"
        out = args[0]
        for a in args[1:]:
            out = build.binary(op, out, a)
        return out
    # SymPy may fold exponentials into hyperbolic functions (cosh, sinh, ...) while it
    # simplifies a repair; their exponential form is lowerable
    alt = x.rewrite(sp.exp)
    if alt != x:
        return to_ir(alt, env)
    raise Unsupported(f"cannot lower {x.func.__name__} in {x}")


def _constant_value(x: sp.Expr, env: dict[sp.Symbol, Expr]) -> float | None:
    """The value of ``x`` when each of its symbols stands for a constant, else None (the
    constants' values enter only here, where an emitted expression needs them)."""
    if not x.free_symbols or not all(isinstance(env.get(s), Const) for s in x.free_symbols):
        return None
    v = x.xreplace({s: sp.Float(env[s].value) for s in x.free_symbols})
    return float(v) if v.is_Number and v.is_finite else None
