"""The column term's rewrite (codegen/mma_bias.py) as algebra, on the CPU.

The Gluon kernel that runs it needs a Hopper GPU (tests/codegen/test_gluon.py has the
GPU tests); here each form the rule accepts is rewritten and both sides are evaluated in
float64 at random points, the contraction's biased value standing for what the MMA step
computes: ``qk + (C / k) (j - j0)``.
"""

from __future__ import annotations

import numpy as np
import pytest

from neptune_fusion import ops
from neptune_fusion.codegen.gluon import shape_of
from neptune_fusion.codegen.mma_bias import BIASED, find
from neptune_fusion.codegen.program import I_FIRST, TILE_START
from neptune_fusion.fusion.plan import plan
from neptune_fusion.ir.dtypes import float32, int64
from neptune_fusion.ir.nodes import Binary, Cast, Const, Param, Unary
from neptune_fusion.ir.traverse import walk
from neptune_fusion.runtime.pipeline import build_programs
from neptune_fusion.schedule.schedule import Schedule


def _alibi():
    [o], ins = ops.definition("PF-ALiBi", "float16", 64, q_heads=2, kv_heads=2)
    [prog] = build_programs(plan([o]), ins, Schedule(block_m=128, block_n=128, num_warps=8,
                                                     num_stages=2), "alibi")
    return prog, shape_of(prog).qks[0]


def _value(e, env: dict) -> float:
    """``e`` in float64 with its leaves (and the contraction) bound by ``env``."""
    if e in env:
        return env[e]
    if isinstance(e, Const):
        return float(e.value)
    if isinstance(e, Cast):
        return _value(e.x, env)
    if isinstance(e, Unary) and e.op == "neg":
        return -_value(e.x, env)
    if isinstance(e, Binary):
        a, b = _value(e.a, env), _value(e.b, env)
        return {"add": a + b, "sub": a - b, "mul": a * b}[e.op]
    raise AssertionError(f"unbound {e}")


C = Param("c", float32)
K = 0.18033688011112042


def _forms(qk, j):
    f = lambda x: Cast(x, float32)   # noqa: E731
    k = Const(K, float32)
    add, mul, sub = (lambda a, b, op=op: Binary(op, a, b) for op in ("add", "mul", "sub"))
    return {
        "alibi": add(mul(qk, k), mul(C, f(sub(j, I_FIRST)))),
        "difference, j + 7": sub(mul(k, qk), mul(mul(C, Const(2.0, float32)),
                                                 f(add(j, Const(7, int64))))),
        "scale 1, 5 + j, term first": add(mul(C, f(add(Const(5, int64), j))), qk),
        "log2 e on the column": add(mul(qk, k), mul(C, mul(f(j), Const(1.4427, float32)))),
    }


@pytest.mark.parametrize("form", ["alibi", "difference, j + 7", "scale 1, 5 + j, term first",
                                  "log2 e on the column"])
def test_rewrite_is_the_same_value(form):
    prog, qk = _alibi()
    j = prog.loop.var
    e = _forms(qk, j)[form]
    bias = find([(qk, [e])], j, prog.row.var, lambda x: frozenset(), frozenset())
    assert bias is not None
    new = bias.apply(e, qk, j, prog.row.var)
    assert qk not in set(walk(new)) and j not in new.free_vars   # one value a tile
    rng = np.random.default_rng(5)
    for _ in range(200):
        c, q0, s0 = rng.normal() * 10.0 ** rng.uniform(-3, 2), rng.normal() * 30, \
            int(rng.integers(0, 10**6))
        j0 = int(rng.integers(0, 10**6)) // 128 * 128
        jj = j0 + int(rng.integers(0, 128))
        env = {C: c, I_FIRST: float(s0)}
        want = _value(e, {**env, qk: q0, j: float(jj)})
        u = _value(bias.coef, env) / bias.scale
        got = _value(new, {**env, TILE_START: float(j0), BIASED: q0 + u * (jj - j0)})
        assert got == pytest.approx(want, rel=1e-12, abs=1e-9 * (abs(c) * 1e6 + 1))


def test_no_rewrite_where_the_forms_disagree():
    """Two terms with different coefficients, or the contraction read outside the sum:
    refused (the one MMA step serves every read)."""
    prog, qk = _alibi()
    j, row = prog.loop.var, prog.row.var
    forms = _forms(qk, j)
    assert find([(qk, [forms["alibi"], forms["difference, j + 7"]])], j, row,
                lambda x: frozenset(), frozenset()) is None
    bare = Binary("mul", qk, Const(2.0, float32))
    assert find([(qk, [forms["alibi"], bare])], j, row, lambda x: frozenset(),
                frozenset()) is None
    state = Param("state:m", float32)
    reads_state = Binary("add", qk, Binary("mul", state, Cast(j, float32)))
    assert find([(qk, [reads_state])], j, row, lambda x: frozenset(),
                frozenset({state})) is None
