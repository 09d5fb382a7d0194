"""A bounded fuzz campaign (issue 15, finding 7): random attention calls and random chains,
compiled and run, against the float64 reference.

CI size: a few examples per test (derandomised under ``CI=1``, see tests/conftest.py), so
the campaign stays within about a minute on two CPU cores under Triton's interpreter. For a
longer local campaign set ``NF_FUZZ=long`` (hundreds of random examples; minutes to hours)
or ``NF_FUZZ=<n>`` for n examples per test. ``test_fuzz_attention_on_gpu`` (marked ``gpu``)
draws the same attention calls and runs them compiled for a CUDA GPU;
``test_fuzz_chains_on_gpu`` the random chains.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import neptune_fusion as nf
from algebra.test_random_chains import REDUCE, D, X, Y, build, trees, uses
from neptune_fusion import ops
from neptune_fusion.frontend.attention import AttentionCache, attention
from neptune_fusion.ir.graph import placeholders
from neptune_fusion.schedule.schedule import Schedule


def _examples(ci: int, long: int) -> int:
    got = os.environ.get("NF_FUZZ", "")
    return long if got == "long" else int(got) if got.isdigit() else ci


FUZZ = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                  HealthCheck.filter_too_much])
CACHE = AttentionCache(store=False)   # one per module: shape classes drawn twice hit it
GPU_CACHE = AttentionCache(store=False)
DTYPES = {"float32": (torch.float32, 2e-4), "float16": (torch.float16, 2e-2),
          "bfloat16": (torch.bfloat16, 6e-2)}

# (nf mod, the same in float64 torch on s[b, h, i, j], h, i, j)
SCORE_MODS = {
    "none": (None, None),
    "softcap": (ops.SoftCap(2.0), lambda s, h, i, j: 2.0 * torch.tanh(s / 2.0)),
    "relative": (lambda s, b, h, i, j, **_: s + 0.1 * nf.cast(j - i, "float32"),
                 lambda s, h, i, j: s + 0.1 * (j - i)),
    "per-head": (lambda s, b, h, i, j, **_: s * nf.cast(h + 1, "float32") * 0.5,
                 lambda s, h, i, j: s * (h + 1) * 0.5),
    "slopes": (ops.AlibiSlopes(), None),    # reference built from the buffer below
}
MASKS = {
    "none": (None, None),
    "causal": (ops.Causal(), lambda i, j: j <= i),
    "window": (ops.SlidingWindow(3), lambda i, j: (j <= i) & (i - j < 3)),
    "sinks": (lambda b, h, i, j, **_: (j < 2) | (j > i + 3), lambda i, j: (j < 2) | (j > i + 3)),
    "empty rows": (lambda b, h, i, j, **_: (j <= i) & (i % 3 != 0),
                   lambda i, j: (j <= i) & (i % 3 != 0)),
}
SCHEDULES = {"auto": None, "rolling": Schedule(block_m=16, block_n=16),
             "split": Schedule(block_m=16, block_n=16, strategy="split", splits=2)}


def modded(s, pos, m: int, score, keep, slopes):
    """float64 scores ``s[..., h, i, j]`` with the score mod (or ALiBi ``slopes``) and the
    mask applied: query row ``i`` at position ``pos[i]``, keys ``0 .. m - 1``."""
    h = torch.arange(s.shape[-3])[:, None, None]
    i, j = pos[:, None], torch.arange(m)[None, :]
    if slopes is not None:
        s = s + slopes.double()[h] * (j - i)
    elif score is not None:
        s = score(s, h, i, j)
    if keep is not None:
        s = s.masked_fill(~keep(i, j), float("-inf"))
    return s


def reference(q, k, v, scale, score, keep, offset, slopes):
    """float64 attention with FlexAttention's semantics (a row with no key gives 0)."""
    q, k, v = (t.double() for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) * scale
    s = modded(s, torch.arange(q.shape[2]) + offset, k.shape[2], score, keep, slopes)
    mx = s.amax(-1, keepdim=True) if s.shape[-1] else s.sum(-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isfinite(mx), mx, 0.0))
    l_ = p.sum(-1, keepdim=True)
    return torch.where(l_ > 0, (p @ v) / torch.where(l_ > 0, l_, 1.0), 0.0)


ATTENTION_DRAWS = dict(
    b=st.integers(0, 2), hkv=st.integers(1, 2), group=st.sampled_from((1, 2)),
    n=st.integers(0, 20), m=st.integers(0, 40), d=st.sampled_from((8, 16)),
    dv=st.sampled_from((8, 16)), dtype=st.sampled_from(sorted(DTYPES)),
    score=st.sampled_from(sorted(SCORE_MODS)), mask=st.sampled_from(sorted(MASKS)),
    offset=st.sampled_from(("none", "end", "3")), scale=st.sampled_from((None, 0.3)),
    schedule=st.sampled_from(sorted(SCHEDULES)), seed=st.integers(0, 2 ** 31 - 1))


@settings(max_examples=_examples(60, 400), **FUZZ)
@given(**ATTENTION_DRAWS)
def test_fuzz_attention(**drawn):
    check_attention("cpu", CACHE, **drawn)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@settings(max_examples=_examples(60, 400), **FUZZ)
@given(**ATTENTION_DRAWS)
def test_fuzz_attention_on_gpu(**drawn):
    """The kernels compiled for the GPU (explicit schedules: "auto" would tune every
    shape class drawn)."""
    assume(drawn["schedule"] != "auto")
    check_attention("cuda", GPU_CACHE, **drawn)


def check_attention(device, cache, b, hkv, group, n, m, d, dv, dtype, score, mask, offset,
                    scale, schedule, seed):
    tdtype, tol = DTYPES[dtype]
    gen = torch.Generator().manual_seed(seed)
    hq = hkv * group
    q = torch.randn(b, hq, n, d, generator=gen).to(tdtype)
    k = torch.randn(b, hkv, m, d, generator=gen).to(tdtype)
    v = torch.randn(b, hkv, m, dv, generator=gen).to(tdtype)
    q_offset = {"none": None, "end": "end", "3": 3}[offset]
    off = m - n if offset == "end" else 3 if offset == "3" else 0
    score_mod, score_ref = SCORE_MODS[score]
    mask_mod, keep = MASKS[mask]
    slopes = torch.rand(hq, generator=gen) * 0.5 if score == "slopes" else None
    out = attention(q.to(device), k.to(device), v.to(device), score_mod=score_mod,
                    mask_mod=mask_mod, scale=scale, enable_gqa=group > 1, q_offset=q_offset,
                    buffers={"slopes": slopes.to(device)} if slopes is not None else None,
                    cache=cache, schedule=SCHEDULES[schedule]).cpu()
    want = reference(q, k, v, d ** -0.5 if scale is None else scale, score_ref, keep, off,
                     slopes)
    assert out.shape == want.shape and out.dtype == tdtype
    assert torch.isfinite(out).all()
    if want.numel():
        err = float((out.double() - want).abs().max())
        assert err <= tol * max(1.0, float(want.abs().max())), err


CHAIN_DRAWS = dict(tree=trees(), producer=st.sampled_from(sorted(REDUCE)),
                   consumer=st.sampled_from(sorted(REDUCE)), rows=st.integers(0, 5),
                   seed=st.integers(0, 2 ** 31 - 1))


@settings(max_examples=_examples(10, 200), **FUZZ)
@given(**CHAIN_DRAWS)
def test_fuzz_chains_compile_and_match(**drawn):
    """A random chain (see tests/algebra/test_random_chains.py), compiled: fused or not, the
    kernels agree with the float64 reference."""
    check_chain("cpu", **drawn)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@settings(max_examples=_examples(10, 200), **FUZZ)
@given(**CHAIN_DRAWS)
def test_fuzz_chains_on_gpu(**drawn):
    """The same random chains, compiled for a CUDA GPU and run there."""
    check_chain("cuda", **drawn)


def check_chain(device, tree, producer, consumer, rows, seed):
    assume(uses(tree, "r") and (uses(tree, "c") or uses(tree, "c2")))   # a chain
    k1, k2 = nf.reduce_axis(D, "k"), nf.reduce_axis(D, "k")
    prod = nf.compute((nf.size("N"),), lambda i: REDUCE[producer](X[i, k1], k1), name="p")
    out = nf.compute((nf.size("N"),), lambda i: REDUCE[consumer](
        build(tree, X[i, k2], Y[i, k2], prod[i]), k2), name="out")
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.uniform(0.5, 1.5, (rows, D)), "y": rng.uniform(-1.0, 1.0, (rows, D))}
    _compiled_matches(out, feeds, f"{tree} {producer} -> {consumer}", device)


def _compiled_matches(out, feeds: dict, label: str, device: str = "cpu") -> None:
    """``nf.compile(out)`` on float32 ``feeds`` (on ``device``) against the float64
    reference."""
    kernel = nf.compile(out)
    names = [p.name for p in kernel.inputs]
    got = kernel(*(torch.tensor(feeds[n], dtype=torch.float32, device=device)
                   for n in names)).cpu()
    want = nf.evaluate(out, {n: feeds[n] for n in names})
    assert got.shape == want.shape
    scale = np.abs(want).max(initial=1.0)
    np.testing.assert_allclose(got.double().numpy(), want, rtol=2e-4, atol=2e-5 * scale,
                               err_msg=label)


@settings(max_examples=_examples(6, 100), **FUZZ)
@given(tree=trees(), rows=st.integers(0, 5), seed=st.integers(0, 2 ** 31 - 1))
def test_fuzz_maps_compile_and_match(tree, rows, seed):
    """A random elementwise tree with no reduction at all (a map: fusion/maps.py) over
    two row tensors and a per-row value compiles and matches the float64 reference (a
    tree of constants alone has no input to size its output: refused by name)."""
    assume(uses(tree, "c") or uses(tree, "c2") or uses(tree, "r"))
    n = nf.size("N")
    z = nf.placeholder((n,), name="z")
    out = nf.compute((n, D), lambda i, j: build(tree, X[i, j], Y[i, j], z[i]), name="out")
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.uniform(0.5, 1.5, (rows, D)), "y": rng.uniform(-1.0, 1.0, (rows, D)),
             "z": rng.uniform(0.5, 1.5, (rows,))}
    _compiled_matches(out, feeds, str(tree))


@settings(max_examples=_examples(6, 100), **FUZZ)
@given(tree=trees(), producer=st.sampled_from(sorted(REDUCE)),
       outer=st.sampled_from(sorted(REDUCE)), back=st.booleans(), rows=st.integers(1, 5),
       seed=st.integers(0, 2 ** 31 - 1))
def test_fuzz_reductions_to_one_value(tree, producer, outer, back, rows, seed):
    """A random row chain reduced over its rows to one value (a 0-d output:
    fusion/scalars.py), or with ``back`` that value read by every row again (a reduction
    no output row depends on: a pass of its own); against the float64 reference."""
    assume(uses(tree, "r"))
    n = nf.size("N")
    k, r = nf.reduce_axis(D, "k"), nf.reduce_axis(n, "r")
    prod = nf.compute((n,), lambda i: REDUCE[producer](X[i, k], k), name="p")
    row = nf.compute((n,), lambda i: build(tree, X[i, 0], Y[i, 0], prod[i]), name="row")
    one = nf.compute((), lambda: REDUCE[outer](row[r], r), name="one")
    out = nf.compute((n,), lambda i: row[i] - one[()], name="out") if back else one
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.uniform(0.5, 1.5, (rows, D)), "y": rng.uniform(-1.0, 1.0, (rows, D))}
    # rows beyond float32's range are inf in any float32 kernel (exp(r^2 * r * c2) with r
    # a sum of D values: 1e84 in float64; inf - inf = NaN where the reference has 0)
    rowref = nf.evaluate(row, {p.name: feeds[p.name] for p in placeholders([row])})
    assume(np.all(np.abs(rowref[np.isfinite(rowref)]) < 1e30))
    _compiled_matches(out, feeds, f"{tree} {producer} -> {outer} back={back}")
