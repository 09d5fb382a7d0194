"""Split-k decode kernels (partial + combine) against the float64 reference, on CPU."""

from __future__ import annotations

import math

import pytest
import torch

from neptune_fusion import ops
from neptune_fusion.frontend.attention import AttentionCache
from neptune_fusion.schedule.schedule import Schedule


def _ref(q, k, v, *, scale, alibi=None, softcap=None):
    q, k, v = q.double(), k.double(), v.double()
    hq, hk = q.shape[1], k.shape[1]
    k = k.repeat_interleave(hq // hk, 1)
    v = v.repeat_interleave(hq // hk, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    n = k.shape[2]
    if alibi is not None:
        j = torch.arange(n, dtype=torch.float64)
        s = s + alibi.double()[None, :, None, None] * (j - (n - 1))
    return torch.softmax(s, -1) @ v


CASES = {"DC-Causal": {}, "DC-GQA": {"gqa": True}, "DC-ALiBi": {"alibi": True},
         "DC-SoftCap": {"softcap": 20.0}}


def _inputs(n, dtype, gqa, seed=0):
    g = torch.Generator().manual_seed(seed)
    hq, hk = (4, 2) if gqa else (2, 2)
    q = torch.randn(1, hq, 1, 64, generator=g).to(dtype)
    k = torch.randn(1, hk, n, 64, generator=g).to(dtype)
    v = torch.randn(1, hk, n, 64, generator=g).to(dtype)
    return q, k, v


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("n,splits,dtype", [(37, 1, torch.float32), (100, 2, torch.float16),
                                            (64, 7, torch.float32), (100, 7, torch.float16)])
def test_decode_split(name, n, splits, dtype):
    opt = CASES[name]
    q, k, v = _inputs(n, dtype, opt.get("gqa", False))
    slopes = torch.tensor([0.5, 0.25]) if opt.get("alibi") else None
    sched = Schedule(block_m=16, block_n=16, num_warps=4, strategy="split", splits=splits)
    cache = AttentionCache()
    out = ops.attention(q, k, v, scale=1 / math.sqrt(64), causal=True, q_start=n - 1,
                        alibi_slopes=slopes, softcap=opt.get("softcap"), cache=cache,
                        schedule=sched)
    [kern] = cache.kernels()
    assert [g.program.split.stage for g in kern.kernels] == ["partial", "combine"]
    # head dim 64: the combine runs two 32-column programs per row block
    assert [sp.col_blocks for sp in kern.specs] == [1, 2]
    ref = _ref(q, k, v, scale=1 / math.sqrt(64), alibi=slopes, softcap=opt.get("softcap"))
    tol = 2e-3 if dtype == torch.float16 else 1e-5
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert (out.double() - ref).abs().max().item() < tol


def test_auto_choice():
    """schedule="auto": split-k for one query over a long KV axis, rolling for many rows;
    both correct against float64."""
    q, k, v = _inputs(200, torch.float32, False)
    cache = AttentionCache(store=False)
    out = ops.attention(q, k, v, scale=0.125, causal=True, q_start=199, cache=cache)
    assert (out.double() - _ref(q, k, v, scale=0.125)).abs().max() < 1e-5
    rows = torch.randn(1, 2, 120, 64)
    ops.attention(rows, k, v, scale=0.125, causal=True, q_start=80, cache=cache)
    (kern,) = cache.kernels()      # one shape class: both put the queries at the end
    assert kern.last_choice.source == "model"       # CPU: the cost model alone chooses
    split, rolling = kern.schedule_for(q, k, v), kern.schedule_for(rows, k, v)
    assert (split.strategy, rolling.strategy) == ("split", "rolling")
    assert 2 <= split.splits <= -(-200 // split.block_n)


@pytest.mark.parametrize("opts,msg", [
    ({"strategy": "tiles"}, "strategy must be one of rolling, split"),
    ({"strategy": "split", "splits": 0}, "splits must be an int >= 1"),
    ({"splits": 3}, "splits=3 needs strategy='split'"),
])
def test_schedule_errors(opts, msg):
    from neptune_fusion.errors import ScheduleError
    with pytest.raises(ScheduleError, match=msg):
        Schedule(**opts).check()


def test_split_of_a_variance():
    """A consumer of a running sum splits (since 2026-12-04): each split's partial sum is
    extrapolated from its own count, which the combine repeats (codegen/split.py)."""
    import neptune_fusion as nf
    from neptune_fusion.runtime.pipeline import compile as nf_compile
    x = nf.placeholder([8, 32], "float32", name="x")
    j = nf.reduce_axis(32, "j")
    mean = nf.compute([8], lambda i: nf.sum(x[i, j], j) / 32, name="mean")
    var = nf.compute([8], lambda i: nf.sum((x[i, j] - mean[i]) ** 2, j), name="var")
    kern = nf_compile(var, [x], strategy="split", splits=2, block_m=16, block_n=16)
    xs = torch.randn(8, 32, generator=torch.Generator().manual_seed(3)) * 3 + 20
    want = ((xs.double() - xs.double().mean(1, keepdim=True)) ** 2).sum(1)
    assert torch.allclose(kern(xs).double(), want, rtol=1e-5, atol=1e-4)


def test_split_of_outputs_that_read_the_input_again():
    """Softmax's output reads x again after the loop: the combine reads it too, each of
    its programs a piece of the row (since 2026-12-04; it used to be refused, and before
    that the auto-scheduler picked split-k and failed generating the combine kernel)."""
    import neptune_fusion as nf
    n, m = nf.sizes("N M")
    x = nf.placeholder((n, m), "float32", name="x")
    j = nf.reduce_axis(m, "j")
    mx = nf.compute((n,), lambda i: nf.max(x[i, j], j), name="m")
    e = nf.compute((n, m), lambda i, jj: nf.exp(x[i, jj] - mx[i]), name="e")
    s = nf.compute((n,), lambda i: nf.sum(e[i, j], j), name="s")
    y = nf.compute((n, m), lambda i, jj: e[i, jj] / s[i], name="y")
    xs = torch.randn(1, 4096, generator=torch.Generator().manual_seed(4))
    want = torch.softmax(xs.double(), -1)
    split = nf.compile(y, [x], strategy="split", splits=2, block_m=16, block_n=16)
    assert torch.allclose(split(xs).double(), want, atol=1e-6)
    assert torch.allclose(nf.compile(y, [x], cache=False)(xs).double(), want, atol=1e-6)


def test_masked_splits_batch_and_visits():
    """A sliding window leaves whole splits fully masked (state at the identity, m=-inf):
    they must contribute nothing and never NaN; batch 2; visits counted over splits."""
    g = torch.Generator().manual_seed(1)
    n, w = 90, 20
    q = torch.randn(2, 2, 1, 64, generator=g)
    k = torch.randn(2, 2, n, 64, generator=g)
    v = torch.randn(2, 2, n, 64, generator=g)
    sched = Schedule(block_m=16, block_n=16, num_warps=4, strategy="split", splits=6,
                     count_visits=True)
    cache = AttentionCache()
    out = ops.attention(q, k, v, scale=0.125, causal=True, q_start=n - 1, window=w,
                        cache=cache, schedule=sched)
    s = (q.double() @ k.double().transpose(-1, -2)) * 0.125
    s[..., : n - w] = -math.inf
    ref = torch.softmax(s, -1) @ v.double()
    assert torch.isfinite(out).all()
    assert (out.double() - ref).abs().max().item() < 1e-5
    [kern] = cache.kernels()
    run = kern.launch(q, k, v)
    assert run.grid == (1, 4, 6)
    assert int(run.visits.sum()) < 4 * 6   # fully masked tiles are skipped


def test_gqa_decode_packs_the_group():
    """DC-GQA decode: the query heads of a KV group share one row block (rows = group)."""
    q, k, v = _inputs(100, torch.float32, True)         # 4 query heads over 2 KV heads
    cache = AttentionCache(store=False)
    out = ops.attention(q, k, v, scale=0.125, causal=True, q_start=99, cache=cache)
    [auto] = cache.kernels()
    assert auto.program.row.extent == 2
    kern = auto.kernel_for(q.reshape(1, 2, 2, 64), k, v)
    assert [g.program.split.stage for g in kern.kernels] == ["partial", "combine"]
    # head dim 64: the combine runs two 32-column programs per row block
    assert [sp.col_blocks for sp in kern.specs] == [1, 2]
    run = kern.launch(q.reshape(1, 2, 2, 64), k, v)
    assert run.grid[:2] == (1, 2)                      # one program per (batch, KV head)
    assert (out.double() - _ref(q, k, v, scale=0.125)).abs().max().item() < 1e-5


@pytest.mark.parametrize("splits", [1, 3])
def test_gqa_decode_packs_the_group_with_alibi(splits):
    """ALiBi with GQA at decode packs the group too: the per-head slopes are read at
    ``h * group + row`` (a scalar plus the row variable), once per program."""
    q, k, v = _inputs(100, torch.float32, True)         # 4 query heads over 2 KV heads
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    cache = AttentionCache(store=False)
    sched = Schedule(block_m=16, block_n=16, num_warps=4, strategy="split", splits=splits)
    out = ops.attention(q, k, v, scale=0.125, causal=True, q_start=99, alibi_slopes=slopes,
                        cache=cache, schedule=sched)
    [kern] = cache.kernels()
    assert kern.program.row.extent == 2                # rows = the group
    assert "slopes_base + offs_i" in kern.source
    ref = _ref(q, k, v, scale=0.125, alibi=slopes)
    assert (out.double() - ref).abs().max().item() < 1e-5


def test_combine_column_programs_need_every_output_on_the_column_axis():
    """The combine is cut into 32-column programs only when every output is indexed by the
    column axis: with a row-only output (log-sum-exp) next to attention it stays whole;
    both forms agree with the float64 reference."""
    import numpy as np

    import neptune_fusion as nf
    n_, m_ = nf.sizes("N M")
    q = nf.placeholder((n_, 64), name="q")
    k = nf.placeholder((m_, 64), name="k")
    v = nf.placeholder((m_, 64), name="v")
    c = nf.reduce_axis(64, "c")
    s = nf.compute((n_, m_), lambda i, j: nf.sum(q[i, c] * k[j, c], c) * 0.125, name="s")
    j = nf.reduce_axis(m_, "j")
    m = nf.compute((n_,), lambda i: nf.max(s[i, j], j), name="m")
    den = nf.compute((n_,), lambda i: nf.sum(nf.exp(s[i, j] - m[i]), j), name="l")
    o = nf.compute((n_, 64), lambda i, e: nf.sum(nf.exp(s[i, j] - m[i]) * v[j, e], j)
                   / den[i], name="o")
    lse = nf.compute((n_,), lambda i: nf.log(den[i]) + m[i], name="lse")
    g = torch.Generator().manual_seed(3)
    x = [torch.randn(r, 64, generator=g) for r in (1, 50, 50)]
    feeds = {"q": x[0].double().numpy(), "k": x[1].double().numpy(),
             "v": x[2].double().numpy()}
    sched = Schedule(block_m=16, block_n=16, num_warps=4, strategy="split", splits=3)
    for outs, blocks in (([o], 2), ([o, lse], 1)):
        kern = nf.compile(outs, [q, k, v], schedule=sched, cache=False)
        assert [sp.col_blocks for sp in kern.specs] == [1, blocks]
        got = kern(*x)
        got = got if isinstance(got, (list, tuple)) else [got]
        want = nf.evaluate(outs, feeds)
        want = want if isinstance(want, (list, tuple)) else [want]
        for a, b in zip(got, want):
            np.testing.assert_allclose(a.double().numpy(), b, atol=2e-6)


@pytest.mark.parametrize("d,blocks", [(80, 1), (96, 3)])
def test_combine_column_programs_cover_odd_head_dims(d, blocks):
    """Head dims that are not powers of two: 96 = 3 x 32 columns (no masks needed in the
    combine, the partial kernel masks its 128-wide tile), 80 stays one program."""
    g = torch.Generator().manual_seed(d)
    q = torch.randn(1, 4, 1, d, generator=g)
    k = torch.randn(1, 2, 70, d, generator=g)
    v = torch.randn(1, 2, 70, d, generator=g)
    cache = AttentionCache(store=False)
    sched = Schedule(block_m=16, block_n=16, num_warps=4, strategy="split", splits=3)
    out = ops.attention(q, k, v, scale=d ** -0.5, causal=True, q_start=69, cache=cache,
                        schedule=sched)
    [kern] = cache.kernels()
    assert [sp.col_blocks for sp in kern.specs] == [1, blocks]
    assert (out.double() - _ref(q, k, v, scale=d ** -0.5)).abs().max().item() < 1e-5


def test_growing_decode_loop_keeps_one_call_setup():
    """A decode loop over a preallocated KV cache whose visible length grows by one per
    step: one call setup (the key leaves M out), a call setup per length sharing one set
    of launch steps, every step right against float64."""
    cache = AttentionCache(store=False)
    torch.manual_seed(3)
    q = torch.randn(1, 4, 1, 32)
    kc, vc = torch.randn(1, 2, 80, 32), torch.randn(1, 2, 80, 32)
    for m in range(61, 67):
        k, v = kc[:, :, :m], vc[:, :, :m]
        out = ops.attention(q, k, v, scale=0.125, causal=True, q_start=m - 1, cache=cache)
        ref = _ref(q, k, v, scale=0.125)
        assert (out.double() - ref).abs().max().item() < 1e-5
    assert cache.call_info() == (5, 1, 1024, 1) and len(cache) == 1
    assert cache.cache_info() == (5, 1, None, 1)   # a call-setup hit is a kernel hit
    (auto,) = cache.kernels()   # lengths 61-64 and 65-66 are two shape classes
    assert auto.cache_info() == (4, 2, None, 2)
    assert sum(kern.cache_info().currsize for kern in auto.kernels()) == 6
    for kern in auto.kernels():   # the launch steps are shared by the lengths
        assert kern.steps_kept == (len(kern.specs) if kern.cache_info().currsize else 0)
