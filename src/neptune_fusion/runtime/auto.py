"""``schedule="auto"``: the schedule chosen per shape class at the first call, remembered.

``nf.compile`` cannot choose tiles without sizes (they are symbolic until a call binds
them), so an auto-scheduled operator is an :class:`AutoKernel`: at the first call of a
shape class it

1. builds the :class:`~neptune_fusion.schedule.space.Problem` from the bound sizes and
   asks the schedule store (``~/.cache/neptune-fusion/schedules``) for a tuned schedule;
2. on a miss, ranks the search space with the cost model; on CPU (the interpreter) the
   model's best is taken as is, on a GPU the best ``top_k`` are measured
   (:mod:`.tune`: each checked against the float64 reference first) with a progress bar;
3. stores the winner (atomically; a corrupt entry is rewritten) and compiles it.

The shape class is the program's fingerprint, input dtypes, every symbolic size rounded
up to a power of two, the base speed rules, the device (name, multiprocessors) and the
versions of the package, Triton and torch. Later calls of the same input signature go
straight to the compiled :class:`~neptune_fusion.runtime.kernel.Kernel`.
"""

from __future__ import annotations

import sys
import threading
import warnings
from dataclasses import dataclass, replace

from ..analysis.reach import check_reaches, reaches
from ..errors import CodegenError, NeptuneError, ScheduleError
from ..ir.pow2 import next_pow2
from ..schedule.schedule import Schedule
from ..settings import log_enabled
from .inputs import CacheInfo, check_inputs, remember, signature
from .torch_ops import call_kernel, compiling, referable

_MAX_SIGS = 256


@dataclass(frozen=True)
class Choice:
    """How a shape class got its schedule: ``source`` is "cache" (the store), "model"
    (the cost model alone: CPU) or "measured" (the fastest measured candidate)."""

    schedule: Schedule
    source: str
    trials: tuple = ()
    key: dict | None = None


class AutoKernel:
    """A compiled operator whose schedule is chosen per shape class (module docstring).

    Call it like a :class:`Kernel`. :meth:`kernel_for` returns the concrete kernel of
    some inputs; :attr:`last_choice` says how the latest new shape class was scheduled.
    """

    def __init__(self, outputs, inputs, builder, single: bool, name: str, base: Schedule,
                 build, *, store=None, top_k: int = 4, log: bool | None = None) -> None:
        referable(self)   # traced code names it by number (torch_ops.constant_key)
        self.outputs = tuple(outputs)
        self.inputs = tuple(inputs)
        self._builder = builder        # the definition's Builder (plan, fingerprint)
        self.name = name
        self.base = base
        self._build = build            # Schedule -> Kernel (checked, not yet launched)
        self._store = store            # a DiskCache, or None: no disk cache
        self.top_k = top_k
        self._log = log
        self._single = single
        self._kernels: dict[Schedule, object] = {}
        self._by_class: dict[str, Choice] = {}
        self._by_sig: dict[tuple, object] = {}
        self._by_bucket: dict[tuple, object] = {}
        self._hits = self._misses = 0   # shape classes known / chosen, for cache_info
        # the base schedule's tile program -- the axes the cost model needs -- is lowered
        # only when a shape class is not in the cache
        self._prog0 = None
        self._splittable: bool | None = None
        self._library_ok: bool | None = None
        self._reaches = None   # bare indices checked before a shape class is chosen
        self._lock = threading.RLock()
        self.last_choice: Choice | None = None

    @property
    def plan(self):
        """The fusion plan (derived on first use)."""
        return self._builder.plan

    def __repr__(self) -> str:
        ins = ", ".join(p.name for p in self.inputs)
        outs = ", ".join(o.name for o in self.outputs)
        return f"<AutoKernel {self.name}({ins}) -> {outs}; schedule chosen per shape class>"

    def __call__(self, *tensors, out=None):
        if compiling():  # traced by torch.compile / torch.export: one op (torch_ops.py)
            return call_kernel(self, tensors, self._single, out)
        sig = signature(tensors)
        kern, checked = self._kernel_signed(tensors, sig)
        return kern.call_signed(tensors, sig, checked, out)

    def launch(self, *tensors):
        return self.kernel_for(*tensors).launch(*tensors)

    def schedule_for(self, *tensors) -> Schedule:
        return self.kernel_for(*tensors).schedule

    def kernel_for(self, *tensors):
        """The compiled kernel for ``tensors``' shape class (chosen, maybe tuned, once)."""
        return self._kernel_signed(tensors, signature(tensors))[0]

    def _kernel_signed(self, tensors, sig):
        """:meth:`kernel_for` when the caller has computed ``signature(tensors)``; also
        the checked inputs' ``(sizes, device)`` when a new signature was checked here."""
        got = self._by_sig.get(sig) if sig is not None else None
        if got is not None:
            self._hits += 1
            return got, None
        with self._lock:
            # a new signature of a known shape class (a decode loop's growing KV length):
            # bind the sizes, bucket them, done -- no store, no versions, no device query
            sizes, tdev = check_inputs(self.name, self.inputs, tensors)
            cls = (tdev, tuple(sorted((s.name, next_pow2(v)) for s, v in sizes.items())),
                   tuple(t.dtype for t in tensors))
            kern = self._by_bucket.get(cls)
            if kern is None:
                self._misses += 1
                kern = self._choose(tensors)
                if not _empty(tensors):   # not its class's answer (see _choose)
                    self._by_bucket[cls] = kern
            else:
                self._hits += 1
            if sig is not None:
                remember(self._by_sig, sig, kern, _MAX_SIGS)
        return kern, (sizes, tdev)

    def cache_info(self) -> CacheInfo:
        """The shape classes seen: lookups (calls, :meth:`kernel_for`) of a known one
        (hits) and of a new one, which chose its schedule (misses); unbounded."""
        return CacheInfo(self._hits, self._misses, None, len(self._by_bucket))

    def kernels(self) -> list:
        """The compiled :class:`~neptune_fusion.runtime.kernel.Kernel` s, one per
        schedule chosen (or asked for with :meth:`kernel_of`)."""
        with self._lock:
            return list(self._kernels.values())

    def kernel_of(self, schedule: Schedule):
        """The concrete kernel of an explicit ``schedule`` (built once, validated)."""
        with self._lock:
            return self._kernel(schedule)

    def space_for(self, *tensors):
        """``(problem, device, candidates)``: what the auto-scheduler searches for
        ``tensors`` (the whole space, before the cost model ranks it)."""
        from ..schedule.space import candidates, device_of
        from .problem import problem_of
        sizes, tdev = check_inputs(self.name, self.inputs, tensors)
        device = device_of(tdev)
        problem = problem_of(self._program(), self.inputs, tensors, sizes, self._can_split())
        return problem, device, candidates(problem, device, self.base)

    # ------------------------------------------------------------------ choosing
    def _kernel(self, s: Schedule):
        k = self._kernels.get(s)
        if k is None:
            k = self._kernels[s] = self._build(s)
            if s.dialect == "gluon":   # the calls it cannot take run the Triton twin
                k.fallback = self._kernel(replace(s, dialect="triton"))
        return k

    @property
    def program(self):
        """The tile program under the base schedule: its axes and their roles (rows, loop,
        grid) are those of every schedule; tiles and splits are not."""
        return self._program()

    def _program(self):
        if self._prog0 is None:
            self._prog0 = self._builder.lowered(self.base)[1][0]
        return self._prog0

    def _can_split(self) -> bool:
        if self._splittable is None:
            from ..codegen.split import split_programs
            try:
                split_programs(self._program(), 2)
                self._splittable = True
            except CodegenError:
                self._splittable = False
        return self._splittable

    def _library(self, problem, device) -> list:
        """The estimate of ``strategy="library"`` (a list of one) when the output is a
        product the vendor library can run (fusion/library.py) and its materialised
        operand is no larger than the kernel's tensors (cost.library_fits), else ``[]``."""
        from dataclasses import replace

        from ..fusion.library import library_form
        from ..schedule.cost import library_estimate, library_fits
        if self._library_ok is None:
            self._library_ok = library_form(list(self.outputs)) is not None
        if not self._library_ok or not library_fits(problem):
            return []
        s = replace(self.base, strategy="library", splits=1, block_col=0)
        return [library_estimate(problem, s, device)]

    def _key(self, sizes: dict, device) -> dict:
        import torch
        import triton

        from .._version import __version__, code_version
        return {
            "what": "neptune-fusion schedule", "program": self._builder.fingerprint,
            "inputs": [[p.name, p.dtype.name] for p in self.inputs],
            "sizes": sorted([s.name, next_pow2(v)] for s, v in sizes.items()),
            "base": {k: v for k, v in self.base.to_dict().items()
                     if k in ("exp2", "partition", "fast_tanh", "fp32_precision",
                              "count_visits", "static_sizes")},
            # the Gluon setting widens the search space: a choice made without it is
            # not the answer with it (and the other way round)
            "device": device.name, "sms": device.sms, "gluon": device.gluon,
            "versions": {"neptune_fusion": __version__, "code": code_version(),
                         "triton": triton.__version__,
                         "torch": torch.__version__.split("+")[0]},
        }

    def _choose(self, tensors):
        from ..runtime.disk_cache import canonical_json
        from ..schedule.cost import library_alone, rank
        from ..schedule.space import candidates, device_of
        from .problem import problem_of
        sizes, tdev = check_inputs(self.name, self.inputs, tensors)
        if self._reaches is None:   # before any candidate runs (a tuning would hide it)
            self._reaches = reaches(self.outputs)
        check_reaches(f"kernel {self.name}", self._reaches,
                      {s.name: v for s, v in sizes.items()})
        device = device_of(tdev)
        key = self._key(sizes, device)
        ckey = canonical_json(key)
        choice = self._by_class.get(ckey)
        if choice is None:
            choice = self._cached(key)
        # an input with no elements (an extent of 0, which shares its class with 1 through
        # next_pow2) leaves nothing to time: such a call takes the cost model's pick and
        # neither tunes nor remembers it
        empty = _empty(tensors)
        fresh = choice is None
        if fresh:
            problem = problem_of(self._program(), self.inputs, tensors, sizes,
                                 self._can_split())
            ranked = rank(problem, candidates(problem, device, self.base), device)
            library = self._library(problem, device)
            if not ranked and not library:
                raise CodegenError(f"{self.name}: no schedule of the search space fits "
                                   f"{device.name} for this shape")
            if tdev.type == "cuda" and not empty:
                # the library form is another vehicle, not another tile: always measured,
                # next to half as many fused tiles (each fused GEMM compiles for seconds),
                # alone for a large product (cost.library_alone), the fused tiles then
                # only if it fails
                fused = ranked[: max(1, self.top_k // 2)] if library else \
                    ranked[: self.top_k]
                # the Gluon dialect is another vehicle too: measured whenever offered
                fused += [e for e in ranked if e.schedule.dialect == "gluon"
                          and e not in fused]
                choice = None
                if library and library_alone(problem):
                    try:
                        choice = self._measure(library, tensors, sizes, key)
                    except CodegenError:   # every library trial failed: the fused tiles
                        pass
                if choice is None:
                    choice = self._measure(fused + library, tensors, sizes, key)
            else:
                choice = self._first_buildable(ranked + library, key)
            if self._store is not None and not empty:
                self._store.put(key, {"schedule": choice.schedule.to_dict(),
                                      "source": choice.source,
                                      "trials": [_trial_json(t) for t in choice.trials]})
        if not (fresh and empty):
            self._by_class[ckey] = choice
        self.last_choice = choice
        return self._kernel(choice.schedule)

    def _cached(self, key: dict) -> Choice | None:
        if self._store is None:
            return None
        record = self._store.get(key)
        if record is None:
            if log_enabled(self._log) and self._store.last_miss not in (None, "missing"):
                print(f"neptune-fusion: schedule cache entry ignored "
                      f"({self._store.last_miss}); re-tuning", file=sys.stderr)
            return None
        try:
            s = Schedule.from_dict(record["schedule"])
            self._kernel(s)
        except (KeyError, TypeError, NeptuneError) as err:
            if log_enabled(self._log):
                print(f"neptune-fusion: schedule cache entry unusable ({err}); re-tuning",
                      file=sys.stderr)
            return None
        if log_enabled(self._log):
            print(f"neptune-fusion: {self.name}: schedule from the cache "
                  f"({self._store.path(key)}): {s.brief()}", file=sys.stderr)
        return Choice(s, "cache", (), key)

    def _first_buildable(self, ranked, key: dict) -> Choice:
        from .tune import Trial
        errors = []
        for est in ranked:
            try:
                self._kernel(est.schedule)
            except (CodegenError, ScheduleError) as err:
                errors.append(str(err))
                continue
            trial = Trial(est.schedule, est.seconds)
            if log_enabled(self._log):
                from .tune import log_trials
                log_trials(f"{self.name}: cost model only (no GPU)", [trial], est.schedule)
            return Choice(est.schedule, "model", (trial,), key)
        raise CodegenError(f"{self.name}: no candidate schedule builds: {errors[0]}")

    def _measure(self, ranked, tensors, sizes: dict, key: dict) -> Choice:
        import time

        from .tune import SlowKernelWarning, best, failures, far_off, log_trials, measure
        if _capturing():
            shape = ", ".join(f"{k.name}={v}" for k, v in sizes.items())
            raise ScheduleError(
                f"{self.name}: the first call at this shape class ({shape}) tunes its "
                "schedule on the GPU (timing, synchronising), which cannot happen while a "
                "CUDA graph is being captured; call it once before the capture (a warm-up "
                "call), or pass an explicit schedule")
        top = ranked
        t0 = time.perf_counter()
        with _progress(f"tuning {self.name}", len(top)) as step:
            trials = measure(self._kernel, top, tensors, inputs=self.inputs,
                             outputs=self.outputs, sizes=sizes, top_k=len(top),
                             on_step=step)
        win = best(trials)
        if log_enabled(self._log):
            log_trials(f"{self.name}: {len(trials)} candidates measured in "
                       f"{time.perf_counter() - t0:.1f} s", trials,
                       win.schedule if win else None)
        if win is None:
            raise CodegenError(f"{self.name}: every candidate schedule failed: "
                               f"{failures(trials)}. A failed reference check or a "
                               "compiler error here is a defect of neptune-fusion; "
                               "NEPTUNE_FUSION_LOG=1 prints each candidate's trial")
        if far_off(win):
            warnings.warn(
                f"{self.name}: its fastest schedule ({win.schedule.brief()}) took "
                f"{win.measured_s * 1e3:.3f} ms, {win.measured_s / win.predicted_s:.0f}x "
                f"the cost model's {win.predicted_s * 1e3:.3f} ms: a sign of a code "
                "generation problem rather than a poor tile. NEPTUNE_FUSION_LOG=1 lists the "
                "candidates; please report it with the kernel's source (.source)",
                SlowKernelWarning, stacklevel=2)
        return Choice(win.schedule, "measured", tuple(trials), key)


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph."""
    import torch
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _trial_json(t) -> dict:
    return {"schedule": t.schedule.brief(), "model_ms": t.predicted_s * 1e3,
            "measured_ms": None if t.measured_s is None else t.measured_s * 1e3,
            "error": t.error, "note": t.note, "spent_s": list(t.spent_s)}


class _progress:
    """A transient rich progress bar on a terminal; silent otherwise."""

    def __init__(self, what: str, total: int) -> None:
        self.what, self.total = what, total
        self.bar = None

    def __enter__(self):
        if sys.stdout.isatty() and sys.stderr.isatty():
            from rich.errors import LiveError
            from rich.progress import Progress
            bar = Progress(transient=True)
            try:   # a tuning nested in another's (a library schedule's operands): one bar
                bar.start()
            except LiveError:
                return lambda trial: None
            self.bar = bar
            task = self.bar.add_task(self.what, total=self.total)
            return lambda trial: self.bar.advance(task)
        return lambda trial: None

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()


def _empty(tensors) -> bool:
    """Whether a call has an input with no elements: nothing to time, not its shape
    class's answer (a size of 0 buckets with 1)."""
    return any(t.numel() == 0 for t in tensors)
