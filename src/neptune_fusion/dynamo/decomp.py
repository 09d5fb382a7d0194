"""The decomposition table: which composite ops reach the rule table as primitives.

Translating primitives (``amax``, ``sub``, ``exp``, ``sum``, ``div``, ``bmm``) rather than
``aten._softmax`` as one node means any chain built of them is translated, whoever wrote
it. torch's own decompositions give softmax and log-softmax in that form; log-sum-exp,
variance, layer norm, group norm and ``scaled_dot_product_attention`` get small ones
here, because torch's guard an infinite maximum inside the exponential (two passes), go
through ``prims.var`` (one node for a two-reduction chain), index groups across tile axes
or pick a fused attention kernel per device (and the per-device kernels, where a caller
such as ``nn.MultiheadAttention`` reached them, become the math again in inference);
``nll_loss`` becomes a gather, so cross-entropy is one chain; ``max``/``min`` over a
dimension become ``amax``/``amin`` (with ``argmax``/``argmin`` for the indices).
"""

from __future__ import annotations

import functools
import math

import torch
from torch._decomp import get_decompositions

from .symbolic import static

aten = torch.ops.aten


def _dims(x, dim):
    """The reduced dimensions, nonnegative: every one for None or an empty list (torch's
    rule for ``dim=[]``), none of a 0-d tensor (whose ``dim=0`` or ``-1`` is itself)."""
    if x.dim() == 0:
        return []
    if dim is None or (not isinstance(dim, int) and len(dim) == 0):
        return list(range(x.dim()))
    return [d % x.dim() for d in ([dim] if isinstance(dim, int) else dim)]


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    """The mean, then the sum of squared deviations from it: a dependent chain the
    compiler fuses in one pass. Over several dimensions that do not merge into one
    (:func:`_merged`: a batch norm's ``(0, 2, 3)``, or all of them) it declines: no
    region takes such a reduction, and the rest's own ``var_mean`` (Inductor's Welford
    reduction, one pass) ran 7 % faster than the two reductions of this form (a batch
    norm's statistics on an H100, 2026-12-05)."""
    dims = _dims(x, dim)
    if len(dims) > 1 and _merged(x, dims) is None:
        return NotImplemented
    n = math.prod(x.shape[d] for d in dims)
    mean = x.mean(dims, keepdim=True)
    dev = x - mean
    var = (dev * dev).sum(dims, keepdim=keepdim) / max(0, n - (1 if correction is None
                                                              else correction))
    return var, (mean if keepdim else mean.squeeze(dims))


def _var(x, dim=None, *, correction=None, keepdim=False):
    got = _var_mean(x, dim, correction=correction, keepdim=keepdim)
    return got if got is NotImplemented else got[0]


def _std(x, dim=None, *, correction=None, keepdim=False):
    got = _var(x, dim, correction=correction, keepdim=keepdim)
    return got if got is NotImplemented else torch.sqrt(got)


def _std_mean(x, dim=None, *, correction=None, keepdim=False):
    got = _var_mean(x, dim, correction=correction, keepdim=keepdim)
    return got if got is NotImplemented else (torch.sqrt(got[0]), got[1])


def _merged(x, dim):
    """``(x with the reduced dimensions merged into one, that dimension, the result's
    shape with keepdim, without)`` when ``dim`` names two or more dimensions, not all of
    them, adjacent once those of extent 1 are left out (an instance norm's batch norm over
    ``(0, 2, 3)`` of a ``(1, N*C, H, W)`` view); else None. The rule table reduces over
    one axis: ``mean((2, 3))`` is one reduction over ``H * W``.

    Dimensions that are not adjacent (a batch norm's statistics over ``(0, 2, 3)`` of
    ``(N, C, H, W)``) stay with the rest: moved last and merged (read as index arithmetic,
    ``x[r // (H*W), c, r // W % H, r % W]``) they ran at 0.07x of Inductor with the
    normalised output and 0.80x for ``var_mean`` alone on the H200 (2026-12-05,
    ``benchmarks/bn_probe.py``; docs/jit.md)."""
    if dim is None or isinstance(dim, int):
        return None
    dims = sorted(_dims(x, dim))
    real = [d for d in dims if not (static(x.shape[d]) and x.shape[d] == 1)]
    if len(dims) < 2 or len(dims) >= x.dim() or not real:
        return None
    kept = tuple(1 if d in dims else n for d, n in enumerate(x.shape))
    dropped = tuple(n for d, n in enumerate(x.shape) if d not in dims)
    # the merged extent spelled out, not -1: an empty tensor's -1 is ambiguous (reshape
    # raised at the compile, where eager gives the empty or NaN result; a fuzzing find)
    extent = math.prod(x.shape[d] for d in real)
    if real != list(range(real[0], real[-1] + 1)):
        return None
    a, b = real[0], real[-1]
    ones = set(dims) - set(real)
    merged = x.reshape(*(n for d, n in enumerate(x.shape[:a]) if d not in ones), extent,
                       *(n for d, n in enumerate(x.shape) if d > b and d not in ones))
    return merged, a - sum(d < a for d in ones), kept, dropped


def _over_merged(reduce):
    """A reduction over adjacent dimensions as one over their merge (see :func:`_merged`),
    reshaped to its own result; ``NotImplemented`` (torch's own) otherwise."""
    def over(x, dim=None, keepdim=False, **kw):
        got = _merged(x, dim)
        if got is None:
            return NotImplemented
        merged, axis, kept, dropped = got
        return reduce(merged, axis, **kw).reshape(kept if keepdim else dropped)
    return over


def _amax(x, dim=(), keepdim=False):
    if x.dtype == torch.bool:   # as Inductor's own: the maximum of booleans is any
        dims = _dims(x, dim)
        return torch.any(x, dim=dims, keepdim=keepdim) if dims else x.clone()
    return _over_merged(lambda t, a: t.amax(a, keepdim=True))(x, dim, keepdim)


def _amin(x, dim=(), keepdim=False):
    if x.dtype == torch.bool:
        dims = _dims(x, dim)
        return torch.all(x, dim=dims, keepdim=keepdim) if dims else x.clone()
    return _over_merged(lambda t, a: t.amin(a, keepdim=True))(x, dim, keepdim)


def _logsumexp(x, dim, keepdim=False):
    """log-sum-exp with the infinite-maximum guard in the epilogue only: torch's own
    decomposition subtracts ``where(|max| == inf, 0, max)`` inside the exponential, a
    producer inside a condition, which no repair breaks (two passes); here a row whose
    maximum is infinite (all -inf, or a +inf) gives that maximum, as torch.logsumexp does."""
    if not x.is_floating_point():   # as torch: integers and booleans in the default dtype
        x = x.to(torch.get_default_dtype())
    dims = _dims(x, dim)
    if any(x.shape[d] == 0 for d in dims):   # an empty sum: log 0 = -inf (no maximum)
        out = torch.full_like(x.sum(dims, keepdim=True), -float("inf"))
        return out if keepdim else out.squeeze(dims)
    m = x.amax(dims, keepdim=True)
    s = torch.exp(x - m).sum(dims, keepdim=True)
    out = torch.where(m.abs() == float("inf"), m, m + torch.log(s))
    return out if keepdim else out.squeeze(dims)


def _nll_loss_forward(x, target, weight, reduction, ignore_index):
    """``nll_loss`` of 2-d log-probabilities (cross-entropy's second half) as a gather:
    with the log-softmax before it, one chain per row -- its maximum and sum, then the
    target's log-probability -- so the full ``(N, V)`` log-softmax is never written (it
    was the fused chain's output, read again by the loss). Ignored targets read class 0
    (a valid index in any PyTorch) and weigh nothing. Returns ``(output, total_weight)``
    as the op does. One sample (a 1-d input, a 0-d target) is a batch of one, its
    ``total_weight`` the target's weight whatever the reduction, as torch gives it.
    ``nll_loss2d`` (classes in dimension 1 of ``(N, C, d...)``, a segmentation loss) is
    the same gather along dimension 1; other ranks use torch's own decomposition."""
    if x.dim() == 1 and target.dim() == 0:
        # its sum is its one loss, for every reduction but the mean
        loss, total = _nll_loss_forward(x.unsqueeze(0), target.unsqueeze(0), weight, 2,
                                        ignore_index)
        return (loss / total if reduction == 1 else loss), total
    if x.dim() < 2 or target.dim() != x.dim() - 1:
        return NotImplemented
    keep = target != ignore_index
    safe = torch.where(keep, target, torch.zeros_like(target))
    picked = x.gather(1, safe.unsqueeze(1)).squeeze(1)
    w = torch.ones_like(picked) if weight is None else \
        weight.gather(0, safe) if safe.dim() == 1 else weight[safe]
    w = torch.where(keep, w, torch.zeros_like(w))
    loss = torch.where(keep, -picked * w, torch.zeros_like(picked))
    if reduction == 0:   # none
        return loss, x.new_zeros(())
    dims = list(range(loss.dim()))
    total = w.sum(dims)
    return (loss.sum(dims) / total if reduction == 1 else loss.sum(dims)), total


def _rsub(x, other, alpha=1):
    """``other - alpha * x`` (``1 - p``, a hinge's ``margin - x``), where torch's own
    decomposition fills a tensor of a Python number from ``empty_like``. A number stays
    one (a ``scalar_tensor`` of a half-precision ``x``'s dtype would round it first):
    ``-x + other`` rounds as ``other - x`` does."""
    if isinstance(other, torch.Tensor):
        return torch.sub(other, x, alpha=alpha)
    return torch.add(torch.neg(x) if alpha == 1 else torch.mul(x, -alpha), other)


def _max_dim(x, dim, keepdim=False):
    """``x.max(dim)``: the values as ``amax`` (a reduction the rule table has) and the
    indices as ``argmax``, dead code when unused (gpt-oss subtracts
    ``logits.max(-1, keepdim=True).values`` before its softmax)."""
    return x.amax(dim, keepdim), x.argmax(dim, keepdim)


def _min_dim(x, dim, keepdim=False):
    return x.amin(dim, keepdim), x.argmin(dim, keepdim)


def _layer_norm(x, normalized_shape, weight, bias, eps):
    """Over several trailing dimensions the statistics are over one merged dimension
    (the rule table reduces over one axis), the weight and bias flattened alike, and the
    result reshaped back at the end: a view the backend can leave outside the kernel
    (partition.without_views). ``mean`` and ``rstd`` keep their shapes."""
    k = len(normalized_shape)
    if k > 1:
        lead = x.shape[:x.dim() - k]
        out, mean, rstd = _layer_norm(
            x.reshape(*lead, -1), [math.prod(normalized_shape)],
            None if weight is None else weight.reshape(-1),
            None if bias is None else bias.reshape(-1), eps)
        keep = (*lead, *([1] * k))
        return out.reshape(x.shape), mean.reshape(keep), rstd.reshape(keep)
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    var, mean = _var_mean(x.float() if x.dtype in (torch.float16, torch.bfloat16) else x,
                          dims, correction=0, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    if x.device.type == "cpu":   # torch's CPU kernel keeps the statistics in x's dtype
        mean, rstd = mean.to(x.dtype), rstd.to(x.dtype)
    return out.to(x.dtype), mean, rstd


def _group_norm(x, weight, bias, n, c, hw, group, eps):
    """``native_group_norm`` on the ``(N, G, C/G * HxW)`` view: the statistics are a row
    chain over its last dimension, and the affine reads the weight and bias spread over
    that view (``(G, C/G * HxW)``: a copy of the size of one sample, made with the rest
    when the backend leaves the views out). On the ``(N, C, ...)`` layout the group of an
    element is arithmetic across tile axes, which the code generator refuses."""
    per = c // group
    xg = x.reshape(n, group, per * hw)
    var, mean = _var_mean(_wide(xg), [2], correction=0, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    y = (xg - mean) * rstd

    def spread(t):
        return t.reshape(group, per, 1).expand(group, per, hw).reshape(group, per * hw)
    if weight is not None:
        y = y * spread(weight)
    if bias is not None:
        y = y + spread(bias)
    return (y.to(x.dtype).reshape(x.shape), mean.reshape(n, group).to(x.dtype),
            rstd.reshape(n, group).to(x.dtype))


_BATCH_NORM = ("a batch norm's statistics over (0, 2, 3): dimensions that are not "
               "adjacent, left to the rest with the op (fused over their merge it ran at "
               "0.07x of Inductor, docs/jit.md)")
_VARIANCE = ("a variance over several dimensions that do not merge into one (not "
             "adjacent, or every one): left to the rest with the op, whose one-pass "
             "reduction beat a mean and a sum of squares (docs/jit.md)")
KEPT_WHOLE = {aten._native_batch_norm_legit.no_stats: _BATCH_NORM,
              aten._native_batch_norm_legit.default: _BATCH_NORM,
              aten._native_batch_norm_legit_functional.default: _BATCH_NORM,
              # only where _var_mean declined them
              aten.var_mean.correction: _VARIANCE, aten.var.correction: _VARIANCE,
              aten.std.correction: _VARIANCE, aten.std_mean.correction: _VARIANCE}
"""Ops the decompositions leave whole for the rest, with the reason the report gives."""


def _batch_norm_no_stats(x, weight, bias, training, momentum, eps, *, own):
    """``_native_batch_norm_legit.no_stats`` of a batch of one (``F.instance_norm``'s
    ``(1, N*C, H, W)`` view) on the ``(C, H*W)`` view: a row chain whose result is
    reshaped back, so a region without the views writes rows of ``H*W`` (a 4-d result
    runs ``H`` as a loop of the kernel's epilogue, 4x slower than Inductor on the H200,
    2026-12-04). Statistics, dtypes and the extra outputs are torch's (``own``: its
    decomposition, for a 2-d input). A larger batch keeps the op whole for the rest: its
    statistics over ``(0, 2, 3)`` are over dimensions that are not adjacent (_merged)."""
    if x.dim() < 3:
        return own(x, weight, bias, training, momentum, eps)
    if not static(x.shape[0]) or x.shape[0] != 1:
        return NotImplemented
    c = x.shape[1]
    rows = x.reshape(c, -1)
    var, mean = _var_mean(_wide(rows), [1], correction=0, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    y = (rows - mean) * rstd
    if weight is not None:
        y = y * weight.reshape(c, 1)
    if bias is not None:
        y = y + bias.reshape(c, 1)
    mean, rstd = mean.reshape(c), rstd.reshape(c)
    if x.device.type == "cpu":   # as torch's: the CPU kernel returns them in x's dtype
        mean, rstd = mean.to(x.dtype), rstd.to(x.dtype)
    return y.to(x.dtype).reshape(x.shape), mean, rstd


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False, layout=None):
    """SDPA's math; ``layout`` (set by :func:`swap_sdpa`): None, or the order of the
    output's dimensions in memory, outermost first, where the kernel SDPA would call
    returns a permuted layout (the CPU's flash kernel allocates its output like the
    query: a query ``x.view(B, L, H, E).transpose(1, 2)`` gives a ``(B, L, H, E)``
    layout, as CUDA's efficient kernel always does). The math's product is contiguous;
    the result is laid out so, ``out.permute(layout).contiguous()`` permuted back, which
    the fused kernel writes in that order directly (rewrite.output_orders) and a
    ``transpose(1, 2).reshape(B, L, H * E)`` after it reads as a view, as in eager."""
    if dropout_p:
        return NotImplemented
    out = _attention(q, k, v, attn_mask, is_causal, scale, enable_gqa)[0]
    if layout is None:
        return out
    return out.permute(layout).contiguous().permute([layout.index(d)
                                                     for d in range(len(layout))])


def _attention(q, k, v, attn_mask, is_causal, scale, enable_gqa):
    """SDPA's math: ``(output, scores)``, the scores masked and scaled (for a
    log-sum-exp)."""
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(g, dim=-3)
        v = v.repeat_interleave(g, dim=-3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool,
                          device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if attn_mask is None:
        return torch.softmax(_wide(s), dim=-1).to(v.dtype) @ v, s
    s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool \
        else s + attn_mask
    out = torch.softmax(_wide(s), dim=-1).to(v.dtype) @ v
    # a row whose every key is masked gives 0, as SDPA does (the softmax alone: NaN)
    empty = s.amax(dim=-1, keepdim=True) == float("-inf")
    return out.masked_fill(empty, 0.0), s


def _wide(s):
    """Half-precision scores widened to float32 for the softmax (as SDPA's kernels do);
    float32 and float64 kept."""
    return s.float() if s.dtype in (torch.float16, torch.bfloat16) else s


# SDPA's per-device kernels, reached where Dynamo keeps a caller whole
# (``F.multi_head_attention_forward``, so ``swap_sdpa`` never sees its SDPA) and
# AOTAutograd picks the kernel. Each becomes the math, its extra outputs as the op's meta
# kernel shapes them (dead code in an inference graph, the only graphs that open them:
# see decompositions()). Dropout and debug masks stay with the kernel.

def _fused_math(q, k, v, attn_mask, dropout_p, is_causal, scale):
    if dropout_p:
        return NotImplemented
    out, s = _attention(q, k, v, attn_mask, is_causal, scale, q.shape[1] != k.shape[1])
    return out, _logsumexp(_wide(s), -1).float()


def _flash_cpu(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    return _fused_math(q, k, v, attn_mask, dropout_p, is_causal, scale)


def _seed_offset(dtype=torch.long):
    return torch.empty((), dtype=dtype, device="meta"), torch.empty((), dtype=dtype,
                                                                     device="meta")


def _flash_cuda(q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *,
                scale=None):
    got = NotImplemented if return_debug_mask else \
        _fused_math(q, k, v, None, dropout_p, is_causal, scale)
    if got is NotImplemented:
        return got
    return (*got, None, None, q.shape[2], k.shape[2],
            torch.empty(2, dtype=torch.uint64, device="meta"),
            torch.empty((), dtype=torch.uint64, device="meta"), q.new_empty(0))


def _efficient_cuda(q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0,
                    is_causal=False, *, scale=None):
    got = _fused_math(q, k, v, attn_bias, dropout_p, is_causal, scale)
    if got is NotImplemented:
        return got
    # its log-sum-exp is padded to a multiple of 32 queries (or empty)
    n = -(-q.shape[2] // 32) * 32 if compute_log_sumexp else 0
    lse = torch.nn.functional.pad(got[1], (0, n - q.shape[2]))[..., :n]
    return (got[0], lse, *_seed_offset())


def _cudnn_cuda(q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
                return_debug_mask=False, *, scale=None):
    got = NotImplemented if return_debug_mask else \
        _fused_math(q, k, v, attn_bias, dropout_p, is_causal, scale)
    if got is NotImplemented:
        return got
    return (got[0], got[1].unsqueeze(-1), None, None, q.shape[2], k.shape[2],
            *_seed_offset(), None)


def _sdpa_targets() -> set:
    import torch.nn.functional as F
    return {F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}


def sdpa_calls(gm) -> int:
    """How many ``scaled_dot_product_attention`` calls a Dynamo graph makes."""
    targets = _sdpa_targets()
    return sum(n.op == "call_function" and n.target in targets for n in gm.graph.nodes)


def swap_sdpa(gm) -> None:
    """Replace ``scaled_dot_product_attention`` in a Dynamo graph by :func:`_sdpa` (its
    math: matmul, mask, softmax, matmul), before AOTAutograd picks a fused attention
    kernel per device that no decomposition opens. Calls with dropout stay. The math
    keeps the layout of the output Dynamo traced (the device's kernel's: its fake
    value's strides), so the graph returns eager's strides."""
    from .rewrite import _memory_order
    targets = _sdpa_targets()
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in targets and \
                not node.kwargs.get("dropout_p") and not (len(node.args) > 4 and node.args[4]):
            node.target, changed = _sdpa, True
            layout = _memory_order(node.meta.get("example_value"))
            if layout is not None:
                node.kwargs = {**node.kwargs, "layout": layout}
    if changed:
        gm.recompile()


# activations a chain may start or end with, as torch decomposes them (``where``,
# ``clamp``, ``expm1``, ``softplus``, ``log1p``...): translated, they join the chain's
# kernel instead of a kernel of their own writing the whole tensor in between
# (``log_sigmoid_forward``'s decomposition computes the buffer its backward reads on the
# CPU, and a zero one on CUDA, whose backward does not read it: tested with gradients)
ACTIVATIONS = (aten.leaky_relu, aten.elu, aten.celu, aten.selu, aten.hardswish,
               aten.hardsigmoid, aten.hardtanh, aten.relu6, aten.mish,
               aten.log_sigmoid_forward, aten.special_entr, aten.special_xlog1py,
               aten.logaddexp)
# elementwise losses and compound maps: ops of their own in a graph that no rule takes,
# so they cut a chain (a loss on log-probabilities). Inductor's table decomposes them as
# well; ours does too, so a graph whose rest runs eagerly fuses the same chains.
ELEMENTWISE = (aten.binary_cross_entropy_with_logits, aten.binary_cross_entropy,
               aten.huber_loss, aten.smooth_l1_loss, aten.mse_loss,
               aten.soft_margin_loss, aten.hinge_embedding_loss,
               aten.margin_ranking_loss, aten.addcmul, aten.addcdiv, aten.lerp,
               aten.xlogy, aten.logit)


def decompositions(inference: bool = True) -> dict:
    """The table handed to AOTAutograd. SDPA's per-device kernels are opened only for
    an ``inference`` graph: in a training graph autograd records such a kernel before
    the table applies, so its own backward runs on the saved log-sum-exp, and the
    kernel stays the faster forward there."""
    table = get_decompositions([aten._softmax, aten._log_softmax, aten._safe_softmax,
                                aten.linalg_vector_norm,
                                aten._native_batch_norm_legit.no_stats, *ACTIVATIONS,
                                *ELEMENTWISE])
    no_stats = aten._native_batch_norm_legit.no_stats
    table[no_stats] = functools.partial(_batch_norm_no_stats, own=table[no_stats])
    table[aten.logsumexp.default] = _logsumexp
    table[aten.var.correction] = _var
    table[aten.var_mean.correction] = _var_mean
    table[aten.std.correction] = _std
    table[aten.std_mean.correction] = _std_mean
    table[aten.native_layer_norm.default] = _layer_norm
    table[aten.native_group_norm.default] = _group_norm
    table[aten.scaled_dot_product_attention.default] = _sdpa
    table[aten.nll_loss_forward.default] = _nll_loss_forward
    table[aten.nll_loss2d_forward.default] = _nll_loss_forward
    if inference:
        table[aten._scaled_dot_product_flash_attention_for_cpu.default] = _flash_cpu
        table[aten._scaled_dot_product_flash_attention.default] = _flash_cuda
        table[aten._scaled_dot_product_efficient_attention.default] = _efficient_cuda
        table[aten._scaled_dot_product_cudnn_attention.default] = _cudnn_cuda
    table[aten.mean.dim] = _over_merged(
        lambda t, a, dtype=None: t.mean(a, keepdim=True, dtype=dtype))
    table[aten.sum.dim_IntList] = _over_merged(
        lambda t, a, dtype=None: t.sum(a, keepdim=True, dtype=dtype))
    table[aten.amax.default] = _amax
    table[aten.amin.default] = _amin
    table[aten.max.dim] = _max_dim
    table[aten.rsub.Scalar] = _rsub
    table[aten.rsub.Tensor] = _rsub
    table[aten.min.dim] = _min_dim
    return table


def over(ours: dict, theirs: dict) -> dict:
    """``theirs`` (Inductor's table) with ``ours`` in front: where one of ours declines an
    op (``NotImplemented``: SDPA with dropout, a reduction over dimensions it does not
    merge), theirs decomposes it, as Inductor would have. Left in the graph instead, an op
    that Inductor decomposes but does not lower failed its lowering (``nll_loss_forward``
    of a 1-d input: "both a fallback and a decomp for same op", a fuzzing find,
    2026-12-04)."""
    return {**theirs, **{op: _or_else(f, theirs[op]) if op in theirs else f
                         for op, f in ours.items()}}


def _or_else(ours, theirs):
    def either(*args, **kwargs):
        got = ours(*args, **kwargs)
        return theirs(*args, **kwargs) if got is NotImplemented else got
    return either
