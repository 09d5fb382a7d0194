"""``StagedKernel``: a multi-pass plan run as a sequence of kernels, one per pass.

A program that is not one fused loop (a dependency no repair breaks, groups over
different axes) is split by :func:`~neptune_fusion.fusion.stages.split_passes` into pass
programs, each single-pass; each is compiled by the ordinary pipeline into a
:class:`~neptune_fusion.runtime.kernel.Kernel` (explicit schedule: the same one for every
pass) or an :class:`~neptune_fusion.runtime.auto.AutoKernel` (``schedule="auto"``: each
pass chooses its own). A call runs the passes in order; the intermediates one pass writes
and a later one reads are the earlier kernels' outputs, dropped when the call returns.
"""

from __future__ import annotations

from collections.abc import Callable

from ..fusion.stages import Staging
from .inputs import CacheInfo, check_inputs, remember, signature

_MAX_SIGS = 256


class StagedKernel:
    """A compiled operator of several passes; call it like a :class:`Kernel`.

    ``passes`` holds one compiled kernel per pass (``Kernel`` or ``AutoKernel``), in
    launch order; ``staging`` the pass programs and where the outputs come from; ``plan``
    the fusion plan of the whole program (it says why it is not one pass).
    """

    def __init__(self, outputs, inputs, staging: Staging, passes: tuple, single: bool,
                 name: str, plan: Callable) -> None:
        self.outputs = tuple(outputs)
        self.inputs = tuple(inputs)
        self.staging = staging
        self.passes = tuple(passes)
        self.name = name
        self._single = single
        self._plan = plan
        self._checked: dict = {}   # input signatures checked already
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

    def __call__(self, *tensors):
        outs = self.run(tensors)
        return outs[0] if self._single else outs

    def run(self, tensors) -> list:
        """Every pass in order; the program's outputs as a list."""
        sig = signature(tensors)
        if sig is None or sig not in self._checked:
            # the passes check their own inputs; this checks (and names) the program's
            check_inputs(self.name, self.inputs, tensors)
            if sig is not None:
                remember(self._checked, sig, True, _MAX_SIGS)
        results: list[list] = []
        for kern, feeds in zip(self.passes, self._feeds):
            args = [tensors[f[1]] if f[0] == "in" else results[f[1]][f[2]] for f in feeds]
            got = kern(*args)
            results.append(got if isinstance(got, list) else [got])
        return [results[k][n] for k, n in self.staging.results]


def _source(kern) -> str:
    if hasattr(kern, "source"):
        return kern.source
    return "\n\n".join(k.source for k in kern.kernels()) or "# (schedule not chosen yet)"
