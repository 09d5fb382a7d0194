"""``nf.compile(..., differentiable=True)``: a compiled chain under ``torch.autograd``.

The forward is the compiled kernel; the backward is derived from the chain's plain
definition by reverse mode (:func:`~neptune_fusion.autodiff.reverse.gradients`: one
gradient program per input, seeded by the outputs' cotangents) and each gradient is
compiled by :func:`~.pipeline.compile` on first use, whatever plan it gets. Saved for the
backward: the inputs only (the gradient programs recompute what they read). A gradient
that cannot be derived or compiled raises its :class:`~neptune_fusion.errors.NeptuneError`
at backward time. Integer inputs get no gradient. Traced by torch.compile, the call is
the ``neptune_fusion::kernel_grad`` op, whose registered backward runs the same gradient
kernels (runtime/torch_ops.py).
"""

from __future__ import annotations

import functools
import threading

from ..ir.nodes import Placeholder, fresh_uid


class DifferentiableKernel:
    """A compiled kernel whose outputs have a ``grad_fn`` when an input requires grad
    (grad mode on); otherwise the kernel itself runs. Call it like the kernel."""

    def __init__(self, kernel, compile_fn, store) -> None:
        self.kernel = kernel
        self.outputs, self.inputs = kernel.outputs, kernel.inputs
        self.name = kernel.name
        self._compile, self._store = compile_fn, store
        self._backward = None
        self._lock = threading.Lock()
        from .torch_ops import referable
        referable(self)   # traced code names it, not its kernel (which __getattr__ gives)

    def __getattr__(self, name):   # plan, schedule_for, kernels...: the kernel's
        return getattr(self.kernel, name)

    def __repr__(self) -> str:
        return f"<differentiable {self.kernel!r}>"

    def __call__(self, *tensors, out=None):
        import torch
        if out is not None or not torch.is_grad_enabled() or not any(
                isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
            return self.kernel(*tensors, out=out)
        from . import torch_ops
        if torch_ops.compiling():   # one op with a registered backward
            got = torch_ops.call_differentiable(self, tensors)
        else:
            got = _function().apply(self, *tensors)
        return got[0] if self.kernel._single else list(got)

    def grads(self, tensors, d_outs, needed) -> list:
        """The gradient of each input (None where ``needed[i]`` is false, the input is
        not a float or no output depends on it) for the outputs' cotangents ``d_outs``
        (zeros for an output not used downstream)."""
        import torch
        seeds, kernels = self.backward_kernels()
        d_outs = [d.to(getattr(torch, s.dtype.name)).contiguous()
                  for d, s in zip(d_outs, seeds)]
        grads: list = [None] * len(tensors)
        for k, kern in kernels:
            if needed[k]:
                got = kern(*tensors, *d_outs)
                grads[k] = got[0] if isinstance(got, (list, tuple)) else got
        return grads

    def backward_kernels(self):
        """``(seeds, [(input index, compiled gradient)])``, derived and compiled once."""
        with self._lock:
            if self._backward is None:
                from ..autodiff.reverse import gradients
                seeds = [Placeholder("d_" + o.name, o.shape, o.dtype, fresh_uid())
                         for o in self.outputs]
                wrt = [p for p in self.inputs if p.dtype.is_float]
                grads = gradients(list(self.outputs), seeds, wrt)
                ins = list(self.inputs) + seeds
                self._backward = (seeds, [
                    (self.inputs.index(p), self._compile(g, ins, name=f"{self.name}_{g.name}",
                                                         cache=self._store))
                    for p, g in zip(wrt, grads) if g is not None])
            return self._backward


@functools.cache
def _function():
    """The Function class, made once on first use (torch is imported lazily)."""
    import torch

    class KernelFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, dk: DifferentiableKernel, *tensors):
            ctx.dk = dk
            ctx.save_for_backward(*tensors)
            with torch.no_grad():
                got = dk.kernel(*tensors)
            return tuple(got) if isinstance(got, (list, tuple)) else (got,)

        @staticmethod
        def backward(ctx, *d_outs):
            # an output not used downstream comes as zeros (materialised grads)
            return (None, *ctx.dk.grads(ctx.saved_tensors, d_outs,
                                        ctx.needs_input_grad[1:]))

    return KernelFunction
