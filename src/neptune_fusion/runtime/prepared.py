"""A prepared launch: one compiled kernel's launches for one input signature, bound once.

An eager call (:meth:`Kernel.__call__`) finds its call setup by the inputs' signature,
allocates its outputs and split-k workspace and builds each launch's argument list: about
50-110 us of host time for a two-kernel decode on the H200 host, where cuDNN's whole call
takes 28. A :class:`PreparedLaunch` does all of that once: the outputs and one workspace
buffer are allocated, every argument but the input tensors is resolved, and each launch
holds the compiled kernel's own launcher. A call compares the inputs' signature (shapes,
strides, dtypes, devices, 16-byte alignment) with the prepared one and launches; it
allocates nothing and checks nothing else, and returns the same output tensors every time
(the next call overwrites them, as a CUDA graph's outputs are).

On CUDA it needs the direct launch path: tensors 16-byte aligned, each launcher holding its
compiled kernel (the preparation launches once to get it). CPU tensors launch the same
bound arguments through the interpreter (a test of the binding, not a fast path).
Anything else is refused when preparing, with the reason; a call whose inputs differ from
the prepared signature returns ``None`` and the caller takes the general path.
"""

from __future__ import annotations

from ..errors import FeedError
from .launcher import Address, aligned


def cheap_signature(tensors) -> tuple:
    """What a prepared launch must see unchanged: per tensor its type, shape, strides,
    dtype, device index, whether its address is 16-byte aligned and whether it requires
    grad (cheaper than :func:`~.inputs.signature`: no ``torch.device`` objects)."""
    return tuple((type(t), t.shape, t.stride(), t.dtype, t.get_device(),
                  t.data_ptr() % 16 == 0, t.requires_grad) for t in tensors)


class PreparedLaunch:
    """``kernel``'s launches for the signature of ``tensors``, bound (see the module)."""

    __slots__ = ("signature", "device", "outputs", "_workspace", "_launches")

    def __init__(self, kernel, tensors, given=None) -> None:
        """``tensors``: the kernel's inputs; ``given``: what callers will pass in their
        place (views of the same memory, e.g. a query before its GQA reshape), default
        ``tensors``: the signature is theirs."""
        import torch

        from .inputs import signature
        from .kernel import _VISITS
        tensors = tuple(tensors)
        if not all(type(t) is torch.Tensor for t in tensors):
            raise FeedError("a prepared call needs plain torch tensors (not a subclass)")
        cuda = tensors[0].is_cuda
        if cuda and not aligned(tensors):
            raise FeedError("a prepared call needs every tensor 16-byte aligned (a view at "
                            "an odd offset: pass .clone() or call the operator itself)")
        setup = kernel._setup(tensors, signature(tensors))
        kernel._run(setup, tensors)   # every launcher has launched once: it is direct now
        self.signature = cheap_signature(tensors if given is None else given)
        self.device = setup.device
        scratch = sum(s.scratch_bytes for s in setup.steps) if cuda else 0
        self._workspace = torch.empty(scratch, dtype=torch.uint8, device=self.device)
        by_tensor: dict = {_VISITS: None}   # as Kernel._launch_one has it, not counting
        base = self._workspace.data_ptr()
        launches = []
        for k, step in enumerate(setup.steps):
            if cuda and step.scratch_bytes:   # the workspace: one buffer (launcher.py)
                outs = [Address(base + off) for off in step.scratch]
                base += step.scratch_bytes
            else:
                outs = [torch.empty(shape, dtype=dt, device=self.device)
                        for shape, dt in step.outputs]
            by_tensor.update(zip(step.output_keys, outs))
            if step.fn is None:   # an empty grid: nothing to launch
                continue
            if kernel.specs[k].count_visits:
                raise FeedError("a prepared call does not count visits (count_visits=True)")
            launches.append((_runner(step),) + _bind(step, setup, by_tensor))
        self.outputs = outs
        self._launches = tuple(launches)

    def __call__(self, tensors) -> list | None:
        """Launch on ``tensors``; their outputs, or None when the signature differs."""
        if cheap_signature(tensors) != self.signature:
            return None
        for runner, template, slots in self._launches:
            args = template.copy()   # a copy per call: threads may share a prepared launch
            for pos, k in slots:
                args[pos] = tensors[k]
            runner(*args)
        return self.outputs


def _runner(step):
    """How ``step`` launches: the compiled kernel's own launcher (CUDA), or the Triton
    interpreter (CPU tensors: the same bound arguments, so CPU tests check the binding)."""
    if step.interpret:
        from .loader import interpreted_launch

        def interpreted(*args):
            with interpreted_launch():
                step.fn[step.grid](*args, **step.opts)
        return interpreted
    runner = step.launcher.direct if step.launcher is not None else None
    if runner is None:
        raise FeedError("a prepared call needs the direct launch path (this Triton has no "
                        "compiled-kernel launcher, or NEPTUNE_FUSION_DIRECT_LAUNCH=0)")
    return runner


def _bind(step, setup, by_tensor: dict) -> tuple[list, tuple]:
    """``step``'s argument list with everything but the inputs filled in, and the
    (position, input index) of each input."""
    from .kernel import _SIZE, _TENSOR
    args, slots = [], []
    for tag, v in step.args:
        if tag == _TENSOR and v in setup.keys:
            slots.append((len(args), setup.keys.index(v)))
            args.append(None)
        elif tag == _TENSOR:
            args.append(by_tensor[v])
        else:
            args.append(setup.sizes[v] if tag == _SIZE else v)
    return args, tuple(slots)
