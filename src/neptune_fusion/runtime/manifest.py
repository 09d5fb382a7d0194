"""Building a compiled operator's kernels, from the cache when it has them.

``nf.compile`` hands a :class:`Builder` the definition; :meth:`Builder.build` turns a
schedule into a :class:`~neptune_fusion.runtime.kernel.Kernel`. Cold, that is plan
(SymPy) -> lowering -> source generation, after which the kernels' launch specs
(:mod:`.launch`, generated source included) are stored as checksummed JSON under
``<cache>/launches``, keyed by the definition's fingerprint, input names/dtypes/shapes,
the schedule and the package version. Warm, the specs are read back and the kernel is
runnable without importing SymPy or lowering anything; the plan and tile programs are
derived only if asked for. A malformed entry is ignored (and rewritten by the cold path).

The check that a definition can be compiled at all (one fused loop) is remembered the
same way, so a warm ``nf.compile(..., schedule="auto")`` skips the plan too.
"""

from __future__ import annotations

import threading

from ..errors import NeptuneError
from ..schedule.schedule import Schedule
from .launch import LaunchSpec, ext_of, specs_of


class Builder:
    """Kernels of one definition, one per schedule (see module docstring)."""

    def __init__(self, outputs, inputs, name: str, single: bool, store) -> None:
        self.outputs = tuple(outputs)
        self.inputs = tuple(inputs)
        self.name = name
        self.single = single
        self._specs_store = None
        if store is not None:
            from ..schedule.store import ScheduleStore
            self._specs_store = ScheduleStore(store.root, subdir="launches")
        self._plan = None
        self._fingerprint: str | None = None
        self._lowered: dict[Schedule, tuple] = {}
        self._lock = threading.RLock()
        self.from_cache = 0        # kernels built from stored specs (for tests and logs)

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            from .fingerprint import fingerprint
            self._fingerprint = fingerprint(self.outputs)
        return self._fingerprint

    @property
    def plan(self):
        """The fusion plan, derived on first use."""
        with self._lock:
            if self._plan is None:
                from ..fusion.plan import plan as make_plan
                self._plan = make_plan(list(self.outputs))
            return self._plan

    def _key(self, what: str, schedule: Schedule | None = None) -> dict:
        from .._version import __version__, code_version
        key = {"what": f"neptune-fusion {what}", "program": self.fingerprint,
               "name": self.name, "version": __version__, "code": code_version(),
               "inputs": [[p.name, p.dtype.name, [ext_of(d) for d in p.shape]]
                          for p in self.inputs]}
        if schedule is not None:
            key["schedule"] = schedule.to_dict()
        return key

    def check_plan(self) -> None:
        """Raise what lowering would for a chain that is not one fused loop (skipped when
        the cache remembers this definition passing)."""
        key = self._key("plan check")
        if self._specs_store is not None and self._specs_store.get(key) is not None:
            return
        from ..codegen.lower import check_plan
        check_plan(self.plan)
        if self._specs_store is not None:
            self._specs_store.put(key, {"single_pass": True})

    def lowered(self, schedule: Schedule) -> tuple:
        """``(plan, programs)`` of ``schedule``: lowered once."""
        with self._lock:
            got = self._lowered.get(schedule)
            if got is None:
                from ..codegen.lower import lower
                from ..codegen.split import split_programs
                prog = lower(self.plan, list(self.inputs), schedule, name=self.name)
                programs = (prog,) if schedule.strategy == "rolling" else \
                    split_programs(prog, schedule.splits, schedule.merge)
                got = self._lowered[schedule] = (self.plan, programs)
            return got

    def build(self, schedule: Schedule):
        """The :class:`Kernel` of ``schedule`` (checked), from stored specs if present."""
        from .kernel import Kernel
        schedule.check()
        specs = self._stored(schedule)
        cached = specs is not None
        if specs is None:
            from ..codegen.source import generate
            _, programs = self.lowered(schedule)
            specs = specs_of(programs, self.inputs, [generate(p) for p in programs])
            if self._specs_store is not None:
                self._specs_store.put(self._key("kernels", schedule),
                                      {"launches": [s.to_dict() for s in specs]})
        else:
            self.from_cache += 1
        return Kernel(self.outputs, self.inputs, specs, schedule, self.single,
                      lambda: self.lowered(schedule), from_cache=cached)

    def _stored(self, schedule: Schedule) -> tuple[LaunchSpec, ...] | None:
        if self._specs_store is None:
            return None
        rec = self._specs_store.get(self._key("kernels", schedule))
        if rec is None:
            return None
        try:
            specs = tuple(LaunchSpec.from_dict(d) for d in rec["launches"])
        except (NeptuneError, KeyError, TypeError):
            return None
        return specs or None
