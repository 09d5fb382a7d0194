"""Written-out attention in a training graph made one ``scaled_dot_product_attention`` call.

A training forward saves what its backward reads. For attention written out by hand --
``softmax(q @ k.transpose(-1, -2) * scale + mask) @ v``, GPT-2's eager attention,
nanoGPT's -- that is the ``(B, H, L, S)`` probabilities: the region is refused (no
kernel can write them without a pass of its own) and runs with the rest, unfused, where
SDPA's device kernels (flash, memory-efficient, cuDNN) need no such tensor and bring a
backward of their own. Inductor makes the forms its patterns know SDPA's kernel in its
joint-graph passes; GPT-2's additive mask is not among them. So before AOTAutograd, a
training graph's written-out attention becomes an SDPA call, which the backend then keeps
(an inference graph fuses the written form itself and is left alone).

The form, on the Dynamo graph (torch functions, operators and methods), from the second
product back; every intermediate value must have no other reader:

* ``matmul(p, v)`` -- ``p`` through casts to its own dtype (``.type``/``.to``) and a
  ``dropout`` (SDPA's ``dropout_p``: the same distribution, other random numbers, as
  any compiled dropout's are) -- ``softmax`` over the last dimension, in the scores'
  dtype or in float32 and cast back (``softmax(s, dtype=torch.float32)``,
  ``softmax(s.float())``: Llama's eager attention; SDPA's kernels take it in float32);
* the scores: additive float masks (``+ mask``, either side), or one boolean mask with
  ``-inf`` (``masked_fill(m, -inf)``, ``where(m, s, -inf)``), and before them products
  and divisions by Python numbers (the scale);
* ``matmul(q, k.transpose(-1, -2))`` (or ``transpose(-2, -1)``, ``.mT``).

Then every SDPA call of the training graph (those made so and the model's own,
:func:`causal_masks_to_is_causal`): a mask computed from positions alone (``arange``
and comparisons, ``tril``, ``where`` of constants: transformers' causal mask) is
evaluated at the rewrite; where it is the causal pattern SDPA's ``is_causal`` means
(key ``j`` kept for query ``i`` when ``j <= i``, every other entry ``-inf`` or at most
``-1e30``, so its weight is exactly 0 either way), the call takes ``is_causal=True``
instead of the mask: flash attention's
kernel, which skips the masked tiles and saves no mask for the backward (GPT-2's
``(B, 1, L, S)`` float mask was an input of the memory-efficient kernel and a saved
tensor). A mask read from a tensor (a registered buffer) is data: it stays a mask.

``q``, ``k`` and ``v`` must have one floating dtype and one rank (3 or more), equal
leading dimensions and the scores their dtype; a float mask that dtype too. A ``where``
fill other than ``-inf`` (``finfo.min``) is not rewritten: with every key of a row masked
eager gives uniform weights, SDPA's additive form would not. With a boolean ``-inf``
mask, a row whose every key is masked comes out 0 (SDPA's answer) where eager's softmax
gives NaN (docs/jit.md, *Known differences*).
"""

from __future__ import annotations

import functools
import math
import operator

import torch
import torch.nn.functional as F

_MATMUL = {torch.matmul, operator.matmul}
_SOFTMAX = {F.softmax, torch.softmax, torch.Tensor.softmax}
_DROPOUT = {F.dropout, torch.dropout}
_ADD = {operator.add, torch.add, operator.iadd}
_MUL = {operator.mul, torch.mul, operator.imul}
_DIV = {operator.truediv, torch.div, torch.true_divide, operator.itruediv}


def _is(node, functions: set, method: str | tuple) -> bool:
    methods = (method,) if isinstance(method, str) else method
    return (node.op == "call_function" and node.target in functions) or \
        (node.op == "call_method" and node.target in methods)


def _val(x):
    return x.meta.get("example_value") if isinstance(x, torch.fx.Node) else None


def _arg(node, k: int, name: str, default=None):
    return node.args[k] if len(node.args) > k else node.kwargs.get(name, default)


def _sole(node) -> bool:
    return len(node.users) == 1


class _NoMatch(Exception):
    pass


def _need(cond) -> None:
    if not cond:
        raise _NoMatch


def _through_casts(node, dtype, nodes: list):
    """``(node, dropout probability)``: ``node`` with casts to ``dtype`` and one dropout
    peeled off (backwards); ``nodes`` gets those peeled."""
    dropout = 0.0
    while True:
        nodes.append(node)
        if _is(node, set(), ("type", "to")) and len(node.args) == 2 and \
                node.args[1] == dtype and not node.kwargs:
            node = node.args[0]
        elif _is(node, _DROPOUT, "dropout") and not dropout:
            p = _arg(node, 1, "p", 0.5)   # F.dropout's ``training``, torch.dropout's ``train``
            training = _arg(node, 2, "training", node.kwargs.get("train", True))
            _need(isinstance(p, (int, float)) and isinstance(training, bool) and
                  not _arg(node, 3, "inplace", False))
            dropout = float(p) if training else 0.0
            node = node.args[0]
        else:
            nodes.pop()
            return node, dropout
        _need(isinstance(node, torch.fx.Node) and _sole(node))


def _is_upcast(node) -> bool:
    """``x.float()`` or ``x.to(torch.float32)``."""
    return isinstance(node, torch.fx.Node) and (
        _is(node, set(), "float") and len(node.args) == 1 and not node.kwargs or
        _is(node, set(), ("to", "type")) and len(node.args) == 2 and
        node.args[1] == torch.float32 and not node.kwargs)


def _is_neg_inf(x) -> bool:
    return isinstance(x, (int, float)) and math.isinf(x) and x < 0


def _scores(node, dtype):
    """``(q, k, scale, float masks, boolean keep mask or None, nodes)`` of the scores."""
    floats, keep, nodes = [], None, []
    while True:   # the masks, outermost first
        nodes.append(node)
        if _is(node, _ADD, ("add", "__add__")) and len(node.args) == 2 and not node.kwargs:
            a, b = node.args
            va, vb = _val(a), _val(b)
            _need(isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor))
            # the scores are the side the products come from: try both
            inner, mask = (a, b) if _is_chain(a) else (b, a)
            _need(_val(mask).dtype == dtype and _val(mask).is_floating_point())
            floats.append(mask)
            node = inner
        elif _is(node, {torch.masked_fill, torch.Tensor.masked_fill}, "masked_fill") and \
                keep is None and _is_neg_inf(_arg(node, 2, "value")):
            keep = ("not", node.args[1])
            node = node.args[0]
        elif node.op == "call_function" and node.target is torch.where and keep is None and \
                len(node.args) == 3 and _is_neg_inf(node.args[2]):
            keep = ("is", node.args[0])
            node = node.args[1]
        else:
            break
        _need(isinstance(node, torch.fx.Node) and _sole(node))
    scale = 1.0
    while _is(node, _MUL | _DIV, ("mul", "div", "__mul__", "__truediv__")) and \
            len(node.args) == 2 and not node.kwargs:
        a, b = node.args
        divides = _is(node, _DIV, ("div", "__truediv__"))
        if isinstance(b, (int, float)) and not isinstance(b, bool):
            scale, node = (scale / b if divides else scale * b), a
        elif isinstance(a, (int, float)) and not isinstance(a, bool) and not divides:
            scale, node = scale * a, b
        else:
            raise _NoMatch
        _need(isinstance(node, torch.fx.Node) and _sole(node))
        nodes.append(node)
    _need(_is(node, _MATMUL, ("matmul", "__matmul__")) and len(node.args) == 2)
    q, kt = node.args
    _need(isinstance(kt, torch.fx.Node) and _sole(kt))
    if _is(kt, {torch.transpose}, "transpose"):
        _need(sorted(int(d) % _val(kt).dim() for d in kt.args[1:3]) ==
              [_val(kt).dim() - 2, _val(kt).dim() - 1])
    else:
        _need(kt.op == "call_function" and kt.target is getattr and kt.args[1] == "mT")
    nodes.append(kt)   # the product itself is in already
    return q, kt.args[0], scale, floats, keep, nodes


def _is_chain(node) -> bool:
    """Whether ``node`` is a product of scores (the side of an add the masks are not)."""
    while isinstance(node, torch.fx.Node):
        if _is(node, _MATMUL, ("matmul", "__matmul__")):
            return True
        if node.op == "call_function" and node.target is torch.where:
            node = node.args[1]
        elif _is(node, _MUL | _DIV | _ADD | {torch.masked_fill, torch.Tensor.masked_fill},
                 ("mul", "div", "add", "__mul__", "__truediv__", "__add__", "masked_fill")):
            node = node.args[0]
        else:
            return False
    return False


def _match(out):
    """The SDPA call's pieces for ``out = matmul(p, v)``, or raise :class:`_NoMatch`."""
    _need(_is(out, _MATMUL, ("matmul", "__matmul__")) and len(out.args) == 2)
    p, v = out.args
    _need(isinstance(p, torch.fx.Node) and isinstance(v, torch.fx.Node) and _sole(p))
    vo, vv = _val(out), _val(v)
    _need(isinstance(vo, torch.Tensor) and isinstance(vv, torch.Tensor))
    dtype = vv.dtype
    _need(dtype in (torch.float16, torch.bfloat16, torch.float32))
    nodes: list = []
    soft, dropout = _through_casts(p, dtype, nodes)
    _need(_is(soft, _SOFTMAX, "softmax") and _sole(soft))
    dim = _arg(soft, 1, "dim")
    s = soft.args[0]
    _need(isinstance(s, torch.fx.Node) and _sole(s))
    # a softmax in float32 of 16-bit scores, cast back (Llama's eager attention:
    # ``softmax(s, dtype=float32).to(q.dtype)``, or ``softmax(s.float())``): SDPA's
    # kernels take the softmax in float32 too
    cast_back = bool(nodes)   # casts (or a dropout) peeled between softmax and product
    upcast = [s] if _is_upcast(s) else []
    if upcast:
        s = s.args[0]
        _need(isinstance(s, torch.fx.Node) and _sole(s))
    wide = upcast or soft.kwargs.get("dtype") == torch.float32
    vs = _val(s)
    _need(isinstance(vs, torch.Tensor) and vs.dtype == dtype)
    _need(dim is not None and int(dim) % vs.dim() == vs.dim() - 1)
    _need(soft.kwargs.get("dtype") in (None, dtype) or wide)
    _need(not wide or dtype == torch.float32 or cast_back)
    q, k, scale, floats, keep, scores = _scores(s, dtype)
    vq, vk = _val(q), _val(k)
    _need(isinstance(vq, torch.Tensor) and isinstance(vk, torch.Tensor))
    _need(vq.dtype == vk.dtype == dtype and vq.dim() == vk.dim() == vv.dim() >= 3)
    _need(vq.shape[:-2] == vk.shape[:-2] == vv.shape[:-2] and vq.shape[-1] == vk.shape[-1])
    _need(vk.shape[-2] == vv.shape[-2] and not (floats and keep))
    _need(tuple(vs.shape) == (*vq.shape[:-1], vk.shape[-2]))   # no mask widens them
    if keep is not None:
        _need(_val(keep[1]) is not None and _val(keep[1]).dtype == torch.bool)
    for m in [*floats, *([keep[1]] if keep else [])]:   # masks broadcast to the scores
        _need(isinstance(_val(m), torch.Tensor) and
              torch.broadcast_shapes(_val(m).shape, vs.shape) == vs.shape)
    return q, k, v, scale, dropout, floats, keep, [*nodes, soft, *upcast, *scores]


# what a mask made from positions alone may be computed with (pure, deterministic)
_POSITIONAL = {
    torch.arange, torch.atleast_2d, torch.zeros, torch.ones, torch.full, torch.where,
    torch.tril, torch.triu, torch.logical_not, torch.logical_and, torch.logical_or,
    torch.eq, torch.ne, torch.le, torch.lt, torch.ge, torch.gt, torch.add, torch.sub,
    torch.mul, torch.masked_fill, torch.zeros_like, torch.ones_like, torch.full_like,
    torch.tensor, operator.getitem, operator.add, operator.sub, operator.mul, operator.eq,
    operator.ne, operator.le, operator.lt, operator.ge, operator.gt, operator.invert,
    operator.and_, operator.or_, operator.neg}
_POSITIONAL_METHODS = {"expand", "view", "reshape", "unsqueeze", "to", "type", "float",
                       "bool", "masked_fill", "eq", "ne", "le", "lt", "ge", "gt", "add",
                       "sub", "mul", "logical_not", "tril", "triu", "__getitem__",
                       "contiguous", "clone", "int", "long"}
_MAX_POSITIONAL = 1 << 27   # elements of a mask evaluated at the rewrite
_CAUSAL_FLOOR = -1e30   # a masked entry's additive value: its weight is exactly 0


def _positional(node, memo: dict):
    """The value of ``node`` computed from constants alone, evaluated now (``memo``
    keeps each node's); raises :class:`_NoMatch` at a graph input, a buffer or an op
    outside the pure set (``_POSITIONAL``)."""
    if isinstance(node, (list, tuple)):
        return type(node)(_positional(a, memo) for a in node)
    if isinstance(node, dict):
        return {k: _positional(a, memo) for k, a in node.items()}
    if not isinstance(node, torch.fx.Node):
        _need(not isinstance(node, torch.SymInt))
        return node
    if node not in memo:
        v = _val(node)
        _need(isinstance(v, torch.Tensor) and v.numel() <= _MAX_POSITIONAL and
              all(isinstance(n, int) for n in v.shape))
        if node.op == "call_function" and node.target in _POSITIONAL:
            fn = node.target
        elif node.op == "call_method" and node.target in _POSITIONAL_METHODS:
            fn = functools.partial(_call_method, node.target)
        else:
            raise _NoMatch
        args, kwargs = _positional(node.args, memo), _positional(dict(node.kwargs), memo)
        with torch.no_grad():
            memo[node] = fn(*args, **kwargs)
    return memo[node]


def _call_method(name, obj, *args, **kwargs):
    return getattr(obj, name)(*args, **kwargs)


def _causal(floats, keep, shape, memo: dict) -> bool:
    """Whether the masks (made from positions alone) are SDPA's ``is_causal`` pattern over
    scores of ``shape``: key ``j`` kept for query ``i`` exactly when ``j <= i``. ``memo``
    gets the nodes evaluated."""
    try:
        values = [_positional(m, memo) for m in floats]
        kept = _positional(keep[1], memo) if keep is not None else None
    except (_NoMatch, RuntimeError, TypeError, ValueError):
        return False
    rows, cols = shape[-2], shape[-1]
    causal = torch.ones(rows, cols, dtype=torch.bool).tril()

    def own(m):   # on its own leading dimensions: never the whole (B, H, L, S)
        m = m.cpu()
        return m.expand(*m.shape[:-2], rows, cols) if m.dim() >= 2 else m.expand(rows, cols)
    if kept is not None:
        kept = own(kept)
        return bool(((kept if keep[0] == "is" else ~kept) == causal).all())
    total = sum(own(m).float() for m in values)
    return bool(((total == 0) | ~causal).all()) and \
        bool(((total <= _CAUSAL_FLOOR) | causal).all())


def written_attention_to_sdpa(gm) -> int:
    """Rewrite each written-out attention of the Dynamo graph ``gm`` (a training graph)
    as ``F.scaled_dot_product_attention``; the number rewritten."""
    made, graph = 0, gm.graph
    for out in list(graph.nodes):
        try:
            q, k, v, scale, dropout, floats, keep, dead = _match(out)
        except _NoMatch:
            continue
        with graph.inserting_before(out):
            mask = None
            for m in floats:
                mask = m if mask is None else _call(graph, operator.add, mask, m)
            if keep is not None:
                how, cond = keep
                mask = cond if how == "is" else _call(graph, torch.logical_not, cond)
            if mask is not None and max(_val(m).dim() for m in
                                        [*floats, *([keep[1]] if keep else [])]) < 2:
                mask = _call(graph, torch.atleast_2d, mask)   # SDPA's minimum
            call = graph.call_function(F.scaled_dot_product_attention, (q, k, v),
                                       {"attn_mask": mask, "scale": scale,
                                        "dropout_p": dropout})
            call.meta["example_value"] = _val(out)
            if any(u.op == "output" for u in out.users):   # returned: eager's layout
                call = graph.call_method("contiguous", (call,))
                call.meta["example_value"] = _val(out)
        out.replace_all_uses_with(call)
        for node in [out, *dead]:   # the product back to the scores' (graph order)
            graph.erase_node(node)
        made += 1
    if made:
        gm.recompile()
    return made


def _call(graph, fn, *args):
    """A new node ``fn(*args)`` with its example value (the pass after reads it); an
    argument that is not a node (a shape, a list of nodes) is taken as it is, its nodes
    by their example values."""
    def value(a):
        if isinstance(a, (list, tuple)):
            return type(a)(value(x) for x in a)
        return _val(a) if isinstance(a, torch.fx.Node) else a
    node = graph.call_function(fn, args)
    node.meta["example_value"] = fn(*(value(a) for a in args))
    return node


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
              "enable_gqa")


def causal_masks_to_is_causal(gm) -> int:
    """Give each ``scaled_dot_product_attention`` call of the Dynamo graph ``gm`` (a
    training graph) whose mask is made from positions alone and is the causal pattern
    ``is_causal=True`` instead of the mask (module docstring); the number changed."""
    made, graph, evaluated = 0, gm.graph, {}
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not F.scaled_dot_product_attention:
            continue
        bound = dict(zip(_SDPA_ARGS, node.args), **node.kwargs)
        mask, q, k = bound.get("attn_mask"), bound.get("query"), bound.get("key")
        vq, vk, vm = _val(q), _val(k), _val(mask)
        if not (isinstance(vm, torch.Tensor) and isinstance(vq, torch.Tensor) and
                isinstance(vk, torch.Tensor)) or bound.get("is_causal"):
            continue
        shape = (*vq.shape[:-1], vk.shape[-2])
        floats, keep = ([], ("is", mask)) if vm.dtype == torch.bool else ([mask], None)
        if not _causal(floats, keep, shape, evaluated):
            continue
        bound.update(attn_mask=None, is_causal=True)
        node.args, node.kwargs = tuple(bound.pop(a) for a in _SDPA_ARGS[:3]), bound
        made += 1
    return finish_masks(gm, evaluated, made)


def finish_masks(gm, evaluated: dict, made: int) -> int:
    """After ``made`` rewrites of ``gm``: the nodes of the masks evaluated at them
    (``evaluated``, :func:`_causal`'s memo) that nothing reads any more erased, the graph
    recompiled where anything changed; returns ``made``."""
    for node in reversed(list(gm.graph.nodes)):   # a causal mask's computation, now unread
        if node in evaluated and not node.users:
            gm.graph.erase_node(node)
    if made:
        gm.recompile()
    return made
