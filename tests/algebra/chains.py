"""The catalogue of reduction chains the algebra must fuse, written plainly.

Each builder returns ``(outputs, feeds_fn)``; ``feeds_fn(rng)`` draws fresh random inputs.
"""

from __future__ import annotations

import math

import numpy as np

import neptune_fusion as nf

INF = float("inf")


def _attention_4d(hq=4, hkv=2, n=6, m=11, d=8, score_mod=None, mask=None, decode=False):
    """Plain grouped-query attention over (B, H, N, D) tensors."""
    B, N, M = 2, (1 if decode else n), m
    q = nf.placeholder((B, hq, N, d), "float16", name="q")
    k = nf.placeholder((B, hkv, M, d), "float16", name="k")
    v = nf.placeholder((B, hkv, M, d), "float16", name="v")
    g = hq // hkv
    c = nf.reduce_axis(d, "c")
    j = nf.reduce_axis(M, "j")
    offset = M - N  # absolute query position = i + offset (decode: the last key)

    def score(b, h, i, jj):
        s = nf.sum(q[b, h, i, c] * k[b, h // g, jj, c], c) * (1 / math.sqrt(d))
        if score_mod is not None:
            s = score_mod(s, b, h, i + offset, jj)
        if mask is not None:
            s = nf.where(mask(b, h, i + offset, jj), s, -INF)
        return s

    s = nf.compute((B, hq, N, M), score, name="s")
    mx = nf.compute((B, hq, N), lambda b, h, i: nf.max(s[b, h, i, j], j), name="m")
    p = nf.compute((B, hq, N, M), lambda b, h, i, jj: nf.exp(s[b, h, i, jj] - mx[b, h, i]),
                   name="p")
    l = nf.compute((B, hq, N), lambda b, h, i: nf.sum(p[b, h, i, j], j), name="l")  # noqa: E741
    o = nf.compute((B, hq, N, d),
                   lambda b, h, i, e: nf.sum(p[b, h, i, j] * v[b, h // g, j, e], j) / l[b, h, i],
                   name="o")

    def feeds(rng):
        return {"q": rng.standard_normal((B, hq, N, d)), "k": rng.standard_normal((B, hkv, M, d)),
                "v": rng.standard_normal((B, hkv, M, d))}
    return [o], feeds


def attention():
    return _attention_4d()


def causal():
    return _attention_4d(mask=lambda b, h, i, j: j <= i)


def window():
    return _attention_4d(m=13, n=13, mask=lambda b, h, i, j: (j <= i) & (i - j < 4))


def alibi():
    H = 4
    return _attention_4d(hkv=4, mask=lambda b, h, i, j: j <= i,
                         score_mod=lambda s, b, h, i, j: s + nf.exp2(
                             -8.0 * nf.cast(h + 1, "float32") / H) * nf.cast(j - i, "float32"))


def softcap():
    return _attention_4d(mask=lambda b, h, i, j: j <= i,
                         score_mod=lambda s, b, h, i, j: 50.0 * nf.tanh(s / 50.0))


def decode_gqa():
    return _attention_4d(hq=8, hkv=2, m=17, decode=True, mask=lambda b, h, i, j: j <= i)


def _rows(n=5, d=19):
    N = nf.size("N")
    x = nf.placeholder((N, d), name="x")
    return N, x, (lambda rng: {"x": rng.standard_normal((n, d))})


def softmax():
    N, x, feeds = _rows()
    k = nf.reduce_axis(x.shape[1], "k")
    m = nf.compute((N,), lambda i: nf.max(x[i, k], k), name="m")
    l = nf.compute((N,), lambda i: nf.sum(nf.exp(x[i, k] - m[i]), k), name="l")  # noqa: E741
    y = nf.compute(x.shape, lambda i, j: nf.exp(x[i, j] - m[i]) / l[i], name="y")
    return [y], feeds


def log_softmax():
    N, x, feeds = _rows()
    k = nf.reduce_axis(x.shape[1], "k")
    m = nf.compute((N,), lambda i: nf.max(x[i, k], k), name="m")
    y = nf.compute(x.shape, lambda i, j: x[i, j] - m[i] - nf.log(
        nf.sum(nf.exp(x[i, k] - m[i]), k)), name="y")
    return [y], feeds


def logsumexp():
    N, x, feeds = _rows()
    k = nf.reduce_axis(x.shape[1], "k")
    y = nf.compute((N,), lambda i: nf.max(x[i, k], k) + nf.log(
        nf.sum(nf.exp(x[i, k] - nf.max(x[i, k], k)), k)), name="lse")
    return [y], feeds


def _norm_matmul(kind: str, d=24, n=5, kout=7, mean=0.0):
    N = nf.size("N")
    x = nf.placeholder((N, d), name="x")
    w = nf.placeholder((d,), name="w")
    W = nf.placeholder((d, kout), name="W")
    c = nf.reduce_axis(d, "c")
    if kind == "rms":
        ms = nf.compute((N,), lambda i: nf.sum(x[i, c] * x[i, c], c) / d, name="ms")
        y = nf.compute((N, d), lambda i, e: x[i, e] * nf.rsqrt(ms[i] + 1e-6) * w[e], name="y")
    elif kind == "l2":
        ss = nf.compute((N,), lambda i: nf.sum(x[i, c] ** 2, c), name="ss")
        y = nf.compute((N, d), lambda i, e: x[i, e] / nf.sqrt(ss[i]) * w[e], name="y")
    else:
        b = nf.placeholder((d,), name="b")
        mu = nf.compute((N,), lambda i: nf.sum(x[i, c], c) / d, name="mean")
        var = nf.compute((N,), lambda i: nf.sum((x[i, c] - mu[i]) ** 2, c) / d, name="var")
        y = nf.compute((N, d), lambda i, e: (x[i, e] - mu[i]) * nf.rsqrt(var[i] + 1e-5) * w[e]
                       + b[e], name="y")
    out = nf.compute((N, kout), lambda i, o: nf.sum(y[i, c] * W[c, o], c), name="out")

    def feeds(rng):
        f = {"x": rng.standard_normal((n, d)) + mean, "w": rng.standard_normal(d),
             "W": rng.standard_normal((d, kout))}
        if kind == "layer":
            f["b"] = rng.standard_normal(d)
        return {key: v.astype(np.float32).astype(np.float64) for key, v in f.items()}
    return [out], feeds


def rmsnorm_matmul():
    return _norm_matmul("rms")


def l2norm_matmul():
    return _norm_matmul("l2")


def layernorm_matmul():
    return _norm_matmul("layer")


def variance():
    N, x, feeds = _rows(d=23)
    d = x.shape[1]
    k = nf.reduce_axis(d, "k")
    mu = nf.compute((N,), lambda i: nf.sum(x[i, k], k) / d, name="mean")
    var = nf.compute((N,), lambda i: nf.sum((x[i, k] - mu[i]) ** 2, k) / d, name="var")
    return [var], feeds


def performer():
    """Two producers: g = a * exp(c1 - r1 - b * c2) / r2, reduced by max (no pull-out)."""
    N, x, _ = _rows()
    d = x.shape[1]
    y = nf.placeholder((N, d), name="y")
    a = nf.placeholder((d,), name="a")
    k = nf.reduce_axis(d, "k")
    r1 = nf.compute((N,), lambda i: nf.max(x[i, k], k), name="r1")
    r2 = nf.compute((N,), lambda i: nf.sum(nf.exp(x[i, k] - r1[i]), k), name="r2")
    out = nf.compute((N,), lambda i: nf.max(
        a[k] * nf.exp(x[i, k] - r1[i] - 0.5 * y[i, k]) / r2[i], k), name="out")
    tot = nf.compute((N,), lambda i: nf.sum(
        a[k] * nf.exp(x[i, k] - r1[i] - 0.5 * y[i, k]) / r2[i], k), name="tot")

    def feeds(rng):
        return {"x": rng.standard_normal((5, d)), "y": rng.standard_normal((5, d)),
                "a": rng.uniform(0.5, 2.0, d)}
    return [out, tot], feeds


def tanh_chain():
    """Not fusable: sum_j tanh(c_j - max_j c_j) proves neither way."""
    N, x, feeds = _rows()
    k = nf.reduce_axis(x.shape[1], "k")
    y = nf.compute((N,), lambda i: nf.sum(nf.tanh(x[i, k] - nf.max(x[i, k], k)), k), name="t")
    return [y], feeds


FUSABLE = {f.__name__: f for f in (
    attention, causal, window, alibi, softcap, decode_gqa, softmax, log_softmax, logsumexp,
    rmsnorm_matmul, l2norm_matmul, layernorm_matmul, variance, performer)}


def prod_chain():
    """A product consumer: prod_k exp(x_k * r), r = max; h(t) = t ** (r' / r)."""
    N, x, _ = _rows(d=7)
    k = nf.reduce_axis(x.shape[1], "k")
    r = nf.compute((N,), lambda i: nf.max(x[i, k], k), name="r")
    out = nf.compute((N,), lambda i: nf.prod(nf.exp(x[i, k] * r[i] * 0.25), k), name="out")
    return [out], (lambda rng: {"x": rng.uniform(0.5, 1.5, (5, 7))})


def min_chain():
    """Min consumer of a min producer and of a sum (a mean): shifts repair by addition."""
    N, x, feeds = _rows()
    d = x.shape[1]
    k = nf.reduce_axis(d, "k")
    lo = nf.compute((N,), lambda i: nf.min(x[i, k], k), name="lo")
    mu = nf.compute((N,), lambda i: nf.sum(x[i, k], k) / d, name="mu")
    out = nf.compute((N,), lambda i: nf.min(x[i, k] - lo[i] + 2.0 * mu[i], k), name="out")
    return [out], feeds


FUSABLE.update({f.__name__: f for f in (prod_chain, min_chain)})
