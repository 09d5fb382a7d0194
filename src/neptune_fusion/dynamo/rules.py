"""The rule table: each ATen op the backend translates, and how.

A rule is ``fn(translator, node, out_shape) -> load`` where ``load(idx)`` builds the IR
expression of the node's element at ``idx`` from its arguments' loads. ``check(node)``
(optional) says, without translating, why this use of the op is not taken (a reduction
over several axes); the partitioner reads it. Ops absent from the table are boundaries:
they and what lies beyond them stay with the rest of the compiler (Inductor).

Kinds: ``elementwise``, ``view``, ``source`` (built from indices and constants: ``arange``,
``ones``, ``tril`` of them), ``reduction`` and ``contraction``. Which ops reach this
table is decided by the decomposition table (:mod:`.decomp`): softmax, log-softmax,
log-sum-exp, variance and attention arrive as these primitives.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..frontend import lang as nf
from ..ir import build
from ..ir.nodes import Binary, Cast, Const, IndexVar, Load, Size
from .refused import Refused
from .symbolic import static
from .views import broadcast, view_index

aten, prims = torch.ops.aten, torch.ops.prims


@dataclass(frozen=True)
class Rule:
    kind: str            # elementwise | view | source | reduction | contraction
    fn: Callable
    check: Callable | None = None


def _shape(tr, a):
    return tr.arg(a).shape


def _at(tr, a, idx, out):
    """Argument ``a`` (a node or a Python scalar) at ``idx`` of the broadcast ``out``."""
    v = tr.arg(a)
    if not hasattr(v, "load"):
        return v
    return v.load(broadcast(idx, v.shape, out))


# -- elementwise ----------------------------------------------------------------------

def _log1p(x):
    """``log(1 + x)`` to a few ulps near 0, where the plain form rounds ``1 + x`` to 1
    (Kahan's: ``log(u) * x / (u - 1)`` with ``u = 1 + x``, whose rounding cancels)."""
    u = 1.0 + x
    return nf.where(u == 1.0, x, nf.where(u == math.inf, u, nf.log(u) * (x / (u - 1.0))))


def _expm1(x):
    """``exp(x) - 1`` to a few ulps near 0 (Kahan's: ``(u - 1) * x / log(u)`` with
    ``u = exp(x)``); ``-1`` where ``u - 1`` is, ``u`` where it is infinite."""
    u = nf.exp(x)
    return nf.where(u == 1.0, x, nf.where((u - 1.0 == -1.0) | (u == math.inf), u - 1.0,
                                          (u - 1.0) * (x / nf.log(u))))


_UNARY = {
    aten.exp.default: nf.exp, aten.exp2.default: nf.exp2, aten.log.default: nf.log,
    aten.log2.default: nf.log2, aten.sqrt.default: nf.sqrt, aten.rsqrt.default: nf.rsqrt,
    aten.tanh.default: nf.tanh, aten.sigmoid.default: nf.sigmoid, aten.erf.default: nf.erf,
    aten.abs.default: nf.abs, aten.neg.default: operator.neg,
    aten.reciprocal.default: lambda x: 1.0 / x,
    aten.relu.default: lambda x: nf.maximum(x, 0.0),
    aten.bitwise_not.default: operator.invert, aten.logical_not.default: operator.invert,
    aten.log1p.default: _log1p, prims.log1p.default: _log1p,
    aten.expm1.default: _expm1, prims.expm1.default: _expm1,
    aten.isnan.default: lambda x: x != x,
}
_BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
    "gt": operator.gt, "ge": operator.ge, "maximum": nf.maximum, "minimum": nf.minimum,
    "bitwise_and": operator.and_, "bitwise_or": operator.or_,
    "logical_and": operator.and_, "logical_or": operator.or_,
}


def _unary(f):
    def fn(tr, node, out):
        return lambda idx: f(_at(tr, node.args[0], idx, out))
    return fn


def _binary(f):
    def fn(tr, node, out):
        alpha = node.kwargs.get("alpha", 1)
        if node.kwargs.get("rounding_mode") is not None:
            raise Refused(f"{node.name}: division with rounding_mode")

        def load(idx):
            a, b = (_at(tr, x, idx, out) for x in node.args[:2])
            if f in _ARITHMETIC:
                a, b = _promoted(a, b), _promoted(b, a)
            return f(a, b if alpha == 1 else b * alpha)
        return load
    return fn


_ARITHMETIC = {operator.add, operator.sub, operator.mul, operator.truediv, nf.maximum,
               nf.minimum}


def _promoted(x, other):
    """A boolean operand of arithmetic with a number, as torch promotes it (``x * mask``,
    ``softmax(x) * any(...)``): 1 where true, else 0, of the other's kind."""
    if not (getattr(getattr(x, "dtype", None), "is_bool", False)):
        return x
    kind = getattr(other, "dtype", None)
    if kind is not None and kind.is_bool:
        return x
    exact = kind is not None and not kind.is_float or isinstance(other, int)
    return nf.where(x, 1, 0) if exact else nf.where(x, 1.0, 0.0)


def _silu(x):
    return x * nf.sigmoid(x)


def _gelu(tr, node, out):
    """``gelu(x)``: ``x/2 (1 + erf(x / sqrt(2)))``; with ``approximate="tanh"``
    ``x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    if node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none") \
            != "tanh":
        r = 1.0 / math.sqrt(2.0)
        return lambda idx: (lambda x: 0.5 * x * (1.0 + nf.erf(x * r)))(
            _at(tr, node.args[0], idx, out))
    c = math.sqrt(2.0 / math.pi)
    return lambda idx: (lambda x: 0.5 * x * (1.0 + nf.tanh(c * (x + 0.044715 * x * x * x))))(
        _at(tr, node.args[0], idx, out))


def _softplus(tr, node, out):
    """``softplus(x, beta, threshold)``: ``log1p(exp(beta x)) / beta``, and ``x`` where
    ``beta x > threshold`` (as torch computes it; ``log(1 + exp(z))`` was 0 below
    ``z = -17`` in float32, where the value is ``exp(z)``)."""
    beta = node.args[1] if len(node.args) > 1 else node.kwargs.get("beta", 1)
    limit = node.args[2] if len(node.args) > 2 else node.kwargs.get("threshold", 20)

    def load(idx):
        x = _at(tr, node.args[0], idx, out)
        z = x * beta if beta != 1 else x
        soft = _log1p(nf.exp(z))
        return nf.where(z > limit, x, soft / beta if beta != 1 else soft)
    return load


def _xlogy(tr, node, out):
    """``xlogy(x, y)``: ``x log y``, 0 where ``x == 0`` unless ``y`` is NaN."""
    def load(idx):
        x, y = (_at(tr, a, idx, out) for a in node.args[:2])
        return nf.where((x == 0) & (y == y), 0.0, x * nf.log(y))
    return load


def _pow(tr, node, out):
    return lambda idx: _at(tr, node.args[0], idx, out) ** node.args[1]


def _clamp(tr, node, out):
    lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
    hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
    if node.target in (aten.clamp_max.default, aten.clamp_max.Tensor):
        lo, hi = None, node.args[1]

    def load(idx):
        x = _at(tr, node.args[0], idx, out)
        lo_, hi_ = (None if b is None else _at(tr, b, idx, out) for b in (lo, hi))
        x = x if lo_ is None else nf.maximum(x, lo_)
        return x if hi_ is None else nf.minimum(x, hi_)
    return load


def _where(tr, node, out):
    return lambda idx: nf.where(*(_at(tr, a, idx, out) for a in node.args[:3]))


def _masked_fill(tr, node, out):
    x, mask, value = node.args[:3]
    if hasattr(value, "op"):   # masked_fill.Tensor: a 0-d tensor
        value = tr.arg(value).load(())
    return lambda idx: nf.where(_at(tr, mask, idx, out), value, _at(tr, x, idx, out))


def _same(tr, node, out):      # casts (the translator casts to the node's dtype), clones
    return lambda idx: _at(tr, node.args[0], idx, out)


def _gather(tr, node, out):
    """``x.gather(d, index)``: ``x`` at ``index``'s value in dimension ``d`` (a load whose
    index is read from another tensor; the kernel clamps it into the dimension)."""
    x, index = tr.arg(node.args[0]), tr.arg(node.args[2])
    d = node.args[1] % len(x.shape)

    def load(idx):
        src = list(idx)
        src[d] = index.load(tuple(idx))
        return x.load(tuple(src))
    return load


def _index(tr, node, out):
    """``x[i0, i1, ...]``: index tensors for ``x``'s leading dimensions (advanced
    indexing, as transformers' mask builders read positions: ``cache_position[kv_idx]``,
    or a hand-written cross-entropy: ``logp[arange(n), target]``). Indices computed from
    the shapes (``arange`` and sums of them) become index arithmetic, so a causal mask
    built this way keeps its structure. An index read from a tensor is wrapped as PyTorch
    wraps it, ``where(t < 0, t + n, t)``, and the kernel clamps it into the dimension as
    any gathered index (PyTorch raises on one outside ``[-n, n)``; the kernel reads an
    element of the tensor, never past it). Other indices that may be negative are refused."""
    x, idxs = tr.arg(node.args[0]), node.args[1]
    if any(getattr(tr.arg(i), "dtype", "bool") == "bool" for i in idxs):
        raise Refused(f"{node.name}: indexing with a None (slice) or a boolean mask")
    vals = [tr.arg(i) for i in idxs]
    nb = len(out) - (len(x.shape) - len(vals))
    bshape = tuple(out[:nb])

    def load(idx):
        picks = []
        for d, v in enumerate(vals):
            e = build.as_expr(v.load(broadcast(idx[:nb], v.shape, bshape)))
            if not _nonnegative(e):
                if not isinstance(e.x if isinstance(e, Cast) else e, Load):
                    raise Refused(f"{node.name}: an index {e} that may be negative (PyTorch "
                                  "wraps negative indices)")
                n = tr.size_expr(x.shape[d])
                e = build.where(e < 0, e + (int(n) if isinstance(n, int) else n), e)
            picks.append(e)
        return x.load((*picks, *idx[nb:]))
    return load


def _embedding(tr, node, out):
    """``embedding(weight, ids)``: row ``ids[...]`` of ``weight``, a gather the kernel
    clamps into the table (PyTorch raises on an id outside it); an embedding followed by
    its LayerNorm (BERT's, Bloom's) is then one kernel. ``padding_idx`` and the other
    arguments only change the backward."""
    weight, ids = tr.arg(node.args[0]), tr.arg(node.args[1])
    lead = len(out) - 1

    def load(idx):
        return weight.load((ids.load(tuple(idx[:lead])), idx[lead]))
    return load


def _remainder(tr, node, out):
    """``torch.remainder`` of integers: the IR's ``%`` rounds toward minus infinity as
    torch's does (``take_along_dim`` wraps its indices so); floats are refused."""
    def load(idx):
        a, b = (build.as_expr(_at(tr, x, idx, out)) for x in node.args[:2])
        if not (a.dtype.is_int and b.dtype.is_int):
            raise Refused(f"{node.name}: remainder of floats")
        return a % b
    return load


def _nonnegative(e) -> bool:
    """Whether an index expression is >= 0 by its form: index variables, sizes and
    non-negative int constants under sums, products, casts, and ``//`` and ``%`` by
    positive constants."""
    if isinstance(e, (IndexVar, Size)):
        return True
    if isinstance(e, Const):
        return isinstance(e.value, int) and not isinstance(e.value, bool) and e.value >= 0
    if isinstance(e, Cast):
        return _nonnegative(e.x)
    if isinstance(e, Binary) and e.op in ("floordiv", "mod"):   # a merged index split
        return _nonnegative(e.a) and isinstance(e.b, Const) and e.b.value > 0
    return isinstance(e, Binary) and e.op in ("add", "mul") \
        and _nonnegative(e.a) and _nonnegative(e.b)


# -- views ----------------------------------------------------------------------------

def _view(tr, node, out):
    src = _shape(tr, node.args[0])
    x = tr.arg(node.args[0])
    return lambda idx: x.load(view_index(tr.merges, idx, src, out, tr.hints))


def _expand(tr, node, out):
    x = tr.arg(node.args[0])
    return lambda idx: x.load(broadcast(idx, x.shape, out))


def _repeat(tr, node, out):
    """``x.repeat(*reps)``: output dimension ``d`` reads ``x`` at its index modulo ``x``'s
    extent there (an instance norm's weight repeated over the batch). Static extents
    only: a modulo by a dynamic size is not written."""
    x = tr.arg(node.args[0])
    reps = list(node.args[1])
    lead = len(reps) - len(x.shape)
    if lead < 0 or not all(isinstance(r, int) for r in reps) \
            or not all(static(n) for n in x.shape):
        raise Refused("repeat with dynamic counts or extents")

    def load(idx):
        return x.load(tuple(
            idx[lead + d] if reps[lead + d] == 1 else 0 if n == 1 else idx[lead + d] % n
            for d, n in enumerate(x.shape)))
    return load


def _permute(tr, node, out):
    x = tr.arg(node.args[0])
    perm = [d % len(out) for d in node.args[1]]

    def load(idx):
        src = [None] * len(perm)
        for k, p in enumerate(perm):
            src[p] = idx[k]
        return x.load(tuple(src))
    return load


def _transpose(tr, node, out):
    x = tr.arg(node.args[0])
    n = len(out)
    a, b = (node.args[1] % n, node.args[2] % n) if n else (0, 0)

    def load(idx):
        src = list(idx)
        src[a], src[b] = idx[b], idx[a]
        return x.load(tuple(src))
    return load


def _select(tr, node, out):
    x = tr.arg(node.args[0])
    d = node.args[1] % len(x.shape)
    at = tr.scalar(node.args[2])
    if isinstance(at, int) and at < 0:
        if not static(x.shape[d]):
            raise Refused(f"{node.name}: index {at} from the end of a dynamic dimension")
        at %= x.shape[d]
    return lambda idx: x.load((*idx[:d], at, *idx[d:]))


def _slice(tr, node, out):
    x = tr.arg(node.args[0])
    d = (node.args[1] if len(node.args) > 1 else 0) % len(x.shape)
    start = node.args[2] if len(node.args) > 2 and node.args[2] is not None else 0
    step = node.args[4] if len(node.args) > 4 else 1
    n = x.shape[d]
    if static(n) and isinstance(start, int):
        start = min(max(start + n if start < 0 else start, 0), n)
    elif not isinstance(start, int) or start < 0:
        # a start of a dynamic slice (a node) or from the end of a dynamic dimension
        raise Refused(f"{node.name}: a slice of a dynamic dimension from {start}")

    def load(idx):
        src = list(idx)
        at = idx[d] * step if step != 1 else idx[d]
        src[d] = at + start if start else at
        return x.load(tuple(src))
    return load


def _t(tr, node, out):
    x = tr.arg(node.args[0])
    return lambda idx: x.load(tuple(reversed(idx)))


def _cat(tr, node, out):
    """``torch.cat(xs, d)``: pieces side by side along ``d``. A load picks its piece from
    the index's structure, never from a comparison in the kernel: a constant index, an
    axis whose extent is the first piece's (a product over the first ``n0`` entries,
    ``probs[..., :-1] @ v``), or ``r + offset`` for an axis ``r`` of a piece's extent (a
    reduction split at the pieces: :func:`_reduction`). Any other index is refused.
    gpt-oss appends one sink logit per head to the scores this way."""
    xs = [tr.arg(a) for a in node.args[0]]
    d = _cat_dim(node, len(out))
    pieces = tr.pieces_of(node, d, [x.shape[d] for x in xs])

    def load(idx):
        k, at = tr.piece_at(pieces, idx[d], node)
        src = list(idx)
        src[d] = at
        return _at(tr, node.args[0][k], tuple(src), out)
    return load


def _cat_dim(node, ndim: int) -> int:
    return (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % ndim


def _cat_check(node):
    """Only single entries added beside one piece (gpt-oss's sink logit) are taken: a
    reduction splits at them, and an index of the large piece is known from its axis.
    Concatenated halves (a rotary embedding's ``rotate_half``) are read at indices that
    fall in either piece, which a kernel would have to select by comparison: they stay
    boundaries."""
    val = node.meta.get("val")
    xs = node.args[0]
    if val is None or not isinstance(xs, (list, tuple)):
        return f"{node.name}: no tensor metadata"
    d = _cat_dim(node, val.ndim)
    sizes = [getattr(x.meta.get("val"), "shape", None) for x in xs]
    if any(s is None for s in sizes):
        return f"{node.name}: no tensor metadata"
    if any(len(s) != val.ndim for s in sizes):
        # torch.cat skips a 1-d empty piece beside pieces of any rank (Bloom's mask)
        return f"{node.name}: a concatenation of pieces of different ranks"
    big = [s for s in sizes if not (isinstance(s[d], int) and s[d] == 1)]
    if len(big) > 1:
        return (f"{node.name}: a concatenation of several pieces longer than one entry "
                "(only single entries beside one piece are translated)")
    return None


# -- sources --------------------------------------------------------------------------

def _fill(value_of):
    def fn(tr, node, out):
        return lambda idx: build.const(value_of(node), None)
    return fn


def _arange(tr, node, out):
    a = [tr.scalar(x) for x in node.args]
    start, step = (0, 1) if len(a) == 1 else (a[0], a[2] if len(a) > 2 else 1)
    return lambda idx: idx[0] * step + start if (start, step) != (0, 1) else idx[0]


def _iota(tr, node, out):
    """``prims.iota(length, start=, step=)``: how some decompositions build ``arange``
    (``tril``'s on CUDA); the index itself, scaled and shifted."""
    start, step = node.kwargs.get("start", 0), node.kwargs.get("step", 1)
    return lambda idx: idx[0] * step + start if (start, step) != (0, 1) else idx[0]


def _tri(lower: bool):
    def fn(tr, node, out):
        x = tr.arg(node.args[0])
        k = node.args[1] if len(node.args) > 1 else node.kwargs.get("diagonal", 0)

        def load(idx):
            i, j = idx[-2], idx[-1]
            keep = (j - i <= k) if lower else (j - i >= k)
            v = x.load(idx)
            if isinstance(v, Const) and v.value is True:   # tril(ones(..., bool)): a mask
                return keep
            return keep & v if v.dtype.is_bool else nf.where(keep, v, 0)
        return load
    return fn


# -- reductions and contractions ------------------------------------------------------

def _to_one_value(node):
    return f"{node.name}: a reduction to one value (it runs with the rest)"


def _one_dim(node):
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    val = node.meta.get("val")
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) != 1):
        if getattr(val, "ndim", None) == 0:
            return _to_one_value(node)
        return (f"{node.name}: a reduction over several axes that are not adjacent; fused "
                "over their merge it ran at 0.07-0.80x of Inductor (docs/jit.md)")
    if getattr(val, "ndim", None) == 0:
        # a loss's mean over rows of each row's chain: inside the chain's kernel it
        # would be one program over every row; with the rest, a sum of N values
        return _to_one_value(node)
    return None


def _count(tr, n, pieces):
    """A mean's divisor: the reduced axis's extent where one axis covers ``n``, else
    ``n`` as a value of the program."""
    return tr.extent(n) if len(pieces) == 1 and static(n) else tr.size_expr(n)


def _reduction(op: str, mean: bool = False, logical: bool = False):
    """``op`` (sum, max, min) over one axis; ``mean`` divides by its extent; ``logical``
    (``any`` as max, ``all`` as min): the elements read as 1.0 where true (nonzero) and
    0.0 where not, the result compared with 0.5 -- a float reduction, so ``_safe_softmax``'s
    ``all(x == -inf)`` joins the softmax's loop instead of cutting the chain."""
    def fn(tr, node, out):
        x = tr.arg(node.args[0])
        dims = node.args[1]
        d = (dims[0] if isinstance(dims, (list, tuple)) else dims) % len(x.shape)
        keep = len(out) == len(x.shape)
        n = x.shape[d]
        # over a concatenation (through elementwise ops): one reduction per piece, their
        # results combined -- a piece of one entry is that entry
        pieces = tr.cuts.get(node.args[0], {}).get(d) or ((0, n),)
        axes = [None if extent == 1 else tr.reduce_axis(extent, f"r_{node.name}_{k}"
                                                         if k else f"r_{node.name}")
                for k, (_, extent) in enumerate(pieces)]
        red = nf.sum if op == "sum" else nf.max if op == "max" else nf.min
        join = operator.add if op == "sum" else nf.maximum if op == "max" else nf.minimum

        def load(idx):
            parts = []
            for (start, _), r in zip(pieces, axes):
                at = tr.size_expr(start) if r is None else r + tr.size_expr(start) \
                    if start else r
                src = list(idx)
                if keep:
                    src[d] = at
                else:
                    src.insert(d, at)
                e = x.load(tuple(src))
                if logical:
                    e = nf.where(e if e.dtype.is_bool else e != 0, 1.0, 0.0)
                parts.append(e if r is None else red(e, r))
            e = parts[0]
            for p in parts[1:]:
                e = join(e, p)
            # a mean divides by its axis's extent as the axis has it (``s<n>`` for a
            # long static one): analysis/centre.py recognises the mean by that
            return e > 0.5 if logical else e / _count(tr, n, pieces) if mean else e
        return load
    return fn


def _contract(tr, a, b):
    """``a @ b`` over the last axis of ``a`` (leading axes: batch)."""
    a, b = tr.arg(a), tr.arg(b)
    c = tr.reduce_axis(a.shape[-1], f"c{len(tr.vals)}")

    def load(idx):
        lead = tuple(idx[:-2])
        return nf.sum(a.load((*lead, idx[-2], c)) * b.load((*lead, c, idx[-1])), c)
    return load


def _mm(tr, node, out):
    return _contract(tr, node.args[0], node.args[1])


def _addmm(tr, node, out):
    """``addmm``/``baddbmm``: ``beta * input + alpha * (a @ b)`` (Bloom's attention scores
    add its ALiBi bias so); ``beta = 0`` ignores ``input``, NaN included, as torch does."""
    bias, a, b = node.args[:3]
    beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
    mm = _contract(tr, a, b)

    def load(idx):
        prod = mm(idx) if alpha == 1 else mm(idx) * alpha
        if beta == 0:
            return prod
        return _at(tr, bias, idx, out) * beta + prod if beta != 1 else \
            _at(tr, bias, idx, out) + prod
    return load


def _table() -> dict:
    t: dict = {}
    for op, f in _UNARY.items():
        t[op] = Rule("elementwise", _unary(f))
    for name, f in _BINARY.items():
        packet = getattr(aten, name)
        for ov in ("Tensor", "Scalar", "default"):
            if hasattr(packet, ov):
                t[getattr(packet, ov)] = Rule("elementwise", _binary(f))
    t[aten.silu.default] = Rule("elementwise", _unary(_silu))
    t[aten.gelu.default] = Rule("elementwise", _gelu)
    t[aten.softplus.default] = Rule("elementwise", _softplus)
    for op in (aten.xlogy.Tensor, aten.xlogy.Scalar_Other):
        t[op] = Rule("elementwise", _xlogy)
    for op in (aten.pow.Tensor_Scalar,):
        t[op] = Rule("elementwise", _pow)
    t[aten.where.self] = Rule("elementwise", _where)
    t[aten.gather.default] = Rule("elementwise", _gather)
    t[aten.embedding.default] = Rule("elementwise", _embedding)
    t[aten.index.Tensor] = Rule("elementwise", _index)
    for op in (aten.remainder.Tensor, aten.remainder.Scalar):
        t[op] = Rule("elementwise", _remainder)
    for op in (aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default,
               aten.clamp.Tensor, aten.clamp_min.Tensor, aten.clamp_max.Tensor):
        t[op] = Rule("elementwise", _clamp)
    for op in (aten.masked_fill.Scalar, aten.masked_fill.Tensor):
        t[op] = Rule("elementwise", _masked_fill)
    for op in (aten._to_copy.default, prims.convert_element_type.default,
               aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default,
               aten.detach.default):   # a training forward detaches what it saves
        t[op] = Rule("elementwise", _same)
    for op in (aten.view.default, aten._unsafe_view.default, aten.reshape.default,
               aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
               aten.squeeze.default):
        t[op] = Rule("view", _view)
    t[aten.expand.default] = Rule("view", _expand)
    # a copy, not a view: the region keeps it (a leading view would run outside)
    t[aten.repeat.default] = Rule("elementwise", _repeat)
    t[aten.permute.default] = Rule("view", _permute)
    t[aten.transpose.int] = Rule("view", _transpose)
    t[aten.t.default] = Rule("view", _t)
    t[aten.select.int] = Rule("view", _select)
    t[aten.slice.Tensor] = Rule("view", _slice)
    t[aten.cat.default] = Rule("elementwise", _cat, _cat_check)
    ones = Rule("source", _fill(lambda n: True if _is_bool(n) else 1))
    zeros = Rule("source", _fill(lambda n: False if _is_bool(n) else 0))
    for op in (aten.ones.default, aten.ones_like.default, aten.new_ones.default):
        t[op] = ones
    for op in (aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default):
        t[op] = zeros
    # ``empty_like`` then ``fill`` (a Python number minus a tensor, as torch's hinge-loss
    # decomposition traces it): the fill's value in the input's shape; unwritten memory
    # may hold any value, zeros among them
    t[aten.empty_like.default] = zeros
    t[aten.fill.Scalar] = Rule("source", _fill(lambda n: n.args[1]))
    t[aten.full.default] = Rule("source", _fill(lambda n: n.args[1]))
    t[aten.full_like.default] = Rule("source", _fill(lambda n: n.args[1]))
    t[aten.new_full.default] = Rule("source", _fill(lambda n: n.args[2]))
    t[aten.scalar_tensor.default] = Rule("source", _fill(lambda n: n.args[0]))
    for op in (aten.arange.default, aten.arange.start, aten.arange.start_step):
        t[op] = Rule("source", _arange)
    t[torch.ops.prims.iota.default] = Rule("source", _iota)
    t[aten.tril.default] = Rule("elementwise", _tri(True))
    t[aten.triu.default] = Rule("elementwise", _tri(False))
    for op, kind in ((aten.amax.default, "max"), (aten.amin.default, "min"),
                     (aten.sum.dim_IntList, "sum")):
        t[op] = Rule("reduction", _reduction(kind), _one_dim)
    t[aten.mean.dim] = Rule("reduction", _reduction("sum", mean=True), _one_dim)
    for op in (aten.sum.default, aten.mean.default):   # to one value: named, with the rest
        t[op] = Rule("reduction", _reduction("sum"), _to_one_value)
    for op, kind in ((aten.any.dim, "max"), (aten.any.dims, "max"), (aten.all.dim, "min"),
                     (aten.all.dims, "min")):
        t[op] = Rule("reduction", _reduction(kind, logical=True), _one_dim)
    t[aten.mm.default] = Rule("contraction", _mm)
    t[aten.bmm.default] = Rule("contraction", _mm)
    t[aten.addmm.default] = Rule("contraction", _addmm)
    t[aten.baddbmm.default] = Rule("contraction", _addmm)
    return t


def _is_bool(node) -> bool:
    val = node.meta.get("val") if hasattr(node, "meta") else None
    return node.kwargs.get("dtype") == torch.bool or getattr(val, "dtype", None) == torch.bool


RULES: dict = _table()
"""ATen op overload -> :class:`Rule`."""
