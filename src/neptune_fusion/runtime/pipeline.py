"""The compiler's pipeline: ``compile()`` and the stages it runs, in order, in one place.

    outputs --axis_staging--> pass programs    (fusion/axes.py: only when a reduction
                                                spans several axes; each compiled below)
            --fusion.plan--> FusionPlan        (canon, normalize, graph, plan: dumped there)
            --check_phased--> one fused loop, or a chain of them over one axis of one
                              row (phases of one kernel), or else
            --split_passes--> pass programs, each one fused loop, each through the
                              stages below (runtime/staged.py StagedKernel runs them)
            --lower--> TileProgram             (codegen/lower.py: one loop per phase, no
                                                masks yet)
            --apply_exp2--> TileProgram        (codegen/exp2.py: when Schedule.exp2)
            --partition_loop--> TileProgram    (codegen/variants.py: boundary/interior)
            --separate--> TileProgram          (codegen/separate.py: per-row terms out of
                                                the tile maxima and exponentials)
            --split_programs--> TileProgram(s) (codegen/split.py: when strategy "split")
            --generate--> Triton source        (codegen/source.py), one per program
            --specs_of--> KernelSpec(s)        (runtime/spec.py) --> Kernel

:func:`build_programs` and :func:`kernel_specs` are that list as code.
``NEPTUNE_FUSION_DUMP=lower,exp2,partition,separate,defer,split,source`` prints the
result of each stage (see :mod:`neptune_fusion.settings`). A :class:`Builder` drives them for one
definition, once per schedule, through the disk cache: the kernel specs (generated
source included) are stored as checksummed JSON under ``<cache>/specs``, keyed by the
definition's fingerprint, input names/dtypes/shapes, the schedule and the package
version. Warm, the specs are read back and the kernel is runnable without importing SymPy
or lowering anything; the plan and tile programs are derived only if asked for. A
malformed entry is ignored (and rewritten by the cold path). The check that a definition
is one fused loop is remembered the same way, so a warm ``schedule="auto"`` compile skips
the plan too.
"""

from __future__ import annotations

import threading
from pathlib import Path

from .. import settings
from ..errors import CodegenError, NeptuneError, ScheduleError, UnschedulableError
from ..ir.graph import placeholders
from ..ir.nodes import Placeholder
from ..reference.evaluate import as_outputs
from ..schedule.schedule import Schedule, make_schedule
from .spec import KernelSpec, ext_of, specs_of

_SUPPORTED = {"float16", "bfloat16", "float32", "int32", "int64"}
SPEED_RULES = ("exp2", "partition", "fast_tanh", "fp32_precision")
_TILE_FIELDS = ("block_m", "block_n", "num_warps", "num_stages", "strategy", "splits",
                "row_programs")


def build_programs(plan, inputs, schedule: Schedule, name: str) -> tuple:
    """The tile programs of ``plan`` under ``schedule``, in launch order: one (rolling) or
    two (split-k: partial, combine). Each stage's result is dumped on request."""
    from ..codegen.defer import defer_tile_reductions
    from ..codegen.exp2 import apply_exp2
    from ..codegen.lower import check_phased, lower
    from ..codegen.outline import outline
    from ..codegen.separate import separate
    from ..codegen.split import split_programs
    from ..codegen.variants import partition_loop

    verify = settings.verify_enabled()

    def done(stage: str, programs: tuple) -> tuple:
        """After each stage: its invariants (NEPTUNE_FUSION_VERIFY), then its dump."""
        if verify:
            for p in programs:
                p.check()
        settings.dump(stage, lambda: "\n\n".join("\n".join(outline(p, bodies=True))
                                                 for p in programs))
        return programs

    check_phased(plan)
    [prog] = done("lower", (lower(plan, list(inputs), schedule, name=name),))
    [prog] = done("exp2", (apply_exp2(prog),))
    [prog] = done("partition", (partition_loop(prog),))
    [prog] = done("separate", (separate(prog),))
    if schedule.strategy == "rolling":
        [prog] = done("defer", (defer_tile_reductions(prog),))
        return done("split", (prog,))
    return done("split", split_programs(prog, schedule.splits))


def kernel_specs(programs, inputs) -> tuple[KernelSpec, ...]:
    """The generated source of each program, and the kernel specs of them all."""
    from ..codegen import gluon, source
    sources = [(gluon if p.schedule.dialect == "gluon" else source).generate(p)
               for p in programs]
    settings.dump("source", lambda: "\n\n".join(sources))
    return specs_of(programs, inputs, sources)


class Builder:
    """The pipeline for one definition: kernels, one per schedule, through the cache."""

    def __init__(self, outputs, inputs, name: str, single: bool, store,
                 fuse_all: bool = False) -> None:
        self.outputs = tuple(outputs)
        self.fuse_all = fuse_all   # require_single_pass: every provable fusion, at any cost
        self.inputs = tuple(inputs)
        self.name = name
        self.single = single
        self.store = store         # the schedule store (a library schedule's operands)
        self._specs_store = None
        if store is not None:
            from ..runtime.disk_cache import DiskCache
            self._specs_store = DiskCache(store.root, subdir="specs")
        self._plan = None
        self._fingerprint: str | None = None
        self._lowered: dict[Schedule, tuple] = {}
        self._lock = threading.RLock()
        self.from_cache = 0        # kernels built from stored specs (for tests and logs)

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            from .fingerprint import fingerprint
            self._fingerprint = fingerprint(self.outputs) + \
                ("+fuse-all" if self.fuse_all else "")
        return self._fingerprint

    @property
    def plan(self):
        """The fusion plan, derived on first use."""
        with self._lock:
            if self._plan is None:
                from ..fusion.plan import plan as make_plan
                self._plan = make_plan(list(self.outputs), fuse_all=self.fuse_all)
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

    def form(self) -> str:
        """``"single"`` (one fused loop) or ``"phased"`` (one kernel, a loop per pass of
        the plan); raise what lowering would for a plan that is neither (skipped when the
        cache remembers the answer)."""
        key = self._key("plan check")
        if self._specs_store is not None:
            rec = self._specs_store.get(key)
            if rec is not None and rec.get("form") in ("single", "phased"):
                return rec["form"]
        from ..codegen.lower import check_phased
        check_phased(self.plan)
        form = "single" if self.plan.single_pass else "phased"
        if self._specs_store is not None and self._lasting():
            self._specs_store.put(key, {"form": form})
        return form

    def _lasting(self) -> bool:
        """Whether what is built now may be stored for later compiles: not when a repair
        derivation ran out of its time budget (a later one, with more time or less load,
        may fuse the chain that this plan leaves unfused)."""
        return self._plan is None or not self._plan.timed_out

    def check_single_pass(self) -> None:
        """Raise the error naming the unfused dependency of a plan that is not one fused
        loop (phases included)."""
        if self.form() != "single":
            from ..codegen.lower import check_single_pass
            check_single_pass(self.plan)

    def lowered(self, schedule: Schedule) -> tuple:
        """``(plan, programs)`` of ``schedule``: built once."""
        with self._lock:
            got = self._lowered.get(schedule)
            if got is None:
                programs = build_programs(self.plan, self.inputs, schedule, self.name)
                got = self._lowered[schedule] = (self.plan, programs)
            return got

    def build(self, schedule: Schedule):
        """The :class:`Kernel` of ``schedule`` (checked), from stored specs if present."""
        from .kernel import Kernel
        schedule.check()
        if schedule.strategy == "library":
            return self._library(schedule)
        specs = self._stored(schedule)
        cached = specs is not None
        if specs is None:
            specs = kernel_specs(self.lowered(schedule)[1], self.inputs)
            if self._specs_store is not None and self._lasting():
                self._specs_store.put(self._key("kernels", schedule),
                                      {"specs": [s.to_dict() for s in specs]})
        else:
            self.from_cache += 1
        return Kernel(self.outputs, self.inputs, specs, schedule, self.single,
                      lambda: self.lowered(schedule), from_cache=cached)

    def _library(self, schedule: Schedule):
        """The :class:`~.library.LibraryKernel` of ``schedule`` (strategy "library"):
        its computed operands compiled with the schedule's speed rules, auto tiles."""
        from ..fusion.library import library_form
        from .library import LibraryKernel
        form = library_form(list(self.outputs))
        if form is None:
            raise UnschedulableError(
                f"{self.name}: strategy='library' needs an output that is a product of two "
                "tensors over one axis (sum_c a[.., i, c] * b[.., c, o], one dtype); this "
                "program's is not (fusion/library.py says what qualifies)")
        rules = {k: getattr(schedule, k) for k in SPEED_RULES}

        def operand(c, inputs, name):
            return compile(c, inputs, name=name, cache=self.store or False, **rules)
        return LibraryKernel(form, self.inputs, schedule, self.single, self.name, operand)

    def _stored(self, schedule: Schedule) -> tuple[KernelSpec, ...] | None:
        if self._specs_store is None:
            return None
        rec = self._specs_store.get(self._key("kernels", schedule))
        if rec is None:
            return None
        try:
            specs = tuple(KernelSpec.from_dict(d) for d in rec["specs"])
        except (NeptuneError, KeyError, TypeError):
            return None
        return specs or None


def compile(outputs, inputs=None, *, schedule: Schedule | dict | str = "auto",  # noqa: A001
            name: str | None = None, cache=None, log: bool | None = None, top_k: int = 4,
            require_single_pass: bool = False, differentiable: bool = False,
            _depth: int = 0, **options):
    """Compile plain ``outputs`` into one fused operator.

    ``inputs`` fixes the order of the tensor arguments (default: the placeholders in
    dependency order). ``schedule``:

    * ``"auto"`` (default): an :class:`~neptune_fusion.runtime.auto.AutoKernel` that
      chooses the schedule per shape class at the first call (cost model; on a GPU the
      best ``top_k`` candidates measured), remembered in ``cache`` (a
      :class:`~neptune_fusion.runtime.disk_cache.DiskCache`, a directory, ``None`` for
      the default ``~/.cache/neptune-fusion``, ``False`` for none). ``log`` (default:
      ``$NEPTUNE_FUSION_LOG``) prints the candidates and their times.
    * a :class:`~neptune_fusion.schedule.schedule.Schedule` (or its dict/JSON form): that
      schedule exactly, validated -- :class:`~neptune_fusion.errors.ScheduleError` names
      the field and the violated invariant. Returns a
      :class:`~neptune_fusion.runtime.kernel.Kernel`.

    A definition that is not one fused loop (the plan's ``unfused``) but a chain of them
    over one reduction axis of one row compiles to one kernel that runs the loops one
    after the other (*phases*, rolling only); one whose passes are over different axes or
    rows compiles to a :class:`~neptune_fusion.runtime.staged.StagedKernel`: one kernel
    per pass, each scheduled like a single-pass definition (see docs/codegen.md,
    multi-pass plans); an explicit split-k schedule runs a phased chain as passes too.
    ``require_single_pass=True`` refuses both instead, with the
    :class:`~neptune_fusion.errors.UnschedulableError` naming the unfused dependency.

    ``options`` replace schedule fields (``block_m=64``); a tile or launch field with
    ``"auto"`` means an explicit schedule (the defaults plus ``options``).

    ``differentiable=True`` wraps the kernel for ``torch.autograd``: its backward is
    derived from the definition and compiled on first use (docs/autodiff.md); without
    it, inputs that require grad are refused.

    ``_depth`` (internal) counts the passes this call is nested in: a pass compiled as a
    definition of its own (a 0-d result, a pass over another axis) passes it on, and
    past :data:`MAX_PASS_DEPTH` the plan's error is raised instead of splitting again.
    """
    if differentiable:
        from .differentiable import DifferentiableKernel
        kern = compile(outputs, inputs, schedule=schedule, name=name, cache=cache, log=log,
                       top_k=top_k, require_single_pass=require_single_pass, **options)
        return DifferentiableKernel(kern, compile, cache)
    outs, single = as_outputs(outputs)
    from ..fusion.maps import as_unit_reductions, has_reduction
    if not has_reduction(outs):   # a map: a loop of one iteration (fusion/maps.py)
        mapped = as_unit_reductions(outs)
        if mapped is None:
            bad = [f"{o.name} ({o.body.dtype})" for o in outs if not o.body.dtype.is_float]
            raise CodegenError(f"{', '.join(bad)} reduce(s) nothing and is not floating "
                               "point; a kernel of maps writes float outputs: cast with "
                               "nf.cast(..., 'float32')")
        outs = mapped
    needed = placeholders(outs)
    inputs = list(needed if inputs is None else inputs)
    for k, p in enumerate(inputs):
        if not isinstance(p, Placeholder):
            raise NeptuneError(f"inputs[{k}] must be a placeholder, got {p!r}")
        if p.dtype.name not in _SUPPORTED:
            raise NeptuneError(f"input {p.name!r} is {p.dtype}; kernels take "
                               f"{', '.join(sorted(_SUPPORTED))}")
    if len(set(inputs)) != len(inputs):
        raise NeptuneError("inputs lists a placeholder twice")
    missing = [p.name for p in needed if p not in inputs]
    if missing:
        raise CodegenError(f"the outputs read {', '.join(missing)}, not among the inputs")
    auto = isinstance(schedule, str) and schedule == "auto" \
        and not any(f in options for f in _TILE_FIELDS)
    if isinstance(schedule, str) and schedule != "auto":
        raise ScheduleError(f"schedule must be 'auto', a Schedule or its dict, got "
                            f"{schedule!r}")
    if isinstance(schedule, dict):
        schedule = Schedule.from_dict(schedule)
    sched = make_schedule(None if isinstance(schedule, str) else schedule, **options)
    kname = _identifier(name or "nf_" + "_".join(o.name for o in outs))
    from ..runtime.disk_cache import DiskCache
    if cache is None or isinstance(cache, (str, Path)):
        store = DiskCache(cache)
    else:
        store = cache or None
    builder = Builder(outs, inputs, kname, single, store, fuse_all=require_single_pass)
    from ..fusion.axes import axis_staging, has_multi_axis
    if has_multi_axis(outs):   # one reduction axis per loop: a pass per partial result
        if require_single_pass:
            raise UnschedulableError(f"{kname}: a reduction over several axes at once runs "
                                     "as several passes (fusion/axes.py); "
                                     "require_single_pass=True refuses them")
        return _staged(builder, auto, sched, store, top_k, log, axis_staging(list(outs)),
                       depth=_depth)
    from ..fusion.scalars import has_scalars, unit_rows
    if has_scalars(outs):   # a 0-d compute: a row of one (fusion/scalars.py)
        from .scalars import ScalarOutputs
        inner = compile(unit_rows(outs), inputs, schedule=schedule, name=kname,
                        cache=cache, log=log, top_k=top_k,
                        require_single_pass=require_single_pass, _depth=_depth + 1,
                        **options)
        return ScalarOutputs(inner, outs, single)
    if not auto and sched.strategy == "library":   # any plan: the product is cuBLAS's
        return builder.build(sched)
    try:
        if require_single_pass:
            builder.check_single_pass()
        elif builder.form() == "phased" and not auto and sched.strategy == "split":
            # split-k cuts one loop: an explicit split schedule splits each pass instead
            raise UnschedulableError("split-k of a phased program")
    except UnschedulableError as err:
        if require_single_pass:
            raise UnschedulableError(f"{err}; require_single_pass=True refuses the "
                                     "multi-pass plan") from None
        if auto and _has_library_form(outs):
            # several passes whatever happens, and the last is a product: the operands
            # come from our kernels and the product from the library (runtime/library.py)
            from dataclasses import replace
            return builder.build(replace(sched, strategy="library"))
        if _depth >= MAX_PASS_DEPTH:
            raise UnschedulableError(
                f"{err}; split into passes {_depth} times over, the same dependency comes "
                "back in a pass of its own (a reduction that no output row depends on, "
                "read inside another reduction)") from None
        return _staged(builder, auto, sched, store, top_k, log, depth=_depth)
    return _one(builder, auto, sched, store, top_k, log)


def _one(builder: Builder, auto: bool, sched: Schedule, store, top_k: int, log):
    """The kernel of a single-pass definition: explicit or auto-scheduled."""
    if not auto:
        return builder.build(sched)
    from .auto import AutoKernel
    return AutoKernel(builder.outputs, builder.inputs, builder, builder.single,
                      builder.name, sched, builder.build, store=store, top_k=top_k,
                      log=log)


MAX_PASS_DEPTH = 4
"""How deep passes compiled as definitions of their own may nest (:func:`compile`)."""


def _staged(whole: Builder, auto: bool, sched: Schedule, store, top_k: int, log,
            staging=None, depth: int = 0):
    """A multi-pass plan whose passes are not phases of one kernel: one kernel per pass
    program (fusion/stages.py, or ``staging`` given: fusion/axes.py), run in order by a
    :class:`~neptune_fusion.runtime.staged.StagedKernel`. A pass program that needs
    several passes itself compiles to its own staged kernel."""
    from ..fusion.stages import split_passes
    from .staged import StagedKernel
    nested = staging is not None   # a pass of fusion/axes.py may need passes of its own
    if staging is None:
        staging = split_passes(list(whole.outputs))
        if staging.single_pass:   # nothing to split (no reduction at all): today's error
            from ..codegen.lower import check_single_pass
            check_single_pass(whole.plan)
    from ..fusion.maps import has_reduction
    from ..fusion.scalars import has_scalars
    kernels = []
    for ps in staging.passes:
        name = f"{whole.name}_pass{ps.index}"
        # a reduction no output row depends on (``x[i, j] / sum_r x[r, 0]``) is a pass
        # with a 0-d output, and the outputs then a map: compile() handles both
        if nested or has_scalars(ps.outputs) or not has_reduction(ps.outputs):
            kernels.append(compile(list(ps.outputs), list(ps.inputs), name=name,
                                   schedule="auto" if auto else sched,
                                   cache=store or False, log=log, top_k=top_k,
                                   _depth=depth + 1))
            continue
        b = Builder(ps.outputs, ps.inputs, name, False, store)
        b.form()
        kernels.append(_one(b, auto, sched, store, top_k, log))
    return StagedKernel(whole.outputs, whole.inputs, staging, tuple(kernels), whole.single,
                        whole.name, lambda: whole.plan)


def _has_library_form(outs) -> bool:
    from ..fusion.library import library_form
    return library_form(list(outs)) is not None


def _identifier(name: str) -> str:
    import re
    out = re.sub(r"\W", "_", name)
    return out if out and not out[0].isdigit() else "k_" + out
