"""Every op of the IR has a row in every backend's table, and the rows agree.

The IR's ops are the tuples of ``neptune_fusion.ir.nodes``. Adding one there without a row
in the reference interpreter (which the fused reference evaluates through), constant
folding, the code generator or ``merge_partials`` fails here, naming the backend; so does a
reducer without a row in the reducer table (``ir/reducers.py``, which every backend reads
for identities and combines) or without a decision in the code generator.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from neptune_fusion.codegen import triton_ops as codegen
from neptune_fusion.ir import fold, nodes
from neptune_fusion.ir.dtypes import float32
from neptune_fusion.ir.nodes import Binary, Param
from neptune_fusion.ir.reducers import EXTRAPOLATED, REDUCERS, STATE, combined_with
from neptune_fusion.reference import interp
from neptune_fusion.runtime import merge

IR_UNARY = set(nodes.UNARY_OPS)
IR_BINARY = set(nodes.ARITH_OPS + nodes.CMP_OPS + nodes.LOGIC_OPS)

# backend -> (its unary ops, its binary ops)
BACKENDS = {
    "reference interpreter": (set(interp.UNARY), set(interp.BINARY)),
    "constant folding": (set(fold.UNARY), set(fold.BINARY)),
    "code generator": (set(codegen.TL_UNARY) | (codegen.LOWERED_BY_METHOD & IR_UNARY),
                       set(codegen.TL_BINARY) | (codegen.LOWERED_BY_METHOD & IR_BINARY)),
    "merge_partials": (set(merge.TORCH_UNARY), set(merge.TORCH_BINARY)),
}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_elementwise_op_has_a_row(backend):
    unary, binary = BACKENDS[backend]
    assert not IR_UNARY - unary, f"{backend}: no row for unary {sorted(IR_UNARY - unary)}"
    assert not IR_BINARY - binary, f"{backend}: no row for binary {sorted(IR_BINARY - binary)}"
    stale = (unary - IR_UNARY) | (binary - IR_BINARY)
    assert not stale, f"{backend}: rows for ops the IR does not have: {sorted(stale)}"


def test_ops_lowered_by_a_method_are_ops():
    assert codegen.LOWERED_BY_METHOD <= IR_UNARY | IR_BINARY


def test_every_reducer_has_a_row():
    missing = set(nodes.REDUCE_OPS) - set(REDUCERS)
    assert not missing, f"ir/reducers.py: no row for reducer(s) {sorted(missing)}"
    assert set(REDUCERS) <= set(nodes.REDUCE_OPS), "ir/reducers.py: rows the IR lacks"
    lowered, refused = set(codegen.REDUCE_OPS), codegen.NOT_LOWERED
    assert lowered | refused == set(nodes.REDUCE_OPS) and not lowered & refused, \
        "the code generator must lower each reducer or say it does not"


@pytest.mark.parametrize("op", sorted(REDUCERS))
def test_reducer_rows_agree_across_backends(op):
    r = REDUCERS[op]
    assert r.name == op and r.running in (STATE, EXTRAPOLATED) and isinstance(r.safe, bool)
    assert r.combine in nodes.ARITH_OPS
    # the same combine in every backend's terms
    assert interp.BINARY[r.combine] is r.ufunc
    assert merge.TORCH_BINARY[r.combine] == r.torch
    a, b = 2.5, -1.25
    want = fold.BINARY[r.combine](a, b)
    assert r.ufunc(a, b) == want
    assert getattr(torch, r.torch)(torch.tensor(a), torch.tensor(b)).item() == want
    assert r.formula.format(a="a", b="b") != r.formula and "{a}" in r.formula \
        and "{b}" in r.formula
    # the identity is one: numerically, for NumPy, and for the folding rules
    assert r.ufunc(r.identity, a) == a
    assert r.ufunc.identity is None or r.ufunc.identity == r.identity
    x = Param("x", float32)
    assert fold.fold(Binary(r.combine, fold.fconst(r.identity), x)) is x
    assert interp.reduce_array(op, np.zeros((0, 3)), (0,)).tolist() == [r.identity] * 3


def test_the_reducer_of_a_repaired_consumer():
    assert combined_with("max", None) == "max"
    assert combined_with("max", "inversion") == "max"
    assert combined_with("max", "augmented") == "sum"


_POINTS = {"float": [(1.5, 0.4), (-2.0, 3.0)], "int": [(7, 3), (-7, 3)],
           "bool": [(True, False), (True, True)]}


def _kind(op: str) -> str:
    if op in nodes.LOGIC_OPS or op == "not":
        return "bool"
    return "int" if op in ("floordiv", "mod") else "float"


@pytest.mark.parametrize("op", sorted(IR_UNARY | IR_BINARY))
def test_backends_agree_on_each_op(op):
    """The reference, constant folding and merge_partials compute the same value."""
    unary = op in IR_UNARY
    for a, b in _POINTS[_kind(op)]:
        args = (a,) if unary else (a, b)
        if op in ("log", "log2", "sqrt", "rsqrt"):
            args = (abs(a),)
        ref = (interp.UNARY if unary else interp.BINARY)[op](*(np.asarray(v) for v in args))
        folded = (fold.UNARY if unary else fold.BINARY)[op](*args)
        fn = getattr(torch, (merge.TORCH_UNARY if unary else merge.TORCH_BINARY)[op])
        got = fn(*(torch.tensor(v) for v in args))
        assert math.isclose(float(ref), float(folded), rel_tol=1e-12), (op, args)
        assert math.isclose(float(ref), float(got), rel_tol=1e-6), (op, args)
