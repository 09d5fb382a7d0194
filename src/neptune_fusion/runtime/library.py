"""``LibraryKernel``: a contraction run as ``torch.matmul``, its operands made by our kernels.

The schedule ``strategy="library"`` of a program whose output has a library form
(:func:`~neptune_fusion.fusion.library.library_form`): each operand that is computed
(RMSNorm's normalised rows) is compiled as its own program (``schedule="auto"``, the
base schedule's speed rules) and launched first; then ``torch.matmul`` of the two
operands, viewed as (batch..., i, c) and (batch..., c, o) -- no copy where the strides
allow -- writes the output. A float32 product follows the schedule's ``fp32_precision``
(``"tf32"`` lets cuBLAS use TF32 tensor cores for this call only).
"""

from __future__ import annotations

from contextlib import contextmanager

from ..fusion.library import LibraryForm
from ..ir.graph import placeholders
from ..schedule.schedule import Schedule
from .inputs import CacheInfo, check_inputs, remember, signature
from .kernel import LaunchResult
from .torch_ops import call_kernel, compiling, referable

_MAX_SIGS = 256


class LibraryKernel:
    """A compiled operator: operand kernels, then ``torch.matmul`` (module docstring)."""

    def __init__(self, form: LibraryForm, inputs, schedule: Schedule, single: bool,
                 name: str, compile_operand) -> None:
        referable(self)   # traced code names it by number (torch_ops.constant_key)
        self.form = form
        self.outputs = (form.output,)
        self.inputs = tuple(inputs)
        self.schedule = schedule
        self.name = name
        self._single = single
        pos = {id(p): k for k, p in enumerate(self.inputs)}
        computed = form.computed
        # one compiled kernel per computed operand, fed from the call's tensors
        self.operand_kernels = tuple(
            compile_operand(c, list(placeholders([c])), f"{name}_{c.name}")
            for c in computed)
        self._operand_feeds = tuple(tuple(pos[id(p)] for p in k.inputs)
                                    for k in self.operand_kernels)
        # each matmul operand: ("in", position) or ("mid", operand kernel)
        self._feeds = tuple(("mid", computed.index(t)) if t in computed
                            else ("in", pos[id(t)]) for t in form.operands)
        self._checked: dict = {}
        self._hits = self._misses = 0

    def __repr__(self) -> str:
        ins = ", ".join(p.name for p in self.inputs)
        return (f"<LibraryKernel {self.name}({ins}) -> {self.form.output.name}; "
                f"{len(self.operand_kernels)} operand kernel(s), then torch.matmul>")

    @property
    def plan(self) -> str:
        """What runs: each computed operand's fusion plan, then the library product."""
        parts = [f"{k.outputs[0].name}: {k.plan}" for k in self.operand_kernels]
        names = ", ".join(t.name for t in self.form.operands)
        parts.append(f"{self.form.output.name} = torch.matmul({names}) (strategy "
                     "'library': the product in the vendor library)")
        return "\n".join(parts)

    @property
    def kernels(self) -> list:
        """The generated kernels launched per call (the operands'; the product is
        cuBLAS's)."""
        out = []
        for k in self.operand_kernels:
            out.extend(k.kernels if hasattr(k, "specs") else
                       [g for kk in k.kernels() for g in kk.kernels])
        return out

    @property
    def source(self) -> str:
        parts = [getattr(k, "source", None) or "\n\n".join(kk.source for kk in k.kernels())
                 for k in self.operand_kernels]
        parts.append(f"# then {self.form.output.name} = torch.matmul(...) "
                     "(the vendor library)")
        return "\n\n".join(parts)

    def cache_info(self) -> CacheInfo:
        return CacheInfo(self._hits, self._misses, _MAX_SIGS, len(self._checked))

    def __call__(self, *tensors, out=None):
        if compiling():  # traced by torch.compile / torch.export: one op (torch_ops.py)
            return call_kernel(self, tensors, self._single, out)
        return self.call_signed(tensors, signature(tensors), out=out)

    def call_signed(self, tensors: tuple, sig: tuple | None, checked=None, out=None):
        got = self._run(tensors, sig, checked, out)
        return got if self._single else [got]

    def run(self, tensors) -> list:
        """The eager call; the outputs as a list."""
        return [self._run(tuple(tensors), signature(tensors))]

    def launch(self, *tensors) -> LaunchResult:
        return LaunchResult([self._run(tensors, signature(tensors))], (), None)

    def _run(self, tensors, sig, checked=None, out=None):
        import torch
        if sig is None or sig not in self._checked:
            self._misses += 1
            if checked is None:
                check_inputs(self.name, self.inputs, tensors)
            if sig is not None:
                remember(self._checked, sig, True, _MAX_SIGS)
        else:
            self._hits += 1
        made = [k(*(tensors[p] for p in feeds))
                for k, feeds in zip(self.operand_kernels, self._operand_feeds)]
        a, b = (tensors[f[1]] if f[0] == "in" else made[f[1]] for f in self._feeds)
        a, b = _view(a, self.form.a_dims), _view(b, self.form.b_dims)
        perm = self.form.out_perm
        identity = perm == tuple(range(len(perm)))
        target = None if out is None else out[0]
        with _precision(a, self.schedule.fp32_precision):
            if target is not None and identity:
                return torch.matmul(a, b, out=target)
            res = torch.matmul(a, b)
        if not identity:
            res = res.permute(perm)
        if target is not None:
            return target.copy_(res)
        return res if identity else res.contiguous()


def _view(t, dims):
    """``t`` with its dimensions in the order ``dims`` gives, size 1 where None."""
    v = t.permute([d for d in dims if d is not None])
    for k, d in enumerate(dims):
        if d is None:
            v = v.unsqueeze(k)
    return v


@contextmanager
def _precision(t, fp32_precision: str):
    """TF32 for a float32 CUDA product exactly when the schedule asks for it."""
    import torch
    if t.device.type != "cuda" or t.dtype != torch.float32:
        yield
        return
    flags = torch.backends.cuda.matmul
    old = flags.allow_tf32
    flags.allow_tf32 = fp32_precision == "tf32"
    try:
        yield
    finally:
        flags.allow_tf32 = old
