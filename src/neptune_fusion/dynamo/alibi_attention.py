"""Written-out attention with a per-key bias through ``baddbmm`` (Bloom's ALiBi) in a
training graph, made ``nf.attention``'s differentiable op.

Bloom writes its scores as ``alibi.baddbmm(q, k^T, beta=1, alpha=1/sqrt(d))`` over
``(B*H, L, D)`` queries and a ``(B*H, 1, S)`` bias (the model's ALiBi, data it computes
in its own dtype), adds an additive mask, takes a float32 softmax and ``bmm``s the
probabilities with the values. A training graph cannot fuse that region (the backward
would read the ``(B, H, L, S)`` probabilities, which no kernel writes without a pass of
its own), and SDPA's call (written_attention.py) would need the bias and the mask summed
into one tensor of that size. ``nf.attention``'s op (``neptune_fusion::attention``, its
backward derived, docs/autodiff.md) takes the bias as a buffer a score_mod reads per key
(``alibi[b, h, j]``) and the mask as ``mask_mod=Causal()`` where it is the causal pattern
built from positions alone (as written_attention.py decides it; the masked tiles are
skipped), else as a buffer added per score (``mask[b, i, j]``); it saves one log-sum-exp
per row.

The form, on the Dynamo graph, from the product back; every intermediate value must have
no other reader:

* ``bmm(p.view(B*H, L, S), v)`` (``torch.bmm``, ``.bmm``, ``matmul``), ``v`` of shape
  ``(B*H, S, Dv)``;
* ``p``: a softmax over the last dimension, in the scores' dtype or in float32 and cast
  back, through casts and a dropout of probability 0 (``nf.attention`` has no dropout);
* its input: ``scores.view(B, H, L, S)``, plus one float mask (either side) that
  broadcasts to it from ``(B or 1, 1, L, S)``;
* ``scores = bias.baddbmm(q, kt, beta=, alpha=)`` (or ``torch.baddbmm``) with Python
  numbers ``beta`` (0: the bias is ignored, as torch ignores it) and ``alpha`` (the
  scale), ``q`` ``(B*H, L, D)``, ``kt`` ``(B*H, D, S)``, ``bias`` ``(B*H, 1, S)``; one
  floating dtype for all.

What differs from eager: the scores are not rounded to a 16-bit dtype before the softmax
(eager's ``baddbmm`` writes them in the model's dtype), as with any fused attention.
"""

from __future__ import annotations

import functools
import operator

import torch

from .written_attention import (
    _MATMUL,
    _SOFTMAX,
    _arg,
    _call,
    _causal,
    _is,
    _need,
    _NoMatch,
    _sole,
    _through_casts,
    _val,
    finish_masks,
)

_BMM = {torch.bmm, *_MATMUL}
_ADD = {operator.add, torch.add}


@functools.cache
def _score_mod(beta: float, masked: bool):
    """The score_mod adding ``beta`` times the bias of key ``j`` (none at ``beta == 0``)
    and, ``masked``, the additive mask's entry; one object per form (its guard and the
    op's handle key on it)."""
    if beta and masked:
        return lambda s, b, h, i, j, alibi, mask: s + beta * alibi[b, h, j] + mask[b, i, j]
    if beta:
        return lambda s, b, h, i, j, alibi: s + beta * alibi[b, h, j]
    if masked:
        return lambda s, b, h, i, j, mask: s + mask[b, i, j]
    return None


def _view_of(node, rank: int):
    """``(source, shape)`` of ``node = source.view(shape)`` (or ``reshape``) to ``rank``
    dimensions."""
    _need(isinstance(node, torch.fx.Node) and _is(node, {torch.reshape}, ("view", "reshape")))
    val = _val(node)
    _need(isinstance(val, torch.Tensor) and val.dim() == rank and
          all(isinstance(n, int) for n in val.shape))
    return node.args[0], tuple(val.shape)


def _baddbmm(node):
    """``(bias, q, kt, beta, alpha)`` of a ``baddbmm`` node."""
    _need(isinstance(node, torch.fx.Node) and _is(node, {torch.baddbmm}, "baddbmm") and
          _sole(node))
    bias, q, kt = (_arg(node, 0, "input"), _arg(node, 1, "batch1"), _arg(node, 2, "batch2"))
    beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
    _need(len(node.args) <= 3 and all(isinstance(x, torch.fx.Node) for x in (bias, q, kt)))
    _need(all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (beta, alpha)))
    return bias, q, kt, float(beta), float(alpha)


def _match(out):
    """The pieces of the attention whose product is ``out``, or raise ``_NoMatch``."""
    _need(_is(out, _BMM, ("bmm", "matmul", "__matmul__")) and len(out.args) == 2)
    pr, v = out.args
    _need(isinstance(pr, torch.fx.Node) and isinstance(v, torch.fx.Node) and _sole(pr))
    vv = _val(v)
    _need(isinstance(vv, torch.Tensor) and vv.dim() == 3)
    dtype = vv.dtype
    _need(dtype in (torch.float16, torch.bfloat16, torch.float32))
    p, _ = _view_of(pr, 3)
    _need(_sole(p))
    nodes: list = [pr]
    soft, dropout = _through_casts(p, dtype, nodes)
    _need(dropout == 0.0 and _is(soft, _SOFTMAX, "softmax") and _sole(soft))
    w = soft.args[0]
    _need(isinstance(w, torch.fx.Node) and _sole(w))
    vw = _val(w)
    _need(isinstance(vw, torch.Tensor) and vw.dim() == 4 and vw.dtype == dtype)
    dim = _arg(soft, 1, "dim")
    _need(dim is not None and int(dim) % 4 == 3)
    _need(soft.kwargs.get("dtype") in (None, dtype, torch.float32))
    _need(soft.kwargs.get("dtype") in (None, dtype) or dtype == torch.float32 or
          len(nodes) > 1)   # a float32 softmax of 16-bit scores is cast back
    nodes += [soft, w]
    view, mask = w, None
    if _is(w, _ADD, ("add", "__add__")) and len(w.args) == 2 and not w.kwargs:
        a, b = w.args   # the scores' view plus a mask, either side
        view, mask = (a, b) if _is_view4(a) else (b, a)
        _need(isinstance(mask, torch.fx.Node) and _sole(view))
        nodes.append(view)
    _need(_is_view4(view))
    scores, (B, H, L, S) = _view_of(view, 4)
    bias, q, kt, beta, alpha = _baddbmm(scores)
    nodes.append(scores)
    vq, vk, vb = _val(q), _val(kt), _val(bias)
    _need(all(isinstance(x, torch.Tensor) and x.dtype == dtype for x in (vq, vk, vb)))
    _need(tuple(vq.shape[:2]) == (B * H, L) and tuple(vk.shape) == (B * H, vq.shape[2], S))
    _need(tuple(vv.shape[:2]) == (B * H, S) and tuple(vb.shape) == (B * H, 1, S))
    if mask is not None:
        vm = _val(mask)
        _need(isinstance(vm, torch.Tensor) and vm.is_floating_point() and vm.dim() == 4)
        _need(vm.shape[0] in (1, B) and vm.shape[1] == 1 and tuple(vm.shape[2:]) == (L, S))
    return dict(q=q, kt=kt, v=v, bias=bias, beta=beta, alpha=alpha, mask=mask,
                shape=(B, H, L, S), dead=nodes)


def _is_view4(node) -> bool:
    try:
        src, _ = _view_of(node, 4)
    except _NoMatch:
        return False
    return _is(src, {torch.baddbmm}, "baddbmm")


def _op_node(graph, m: dict, causal: bool, made: list):
    """The nodes of ``nf.attention``'s op over the matched pieces (each new node also in
    ``made``); its result as the product's ``(B*H, L, Dv)``."""
    from .. import ops
    from ..frontend.attention import _OpEntry
    from ..runtime import torch_ops

    def call(fn, *args):
        made.append(_call(graph, fn, *args))
        return made[-1]
    B, H, L, S = m["shape"]
    d, dv = _val(m["q"]).shape[-1], _val(m["v"]).shape[-1]
    q = call(torch.reshape, m["q"], (B, H, L, d))
    k = call(torch.reshape, call(torch.transpose, m["kt"], -1, -2), (B, H, S, d))
    v = call(torch.reshape, m["v"], (B, H, S, dv))
    bufs, names = [], []
    if m["beta"]:
        bufs.append(call(torch.reshape, m["bias"], (B, H, S)))
        names.append("alibi")
    masked = m["mask"] is not None and not causal
    if masked:
        mask = call(torch.Tensor.expand, m["mask"], (B, 1, L, S))
        bufs.append(call(torch.reshape, mask, (B, L, S)))
        names.append("mask")
    score_mod = _score_mod(m["beta"], masked)
    mask_mod = ops.Causal() if causal else None
    key = torch_ops.constant_key
    h = torch_ops.handle(_OpEntry, key(score_mod), key(mask_mod), m["alpha"], False, None,
                         tuple(names) or None, key(None), key(None), (False, False))
    both = call(torch.ops.neptune_fusion.attention.default, q, k, v, bufs, h)
    o = call(operator.getitem, both, 0)   # the output; the log-sum-exp is for the backward
    return call(torch.reshape, o, (B * H, L, dv))


def alibi_attention_to_nf(gm) -> int:
    """Rewrite each ``baddbmm``-biased written-out attention of the Dynamo graph ``gm`` (a
    training graph) as ``nf.attention``'s op; the number rewritten."""
    made, graph, evaluated = 0, gm.graph, {}
    for out in list(graph.nodes):
        try:
            m = _match(out)
        except _NoMatch:
            continue
        mask, (B, H, L, S) = m["mask"], m["shape"]
        causal = mask is not None and _causal([mask], None, (B, H, L, S), evaluated)
        new: list = []
        with graph.inserting_before(out):
            try:
                call = _op_node(graph, m, causal, new)
            except Exception:   # noqa: BLE001 - the op refused the form: leave it as written
                for node in reversed(new):
                    graph.erase_node(node)
                continue
        out.replace_all_uses_with(call)
        for node in [out, *m["dead"]]:   # the product back to the scores (graph order)
            graph.erase_node(node)
        made += 1
    return finish_masks(gm, evaluated, made)

