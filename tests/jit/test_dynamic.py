"""Dynamic shapes through the backend (CPU, interpreter): a graph Dynamo compiles with
symbolic sizes is fused once and serves every size, each result checked against
float64; what cannot be taken falls back with the reason; nothing guards on a size."""

from __future__ import annotations

import copy

import pytest
import sympy
import torch
import torch.nn.functional as F

import neptune_fusion as nf
from neptune_fusion.bench.chains import CHAINS
from neptune_fusion.dynamo import Backend
from neptune_fusion.dynamo.refused import Refused
from neptune_fusion.dynamo.symbolic import to_ir
from neptune_fusion.dynamo.views import Merges, view_groups


def _run(fn, shapes, dynamic=True, make=torch.randn, rest="eager"):
    """``fn`` compiled with ``dynamic`` and called on inputs of each shape list; every
    result within float32 rounding of float64. Returns the backend (its reports)."""
    torch._dynamo.reset()
    backend = Backend(rest=rest)
    compiled = torch.compile(fn, backend=backend, dynamic=dynamic)
    for shape in shapes:
        args = [make(*s) for s in shape]
        with torch.no_grad():
            got = compiled(*args)
            want = fn(*[a.double() for a in args])
        assert got.shape == want.shape
        scale = max(1.0, float(want.abs().max()))
        assert float((got.double() - want).abs().max()) <= 2e-5 * scale, shape
    return backend


def _fused(backend):
    return [f for r in backend.reports for f in r.fused]


def _left(backend):
    return [x for r in backend.reports for x in r.left]


@pytest.mark.parametrize("fn", [
    lambda x: torch.logsumexp(x, -1),
    lambda x: torch.softmax(x, -1),
    lambda x: torch.log_softmax(x, 0),
    lambda x: x.var(-1),               # unbiased: divides by the dynamic size minus one
    lambda x: F.layer_norm(x, (x.shape[-1],)),
], ids=["logsumexp", "softmax", "log-softmax-dim0", "var", "layer-norm"])
def test_one_dynamic_graph_serves_every_size(fn):
    backend = _run(fn, [[(5, 40)], [(7, 300)], [(3, 33)], [(9, 17)]])
    assert len(backend.reports) == 1, "a size recompiled the graph"
    (fused,) = _fused(backend)
    assert "dyn_" in fused.plan   # the loop runs over Dynamo's symbol, bound at call time
    assert not _left(backend)
    assert "dynamic sizes s" in str(backend.reports[0])


def _decode(q, k, v):
    """Causal attention of the last queries over a cache, the mask built from the
    shapes (symbolic arithmetic ``m - n`` in the graph)."""
    s = (q @ k.transpose(-2, -1)) * 0.25
    n, m = s.shape[-2], s.shape[-1]
    i = torch.arange(n).view(n, 1) + (m - n)
    j = torch.arange(m).view(1, m)
    return torch.softmax(s.masked_fill(j > i, float("-inf")), -1) @ v


def test_a_growing_cache_compiles_twice_and_fuses_both():
    """Dynamo's default (``dynamic=None``): the first length static, the second makes the
    length dynamic; the third and later reuse that graph. The mask's offset is a
    symbolic int of the graph, read as a value (not reported as a cut)."""
    shapes = [[(1, 4, 2, 16), (1, 4, m, 16), (1, 4, m, 16)] for m in (30, 47, 64, 90)]
    backend = _run(_decode, shapes, dynamic=None)
    assert len(backend.reports) == 2
    assert len(_fused(backend)) == 2 and not _left(backend)
    assert "dyn_" in _fused(backend)[1].plan


def _gqa_decode(q, k, v):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    return torch.softmax((q @ k.transpose(-2, -1)) * 0.25, -1) @ v


def test_gqa_decode_with_a_dynamic_length_is_packed():
    shapes = [[(1, 8, 1, 16), (1, 2, m, 16), (1, 2, m, 16)] for m in (30, 47, 90)]
    backend = _run(_gqa_decode, shapes, dynamic=None)
    assert len(backend.reports) == 2
    assert all("GQA decode packed" in f.plan for f in _fused(backend))


def _causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_batch_heads_and_length_all_dynamic():
    """``dynamic=True``: batch, heads and length symbolic; ``bmm`` merges batch and heads
    (``b * H + h`` with a symbolic ``H``) and its result splits them back."""
    shapes = [[(b, h, n, 16)] * 3 for b, h, n in ((2, 3, 20), (3, 2, 33), (2, 4, 9))]
    backend = _run(_causal, shapes)
    assert len(backend.reports) == 1
    (fused,) = _fused(backend)
    assert "dyn_" in fused.plan and not _left(backend)


def test_an_expression_of_sizes_an_input_binds_is_an_extent():
    """A softmax over a flattened batch: the merged extent ``s0*s1`` is no input's
    dimension inside the region, so the reshape goes outside its kernel; there it is the
    kernel input's first dimension, bound at call time as a size of its own. The reason
    the whole region was refused is reported with the view left out."""
    def fn(x):
        return torch.softmax(x.reshape(-1, x.shape[-1]), -1)
    backend = _run(fn, [[(2, 3, 20)], [(3, 5, 33)], [(4, 2, 7)]])
    assert len(backend.reports) == 1
    (fused,) = _fused(backend)
    assert fused.inputs == ("view",) and "dyn_" in fused.plan, fused.plan
    (left,) = _left(backend)
    assert left.ops == ("view",)
    assert "expression of dynamic sizes that is no input's dimension" in left.reason


@pytest.mark.parametrize("affine,rest", [(True, "eager"), (False, "eager"),
                                         (True, "inductor")])
def test_group_norm_with_every_size_dynamic_fuses_on_its_group_view(affine, rest):
    """``nn.GroupNorm`` under ``dynamic=True``: the group view ``(N, G, C/G*H*W)`` taken
    outside the kernel, whose last dimension (``4*s0*s1``) binds the reduction's extent.
    Each result against float64; under Inductor too (the op's fake output takes the
    view's symbolic size)."""
    m = torch.nn.GroupNorm(4, 16, affine=affine).eval()
    if affine:
        with torch.no_grad():
            m.weight.normal_(generator=torch.Generator().manual_seed(2))
            m.bias.normal_(generator=torch.Generator().manual_seed(3))

    m64 = copy.deepcopy(m).double()

    def fn(x):   # the float64 reference of _run calls it with a float64 input
        return m64(x) if x.dtype == torch.float64 else m(x)
    shapes = [[(2, 16, 5, 5)], [(3, 16, 7, 4)], [(2, 16, 3, 9)]]
    backend = _run(fn, shapes, make=lambda *s: torch.randn(*s) * 2.0 + 1.0, rest=rest)
    fused = _fused(backend)
    assert fused and all({"mean", "rsqrt"} <= set(f.ops) for f in fused)
    assert "_x_" in fused[-1].plan, fused[-1].plan   # the product of sizes as an extent


def test_a_dynamic_extent_no_input_binds_falls_back_with_the_reason():
    """``x.repeat(1, 2)`` with a dynamic width cannot be in the kernel (its extent ``2*s0``
    is no input's dimension). It runs outside, where its result is the kernel's input,
    and the report gives the reason it was left out."""
    def fn(x):
        return torch.softmax(x.repeat(1, 2), -1)
    backend = _run(fn, [[(3, 20)], [(5, 33)]])
    assert len(_fused(backend)) == 1
    (left,) = _left(backend)
    assert left.ops == ("repeat",) and "dynamic counts or extents" in left.reason


def test_a_compiled_kernel_in_a_dynamic_graph_does_not_specialise():
    """``nf.compile``'s operator under ``torch.compile(dynamic=True)``: its fake outputs
    take the symbolic sizes without guarding on them, so one graph serves every shape."""
    outputs, inputs = CHAINS["logsumexp"].build("float32")
    kern = nf.compile(outputs[0], inputs, cache=False)
    graphs = []

    def count(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    torch._dynamo.reset()
    f = torch.compile(lambda t: kern(t) * 2, backend=count, dynamic=True)
    for n, m in ((5, 40), (7, 300), (3, 33)):
        t = torch.randn(n, m)
        want = 2 * torch.logsumexp(t.double(), 1)
        assert float((f(t).double() - want).abs().max()) < 1e-5
    assert len(graphs) == 1


# -- the pieces ---------------------------------------------------------------------------

def test_view_groups_pair_dynamic_dimensions_by_their_products():
    s0, s1 = sympy.symbols("s0 s1", positive=True, integer=True)
    hints = {s0: 3, s1: 5}
    assert view_groups((s0, s1, 4), (s0 * s1, 4), hints) == [([0, 1], [0]), ([2], [1])]
    assert view_groups((1, s0, 1), (s0,), hints) == [([1], [0])]
    with pytest.raises(Refused, match="do not pair up"):   # 15 == 15, but not as symbols
        view_groups((s0, s1), (s1 * 3,), {s0: 5, s1: 5})


def test_a_split_over_dynamic_sizes_is_only_a_merges_inverse():
    s1 = sympy.Symbol("s1", positive=True, integer=True)
    size = nf.size("dyn_s1")
    m = Merges(lambda n: size)
    b, h = nf.reduce_axis(2, "b"), nf.reduce_axis(size, "h")
    lin = m.merge([b, h], [2, s1])
    assert "dyn_s1" in str(lin)
    assert m.split(lin, [2, s1]) == (b, h)
    with pytest.raises(Refused, match="not the inverse of a merge"):
        m.split(b * 7 + h, [2, s1])


def test_size_expressions_translate_or_are_refused():
    s0 = sympy.Symbol("s0", positive=True, integer=True)
    size = nf.size("dyn_s0")
    assert str(to_ir(s0 - 1, {s0: size})) in ("dyn_s0 + -1", "-1 + dyn_s0")
    with pytest.raises(Refused, match="no input's dimension"):
        to_ir(s0, {})
    assert "maximum" in repr(to_ir(sympy.Max(0, s0 - 3), {s0: size}))
    with pytest.raises(Refused, match="not a sum, product, maximum or minimum"):
        to_ir(sympy.floor(s0 / 2), {s0: size})


def test_a_position_no_shape_gives_is_passed_as_a_tensor():
    """A sliding window whose first key is ``max(0, end - 3)`` for an int ``end`` that
    changes between calls (a decode step's position): Dynamo makes it a symbolic int that
    no input's shape gives, so the kernel gets it as a 0-d tensor. One graph serves every
    position, each result against float64; rows with every key masked stay out (eager
    gives NaN there)."""
    def windowed(q, k, v, end):
        s = (q @ k.transpose(-1, -2)) * 0.25
        pos = torch.arange(k.shape[-2])
        keep = (pos >= max(0, end - 3)) & (pos < end)
        return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v

    torch._dynamo.reset()
    backend = Backend(rest="eager")
    compiled = torch.compile(windowed, backend=backend, dynamic=True)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g) for n in (4, 12, 12))
    for end in (5, 2, 11, 12):
        with torch.no_grad():
            got = compiled(q, k, v, end)
        want = windowed(q.double(), k.double(), v.double(), end)
        assert float((got.double() - want).abs().max()) <= 2e-5 * float(want.abs().max())
    assert len(backend.reports) == 1, "a position recompiled the graph"
    (fused,) = _fused(backend)
    assert "bmm" in fused.ops and "amax" in fused.ops
