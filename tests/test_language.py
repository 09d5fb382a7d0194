"""Operators written plainly in the language, checked against hand-written float64 NumPy.

Each operator is built with symbolic sizes and with concrete ones, verified, evaluated
with the reference on fresh random data, and compared at rtol 1e-12.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import neptune_fusion as nf
from neptune_fusion.frontend.examples import plain_attention

SIZES = {"B": 2, "H": 4, "KH": 2, "N": 5, "M": 7, "D": 3}
SCALE = 0.5
RTOL = ATOL = 1e-12


@pytest.fixture(params=["symbolic", "concrete"])
def ext(request):
    """Maps a size name to ``nf.size(name)`` or to its concrete value."""
    if request.param == "symbolic":
        return nf.size
    return SIZES.__getitem__


def check(outputs, feeds, expected) -> None:
    nf.verify(outputs)
    got = nf.evaluate(outputs, feeds)
    assert got.dtype == np.float64
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


# ----------------------------------------------------------------------- attention


def attention(ext, group=1, score=None, mask=None):
    """Multi-head attention over [B, H, N, D]; ``group`` query heads share a kv head."""
    B, H, N, M, D = (ext(n) for n in "B H N M D".split())
    KH = ext("KH") if group > 1 else H
    q = nf.placeholder((B, H, N, D), name="q")
    k = nf.placeholder((B, KH, M, D), name="k")
    v = nf.placeholder((B, KH, M, D), name="v")
    d = nf.reduce_axis(D, "d")

    def scores(b, h, i, j):
        s = nf.sum(q[b, h, i, d] * k[b, h // group, j, d], d) * SCALE
        if score is not None:
            s = score(s, h, i, j, H)
        if mask is not None:
            s = nf.where(mask(i, j, N, M), s, -math.inf)
        return s

    s = nf.compute((B, H, N, M), scores, name="s")
    j = nf.reduce_axis(M, "j")
    m = nf.compute((B, H, N), lambda b, h, i: nf.max(s[b, h, i, j], j), name="m")
    l = nf.compute((B, H, N), lambda b, h, i: nf.sum(nf.exp(s[b, h, i, j] - m[b, h, i]), j),  # noqa: E741
                   name="l")
    o = nf.compute(
        (B, H, N, D),
        lambda b, h, i, e: nf.sum(nf.exp(s[b, h, i, j] - m[b, h, i]) * v[b, h // group, j, e],
                                  j) / l[b, h, i],
        name="o")
    return o


def np_attention(q, k, v, group=1, score=None, mask=None):
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("bhnd,bhmd->bhnm", q, k) * SCALE
    H, N, M = s.shape[1:]
    h, i, j = np.ogrid[:H, :N, :M]
    if score is not None:
        s = score(s, h, i, j, H)
    if mask is not None:
        s = np.where(mask(i, j, N, M), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return np.einsum("bhnm,bhmd->bhnd", p, v) / p.sum(axis=-1)[..., None]


def attention_feeds(rng, group=1, q_scale=1.0):
    B, H, N, M, D = (SIZES[n] for n in "B H N M D".split())
    KH = H // group
    return {"q": q_scale * rng.standard_normal((B, H, N, D)),
            "k": rng.standard_normal((B, KH, M, D)),
            "v": rng.standard_normal((B, KH, M, D))}


VARIANTS = {
    # name: (group, nf score, numpy score, nf mask, numpy mask, scale of q)
    "plain": (1, None, None, None, None, 1.0),
    "gqa": (2, None, None, None, None, 1.0),
    "causal": (1, None, None, lambda i, j, N, M: j <= i, lambda i, j, N, M: j <= i, 1.0),
    "causal_bottom_right": (1, None, None, lambda i, j, N, M: j <= i + (M - N),
                            lambda i, j, N, M: j <= i + (M - N), 1.0),
    "sliding_window": (1, None, None, lambda i, j, N, M: (j <= i) & (j > i - 3),
                       lambda i, j, N, M: (j <= i) & (j > i - 3), 1.0),
    "alibi": (1, lambda s, h, i, j, H: s + nf.exp2(-8.0 * (h + 1) / H) * (j - i),
              lambda s, h, i, j, H: s + 2.0 ** (-8.0 * (h + 1) / H) * (j - i),
              None, None, 1.0),
    "softcap": (1, lambda s, h, i, j, H: 50.0 * nf.tanh(s / 50.0),
                lambda s, h, i, j, H: 50.0 * np.tanh(s / 50.0), None, None, 40.0),
    "gqa_causal_alibi": (2, lambda s, h, i, j, H: s + nf.exp2(-8.0 * (h + 1) / H) * (j - i),
                         lambda s, h, i, j, H: s + 2.0 ** (-8.0 * (h + 1) / H) * (j - i),
                         lambda i, j, N, M: j <= i, lambda i, j, N, M: j <= i, 1.0),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_attention_variants(variant, ext, rng):
    group, score, np_score, mask, np_mask, q_scale = VARIANTS[variant]
    o = attention(ext, group=group, score=score, mask=mask)
    feeds = attention_feeds(rng, group, q_scale)
    want = np_attention(feeds["q"], feeds["k"], feeds["v"], group, np_score, np_mask)
    check(o, feeds, want)


def test_softcap_is_active(rng):
    # Large scores make the cap change the result: it is not a no-op in the test above.
    feeds = attention_feeds(rng, 1, 40.0)
    capped = np_attention(feeds["q"], feeds["k"], feeds["v"], 1,
                          lambda s, h, i, j, H: 50.0 * np.tanh(s / 50.0))
    assert not np.allclose(capped, np_attention(feeds["q"], feeds["k"], feeds["v"]))


def test_attention_prints_readably():
    o = attention(nf.size, group=2, mask=lambda i, j, N, M: j <= i)
    text = str(o)
    for part in ("max(", "exp(", "sum(", "where(j <= i", "-inf", "q[", "k[b, h // 2, j, d]",
                 "m[b, h, i]", "l[b, h, i]", "o[b, h, i, e] ="):
        assert part in text, part
    assert len(text.splitlines()) == 7  # q, k, s, m, l, v, o
    assert nf.show(o) == text == nf.show([o])


@pytest.mark.parametrize("symbolic", [True, False])
def test_plain_attention_example(symbolic, rng):
    sizes = ("N", "M", "D") if symbolic else (4, 9, 8)
    [o], (q, k, v) = plain_attention(*sizes)
    nf.verify(o)
    qa, ka, va = (rng.standard_normal(shape) for shape in ((4, 8), (9, 8), (9, 8)))
    s = qa @ ka.T / math.sqrt(8)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    want = p @ va / p.sum(axis=1, keepdims=True)
    # feeds keyed by placeholder objects as well as by name
    np.testing.assert_allclose(nf.evaluate(o, {q: qa, k: ka, "v": va}), want, rtol=RTOL)


def test_torch_feeds(rng):
    torch = pytest.importorskip("torch")
    [o], _ = plain_attention("N", "M", "D", scale=0.25)
    arrays = {n: rng.standard_normal(shape) for n, shape in
              (("q", (3, 4)), ("k", (6, 4)), ("v", (6, 4)))}
    want = nf.evaluate(o, arrays)
    got = nf.evaluate(o, {n: torch.from_numpy(a) for n, a in arrays.items()})
    np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------------- softmax and norms


def rows(ext):
    N, D = ext("N"), ext("D")
    return N, D, nf.placeholder((N, D), name="x"), nf.reduce_axis(D, "j")


def test_softmax(ext, rng):
    N, D, x, j = rows(ext)
    m = nf.compute((N,), lambda i: nf.max(x[i, j], j), name="m")
    z = nf.compute((N,), lambda i: nf.sum(nf.exp(x[i, j] - m[i]), j), name="z")
    y = nf.compute((N, D), lambda i, c: nf.exp(x[i, c] - m[i]) / z[i], name="y")
    xa = 3 * rng.standard_normal((5, 3))
    e = np.exp(xa - xa.max(axis=1, keepdims=True))
    check(y, {"x": xa}, e / e.sum(axis=1, keepdims=True))


def test_log_softmax(ext, rng):
    N, D, x, j = rows(ext)
    m = nf.compute((N,), lambda i: nf.max(x[i, j], j), name="m")
    y = nf.compute((N, D), lambda i, c: x[i, c] - m[i] - nf.log(
        nf.sum(nf.exp(x[i, j] - m[i]), j)), name="y")
    xa = 3 * rng.standard_normal((5, 3))
    sh = xa - xa.max(axis=1, keepdims=True)
    check(y, {"x": xa}, sh - np.log(np.exp(sh).sum(axis=1, keepdims=True)))


def test_log_sum_exp(ext, rng):
    N, D, x, j = rows(ext)
    m = nf.compute((N,), lambda i: nf.max(x[i, j], j), name="m")
    lse = nf.compute((N,), lambda i: m[i] + nf.log(nf.sum(nf.exp(x[i, j] - m[i]), j)),
                     name="lse")
    xa = 3 * rng.standard_normal((5, 3))
    mx = xa.max(axis=1)
    check(lse, {"x": xa}, mx + np.log(np.exp(xa - mx[:, None]).sum(axis=1)))


def test_log_sum_exp_of_a_vector_is_a_scalar(ext, rng):
    M = ext("M")
    x = nf.placeholder((M,), name="x")
    j = nf.reduce_axis(M, "j")
    m = nf.compute((), lambda: nf.max(x[j], j), name="m")
    lse = nf.compute((), lambda: m[()] + nf.log(nf.sum(nf.exp(x[j] - m[()]), j)), name="lse")
    xa = rng.standard_normal(7)
    check(lse, {"x": xa}, np.asarray(xa.max() + np.log(np.exp(xa - xa.max()).sum())))


def test_layer_norm(ext, rng):
    N, D, x, j = rows(ext)
    w = nf.placeholder((D,), name="w")
    b = nf.placeholder((D,), name="b")
    mean = nf.compute((N,), lambda i: nf.sum(x[i, j], j) / D, name="mean")
    var = nf.compute((N,), lambda i: nf.sum((x[i, j] - mean[i]) ** 2, j) / D, name="var")
    y = nf.compute((N, D), lambda i, c: (x[i, c] - mean[i]) * nf.rsqrt(var[i] + 1e-5) * w[c]
                   + b[c], name="y")
    xa, wa, ba = 2 + rng.standard_normal((5, 3)), rng.standard_normal(3), rng.standard_normal(3)
    mu = xa.mean(axis=1, keepdims=True)
    sd = np.sqrt(((xa - mu) ** 2).mean(axis=1, keepdims=True) + 1e-5)
    check(y, {"x": xa, "w": wa, "b": ba}, (xa - mu) / sd * wa + ba)


def test_rms_norm(ext, rng):
    N, D, x, j = rows(ext)
    w = nf.placeholder((D,), name="w")
    y = nf.compute((N, D), lambda i, c: x[i, c] * nf.rsqrt(nf.sum(x[i, j] * x[i, j], j) / D
                                                           + 1e-6) * w[c], name="y")
    xa, wa = rng.standard_normal((5, 3)), rng.standard_normal(3)
    want = xa / np.sqrt((xa ** 2).mean(axis=1, keepdims=True) + 1e-6) * wa
    check(y, {"x": xa, "w": wa}, want)


def test_norms_print_readably(ext):
    N, D, x, j = rows(ext)
    mean = nf.compute((N,), lambda i: nf.sum(x[i, j], j) / D, name="mean")
    var = nf.compute((N,), lambda i: nf.sum((x[i, j] - mean[i]) ** 2, j) / D, name="var")
    d = "D" if ext is nf.size else "3.0"  # a concrete int extent is weakly typed: float
    assert f"var[i] = sum((x[i, j] - mean[i]) ** 2.0, j) / {d}" in str(var)


# ----------------------------------------------------------------- reference semantics


def test_out_of_range_loads_read_nan_unless_guarded(rng):
    N = nf.size("N")
    x = nf.placeholder((N,), name="x")
    shifted = nf.compute((N,), lambda i: x[i - 1], name="shifted")
    guarded = nf.compute((N,), lambda i: nf.where(i >= 1, x[i - 1], 0.0), name="guarded")
    xa = rng.standard_normal(4)
    got = nf.evaluate(shifted, {"x": xa})
    assert np.isnan(got[0]) and np.array_equal(got[1:], xa[:-1])
    np.testing.assert_array_equal(nf.evaluate(guarded, {"x": xa}), np.r_[0.0, xa[:-1]])


def test_empty_reductions_give_the_identity():
    N, M = nf.sizes("N M")
    x = nf.placeholder((N, M), name="x")
    j = nf.reduce_axis(M, "j")
    outs = [nf.compute((N,), lambda i, op=op: op(x[i, j], j), name=op.__name__)
            for op in (nf.sum, nf.prod, nf.max, nf.min)]
    got = nf.evaluate(outs, {"x": np.zeros((2, 0))})
    for g, want in zip(got, (0.0, 1.0, -np.inf, np.inf)):
        np.testing.assert_array_equal(g, [want, want])


def test_fully_masked_softmax_row_is_nan(rng):
    x = nf.placeholder((3, 4), name="x")
    j = nf.reduce_axis(4, "j")
    s = nf.compute((3, 4), lambda i, c: nf.where(c < i, x[i, c], -math.inf), name="s")
    m = nf.compute((3,), lambda i: nf.max(s[i, j], j), name="m")
    z = nf.compute((3,), lambda i: nf.sum(nf.exp(s[i, j] - m[i]), j), name="z")
    got = nf.evaluate(z, {"x": rng.standard_normal((3, 4))})
    assert np.isnan(got[0]) and np.all(np.isfinite(got[1:]))  # row 0 keeps no key


def test_float_math_is_float64_and_casts_do_not_round(rng):
    x = nf.placeholder((3,), "float16", name="x")
    y = nf.compute((3,), lambda i: nf.cast(x[i] / 3.0, "bfloat16"), name="y")
    assert y.dtype == nf.bfloat16
    xa = rng.standard_normal(3)
    np.testing.assert_array_equal(nf.evaluate(y, {"x": xa}), xa / 3.0)


def test_integer_semantics(rng):
    n = nf.placeholder((4,), "int32", name="n")
    y = nf.compute((4,), lambda i: n[i] // 3 + n[i] % 3 * 10, name="y")
    f = nf.compute((4,), lambda i: nf.cast(nf.cast(n[i], "float32") / 2.0, "int64"), name="f")
    na = np.array([-7, -1, 5, 8])
    np.testing.assert_array_equal(nf.evaluate(y, {"n": na}), na // 3 + na % 3 * 10)
    np.testing.assert_array_equal(nf.evaluate(f, {"n": na}), np.trunc(na / 2.0))
