"""Odd but valid input, and bad input (issue 15, findings 3, 4 and 5).

Valid odd input must give what SDPA gives (checked against float64); bad input must raise
a NeptuneError naming the parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import neptune_fusion as nf
from neptune_fusion import cli
from neptune_fusion.errors import FeedError, NeptuneError
from neptune_fusion.frontend.attention import AttentionCache, attention
from neptune_fusion.frontend.examples import plain_attention
from neptune_fusion.runtime.merge import Partial, merge_partials
from neptune_fusion.schedule.schedule import Schedule

SMALL = Schedule(block_m=16, block_n=16)
SPLIT = Schedule(block_m=16, block_n=16, strategy="split", splits=3)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def sdpa64(q, k, v, keep=None):
    """SDPA in float64 (torch 2.13: a row with no key gives 0)."""
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=keep)


def close(out, want, tol=1e-5):
    assert out.shape == want.shape
    assert torch.isfinite(out).all()
    if want.numel():
        assert float((out.double() - want).abs().max()) < tol


# -------------------------------------------------------------- finding 4: empty rows


@pytest.mark.parametrize("schedule", [SMALL, None], ids=["rolling", "auto"])
def test_fully_masked_rows_give_zero(schedule):
    q, k, v = (randn(1, 2, 9, 16, seed=s) for s in range(3))
    i, j = torch.arange(9)[:, None], torch.arange(9)[None, :]
    keep = (j <= i) & (i >= 4)       # rows 0-3 see no key
    out = attention(q, k, v, mask_mod=lambda b, h, i, j: (j <= i) & (i >= 4),
                    cache=AttentionCache(store=False), schedule=schedule)
    want = sdpa64(q, k, v, keep)
    assert torch.equal(want[:, :, :4], torch.zeros_like(want[:, :, :4]))  # SDPA: 0
    close(out, want)


@pytest.mark.parametrize("schedule", [SPLIT, None], ids=["split", "auto"])
def test_decode_with_every_key_masked_gives_zero(schedule):
    q, k, v = randn(1, 2, 1, 16), randn(1, 2, 70, 16, seed=1), randn(1, 2, 70, 16, seed=2)
    cache = AttentionCache(store=False)
    out = attention(q, k, v, mask_mod=lambda b, h, i, j: j > 1000, cache=cache,
                    schedule=schedule)
    close(out, torch.zeros(1, 2, 1, 16, dtype=torch.float64))
    out = attention(q, k, v, mask_mod=lambda b, h, i, j: j < 20, cache=cache,
                    schedule=schedule)
    close(out, sdpa64(q, k[:, :, :20], v[:, :, :20]))


def test_reference_gives_zero_for_an_empty_row():
    from neptune_fusion.frontend.attention import AttentionSpec, attention_definition
    [o], ins = attention_definition(AttentionSpec(
        "float32", 1, 1, 4, 4, 0.5, mask_mod=lambda b, h, i, j: j < i))
    rng = np.random.default_rng(3)
    feeds = {"q": rng.standard_normal((1, 1, 3, 4)), "k": rng.standard_normal((1, 1, 3, 4)),
             "v": rng.standard_normal((1, 1, 3, 4))}
    out = nf.evaluate(o, feeds)
    assert np.array_equal(out[0, 0, 0], np.zeros(4)) and np.isfinite(out).all()


# ----------------------------------------------------- finding 3: empty sizes, crashes


@pytest.mark.parametrize("schedule", [SMALL, None], ids=["rolling", "auto"])
@pytest.mark.parametrize("b, n, m", [(0, 5, 7), (1, 0, 7), (1, 5, 0), (2, 0, 0)])
def test_empty_sizes_give_empty_or_zero_outputs(b, n, m, schedule):
    q, k, v = randn(b, 2, n, 16), randn(b, 2, m, 16, seed=1), randn(b, 2, m, 16, seed=2)
    out = attention(q, k, v, cache=AttentionCache(store=False), schedule=schedule)
    close(out, sdpa64(q, k, v))   # T = 0: zeros, as SDPA


UNIFORM = {   # scores that do not depend on the query: (kwargs, float64 score of (i, j))
    "scale 0": (dict(scale=0.0), lambda i, j: 0.0 * (i + j)),
    "constant": (dict(score_mod=lambda s, b, h, i, j: 1.5), lambda i, j: 1.5 + 0.0 * (i + j)),
    "key only": (dict(score_mod=lambda s, b, h, i, j: nf.cast(j, "float32") * 0.3),
                 lambda i, j: 0.3 * j + 0.0 * i),
    "query only": (dict(scale=0.0, score_mod=lambda s, b, h, i, j: nf.cast(i, "float32")),
                   lambda i, j: 1.0 * i + 0.0 * j),
    "scale 0, causal": (dict(scale=0.0, mask_mod=lambda b, h, i, j: j <= i),
                        lambda i, j: torch.where(j <= i, 0.0, -torch.inf)),
}


@pytest.mark.parametrize("schedule", [SMALL, None], ids=["rolling", "auto"])
@pytest.mark.parametrize("name", sorted(UNIFORM))
def test_scores_that_ignore_the_query(name, schedule):
    """Uniform attention (in the query): compiles, and matches SDPA given the scores."""
    kw, score = UNIFORM[name]
    q, k, v = randn(2, 2, 7, 16), randn(2, 2, 11, 16, seed=1), randn(2, 2, 11, 16, seed=2)
    out = attention(q, k, v, cache=AttentionCache(store=False), schedule=schedule, **kw)
    s = score(torch.arange(7.0)[:, None], torch.arange(11.0)[None, :]).double()
    close(out, torch.softmax(s, -1) @ v.double())


def test_uniform_decode_gqa():
    q, k, v = randn(1, 4, 1, 16), randn(1, 2, 70, 16, seed=1), randn(1, 2, 70, 16, seed=2)
    for schedule in (SPLIT, None):
        out = attention(q, k, v, scale=0.0, enable_gqa=True, schedule=schedule,
                        cache=AttentionCache(store=False))
        close(out, v.double().mean(2, keepdim=True).repeat_interleave(2, 1))


def _softmax():
    N, L = nf.sizes("N L")
    x = nf.placeholder((N, L), name="x")
    c = nf.reduce_axis(L, "c")
    m = nf.compute((N,), lambda i: nf.max(x[i, c], c), name="m")
    l = nf.compute((N,), lambda i: nf.sum(nf.exp(x[i, c] - m[i]), c), name="l")  # noqa: E741
    return l, nf.compute((N, L), lambda i, cc: nf.exp(x[i, cc] - m[i]) / l[i], name="sm")


@pytest.mark.parametrize("rows, cols", [(0, 7), (3, 0), (0, 0), (1, 300), (2, 129)])
def test_softmax_full_row_output_any_size(rows, cols):
    l, sm = _softmax()   # noqa: E741
    x = randn(rows, cols) * 3
    close(nf.compile(sm)(x), torch.softmax(x.double(), -1))
    close(nf.compile(l)(x), torch.exp(x.double() - x.double().amax(1, keepdim=True)).sum(1)
          if cols else torch.zeros(rows, dtype=torch.float64))


@pytest.mark.parametrize("rows, cols", [(3, 300), (2, 129), (1, 0)])
def test_softmax_full_row_output_splits(rows, cols):
    """It used to be split by the auto-scheduler and fail generating the combine kernel
    (a raw KeyError), then was refused by name. Since 2026-12-04 the combine reads ``x``
    and writes a piece of the row per program (codegen/split.py): an explicit split-k
    schedule runs, empty splits and an empty row included."""
    _, sm = _softmax()
    kern = nf.compile(sm, schedule=Schedule(block_m=1, block_n=64, strategy="split",
                                            splits=4))
    x = randn(rows, cols) * 3
    close(kern(x), torch.softmax(x.double(), -1), 1e-5)


def test_two_independent_reductions_combined():
    """``(x @ W) * rsqrt(mean(x^2))``: a matmul and a mean square over one axis."""
    N, D, OUT = nf.sizes("N D O")
    x, w = nf.placeholder((N, D), name="x"), nf.placeholder((D, OUT), name="W")
    c = nf.reduce_axis(D, "c")
    ms = nf.compute((N,), lambda i: nf.rsqrt(nf.sum(x[i, c] * x[i, c], c) / D), name="ms")
    y = nf.compute((N, OUT), lambda i, o: nf.sum(x[i, c] * w[c, o], c) * ms[i], name="y")
    mm = nf.compute((N, OUT), lambda i, o: nf.sum(x[i, c] * w[c, o], c), name="mm")
    y2 = nf.compute((N, OUT), lambda i, o: mm[i, o] * ms[i], name="y2")
    for n, d in ((3, 29), (2, 300)):
        xt, wt = randn(n, d), randn(d, 16, seed=1)
        want = (xt.double() @ wt.double()) * torch.rsqrt((xt.double() ** 2).mean(1, True))
        close(nf.compile(y)(xt, wt), want, 1e-4)
        close(nf.compile(y2)(xt, wt), want, 1e-4)


# ----------------------------------------------------------- finding 5: clear errors


def test_bad_attention_arguments():
    q, k, v = (randn(1, 2, 4, 8, seed=s) for s in range(3))
    cache = AttentionCache(store=False)
    for scale in ("a", float("nan"), float("inf"), True, None.__class__):
        with pytest.raises(FeedError, match="attention: scale must be a finite number"):
            attention(q, k, v, scale=scale, cache=cache)
    with pytest.raises(FeedError, match="attention: buffers must map names to tensors"):
        attention(q, k, v, buffers=5, cache=cache)
    with pytest.raises(FeedError, match="attention: buffer 'w' must be a torch tensor"):
        attention(q, k, v, buffers={"w": [1.0]}, cache=cache)
    with pytest.raises(FeedError, match="buffer name 'q' must be an identifier other"):
        attention(q, k, v, buffers={"q": q}, cache=cache)
    with pytest.raises(FeedError, match="attention: q must be a torch tensor"):
        attention(None, k, v, buffers=5, cache=cache)   # q, k, v first
    for schedule in ({"block_m": 16}, "fast"):
        with pytest.raises(FeedError, match="attention: schedule must be 'auto', None or a "
                                            "Schedule"):
            attention(q, k, v, schedule=schedule, cache=cache)


@dataclass
class Cap:   # a non-frozen dataclass is unhashable: it is traced, not hashed
    cap: float

    def __call__(self, s, b, h, i, j):
        return self.cap * nf.tanh(s / self.cap)


def test_unhashable_mod_works():
    q, k, v = (randn(1, 2, 4, 8, seed=s) for s in range(3))
    out = attention(q, k, v, score_mod=Cap(2.0), cache=AttentionCache(store=False))
    s = q.double() @ k.double().transpose(-1, -2) * 8 ** -0.5
    close(out, torch.softmax(2.0 * torch.tanh(s / 2.0), -1) @ v.double())


def test_requires_grad_is_refused_unless_grad_mode_is_off():
    q, k, v = (randn(1, 2, 4, 8, seed=s) for s in range(3))
    cache = AttentionCache(store=False)
    qg = q.clone().requires_grad_()
    # attention is differentiable (tests/autodiff); over a paged cache it is not
    assert attention(qg, k, v, cache=cache).grad_fn is not None
    pool = torch.cat([k[0], k[0]]).reshape(2, 2, 4, 8).repeat(1, 1, 4, 1)   # pages of 16
    with pytest.raises(FeedError, match=r"paged cache \(block_table=\) has no backward: "
                                        r"q, k or v requires grad.*torch.no_grad\(\).*"
                                        r"detached"):
        attention(qg[:, :, :1], pool, pool, cache=cache,
                  kv_lens=torch.tensor([5], dtype=torch.int32),
                  block_table=torch.tensor([[1]], dtype=torch.int32))
    with torch.no_grad():
        close(attention(qg, k, v, cache=cache), sdpa64(q, k, v))
    close(attention(qg.detach(), k, v, cache=cache), sdpa64(q, k, v))
    # a compiled kernel, on its cached fast path too
    l, _ = _softmax()   # noqa: E741
    kern, x = nf.compile(l), randn(3, 5)
    kern(x)
    with pytest.raises(FeedError, match=r"argument 0 requires grad"):
        kern(x.clone().requires_grad_())
    with torch.inference_mode():
        assert kern(x.clone().requires_grad_()).shape == (3,)


def _partials():
    [o], _ = plain_attention("N", "M", 4, "float32")
    pl = nf.plan(o)
    m, lsum, osum = torch.zeros(3), torch.ones(3), randn(3, 4)
    return o, pl, Partial({"m": (m,), "l": (lsum,), "o_sum": (osum,)}, 5)


def test_merge_partials_errors():
    o, pl, good = _partials()
    with pytest.raises(FeedError, match="plan must be a fusion plan, got Compute 'o'; pass "
                                        r"nf.plan\(outputs\)"):
        merge_partials(o, [good])
    bad = Partial({"m": (torch.zeros(4),), "l": (torch.ones(4),),
                   "o_sum": (randn(4, 4),)}, 5)
    with pytest.raises(FeedError, match=r"the state of 'm' has shapes \[\(4,\)\] in partial "
                                        r"1 but \[\(3,\)\] in partial 0"):
        merge_partials(pl, [good, bad])
    with pytest.raises(FeedError, match="partial 1 covers -2 elements"):
        merge_partials(pl, [good, Partial(good.states, -2)])
    with pytest.raises(FeedError, match="partial 0 must be a Partial or a dict, got int"):
        merge_partials(pl, [3])
    with pytest.raises(FeedError, match="extent is 2"):
        merge_partials(pl, [good], extent=2)
    assert merge_partials(pl, [good, Partial(good.states, 0)]).count == 5


def test_demo_rejects_a_negative_seed(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", "--seed", "-1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --seed: must be an integer from 0" in err and "Traceback" not in err


def test_all_are_neptune_errors():
    assert issubclass(FeedError, NeptuneError)


def test_a_mask_offset_read_from_a_buffer_compiles(rng):
    """``j <= i + d[0]``: the loop bounds read tensor data, which the cost model cannot
    evaluate on the host; it prices every tile instead of raising a raw ValueError."""
    b, h, n, m, d = 1, 2, 4, 9, 16
    q, k, v = (torch.tensor(rng.standard_normal((b, h, s, d)), dtype=torch.float32)
               for s in (n, m, m))
    off = torch.tensor([m - n], dtype=torch.int32)
    out = nf.attention(q, k, v, mask_mod=lambda bb, hh, i, j, o: j <= i + o[0],
                       buffers={"o": off})
    s = (q.double() @ k.double().transpose(-1, -2)) * d ** -0.5
    keep = torch.arange(m)[None, :] <= torch.arange(n)[:, None] + (m - n)
    want = torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v.double()
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
