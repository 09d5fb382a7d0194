"""±inf as the float64 reference and PyTorch give them (ir/reducers.py's guard,
codegen/settle.py, docs/language.md "Infinities").

Until 2026-12-04 a consumer read every non-finite running maximum as 0: a row holding
``+inf`` gave a softmax of 0 beside one NaN (``exp(inf - 0)``), a log-sum-exp and a
denominator ``inf``; a row of ``-inf`` a denominator 0 and a log-sum-exp ``-inf``; and a
running mean of ``-inf`` read as 0 gave a variance ``inf``. The reference and PyTorch
give NaN there. Every kernel (one tile, looped, split-k), the fused reference and the
torch.compile backend are compared with both, NaN positions exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.codegen.lower import lower
from neptune_fusion.frontend.attention import (
    AttentionCache,
    AttentionSpec,
    attention,
    attention_definition,
)
from neptune_fusion.fusion.plan import plan
from neptune_fusion.fusion.reference import GroupRunner, evaluate_fused
from neptune_fusion.ir.graph import placeholders
from neptune_fusion.ir.nodes import Where
from neptune_fusion.ir.traverse import walk
from neptune_fusion.reference.feeds import bind_feeds
from neptune_fusion.reference.interp import Interpreter
from neptune_fusion.runtime.merge import Partial, merge_partials
from neptune_fusion.schedule.schedule import Schedule

D = 40
INF = float("inf")
SCHEDULES = {
    "one_tile": dict(schedule=Schedule(block_m=2, block_n=64, num_warps=1, num_stages=1)),
    "looped": dict(schedule=Schedule(block_m=2, block_n=8, num_warps=1, num_stages=1)),
    "split": dict(strategy="split", splits=3, block_m=16, block_n=16),
}


def _x() -> torch.Tensor:
    """Float32 rows: 0 finite; 1 one +inf; 2 one -inf; 3 all -inf; 4 two +inf; 5 its
    first 20 elements -inf (a masked prefix: finite results for a maximum's chains).
    Rows 1 and 2 hold theirs in the last tile (a variance read its mean's -inf as 0 and
    gave inf there; an earlier one made the next repair's ``0 * inf`` NaN)."""
    x = torch.randn(6, D, generator=torch.Generator().manual_seed(5)) * 3
    x[1, D - 2] = INF
    x[2, D - 1] = -INF
    x[3, :] = -INF
    x[4, 5] = x[4, 30] = INF
    x[5, :20] = -INF
    return x


def _chain(kind: str, n=None):
    """The chain ``kind`` as a user writes it; ``n``: the reduced extent (D)."""
    n = D if n is None else n
    N = nf.size("N")
    x = nf.placeholder((N, n), name="x")
    k = nf.reduce_axis(n, "k")
    if kind == "variance":    # centred on the mean: sum((x - mean)^2) / n
        mu = nf.compute((N,), lambda i: nf.sum(x[i, k], k) / D, name="mu")
        return nf.compute((N,), lambda i: nf.sum(
            (x[i, k] - mu[i]) * (x[i, k] - mu[i]), k) / D, name="y")
    if kind == "softmin_denominator":
        m = nf.compute((N,), lambda i: nf.min(x[i, k], k), name="m")
        return nf.compute((N,), lambda i: nf.sum(nf.exp(m[i] - x[i, k]), k), name="y")
    src = x
    if kind == "relu_softmax":
        src = nf.compute(x.shape, lambda i, j: nf.maximum(x[i, j], 0.0), name="r")
    m = nf.compute((N,), lambda i: nf.max(src[i, k], k), name="m")
    s = nf.compute((N,), lambda i: nf.sum(nf.exp(src[i, k] - m[i]), k), name="s")
    if kind in ("softmax", "relu_softmax"):
        return nf.compute(x.shape, lambda i, j: nf.exp(src[i, j] - m[i]) / s[i], name="y")
    if kind == "log_softmax":
        return nf.compute(x.shape, lambda i, j: src[i, j] - m[i] - nf.log(s[i]), name="y")
    if kind == "logsumexp":
        return nf.compute((N,), lambda i: m[i] + nf.log(s[i]), name="y")
    assert kind == "denominator"
    return s


def _lse(x):
    m = x.amax(-1, keepdim=True)
    return (m + torch.log(torch.exp(x - m).sum(-1, keepdim=True)))[:, 0]


def _variance(x):
    return ((x - x.mean(-1, keepdim=True)) ** 2).mean(-1)


# the same expressions in eager PyTorch
EAGER = {
    "softmax": lambda x: torch.softmax(x, -1),
    "relu_softmax": lambda x: torch.softmax(torch.relu(x), -1),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "logsumexp": _lse,
    "denominator": lambda x: torch.exp(x - x.amax(-1, keepdim=True)).sum(-1),
    "variance": _variance,
    "softmin_denominator": lambda x: torch.exp(x.amin(-1, keepdim=True) - x).sum(-1),
}
# the rows each gives NaN (the reference's and torch's answer)
NAN_ROWS = {"softmax": {1, 3, 4}, "relu_softmax": {1, 4}, "log_softmax": {1, 3, 4},
            "logsumexp": {1, 3, 4}, "denominator": {1, 3, 4}, "variance": {1, 2, 3, 4, 5},
            "softmin_denominator": {2, 3, 5}}


def _same(got, want, tol: float = 1e-5, what=None) -> None:
    """NaN exactly where ``want`` has NaN, infinities equal, the rest within ``tol``."""
    got, want = torch.as_tensor(np.asarray(got)).double(), torch.as_tensor(np.asarray(want))
    want = want.double()
    assert torch.equal(got.isnan(), want.isnan()), (what, got, want)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


def _nan_rows(y: torch.Tensor) -> set[int]:
    y = torch.as_tensor(np.asarray(y))
    return {r for r in range(y.shape[0]) if y[r].isnan().any()}


@pytest.mark.parametrize("kind", sorted(EAGER))
def test_kernels_give_the_reference_and_torch_on_infinities(kind):
    """Each schedule: one tile, looped tiles, split-k (partial kernels and combine).
    (The old split-k variance gave NaN too, by accident: its combine's ``0 * inf``.)"""
    out = _chain(kind)
    x = _x()
    want = nf.evaluate(out, {"x": x.double().numpy()})
    for sched, kw in SCHEDULES.items():
        got = nf.compile(out, placeholders([out]), cache=False, **kw)(x)
        _same(got, want, what=sched)
        _same(got, EAGER[kind](x), 1e-4, what=sched)
        assert _nan_rows(got) == NAN_ROWS[kind], sched
        if kind in ("softmax", "log_softmax", "relu_softmax"):
            assert got[[1, 4]].isnan().all(), sched   # the whole row, not one element


@pytest.mark.parametrize("kind", sorted(EAGER))
def test_the_fused_reference_gives_the_reference(kind):
    out = _chain(kind)
    feeds = {"x": _x().double().numpy()}
    want = nf.evaluate(out, feeds)
    for mode, kw in (("rolling", dict(tile=1)), ("rolling", dict(tile=7)),
                     ("rolling", dict(tile=64)), ("split", dict(splits=3))):
        with np.errstate(all="ignore"):
            got = evaluate_fused([out], feeds, mode=mode, **kw)[0]
        _same(got, want, 1e-9, what=(mode, kw))


@pytest.mark.parametrize("sched", sorted(SCHEDULES))
def test_a_row_of_minus_inf_settles_and_an_empty_row_keeps_the_identities(sched):
    """A symbolic extent: a row of -inf gives the reference's NaN (the state settled
    after the loop); an empty axis (extent 0) the identities, a denominator 0 and a
    log-sum-exp -inf (the settling is guarded by ``n > 0``)."""
    for kind, empty in (("denominator", 0.0), ("logsumexp", -INF)):
        out = _chain(kind, nf.size("D"))
        kern = nf.compile(out, placeholders([out]), cache=False, **SCHEDULES[sched])
        rows = torch.full((3, 5), -INF)
        assert kern(rows).isnan().all(), kind
        got = kern(torch.zeros(3, 0))
        assert torch.equal(got, torch.full((3,), empty)), (kind, got)
        _same(got, nf.evaluate(out, {"x": np.zeros((3, 0))}))


def test_settling_reads_what_the_output_can_tell_apart():
    """The log-sum-exp reads its sum settled (``where(m == -inf, l * inf, l)``);
    attention's guarded output reads ``o_sum / l`` as it is (0 at ``m = -inf`` either
    way), so its epilogue is unchanged."""
    def settled(out, ins):
        [o] = lower(plan(out), ins, Schedule()).outputs
        return any(isinstance(x, Where) and "inf" in str(x.a) for x in walk(o.body))
    lse = _chain("logsumexp")
    assert settled(lse, placeholders([lse]))
    [o], ins = attention_definition(AttentionSpec("float32", 2, 2, 16, 16, 0.25))
    assert not settled(o, ins)


# ------------------------------------------------------------------------ torch.compile


def _denominator(x):
    return torch.exp(x - x.amax(-1, keepdim=True)).sum(-1)


@pytest.mark.parametrize("fn", [
    lambda x: torch.softmax(x, -1),
    lambda x: torch.softmax(torch.relu(x), -1),
    lambda x: torch.log_softmax(x, -1),
    _denominator,
    lambda x: torch.var(x, -1),
    _variance,
], ids=["softmax", "relu_softmax", "log_softmax", "denominator", "var", "variance"])
def test_the_backend_gives_eager_torch(fn):
    torch._dynamo.reset()
    g, x = nf.jit(fn, rest="eager"), _x()
    with torch.no_grad():
        got, ex = g(x), g.explain(x)
    assert len(ex.fused) == 1, str(ex)
    _same(got, fn(x), 1e-4)
    _same(got, fn(x.double()), 1e-4)


def test_torch_logsumexp_keeps_its_guard_and_the_written_math_gives_nan():
    """``torch.logsumexp`` guards the maximum: inf for a row holding +inf, -inf for a row
    of -inf (its decomposition keeps the guard, dynamo/decomp.py). The same math written
    out is NaN there, in eager torch and in the backend."""
    x = _x()
    for fn, want in ((lambda t: torch.logsumexp(t, -1), [INF, -INF, INF]),
                     (_lse, [float("nan")] * 3)):
        torch._dynamo.reset()
        g = nf.jit(fn, rest="eager")
        with torch.no_grad():
            got, ex = g(x), g.explain(x)
        assert len(ex.fused) == 1, str(ex)
        _same(got, fn(x), 1e-4)
        _same(got[[1, 3, 4]], torch.tensor(want))


# ---------------------------------------------------------------------------- attention


@pytest.mark.parametrize("schedule", [Schedule(block_m=16, block_n=16), None,
                                      Schedule(block_m=16, block_n=16, strategy="split",
                                               splits=3)], ids=["rolling", "auto", "split"])
def test_attention_keeps_empty_rows_and_gives_plus_inf_rows_nan(schedule):
    """Causal with rows 0-1 seeing no key: o = 0 and lse = -inf (the definition's
    guards); a key scoring +inf for every query of head 0 from row 3 on: o and lse NaN,
    as the reference gives them (``exp(inf - inf)``), where the kernels read the +inf
    maximum as 0 and wrote lse = inf."""
    mask = lambda b, h, i, j: (j <= i) & (i >= 2)  # noqa: E731
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 9, 16, generator=g) for _ in range(3))
    q = q.abs()
    k[0, 0, 3, :] = INF
    o, lse = attention(q, k, v, mask_mod=mask, return_lse=True, schedule=schedule,
                       cache=AttentionCache(store=False))
    [wo, wl], _ = attention_definition(AttentionSpec("float32", 2, 2, 16, 16, 0.25,
                                                     mask_mod=mask, lse=True))
    feeds = {"q": q.double().numpy(), "k": k.double().numpy(), "v": v.double().numpy()}
    want_o, want_lse = nf.evaluate([wo, wl], feeds)
    _same(o, want_o)
    _same(lse, want_lse)
    assert (o[:, :, :2] == 0).all() and torch.isneginf(lse[:, :, :2]).all()
    assert o[0, 0, 3:].isnan().all() and lse[0, 0, 3:].isnan().all()
    assert not o[0, 1, 2:].isnan().any() and torch.isfinite(lse[0, 1, 2:]).all()


# ------------------------------------------------------------------------ merge_partials


def _split_states(out, x, cuts=((0, 13), (13, 27), (27, D))) -> tuple:
    """``(plan, partial states of the chunks)``: each chunk's rolling states (the fused
    reference's, tiles of 5), as a kernel's split would store them."""
    p = plan(out)
    arrays, sizes = bind_feeds(list(p.outputs), {"x": x})
    runner = GroupRunner(p, p.groups[0], Interpreter(arrays, sizes), {}, {})
    parts = []
    with np.errstate(all="ignore"):
        for a, b in cuts:
            states = runner.rolling(a, b, 5)
            parts.append(Partial({m.name: tuple(torch.from_numpy(np.asarray(c, np.float64))
                                                for c in states[id(m.node)].comps)
                                  for m in p.groups[0].members}, b - a))
    return p, parts


def test_merge_partials_reads_infinities_as_the_kernels_do():
    """Partial states merged by ``merge_partials``: a softmax's maximum and sum give the
    reference's for a row holding +inf (NaN: ``exp(inf - inf)``; the +inf read as 0
    gave inf), and for a row of -inf the sum at the guard's 0 (its outputs settle it);
    a variance's mean is read as it is (NaN for a row holding -inf or +inf)."""
    x = _x().double().numpy()
    out = _chain("denominator")
    p, parts = _split_states(out, x)
    merged = merge_partials(p, parts).states
    m = merged[p.name(p.groups[0].members[0].node)][0]
    s = merged[out.name][0]
    np.testing.assert_array_equal(m.numpy(), x.max(1))
    want = torch.from_numpy(nf.evaluate(out, {"x": x}))
    want[torch.isneginf(m)] = 0.0
    _same(s, want, 1e-9)
    assert s[[1, 4]].isnan().all() and s[3] == 0
    var = _chain("variance")
    p, parts = _split_states(var, x)
    [member] = [mm for mm in p.groups[0].members if mm.producers]
    got = merge_partials(p, parts).states[member.name][0] / D
    _same(got, nf.evaluate(var, {"x": x}), 1e-9)
    assert _nan_rows(got) == NAN_ROWS["variance"]


def test_a_float_division_by_a_zero_constant_folds_as_ieee(rng):
    """A settled state's guard reads a minimum at its identity, ``+inf``; a repair
    ``|p' |p'/p| / p|`` there became ``inf / 0.0`` in the kernel's source, which Python
    raised (ZeroDivisionError in the interpreter; at compile time on a GPU). Float
    division by a zero constant now folds to +-inf or NaN (a CPU fuzzing find,
    2026-12-04); an integer floor division by zero stays unfolded."""
    from neptune_fusion.ir.fold import fconst, fold, iconst
    from neptune_fusion.ir.nodes import Binary
    inf = float("inf")
    for a, b, want in ((inf, 0.0, inf), (-2.0, 0.0, -inf), (3.0, -0.0, -inf)):
        assert fold(Binary("div", fconst(a), fconst(b))) == fconst(want)
    assert np.isnan(fold(Binary("div", fconst(0.0), fconst(0.0))).value)
    assert isinstance(fold(Binary("floordiv", iconst(3), iconst(0))), Binary)
    n, d = nf.size("N"), 9
    x, y = nf.placeholder((n, d), name="x"), nf.placeholder((n, d), name="y")
    k1, k2 = nf.reduce_axis(d, "k"), nf.reduce_axis(d, "k")
    p = nf.compute((n,), lambda i: nf.min(x[i, k1], k1), name="p")
    out = nf.compute((n,), lambda i: nf.sum(nf.abs(nf.abs(p[i]) * (p[i] * y[i, k2])), k2),
                     name="out")
    xs, ys = rng.uniform(0.5, 1.5, (3, d)), rng.uniform(-1.0, 1.0, (3, d))
    got = nf.compile(out)(torch.tensor(xs, dtype=torch.float32),
                          torch.tensor(ys, dtype=torch.float32))
    want = nf.evaluate(out, {"x": xs, "y": ys})
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-5)
