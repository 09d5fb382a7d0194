"""Multi-pass plans: a chain over one axis of one row as one kernel of several phases
(codegen/lower.py), the others split into pass programs (fusion/stages.py) run in order
(runtime/staged.py); every result checked against the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

import neptune_fusion as nf
from algebra.chains import FUSABLE
from algebra.test_random_chains import D, N, X, Y, build, trees, uses
from neptune_fusion.errors import UnschedulableError
from neptune_fusion.fusion.stages import split_passes
from neptune_fusion.runtime.auto import AutoKernel
from neptune_fusion.runtime.kernel import Kernel
from neptune_fusion.runtime.staged import StagedKernel
from neptune_fusion.schedule.schedule import Schedule

SMALL = Schedule(block_m=16, block_n=16, num_warps=4, num_stages=2)


def _x(sizes: str = "N M"):
    """``x`` with rows and reduction length symbolic (``"N M"``) or static (``(n, m)``)."""
    if isinstance(sizes, str):
        N, M = nf.sizes(sizes)
    else:
        N, M = sizes
    x = nf.placeholder((N, M), name="x")
    return N, M, x, nf.reduce_axis(M, "j")


def tanh_sum(sizes="N M"):
    """sum_j tanh(x - max_j x): tanh proves no repair, so two passes."""
    N, _, x, j = _x(sizes)
    t = nf.compute((N,), lambda i: nf.sum(nf.tanh(x[i, j] - nf.max(x[i, j], j)), j), name="t")
    return [t]


def prod_chain(sizes="N M"):
    """prod_j (x / max_j x): no repair distributes over the product, so two passes."""
    N, _, x, j = _x(sizes)
    p = nf.compute((N,), lambda i: nf.prod(x[i, j] / nf.max(x[i, j], j), j), name="p")
    return [p]


def stages_out(sizes="N M"):
    """Outputs of different passes: the max (pass 0), the tanh-sum and their ratio."""
    N, _, x, j = _x(sizes)
    m = nf.compute((N,), lambda i: nf.max(x[i, j], j), name="m")
    t = nf.compute((N,), lambda i: nf.sum(nf.tanh(x[i, j] - m[i]), j), name="t")
    r = nf.compute((N,), lambda i: t[i] / (m[i] * m[i] + 1.0), name="r")
    return [m, t, r]


def unfusable_softmax(sizes="N M"):
    """A softmax of y = tanh(x - max x): its denominator reads the max through tanh."""
    N, M, x, j = _x(sizes)
    m = nf.compute((N,), lambda i: nf.max(x[i, j], j), name="m")
    y = nf.compute((N, M), lambda i, k: nf.tanh(x[i, k] - m[i]), name="y")
    s = nf.compute((N,), lambda i: nf.sum(nf.exp(y[i, j]), j), name="s")
    o = nf.compute((N, M), lambda i, k: nf.exp(y[i, k]) / s[i], name="o")
    return [o, s]


def two_lengths(sizes="N M K"):
    """A chain over two axes: the max over j < M, then a tanh-sum over k < K reading it
    (different extents: two passes, not phases)."""
    if isinstance(sizes, str):
        N, M, K = nf.sizes(sizes)
    else:
        N, M, K = sizes
    x = nf.placeholder((N, M), name="x")
    z = nf.placeholder((N, K), name="z")
    j, k = nf.reduce_axis(M, "j"), nf.reduce_axis(K, "k")
    m = nf.compute((N,), lambda i: nf.max(x[i, j], j), name="m")
    a = nf.compute((N,), lambda i: nf.sum(x[i, j], j), name="a")
    t = nf.compute((N,), lambda i: nf.sum(nf.tanh(z[i, k] - m[i]) + 0.1 * a[i], k), name="t")
    return [t]


def per_batch(n=None):
    """The max over a row of ``w[b]``, then a tanh-sum per row of ``x[b, i]`` reading it:
    both over j < M, but per b, then per (b, i) -- rows of their own (a symbolic i, or a
    static one that no tile holds next to the loop: no contraction): two passes."""
    B, N, M = nf.sizes("B N M")
    N = N if n is None else n
    w = nf.placeholder((B, M), name="w")
    x = nf.placeholder((B, N, M), name="x")
    j = nf.reduce_axis(M, "j")
    m = nf.compute((B,), lambda b: nf.max(w[b, j], j), name="m")
    t = nf.compute((B, N), lambda b, i: nf.sum(nf.tanh(x[b, i, j] - m[b]), j), name="t")
    return [t]


PROGRAMS = {f.__name__: f for f in (tanh_sum, prod_chain, stages_out, unfusable_softmax)}
STAGED = {"two_lengths": (two_lengths, {"x": (7, 13), "z": (7, 29)}),
          "per_batch": (per_batch, {"w": (2, 13), "x": (2, 5, 13)}),
          "per_batch_static": (lambda: per_batch(5), {"w": (2, 13), "x": (2, 5, 13)})}


def _data(rng, n: int, m: int, positive: bool = False) -> np.ndarray:
    return rng.uniform(0.5, 1.5, (n, m)) if positive else rng.standard_normal((n, m))


def _check(got, want, rtol=2e-5, atol=2e-5):
    got = got if isinstance(got, list) else [got]
    want = want if isinstance(want, list) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g.double().numpy(), w, rtol=rtol, atol=atol)


# ------------------------------------------------------------------ the split (pure, IR)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_split_preserves_the_reference(name, rng):
    """reference(before) == reference(pass programs chained), on random data."""
    outs = PROGRAMS[name]()
    stage = split_passes(outs)
    assert len(stage.passes) >= 2
    x = _data(rng, 7, 13, positive=name == "prod_chain")
    want = nf.evaluate(outs, {"x": x})
    feeds = {"x": x}
    results = []
    for ps in stage.passes:
        for o in ps.outputs:
            nf.verify(o)
        assert nf.plan(list(ps.outputs)).single_pass and len(nf.plan(list(ps.outputs)).groups) == 1
        got = nf.evaluate(list(ps.outputs), {p.name: feeds[p.name] for p in ps.inputs})
        results.append(got)
        for ph, k, n in stage.intermediates:
            if k == ps.index:
                feeds[ph.name] = got[n]
    for w, (k, n) in zip(want, stage.results):
        np.testing.assert_allclose(results[k][n], w, rtol=1e-12, atol=1e-12)


def test_split_shape_of_the_tanh_sum():
    [t] = tanh_sum()
    stage = split_passes([t])
    first, second = stage.passes
    assert [o.name for o in first.outputs] == ["max0"]
    assert [p.name for p in second.inputs] == ["x", "max0"]
    assert stage.results == ((1, 0),)
    assert "tanh(x[i, j] - max0[i])" in nf.show(second.outputs[0])


def test_an_output_that_is_an_intermediate_is_not_recomputed():
    stage = split_passes(stages_out())
    assert stage.results[0] == (0, 0)           # m: pass 0's output itself
    assert [o.name for o in stage.passes[-1].outputs] == ["t", "r"]


def test_a_single_pass_program_is_one_pass():
    outs, _ = FUSABLE["softmax"]()
    stage = split_passes(outs)
    assert stage.single_pass and stage.passes[0].outputs == tuple(outs)


def test_narrow_intermediates_are_float32():
    N, M = nf.sizes("N M")
    x = nf.placeholder((N, M), "bfloat16", name="x")
    j = nf.reduce_axis(M, "j")
    t = nf.compute((N,), lambda i: nf.sum(nf.tanh(x[i, j] - nf.max(x[i, j], j)), j), name="t")
    stage = split_passes([t])
    assert stage.intermediates[0][0].dtype == nf.float32
    assert stage.passes[-1].outputs[0].dtype == t.dtype


# ------------------------------------------------------------------ kernels (interpreter)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("schedule", ["auto", SMALL], ids=["auto", "explicit"])
def test_multi_pass_chains_are_one_phased_kernel(name, schedule, rng):
    """A chain over one axis of one row: one kernel, one loop per pass of the plan."""
    outs = PROGRAMS[name]()
    kernel = nf.compile(outs, schedule=schedule, cache=False)
    assert isinstance(kernel, AutoKernel if schedule == "auto" else Kernel)
    assert not kernel.plan.single_pass
    for n, m in ((1, 1), (5, 29), (40, 33)):
        x = _data(rng, n, m, positive=name == "prod_chain")
        xt = torch.tensor(x, dtype=torch.float32)
        got = kernel(xt)
        _check(got, nf.evaluate(outs, {"x": x}),
               rtol=1e-4 if name == "prod_chain" else 2e-5)
        one = kernel.kernel_for(xt) if schedule == "auto" else kernel
        assert len(one.kernels) == 1 and one.program.phases == len(kernel.plan.groups) == 2


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("shape", [(29, 33), (1, 29), (33, 1)])
def test_static_sizes(name, shape, rng):
    outs = PROGRAMS[name](shape)
    kernel = nf.compile(outs, schedule=SMALL, cache=False)
    assert kernel.program.phases == 2
    x = _data(rng, *shape, positive=name == "prod_chain")
    _check(kernel(torch.tensor(x, dtype=torch.float32)), nf.evaluate(outs, {"x": x}),
           rtol=1e-4 if name == "prod_chain" else 2e-5)


@pytest.mark.parametrize("name", sorted(STAGED))
@pytest.mark.parametrize("schedule", ["auto", SMALL], ids=["auto", "explicit"])
def test_passes_over_different_axes_or_rows_stay_staged(name, schedule, rng):
    make, shapes = STAGED[name]
    outs = make()
    kernel = nf.compile(outs, schedule=schedule, cache=False)
    assert isinstance(kernel, StagedKernel) and len(kernel.passes) == 2
    feeds = {p.name: rng.standard_normal(shapes[p.name]) for p in kernel.inputs}
    got = kernel(*(torch.tensor(feeds[p.name], dtype=torch.float32) for p in kernel.inputs))
    _check(got, nf.evaluate(outs, feeds))
    with pytest.raises(UnschedulableError, match=r"are not phases of one kernel: .*"
                                                 r"\(different rows: |2 fused groups"):
        nf.codegen.lower.check_phased(kernel.plan)


def test_split_k_per_pass(rng):
    outs = prod_chain()
    sched = Schedule(block_m=16, block_n=16, num_warps=4, num_stages=2, strategy="split",
                     splits=3)
    kernel = nf.compile(outs, schedule=sched, cache=False)
    assert len(kernel.kernels) == 4      # each pass: partial, combine
    x = _data(rng, 6, 33, positive=True)
    _check(kernel(torch.tensor(x, dtype=torch.float32)), nf.evaluate(outs, {"x": x}),
           rtol=1e-4)


def test_groups_over_different_axes(rng):
    """Two independent reductions, over the columns and over the rows: two passes."""
    N, M = nf.sizes("N M")
    x = nf.placeholder((N, M), name="x")
    j, i0 = nf.reduce_axis(M, "j"), nf.reduce_axis(N, "i0")
    a = nf.compute((N,), lambda i: nf.sum(x[i, j], j), name="a")
    b = nf.compute((M,), lambda k: nf.max(x[i0, k], i0), name="b")
    kernel = nf.compile([a, b], schedule=SMALL, cache=False)
    assert isinstance(kernel, StagedKernel)
    x = rng.standard_normal((21, 17))
    _check(kernel(torch.tensor(x, dtype=torch.float32)), nf.evaluate([a, b], {"x": x}))


def test_bfloat16_multi_pass(rng):
    N, M = nf.sizes("N M")
    x = nf.placeholder((N, M), "bfloat16", name="x")
    j = nf.reduce_axis(M, "j")
    t = nf.compute((N,), lambda i: nf.sum(nf.tanh(x[i, j] - nf.max(x[i, j], j)), j), name="t")
    kernel = nf.compile(t, schedule=SMALL, cache=False)
    xt = torch.randn(9, 29).to(torch.bfloat16)
    got = kernel(xt)
    assert got.dtype == torch.bfloat16
    want = nf.evaluate(t, {"x": xt.double().numpy()})
    np.testing.assert_allclose(got.double().numpy(), want, rtol=2e-2, atol=2e-2)


def test_introspection_and_cache_info(rng):
    outs = two_lengths()
    kernel = nf.compile(outs, schedule=SMALL, cache=False)
    assert isinstance(kernel, nf.StagedKernel) and "2 passes" in repr(kernel)
    assert "# ---- pass 0 of 2" in kernel.source and "# ---- pass 1 of 2" in kernel.source
    assert [k.name for k in kernel.kernels] == ["nf_t_pass0", "nf_t_pass1"]
    assert kernel.plan.single_pass and len(kernel.plan.groups) == 2   # over j, then k
    assert [p.name for p in kernel.inputs] == ["z", "x"]
    x, z = torch.randn(3, 5), torch.randn(3, 4)
    kernel(z, x)
    kernel(z, x)
    info = kernel.cache_info()
    assert (info.hits, info.misses) == (2, 2)
    with pytest.raises(nf.FeedError, match=r"argument 1 \('x'\) must be float32"):
        kernel(z, x.double())


@pytest.mark.parametrize("make", [tanh_sum, per_batch], ids=["phased", "staged"])
def test_require_single_pass_refuses(make):
    """Phases are not a single pass (the input is read once per phase): refused too."""
    outs = make()
    for schedule in ("auto", SMALL):
        with pytest.raises(UnschedulableError, match=r"not single-pass \(t reads the final "
                                                     r"m(ax0)?: .*require_single_pass=True"):
            nf.compile(outs, schedule=schedule, cache=False, require_single_pass=True)


def test_two_axes_with_an_explicit_schedule():
    """A reduction over two axes (once refused by name) runs as passes, each under the
    explicit schedule given (fusion/axes.py; more cases in test_multi_axis.py)."""
    N, M = nf.sizes("N M")
    x = nf.placeholder((N, M, 3), name="x")
    j, k = nf.reduce_axis(M, "j"), nf.reduce_axis(3, "k")
    s = nf.compute((N,), lambda i: nf.sum(x[i, j, k], (j, k)), name="s")
    kern = nf.compile(s, schedule=SMALL, cache=False)
    t = torch.randn(5, 29, 3)
    assert isinstance(kern, StagedKernel) and kern.passes[0].schedule == SMALL
    torch.testing.assert_close(kern(t), t.sum((1, 2)), rtol=1e-5, atol=1e-5)


def test_multi_pass_golden_source(golden):
    kernel = nf.compile(two_lengths(), schedule=Schedule(), cache=False)
    golden("two_lengths_passes.py", kernel.source)


def test_intermediates_share_one_workspace(rng):
    """Two intermediates of pass 0 (max and sum, fused) are views of one allocation."""
    [t] = two_lengths()
    kernel = nf.compile(t, schedule=SMALL, cache=False)
    assert len(kernel.staging.intermediates) == 2
    seen = []
    first = kernel.passes[0]

    class Spy:
        inputs = first.inputs

        def __call__(self, *args, out=None):
            seen.append(out)
            return first(*args, out=out)

        def cache_info(self):
            return first.cache_info()

    kernel.passes = (Spy(),) + kernel.passes[1:]
    xv, zv = rng.standard_normal((7, 33)), rng.standard_normal((7, 29))
    _check(kernel(torch.tensor(zv, dtype=torch.float32), torch.tensor(xv, dtype=torch.float32)),
           nf.evaluate(t, {"x": xv, "z": zv}))
    [outs] = seen
    assert len(outs) == 2 and all(o is not None for o in outs)
    assert outs[0].untyped_storage().data_ptr() == outs[1].untyped_storage().data_ptr()


def test_out_tensors_are_checked():
    [t] = two_lengths()
    kernel = nf.compile(t, schedule=SMALL, cache=False)
    z = torch.randn(3, 5)
    with pytest.raises(nf.FeedError, match=r"out\[0\] \(output 't'\) is a \(4,\) "
                                           r"torch.float32 .* pass a \(3,\)"):
        kernel.passes[1](z, torch.randn(3), torch.randn(3), out=[torch.empty(4)])
    # the whole staged call likewise, before anything is written
    x, kept = torch.randn(3, 6), torch.full((4,), 7.0)
    for bad in ([kept], [kept[:1].expand(3)], [3], kept, [None, None]):
        with pytest.raises(nf.FeedError, match=r"kernel .*out"):
            kernel(z, x, out=bad)
    assert bool((kept == 7.0).all())
    got = torch.empty(3)
    assert kernel(z, x, out=[got]) is got
    torch.testing.assert_close(got, kernel(z, x))


@hsettings(max_examples=8, deadline=None,
           suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(tree=trees(), producer=st.sampled_from(["max", "min", "sum"]),
       consumer=st.sampled_from(["max", "min", "sum"]), seed=st.integers(0, 2**31 - 1))
def test_random_chains_compile_fused_or_not(tree, producer, consumer, seed):
    """Random chains (those the plan fuses and those it does not) compile and match."""
    if not (uses(tree, "r") and uses(tree, "c")):
        return
    op = {"sum": nf.sum, "max": nf.max, "min": nf.min}
    k1, k2 = nf.reduce_axis(D, "k"), nf.reduce_axis(D, "k")
    p = nf.compute((N,), lambda i: op[producer](X[i, k1], k1), name="p")
    out = nf.compute((N,), lambda i: op[consumer](build(tree, X[i, k2], Y[i, k2], p[i]), k2),
                     name="out")
    kernel = nf.compile(out, [X, Y], schedule=SMALL, cache=False)
    assert isinstance(kernel, Kernel) and kernel.program.phases == len(nf.plan(out).groups)
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.uniform(0.5, 1.5, (3, D)), "y": rng.uniform(-1.0, 1.0, (3, D))}
    want = nf.evaluate(out, {n: v for n, v in feeds.items() if n == "x" or uses(tree, "c2")})
    got = kernel(*(torch.tensor(feeds[n], dtype=torch.float32) for n in ("x", "y")))
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-4,
                               atol=1e-4 * max(1.0, float(np.abs(want).max())))


def test_maps_over_other_axes_beside_a_projection_get_passes_of_their_own():
    """LayerNorm -> matmul with ``x - mean`` (row width D) and ``rsqrt(var)`` (width 1)
    as outputs too -- what a training forward saves: the projection's pass has its columns
    (E), so the maps of the statistics run as passes of their own (they sat in the
    projection's pass: "output sub does not have the row axis j"), and the one that
    divides by D without reading a tensor of width D takes ``x`` for its size."""
    n, d, e = nf.sizes("N D E")
    x = nf.placeholder((n, d), name="x")
    w = nf.placeholder((d, e), name="w")

    def mean(i):
        r = nf.reduce_axis(d, "r")
        return nf.sum(x[i, r], r) / nf.cast(d, "float32")

    def rstd(i):
        r = nf.reduce_axis(d, "r1")
        return nf.rsqrt(nf.sum((x[i, r] - mean(i)) ** 2, r) / nf.cast(d, "float32") + 1e-5)

    def proj(i, j):
        c = nf.reduce_axis(d, "c")
        return nf.sum((x[i, c] - mean(i)) * rstd(i) * w[c, j], c)
    outs = [nf.compute((n, d), lambda i, c: x[i, c] - mean(i), name="centred"),
            nf.compute((n, 1), lambda i, c: rstd(i), name="rstd"),
            nf.compute((n, e), proj, name="y")]
    kern = nf.compile(outs, [x, w], cache=False)
    assert isinstance(kern, StagedKernel)
    gen = torch.Generator().manual_seed(2)
    xs, ws = torch.randn(5, 29, generator=gen) * 2 + 1, torch.randn(29, 7, generator=gen)
    got = kern(xs, ws)
    xd = xs.double()
    mu = xd.mean(1, keepdim=True)
    rs = torch.rsqrt(((xd - mu) ** 2).mean(1, keepdim=True) + 1e-5)
    for g, want in zip(got, (xd - mu, rs, (xd - mu) * rs @ ws.double())):
        torch.testing.assert_close(g.double(), want, rtol=2e-5, atol=2e-5)


def _one_token_mlp_entry():
    """One token through RMSNorm -> two projections as the torch.compile backend
    translates it: a row of one read at index 0, so the statistic depends on no output
    row, and the planner groups it with the projections (both reduce over ``D``)."""
    D, K = nf.size("D"), nf.size("K")
    e, g = nf.placeholder((1, 1, D), name="e"), nf.placeholder((1, D), name="g")
    w = nf.placeholder((D,), name="w")
    W1, W2 = nf.placeholder((K, D), name="W1"), nf.placeholder((K, D), name="W2")
    c, r = nf.reduce_axis(D, "c"), nf.reduce_axis(D, "r")
    add = nf.compute((1, 1, D), lambda i, j, k: e[0, 0, k] + g[0, k], name="add")

    def proj(m, name):
        def body(i, j):
            ms = nf.sum((e[0, 0, r] + g[0, r]) ** 2, r) / 16.0
            return nf.sum(w[c] * (e[0, 0, c] + g[0, c]) * nf.rsqrt(ms + 1e-6) * m[j, c], c)
        return nf.compute((1, K), body, name=name)
    return [add, proj(W1, "m1"), proj(W2, "m2")], [e, g, w, W1, W2]


def test_a_statistic_of_one_fixed_row_is_a_pass_of_its_own_not_the_whole_group():
    """The first pass holds only the members no output row depends on: with the whole
    group it came back unchanged as the next pass's program, at every split, until
    Python's recursion limit (Llama-1B decode through the backend, H200, 2026-12-03)."""
    outs, ins = _one_token_mlp_entry()
    staging = split_passes(outs)
    first, *rest = staging.passes
    assert len(first.outputs) == 1 and first.outputs[0].shape == ()
    assert all(o.shape != () for p in rest for o in p.outputs)
    kern = nf.compile(outs, ins, cache=False)
    gen = torch.Generator().manual_seed(3)
    d, k = 16, 24
    e, g, w = (torch.randn(*s, generator=gen) for s in ((1, 1, d), (1, d), (d,)))
    W1, W2 = torch.randn(k, d, generator=gen), torch.randn(k, d, generator=gen)
    got = kern(e, g, w, W1, W2)
    xd = (e.double() + g.double())
    y = xd[0] * torch.rsqrt((xd[0] ** 2).sum(-1, keepdim=True) / 16.0 + 1e-6) * w.double()
    for out, want in zip(got, (xd, y @ W1.double().T, y @ W2.double().T)):
        torch.testing.assert_close(out.double(), want, rtol=2e-5, atol=2e-5)


def test_passes_nested_past_the_limit_are_an_error_not_a_recursion(monkeypatch):
    """Past ``MAX_PASS_DEPTH`` nested splits the plan's error is raised, naming it (the
    guard that kept the case above from a RecursionError before its cause was found)."""
    from neptune_fusion.runtime import pipeline
    monkeypatch.setattr(pipeline, "MAX_PASS_DEPTH", 0)
    outs, ins = _one_token_mlp_entry()
    with pytest.raises(UnschedulableError, match="split into passes 0 times"):
        nf.compile(outs, ins, cache=False)


def rotated_keys_beside_attention():
    """``([o, rot], inputs)``: attention over keys rotated inline, and the rotated keys as
    an output of their own (what a sliding-window cache stores)."""
    N, M, D = nf.sizes("N M D")
    q, k, sn = nf.placeholder((N, D), name="q"), nf.placeholder((M, D), name="k"), \
        nf.placeholder((M, D), name="sn")
    j, c = nf.reduce_axis(M, "j"), nf.reduce_axis(D, "c")
    rot = nf.compute((M, D), lambda r, d: k[r, d] * 0.5 + sn[r, d], name="rot")

    def body(i, e):
        s = nf.sum(q[i, c] * (k[j, c] * 0.5 + sn[j, c]), c)
        w = nf.exp(s - nf.max(s, j))
        return nf.sum(w * (k[j, e] * 0.5 + sn[j, e]), j) / nf.sum(w, j)
    return [nf.compute((N, D), body, name="o"), rot], [q, k, sn]


def test_an_output_that_reads_no_reduction_is_a_pass_beside_the_group_not_a_reason_to_split_it():
    """Attention beside the rotated keys a sliding-window cache stores (Mistral, Gemma2
    through the torch.compile backend): the map has none of the attention's rows, which
    made the attention's group a pass of its own, its states float32 workspaces and its
    division a third pass. The map is now a pass of its own and the attention one kernel;
    no workspace."""
    (out, rot), ins = rotated_keys_beside_attention()
    staging = split_passes([out, rot])
    assert len(staging.passes) == 2 and not staging.intermediates
    kern = nf.compile([out, rot], ins, cache=False)
    gen = torch.Generator().manual_seed(6)
    qs, ks, ss = torch.randn(7, 16, generator=gen), torch.randn(23, 16, generator=gen), \
        torch.randn(23, 16, generator=gen)
    got_o, got_rot = kern(qs, ks, ss)
    kr = ks.double() * 0.5 + ss.double()
    torch.testing.assert_close(got_rot.double(), kr, rtol=2e-6, atol=2e-6)
    want = torch.softmax(qs.double() @ kr.T, -1) @ kr
    torch.testing.assert_close(got_o.double(), want, rtol=2e-5, atol=2e-5)
