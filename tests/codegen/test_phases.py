"""Phased tile programs: a chain that is not single-pass, over one reduction axis of one
row, lowered to one kernel whose loops run one after the other (codegen/lower.py), each
kernel checked against the float64 reference on fresh random data, ragged lengths."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

import neptune_fusion as nf
from algebra.test_random_chains import build, trees, uses
from neptune_fusion.codegen.exp2 import LOG2E
from neptune_fusion.codegen.lower import check_phased, lower
from neptune_fusion.codegen.outline import outline
from neptune_fusion.codegen.source import generate
from neptune_fusion.codegen.split import split_programs
from neptune_fusion.errors import UnschedulableError, VerificationError
from neptune_fusion.fusion.plan import plan
from neptune_fusion.ir.graph import placeholders
from neptune_fusion.ir.nodes import Binary, Param
from neptune_fusion.ir.traverse import walk
from neptune_fusion.runtime.kernel import Kernel
from neptune_fusion.runtime.pipeline import build_programs
from neptune_fusion.runtime.staged import StagedKernel
from neptune_fusion.schedule.schedule import Schedule

SMALL = Schedule(block_m=16, block_n=16, num_warps=4, num_stages=2)


def _sizes(n, m):
    """``(N, M)``: symbolic when ``n`` is None, else the ints."""
    return nf.sizes("N M") if n is None else (n, m)


def tanh_sum(n=None, m=None):
    N, M = _sizes(n, m)
    x = nf.placeholder((N, M), name="x")
    j = nf.reduce_axis(M, "j")
    return [nf.compute((N,), lambda i: nf.sum(nf.tanh(x[i, j] - nf.max(x[i, j], j)), j),
                       name="t")]


def scaled_then_tanh(n=None, m=None, dot=False):
    """Phase 0 fuses a softmax denominator; phase 1 reads both through tanh: ``sum_j
    tanh(exp(x - m) / l)``. With ``dot``, ``x = a . b`` (scores of a contraction, whose
    max the exp2 rule keeps scaled); else ``x`` is an input (its max stays natural)."""
    N, M = _sizes(n, m)
    j = nf.reduce_axis(M, "j")
    if dot:
        a, b = nf.placeholder((N, 4), name="a"), nf.placeholder((M, 4), name="b")
        c = nf.reduce_axis(4, "c")
        x = nf.compute((N, M), lambda i, t: nf.sum(a[i, c] * b[t, c], c) * 0.5, name="x")
    else:
        x = nf.placeholder((N, M), name="x")
    mx = nf.compute((N,), lambda i: nf.max(x[i, j], j), name="m")
    lv = nf.compute((N,), lambda i: nf.sum(nf.exp(x[i, j] - mx[i]), j), name="l")
    return [nf.compute((N,), lambda i: nf.sum(nf.tanh(nf.exp(x[i, j] - mx[i]) / lv[i]), j),
                       name="t")]


def causal_second(n=None):
    """An unmasked max, then a causal tanh-sum: the phases' loops have different bounds."""
    N = nf.size("N") if n is None else n
    x = nf.placeholder((N, N), name="x")
    j = nf.reduce_axis(N, "j")
    mx = nf.compute((N,), lambda i: nf.max(x[i, j], j), name="m")
    return [nf.compute((N,), lambda i: nf.sum(
        nf.where(j <= i, nf.tanh(x[i, j] - mx[i]), 0.0), j), name="t")]


def _run(outs, schedule, x: np.ndarray, rtol=2e-5):
    kernel = nf.compile(outs[0], placeholders(outs), schedule=schedule, cache=False)
    assert isinstance(kernel, Kernel) and len(kernel.kernels) == 1
    got = kernel(torch.tensor(x, dtype=torch.float32))
    want = nf.evaluate(outs[0], {"x": x})
    np.testing.assert_allclose(got.double().numpy(), want, rtol=rtol,
                               atol=rtol * max(1.0, float(np.abs(want).max())))
    return kernel


def _program(outs, schedule=SMALL, name="k"):
    [prog] = build_programs(plan(outs), placeholders(outs), schedule, name)
    return prog


# ------------------------------------------------------------------ the program (data)
def test_phases_are_data_of_one_program():
    prog = _program(tanh_sum())
    assert prog.phases == 2
    assert [a.phase for a in prog.accumulators] == [0, 1]
    assert [s.name for s in prog.phase_state(0)] == ["max0"]
    assert [s.name for s in prog.phase_state(1)] == ["t"]
    assert [s.phase for s in prog.segments] == [0, 0, 1, 1]
    # phase 1 reads the final max as a plain value: its state parameter, no running value
    reads = {x for _, e in prog.segments[2].body for x in walk(e) if isinstance(x, Param)}
    assert prog.phase_state(0)[0].param in reads
    # both phases' loops have the same bounds: one set of names
    assert [n for n, _ in prog.bounds] == ["lo", "hi", "full_hi"]
    assert any(r.startswith("phases: 2 loops over j") for r in prog.rules)


def test_outline_names_the_phases():
    text = "\n".join(outline(_program(tanh_sum())))
    assert "phases: 2 loops over j, one after the other; 0: max0; 1: t" in text
    assert "# phase 1, interior tiles, no masks" in text
    assert "    update t" in text


def test_check_states_the_phase_invariants():
    prog = _program(tanh_sum())
    prog.check()
    seg = prog.segments
    with pytest.raises(VerificationError, match=r"phases: the loops run phases \[1, 1, 0, 0\]"):
        replace(prog, segments=seg[2:] + seg[:2]).check()
    with pytest.raises(VerificationError, match=r"segments: segment .* of phase 0 updates t, "
                                                r"not the accumulators' state \(max0\)"):
        replace(prog, segments=(replace(seg[2], phase=0),) + seg[1:]).check()
    accs = prog.accumulators
    with pytest.raises(VerificationError, match=r"phases: t is in phase 2 after phase 0"):
        replace(prog, accumulators=(accs[0], replace(accs[1], phase=2))).check()
    # phase 0 may not read phase 1's state (it is not computed yet)
    body0 = tuple((s, Binary("add", e, prog.phase_state(1)[0].param)) for s, e in seg[0].body)
    with pytest.raises(VerificationError, match=r"phase 0 reads state:t, not defined there"):
        replace(prog, segments=(replace(seg[0], body=body0),) + seg[1:]).check()


def test_split_k_is_refused_for_phases():
    prog = _program(tanh_sum())
    with pytest.raises(UnschedulableError, match=r"schedule strategy 'split': k runs 2 "
                                                 r"phases .* a phased program stays rolling"):
        split_programs(prog, 2)
    kernel = nf.compile(tanh_sum(), schedule="auto", cache=False)
    assert kernel._can_split() is False
    # an explicit split-k schedule splits each pass instead
    sched = replace(SMALL, strategy="split", splits=2)
    assert isinstance(nf.compile(tanh_sum(), schedule=sched, cache=False), StagedKernel)


def test_require_single_pass_refuses_phases():
    with pytest.raises(UnschedulableError, match=r"t reads the final max0.*"
                                                 r"require_single_pass=True refuses"):
        nf.compile(tanh_sum(), schedule=SMALL, cache=False, require_single_pass=True)


def test_golden_phased_source(golden):
    [t] = tanh_sum()
    golden("tanh_sum_phases.py", generate(_program([t], Schedule(), "tanh_sum")))


# ------------------------------------------------------------------ kernels (interpreter)
@pytest.mark.parametrize("shape", [(1, 1), (5, 29), (40, 33)])
@pytest.mark.parametrize("static", [False, True], ids=["symbolic", "static"])
def test_scaled_producer_read_by_a_later_phase(shape, static, rng):
    """The max kept as m * log2(e) in phase 0 (scores of a contraction) is read by
    phase 1 as m2 / log2(e), which the exp2 rewrite cancels inside the exponential."""
    outs = scaled_then_tanh(*shape, dot=True) if static else scaled_then_tanh(dot=True)
    prog = _program(outs)
    assert any("m kept in the exp2 domain" in r for r in prog.rules)
    for seg in prog.segments:
        for x in (x for _, e in seg.body for x in walk(e)):
            assert not (isinstance(x, Binary) and x.op in ("mul", "div")
                        and isinstance(x.a, Param) and x.a.name == "state:m"), \
                "m2 / log2(e) was not cancelled inside exp2"
    assert LOG2E > 1
    a, b = rng.standard_normal((shape[0], 4)), rng.standard_normal((shape[1], 4))
    kernel = nf.compile(outs[0], placeholders(outs), schedule=SMALL, cache=False)
    got = kernel(*(torch.tensor(v, dtype=torch.float32) for v in (a, b)))
    want = nf.evaluate(outs[0], {"a": a, "b": b})
    np.testing.assert_allclose(got.double().numpy(), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("shape", [(1, 1), (5, 29), (40, 33)])
def test_natural_producer_read_by_a_later_phase(shape, rng):
    """Without a contraction phase 0's max stays natural, and phase 1's exponential of
    ``x - m`` is factored, ``exp2((x - m) * log2 e)``."""
    outs = scaled_then_tanh(*shape)
    assert any(r.startswith("m kept natural") for r in _program(outs).rules)
    x = (rng.standard_normal(shape) * 4.0 + 1e4).astype(np.float32)   # far from 0
    _run(outs, SMALL, x.astype(np.float64))


@pytest.mark.parametrize("n", [1, 29, 33, None])
def test_phases_with_different_bounds(n, rng):
    """Phase 1's causal mask gives its loops their own bounds (named for the phase)."""
    outs = causal_second(n)
    prog = _program(outs)
    names = [name for name, _ in prog.bounds]
    assert "hi_1" in names and "hi" in names
    _run(outs, SMALL, rng.standard_normal((n or 21, n or 21)))
    # one tile over the row (the masks on the tile, no bounds): the same answers
    whole = Schedule(block_m=4, block_n=64, num_warps=2, num_stages=1)
    kernel = _run(outs, whole, rng.standard_normal((n or 21, n or 21)))
    assert kernel.program.one_tile == ("runtime" if n is None else "static")


@pytest.mark.parametrize("m", [1, 29, 33])
@pytest.mark.parametrize("block_m", [1, 4])
def test_persistent_phases(m, block_m, rng):
    """A loop tile covering the whole row: each phase's loop runs once."""
    sched = Schedule(block_m=block_m, block_n=64, num_warps=2, num_stages=1)
    _run(tanh_sum(7, m), sched, rng.standard_normal((7, m)))


def test_prod_over_the_max(rng):
    N, M = nf.sizes("N M")
    x = nf.placeholder((N, M), name="x")
    j = nf.reduce_axis(M, "j")
    outs = [nf.compute((N,), lambda i: nf.prod(x[i, j] / nf.max(x[i, j], j), j), name="p")]
    for shape in ((1, 1), (6, 29), (17, 33)):
        kernel = _run(outs, SMALL, rng.uniform(0.5, 1.5, shape), rtol=1e-4)
        assert kernel.program.phases == 2


@pytest.mark.parametrize("rows, keys", [(1, 1), (5, 29), (17, 33)])
def test_a_phase_with_a_contraction(rows, keys, rng):
    """Attention with tanh in place of exp cannot fuse: the max over the scores, then
    sum_j tanh(s - m) v[j, e] -- a tl.dot in phase 1, the head dim a static column."""
    N, M = nf.sizes("N M")
    q = nf.placeholder((N, 16), name="q")
    k = nf.placeholder((M, 16), name="k")
    v = nf.placeholder((M, 16), name="v")
    c = nf.reduce_axis(16, "c")
    s = nf.compute((N, M), lambda i, j: nf.sum(q[i, c] * k[j, c], c) * 0.25, name="s")
    j = nf.reduce_axis(M, "j")
    m = nf.compute((N,), lambda i: nf.max(s[i, j], j), name="m")
    o = nf.compute((N, 16), lambda i, e: nf.sum(nf.tanh(s[i, j] - m[i]) * v[j, e], j),
                   name="o")
    kernel = nf.compile(o, [q, k, v], schedule=SMALL, cache=False)
    assert isinstance(kernel, Kernel) and kernel.program.phases == 2
    assert "tl.dot(" in kernel.source
    feeds = {"q": rng.standard_normal((rows, 16)), "k": rng.standard_normal((keys, 16)),
             "v": rng.standard_normal((keys, 16))}
    got = kernel(*(torch.tensor(feeds[n], dtype=torch.float32) for n in ("q", "k", "v")))
    np.testing.assert_allclose(got.double().numpy(), nf.evaluate(o, feeds), rtol=2e-5,
                               atol=2e-5)


@pytest.mark.parametrize("block_n", [16, 64])
def test_a_later_phase_fuses_its_own_chain(block_n, rng):
    """Phase 1 is an online softmax of y = 3 tanh(x - max x): its max and sum fused with
    a repair (its max kept natural: the output reads y - m2), reading phase 0's max as a
    final value; the output reads x again (or the one tile)."""
    N, M = nf.sizes("N M")
    x = nf.placeholder((N, M), name="x")
    j = nf.reduce_axis(M, "j")
    m = nf.compute((N,), lambda i: nf.max(x[i, j], j), name="m")
    y = nf.compute((N, M), lambda i, k: nf.tanh(x[i, k] - m[i]) * 3.0, name="y")
    m2 = nf.compute((N,), lambda i: nf.max(y[i, j], j), name="m2")
    l2 = nf.compute((N,), lambda i: nf.sum(nf.exp(y[i, j] - m2[i]), j), name="l2")
    o = nf.compute((N, M), lambda i, k: nf.exp(y[i, k] - m2[i]) / l2[i], name="o")
    prog = _program([o], replace(SMALL, block_n=block_n))
    assert [a.phase for a in prog.accumulators] == [0, 1, 1]
    assert prog.accumulators[2].producers == (1,)
    assert any(r.startswith("m2 kept natural") for r in prog.rules)
    for shape in ((3, 1), (5, 29), (6, 33), (2, 70)):
        _run([o], replace(SMALL, block_n=block_n), rng.standard_normal(shape))


# ------------------------------------------------------------------ random chains
D_CHOICES = (1, 29, 33)


@hsettings(max_examples=8, deadline=None,
           suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(tree=trees(), producer=st.sampled_from(["max", "min", "sum"]),
       consumer=st.sampled_from(["max", "min", "sum"]), d=st.sampled_from(D_CHOICES),
       static=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_random_unfusable_chains_are_one_kernel(tree, producer, consumer, d, static, seed):
    """Random producer -> consumer chains that the plan cannot fuse compile into one
    phased kernel and match float64, at reduction lengths 1, 29, 33, static or not."""
    if not (uses(tree, "r") and uses(tree, "c")):
        return
    N = 5 if static else nf.size("N")
    D = d if static else nf.size("D")
    x = nf.placeholder((N, D), name="x")
    y = nf.placeholder((N, D), name="y")
    op = {"sum": nf.sum, "max": nf.max, "min": nf.min}
    k1, k2 = nf.reduce_axis(D, "k"), nf.reduce_axis(D, "k")
    p = nf.compute((N,), lambda i: op[producer](x[i, k1], k1), name="p")
    out = nf.compute((N,), lambda i: op[consumer](build(tree, x[i, k2], y[i, k2], p[i]), k2),
                     name="out")
    if nf.plan(out).single_pass:
        return
    check_phased(plan(out))
    kernel = nf.compile(out, [x, y], schedule=SMALL, cache=False)
    assert isinstance(kernel, Kernel) and len(kernel.kernels) == 1
    assert kernel.program.phases == 2
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.uniform(0.5, 1.5, (5, d)), "y": rng.uniform(-1.0, 1.0, (5, d))}
    want = nf.evaluate(out, {n: v for n, v in feeds.items() if n == "x" or uses(tree, "c2")})
    got = kernel(*(torch.tensor(feeds[n], dtype=torch.float32) for n in ("x", "y")))
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-4,
                               atol=1e-4 * max(1.0, float(np.abs(want).max())))


def test_lower_itself_takes_a_phased_plan():
    outs = tanh_sum()
    prog = lower(plan(outs), placeholders(outs), SMALL)
    assert prog.phases == 2 and len(prog.segments) == 2
    assert all(not s.masked for s in prog.segments)


def test_outline_in_the_doc_is_current():
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[2] / "docs" / "codegen.md").read_text()
    for line in outline(_program(tanh_sum(), Schedule(), "tanh_sum")):
        if not line.startswith("rule:"):
            assert line in doc, line


def test_a_warm_compile_of_phases_skips_the_plan(tmp_path, rng, monkeypatch):
    """The form of the definition (phased) and its kernel specs come from the cache: the
    second compile and its call plan nothing and give the same output."""
    from neptune_fusion.fusion import plan as plan_module
    from neptune_fusion.runtime.disk_cache import DiskCache
    store = DiskCache(tmp_path)
    x = torch.tensor(rng.standard_normal((5, 29)), dtype=torch.float32)
    want = nf.compile(tanh_sum(), schedule=SMALL, cache=store)(x)
    with monkeypatch.context() as mp:
        mp.setattr(plan_module, "plan", lambda *a, **k: pytest.fail("planned again"))
        second = nf.compile(tanh_sum(), schedule=SMALL, cache=store)
        got = second(x)
    assert second.from_cache and torch.equal(got[0], want[0])
    assert second.program.phases == 2     # derived on demand
