"""Unit tests of the IR: interning, free variables, traversals, printer, verifier, dtypes."""

from __future__ import annotations

import numpy as np
import pytest

import neptune_fusion as nf
from neptune_fusion.frontend.examples import plain_attention
from neptune_fusion.ir.dtypes import as_dtype, promote
from neptune_fusion.ir.graph import placeholders, tensors_in_order
from neptune_fusion.ir.nodes import Binary, Compute, Const, IndexVar, Load, Reduce, Where
from neptune_fusion.ir.traverse import inline, rewrite, substitute, walk
from neptune_fusion.ir.verify import verify_body


@pytest.fixture
def x():
    return nf.placeholder((4, 4), name="x")


@pytest.fixture
def axes():
    """Spatial-like axes i, j (reduce kind, for building free expressions) and r."""
    return nf.reduce_axis(4, "i"), nf.reduce_axis(4, "j"), nf.reduce_axis(4, "r")


# ------------------------------------------------------------------ interning


def test_structurally_equal_expressions_are_identical(x, axes):
    i, j, _ = axes
    a = nf.exp(x[i, j] * 2.0 + 1.0) / nf.sum(x[i, j], j)
    b = nf.exp(x[i, j] * 2.0 + 1.0) / nf.sum(x[i, j], j)
    assert a is b
    assert nf.const(1.5) is nf.const(1.5)
    assert (a == b) and not (a == a + 1.0)  # bool of == is structural identity
    assert {a: 1}[b] == 1 and a in [x[i, j], b]


def test_interning_keeps_distinct_things_distinct(x, axes):
    i, j, _ = axes
    assert nf.const(0.0) is not nf.const(-0.0)
    assert nf.const(1.0) is not nf.const(1.0, "float64")
    assert nf.const(1) is not nf.const(1.0)
    # two tensors (or axes) with the same name are different
    x2 = nf.placeholder((4, 4), name="x")
    assert x[i, j] is not x2[i, j]
    assert nf.reduce_axis(4, "k") is not nf.reduce_axis(4, "k")
    assert nf.size("N") is nf.size("N")


def test_constant_folding_and_weak_scalars(x, axes):
    i, j, _ = axes
    assert nf.const(2.0) + 3.0 is nf.const(5.0)
    h = nf.placeholder((4,), "float16", name="h")
    assert (h[i] * 0.5).dtype == nf.float16  # Python scalars take the other side's dtype
    assert (i * 2).dtype == nf.int64
    assert (i / 2).dtype == nf.float32       # true division of integers is float
    assert (i * 0.5).dtype == nf.float32
    assert (h[i] * x[i, j]).dtype == nf.float32


# ------------------------------------------------------------------ free variables


def test_free_vars(x, axes):
    i, j, r = axes
    assert x[i, j].free_vars == {i, j}
    assert nf.sum(x[i, j], j).free_vars == {i}
    assert nf.sum(nf.sum(x[i, j], j) * x[r, i], (i, r)).free_vars == frozenset()
    assert nf.const(1.0).free_vars == frozenset()
    assert (x[i + 1, j // 2] > 0.0).free_vars == {i, j}


# ------------------------------------------------------------------ substitute


def test_substitute_replaces_and_returns_self_when_unchanged(x, axes):
    i, j, r = axes
    e = x[i, j] + x[j, i]
    assert substitute(e, {i: nf.const(2)}) is x[2, j] + x[j, 2]
    assert substitute(e, {r: nf.const(2)}) is e
    assert substitute(e, {}) is e
    assert substitute(e, {x[j, i]: nf.const(1.0)}) is x[i, j] + 1.0


def test_substitute_respects_shadowing(x, axes):
    i, j, _ = axes
    e = nf.sum(x[i, j], j) * x[j, j]
    got = substitute(e, {j: nf.const(1)})
    assert got is nf.sum(x[i, j], j) * x[1, 1]  # the bound j is left alone


def test_substitute_avoids_capture(x, axes):
    i, j, _ = axes
    e = nf.sum(x[i, j], j)
    got = substitute(e, {i: j})  # the free j must not be captured by the binder j
    assert isinstance(got, Reduce)
    (new,) = got.axes
    assert new is not j and new.name == "j'" and new.extent == 4
    assert got.body is x[j, new]
    assert got.free_vars == {j}
    assert str(got) == "sum(x[j, j'], j')"


def test_substitute_keeps_renamed_bodies_apart():
    # Regression: the memo is keyed by ids; renamed bodies freed early let a later one
    # reuse an id and pick up another reduction's result.
    ts = [nf.placeholder((4, 4), name=f"t{n}") for n in range(6)]
    i, j = nf.reduce_axis(4, "i"), nf.reduce_axis(4, "j")
    for _ in range(20):
        e = nf.const(0.0)
        for t in ts:
            e = e + nf.sum(t[i, j], j)
        text = str(substitute(e, {i: j}))
        assert all(f"{t.name}[j, j']" in text for t in ts), text


def test_substitute_in_sibling_reductions(x, axes):
    # Regression: each reduction shadows a different key; results must not leak between them.
    i, j, _ = axes
    e = nf.sum(x[i, j], i) + nf.sum(x[i, j], j)
    got = substitute(e, {i: nf.const(1), j: nf.const(2)})
    assert got is nf.sum(x[i, 2], i) + nf.sum(x[1, j], j)


def test_substitute_matches_evaluation(rng):
    N = nf.size("N")
    x = nf.placeholder((N, N), name="x")
    j = nf.reduce_axis(N, "j")
    y = nf.compute((N,), lambda i: nf.sum(x[i, j], j), name="y")
    # z[j'] = y[j'] via substitution of y's body, with the index named like the binder
    z = nf.compute((N,), lambda j: substitute(y.body, {y.axes[0]: j}), name="z")
    xa = rng.standard_normal((3, 3))
    np.testing.assert_array_equal(nf.evaluate(z, {"x": xa}), xa.sum(axis=1))


# ------------------------------------------------------------------ inline, walk, rewrite


def test_inline_removes_compute_loads_and_keeps_the_value(rng):
    N = nf.size("N")
    x = nf.placeholder((N, N), name="x")
    j = nf.reduce_axis(N, "j")
    m = nf.compute((N,), lambda i: nf.max(x[i, j], j), name="m")
    e = nf.compute((N, N), lambda i, c: nf.exp(x[i, c] - m[i]), name="e")
    s = nf.compute((N,), lambda i: nf.sum(e[i, j] * m[j], j), name="s")
    body = inline(s.body)
    assert not any(isinstance(n, Load) and isinstance(n.tensor, Compute) for n in walk(body))
    flat = nf.compute((N,), lambda i: substitute(body, {s.axes[0]: i}), name="flat")
    feeds = {"x": rng.standard_normal((4, 4))}
    np.testing.assert_allclose(nf.evaluate(flat, feeds), nf.evaluate(s, feeds), rtol=1e-14)


def test_walk_visits_each_node_once_children_first(x, axes):
    i, j, _ = axes
    shared = x[i, j] * 2.0
    e = shared + nf.exp(shared)
    order = list(walk(e))
    assert order[-1] is e
    assert len(order) == len(set(map(id, order)))
    pos = {id(n): p for p, n in enumerate(order)}
    for n in order:
        assert all(pos[id(c)] < pos[id(n)] for c in n.children())
    assert sum(n is shared for n in order) == 1


def test_rewrite_bottom_up(x, axes):
    i, j, _ = axes
    e = x[i, j] * 2.0 + nf.exp(x[i, j] * 2.0)
    two_to_three = lambda n: nf.const(3.0) if n is nf.const(2.0) else None
    assert rewrite(e, two_to_three) is x[i, j] * 3.0 + nf.exp(x[i, j] * 3.0)
    assert rewrite(e, lambda n: None) is e


# ------------------------------------------------------------------ printer


@pytest.mark.parametrize("build, text", [
    (lambda a, b, c: (a + b) * c, "(a[i] + b[i]) * c[i]"),
    (lambda a, b, c: a + b * c, "a[i] + b[i] * c[i]"),
    (lambda a, b, c: a - (b - c), "a[i] - (b[i] - c[i])"),
    (lambda a, b, c: a - b - c, "a[i] - b[i] - c[i]"),
    (lambda a, b, c: a / (b * c), "a[i] / (b[i] * c[i])"),
    (lambda a, b, c: -(a + b), "-(a[i] + b[i])"),
    (lambda a, b, c: (-a) ** 2, "(-a[i]) ** 2.0"),
    (lambda a, b, c: -a ** 2, "-a[i] ** 2.0"),
    (lambda a, b, c: (a < b) & (b <= c) | ~(a == c),
     "(a[i] < b[i]) & (b[i] <= c[i]) | ~(a[i] == c[i])"),
    (lambda a, b, c: (a < b) == (b < c), "(a[i] < b[i]) == (b[i] < c[i])"),
    (lambda a, b, c: a + b < c, "a[i] + b[i] < c[i]"),
    (lambda a, b, c: nf.where(a > 0.0, b, -np.inf), "where(a[i] > 0.0, b[i], -inf)"),
    (lambda a, b, c: nf.maximum(a, b * 0.125), "maximum(a[i], b[i] * 0.125)"),
    (lambda a, b, c: nf.cast(a, "float64") * 2, "cast(a[i], float64) * 2.0"),
])
def test_printer_precedence(build, text):
    a, b, c = (nf.placeholder((3,), name=n) for n in "abc")
    i = nf.reduce_axis(3, "i")
    assert str(build(a[i], b[i], c[i])) == text


def test_printer_reductions_and_indices(x, axes):
    i, j, r = axes
    assert str(nf.sum(x[i, j], (i, j))) == "sum(x[i, j], (i, j))"
    assert str(nf.max(x[i - j, j // 2 + 1], j)) == "max(x[i - j, j // 2 + 1], j)"
    assert str(nf.min(x[(i + r) % 4, 0], r)) == "min(x[(i + r) % 4, 0], r)"


# ------------------------------------------------------------------ verifier


def test_verify_accepts_what_the_language_builds(x):
    [o], _ = plain_attention("N", "M", "D")
    nf.verify(o)
    nf.verify([o, o])


def _bad_compute(body_fn):
    i = IndexVar("i", 4, "spatial", 10**9)
    return Compute("bad", (4,), (i,), body_fn(i), 10**9 + 1)


def test_verify_rejects_wrong_index_count(x):
    bad = _bad_compute(lambda i: Load(x, (i,)))  # bypasses the checking constructor
    with pytest.raises(nf.VerificationError, match="'bad'.*1 indices for a 2-d tensor"):
        nf.verify(bad)


def test_verify_rejects_unbound_variable(x, axes):
    _, j, _ = axes
    bad = _bad_compute(lambda i: Load(x, (i, j)))
    with pytest.raises(nf.VerificationError, match="'bad'.*index variable\\(s\\) j"):
        nf.verify(bad)


def test_verify_rejects_reduce_over_spatial_axis(x):
    k = IndexVar("k", 4, "spatial", 10**9 + 2)
    bad = _bad_compute(lambda i: Reduce("sum", Load(x, (i, k)), (k,)))
    with pytest.raises(nf.VerificationError, match="binds k, not a reduce axis"):
        nf.verify(bad)


def test_verify_rejects_non_boolean_condition(x):
    bad = _bad_compute(lambda i: Where(Load(x, (i, i)), Const(1.0, nf.float32),
                                       Const(0.0, nf.float32)))
    with pytest.raises(nf.VerificationError, match="not boolean"):
        nf.verify(bad)


def test_verify_rejects_float_index(x):
    bad = _bad_compute(lambda i: Load(x, (i, Const(1.0, nf.float32))))
    with pytest.raises(nf.VerificationError, match="not an integer"):
        nf.verify(bad)


def test_verify_rejects_logic_on_non_booleans(x):
    zero = nf.const(0)
    bad = _bad_compute(lambda i: Where(Binary("and", Load(x, (i, i)), Load(x, (i, zero))),
                                       Load(x, (i, i)), Load(x, (i, zero))))
    with pytest.raises(nf.VerificationError, match="non-booleans"):
        nf.verify(bad)


def test_verify_body_rejects_a_compute_left_uninlined(x):
    c = nf.compute((4, 4), lambda i, j: x[i, j] * 2.0, name="c")
    i = IndexVar("i", 4, "spatial", 10**9 + 3)
    with pytest.raises(nf.VerificationError,
                       match="after canon: output 'o': .* reads the compute 'c'"):
        verify_body(Load(c, (i, i)), (i,), "after canon: output 'o'")


def test_verify_body_rejects_a_nested_binder_bound_again(x):
    i = IndexVar("i", 4, "spatial", 10**9 + 4)
    k = IndexVar("k", 4, "reduce", 10**9 + 5)
    inner = Reduce("max", Load(x, (i, k)), (k,))
    body = Reduce("sum", Binary("sub", Load(x, (i, k)), inner), (k,))
    with pytest.raises(nf.VerificationError, match="max inside sum binds k again"):
        verify_body(body, (i,), "after normalize: output 'o'")
    verify_body(Binary("add", inner, Load(x, (i, i))), (i,), "fine")


# ------------------------------------------------------------------ dtypes and graph


def test_dtypes():
    assert as_dtype("half") is nf.float16 and as_dtype("torch.bfloat16") is nf.bfloat16
    assert as_dtype(np.dtype("float64")) is nf.float64
    assert promote(nf.float16, nf.bfloat16) == nf.float32
    assert promote(nf.int32, nf.float16) == nf.float16
    assert promote(nf.bool_, nf.int32) == nf.int32


def test_tensors_in_dependency_order():
    [o], (q, k, v) = plain_attention(2, 3, 4)
    order = tensors_in_order([o])
    assert [t.name for t in order] == ["q", "k", "s", "m", "v", "l", "o"]
    assert placeholders([o]) == [q, k, v]


def _int_value(e, env):
    """An integer index expression's value (floored division, as Python's)."""
    if isinstance(e, Const):
        return e.value
    if isinstance(e, IndexVar):
        return env[e.name]
    assert isinstance(e, Binary), e
    a, b = _int_value(e.a, env), _int_value(e.b, env)
    ops = {"add": int.__add__, "sub": int.__sub__, "mul": int.__mul__,
           "floordiv": int.__floordiv__, "mod": int.__mod__}
    return ops[e.op](a, b)


def test_index_arithmetic_folds_to_the_same_values():
    """fold's index identities (``(x*m + y) // c``, ``(x*m + y) % c``, ``y % c`` below c,
    ``(x // c) * c + x % c``) give the same value at every index, and simpler trees;
    an index that may be negative is left alone, and so is ``y // c`` below c (a grouped
    query's key head ``h // group``, which the derivative reads as such)."""
    import itertools

    from neptune_fusion.ir.dtypes import int64
    from neptune_fusion.ir.fold import fold
    from neptune_fusion.ir.nodes import Binary, Const, IndexVar, Size
    i, j = IndexVar("i", Size("N"), "spatial", 901), IndexVar("j", 3, "spatial", 902)
    k = IndexVar("k", 20, "spatial", 903)

    def c(v):
        return Const(v, int64)

    def b(op, x, y):
        return Binary(op, x, y)
    cases = [
        (b("mod", b("add", b("mul", i, c(3)), j), c(3)), "j"),
        (b("floordiv", b("add", b("mul", i, c(3)), j), c(3)), "i + j // 3"),
        (b("floordiv", b("add", b("mul", i, c(6)), k), c(3)), "i * 2 + k // 3"),
        (b("mod", b("add", j, b("mul", c(12), i)), c(4)), "j"),
        (b("add", b("mul", b("floordiv", k, c(4)), c(4)), b("mod", k, c(4))), "k"),
        (b("mod", k, c(20)), "k"),
        (b("floordiv", j, c(5)), "j // 5"),   # kept: autodiff reads h // group
        (b("mod", b("sub", i, c(1)), c(3)), "(i - 1) % 3"),   # may be negative: kept
    ]
    for e, want in cases:
        got = fold(e)
        assert str(got) == want, (str(e), str(got))
        for iv, jv, kv in itertools.product(range(1, 7), range(3), range(20)):
            env = {"i": iv, "j": jv, "k": kv}
            assert _int_value(got, env) == _int_value(e, env), (str(e), env)
