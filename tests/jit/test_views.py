"""Unit tests of the index maps (views, broadcasting), the rule table and the regions,
without compiling anything: the translation of each view is checked against torch on
random data through the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.dynamo.partition import regions
from neptune_fusion.dynamo.rules import RULES
from neptune_fusion.dynamo.views import Merges, Refused, broadcast, view_groups, view_index


def test_view_groups_pair_dimensions_of_equal_product():
    assert view_groups((2, 3, 4), (6, 4)) == [([0, 1], [0]), ([2], [1])]
    assert view_groups((1, 6, 1), (2, 3)) == [([1], [0, 1])]
    assert view_groups((4, 6), (3, 8)) == [([0, 1], [0, 1])]
    with pytest.raises(Refused, match="do not pair up"):
        view_groups((4, 6), (5, 5))


def test_split_of_a_merge_gives_the_parts_back():
    m = Merges()
    b, h = nf.reduce_axis(2, "b"), nf.reduce_axis(3, "h")
    lin = m.merge([b, h], [2, 3])
    assert m.split(lin, [2, 3]) == (b, h)
    parts = m.split(lin, [3, 2])   # another factorisation: // and %
    assert "//" in str(parts[0]) and "%" in str(parts[1])


@pytest.mark.parametrize("src,dst", [((2, 3, 4), (6, 4)), ((6, 4), (2, 3, 4)),
                                     ((4, 6), (3, 8)), ((1, 5, 1, 3), (5, 3)),
                                     ((5, 3), (1, 5, 3, 1))])
def test_view_index_reads_what_torch_reshape_reads(src, dst):
    x = nf.placeholder(src, name="x")
    m = Merges()
    y = nf.compute(dst, lambda *idx: x[view_index(m, idx, src, dst)], name="y")
    data = np.random.default_rng(0).standard_normal(src)
    got = nf.evaluate(y, {"x": data})
    np.testing.assert_array_equal(got, torch.from_numpy(data).reshape(dst).numpy())


def test_broadcast_index():
    i, j = nf.reduce_axis(4, "i"), nf.reduce_axis(5, "j")
    assert broadcast((i, j), (4, 1), (4, 5)) == (i, 0)
    assert broadcast((i, j), (5,), (4, 5)) == (j,)


def test_rule_table_kinds():
    kinds = {r.kind for r in RULES.values()}
    assert kinds == {"elementwise", "view", "source", "reduction", "contraction"}
    assert all(isinstance(op, torch._ops.OpOverload) for op in RULES)


def _graph(fn, *args):
    from torch.fx.experimental.proxy_tensor import make_fx
    return make_fx(fn)(*args).graph


def test_regions_end_at_a_2d_matmul_and_keep_masks():
    def fn(x, w, v):
        y = x @ w                      # a Linear: its output leaves the region
        keep = torch.ones(4, 4, dtype=torch.bool).tril()
        s = y.masked_fill(~keep, -1e9)
        return torch.exp(s - s.amax(-1, keepdim=True)) @ v

    g = _graph(fn, torch.randn(4, 8), torch.randn(8, 4), torch.randn(4, 3))
    regs = [r for r in regions(g) if r.outputs]
    first = next(r for r in regs if "mm" in r.ops and "amax" not in r.ops)
    chain = next(r for r in regs if "amax" in r.ops)
    assert [n.name for n in first.outputs] == ["mm"]
    assert "mm" in [n.name for n in chain.inputs]
    # the mask (ones -> tril -> not) is translated inside and not an output
    assert {"ones", "tril"} <= set(chain.ops)
    assert [n.target for n in chain.outputs] == [torch.ops.aten.mm.default]
