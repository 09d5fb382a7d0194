"""Property tests: random well-formed programs print, verify and evaluate sensibly.

Hypothesis draws a *recipe* (plain nested tuples) and :func:`build` turns it into IR, so
the same recipe can be built twice (interning) and a failing case prints readably. Every
program is also evaluated point by point by :func:`naive`, a slow scalar interpreter
written independently of the vectorised reference, and the two must agree.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import neptune_fusion as nf
from neptune_fusion.ir import nodes as ir
from neptune_fusion.ir.graph import placeholders
from neptune_fusion.ir.traverse import inline, substitute

SETTINGS = settings(max_examples=50, deadline=None)

# Unary and binary forms that stay finite on finite inputs (NaN only from out-of-range loads).
UNARY = {
    "neg": lambda a: -a, "abs": nf.abs, "tanh": nf.tanh, "sigmoid": nf.sigmoid, "erf": nf.erf,
    "exp": lambda a: nf.exp(nf.tanh(a)), "exp2": lambda a: nf.exp2(nf.tanh(a)),
    "log": lambda a: nf.log(1.0 + nf.abs(a)), "log2": lambda a: nf.log2(1.0 + nf.abs(a)),
    "sqrt": lambda a: nf.sqrt(nf.abs(a)), "rsqrt": lambda a: nf.rsqrt(1.0 + nf.abs(a)),
    "square": lambda a: a ** 2,
}
BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / (1.0 + nf.abs(b)), "max": nf.maximum, "min": nf.minimum,
}
CMP = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
       "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}
REDUCE = {"sum": nf.sum, "max": nf.max, "min": nf.min, "prod": nf.prod}
INDEX_FORMS = ("plain", "plus1", "minus1", "rev", "half", "mod", "zero")


# ------------------------------------------------------------------ recipes


def index_recipe(nvars: int):
    return st.tuples(st.sampled_from(INDEX_FORMS), st.integers(0, nvars - 1))


def cond_recipe(nvars: int, depth: int):
    leaf = st.one_of(
        st.tuples(st.just("cmp"), st.sampled_from(sorted(CMP)), expr_recipe(nvars, 0),
                  expr_recipe(nvars, 0)),
        st.tuples(st.just("icmp"), st.sampled_from(sorted(CMP)), st.integers(0, nvars - 1),
                  st.integers(0, nvars - 1), st.integers(-1, 1)))
    if depth <= 0:
        return leaf
    sub = cond_recipe(nvars, depth - 1)
    return st.one_of(leaf, st.tuples(st.sampled_from(["and", "or"]), sub, sub),
                     st.tuples(st.just("not"), sub))


def expr_recipe(nvars: int, depth: int):
    """A float expression over ``nvars`` index variables in scope (reductions add more)."""
    leaf = st.one_of(
        st.tuples(st.just("const"), st.floats(-2, 2, allow_nan=False).map(lambda v: round(v, 3))),
        st.tuples(st.just("var"), st.integers(0, nvars - 1)),
        st.tuples(st.just("load"), st.integers(0, 2),
                  st.lists(index_recipe(nvars), min_size=2, max_size=2).map(tuple)))
    if depth <= 0:
        return leaf
    sub = expr_recipe(nvars, depth - 1)
    return st.one_of(
        leaf,
        st.tuples(st.just("un"), st.sampled_from(sorted(UNARY)), sub),
        st.tuples(st.just("bin"), st.sampled_from(sorted(BINARY)), sub, sub),
        st.tuples(st.just("where"), cond_recipe(nvars, 1), sub, sub),
        st.tuples(st.just("red"), st.sampled_from(sorted(REDUCE)), st.integers(0, 2),
                  expr_recipe(nvars + 1, depth - 1)))


@dataclass(frozen=True)
class Program:
    """A drawn program: its sizes, whether they are symbolic, and the body recipes."""

    n0: int
    n1: int
    symbolic: bool
    body: tuple
    second: tuple | None  # a second compute reading the first one, or None
    seed: int


programs = st.builds(
    Program, n0=st.integers(1, 4), n1=st.integers(1, 4), symbolic=st.booleans(),
    body=expr_recipe(2, 3), second=st.none() | expr_recipe(2, 2), seed=st.integers(0, 2**32 - 1))


# ------------------------------------------------------------------ building


class Env:
    """Placeholders and reduce axes of one program; built once, so rebuilding interns."""

    def __init__(self, p: Program):
        self.S0 = nf.size("S0") if p.symbolic else p.n0
        self.S1 = nf.size("S1") if p.symbolic else p.n1
        S0, S1 = self.S0, self.S1
        self.tensors = [nf.placeholder((S0, S1), name="a"), nf.placeholder((S1, S0), name="b"),
                        nf.placeholder((S0, S0), name="c")]
        self.axes = [nf.reduce_axis(S1, "r"), nf.reduce_axis(3, "u"), nf.reduce_axis(S0, "w")]
        self.sizes = {"S0": p.n0, "S1": p.n1}

    def feeds(self, seed: int, out: ir.Compute) -> dict:
        """Random inputs for the placeholders ``out`` reads."""
        rng = np.random.default_rng(seed)
        return {t.name: rng.uniform(-2, 2, tuple(self.sizes[str(s)] if isinstance(s, ir.Size)
                                                  else s for s in t.shape))
                for t in placeholders([out])}


def _fits(var_extent, extent) -> bool:
    """Whether a bare variable may index a dimension without a static bounds error."""
    if isinstance(var_extent, int) and isinstance(extent, int):
        return var_extent <= extent
    if isinstance(var_extent, ir.Size) and isinstance(extent, ir.Size):
        return var_extent is extent
    return True


def build_index(r, scope: list[ir.IndexVar], extent) -> ir.Expr:
    form, k = r
    v = scope[k]
    if form == "plain" and _fits(v.extent, extent):
        return v
    return {"plain": lambda: v % extent, "plus1": lambda: v + 1, "minus1": lambda: v - 1,
            "rev": lambda: (extent - 1) - v, "half": lambda: v // 2,
            "mod": lambda: v % extent, "zero": lambda: nf.const(0)}[form]()


def build_cond(r, scope, env: Env) -> ir.Expr:
    if r[0] == "cmp":
        return CMP[r[1]](build(r[2], scope, env), build(r[3], scope, env))
    if r[0] == "icmp":
        return CMP[r[1]](scope[r[2]], scope[r[3]] + r[4])
    if r[0] == "not":
        return ~build_cond(r[1], scope, env)
    a, b = build_cond(r[1], scope, env), build_cond(r[2], scope, env)
    return a & b if r[0] == "and" else a | b


def build(r, scope: list[ir.IndexVar], env: Env, extra=None) -> ir.Expr:
    """The expression a recipe describes, over the index variables in ``scope``."""
    kind = r[0]
    if kind == "const":
        return nf.const(r[1])
    if kind == "var":
        return nf.cast(scope[r[1] % len(scope)], "float32")
    if kind == "load":
        t = env.tensors[r[1]] if extra is None or r[1] != 2 else extra
        return t[tuple(build_index((f, k % len(scope)), scope, e)
                       for (f, k), e in zip(r[2], t.shape))]
    if kind == "un":
        return UNARY[r[1]](build(r[2], scope, env, extra))
    if kind == "bin":
        return BINARY[r[1]](build(r[2], scope, env, extra), build(r[3], scope, env, extra))
    if kind == "where":
        return nf.where(build_cond(r[1], scope, env), build(r[2], scope, env, extra),
                        build(r[3], scope, env, extra))
    assert kind == "red"
    free = [a for a in env.axes if a not in scope]
    if not free:  # every reduce axis is bound already: use the body as it is
        return build(r[3], scope + [scope[-1]], env, extra)
    ax = free[r[2] % len(free)]
    body = build(r[3], scope + [ax], env, extra)
    if ax not in body.free_vars:  # a reduction must use its axis
        body = body + nf.cast(ax, "float32") * 0.25
    return REDUCE[r[1]](body, ax)


def make(p: Program, env: Env) -> ir.Compute:
    # `+ a[i, j]` makes every program read an input, which binds the sizes.
    a = env.tensors[0]
    out = nf.compute((env.S0, env.S1), lambda i, j: build(p.body, [i, j], env) + a[i, j],
                     name="out")
    if p.second is None:
        return out
    # the second stage reduces over r, reading `out` (also where recipes load tensor 2)
    r = env.axes[0]
    return nf.compute((env.S0,), lambda i: nf.sum(build(p.second, [i, r], env, out) * out[i, r],
                                                  r), name="out2")


# ------------------------------------------------------------------ a naive interpreter

_NP_UNARY = {"neg": np.negative, "exp": np.exp, "exp2": np.exp2, "log": np.log,
             "log2": np.log2, "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x),
             "tanh": np.tanh, "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "abs": np.abs,
             "not": np.logical_not, "erf": np.vectorize(math.erf, otypes=[np.float64])}
_PY_BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b,
              "mul": lambda a, b: a * b, "div": lambda a, b: np.float64(a) / np.float64(b),
              "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b,
              "pow": lambda a, b: a ** b, "maximum": np.maximum, "minimum": np.minimum,
              "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
              "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
              "and": lambda a, b: a and b, "or": lambda a, b: a or b}


def _combine(op: str, vals: list):
    if op == "sum":
        return math.fsum(vals) if vals else 0.0
    if op == "prod":
        return math.prod(vals)
    if any(np.isnan(v) for v in vals):
        return math.nan
    ident = -math.inf if op == "max" else math.inf
    return (max if op == "max" else min)(vals, default=ident)


def naive(e: ir.Expr, env: dict, arrays: dict, sizes: dict):
    """Scalar value of ``e`` with index variables bound in ``env``; loops, no broadcasting."""
    def go(x, env):
        if isinstance(x, ir.Const):
            return x.value
        if isinstance(x, ir.IndexVar):
            return env[x]
        if isinstance(x, ir.Size):
            return sizes[x.name]
        if isinstance(x, ir.Load):
            arr = naive_tensor(x.tensor, arrays, sizes)
            idx = tuple(int(go(i, env)) for i in x.indices)
            if any(not 0 <= k < n for k, n in zip(idx, arr.shape)):
                return math.nan
            return arr[idx]
        if isinstance(x, ir.Unary):
            return _NP_UNARY[x.op](np.float64(go(x.x, env)) if x.op != "not" else go(x.x, env))
        if isinstance(x, ir.Binary):
            return _PY_BINARY[x.op](go(x.a, env), go(x.b, env))
        if isinstance(x, ir.Where):
            return go(x.a, env) if go(x.cond, env) else go(x.b, env)
        if isinstance(x, ir.Cast):
            return float(go(x.x, env))
        assert isinstance(x, ir.Reduce)
        ranges = [range(a.extent if isinstance(a.extent, int) else sizes[a.extent.name])
                  for a in x.axes]
        vals = [go(x.body, {**env, **dict(zip(x.axes, pt))}) for pt in itertools.product(*ranges)]
        return _combine(x.op, [float(v) for v in vals])
    return go(e, env)


def naive_tensor(t, arrays: dict, sizes: dict) -> np.ndarray:
    if t.name in arrays:
        return arrays[t.name]
    shape = tuple(s if isinstance(s, int) else sizes[s.name] for s in t.shape)
    out = np.empty(shape)
    for pt in itertools.product(*map(range, shape)):
        out[pt] = naive(t.body, dict(zip(t.axes, pt)), arrays, sizes)
    arrays[t.name] = out
    return out


# ------------------------------------------------------------------ properties


@SETTINGS
@given(programs)
def test_random_programs_print_verify_and_evaluate(p: Program):
    env = Env(p)
    out = make(p, env)
    text = str(out)
    assert f"{out.name}[" in text and "placeholder" in text
    nf.verify(out)
    feeds = env.feeds(p.seed, out)
    got = nf.evaluate(out, feeds)
    assert got.shape == ((p.n0, p.n1) if p.second is None else (p.n0,))
    assert got.dtype == np.float64
    assert np.all(np.isfinite(got) | np.isnan(got))
    again = nf.evaluate(out, feeds)
    np.testing.assert_array_equal(got, again)  # deterministic, NaN in the same places
    want = naive_tensor(out, dict(feeds), env.sizes)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9, equal_nan=True)


@SETTINGS
@given(programs)
def test_interning_makes_rebuilt_expressions_identical(p: Program):
    env = Env(p)
    i, j = nf.reduce_axis(env.S0, "i"), nf.reduce_axis(env.S1, "j")
    a, b = build(p.body, [i, j], env), build(p.body, [i, j], env)
    assert a is b
    assert str(a) == str(b)


@SETTINGS
@given(programs)
def test_inlining_preserves_the_value(p: Program):
    env = Env(p)
    out = make(p, env)
    flat_body = inline(out.body)
    flat = nf.compute(out.shape, lambda *ix: substitute(flat_body, dict(zip(out.axes, ix))),
                      name="flat")
    feeds = env.feeds(p.seed, out)
    np.testing.assert_allclose(nf.evaluate(flat, feeds), nf.evaluate(out, feeds),
                               rtol=1e-12, atol=1e-12, equal_nan=True)
