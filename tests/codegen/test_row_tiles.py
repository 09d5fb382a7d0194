"""Row reductions (no tl.dot) at the tile shapes only they may use: rows per program 1, 2,
4, loop tiles below 16, and persistent tiles (the whole reduction axis in one tile), each
kernel against the float64 reference on fresh random data with ragged lengths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.codegen.lower import dot_roles
from neptune_fusion.errors import ScheduleError
from neptune_fusion.frontend.examples import plain_attention
from neptune_fusion.ir.graph import placeholders
from neptune_fusion.schedule.schedule import Schedule

ROWS = 7          # ragged against every block_m > 1 below


def _chain(kind: str, d: int):
    N = nf.size("N")
    x = nf.placeholder((N, d), name="x")
    k = nf.reduce_axis(d, "k")
    if kind == "softmax":
        m = nf.compute((N,), lambda i: nf.max(x[i, k], k), name="m")
        l = nf.compute((N,), lambda i: nf.sum(nf.exp(x[i, k] - m[i]), k), name="l")  # noqa: E741
        outs = [nf.compute(x.shape, lambda i, j: nf.exp(x[i, j] - m[i]) / l[i], name="y")]
    elif kind == "log_softmax":
        m = nf.compute((N,), lambda i: nf.max(x[i, k], k), name="m")
        outs = [nf.compute(x.shape, lambda i, j: x[i, j] - m[i] - nf.log(
            nf.sum(nf.exp(x[i, k] - m[i]), k)), name="y")]
    elif kind == "logsumexp":
        outs = [nf.compute((N,), lambda i: nf.max(x[i, k], k) + nf.log(
            nf.sum(nf.exp(x[i, k] - nf.max(x[i, k], k)), k)), name="lse")]
    elif kind == "denominator":     # a softmax denominator: max, then the sum of exp
        m = nf.compute((N,), lambda i: nf.max(x[i, k], k), name="m")
        outs = [nf.compute((N,), lambda i: nf.sum(nf.exp(x[i, k] - m[i]), k), name="l")]
    else:                           # variance around a mean of 100: the centred update
        mu = nf.compute((N,), lambda i: nf.sum(x[i, k], k) / d, name="mean")
        outs = [nf.compute((N,), lambda i: nf.sum((x[i, k] - mu[i]) ** 2, k) / d,
                           name="var")]
    return outs, (100.0 if kind == "variance" else 0.0)


def _check(kind: str, d: int, schedule: Schedule, rows: int = ROWS, seed: int = 0):
    outs, mean = _chain(kind, d)
    ins = placeholders(outs)
    kern = nf.compile(outs[0], ins, schedule=schedule, cache=False)
    assert not dot_roles(kern.program)           # a row reduction: no tl.dot anywhere
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, d)) * 2.0 + mean).astype(np.float32)
    got = kern(torch.from_numpy(x))
    want = nf.evaluate(outs[0], {"x": x.astype(np.float64)})
    got, want = got.double().numpy(), np.asarray(want)
    assert got.shape == want.shape
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * max(1.0, np.abs(want).max()))
    return kern


KINDS = ("softmax", "log_softmax", "logsumexp", "denominator", "variance")
# (block_m, block_n, reduction length): single rows, tiles below 16, several tiles per
# row with a ragged last tile, and persistent tiles (block_n >= length: the loop runs once)
SHAPES = [(1, 8, 29), (2, 16, 33), (4, 64, 33), (1, 32, 29), (2, 1, 1), (4, 4, 1)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bm, bn, d", SHAPES)
def test_small_and_persistent_tiles_match_float64(kind, bm, bn, d):
    _check(kind, d, Schedule(block_m=bm, block_n=bn, num_warps=1, num_stages=1))


@pytest.mark.parametrize("kind", ["logsumexp", "denominator"])
@pytest.mark.parametrize("bm, bn, splits, d", [(1, 8, 3, 29), (2, 16, 2, 33),
                                               (4, 4, 5, 33)])
def test_split_rows_at_small_tiles_match_float64(kind, bm, bn, splits, d):
    kern = _check(kind, d, Schedule(block_m=bm, block_n=bn, num_warps=2, strategy="split",
                                    splits=splits))
    assert [k.program.split.stage for k in kern.kernels] == ["partial", "combine"]


def test_persistent_tile_runs_the_loop_once():
    """block_n covering the static length: one masked tile, no loop."""
    kern = _check("logsumexp", 33, Schedule(block_m=1, block_n=64, num_warps=2,
                                            num_stages=1, count_visits=True), rows=3)
    assert kern.program.one_tile == "static" and "for " not in kern.source
    x = torch.randn(3, 33)
    visits = kern.launch(x).visits
    assert visits.sum().item() == 3            # one tile per program, three programs
    assert visits[:, 0].sum().item() == 3      # masked (33 of 64)


def test_block_m_below_16_on_a_contraction_is_refused():
    [o], ins = plain_attention("N", "M", 16, "float32")
    with pytest.raises(ScheduleError, match=r"block_m=1 is below 16, the smallest tl\.dot "
                                            r"tile: .* contracts over its row axis"):
        nf.compile(o, ins, schedule=Schedule(block_m=1, block_n=16), cache=False)
    with pytest.raises(ScheduleError, match=r"block_n=8 is below 16.* loop axis"):
        nf.compile(o, ins, schedule=Schedule(block_m=16, block_n=8), cache=False)


def test_persistent_row_reduction_source(golden):
    """log-sum-exp over rows of a static 33 in one 64-wide tile, one row per program:
    straight-line code, no loop, the first tile's update from the empty state folded
    (no repair)."""
    from neptune_fusion.codegen.source import generate
    from neptune_fusion.fusion.plan import plan
    from neptune_fusion.runtime.pipeline import build_programs
    [o], _ = _chain("logsumexp", 33)
    ins = placeholders([o])
    sched = Schedule(block_m=1, block_n=64, num_warps=2, num_stages=1)
    [prog] = build_programs(plan(o), ins, sched, "persistent_lse")
    golden("persistent_lse.py", generate(prog))


@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
@pytest.mark.parametrize("bn", [1024, 8192])
def test_full_row_output_is_written_in_column_chunks(kind, bn):
    """A row longer than the epilogue's chunk (2048 columns): the output column carries no
    state, so after a loop the epilogue walks it chunk by chunk (ragged last chunk)
    instead of one [BLOCK_M, next_pow2(row)] tile (looped: 1024); a persistent loop tile
    (8192) holds the row already, and the epilogue writes it from that tile (the input
    is read once)."""
    from neptune_fusion.codegen.lower import EPILOGUE_CHUNK
    d = 2 * EPILOGUE_CHUNK + 29
    kern = _check(kind, d, Schedule(block_m=2, block_n=bn, num_warps=4), rows=3)
    assert kern.program.col.chunk == EPILOGUE_CHUNK
    chunked = "for j0 in range(0, " in kern.source and \
        "offs_j = j0 + tl.arange(0, BLOCK_J)" in kern.source
    assert chunked == (bn < d)
    assert kern.source.count("tl.load(") == (3 if bn < d else 1)


def test_attention_keeps_its_column_whole():
    """The output column of attention is carried state (o_sum): never chunked."""
    [o], ins = plain_attention("N", "M", 32)
    kern = nf.compile(o, list(ins), schedule=Schedule(block_m=16, block_n=16), cache=False)
    assert kern.program.col.chunk is None


def _one_tile_branch(src: str) -> str:
    """The code of a kernel's masked one-tile branch (``elif ONE_TILE == 1:``), or all of
    it."""
    if "ONE_TILE == 1:" not in src:
        return src
    start = src.index("ONE_TILE == 1:")
    end = src.find("\n    else:", start)
    return src[start:end if end > 0 else None]


@pytest.mark.parametrize("d", [29, 64])   # a masked tile (29 of 64) and an exact one
def test_persistent_softmax_computes_one_exponential_per_element(d):
    """``exp(x - m) / l``: the sum ``l`` computed the exponential of every element already;
    the epilogue reads it (``codegen/reuse.py``) instead of computing a second one, and
    the result matches float64 (through ``_check``)."""
    kern = _check("softmax", d, Schedule(block_m=2, block_n=64, num_warps=2, num_stages=1))
    one = _one_tile_branch(kern.source)
    # one per element; the factor per row is a select (reuse.py)
    assert one.count("tl.exp2(") == 1 and "tl.exp(" not in one, one
    assert "l_new = tl.sum(p, 1)" in one, one
    looped = _check("softmax", d, Schedule(block_m=2, block_n=16, num_warps=2, num_stages=1))
    assert "tl.exp(" in looped.source   # a looped epilogue reads x again: its own exp


def test_the_shared_exponential_keeps_non_finite_rows_as_the_loop_gives_them():
    """Rows of -inf (no element), with +inf or NaN: the one-tile kernel (shared
    exponential) and the looped one give the same NaN, infinity and zero pattern."""
    outs, _ = _chain("softmax", 40)
    ins = placeholders(outs)
    x = torch.randn(5, 40, generator=torch.Generator().manual_seed(3)) * 3
    x[1, :] = float("-inf")
    x[2, 3] = float("inf")
    x[3, 7] = float("nan")
    got = [nf.compile(outs[0], ins, schedule=Schedule(block_m=1, block_n=bn, num_warps=1,
                                                      num_stages=1), cache=False)(x)
           for bn in (64, 8)]
    for t in got:
        assert t[0].isfinite().all() and t[4].isfinite().all()
    for f in (torch.isnan, torch.isinf, lambda t: t == 0):
        assert torch.equal(f(got[0]), f(got[1]))
    fin = got[0].isfinite()
    torch.testing.assert_close(got[0][fin], got[1][fin], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("op", ["max", "min"])
def test_the_exponential_identity_holds_on_every_special_value(op):
    """``exp2(a - m) = exp2(a - g(m)) * where(m == id, exp2(-id), 1)``, ``g`` the guard a
    consumer reads the running value through (reducers.safe_array: the identity ``id``
    as 0) -- reuse.py's rewrite -- in float32 for a and m finite, infinite and NaN:
    equal, NaN where the left side is. (With the old guard, every non-finite m read as
    0, the factor was ``exp2(g(m) - m)``; with +inf kept that is NaN at m = +inf.)"""
    from neptune_fusion.ir.reducers import reducer, safe_array
    vals = torch.tensor([-3.5, 0.0, 2.25, float("inf"), float("-inf"), float("nan")])
    a, m = torch.meshgrid(vals, vals, indexing="ij")
    ident = reducer(op).identity
    g = safe_array(op, m, torch)
    assert torch.equal(g.isnan(), m.isnan()) and (g[m == ident] == 0).all()
    left = torch.exp2(a - m)
    right = torch.exp2(a - g) * torch.where(m == ident, 2.0 ** -ident, 1.0)
    assert torch.equal(left.isnan(), right.isnan())
    assert torch.equal(left[~left.isnan()], right[~left.isnan()])
