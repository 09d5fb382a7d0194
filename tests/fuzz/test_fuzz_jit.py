"""A bounded fuzz campaign of the torch.compile backend (plain PyTorch in): random chains
written as users write them -- a map, a reduction chain over a random dimension, a map
after it -- over random 2-d and 3-d shapes, compiled with static or dynamic shapes and
called on two shapes, each result against float64 eager PyTorch; and the same chains in
training (an input that requires grad), the gradient against float64 autograd.

The backend must never raise and never give a wrong answer: what it cannot fuse runs with
the rest (``rest="eager"`` here, the interpreter runs the kernels). CI size: a few
examples (derandomised under ``CI=1``); ``NF_FUZZ=long`` or ``NF_FUZZ=<n>`` for more.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz.test_fuzz import FUZZ, _examples
from neptune_fusion.dynamo import Backend

# before the chain (elementwise, any values)
MAPS = {
    "id": lambda t: t,
    "affine": lambda t: t * 0.5 + 1.0,
    "affine-2": lambda t: t * 1.5 + 0.25,   # affine's ops, other constants
    "tanh": lambda t: torch.tanh(t) * 3.0,
    "silu": lambda t: t * torch.sigmoid(t),
    "F.silu": F.silu,
    "softplus": lambda t: F.softplus(t) - 1.0,
    "gelu-tanh": lambda t: F.gelu(t, approximate="tanh"),
    # torch's decompositions (decomp.ACTIVATIONS): where, clamp, expm1, softplus, log1p
    "elu": F.elu,
    "mish": F.mish,
    "hardswish": F.hardswish,
    "logsigmoid": F.logsigmoid,
    "leaky_relu": lambda t: F.leaky_relu(t, 0.05),
}
# the chain over dimension d (each reads a reduction's final value, or is torch's own)
CHAINS = {
    "logsumexp": lambda t, d: torch.logsumexp(t, d),
    "softmax": lambda t, d: torch.softmax(t, d),
    "log_softmax": lambda t, d: torch.log_softmax(t, d),
    "var": lambda t, d: t.var(d),
    "centred-square": lambda t, d: (t - t.mean(d, keepdim=True)).square().sum(d),
    "tanh-sum": lambda t, d: torch.tanh(t - t.amax(d, keepdim=True)).sum(d),
    "range-ratio": lambda t, d: (t - t.amin(d, keepdim=True)).abs().mean(d)
    / (t.amax(d) - t.amin(d) + 1.0),
    "layer_norm": lambda t, d: F.layer_norm(t, (t.shape[-1],)),
    "rms": lambda t, d: t * torch.rsqrt(t.square().mean(d, keepdim=True) + 1e-6),
    "entropy": lambda t, d: -(torch.softmax(t, d) * torch.log_softmax(t, d)).sum(d),
    "max-dim": lambda t, d: t - t.max(d, keepdim=True).values + t.min(d).values.sum(),
    "std": lambda t, d: t.std(d, keepdim=True) * t,
    "norm": lambda t, d: t / (torch.linalg.vector_norm(t, dim=d, keepdim=True) + 1e-3),
    "masked-softmax": lambda t, d: torch.softmax(t.masked_fill(t > 1.5, float("-inf")), d),
    "var_mean": lambda t, d: torch.var_mean(t, d, correction=0)[0]
    - torch.var_mean(t, d)[1],
    # over d and the next dimension (adjacent, or not when d is the last, or all of them)
    "pair-norm": lambda t, d: (t - t.mean(_pair(t, d), keepdim=True)) * torch.rsqrt(
        t.var(_pair(t, d), keepdim=True, correction=0) + 1e-3),
    "pair-max": lambda t, d: t.amax(_pair(t, d), keepdim=True) - t,
}


def _pair(t, d):
    return sorted({d, (d + 1) % t.dim()})
# after the chain
POSTS = {"id": lambda y: y, "affine": lambda y: y * 2.0 - 1.0, "square": lambda y: y * y,
         # a reshape, then maps of it (the views sink below the maps: dynamo/sink.py)
         "flat-silu": lambda y: F.silu(y.reshape(y.shape[0], -1)) * 2.0,
         "flat-pair": lambda y: torch.exp(-y.reshape(-1).abs()) + y.reshape(-1),
         # losses and compound maps decomposed by our table (decomp.ELEMENTWISE)
         "bce": lambda y: F.binary_cross_entropy_with_logits(
             y, torch.sigmoid(y.detach() * 0.5), reduction="none"),
         "huber": lambda y: F.huber_loss(y, y.detach() * 0.5 + 0.1, reduction="none"),
         "rsub-lerp": lambda y: torch.lerp(1.0 - y, y * y, 0.25)}


def _fn(pre: str, chain: str, post: str, d: int):
    def fn(x):
        return POSTS[post](CHAINS[chain](MAPS[pre](x), d))
    fn.__name__ = f"{pre}_{chain}_{post}_{d}"
    return fn


shapes = st.lists(st.integers(1, 37), min_size=2, max_size=3)


@settings(max_examples=_examples(8, 300), **FUZZ)
@given(pre=st.sampled_from(sorted(MAPS)), chain=st.sampled_from(sorted(CHAINS)),
       post=st.sampled_from(sorted(POSTS)), first=shapes, grow=st.integers(1, 9),
       dim=st.integers(-3, 2), dynamic=st.sampled_from((False, True, None)),
       seed=st.integers(0, 2 ** 31 - 1))
def test_fuzz_plain_chains_through_the_backend(pre, chain, post, first, grow, dim, dynamic,
                                               seed):
    d = dim % len(first)
    second = [n + grow if k == d else n for k, n in enumerate(first)]
    fn = _fn(pre, chain, post, d)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=Backend(rest="eager"), dynamic=dynamic)
    gen = torch.Generator().manual_seed(seed)
    for shape in (first, second, first):
        x = torch.randn(*shape, generator=gen) * 2.0
        with torch.no_grad():
            got = compiled(x)
        want = fn(x.double())
        what = f"{fn.__name__} dynamic={dynamic} {shape}"
        assert got.shape == want.shape and got.dtype == x.dtype, what
        # NaN where eager PyTorch gives NaN (the variance of one element), nowhere else
        nan = want.isnan()
        assert torch.equal(got.isnan(), nan), what
        got, want = got.double()[~nan], want[~nan]
        scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
        err = float((got - want).abs().max()) if want.numel() else 0.0
        assert err <= 1e-4 * scale, f"{what}: {err}"


HALF = {"float16": (torch.float16, 2e-2), "bfloat16": (torch.bfloat16, 6e-2)}


@settings(max_examples=_examples(6, 200), **FUZZ)
@given(pre=st.sampled_from(sorted(MAPS)), chain=st.sampled_from(sorted(CHAINS)),
       post=st.sampled_from(sorted(POSTS)), shape=shapes, dim=st.integers(-3, 2),
       dtype=st.sampled_from(sorted(HALF)), seed=st.integers(0, 2 ** 31 - 1))
def test_fuzz_half_precision_chains_through_the_backend(pre, chain, post, shape, dim, dtype,
                                                        seed):
    """The same chains in float16 and bfloat16: the traced graph casts around every
    reduction (torch upcasts softmax, norms and sums), and the kernels compute in float32
    -- the rewrites that look through those casts (exp2's factor, widened scales) must
    keep the answer. Against float64 of the same rounded inputs, within the dtype's
    tolerance, or where eager PyTorch's own roundings in the dtype are the answer
    (``softplus(x) - 1`` near 0 in bfloat16, then divided by its norm: the kernel rounds
    the map as eager does), against eager in the dtype; the output keeps the input's
    dtype."""
    d = dim % len(shape)
    fn = _fn(pre, chain, post, d)
    dt, tol = HALF[dtype]
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=Backend(rest="eager"))
    x = (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2.0).to(dt)
    with torch.no_grad():
        got = compiled(x)
    want = fn(x.double())
    what = f"{fn.__name__} {dtype} {shape}"
    assert got.shape == want.shape and got.dtype == dt, what
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), what
    # values past the dtype's range are inf in eager PyTorch too (a square after the
    # chain); the rest is compared
    keep = ~nan & (want.abs() < 0.9 * torch.finfo(dt).max)
    with torch.no_grad():
        eager = fn(x).double()[keep]
    got, want = got.double()[keep], want[keep]
    if want.numel():
        err = torch.fmin((got - want).abs(), (got - eager).abs())   # NaN: the other
        assert float(err.max()) <= tol * max(1.0, float(want.abs().max())), \
            f"{what}: {float(err.max())}"


@settings(max_examples=_examples(6, 200), **FUZZ)
@given(a=st.tuples(st.sampled_from(sorted(MAPS)), st.sampled_from(sorted(CHAINS)),
                   st.sampled_from(sorted(POSTS))),
       b=st.one_of(st.none(), st.tuples(st.sampled_from(sorted(MAPS)),
                                        st.sampled_from(sorted(CHAINS)),
                                        st.sampled_from(sorted(POSTS)))),
       shape=shapes, grow=st.integers(0, 3), dim=st.integers(-3, 2),
       dynamic=st.sampled_from((False, None)), seed=st.integers(0, 2 ** 31 - 1))
def test_fuzz_repeated_layers_through_the_backend(a, b, shape, grow, dim, dynamic, seed):
    """Two chains in one graph, as a model's layers: the same chain again (``b`` None) or
    another, on the same shape or a grown one. A region of an earlier one's structure
    takes its kernel (dynamo/memo.py); each result must still be its own."""
    d = dim % len(shape)
    first, second = _fn(*a, d), _fn(*(b or a), d)

    def layers(x, y):
        return first(x), second(y)
    torch._dynamo.reset()
    compiled = torch.compile(layers, backend=Backend(rest="eager"), dynamic=dynamic)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen) * 2.0
    y = torch.randn(*[n + grow if k == d else n for k, n in enumerate(shape)],
                    generator=gen) * 2.0
    with torch.no_grad():
        got = compiled(x, y)
    for out, fn, t in zip(got, (first, second), (x, y)):
        want = fn(t.double())
        what = f"{first.__name__} / {second.__name__} {list(x.shape)} {list(y.shape)}"
        assert out.shape == want.shape, what
        nan = want.isnan()
        assert torch.equal(out.isnan(), nan), what
        kept = want[~nan]
        if kept.numel():
            err = float((out.double()[~nan] - kept).abs().max())
            assert err <= 1e-4 * max(1.0, float(kept.abs().max())), f"{what}: {err}"


@settings(max_examples=_examples(6, 200), **FUZZ)
@given(pre=st.sampled_from(sorted(MAPS)), chain=st.sampled_from(sorted(CHAINS)),
       post=st.sampled_from(sorted(POSTS)), shape=shapes, dim=st.integers(-3, 2),
       weighted=st.booleans(), seed=st.integers(0, 2 ** 31 - 1))
def test_fuzz_training_chains_through_the_backend(pre, chain, post, shape, dim, weighted,
                                                  seed):
    """The same chains with an input that requires grad (and, ``weighted``, a weight
    over the last dimension that does too, as a norm's): AOTAutograd splits forward and
    backward with the min-cut partitioner (dynamo/inductor.partition), the forward's
    chains are fused with whatever the backward saves among their outputs (boolean masks
    too). The output and the gradients of ``sum(out * c)`` for a random ``c``, against
    float64 autograd of the same function."""
    d = dim % len(shape)
    chained = _fn(pre, chain, post, d)

    def fn(x, w):
        return chained(x * w)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=Backend(rest="eager"))
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=gen) * 2.0).requires_grad_()
    w = (torch.rand(shape[-1], generator=gen) + 0.5).requires_grad_(weighted)
    ref = [t.detach().double().requires_grad_(t.requires_grad) for t in (x, w)]
    got, want = compiled(x, w), fn(*ref)
    c = torch.randn(want.shape, generator=gen)
    (got * c).sum().backward()
    (want * c.double()).sum().backward()
    what = f"{chained.__name__} weighted={weighted} {shape}"
    assert got.shape == want.shape and got.dtype == x.dtype, what
    for name, g, e, tol in (("out", got.detach(), want.detach(), 1e-4),
                            ("grad", x.grad, ref[0].grad, 1e-3),
                            ("weight grad", w.grad if weighted else x.grad,
                             ref[1].grad if weighted else ref[0].grad, 1e-3)):
        nan = e.isnan()
        assert torch.equal(g.isnan(), nan), f"{what}: {name} NaN"
        g, e = g.double()[~nan], e[~nan]
        if e.numel():
            err = float((g - e).abs().max())
            assert err <= tol * max(1.0, float(e.abs().max())), f"{what}: {name} {err}"


@settings(max_examples=_examples(4, 150), **FUZZ)
@given(pre=st.sampled_from(sorted(MAPS)), chain=st.sampled_from(sorted(CHAINS)),
       post=st.sampled_from(sorted(POSTS)), shape=shapes, dim=st.integers(-3, 2),
       dtype=st.sampled_from(sorted(HALF)), seed=st.integers(0, 2 ** 31 - 1))
def test_fuzz_half_precision_training_chains_through_the_backend(pre, chain, post, shape,
                                                                 dim, dtype, seed):
    """Training in float16 and bfloat16: the output and the input's gradient against
    float64 autograd, or where eager PyTorch's own roundings in the dtype are the answer,
    against eager autograd in the dtype (as the inference campaign above), within three
    times the dtype's tolerance (the backward's own roundings add to the forward's); a
    NaN only where eager has one. The campaign found a saved maximum of values computed
    in the kernel (``logsigmoid`` before ``tanh(t - max t)``, bfloat16), which the
    backward's recomputation did not match: NaN gradients (dynamo/partition.py,
    ``recomputed_extremum``)."""
    d = dim % len(shape)
    fn = _fn(pre, chain, post, d)
    dt, tol = HALF[dtype]
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=Backend(rest="eager"))
    gen = torch.Generator().manual_seed(seed)
    x0 = (torch.randn(*shape, generator=gen) * 2.0).to(dt)
    x, ref, eager = (x0.clone().requires_grad_(), x0.double().requires_grad_(),
                     x0.clone().requires_grad_())
    got, want, mine = compiled(x), fn(ref), fn(eager)
    c = torch.randn(want.shape, generator=gen)
    for y, cot in ((got, c), (want, c.double()), (mine, c)):
        (y.to(cot.dtype) * cot).sum().backward()
    what = f"{fn.__name__} {dtype} {shape}"
    assert got.shape == want.shape and got.dtype == dt, what
    for name, g, e, m in (("out", got.detach(), want.detach(), mine.detach()),
                          ("grad", x.grad, ref.grad, eager.grad)):
        # eager's NaN or infinity (a value past the dtype's range) is not compared
        skip = e.isnan() | ~torch.isfinite(m.double())
        assert not (g.isnan() & ~skip).any(), f"{what}: {name} NaN"
        g, e, m = g.double()[~skip], e[~skip], m.double()[~skip]
        if e.numel():
            err = float(torch.fmin((g - e).abs(), (g - m).abs()).max())
            assert err <= 3 * tol * max(1.0, float(e.abs().max())), f"{what}: {name} {err}"


# written-out attention as models write it (dynamo/written_attention.py): the scale, the
# transposed keys, the mask, a cast and an idle dropout after the softmax
SCALES = {"none": lambda s, d: s, "mul": lambda s, d: s * d ** -0.5,
          "div": lambda s, d: s / d ** 0.5, "left": lambda s, d: 0.5 * s,
          "both": lambda s, d: (s * 2.0) / d}
KEYS_T = {"transpose": lambda k: k.transpose(-1, -2), "transpose-2": lambda k: k.transpose(-2, -1),
          "mT": lambda k: k.mT}


def _keep(n, m):   # causal, the queries last; every row keeps a key
    return torch.arange(m)[None, :] <= torch.arange(n)[:, None] + max(m - n, 0)


MASKS = {
    "none": lambda s: s,
    "finfo": lambda s: s + torch.where(_keep(*s.shape[-2:]), torch.zeros((), dtype=s.dtype),
                                       torch.finfo(s.dtype).min),
    "bias": lambda s: torch.linspace(-1.0, 1.0, s.shape[-1], dtype=s.dtype) + s,
    "masked_fill": lambda s: s.masked_fill(~_keep(*s.shape[-2:]), float("-inf")),
    "where": lambda s: torch.where(_keep(*s.shape[-2:]), s, float("-inf")),
    "finite-where": lambda s: torch.where(_keep(*s.shape[-2:]), s, -1e4),
    # top-left causal at every shape: SDPA's is_causal=True instead of the mask
    "tril": lambda s: s.masked_fill(
        torch.ones(s.shape[-2:], dtype=torch.bool).tril().logical_not(), float("-inf")),
}
# in float32, cast back to the scores' dtype (the float64 reference stays float64)
SOFTMAX = {"plain": lambda s: torch.softmax(s, dim=-1),
           "float32": lambda s: F.softmax(s, dim=-1, dtype=torch.float32).to(s.dtype),
           "float": lambda s: torch.softmax(s.float(), -1).to(s.dtype)}
AFTER = {"none": lambda p, v: p, "type": lambda p, v: p.type(v.dtype),
         "to": lambda p, v: p.to(v.dtype), "dropout": lambda p, v: F.dropout(p, 0.0, True)}


@settings(max_examples=_examples(6, 200), **FUZZ)
@given(scale=st.sampled_from(sorted(SCALES)), keys=st.sampled_from(sorted(KEYS_T)),
       mask=st.sampled_from(sorted(MASKS)), after=st.sampled_from(sorted(AFTER)),
       soft=st.sampled_from(sorted(SOFTMAX)),
       lead=st.lists(st.integers(1, 3), min_size=1, max_size=2), n=st.integers(1, 19),
       m=st.integers(1, 19), d=st.sampled_from((4, 8, 12)),
       seed=st.integers(0, 2 ** 31 - 1))
def test_fuzz_written_attention_in_training(scale, keys, mask, after, soft, lead, n, m,
                                             d, seed):
    """Attention written out as models write it, in a training graph: made SDPA's call
    where written_attention.py allows, left as it is elsewhere. The output and the three
    gradients against float64 autograd."""
    def fn(q, k, v):
        s = MASKS[mask](SCALES[scale](q @ KEYS_T[keys](k), q.shape[-1]))
        return AFTER[after](SOFTMAX[soft](s), v) @ v
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=Backend(rest="eager"))
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(*lead, rows, d, generator=gen) for rows in (n, m, m)]
    got = compiled(*[x.requires_grad_() for x in xs])
    ref = [x.detach().double().requires_grad_() for x in xs]
    want = fn(*ref)
    c = torch.randn(want.shape, generator=gen)
    (got * c).sum().backward()
    (want * c.double()).sum().backward()
    what = f"{scale} {keys} {mask} {soft} {after} {lead} {n} {m} {d}"
    assert got.shape == want.shape and got.dtype == torch.float32, what
    for name, g, e in (("out", got.detach(), want.detach()),
                       *((f"d{x}", a.grad, r.grad) for x, a, r in zip("qkv", xs, ref))):
        err = float((g.double() - e).abs().max())
        assert err <= 1e-4 * max(1.0, float(e.abs().max())), f"{what}: {name} {err}"


# Bloom's form (dynamo/alibi_attention.py): a baddbmm bias, the scores viewed per head
BIAS_MASKS = {
    "none": lambda w: w,
    "finfo": lambda w: w + torch.where(_keep(*w.shape[-2:]), torch.zeros((), dtype=w.dtype),
                                       torch.finfo(w.dtype).min),
    "data": lambda w: torch.where(torch.arange(w.shape[-1]) % 3 == 1,
                                  torch.full((), torch.finfo(w.dtype).min, dtype=w.dtype),
                                  torch.zeros((), dtype=w.dtype)) + w,
}


@settings(max_examples=_examples(4, 150), **FUZZ)
@given(mask=st.sampled_from(sorted(BIAS_MASKS)), soft=st.sampled_from(sorted(SOFTMAX)),
       beta=st.sampled_from((0.0, 0.5, 1.0)), b=st.integers(1, 3), h=st.integers(1, 4),
       n=st.integers(1, 19), extra=st.sampled_from((0, 0, 3)), d=st.sampled_from((4, 8, 12)),
       seed=st.integers(0, 2 ** 31 - 1))
def test_fuzz_baddbmm_biased_attention_in_training(mask, soft, beta, b, h, n, extra, d,
                                                   seed):
    """Attention with a ``baddbmm`` per-key bias as Bloom writes it, in a training graph:
    made ``nf.attention``'s op where alibi_attention.py allows (a causal mask from
    positions becomes ``Causal()``; other masks are read as data), left as it is
    elsewhere. The output and the three gradients against float64 autograd."""
    m = n + extra

    def fn(q, k, v, bias):
        s = bias.baddbmm(q, k.transpose(-1, -2), beta=beta, alpha=d ** -0.5)
        p = SOFTMAX[soft](BIAS_MASKS[mask](s.view(b, h, n, m)))
        return torch.bmm(p.view(b * h, n, m), v)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=Backend(rest="eager"))
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(b * h, rows, d, generator=gen) for rows in (n, m, m)]
    bias = torch.randn(b * h, 1, m, generator=gen)
    got = compiled(*[x.requires_grad_() for x in xs], bias)
    ref = [x.detach().double().requires_grad_() for x in xs]
    want = fn(*ref, bias.double())
    c = torch.randn(want.shape, generator=gen)
    (got * c).sum().backward()
    (want * c.double()).sum().backward()
    what = f"{mask} {soft} beta={beta} {b}x{h} {n}x{m} {d}"
    for name, g, e in (("out", got.detach(), want.detach()),
                       *((f"d{x}", a.grad, r.grad) for x, a, r in zip("qkv", xs, ref))):
        err = float((g.double() - e).abs().max())
        assert err <= 1e-4 * max(1.0, float(e.abs().max())), f"{what}: {name} {err}"


# what reads the chain's result besides the Linear layer, if anything
BESIDE = {"none": lambda y, z: z, "residual": lambda y, z: z + y[..., :1],
          "square": lambda y, z: z * y.square().mean(-1, keepdim=True)}


@settings(max_examples=_examples(6, 200), **FUZZ)
@given(chain=st.sampled_from(sorted(CHAINS)), pre=st.sampled_from(sorted(MAPS)),
       beside=st.sampled_from(sorted(BESIDE)), bias=st.booleans(), shape=shapes,
       out=st.integers(1, 9), wants=st.sampled_from(("all", "x", "weight")),
       seed=st.integers(0, 2 ** 31 - 1))
def test_fuzz_chains_before_a_linear_layer_in_training(chain, pre, beside, bias, shape,
                                                       out, wants, seed):
    """A chain over the last dimension, then a Linear layer (``mm``/``addmm`` of its 2-d
    view), the chain's result maybe read again beside it, in training: where the
    backward saves the product's operand (the weight requires grad) the matmul runs with
    the rest (partition.without_written_operands), else it may fuse as the chain's
    epilogue. The output and every gradient against float64 autograd."""
    def fn(x, w, b):
        y = CHAINS[chain](MAPS[pre](x), -1)
        if y.dim() != x.dim():   # a reduction to fewer dimensions: spread it back
            y = y.unsqueeze(-1) * x
        return BESIDE[beside](y, F.linear(y, w, b))
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=Backend(rest="eager"))
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen) * 2.0
    w = torch.randn(out, shape[-1], generator=gen) / shape[-1] ** 0.5
    b = torch.randn(out, generator=gen) if bias else None
    grads = {"all": (True, True), "x": (True, False), "weight": (False, True)}[wants]
    xs = [x.requires_grad_(grads[0]), w.requires_grad_(grads[1])] + \
        ([b.requires_grad_(grads[1])] if bias else [None])
    ref = [None if t is None else t.detach().double().requires_grad_(t.requires_grad)
           for t in xs]
    got, want = compiled(*xs), fn(*ref)
    c = torch.randn(want.shape, generator=gen)
    (got * c).sum().backward()
    (want * c.double()).sum().backward()
    what = f"{pre} {chain} {beside} bias={bias} {shape} {out} {wants}"
    assert got.shape == want.shape, what
    pairs = [("out", got.detach(), want.detach())] + [
        (f"grad {k}", a.grad, r.grad) for k, (a, r) in enumerate(zip(xs, ref))
        if a is not None and a.requires_grad]
    for name, g, e in pairs:
        nan = e.isnan()
        assert torch.equal(g.isnan(), nan), f"{what}: {name} NaN"
        g, e = g.double()[~nan], e[~nan]
        if e.numel():
            err = float((g - e).abs().max())
            assert err <= 1e-3 * max(1.0, float(e.abs().max())), f"{what}: {name} {err}"
