"""Replacing a translated region by one call of its compiled operator.

The call is the ``neptune_fusion::fused`` op (:mod:`neptune_fusion.runtime.torch_ops`:
``neptune_fusion::kernel`` without the custom op's per-call Python wrappers; the graph is
AOTAutograd's forward or inference graph, which nothing differentiates through) with the
operator's handle, so the rest of the graph -- Inductor or eager -- runs it as an opaque
op. Boolean inputs (masks) are passed as ``int32``, as kernels take no bool; a symbolic
int whose value no input shape gives, as a 0-d ``int64`` tensor (``scalar_tensor``).
"""

from __future__ import annotations

import operator

import torch

from ..runtime.torch_ops import KernelEntry, constant_key, handle
from .inductor import dense_layout
from .refused import Refused
from .symbolic import dim, hint, hints_of, is_scalar_value, same, shape_of, static


def replace_region(graph, region, inputs, casts, kernel, packed=None) -> None:
    """Insert the call of ``kernel`` on ``inputs`` and make the region's outputs read its
    results (the region's nodes are then dead, and removed by the caller). ``packed``
    (a :class:`~.gqa.Packing`): its query inputs are passed reshaped to the packed shape
    and the one result reshaped back. A result the kernel writes in another order
    (:func:`output_orders`) is permuted back, a view."""
    h = handle(KernelEntry, constant_key(kernel))
    order = {n: k for k, n in enumerate(graph.nodes)}
    last = max(region.nodes, key=order.__getitem__)
    with graph.inserting_before(last.next):   # in creation order, after the region
        args = []
        device = _device(inputs)
        for node in inputs:
            n = node
            if n.op == "get_attr":   # a tensor constant of the function (torch.tensor(.2))
                # lifted as torch's own graphs read one: the fake mode that propagates
                # fake values (ours, Inductor's) refuses a real tensor as an op's input
                n = graph.call_function(torch.ops.aten.lift_fresh_copy.default, (n,))
                n.meta["val"] = node.meta["val"]
            if is_scalar_value(n.meta["val"]):   # a symbolic int no shape gives
                n = graph.call_function(torch.ops.aten.scalar_tensor.default, (n,),
                                        {"dtype": torch.int64, "device": device})
            elif node in casts:
                n = graph.call_function(torch.ops.prims.convert_element_type.default,
                                        (n, getattr(torch, casts[node])))
            elif _strided_rows(n):   # kernels read rows with unit stride
                n = graph.call_function(torch.ops.aten.clone.default, (n,),
                                        {"memory_format": torch.contiguous_format})
            elif n.meta["val"].dim() == 0 and n.meta["val"].device != device:
                # a 0-d CPU tensor (a Python float of a dynamic graph, cast) beside
                # device tensors: eager reads it as a scalar, a kernel through a pointer
                n = graph.call_function(torch.ops.aten._to_copy.default, (n,),
                                        {"device": device})
            # the region's node, not its cast or copy: a packed bool mask per query head
            # or a strided query was passed unpacked, failing the op's input check
            # (FeedError; a fuzzing find, 2026-12-04)
            if packed is not None and node in packed.queries:
                shape = packed.input_shape(tuple(node.meta["val"].shape))
                n = graph.call_function(torch.ops.aten.reshape.default, (n, list(shape)))
            args.append(n)
        call = graph.call_function(torch.ops.neptune_fusion.fused.default, (args, h))
        gets = [graph.call_function(operator.getitem, (call, k))
                for k in range(len(region.outputs))]
        if packed is not None:   # (B, Hkv, g N, Dv) -> (B, Hq, N, Dv): a view
            gets = [graph.call_function(torch.ops.aten.reshape.default,
                                        (g, list(out.meta["val"].shape)))
                    for g, out in zip(gets, region.outputs)]
        for k, order in enumerate(output_orders(region)):
            if order is not None:   # value.permute(order) -> value: a view
                at = [order.index(d) for d in range(len(order))]
                gets[k] = graph.call_function(torch.ops.aten.permute.default,
                                              (gets[k], at))
    for out, got in zip(region.outputs, gets):
        # a later region may read this result: its translation needs the shape and dtype
        # (finish() propagates exact fake values once every region is placed)
        if "val" in out.meta:
            got.meta["val"] = out.meta["val"]
        out.replace_all_uses_with(got)


def output_orders(region) -> tuple:
    """Per output of ``region``: where it is an output of the graph, dense and not
    contiguous (``softmax(x, -1).t()``, whose ``t`` the region holds), the order of its
    dimensions in memory, outermost first; else None. The kernel writes such a value in
    that order, ``value.permute(order)``, and the graph returns it permuted back: the
    strides eager PyTorch gives it (and Inductor keeps a graph's traced output strides).
    A value read only inside the graph keeps the kernel's contiguous rows; a non-dense
    one (a slice, a broadcast) comes back contiguous. Dynamic graphs too: their strides
    are compared as expressions of the size symbols (:func:`_memory_order`)."""
    return tuple(_memory_order(n.meta.get("val"))
                 if any(u.op == "output" for u in n.users) else None
                 for n in region.outputs)


def _memory_order(v) -> tuple | None:
    if not isinstance(v, torch.Tensor) or v.dim() < 2:
        return None
    shape, stride = shape_of(v), tuple(_at_least_one(dim(s)) for s in v.stride())
    if any(static(n) and n == 0 for n in shape):
        return None
    if all(static(x) for x in (*shape, *stride)):
        if v.is_contiguous() or not dense_layout(shape, stride):
            return None
        return tuple(sorted(range(len(shape)), key=lambda d: (-stride[d], d)))
    # symbolic strides (a dynamic graph): never compared as SymInts (that would guard);
    # the example's values order the dimensions, and the order is kept only where the
    # strides are that order's contiguous strides for every value of the symbols
    hints = hints_of((v,))
    try:
        order = tuple(sorted(range(len(shape)),
                             key=lambda d: (-hint(stride[d], hints), d)))
    except Refused:   # a symbol without an example value: the contiguous default
        return None
    if _dense_in(tuple(range(len(shape))), shape, stride) \
            or not _dense_in(order, shape, stride):
        return None
    return order


def _at_least_one(e):
    """A symbolic stride with torch's ``Max(1, n)`` (the stride past a dimension ``n``
    that could be 0) read as ``n``: equal wherever the tensor has an element."""
    if static(e):
        return e
    return e.replace(lambda a: type(a).__name__ == "Max" and len(a.args) == 2
                     and 1 in a.args,
                     lambda a: a.args[0] if a.args[1] == 1 else a.args[1])


def _dense_in(order, shape, stride) -> bool:
    """Whether ``stride`` is the contiguous layout of ``shape`` permuted by ``order``
    (outermost first) for every value of the sizes' symbols; an extent-1 dimension's
    stride is free (a dynamic size is never 1: Dynamo specialises 0 and 1)."""
    want = 1
    for d in reversed(order):
        if static(shape[d]) and shape[d] == 1:
            continue
        if not same(stride[d], want):
            return False
        want = want * shape[d]
    return True


def _strided_rows(node) -> bool:
    """Whether the input's last dimension is not contiguous (read without guarding on a
    dynamic size or stride: an unknown one counts as strided, and is copied)."""
    v = node.meta.get("val")
    if v is None or v.dim() == 0:
        return False
    n, stride = dim(v.shape[-1]), dim(v.stride(-1))
    return not (static(n) and n <= 1) and not (static(stride) and stride == 1)


def mutations_last(graph) -> None:
    """Every ``copy_`` into a graph input moved back to the graph's end, in its order.
    AOTAutograd places a graph's input mutations there (``keep_inference_input_mutations``:
    a static cache's new rows, a position counter); a topological sort only knows data
    dependencies and had moved a counter's increment ahead of a fused call reading the
    counter's old value (wrong decode logits through Inductor)."""
    out = next(n for n in graph.nodes if n.op == "output")
    for n in [n for n in graph.nodes if n.op == "call_function"
              and n.target is torch.ops.aten.copy_.default and n.args[0].op == "placeholder"]:
        out.prepend(n)


def finish(gm, example_inputs) -> None:
    """Drop dead nodes, restore a topological order, recompile, and give every node its
    fake value again (Inductor reads ``node.meta["val"]``)."""
    from torch.fx.passes.tools_common import legalize_graph

    legalize_graph(gm)   # first: a call placed after its region may precede a reader
    mutations_last(gm.graph)
    gm.graph.eliminate_dead_code()
    propagate(gm, example_inputs)


def propagate(gm, example_inputs) -> None:
    """Recompile ``gm`` and give every node its fake value again."""
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    gm.recompile()
    mode = detect_fake_mode(example_inputs)
    if mode is None:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        FakeTensorProp(gm, mode).propagate(*example_inputs)
    else:
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*example_inputs)


def trial(kernel, inputs, casts, packed=None, hints=None) -> None:
    """One eager call of ``kernel`` on random tensors shaped like ``inputs``' fake values
    (bool inputs cast as passed, packed query inputs in their packed shape, dynamic sizes
    at the example's values ``hints``), outside the fake mode: it compiles (on a GPU:
    tunes) the shape class now, so a failure leaves the region out instead of failing
    later."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from ..runtime.torch_ops import KernelEntry
    with unset_fake_temporarily():
        KernelEntry(kernel).run(_random_like(inputs, casts, packed, hints or {}))


def _device(inputs):
    """The device of a region's kernel: its first input tensor's with a dimension (a 0-d
    one may be a CPU scalar beside CUDA tensors), else its first tensor's."""
    tensors = [n.meta["val"] for n in inputs if not is_scalar_value(n.meta["val"])]
    return next((v.device for v in tensors if v.dim() > 0),
                tensors[0].device if tensors else None)


def _random_like(inputs, casts, packed, hints) -> list:
    out = []
    device = _device(inputs)
    for n in inputs:
        v = n.meta["val"]
        if is_scalar_value(v):   # a symbolic int passed as a 0-d tensor: its example value
            out.append(torch.tensor(hint(dim(v), hints), dtype=torch.int64, device=device))
            continue
        shape = tuple(hint(d, hints) for d in shape_of(v))
        if packed is not None and n in packed.queries:
            shape = packed.input_shape(shape)
        at = device if v.dim() == 0 else v.device   # as replace_region passes it
        if v.dtype.is_floating_point:
            t = torch.randn(shape, dtype=v.dtype, device=at)
        else:
            t = torch.randint(0, 2, shape, device=at).to(v.dtype)
        out.append(t.to(getattr(torch, casts[n])) if n in casts else t)
    return out
