"""The tile program: roles, accumulators, speed rules and the loop partition, on the IR."""

from __future__ import annotations

import pytest

from algebra.chains import FUSABLE, tanh_chain
from neptune_fusion import ops
from neptune_fusion.algebra.synth import running
from neptune_fusion.codegen.exp2 import LOG2E, apply_exp2, to_exp2
from neptune_fusion.codegen.lower import lower
from neptune_fusion.codegen.patterns import match_contraction
from neptune_fusion.codegen.program import Accumulator, StateVar
from neptune_fusion.codegen.source import generate
from neptune_fusion.codegen.variants import partition_loop
from neptune_fusion.errors import CodegenError, ScheduleError
from neptune_fusion.frontend.examples import plain_attention
from neptune_fusion.fusion.plan import plan
from neptune_fusion.ir.fold import fconst
from neptune_fusion.ir.nodes import Binary, Load, Param, Reduce, Unary, Where
from neptune_fusion.ir.traverse import walk
from neptune_fusion.runtime.pipeline import build_programs
from neptune_fusion.schedule.schedule import Schedule, default_schedule, make_schedule

DEFAULT = Schedule()


def program(name="PF-Causal", schedule=DEFAULT, head_dim=64):
    [o], ins = ops.definition(name, "float16", head_dim, 4, 2 if name != "PF-Global" else 4)
    return rolling(o, ins, schedule)


def rolling(o, ins, schedule):
    """The finished rolling program (every stage of the pipeline up to the split)."""
    [prog] = build_programs(plan(o), ins, schedule, "fused_kernel")
    return prog


def loop_wheres(expr, loop):
    return {w for w in walk(expr) if isinstance(w, Where) and loop in w.cond.free_vars}


def test_roles_state_and_exp2_domain():
    p = program("PF-GQA")
    assert {a.name: a.role for a in p.axes} == {
        "h": "grid", "b": "grid", "i": "row", "j": "loop", "e": "col", "c": "inner"}
    assert [(s.name, s.roles, s.init) for s in p.state] == [
        ("m", ("row",), float("-inf")), ("l", ("row",), 0.0), ("o_sum", ("row", "col"), 0.0)]
    m, l, o_sum = p.accumulators  # noqa: E741
    assert (m.op, m.producers, m.scaled) == ("max", (), LOG2E)
    assert o_sum.producers == l.producers == (0,)
    assert any("exp2 domain" in r for r in p.rules)
    # every exp became exp2, with log2(e) folded into the score scale
    for seg in p.segments:
        for _, e in seg.body:
            assert not any(isinstance(x, Unary) and x.op == "exp" for x in walk(e))


def test_repair_factor_is_computed_once_per_row():
    p = program()
    seg = p.segments[0]
    body = dict((s.name, e) for s, e in seg.body)
    factors = []
    for name in ("l", "o_sum"):
        add = body[name]
        update = add.a if isinstance(add.b, Reduce) else add.b
        assert isinstance(update, Binary) and update.op == "mul"
        factors.append(update.b if update.a is p.state[[s.name for s in p.state].index(name)]
                       .param else update.a)
    assert factors[0] is factors[1]  # one alpha for l and o_sum (CSE keys on the node)
    assert p.loop.var not in factors[0].free_vars  # per row: it touches only the state


@pytest.mark.parametrize("name, segments", [
    ("PF-Global", [False, True]), ("PF-Causal", [False, True]),
    ("PF-Window", [True, False, True])])
def test_segments_and_masks(name, segments):
    p = program(name)
    assert [s.masked for s in p.segments] == segments
    for s in p.segments:
        wheres = set().union(*(loop_wheres(e, p.loop.var) for _, e in s.body))
        if s.masked:  # one select per tile serves every member
            assert len({w for w in wheres if w.dtype.is_float}) == 1
        else:         # interior tiles: no mask arithmetic at all
            assert wheres == set()


def test_even_extent_needs_no_boundary_loop():
    [o], ins = plain_attention(64, 128, 32, "float16")
    p = rolling(o, ins, Schedule(block_m=32, block_n=32))
    assert [s.masked for s in p.segments] == [False]
    p = rolling(o, ins, Schedule(block_m=32, block_n=32, partition=False))
    assert [s.masked for s in p.segments] == [True]


def test_stages_in_order():
    """``lower`` gives one unmasked loop over every tile; ``apply_exp2`` rewrites it in
    place (only when the schedule asks); ``partition_loop`` adds the masked loops. Each
    refuses a program past its place in the pipeline."""
    [o], ins = ops.definition("PF-Causal", "float16", 64, 4, 2)
    sched = Schedule(block_m=32, block_n=32)
    low = lower(plan(o), ins, sched)
    assert [(s.lo, s.hi, s.masked) for s in low.segments] == [("lo", "hi", False)]
    assert [n for n, _ in low.bounds] == ["lo", "hi"] and low.rules == ()
    assert apply_exp2(lower(plan(o), ins, Schedule(exp2=False))).rules == ()
    fast = apply_exp2(low)
    assert fast.accumulators[0].scaled == LOG2E and len(fast.segments) == 1
    done = partition_loop(fast)
    assert [s.masked for s in done.segments] == [False, True]   # interior, diagonal
    assert done.rules[:-1] == fast.rules and done.rules[-1].startswith("loop partition")
    assert generate(done) == generate(rolling(o, ins, sched))   # the pipeline's stages
    with pytest.raises(CodegenError, match="partitioned once"):
        partition_loop(done)
    with pytest.raises(CodegenError, match="only before the loop partition"):
        apply_exp2(done)


def test_contraction_patterns():
    p = program()
    role = {a.var: a.role for a in p.axes}.get

    def tile_roles(e):  # the tile axes (row, loop, col, inner) an expression spans
        return frozenset(r for v in e.free_vars if (r := role(v)) not in (None, "grid"))

    found = []
    for _, e in p.segments[0].body:
        for x in walk(e):
            if isinstance(x, Reduce):
                c = match_contraction(x, role, tile_roles)
                if c is not None:
                    found.append((c.x, c.y, role(c.k)))
    assert ("row", "loop", "inner") in found  # q . k
    assert ("row", "col", "loop") in found    # p . v
    loads = [x for x in walk(p.segments[0].body[2][1]) if isinstance(x, Load)]  # o_sum's
    assert {ld.tensor.name for ld in loads} == {"q", "k", "v"}


def test_exp2_rule_refuses_a_producer_read_outside_exp():
    st = lambda n: (StateVar(n, Param(f"state:{n}", fconst(0).dtype), ("row",), 0.0),)  # noqa
    x = Param("x", fconst(0).dtype)
    prod = Accumulator("m", "max", (), (x,), (), st("m"))
    cons = Accumulator("t", "sum", (0,), (Binary("mul", x, running(0)),), (), st("t"))
    accs, _, notes = to_exp2((prod, cons), ())
    assert accs[0].scaled == 1.0 and not any("domain" in n for n in notes)


@pytest.mark.parametrize("bn", [16, 64])   # looped (ragged last tile) and one tile
def test_a_maximum_output_is_exact_beside_its_exp_consumers(bn):
    """``[max_k x, sum_k exp(x - max)]``: the maximum is an output, so it is not kept in
    the exp2 domain (``m2 / log2 e`` is off by an ulp; amax's backward, which counts the
    elements equal to it, then found none and gave NaN gradients through the
    torch.compile backend). Bit-equal to ``torch.amax``; the sum still exp2-fused."""
    import torch

    import neptune_fusion as nf
    n = nf.size("N")
    x = nf.placeholder((n, 50), name="x")
    k = nf.reduce_axis(50, "k")
    m = nf.compute((n,), lambda i: nf.max(x[i, k], k), name="m")
    l = nf.compute((n,), lambda i: nf.sum(nf.exp(x[i, k] - m[i]), k), name="l")  # noqa: E741
    kern = nf.compile([m, l], schedule=Schedule(block_m=1, block_n=bn, num_warps=1),
                      cache=False)
    assert "tl.exp2(" in kern.source and not any("m kept in the exp2" in r
                                                   for r in kern.program.rules)
    xs = torch.randn(64, 50, generator=torch.Generator().manual_seed(0)) * 3
    got_m, got_l = kern(xs)
    assert torch.equal(got_m, xs.amax(1))
    want = torch.exp(xs.double() - xs.double().amax(1, keepdim=True)).sum(1)
    torch.testing.assert_close(got_l.double(), want, rtol=1e-5, atol=0)


def test_a_fused_prod_consumer_lowers(rng):
    """prod_k exp(x * r / 4) with r = max: the product state, repaired, in one loop."""
    import numpy as np
    import torch

    import neptune_fusion as nf
    outs, feeds = FUSABLE["prod_chain"]()
    kernel = nf.compile(outs, schedule=Schedule(block_m=16, block_n=16), cache=False)
    assert "_nf_prod(" in kernel.source
    f = feeds(rng)
    got = kernel(torch.tensor(f["x"], dtype=torch.float32))
    np.testing.assert_allclose(got[0].double().numpy(), nf.evaluate(outs, f)[0], rtol=1e-5)


def _per_batch():
    """max over a row of w[b], then a tanh-sum per row of x[b, i]: rows b, then i."""
    import neptune_fusion as nf
    B, N, M = nf.sizes("B N M")
    w = nf.placeholder((B, M), name="w")
    x = nf.placeholder((B, N, M), name="x")
    j = nf.reduce_axis(M, "j")
    m = nf.compute((B,), lambda b: nf.max(w[b, j], j), name="m")
    return [nf.compute((B, N), lambda b, i: nf.sum(nf.tanh(x[b, i, j] - m[b]), j),
                       name="t")], None


@pytest.mark.parametrize("chain, why", [
    (_per_batch, r"not single-pass \(t reads the final m: .*\) and its passes are not "
                 r"phases of one kernel: t is per b and i, the chain per b \(different "
                 r"rows: a column of symbolic extent N is not held in registers\)")])
def test_unsupported_plans_say_why(chain, why):
    outs, _ = chain()
    from neptune_fusion.ir.graph import placeholders
    with pytest.raises(CodegenError, match=why):
        rolling(outs, placeholders(outs), Schedule())


def test_an_unfusable_chain_lowers_to_phases():
    outs, _ = tanh_chain()
    from neptune_fusion.ir.graph import placeholders
    prog = rolling(outs, placeholders(outs), Schedule())
    assert prog.phases == 2 and [a.name for a in prog.accumulators] == ["max0", "t"]


@pytest.mark.parametrize("options, text", [
    (dict(block_m=24), "block_m must be a power of two"),
    (dict(block_n=24), "block_n must be a power of two in \\[1, "),
    (dict(block_m=1 << 21), "block_m must be a power of two in"),
    (dict(num_warps=3), "num_warps"),
    (dict(num_stages=0), "num_stages"),
    (dict(fp32_precision="tf64"), "fp32_precision"),
    (dict(blocks=3), "unknown option"),
])
def test_schedule_errors(options, text):
    with pytest.raises(ScheduleError, match=text):
        make_schedule(**options)


def test_schedule_is_plain_data():
    s = Schedule(block_m=64, exp2=False)
    assert Schedule.from_dict(s.to_dict()) == s
    assert default_schedule(128) == Schedule()
    assert default_schedule(128, 1).block_m == 16
    assert default_schedule(64, itemsize=4).num_stages == 2
    with pytest.raises(ScheduleError, match="unknown field"):
        Schedule.from_dict({"block_k": 3})


def test_shifted_row_index_lowers_only_when_provably_inside():
    """``x[i + 1]`` over symbolic rows could read past the tensor (the tile mask covers
    only ``i``): rejected, naming the index; ``h * group + i`` with constant extents is
    provably inside and lowers (packed GQA decode's slopes)."""
    import torch

    import neptune_fusion as nf
    from neptune_fusion.codegen.tiles import index_range
    from neptune_fusion.ir.dtypes import int64
    from neptune_fusion.ir.nodes import Const, IndexVar
    n_, m_ = nf.sizes("N M")
    x = nf.placeholder((n_, m_), name="x")
    j = nf.reduce_axis(m_, "j")
    mx = nf.compute((n_,), lambda i: nf.max(x[i, j], j), name="mx")
    out = nf.compute((n_,), lambda i: nf.sum(nf.exp(x[i, j] - mx[i]) * x[i + 1, j], j),
                     name="out")
    with pytest.raises(CodegenError, match=r"index i \+ 1 of 'x' mixes tile axes"):
        nf.compile(out, [x], schedule=Schedule(block_m=16, block_n=16))(torch.randn(5, 20))
    h, i = IndexVar("h", 8, "spatial", -1), IndexVar("i", 4, "spatial", -2)
    assert index_range(Binary("add", Binary("mul", h, Const(4, int64)), i)) == (0, 31)
    r = IndexVar("r", n_, "spatial", -3)
    assert index_range(Binary("add", r, Const(1, int64))) is None


@pytest.mark.parametrize("schedule", ["auto", dict(block_m=16, block_n=16, block_col=64,
                                                   num_warps=4, num_stages=2)])
def test_last_row_of_a_symbolic_dimension_is_read_masked(schedule):
    """The LM head of ``logits_to_keep=1`` as the torch.compile backend translates a
    static graph: RMSNorm of ``x[i + 7]`` (a row of one: the sequence's last position,
    at a constant offset) into a 300-column projection. The offset's range is known,
    the dimension is a size argument: the load is masked by ``i + 7 < N`` (before, every
    schedule was refused, on the H200 too). Whole-column and column-tiled schedules
    against float64; a tensor too short for the offset reads zeros, never past its end."""
    import numpy as np
    import torch

    import neptune_fusion as nf
    n_, d_ = nf.sizes("N D")
    x, w = nf.placeholder((n_, d_), name="x"), nf.placeholder((300, d_), name="W")
    c, r = nf.reduce_axis(d_, "c"), nf.reduce_axis(d_, "r")
    ms = nf.compute((1,), lambda i: nf.sum(x[i + 7, r] * x[i + 7, r], r) / 16.0, name="ms")
    out = nf.compute((1, 300), lambda i, o: nf.sum(x[i + 7, c] * nf.rsqrt(ms[i] + 1e-6)
                                                   * w[o, c], c), name="out")
    xs, ws = torch.randn(8, 16) + 0.5, torch.randn(300, 16)
    want = nf.evaluate(out, {"x": xs.double().numpy(), "W": ws.double().numpy()})
    kernel = nf.compile(out, [x, w], schedule=schedule, cache=False)
    np.testing.assert_allclose(kernel(xs, ws).double().numpy(), want, rtol=2e-5,
                               atol=2e-5 * np.abs(want).max())
    assert float(kernel(xs[:5], ws).abs().max()) == 0.0


def test_the_exp2_domain_reaches_through_float_casts():
    """A traced half-precision graph scores in float16 and casts to float32 around the
    exponential (``exp(float(half(q.k * c)) - float(m))``, as SDPA's decomposition under the
    torch.compile backend reads): the kernels compute every float in float32, so the
    rule still keeps the maximum in the exp2 domain and folds ``log2 e`` into ``c`` --
    one multiply per element fewer than ``x * c * log2 e - m * log2 e``."""
    import torch

    import neptune_fusion as nf
    n = nf.size("N")
    q = nf.placeholder((n, 16), dtype="float16", name="q")
    kk = nf.placeholder((50, 16), dtype="float16", name="k")
    c, k = nf.reduce_axis(16, "c"), nf.reduce_axis(50, "j")
    s = nf.compute((n, 50), lambda i, j: nf.cast(
        nf.sum(q[i, c] * kk[j, c], c) * 0.3, "float16"), name="s")
    m = nf.compute((n,), lambda i: nf.max(s[i, k], k), name="m")
    l = nf.compute((n,), lambda i: nf.sum(nf.exp(  # noqa: E741
        nf.cast(s[i, k], "float32") - nf.cast(m[i], "float32")), k), name="l")
    kern = nf.compile(l, schedule=Schedule(block_m=16, block_n=16, num_warps=1),
                      cache=False)
    assert any("m kept in the exp2" in r for r in kern.program.rules)
    assert repr(LOG2E) not in kern.source and repr(0.3 * LOG2E) in kern.source
    gen = torch.Generator().manual_seed(3)
    qs, ks = (torch.randn(64, 16, generator=gen).half(), torch.randn(50, 16, generator=gen).half())
    sd = (qs.double() @ ks.double().T * 0.3).half().double()
    want = torch.exp(sd - sd.amax(1, keepdim=True)).sum(1)
    torch.testing.assert_close(kern(qs, ks).double(), want, rtol=2e-3, atol=0)


def test_linear_form_keeps_a_division_by_zero_as_a_term():
    """``x / 0.0`` (a constant a derived expression can hold in a branch never taken)
    is a term of its own, not a coefficient 1/0: the linear form raised
    ZeroDivisionError and the kernel did not build (a fuzzing find, 2026-12-05)."""
    from neptune_fusion.codegen.exp2 import linear
    x = Param("x", fconst(0).dtype)
    term = Binary("div", x, fconst(0.0))
    terms, const = linear(Binary("add", Binary("mul", term, fconst(2.0)), fconst(1.0)))
    assert terms == {term: 2.0} and const == 1.0
