"""``StagedKernel``: a multi-pass plan run as a sequence of kernels, one per pass.

A program that is not one fused loop (a dependency no repair breaks, groups over
different axes) and not a chain of phases of one kernel (codegen/lower.py,
``phase_groups``: the passes run over different axes or rows) is split by
:func:`~neptune_fusion.fusion.stages.split_passes` into pass programs, each single-pass;
each is compiled by the ordinary pipeline into a
:class:`~neptune_fusion.runtime.kernel.Kernel` (explicit schedule: the same one for every
pass) or an :class:`~neptune_fusion.runtime.auto.AutoKernel` (``schedule="auto"``: each
pass chooses its own). A call runs the passes in order. The intermediates one pass writes
and a later one reads live in one workspace allocation per call (a byte buffer carved
into contiguous views, handed to the kernels as ``out``), dropped when the call returns.
"""

from __future__ import annotations

from collections.abc import Callable

from ..fusion.stages import Staging
from .inputs import CacheInfo, check_inputs, remember, signature
from .kernel import check_out_list, check_out_tensor
from .torch_ops import call_kernel, compiling, referable

_MAX_SIGS = 256


class StagedKernel:
    """A compiled operator of several passes; call it like a :class:`Kernel`.

    ``passes`` holds one compiled kernel per pass (``Kernel`` or ``AutoKernel``), in
    launch order; ``staging`` the pass programs and where the outputs come from; ``plan``
    the fusion plan of the whole program (it says why it is not one pass).
    """

    def __init__(self, outputs, inputs, staging: Staging, passes: tuple, single: bool,
                 name: str, plan: Callable) -> None:
        referable(self)   # traced code names it by number (torch_ops.constant_key)
        self.outputs = tuple(outputs)
        self.inputs = tuple(inputs)
        self.staging = staging
        self.passes = tuple(passes)
        self.name = name
        self._single = single
        self._plan = plan
        self._layouts: dict = {}   # input signature -> the workspace layout of a call
        # for each pass: where each of its inputs comes from, ("in", k) a call argument or
        # ("mid", pass, position) an earlier pass's output
        made = {id(ph): (k, n) for ph, k, n in staging.intermediates}
        pos = {id(p): k for k, p in enumerate(self.inputs)}
        self._feeds = tuple(
            tuple(("in", pos[id(p)]) if id(p) in pos else ("mid",) + made[id(p)]
                  for p in kern.inputs)
            for kern in self.passes)

    @property
    def plan(self):
        """The fusion plan of the whole program (its ``unfused`` says why several passes)."""
        return self._plan()

    @property
    def kernels(self) -> list:
        """The generated kernels launched per call, in order (explicit schedules; an
        auto-scheduled pass lists those of the schedules chosen so far)."""
        out = []
        for k in self.passes:
            if hasattr(k, "specs"):
                out.extend(k.kernels)
            else:
                for kk in k.kernels():
                    out.extend(kk.kernels)
        return out

    @property
    def source(self) -> str:
        """The generated source of every pass, in launch order (explicit schedules)."""
        return "\n\n".join(f"# ---- pass {k} of {len(self.passes)}\n{_source(p)}"
                           for k, p in enumerate(self.passes))

    def __repr__(self) -> str:
        ins = ", ".join(p.name for p in self.inputs)
        outs = ", ".join(o.name for o in self.outputs)
        return f"<StagedKernel {self.name}({ins}) -> {outs}; {len(self.passes)} passes>"

    def cache_info(self) -> CacheInfo:
        """The call setups of every pass summed (hits, misses, kept)."""
        infos = [k.cache_info() for k in self.passes]
        return CacheInfo(sum(i.hits for i in infos), sum(i.misses for i in infos), None,
                         sum(i.currsize for i in infos))

    def __call__(self, *tensors, out=None):
        """Run on ``tensors``; ``out`` as :meth:`Kernel.__call__` takes it (a staged pass
        of another staged kernel writes there: copied, after the passes)."""
        if compiling():  # traced by torch.compile / torch.export: one op (torch_ops.py)
            return call_kernel(self, tensors, self._single, out)
        if out is not None:
            check_out_list(self.name, self.outputs, out)
        outs = self.run(tensors)
        if out is not None:   # every out checked before any is written
            for k, (o, g) in enumerate(zip(out, outs)):
                if o is not None:
                    check_out_tensor(f"kernel {self.name}: out[{k}] (output "
                                     f"{self.outputs[k].name!r})", o, g.shape, g.dtype,
                                     g.device)
            outs = [g if o is None else o.copy_(g) for o, g in zip(out, outs)]
        return outs[0] if self._single else outs

    def run(self, tensors) -> list:
        """Every pass in order; the program's outputs as a list."""
        import torch
        sig = signature(tensors)
        layout = self._layouts.get(sig) if sig is not None else None
        if layout is None:
            # the passes check their own inputs; this checks (and names) the program's
            sizes, device = check_inputs(self.name, self.inputs, tensors)
            layout = self._layout(sizes, device)
            if sig is not None:
                remember(self._layouts, sig, layout, _MAX_SIGS)
        device, nbytes, slots = layout
        work = torch.empty(nbytes, dtype=torch.uint8, device=device)
        views = {key: work[off:off + size].view(dt).view(shape)
                 for key, (off, size, dt, shape) in slots.items()}
        results: list[list] = []
        for k, (kern, feeds) in enumerate(zip(self.passes, self._feeds)):
            args = [tensors[f[1]] if f[0] == "in" else results[f[1]][f[2]] for f in feeds]
            n_out = len(self.staging.passes[k].outputs)
            out = [views.get((k, n)) for n in range(n_out)]
            got = kern(*args, out=out) if any(o is not None for o in out) else kern(*args)
            results.append(got if isinstance(got, list) else [got])
        # two outputs that are one intermediate (an amax and its detach in a training
        # graph) are two tensors: the same one twice was an aliasing op's result, which
        # AOTAutograd refused (RuntimeError at the first call; a fuzzing find, 2026-12-04)
        seen: set = set()
        outs = []
        for k, n in self.staging.results:
            outs.append(results[k][n] if (k, n) not in seen else results[k][n].clone())
            seen.add((k, n))
        return outs

    def _layout(self, sizes: dict, device) -> tuple:
        """``(device, bytes, slots)``: the one workspace of a call with these sizes; each
        intermediate's slot ``(pass, position) -> (offset, bytes, dtype, shape)``, at
        offsets aligned to 256 bytes. An intermediate that is also an output of the
        program gets no slot (its kernel allocates it: the caller keeps it)."""
        import torch
        returned = set(self.staging.results)
        slots: dict = {}
        off = 0
        for ph, k, n in self.staging.intermediates:
            if (k, n) in returned:
                continue
            shape = tuple(d if isinstance(d, int) else sizes[d] for d in ph.shape)
            dt = getattr(torch, ph.dtype.name)
            size = dt.itemsize
            for d in shape:
                size *= d
            slots[(k, n)] = (off, size, dt, shape)
            off += -(-size // 256) * 256
        return device, off, slots


def _source(kern) -> str:
    if hasattr(kern, "source"):
        return kern.source
    return "\n\n".join(k.source for k in kern.kernels()) or "# (schedule not chosen yet)"
