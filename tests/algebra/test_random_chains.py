"""Random chains around a producer: each gets a proved repair that evaluates right, or a
stated reason and a correct multi-pass evaluation. Never a wrong fused answer."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import neptune_fusion as nf

D = 9
N = nf.size("N")
X = nf.placeholder((N, D), name="x")
Y = nf.placeholder((N, D), name="y")

LEAVES = ("c", "c2", "r", "r", "const")
UNARY = ("exp", "tanh", "neg", "square", "abs")
BINARY = ("add", "sub", "mul")


@st.composite
def trees(draw, depth=3):
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        leaf = draw(st.sampled_from(LEAVES))
        return ("const", draw(st.sampled_from((0.5, 2.0, 3.0)))) if leaf == "const" else (leaf,)
    if draw(st.booleans()):
        return (draw(st.sampled_from(UNARY)), draw(trees(depth=depth - 1)))
    return (draw(st.sampled_from(BINARY)), draw(trees(depth=depth - 1)),
            draw(trees(depth=depth - 1)))


def build(tree, c, c2, r):
    kind = tree[0]
    if kind == "c":
        return c
    if kind == "c2":
        return c2
    if kind == "r":
        return r
    if kind == "const":
        return nf.const(tree[1])
    if kind in UNARY:
        a = build(tree[1], c, c2, r)
        return {"exp": lambda: nf.exp(a * 0.25), "tanh": lambda: nf.tanh(a),
                "neg": lambda: -a, "square": lambda: a * a, "abs": lambda: nf.abs(a)}[kind]()
    a, b = build(tree[1], c, c2, r), build(tree[2], c, c2, r)
    return {"add": a + b, "sub": a - b, "mul": a * b}[kind]


def uses(tree, leaf):
    return tree[0] == leaf or any(isinstance(t, tuple) and uses(t, leaf) for t in tree[1:])


REDUCE = {"sum": nf.sum, "max": nf.max, "min": nf.min}


@settings(max_examples=int(__import__("os").environ.get("NF_HYPO", "40")), deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(tree=trees(), producer=st.sampled_from(sorted(REDUCE)),
       consumer=st.sampled_from(sorted(REDUCE)), tile=st.integers(1, 5),
       splits=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_random_chain_is_repaired_or_explained(tree, producer, consumer, tile, splits, seed):
    if not (uses(tree, "r") and (uses(tree, "c") or uses(tree, "c2"))):
        return  # not a chain: nothing to repair
    k1, k2 = nf.reduce_axis(D, "k"), nf.reduce_axis(D, "k")
    prod = nf.compute((N,), lambda i: REDUCE[producer](X[i, k1], k1), name="p")
    out = nf.compute((N,), lambda i: REDUCE[consumer](
        build(tree, X[i, k2], Y[i, k2], prod[i]), k2), name="out")
    plan = nf.plan(out)
    if plan.single_pass:
        assert all(m.repair is not None for g in plan.groups for m in g.consumers)
    else:
        assert plan.unfused and all(u.reason for u in plan.unfused)
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.uniform(0.5, 1.5, (3, D))}
    if uses(tree, "c2"):
        feeds["y"] = rng.uniform(-1.0, 1.0, (3, D))
    want = nf.evaluate(out, feeds)
    for mode, kw in (("rolling", {"tile": tile}), ("split", {"splits": splits})):
        got = nf.evaluate(out, feeds, mode=mode, **kw)
        np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-9,
                                   err_msg=f"{mode} {kw}\n{plan}")


def test_found_chain_with_a_hyperbolic_repair():
    """Found by the test above: SymPy folded the repair of sum(tanh(r) + c + c2 * r + c)
    under a max producer into cosh(...), which must lower (as exponentials) and agree."""
    k1, k2 = nf.reduce_axis(D, "k"), nf.reduce_axis(D, "k")
    tree = ("add", ("add", ("tanh", ("r",)), ("c",)), ("add", ("mul", ("c2",), ("r",)), ("c",)))
    prod = nf.compute((N,), lambda i: nf.max(X[i, k1], k1), name="p")
    out = nf.compute((N,), lambda i: nf.sum(build(tree, X[i, k2], Y[i, k2], prod[i]), k2),
                     name="out")
    nf.plan(out)      # raised "cannot lower cosh" before
    rng = np.random.default_rng(0)
    feeds = {"x": rng.uniform(0.5, 1.5, (3, D)), "y": rng.uniform(-1.0, 1.0, (3, D))}
    want = nf.evaluate(out, feeds)
    for mode, kw in (("rolling", {"tile": 2}), ("split", {"splits": 3})):
        np.testing.assert_allclose(nf.evaluate(out, feeds, mode=mode, **kw), want,
                                   rtol=1e-7, atol=1e-9)


def test_sympy_internal_failure_is_a_failed_proof():
    """Found by the random chains: simplifying |x * max x| crashed inside SymPy
    (``KeyError: zoo``); a failed derivation must leave the chain unfused, explained."""
    k1, k2 = nf.reduce_axis(D, "k"), nf.reduce_axis(D, "k")
    p = nf.compute((N,), lambda i: nf.max(X[i, k1], k1), name="p")
    out = nf.compute((N,), lambda i: nf.max(nf.exp(nf.abs(X[i, k2] * p[i]) / 4), k2),
                     name="out")
    plan = nf.plan(out)
    assert not plan.single_pass and plan.unfused
    assert "out" in str(plan)
