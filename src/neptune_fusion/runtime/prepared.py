"""A prepared launch: one compiled kernel's launches for one input signature, bound once.

An eager call (:meth:`Kernel.__call__`) finds its call setup by the inputs' signature,
allocates its outputs and split-k workspace and builds each launch's argument list: about
50-110 us of host time for a two-kernel decode on the H200 host, where cuDNN's whole call
takes 28. A :class:`PreparedLaunch` does all of that once: the workspace is one buffer
allocated once, every argument but the input tensors' addresses is resolved (the
workspace's and the outputs' addresses included), and each launch is bound to the compiled
kernel's own C launch function (:func:`~.launcher.direct_runner`). A call compares the
inputs' signature (:func:`signed`: shapes, strides, dtypes, devices, 16-byte alignment,
requires-grad) with the prepared one, looks up the current stream once and launches with
the inputs' addresses as plain integers; it checks nothing else.

Outputs: by default allocated once and returned by every call, overwritten by the next (as
a CUDA graph's are); with ``fresh=True`` the last kernel's outputs are allocated per call
(one ``torch.empty`` each: what an eager call that must not alias its earlier results
needs), and a call on another stream than the one bound returns ``None`` (the workspace
is reused in stream order, so only one stream may use it). With ``transient=True`` the
split-k workspace is allocated per call as well (one more ``torch.empty``), so the
binding holds no device memory: what a call inside a compiled graph needs, where
``mode="reduce-overhead"``'s CUDA-graph trees require every allocation made in their
memory pool to be an output (a workspace kept by the binding failed their check on the
H200, 2026-12-01).

On CUDA it needs the direct launch path: tensors 16-byte aligned, each launcher holding its
compiled kernel (the preparation launches once to get it, unless an earlier call did).
CPU tensors launch the same bound arguments through the interpreter (a test of the
binding, not a fast path). Anything else is refused when preparing, with the reason; a
call whose inputs differ from the prepared signature returns ``None`` and the caller
takes the general path.
"""

from __future__ import annotations

from ..errors import FeedError
from .descriptors import address_maker, bind_context
from .inputs import plain_types
from .launcher import ARG_SIZE, ARG_TENSOR, VISITS, aligned, stream_getter


def signed(tensors, cuda: bool) -> tuple[list, list]:
    """``(signature, values)`` of ``tensors``: what a prepared launch must see unchanged
    -- per tensor its type, shape, strides, dtype, device index, whether its address is
    16-byte aligned and whether it requires grad (cheaper than :func:`~.inputs.signature`:
    no ``torch.device`` objects for CUDA tensors) -- and what a launch takes for each: its
    address (``cuda``) or the tensor itself (the interpreter). A tensor off CUDA has
    device index -1 whatever its device, so its device type stands in: a meta ``kv_lens``
    (or ``q``) once matched a CPU binding and reached the launch (a raw torch error)."""
    sig, vals = [], []
    for t in tensors:
        p = t.data_ptr()
        vals.append(p if cuda else t)
        dev = t.get_device()
        sig.append((type(t), t.shape, t.stride(), t.dtype,
                    dev if dev >= 0 else t.device.type, p & 15 == 0, t.requires_grad))
    return sig, vals


def cheap_signature(tensors) -> tuple:
    """The signature part of :func:`signed`, as a tuple (a key)."""
    return tuple(signed(tensors, False)[0])


class PreparedLaunch:
    """``kernel``'s launches for the signature of ``tensors``, bound (see the module)."""

    __slots__ = ("signature", "device", "outputs", "cuda", "stream", "kernel", "_workspace",
                 "_launches", "_fresh", "_index", "_bound_stream", "_get_device", "_scratch")

    def __init__(self, kernel, tensors, given=None, fresh: bool = False,
                 transient: bool = False) -> None:
        """``tensors``: the kernel's inputs; ``given``: what callers will pass in their
        place (views of the same memory, e.g. a query before its GQA reshape), default
        ``tensors``: the signature is theirs. ``fresh``: new last outputs per call;
        ``transient`` (with ``fresh``): the workspace too."""
        import torch

        from .inputs import signature
        if not hasattr(kernel, "specs"):   # a Kernel (not importing kernel.py: it imports us)
            raise FeedError(f"a prepared call needs a kernel of one set of launches, not a "
                            f"{type(kernel).__name__} (several passes)")
        tensors = tuple(tensors)
        if kernel.fallback is not None and not kernel.takes(tensors):
            kernel = kernel.fallback   # a Gluon kernel's Triton twin (runtime/auto.py)
        self.kernel = kernel           # the kernel whose launches these are
        if not all(type(t) in plain_types() for t in tensors):
            raise FeedError("a prepared call needs plain torch tensors or parameters (not "
                            "another subclass)")
        cuda = self.cuda = tensors[0].is_cuda
        if cuda and not aligned(tensors):
            raise FeedError("a prepared call needs every tensor 16-byte aligned (a view at "
                            "an odd offset: pass .clone() or call the operator itself)")
        if any(kernel.specs[k].count_visits for k in range(len(kernel.specs))):
            raise FeedError("a prepared call does not count visits (count_visits=True)")
        setup = kernel._setup(tensors, signature(tensors))
        if cuda and any(s.fn is not None and (s.launcher is None or s.launcher.direct is None)
                        for s in setup.steps):
            kernel._run(setup, tensors)   # every launcher launches once: direct from now
        self.signature = signed(tensors if given is None else given, cuda)[0]
        self.device = setup.device
        self._index = self.device.index if cuda else None
        self.stream = stream_getter(self._index) if cuda else None
        self._bound_stream = self.stream() if cuda and fresh else None
        # the current device, as torch.cuda.current_device reads it (initialised by now)
        self._get_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device) \
            if cuda else None
        scratch = sum(s.scratch_bytes for s in setup.steps) if cuda else 0
        transient = transient and fresh
        # every buffer the bound arguments address (kept alive: they hold addresses)
        self._workspace = [] if transient else \
            [torch.empty(scratch, dtype=torch.uint8, device=self.device)]
        by_tensor: dict = {VISITS: None}   # as Kernel._launch_one has it, not counting
        base = 0 if transient else self._workspace[0].data_ptr()
        last = len(setup.steps) - 1
        launches, outs, n_in = [], [], len(tensors)
        self._fresh = None
        offsets: list[int] = []   # transient: the workspace tensors' offsets, per call
        for k, step in enumerate(setup.steps):
            if cuda and step.scratch_bytes and transient:   # values n_in, n_in + 1, ...
                outs = [_Fresh(n_in + len(offsets) + i) for i in range(len(step.scratch))]
                offsets += [base + off for off in step.scratch]
                base += step.scratch_bytes
            elif cuda and step.scratch_bytes:   # the workspace: one buffer (launcher.py)
                outs = [base + off for off in step.scratch]
                base += step.scratch_bytes
            elif fresh and k == last:          # filled per call: after the workspace's
                self._fresh = step.outputs
                outs = [_Fresh(n_in + len(offsets) + i) for i in range(len(step.outputs))]
            else:
                outs = [torch.empty(shape, dtype=dt, device=self.device)
                        for shape, dt in step.outputs]
                self._workspace += outs
            by_tensor.update(zip(step.output_keys, outs))
            if step.fn is None:   # an empty grid: nothing to launch
                continue
            launches.append((_runner(step),) + _bind(step, setup, by_tensor, cuda)
                            + (_descriptors(step, setup, tensors, cuda),))
        self.outputs = None if fresh else outs
        self._launches = tuple(launches)
        self._scratch = (scratch, tuple(offsets)) if transient and offsets else None

    @property
    def returns(self) -> int:
        """How many tensors a call returns (the last launch's outputs)."""
        return len(self._fresh if self._fresh is not None else self.outputs)

    def __call__(self, tensors) -> list | None:
        """Launch on ``tensors``; their outputs, or None when the signature differs."""
        sig, vals = signed(tensors, self.cuda)
        if sig != self.signature:
            return None
        return self.launch(vals)

    def launch(self, vals: list) -> list | None:
        """Launch on input ``vals`` (:func:`signed`'s, of a matching signature); the
        outputs, or None (``fresh``) when the current stream is not the bound one."""
        import torch
        outs = self.outputs
        if self.cuda:
            if self._get_device() != self._index:   # Triton launches on the current device
                with torch.cuda.device(self._index):
                    return self.launch(vals)
            stream = self.stream()
            if self._fresh is not None:
                if stream != self._bound_stream:
                    return None
                if self._scratch is not None:
                    size, offsets = self._scratch
                    ws = torch.empty(size, dtype=torch.uint8, device=self.device)
                    vals = vals + [ws.data_ptr() + off for off in offsets]
                outs = [torch.empty(shape, dtype=dt, device=self.device)
                        for shape, dt in self._fresh]
                vals = vals + [o.data_ptr() for o in outs]
            for run, template, slots, descs in self._launches:
                args = template.copy()   # a copy per call: threads may share a launch
                for pos, k in slots:
                    args[pos] = vals[k]
                if descs:   # a Gluon kernel's, over an input
                    bind_context(self.device)
                    for pos, k, make in descs:
                        args[pos] = make(vals[k])
                run(args, stream)
            return outs
        if self._fresh is not None:
            outs = [torch.empty(shape, dtype=dt, device=self.device)
                    for shape, dt in self._fresh]
            vals = vals + outs
        for run, template, slots, descs in self._launches:
            args = template.copy()
            for pos, k in slots:
                args[pos] = vals[k]
            for pos, k, make in descs:
                args[pos] = make(vals[k])
            run(args, None)
        return outs


class _Fresh:
    """A per-call output in a bound argument list: value ``index`` of the call's."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _runner(step):
    """How ``step`` launches, as ``run(args, stream)``: the compiled kernel's bound launch
    (CUDA), or the Triton interpreter (CPU tensors: the same bound arguments, so CPU tests
    check the binding)."""
    if step.interpret:
        from .loader import interpreted_launch

        def interpreted(args, stream):
            with interpreted_launch():
                step.fn[step.grid](*args, **step.opts)
        return interpreted
    runner = step.launcher.direct if step.launcher is not None else None
    if runner is None:
        raise FeedError("a prepared call needs the direct launch path (this Triton has no "
                        "compiled-kernel launcher, or NEPTUNE_FUSION_DIRECT_LAUNCH=0)")
    return runner


def _descriptors(step, setup, tensors, cuda: bool) -> tuple:
    """``(position, input index, make(value))`` of each host-side TMA descriptor of
    ``step`` (a Gluon kernel's, runtime/descriptors.py: always over an input), made per
    call from the input's address (CUDA) or the tensor."""
    out = []
    for pos, key, make in step.descs:
        if key in setup.keys:
            k = setup.keys.index(key)
            out.append((pos, k, address_maker(make, tensors[k]) if cuda else make))
        else:
            raise FeedError(f"a prepared call cannot bind a descriptor over {key}, which "
                            "is not an input")
    return tuple(out)


def _bind(step, setup, by_tensor: dict, cuda: bool) -> tuple[list, tuple]:
    """``step``'s argument list with everything but the inputs (and per-call outputs)
    filled in -- on CUDA tensors as their addresses --, and the (position, value index)
    of each input and per-call output."""
    args, slots = [], []
    for tag, v in step.args:
        if tag == ARG_TENSOR and v in setup.keys:
            slots.append((len(args), setup.keys.index(v)))
            args.append(None)
        elif tag == ARG_TENSOR:
            t = by_tensor[v]
            if type(t) is _Fresh:
                slots.append((len(args), t.index))
                t = None
            elif cuda and t is not None and not isinstance(t, int):
                t = t.data_ptr()
            args.append(t)
        else:
            args.append(setup.sizes[v] if tag == ARG_SIZE else v)
    return args, tuple(slots)
