"""torch ops: compiled operators and ``nf.attention`` as ``torch.library`` custom ops.

Eager calls go straight to the Python launch path (no op boundary: it costs host time).
While torch.compile or torch.export traces a program (``torch.compiler.is_compiling()``),
a call becomes one op with a fake implementation computed from the input shapes, so the
trace has no graph break and tunes or launches nothing:

* ``neptune_fusion::kernel(Tensor[] inputs, int handle) -> Tensor[]`` for a
  :class:`~.kernel.Kernel`, :class:`~.auto.AutoKernel` or :class:`~.staged.StagedKernel`;
* ``neptune_fusion::attention(Tensor q, Tensor k, Tensor v, Tensor[] buffers, int handle)
  -> (Tensor, Tensor)`` for ``nf.attention`` where a gradient or the log-sum-exp is wanted
  (the output and its log-sum-exp, which its registered backward reads);
* ``neptune_fusion::fused(Tensor[] inputs, int handle) -> Tensor[]``: ``kernel`` without
  the custom op's per-call Python wrappers, for the regions the jit backend fuses in a
  graph AOTAutograd has already differentiated (:mod:`neptune_fusion.dynamo.rewrite`);
* ``neptune_fusion::attention_infer`` (and ``attention_infer_lse``, with the
  log-sum-exp): ``attention`` without them, traced where no input requires a gradient
  (or grad mode is off): it has no derivative;
* ``neptune_fusion::kernel_grad(Tensor[] inputs, int handle) -> Tensor[]``: a
  differentiable compiled chain whose inputs require grad, with a registered backward
  (``neptune_fusion::kernel_backward``: the derived gradient kernels).

An op takes tensors and plain values only, so what is not a tensor -- the compiled
operator, or attention's mods, scale, cache and schedule -- is entered once in a table of
this process and passed as its ``int`` handle. :func:`handle` runs at trace time, outside
the traced code (``assume_constant_result``): the handle is a constant of the graph. The
op's real implementation is the eager call of the entry, so a graph run tunes a new shape
class at its first call as an eager call does, and raises what it raises (inside a CUDA
graph capture: the auto-scheduler's "call it once before the capture" error). The table
is the one piece of process state here (ops cannot take Python objects); it is keyed by
the entries' identity and holds them for as long as the process lives, as a compiled
graph may call them at any time. docs/torch.md says why this design.
"""

from __future__ import annotations

import itertools
import sys
import threading
import weakref
from collections.abc import Callable

from .inputs import remember
from .prepared import PreparedLaunch, signed  # the bound calls (no torch imported)

_TABLE: dict[tuple, int] = {}   # (maker, *key) -> handle
_ENTRIES: list = []             # handle -> entry: .run(tensors), .fake(tensors)
_LOCK = threading.Lock()
_DEFINED: list = []             # the ops, once defined
_REFS = weakref.WeakValueDictionary()   # ref name -> referable object of this process
_REF_NUMBERS = itertools.count(1)
_REF, _DATACLASS = "nf-ref", "nf-dataclass"   # tags of constant keys (see constant_key)


def compiling() -> bool:
    """Whether torch.compile (Dynamo) or torch.export is tracing the current call (cheap:
    false without importing torch when torch is not loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def referable(obj):
    """Give ``obj`` (a compiled operator, an attention cache: objects with identity) a
    name by which traced code refers to it; returns ``obj``. Called when it is made."""
    # a string, not an int: Dynamo may turn an int attribute of an argument symbolic when
    # a recompile sees another value (automatic dynamic), and a symbol is not a constant
    n = f"{_REF}-{next(_REF_NUMBERS)}"
    obj._nf_ref = n
    _REFS[n] = obj
    return obj


def constant_key(x):
    """``x`` as a value every supported Dynamo can take as a constant (code Dynamo traces).

    Dynamo hands ``assume_constant_result`` functions only what it can rebuild as a Python
    constant, and what that is differs by version: torch 2.11 refuses frozen dataclasses
    (``ops.Causal()``, a ``Schedule``) and plain objects (a kernel, a cache) that 2.13
    accepts. Functions, closures, numbers, strings, ``None``, tuples and classes pass
    everywhere, so objects travel as those: a referable object as its name, a dataclass
    as its class and field values (rebuilt equal by :func:`from_key`). A dataclass mod
    passed *as an argument* of the compiled function whose int field differs between calls
    may be made symbolic by Dynamo and fail to convert: make such mods globals or
    closures (they are constants of the program)."""
    if isinstance(x, tuple):
        return tuple(constant_key(e) for e in x)
    ref = getattr(x, "_nf_ref", None)
    if ref is not None:
        return (_REF, ref)
    fields = getattr(type(x), "__dataclass_fields__", None)
    if fields is not None and not isinstance(x, type):
        return (_DATACLASS, type(x), tuple((n, constant_key(getattr(x, n))) for n in fields))
    return x


def from_key(k):
    """The object a :func:`constant_key` stands for (an equal one for dataclasses)."""
    if isinstance(k, tuple) and len(k) == 2 and k[0] == _REF:
        return _REFS[k[1]]
    if isinstance(k, tuple) and len(k) == 3 and k[0] == _DATACLASS:
        # rebuilt field by field (frozen or slotted, init=False fields too): the values
        # were the object's, so no __init__/__post_init__ is needed to make them
        obj = object.__new__(k[1])
        for n, v in k[2]:
            object.__setattr__(obj, n, from_key(v))
        return obj
    if isinstance(k, tuple):
        return tuple(from_key(e) for e in k)
    return k


def handle(maker: Callable, *key) -> int:
    """The op handle of ``maker(*objects)`` (an entry with ``run`` and ``fake``), made
    once per key; ``key`` holds :func:`constant_key` values of the objects. Called at trace
    time; Dynamo takes the result as a constant."""
    define_ops()
    k = (maker, *key)
    with _LOCK:
        got = _TABLE.get(k)
        if got is None:
            got = _TABLE[k] = len(_ENTRIES)
            _ENTRIES.append(maker(*(from_key(x) for x in key)))
    return got


handle._dynamo_marked_constant = True   # torch.compiler.assume_constant_result(handle)


def entry(h: int):
    """The entry of handle ``h``; a :class:`~neptune_fusion.errors.FeedError` if this
    process has none (a graph traced in another process, e.g. a loaded export)."""
    if not 0 <= h < len(_ENTRIES):
        from ..errors import FeedError
        raise FeedError(f"neptune-fusion op handle {h} is not known in this process: the "
                        "handle names a compiled operator or attention call site traced in "
                        "this process, so a graph or exported program that calls "
                        "neptune_fusion ops runs in the process that traced it")
    return _ENTRIES[h]


def _grad_enabled() -> bool:
    import torch
    return torch.is_grad_enabled()


ENTRY_PREPARED_SIGNATURES = 64   # bound launches kept per compiled operator (then oldest out)


class KernelEntry:
    """A compiled operator (``Kernel``, ``AutoKernel``, ``StagedKernel``,
    ``LibraryKernel``) as an op entry:
    ``run`` is its eager call, ``fake`` allocates its outputs from the input shapes.

    A static graph calls ``run`` with the same input signature every time, so ``run``
    binds the call at a signature's second call, as ``nf.prepare_attention`` does
    (:class:`~.prepared.PreparedLaunch`: fresh outputs per call, the split-k workspace
    allocated per call so the binding holds no device memory, the compiled kernels' own
    launchers): one signature compare per call instead of the general
    path's checks, lookups and argument lists (issue 19: a decode step through the
    backend). Where a binding does not apply -- a multi-pass or library operator,
    tensor subclasses, inputs that require grad, a graph capture in progress, another
    stream than the bound one -- the general path runs (and says what is wrong)."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self._bound: dict = {}   # input signature -> PreparedLaunch, or False (never)
        self._seen: dict = {}    # signatures called once (bound at their second call)
        self.hits = 0            # calls that took a bound launch

    def run(self, tensors) -> list:
        """The eager call (not the kernel's ``__call__``, which would route to the op if
        a trace were running)."""
        from .inputs import signature
        k, tensors = self.kernel, tuple(tensors)
        if hasattr(k, "run"):                         # StagedKernel, LibraryKernel
            return list(k.run(tensors))
        got = self._bound_run(tensors)
        if got is not None:
            return got
        sig = signature(tensors)
        if hasattr(k, "specs"):                       # Kernel
            got = k.call_signed(tensors, sig)
        else:                                         # AutoKernel
            kern, checked = k._kernel_signed(tensors, sig)
            got = kern.call_signed(tensors, sig, checked)
        return list(got) if isinstance(got, (list, tuple)) else [got]

    def _bound_run(self, tensors) -> list | None:
        """The outputs of the bound launch of ``tensors``' signature, binding it at the
        signature's second call (compiled and tuned first, as the general path would; the
        binding may launch once to reach the compiled kernels' launchers); None where
        none applies. A signature's first call takes the general path: a graph compiled
        with dynamic shapes (a decode loop's growing key length) may never repeat one,
        and binding each would cost more than it saves."""
        if not tensors:
            return None
        cuda = tensors[0].is_cuda
        sig, vals = signed(tensors, cuda)
        key = (_grad_enabled(), *sig)   # a binding made under no_grad serves no grad call
        got = self._bound.get(key)
        if got is None:
            if key not in self._seen:
                with _LOCK:
                    remember(self._seen, key, True, ENTRY_PREPARED_SIGNATURES)
                return None
            got = self._bind(tensors, key)
        if got is False:
            return None
        outs = got.launch(vals)
        if outs is None:   # another stream than the bound one
            return None
        self.hits += 1
        return list(outs)

    def _bind(self, tensors, key):
        """A fresh-output, transient :class:`~.prepared.PreparedLaunch` of ``tensors``
        (kept under ``key``), or False: not bindable. Not kept while a CUDA graph is
        being captured (its preparation may launch once): the next call binds."""
        import torch

        from ..errors import NeptuneError
        from .inputs import plain_types, wants_grad
        if any(type(t) not in plain_types() for t in tensors) or wants_grad(tensors):
            return False   # (a module's parameters require grad, also in inference)
        if tensors[0].is_cuda and torch.cuda.is_current_stream_capturing():
            return False
        k = self.kernel
        try:
            kern = k.kernel_for(*tensors) if hasattr(k, "kernel_for") else k
            launch = PreparedLaunch(kern, tensors, fresh=True, transient=True)
        except NeptuneError:
            launch = False
        if launch is not False and launch.returns != len(kern.outputs):
            launch = False   # outputs not all written by the last launch: general path
        with _LOCK:
            remember(self._bound, key, launch, ENTRY_PREPARED_SIGNATURES)
        return launch

    def fake(self, tensors) -> list:
        """The outputs' fake tensors, sized from the inputs' shapes. Static shapes are
        checked as a call checks them; dynamic ones (``SymInt`` s of a graph compiled
        with dynamic shapes) are read without a check that would guard on them, so the
        graph stays general over their values."""
        import torch

        from ..ir.nodes import Size
        from .inputs import check_inputs
        k = self.kernel
        name = getattr(k, "name", None) or k.specs[0].name
        if all(isinstance(n, int) for t in tensors for n in t.shape):
            sizes, device = check_inputs(name, k.inputs, tensors)
            named = {s.name: v for s, v in sizes.items()}
        else:
            named, device = _dynamic_sizes(name, k.inputs, tensors), tensors[0].device
        return [torch.empty(tuple(named[x.name] if isinstance(x, Size) else int(x)
                                  for x in o.shape),
                            dtype=getattr(torch, o.dtype.name), device=device)
                for o in k.outputs]


class DifferentiableEntry(KernelEntry):
    """A :class:`~.differentiable.DifferentiableKernel` as an op entry: ``run`` and
    ``fake`` are its kernel's; ``backward`` gives one gradient per float input, zeros
    where no output depends on it (an op's list holds tensors only)."""

    def __init__(self, dk) -> None:
        super().__init__(dk.kernel)
        self.dk = dk

    def backward(self, tensors, d_outs) -> list:
        import torch
        floats = [t.dtype.is_floating_point for t in tensors]
        got = self.dk.grads(tensors, d_outs, floats)
        return [torch.zeros_like(t) if g is None else g
                for t, g, f in zip(tensors, got, floats) if f]


def _dynamic_sizes(name: str, inputs, tensors) -> dict:
    """Size name -> the (symbolic) extent that binds it, checking counts, ranks and dtypes
    only: comparing a ``SymInt`` with an int would specialise it."""
    from ..errors import FeedError
    from ..ir.nodes import Size
    if len(tensors) != len(inputs):
        raise FeedError(f"kernel {name} takes {len(inputs)} tensor(s), got {len(tensors)}")
    named: dict = {}
    for p, t in zip(inputs, tensors):
        got = str(t.dtype).removeprefix("torch.")
        if t.dim() != p.ndim or got != p.dtype.name:
            raise FeedError(f"kernel {name}: input {p.name!r} must be {p.dtype} with "
                            f"{p.ndim} dimension(s), got {got} {tuple(t.shape)}")
        for want, n in zip(p.shape, t.shape):
            if isinstance(want, Size):
                named.setdefault(want.name, n)
    return named


def _run_fused(inputs, handle) -> list:
    """The ``fused`` op's call. An input without unit-stride rows fails the kernel's
    check (its signature, strides included, matches no bound launch), and is then
    copied (:func:`unit_rows`) and the call made again: the common call pays nothing for
    that (:func:`unit_rows` on every call cost about 6 us for five inputs on the CPU)."""
    from ..errors import FeedError
    e = entry(handle)
    try:
        return e.run(inputs)
    except FeedError:
        fixed = unit_rows(inputs)
        if all(a is b for a, b in zip(fixed, inputs)):
            raise
        return e.run(fixed)


def unit_rows(tensors: list) -> list:
    """``tensors`` with unit stride in their last dimension, copying those without: the
    ``fused`` op's inputs. The rewrite copies a strided input in the graph
    (:mod:`neptune_fusion.dynamo.rewrite`), but Inductor constrains no element of a
    ``Tensor[]`` argument to its traced layout: on the H200 it passed
    ``nn.MultiheadAttention``'s head split as a view with strides (64, 1, 4096)
    (2026-12-04). A copy here costs one pass over that input; a refusal failed the
    compile."""
    return [t.contiguous() if _strided_rows(t) else t for t in tensors]


def _strided_rows(t) -> bool:
    """Whether ``t``'s last dimension has a stride other than 1 (a symbolic extent or
    stride, in a fake tensor of a dynamic graph, is not compared: that would guard)."""
    if t.dim() == 0:
        return False
    n, stride = t.shape[-1], t.stride(-1)
    return isinstance(n, int) and isinstance(stride, int) and n > 1 and stride != 1


def call_differentiable(dk, tensors: tuple) -> list:
    """``dk(*tensors)`` (a :class:`~.differentiable.DifferentiableKernel` whose inputs
    require grad) as the ``neptune_fusion::kernel_grad`` op (traced code)."""
    import torch
    h = handle(DifferentiableEntry, constant_key(dk))   # first: it defines the ops
    return torch.ops.neptune_fusion.kernel_grad(list(tensors), h)


def call_kernel(kernel, tensors: tuple, single: bool, out=None):
    """``kernel(*tensors, out=out)`` as the ``neptune_fusion::kernel`` op (traced code)."""
    import torch

    from .inputs import check_no_grad
    # the op has no derivative: refused by name, as an eager call is (else torch says
    # "no autograd formula was registered" at the backward's trace)
    check_no_grad(tensors, [p.name for p in getattr(kernel, "inputs", ())] or None)
    h = handle(KernelEntry, constant_key(kernel))   # first: it defines the ops
    got = torch.ops.neptune_fusion.kernel(list(tensors), h)
    if out is not None:   # the op returns new tensors; ``out`` gets a copy
        got = [g if o is None else o.copy_(g) for o, g in zip(out, got)]
    return got[0] if single else got


def _entry_op(torch, name: str):
    """The custom op ``name(Tensor[] inputs, int handle) -> Tensor[]``: its entry's
    ``run``, faked by the entry's ``fake`` (the schema spelled out: this module's
    annotations are strings, ``__future__``)."""
    @torch.library.custom_op(name, mutates_args=(),
                             schema="(Tensor[] inputs, int handle) -> Tensor[]")
    def op(inputs, handle):
        return entry(handle).run(inputs)

    @op.register_fake
    def _(inputs, handle):
        return entry(handle).fake(inputs)
    return op


def define_ops() -> None:
    """Define the ops (once per process; imports torch)."""
    if _DEFINED:
        return
    with _LOCK:
        if _DEFINED:
            return
        import torch

        kernel_op = _entry_op(torch, "neptune_fusion::kernel")

        # the same call for graphs the jit backend rewrote (dynamo/rewrite.py), defined
        # through the dispatcher's own registration: no Python autograd or aliasing
        # wrapper per call (custom_op's: about 9 us of a 13 us op call on the CPU).
        # Only a forward or inference graph AOTAutograd has already derived calls it, so
        # nothing differentiates through it; a call with inputs that require grad in grad
        # mode is refused by the eager path's check, as any kernel call is.
        lib = torch.library.Library("neptune_fusion", "FRAGMENT")
        # no layout tag: the backend gives Inductor the op's layout constraint
        # (dynamo/inductor.unit_rows: unit-stride rows), which a tag would override
        lib.define("fused(Tensor[] inputs, int handle) -> Tensor[]")
        lib.impl("fused", _run_fused, "CompositeExplicitAutograd")
        torch.library.register_fake(
            "neptune_fusion::fused",
            lambda inputs, handle: entry(handle).fake(unit_rows(inputs)), lib=lib)

        # attention where no gradient is wanted (inference, a decode step), defined as
        # ``fused`` is: the custom op's Python autograd wrapper cost about 13 of a 27 us
        # op call on the CPU with the launches stubbed (benchmarks/host_python.py)
        lib.define("attention_infer(Tensor q, Tensor k, Tensor v, Tensor[] buffers, "
                   "int handle) -> Tensor")
        lib.impl("attention_infer",
                 lambda q, k, v, buffers, handle: entry(handle).run([q, k, v, *buffers])[0],
                 "CompositeExplicitAutograd")
        torch.library.register_fake(
            "neptune_fusion::attention_infer",
            lambda q, k, v, buffers, handle: entry(handle).fake([q, k, v, *buffers])[0],
            lib=lib)
        # the same with the rows' log-sum-exp (return_lse=True, sinks=) where no gradient
        # is wanted: a compiled decode step with sinks pays no autograd wrapper either
        lib.define("attention_infer_lse(Tensor q, Tensor k, Tensor v, Tensor[] buffers, "
                   "int handle) -> (Tensor, Tensor)")
        lib.impl("attention_infer_lse",
                 lambda q, k, v, buffers, handle: tuple(
                     entry(handle).run_lse([q, k, v, *buffers])),
                 "CompositeExplicitAutograd")
        torch.library.register_fake(
            "neptune_fusion::attention_infer_lse",
            lambda q, k, v, buffers, handle: tuple(
                entry(handle).fake([q, k, v, *buffers], lse=True)),
            lib=lib)

        # attention where a gradient is wanted: the output and its rows' log-sum-exp
        # (float32), which the backward reads with the output, so nothing is recomputed
        @torch.library.custom_op(
            "neptune_fusion::attention", mutates_args=(),
            schema="(Tensor q, Tensor k, Tensor v, Tensor[] buffers, int handle) -> "
                   "(Tensor, Tensor)")
        def attention_op(q, k, v, buffers, handle):
            o, lse = entry(handle).run_lse([q, k, v, *buffers])
            return o, lse

        @attention_op.register_fake
        def _(q, k, v, buffers, handle):
            o, lse = entry(handle).fake([q, k, v, *buffers], lse=True)
            return o, lse

        # the backward as an op too, so a compiled training step traces it (fake: the
        # gradients' shapes) and runs the derived backward kernels (docs/autodiff.md)
        @torch.library.custom_op(
            "neptune_fusion::attention_backward", mutates_args=(),
            schema="(Tensor q, Tensor k, Tensor v, Tensor[] buffers, Tensor out, "
                   "Tensor lse, Tensor? grad, Tensor? grad_lse, int handle) -> Tensor[]")
        def attention_backward_op(q, k, v, buffers, out, lse, grad, grad_lse, handle):
            return entry(handle).backward([q, k, v, *buffers], out, lse, grad, grad_lse)

        @attention_backward_op.register_fake
        def _(q, k, v, buffers, out, lse, grad, grad_lse, handle):
            return [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)]

        def setup_context(ctx, inputs, output):
            q, k, v, buffers, handle = inputs
            ctx.save_for_backward(q, k, v, *output, *buffers)
            ctx.handle, ctx.buffers = handle, len(buffers)
            ctx.set_materialize_grads(False)   # an unused output's cotangent stays None

        def backward(ctx, grad, grad_lse):
            q, k, v, out, lse, *buffers = ctx.saved_tensors
            if grad is None and grad_lse is None:
                return None, None, None, [None] * ctx.buffers, None
            dq, dk, dv = torch.ops.neptune_fusion.attention_backward(
                q, k, v, buffers, out, lse, grad, grad_lse, ctx.handle)
            return dq, dk, dv, [None] * ctx.buffers, None

        attention_op.register_autograd(backward, setup_context=setup_context)

        # a differentiable compiled chain (nf.compile(..., differentiable=True)) where an
        # input requires grad: the kernel, and its derived gradient kernels as the backward
        kernel_grad_op = _entry_op(torch, "neptune_fusion::kernel_grad")

        @torch.library.custom_op(
            "neptune_fusion::kernel_backward", mutates_args=(),
            schema="(Tensor[] inputs, Tensor[] grads, int handle) -> Tensor[]")
        def kernel_backward_op(inputs, grads, handle):
            return entry(handle).backward(inputs, grads)

        @kernel_backward_op.register_fake
        def _(inputs, grads, handle):
            return [torch.empty_like(t) for t in inputs if t.dtype.is_floating_point]

        def kernel_setup_context(ctx, inputs, output):
            tensors, handle = inputs
            ctx.save_for_backward(*tensors)
            ctx.handle = handle

        def kernel_backward(ctx, grads):
            tensors = ctx.saved_tensors
            got = iter(torch.ops.neptune_fusion.kernel_backward(list(tensors), list(grads),
                                                                 ctx.handle))
            # one gradient per float input, in order; integer inputs get none
            return [next(got) if t.dtype.is_floating_point else None
                    for t in tensors], None

        kernel_grad_op.register_autograd(kernel_backward, setup_context=kernel_setup_context)
        _DEFINED.extend([kernel_op, attention_op, attention_backward_op, kernel_grad_op,
                         kernel_backward_op, lib])
