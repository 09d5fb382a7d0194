"""The rest of a graph handed to Inductor as torch.compile's own Inductor entry hands it.

``torch.compile(fn)`` enters Inductor through ``compile_fx``, which runs AOTAutograd and
compiles each resulting graph with ``compile_fx_inner``, telling it what the graph is:
an inference graph or a training forward, its inputs at fixed addresses (parameters and
buffers), the device box its forward and backward share. The backend runs AOTAutograd
itself (its decompositions, the fusion pass on the forward graph), so it passes the same:
Inductor's CUDA graphs (``mode="reduce-overhead"``) need them -- an inference graph
replays without waiting for a backward, a weight is not copied into the graph's pool on
every call, a backward finds its forward's device.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def inductor_patches(mode: str | None, options: dict | None) -> dict:
    """The Inductor configuration of torch.compile's ``mode`` and ``options``
    (``torch._inductor.list_mode_options``; ``options`` win), patched in while the rest
    compiles. ``"reduce-overhead"`` turns on Inductor's CUDA graphs
    (``triton.cudagraphs``): the whole compiled graph, fused kernels included, is
    recorded once per shape and replayed (docs/jit.md)."""
    from ..errors import NeptuneError
    try:
        from torch._inductor import list_mode_options
        patches = dict(list_mode_options(mode or "default"))
    except (RuntimeError, KeyError) as err:
        raise NeptuneError(f"mode={mode!r}: {err}") from None
    patches.update(options or {})
    return patches


def _inductor(name: str):
    """An Inductor helper of ``compile_fx``'s, wherever this torch keeps it."""
    from torch._inductor import compile_fx, utils
    return getattr(utils, name, None) or getattr(compile_fx, name)


def _device_box():
    return _inductor("BoxedDeviceIndex")(None)


@dataclass
class GraphArgs:
    """What ``compile_fx`` tells ``compile_fx_inner`` about the graphs AOTAutograd makes
    of one Dynamo graph of ``dynamo_inputs`` inputs."""

    dynamo_inputs: int
    device: object = field(default_factory=_device_box)   # shared by forward and backward

    def forward(self, inputs, inference: bool) -> dict:
        """A forward graph's: inputs that AOTAutograd lifted (parameters, buffers) or
        that Dynamo marked static keep their addresses between calls."""
        fixed = _inductor("num_fw_fixed_arguments")(self.dynamo_inputs, len(inputs))
        return dict(static_input_idxs=_inductor("get_static_input_idxs")(fixed),
                    is_inference=inference, boxed_forward_device_index=self.device)

    def backward(self, gm) -> dict:
        """The backward graph's: its leading inputs (the saved parameters) are fixed."""
        fixed = _inductor("count_tangents")(gm)
        return dict(static_input_idxs=list(range(fixed)), is_backward=True,
                    boxed_forward_device_index=self.device)


def unit_rows(fx_node, *args, **kwargs):
    """Inductor's layout constraint of the ``fused`` op: each input tensor has unit stride
    in its last dimension (the kernels' rows), laid out so by the kernel that writes it
    or else copied. A layout tag (``needs_fixed_stride_order``) reached no element of the
    op's ``Tensor[]`` argument in torch 2.11, and a tag wins over this constraint: the op
    has none. On the H200 Inductor passed
    ``nn.MultiheadAttention``'s head split as a transposed view, which the op then copied
    with an ATen kernel (120 us of a 1.14 ms call, 2026-12-04).

    An input whose layout Inductor has not fixed yet (a pointwise result, a ``clone``)
    gets the strides it had when traced, where those have unit rows: the layout eager
    PyTorch gives it, which the kernel that writes it was written for. Made contiguous
    instead, ``nn.MultiheadAttention``'s queries, keys and values were written head by
    head, a transposing copy: 37.8, 22.1 and 21.1 us against 18.4, 17.1 and 16.2 for the
    same copies into the projection's own order, which cuDNN reads in Inductor's graph
    (H200, 2026-12-04). The kernels read any strides (a Gluon kernel through its host
    descriptors)."""
    from torch._inductor import ir
    from torch._inductor.virtualized import V
    known = V.graph.sizevars.statically_known_equals
    traced = [getattr(n, "meta", {}).get("val") for n in fx_node.args[0]] \
        if fx_node.args and isinstance(fx_node.args[0], (list, tuple)) else []

    def fix(a, val=None):
        if isinstance(a, (list, tuple)):
            vals = traced if len(traced) == len(a) else [None] * len(a)
            return type(a)(fix(x, v) for x, v in zip(a, vals))
        if not isinstance(a, ir.IRNode):
            return a
        try:
            size, stride = a.get_size(), a.get_stride()
            flexible = isinstance(a.get_layout(), ir.FlexibleLayout)
        except (AttributeError, NotImplementedError):   # no layout yet: choose it
            size, stride, flexible = None, None, True
        if not flexible and (not size or known(size[-1], 1) or known(stride[-1], 1)):
            return a
        want = _traced_unit_rows(val)
        if want is not None and flexible:
            return ir.ExternKernel.require_exact_strides(a, want)
        if size is not None and (not size or known(size[-1], 1) or known(stride[-1], 1)):
            return a
        return ir.ExternKernel.require_contiguous(a)
    return tuple(fix(a) for a in args), {k: fix(v) for k, v in kwargs.items()}


def _traced_unit_rows(val) -> list | None:
    """A traced input's strides when they are ints with unit stride in the last dimension
    (or that dimension has one element) and no two dimensions overlap; else None."""
    import torch
    if not isinstance(val, torch.Tensor) or val.dim() == 0:
        return None
    shape, stride = val.shape, val.stride()
    if not all(isinstance(x, int) for x in (*shape, *stride)):
        return None   # symbolic: comparing would guard
    if shape[-1] != 1 and stride[-1] != 1:
        return None
    if 0 in stride or val.numel() == 0 or not dense_layout(shape, stride):
        return None
    return list(stride)


def dense_layout(shape, stride) -> bool:
    """Whether ``shape`` at ``stride`` covers ``prod(shape)`` elements with no gaps or
    overlaps (a permutation of a contiguous layout)."""
    want = 1
    for n, s in sorted(((n, s) for n, s in zip(shape, stride) if n != 1),
                       key=lambda t: t[1]):
        if s != want:
            return False
        want *= n
    return True


def native_random(gm, example_inputs) -> None:
    """``gm``'s ATen random ops (``rand``, ``randn``: dropout's mask, ``rand_like``,
    SDPA's dropout) made Inductor's random prims, as ``compile_fx``'s joint-graph passes
    make them (``replace_random_passes``) before ``compile_fx_inner``, which the backend
    calls directly: Inductor lowers no ``aten.rand`` unless ``fallback_random`` is set
    (``LoweringException``: "should have been handled in replace_random.py", a fuzzing
    find, 2026-12-04). Only this pass of the joint ones: the others are optimisations
    (and the attention patterns would rewrite what is left of a refused region)."""
    import torch
    from torch._guards import detect_fake_mode
    from torch._inductor.fx_passes.replace_random import replace_random_passes
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.tools_common import legalize_graph
    aten = torch.ops.aten
    randoms = {aten.rand.default, aten.rand.generator, aten.randn.default,
               aten.randn.generator}
    if not any(n.target in randoms for n in gm.graph.nodes):
        return
    mode = detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)
    with V.set_fake_mode(mode):
        if replace_random_passes(gm):
            legalize_graph(gm)   # the seeds are created before their first reader
            gm.recompile()


ATTENTION_KERNELS = ("_scaled_dot_product_flash_attention",
                     "_scaled_dot_product_efficient_attention",
                     "_scaled_dot_product_cudnn_attention",
                     "_scaled_dot_product_flash_attention_for_cpu")


def attention_kernels(gm) -> int:
    """How many of SDPA's device kernels an ATen graph calls."""
    return sum(n.op == "call_function" and getattr(n.target, "__name__", "").split(".")[0]
               in ATTENTION_KERNELS for n in gm.graph.nodes)


def partition(gm, joint_inputs, *, joint_passes: bool, found: list, **kwargs):
    """A training graph's joint forward and backward split as torch.compile's Inductor
    entry splits it: Inductor's joint-graph passes first (``joint_passes``, for
    ``rest="inductor"``: among them the patterns that make written-out attention SDPA's
    kernel with its own backward; how many they made is appended to ``found``), then the
    min-cut rematerialisation partitioner, which saves for the backward what is cheapest
    to keep and recomputes elementwise work there. AOTAutograd's default partitioner saved
    every intermediate the backward reads, so a fused forward had to write them all
    (softmax entropy's kernel five outputs instead of three, docs/jit.md)."""
    from functorch.compile import min_cut_rematerialization_partition
    if joint_passes:
        from torch._guards import detect_fake_mode
        from torch._inductor.fx_passes.joint_graph import joint_graph_passes
        from torch._inductor.virtualized import V
        from torch._subclasses.fake_tensor import FakeTensorMode
        before = attention_kernels(gm)
        mode = detect_fake_mode(joint_inputs) or FakeTensorMode(allow_non_fake_inputs=True)
        with V.set_fake_mode(mode):   # the random-op passes read it
            gm = joint_graph_passes(gm)
        found.append(attention_kernels(gm) - before)
    return min_cut_rematerialization_partition(gm, joint_inputs, compiler="inductor",
                                               **kwargs)


def compile_rest(gm, example_inputs, patches: dict, kwargs: dict):
    """``gm`` (fused regions already replaced by kernel calls) compiled by Inductor under
    ``patches``, its random ops Inductor's first (:func:`native_random`); CUDA graphs,
    when the patches turn them on, wrap the compiled call before the patches are
    lifted."""
    import torch
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.lowering import add_layout_constraint, lowerings, make_fallback

    from ..runtime.torch_ops import define_ops
    define_ops()   # a graph with nothing fused has not defined them yet
    op = torch.ops.neptune_fusion.fused.default
    if op not in lowerings:   # a fallback kernel, as Inductor's implicit one, but ours
        make_fallback(op, layout_constraint=unit_rows, warn=False)
    add_layout_constraint(op, unit_rows)
    if any(n.target is op for n in gm.graph.nodes):
        # the graph names its kernels by a number of this process (runtime/torch_ops
        # .handle): Inductor's on-disk graph cache would hand another process the code
        # compiled for another kernel of the same number (wrong results, 2026-12-04)
        patches = {**patches, "fx_graph_cache": False}
    with inductor_config.patch(patches):
        native_random(gm, example_inputs)
        return compile_fx_inner(gm, example_inputs, **kwargs)
