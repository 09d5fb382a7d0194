"""The chain suite's workloads (``neptune-fusion bench --suite chains``): one table.

Each :class:`Chain` is defined once here, in three independent spellings:

* ``build(dtype)``: the neptune-fusion program with symbolic sizes (``N``, ``M``, ``D``,
  ``K``), its outputs and its inputs in argument order;
* ``plain(*tensors)``: the same chain as a user writes it in plain PyTorch (timed eagerly
  and under ``torch.compile``). Like production code (LLaMA's RMSNorm) it computes the
  reductions in float32 and returns the input dtype; the projection of the norm chains
  runs in the input dtype;
* ``reference(*tensors)``: float64 with torch's library functions (``logsumexp``,
  ``layer_norm``, ``var``...), run on the inputs' device: the correctness gate's truth.
  The tests check it against ``nf.evaluate`` of ``build``'s program on CPU.

Sizes are the user-facing ones of BENCHMARKS.md (4096 rows of 32768 columns, 4096^3
projections); ``smoke`` sizes are tiny and ragged for the CPU run under the interpreter.
``single_pass`` says whether the chain is expected to fuse into one pass (the geometric
mean of the report covers those); ``bound`` picks the ceiling of the % column.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

import neptune_fusion as nf

Bound = Literal["memory", "compute"]
Sizes = dict[str, int]
EPS_RMS = 1e-6
EPS_LN = 1e-5
VARIANCE_MEAN = 100.0


Dims = tuple[str, ...]
"""A shape as size names: ``("N", "M")``."""


@dataclass(frozen=True, slots=True)
class Chain:
    """One chain of the suite: its three spellings, inputs, work counts and sizes."""

    name: str
    description: str
    build: Callable[[str], tuple[list, list]]
    plain: Callable[..., object]
    reference: Callable[..., object]
    inputs: tuple[tuple[str, Dims], ...]  # (argument name, shape), in argument order
    outputs: tuple[Dims, ...]            # each output's shape
    sizes: Sizes                         # the GPU run's sizes
    smoke: Sizes                         # the CPU smoke run's sizes
    bound: Bound = "memory"
    single_pass: bool = True
    mean: float = 0.0                    # added to the N(0, 1) input ``x``

    @property
    def contraction(self) -> bool:
        """Whether the chain ends in a projection (``K`` sizes its output)."""
        return "K" in self.sizes

    def shapes(self, sizes: Sizes) -> dict[str, tuple[int, ...]]:
        """Each input's shape at ``sizes``, in argument order."""
        return {name: tuple(sizes[d] for d in dims) for name, dims in self.inputs}

    def output_shapes(self, sizes: Sizes) -> list[tuple[int, ...]]:
        """Each output's shape at ``sizes``."""
        return [tuple(sizes[d] for d in dims) for dims in self.outputs]

    def bytes_moved(self, sizes: Sizes, elem_size: int) -> int:
        """Bytes of every input read once plus every output written once (the int64
        targets ``t`` at 8 bytes each, the rest at ``elem_size``)."""
        shapes = self.shapes(sizes)
        data = [s for name, s in shapes.items() if name != "t"] + self.output_shapes(sizes)
        targets = math.prod(shapes["t"]) if "t" in shapes else 0
        return sum(math.prod(s) for s in data) * elem_size + 8 * targets

    def flops(self, sizes: Sizes) -> int:
        """Multiply-adds of the projection times two (0 for the chains without one)."""
        return 2 * sizes["N"] * sizes["D"] * sizes["K"] if self.contraction else 0


# -- neptune-fusion programs ---------------------------------------------------------

def _rows(dtype: str):
    n, m = nf.sizes("N M")
    x = nf.placeholder((n, m), dtype, name="x")
    return n, x, nf.reduce_axis(m, "k")


def _build_logsumexp(dtype):
    n, x, k = _rows(dtype)
    mx = nf.compute((n,), lambda i: nf.max(x[i, k], k), name="m")
    lse = nf.compute((n,), lambda i: mx[i] + nf.log(nf.sum(nf.exp(x[i, k] - mx[i]), k)),
                     name="lse")
    return [lse], [x]


def _build_softmax_denominator(dtype):
    n, x, k = _rows(dtype)
    mx = nf.compute((n,), lambda i: nf.max(x[i, k], k), name="m")
    den = nf.compute((n,), lambda i: nf.sum(nf.exp(x[i, k] - mx[i]), k), name="l")
    return [den], [x]


def _build_softmax(dtype):
    n, x, k = _rows(dtype)
    mx = nf.compute((n,), lambda i: nf.max(x[i, k], k), name="m")
    den = nf.compute((n,), lambda i: nf.sum(nf.exp(x[i, k] - mx[i]), k), name="l")
    y = nf.compute(x.shape, lambda i, j: nf.exp(x[i, j] - mx[i]) / den[i], name="y")
    return [y], [x]


def _build_log_softmax(dtype):
    n, x, k = _rows(dtype)
    mx = nf.compute((n,), lambda i: nf.max(x[i, k], k), name="m")
    den = nf.compute((n,), lambda i: nf.sum(nf.exp(x[i, k] - mx[i]), k), name="l")
    y = nf.compute(x.shape, lambda i, j: x[i, j] - mx[i] - nf.log(den[i]), name="y")
    return [y], [x]


def _build_cross_entropy(dtype):
    n, x, k = _rows(dtype)
    t = nf.placeholder((n,), "int64", name="t")
    mx = nf.compute((n,), lambda i: nf.max(x[i, k], k), name="m")
    den = nf.compute((n,), lambda i: nf.sum(nf.exp(x[i, k] - mx[i]), k), name="l")
    loss = nf.compute((n,), lambda i: mx[i] + nf.log(den[i]) - x[i, t[i]], name="loss")
    return [loss], [x, t]


def _softmax_stats(x, n, k, name):
    mx = nf.compute((n,), lambda i: nf.max(x[i, k], k), name=f"m{name}")
    den = nf.compute((n,), lambda i: nf.sum(nf.exp(x[i, k] - mx[i]), k), name=f"l{name}")
    return mx, den


def _build_entropy(dtype):
    n, x, k = _rows(dtype)
    mx, den = _softmax_stats(x, n, k, "")
    h = nf.compute((n,), lambda i: -nf.sum(nf.exp(x[i, k] - mx[i]) / den[i]
                                           * (x[i, k] - mx[i] - nf.log(den[i])), k),
                   name="entropy")
    return [h], [x]


def _build_kl(dtype):
    n, x, k = _rows(dtype)
    y = nf.placeholder(x.shape, dtype, name="y")
    mx, lx = _softmax_stats(x, n, k, "x")
    my, ly = _softmax_stats(y, n, k, "y")

    def term(i):   # p_y * (log p_y - log p_x)
        log_py = y[i, k] - my[i] - nf.log(ly[i])
        log_px = x[i, k] - mx[i] - nf.log(lx[i])
        return nf.exp(log_py) * (log_py - log_px)
    kl = nf.compute((n,), lambda i: nf.sum(term(i), k), name="kl")
    return [kl], [x, y]


def _mean_var(n, x, k):
    m = x.shape[1]
    mu = nf.compute((n,), lambda i: nf.sum(x[i, k], k) / m, name="mean")
    var = nf.compute((n,), lambda i: nf.sum((x[i, k] - mu[i]) ** 2, k) / m, name="var")
    return mu, var


def _build_variance(dtype):
    n, x, k = _rows(dtype)
    return [_mean_var(n, x, k)[1]], [x]


def _build_layer_stats(dtype):
    n, x, k = _rows(dtype)
    mu, var = _mean_var(n, x, k)
    rstd = nf.compute((n,), lambda i: nf.rsqrt(var[i] + EPS_LN), name="rstd")
    return [mu, rstd], [x]


def _build_tanh_sum(dtype):
    n, x, k = _rows(dtype)
    mx = nf.compute((n,), lambda i: nf.max(x[i, k], k), name="m")
    t = nf.compute((n,), lambda i: nf.sum(nf.tanh(x[i, k] - mx[i]), k), name="t")
    return [t], [x]


def _build_norm_matmul(kind: str):
    def build(dtype):
        n, d, kout = nf.sizes("N D K")
        x = nf.placeholder((n, d), dtype, name="x")
        w = nf.placeholder((d,), dtype, name="w")
        big_w = nf.placeholder((d, kout), dtype, name="W")
        c = nf.reduce_axis(d, "c")
        inputs = [x, w, big_w]
        if kind == "rms":
            ms = nf.compute((n,), lambda i: nf.sum(x[i, c] * x[i, c], c) / d, name="ms")
            y = nf.compute((n, d), lambda i, e: x[i, e] * nf.rsqrt(ms[i] + EPS_RMS) * w[e],
                           name="y")
        elif kind == "l2":
            ss = nf.compute((n,), lambda i: nf.sum(x[i, c] * x[i, c], c), name="ss")
            y = nf.compute((n, d), lambda i, e: x[i, e] / nf.sqrt(ss[i]) * w[e], name="y")
        else:
            b = nf.placeholder((d,), dtype, name="b")
            inputs = [x, w, b, big_w]
            mu, var = _mean_var(n, x, c)
            y = nf.compute((n, d), lambda i, e: (x[i, e] - mu[i]) * nf.rsqrt(var[i] + EPS_LN)
                           * w[e] + b[e], name="y")
        out = nf.compute((n, kout), lambda i, o: nf.sum(y[i, c] * big_w[c, o], c), name="out")
        return [out], inputs
    return build


# -- plain PyTorch (float32 statistics, input dtype out) ------------------------------

def _plain_logsumexp(x):
    xf = x.float()
    m = xf.amax(dim=-1, keepdim=True)
    return (m.squeeze(-1) + torch.log(torch.exp(xf - m).sum(dim=-1))).to(x.dtype)


def _plain_softmax_denominator(x):
    xf = x.float()
    return torch.exp(xf - xf.amax(dim=-1, keepdim=True)).sum(dim=-1).to(x.dtype)


def _plain_softmax(x):
    xf = x.float()
    p = torch.exp(xf - xf.amax(dim=-1, keepdim=True))
    return (p / p.sum(dim=-1, keepdim=True)).to(x.dtype)


def _plain_log_softmax(x):
    xf = x.float()
    s = xf - xf.amax(dim=-1, keepdim=True)
    return (s - torch.log(torch.exp(s).sum(dim=-1, keepdim=True))).to(x.dtype)


def _plain_cross_entropy(x, t):
    return F.cross_entropy(x.float(), t, reduction="none").to(x.dtype)


def _plain_variance(x):
    xf = x.float()
    return ((xf - xf.mean(dim=-1, keepdim=True)) ** 2).mean(dim=-1).to(x.dtype)


def _plain_layer_stats(x):
    xf = x.float()
    mu = xf.mean(dim=-1, keepdim=True)
    var = ((xf - mu) ** 2).mean(dim=-1)
    return mu.squeeze(-1).to(x.dtype), torch.rsqrt(var + EPS_LN).to(x.dtype)


def _plain_tanh_sum(x):
    xf = x.float()
    return torch.tanh(xf - xf.amax(dim=-1, keepdim=True)).sum(dim=-1).to(x.dtype)


def _plain_entropy(x):
    xf = x.float()
    return -(torch.softmax(xf, -1) * torch.log_softmax(xf, -1)).sum(-1).to(x.dtype)


def _plain_kl(x, y):
    """KL(softmax(y) || softmax(x)) per row, as distillation losses write it."""
    return F.kl_div(torch.log_softmax(x.float(), -1), torch.log_softmax(y.float(), -1),
                    reduction="none", log_target=True).sum(-1).to(x.dtype)


def _plain_rmsnorm_matmul(x, w, big_w):
    xf = x.float()
    y = xf * torch.rsqrt((xf * xf).mean(dim=-1, keepdim=True) + EPS_RMS) * w.float()
    return y.to(x.dtype) @ big_w


def _plain_l2norm_matmul(x, w, big_w):
    xf = x.float()
    y = xf / torch.sqrt((xf * xf).sum(dim=-1, keepdim=True)) * w.float()
    return y.to(x.dtype) @ big_w


def _plain_layernorm_matmul(x, w, b, big_w):
    xf = x.float()
    mu = xf.mean(dim=-1, keepdim=True)
    var = ((xf - mu) ** 2).mean(dim=-1, keepdim=True)
    y = (xf - mu) * torch.rsqrt(var + EPS_LN) * w.float() + b.float()
    return y.to(x.dtype) @ big_w


# -- float64 references (torch library functions) -------------------------------------

def _ref_cross_entropy(x, t):
    return F.cross_entropy(x, t, reduction="none")


def _ref_layer_stats(x):
    var, mu = torch.var_mean(x, dim=-1, correction=0)
    return mu, torch.rsqrt(var + EPS_LN)


def _ref_log_softmax(x):
    return torch.log_softmax(x, dim=-1)


def _ref_softmax(x):
    return torch.softmax(x, dim=-1)


def _ref_entropy(x):
    return torch.distributions.Categorical(logits=x).entropy()


def _ref_kl(x, y):
    px, py = torch.log_softmax(x, -1), torch.log_softmax(y, -1)
    return (py.exp() * (py - px)).sum(-1)


def _ref_rms(x, w, big_w):
    return F.rms_norm(x, (x.shape[-1],), w, eps=EPS_RMS) @ big_w


def _ref_l2(x, w, big_w):
    return (F.normalize(x, dim=-1, eps=0.0) * w) @ big_w


def _ref_layer(x, w, b, big_w):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=EPS_LN) @ big_w


ROWS = {"N": 4096, "M": 32768}
ROWS_SMOKE = {"N": 5, "M": 33}
PROJ = {"N": 4096, "D": 4096, "K": 4096}
PROJ_SMOKE = {"N": 5, "D": 29, "K": 7}


ROW_IN = (("x", ("N", "M")),)
LABELED_IN = (("x", ("N", "M")), ("t", ("N",)))   # t: int64 class ids in [0, M)
PAIR_IN = (("x", ("N", "M")), ("y", ("N", "M")))   # y: a second row of logits, N(0, 1)
PROJ_IN = (("x", ("N", "D")), ("w", ("D",)), ("W", ("D", "K")))
LN_IN = (("x", ("N", "D")), ("w", ("D",)), ("b", ("D",)), ("W", ("D", "K")))
PER_ROW = (("N",),)
PER_ELEMENT = (("N", "M"),)
PROJECTED = (("N", "K"),)


def _chain(name, description, build, plain, reference, *, inputs=ROW_IN, outputs=PER_ROW,
           sizes=None, smoke=None, **kw) -> Chain:
    return Chain(name, description, build, plain, reference, inputs, outputs,
                 dict(sizes or ROWS), dict(smoke or ROWS_SMOKE), **kw)


CHAINS: dict[str, Chain] = {c.name: c for c in (
    _chain("rmsnorm-matmul", "RMSNorm (weight w) then x_n @ W", _build_norm_matmul("rms"),
           _plain_rmsnorm_matmul, _ref_rms, inputs=PROJ_IN, outputs=PROJECTED, sizes=PROJ,
           smoke=PROJ_SMOKE, bound="compute"),
    _chain("layernorm-matmul", "LayerNorm (w, b) then x_n @ W", _build_norm_matmul("layer"),
           _plain_layernorm_matmul, _ref_layer, inputs=LN_IN, outputs=PROJECTED, sizes=PROJ,
           smoke=PROJ_SMOKE, bound="compute"),
    _chain("l2norm-matmul", "x / ||x|| * w then @ W", _build_norm_matmul("l2"),
           _plain_l2norm_matmul, _ref_l2, inputs=PROJ_IN, outputs=PROJECTED, sizes=PROJ,
           smoke=PROJ_SMOKE, bound="compute"),
    _chain("logsumexp", "max + log sum exp(x - max): the cross-entropy normaliser",
           _build_logsumexp, _plain_logsumexp, lambda x: torch.logsumexp(x, dim=-1)),
    _chain("logsumexp-128k", "log-sum-exp over a 128k vocabulary", _build_logsumexp,
           _plain_logsumexp, lambda x: torch.logsumexp(x, dim=-1),
           sizes={"N": 4096, "M": 131072}, smoke={"N": 3, "M": 64}),
    _chain("cross-entropy", "per-row loss max + log sum exp(x - max) - x[t] (int64 targets)",
           _build_cross_entropy, _plain_cross_entropy, _ref_cross_entropy,
           inputs=LABELED_IN, sizes={"N": 4096, "M": 131072}, smoke={"N": 3, "M": 64}),
    _chain("log-softmax", "x - max - log sum exp(x - max)", _build_log_softmax,
           _plain_log_softmax, _ref_log_softmax, outputs=PER_ELEMENT),
    _chain("softmax", "exp(x - max) / sum exp(x - max)", _build_softmax, _plain_softmax,
           _ref_softmax, outputs=PER_ELEMENT),
    _chain("softmax-denominator", "sum exp(x - max) (max, then the sum)",
           _build_softmax_denominator, _plain_softmax_denominator,
           lambda x: torch.exp(x - x.amax(dim=-1, keepdim=True)).sum(dim=-1)),
    _chain("variance", "mean((x - mean)^2), x ~ N(100, 1)", _build_variance, _plain_variance,
           lambda x: torch.var(x, dim=-1, correction=0), mean=VARIANCE_MEAN),
    _chain("layer-stats", "mean and rsqrt(var + eps), x ~ N(100, 1): two outputs",
           _build_layer_stats, _plain_layer_stats, _ref_layer_stats, outputs=PER_ROW * 2,
           mean=VARIANCE_MEAN),
    _chain("softmax-entropy", "-sum p log p, p = softmax(x) (a policy's entropy)",
           _build_entropy, _plain_entropy, _ref_entropy),
    _chain("kl-divergence", "sum p_y (log p_y - log p_x), two rows of logits (distillation)",
           _build_kl, _plain_kl, _ref_kl, inputs=PAIR_IN),
    _chain("tanh-sum", "sum tanh(x - max): cannot fuse (multi-pass)", _build_tanh_sum,
           _plain_tanh_sum, lambda x: torch.tanh(x - x.amax(dim=-1, keepdim=True)).sum(-1),
           single_pass=False),
)}


def chain_names() -> tuple[str, ...]:
    """The chains, in table order."""
    return tuple(CHAINS)


def select_chains(names: Sequence[str] | None) -> tuple[Chain, ...]:
    """The chains named (case-insensitive), in table order; all of them for None/empty."""
    if not names:
        return tuple(CHAINS.values())
    lower = {n.lower(): n for n in CHAINS}
    unknown = [n for n in names if n.lower() not in lower]
    if unknown:
        raise ValueError(f"unknown chain(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(CHAINS)}")
    wanted = {lower[n.lower()] for n in names}
    return tuple(c for c in CHAINS.values() if c.name in wanted)


def input_seed(chain: Chain, dtype: torch.dtype) -> int:
    """A stable seed per (chain, dtype), independent of run order."""
    return zlib.crc32(f"chain/{chain.name}/{dtype}".encode())


def make_inputs(chain: Chain, sizes: Sizes, dtype: torch.dtype,
                device: torch.device | str) -> tuple[torch.Tensor, ...]:
    """Fresh random inputs in argument order: ``x`` ~ N(mean, 1), ``y`` ~ N(0, 1); the
    norm weight ``w`` ~ N(1, 0.1^2), bias ``b`` ~ N(0, 0.1^2); the projection ``W`` ~
    N(0, 1/D); the targets ``t`` uniform int64 class ids in ``[0, M)``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(input_seed(chain, dtype))
    out = []
    for name, shape in chain.shapes(sizes).items():
        if name == "t":
            out.append(torch.randint(0, sizes["M"], shape, generator=gen, device=device))
            continue
        t = torch.randn(shape, generator=gen, dtype=torch.float32, device=device)
        if name == "x":
            t = t + chain.mean
        elif name == "y":
            pass
        elif name == "w":
            t = 1.0 + 0.1 * t
        elif name == "b":
            t = 0.1 * t
        else:
            t = t / shape[0] ** 0.5
        out.append(t.to(dtype))
    return tuple(out)


def as_outputs(value: object) -> tuple:
    """A provider's or reference's result as a tuple of outputs."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def reference(chain: Chain, tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The float64 outputs of ``chain`` on ``tensors`` (floating ones upcast on their own
    device; integer ones, the targets, as they are)."""
    return as_outputs(chain.reference(*(t.to(torch.float64) if t.is_floating_point() else t
                                        for t in tensors)))
