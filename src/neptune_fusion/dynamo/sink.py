"""Views moved below the pointwise maps that read them, before the regions are found.

``silu(group_norm(x))``: the group norm's decomposition normalises on the ``(N, G, c)``
view and reshapes back to ``(N, C, H, W)``; the SiLU then reads the reshaped value. In a
region that ends ``... -> view -> silu`` the kernel would write on the 4-d layout, where
the group of an element is arithmetic across tile axes, which the code generator
refuses; and leaving the view outside the kernel leaves the SiLU outside too, a second
pass over the tensor. A pointwise map commutes with a reshape: ``f(view(a), view(b)) =
view(f(a, b))`` when ``a`` and ``b`` have one shape and are reshaped alike. So the graph
is rewritten that way first, and the region ends in the map, with the view after it.

Only value-wise maps move (not ``tril``, ``gather`` or ``cat``, whose results depend on
positions), only through ``view``/``_unsafe_view``/``reshape`` of contiguous values (the
map's result is then contiguous and the same view applies), and only when every tensor
the map reads is such a view or a 0-d tensor. A view of a graph input (or of a view of
one) stays where it is: a region takes it as its input, a free reshape of a contiguous
tensor outside its kernel (``partition.without_views``), where a map moved above it (a
half-precision group norm's cast to float32) would keep it inside, as index arithmetic
across tile axes.
"""

from __future__ import annotations

import torch

aten, prims = torch.ops.aten, torch.ops.prims

_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_MAPS = frozenset(
    getattr(getattr(aten, name), overload)
    for name in ("add", "sub", "mul", "div", "neg", "exp", "exp2", "log", "log2", "sqrt",
                 "rsqrt", "tanh", "sigmoid", "erf", "abs", "reciprocal", "relu", "silu", "softplus",
                 "gelu", "pow", "maximum", "minimum", "clamp", "clamp_min", "clamp_max",
                 "where", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
                 "logical_not", "bitwise_and", "bitwise_or", "bitwise_not", "_to_copy")
    for overload in getattr(aten, name).overloads()) | {prims.convert_element_type.default}


def sink_views(graph) -> bool:
    """Rewrite ``f(view(a), ...)`` as ``view(f(a, ...))`` throughout ``graph`` (in node
    order, so a chain of maps after one view moves it to its end); whether anything
    changed. The new nodes have no fake values: the caller propagates them."""
    changed, made = False, {}   # made: a moved map's result -> its shape (contiguous)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _MAPS or any(
                k not in ("dtype", "alpha", "approximate", "beta", "threshold")
                and v is not None for k, v in node.kwargs.items()):
            continue   # a cast that also moves, or sets a layout, stays after the view
        views = _common_view(node, made)
        if views is None:
            continue
        source = {v: v.args[0] for v in views}

        def swap(a, source=source):
            return source.get(a, a) if isinstance(a, torch.fx.Node) else a
        with graph.inserting_before(node):
            inner = graph.call_function(node.target,
                                        tuple(_map(swap, a) for a in node.args),
                                        {k: _map(swap, a) for k, a in node.kwargs.items()})
            first = views[0]
            moved = graph.call_function(first.target, (inner, *first.args[1:]),
                                        dict(first.kwargs))
        made[inner] = _shape_of(views[0].args[0], made)
        node.replace_all_uses_with(moved)
        graph.erase_node(node)
        for v in views:
            if not v.users:
                graph.erase_node(v)
        changed = True
    return changed


def _map(f, a):
    if isinstance(a, (list, tuple)):
        return type(a)(_map(f, x) for x in a)
    return f(a)


def _common_view(node, made: dict) -> list | None:
    """The view nodes ``node`` reads if every tensor it reads is one of them, all
    reshaping contiguous values of one shape to one shape (0-d tensors aside); else
    None. ``made``: maps moved already (no fake value yet; contiguous, as a pointwise
    result of contiguous values is)."""
    views, others = [], []
    for a in node.all_input_nodes:
        (views if a.op == "call_function" and a.target in _VIEWS else others).append(a)
    if not views or any(_rank(o) != 0 for o in others):
        return None
    shape, source = views[0].args[1:], _shape_of(views[0].args[0], made)
    for v in views:
        src = v.args[0]
        if _of_input(v) or v.args[1:] != shape or v.kwargs or source is None \
                or _shape_of(src, made) != source or not _contiguous(src, made):
            return None
    return views


def _of_input(view) -> bool:
    """Whether ``view`` reshapes a graph input, directly or through other views."""
    while view.op == "call_function" and view.target in _VIEWS:
        view = view.args[0]
    return view.op == "placeholder"


def _rank(node) -> int | None:
    val = node.meta.get("val")
    return val.dim() if isinstance(val, torch.Tensor) else None


def _shape_of(node, made: dict):
    """A value's shape as text (comparing symbolic sizes as text adds no guard)."""
    if node in made:
        return made[node]
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return None if not isinstance(val, torch.Tensor) else tuple(map(str, val.shape))


def _contiguous(node, made: dict) -> bool:
    """Whether ``node``'s value is contiguous, False where that is not known without a
    guard on a symbolic size or stride."""
    from torch._prims_common import is_contiguous_or_false
    if node in made:
        return True
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and bool(is_contiguous_or_false(val))
