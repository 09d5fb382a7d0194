"""``Kernel``: a compiled operator's launch machinery.

A :class:`Kernel` runs the generated kernels of one schedule from their
:class:`~neptune_fusion.runtime.spec.KernelSpec` s (built by the pipeline,
:mod:`neptune_fusion.runtime.pipeline`, or read from the cache): CUDA tensors launch the
compiled Triton kernels, CPU tensors run the *same* generated kernels under Triton's
interpreter. Inputs are checked at call time (:func:`~.inputs.check_inputs`); what a launch
derives from them besides their data is cached per input signature as a call setup
(:meth:`Kernel.cache_info` counts them).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..analysis.reach import check_reaches, reaches
from ..codegen.program import contiguous_strides
from ..errors import CodegenError, FeedError
from ..ir.nodes import Size, memo
from ..ir.pow2 import tile_extent
from ..schedule.schedule import Schedule
from .descriptors import bind_context, maker
from .inputs import CacheInfo, check_gathered, check_inputs, gathered_dims, remember, signature
from .launcher import (
    ARG_CONST,
    ARG_SIZE,
    ARG_TENSOR,
    VISITS,
    Address,
    Launcher,
    aligned,
    reuse_key,
    scratch_layout,
)
from .loader import interpreted_launch, load_kernel_module
from .spec import KernelSpec
from .torch_ops import call_kernel, compiling, referable


class GeneratedKernel:
    """One generated Triton kernel (one launch per call): its kernel spec (the source
    included: compiled from that text, never from a file) and (lowered on demand when the
    kernel came from the cache) tile program."""

    def __init__(self, spec: KernelSpec, program: Callable) -> None:
        self.spec = spec
        self._program = program

    name = property(lambda self: self.spec.name)
    source = property(lambda self: self.spec.source)

    @property
    def program(self):
        return self._program()

    @property
    def grid(self) -> str:
        grid = " * ".join(str(g) for g in self.spec.grid) or "1"
        tail = f", {self.spec.splits}" if self.spec.splits else ""
        cols = f" * cdiv({self.spec.col_tile[0]}, {self.spec.col_tile[1]})" \
            if self.spec.col_tile else ""
        return f"(cdiv({self.spec.rows}, BLOCK_M){cols}, {grid}{tail})"


@dataclass(frozen=True)
class LaunchResult:
    """The result of :meth:`Kernel.launch`: outputs, grid, and the visit counts if asked."""

    outputs: list
    grid: tuple[int, ...]   # the first kernel's grid (split-k: with the split axis)
    visits: object | None   # int32 tensor (programs, 2): masked and interior tiles visited


_MAX_SETUPS = 256    # call setups kept per kernel (oldest dropped first)
_VISITS = VISITS  # the by_tensor key of the visit-count tensor in a launch


_CONST, _TENSOR, _SIZE = ARG_CONST, ARG_TENSOR, ARG_SIZE  # an argument's value: from where


@dataclass(frozen=True)
class _Step:
    """One kernel launch with everything but the tensors and the symbolic sizes' values
    precomputed; shared by the call setups whose signatures differ only in sizes that
    reach the kernel as plain arguments (a decode loop's growing key length)."""

    outputs: tuple[tuple[tuple[int, ...], object], ...]  # (shape, torch dtype) to allocate
    output_keys: tuple          # the tensor keys of those outputs
    grid: tuple[int, ...]
    # (_CONST, value), (_TENSOR, tensor key) or (_SIZE, size name): filled per call
    args: tuple[tuple[int, object], ...]
    fn: object | None           # the Triton function; None when the grid is empty
    interpret: bool
    opts: dict
    launcher: Launcher | None = None  # CUDA: launches fn (directly after the first time)
    # a workspace step (not the last): byte offsets of its outputs in one buffer, its size
    scratch: tuple[int, ...] = ()
    scratch_bytes: int = 0
    # the position of the kernel's TMA argument when it is True: an unaligned call passes
    # False there (codegen/tma.py: descriptors need 16-byte aligned addresses)
    tma_at: int | None = None
    # a Gluon kernel (Schedule.dialect): it reads every tile by TMA, so an input whose
    # address is not 16-byte aligned is refused at the launch (strides: at the setup)
    needs_aligned: bool = False
    # its host-side TMA descriptors: (argument position, tensor key, make(tensor)),
    # made per launch (runtime/descriptors.py)
    descs: tuple = ()


@dataclass(frozen=True)
class _CallSetup:
    """The launches of one input signature: the device and one step per kernel."""

    device: object
    steps: tuple[_Step, ...]
    keys: tuple[str, ...]       # the tensor keys of the inputs: in0, in1, ...
    sizes: dict                 # size name -> bound value


class Kernel:
    """A compiled operator. Call it with torch tensors in the order of ``inputs``.

    ``kernels`` lists the generated kernels launched in order per call: one for the
    rolling update, two for split-k (the partial kernel, then the combine). A kernel runs
    from its :class:`~neptune_fusion.runtime.spec.KernelSpec` s alone; ``plan`` and the
    tile programs are derived on first access when it was loaded from the cache.
    """

    def __init__(self, outputs, inputs, specs: tuple[KernelSpec, ...], schedule: Schedule,
                 single: bool, lowered: Callable, from_cache: bool = False) -> None:
        referable(self)   # traced code names it by number (torch_ops.constant_key)
        self.outputs = tuple(outputs)
        self.inputs = tuple(inputs)
        self.schedule = schedule
        self.specs = tuple(specs)
        self._lowered = lowered        # () -> (plan, programs), memoised by the caller
        self.from_cache = from_cache   # built from stored kernel specs (nothing lowered)
        self.kernels = [GeneratedKernel(sp, lambda k=k: self._lowered()[1][k])
                        for k, sp in enumerate(self.specs)]
        self.source = self.specs[0].source if len(self.specs) == 1 else \
            "\n\n".join(sp.source for sp in self.specs)
        self._single = single
        self._modules: dict[tuple[int, bool], object] = {}
        self._load_lock = threading.Lock()   # one module per (kernel, mode), ever
        # call setups by input signature (see _setup); owned by this kernel, bounded
        self._setups: dict[tuple, _CallSetup] = {}
        self._hits = self._misses = 0   # of _setups, for cache_info
        # Triton's compiled kernels shared by the call setups (launcher.reuse_key)
        self._compiled: dict[tuple, object] = {}
        # launch steps shared by call setups (see _step), bounded like the plans
        self._steps: dict[tuple, _Step] = {}
        self._shaping = tuple(_shaping_sizes(self.specs, k) for k in range(len(self.specs)))
        self._fits: set = set()   # (device, column extents) whose resources were checked
        # a Gluon kernel chosen by the auto-scheduler: the same tile in the Triton dialect,
        # for the calls the Gluon kernel cannot take (:meth:`takes`); None: refuse them
        self.fallback = None
        self._reaches = None   # bare indices checked per call setup (analysis.reach)
        self._gathered = None  # input dimensions indexed by other tensors (inputs.py)
        self._gluon = any(sp.dialect == "gluon" for sp in self.specs)
        names = [s.name for p in self.inputs for s in p.shape if isinstance(s, Size)]
        self._size_names = {s: s.name for p in self.inputs for s in p.shape
                            if isinstance(s, Size)}
        if len(set(self._size_names.values())) != len(set(self._size_names)):
            raise CodegenError(f"two different sizes share a name among {sorted(set(names))}"
                               "; give every size its own name")

    @memo
    def plan(self):
        """The fusion plan (derived now if the kernel came from the cache)."""
        return self._lowered()[0]

    @property
    def program(self):
        """The first kernel's tile program (lowered now if it came from the cache)."""
        return self.kernels[0].program

    def __repr__(self) -> str:
        ins = ", ".join(p.name for p in self.inputs)
        outs = ", ".join(o.name for o in self.outputs)
        return f"<Kernel {self.specs[0].name}({ins}) -> {outs}; {self.schedule}>"

    def cache_info(self) -> CacheInfo:
        """The call setups kept per input signature: calls that found theirs (hits),
        calls that derived one (misses, tensor subclasses included: never kept)."""
        return CacheInfo(self._hits, self._misses, _MAX_SETUPS, len(self._setups))

    @property
    def steps_kept(self) -> int:
        """How many launch steps the call setups share (one per kernel and distinct
        launch shape: a growing decode loop keeps one per kernel)."""
        return len(self._steps)

    def _function(self, k: int, interpret: bool):
        mod = self._modules.get((k, interpret))
        if mod is None:
            with self._load_lock:
                mod = self._modules.get((k, interpret))
                if mod is None:
                    spec = self.specs[k]
                    mod = self._modules[(k, interpret)] = load_kernel_module(
                        spec.source, spec.name, interpret)
        return getattr(mod, self.kernels[k].name)

    def __call__(self, *tensors, out=None):
        """Run on ``tensors``. ``out``: a list with, per output, a tensor of its shape and
        dtype on the inputs' device to write it into (any strides: the last kernel writes
        through them, or through a copy when the last dimension is not unit-stride), or
        None (a new contiguous tensor); how a multi-pass kernel places its intermediates
        in one workspace. Traced by
        torch.compile or torch.export: one ``neptune_fusion::kernel`` op (torch_ops.py)."""
        if compiling():
            return call_kernel(self, tensors, self._single, out)
        return self.call_signed(tensors, signature(tensors), out=out)

    def call_signed(self, tensors: tuple, sig: tuple | None, checked=None, out=None):
        """``self(*tensors)`` when the caller has computed ``signature(tensors)`` (and
        maybe ``checked = check_inputs(...)`` of these inputs)."""
        if out is not None:
            check_out_list(self.specs[0].name, self.outputs, out)
        if self.fallback is not None and not self.takes(tensors, out):
            return self.fallback.call_signed(tensors, sig, checked, out)
        if out is None:
            got = self._run(self._setup(tensors, sig, checked), tensors).outputs
            return got[0] if self._single else got
        # the kernels index an output's last dimension with stride 1: any other out gets
        # a contiguous result, copied into it
        direct = [o if o is None or _unit_last(o) else None for o in out]
        setup = self._setup(tensors, sig, checked, _out_strides(direct))
        self._check_out(out, setup)   # before anything is launched or copied
        got = self._run(setup, tensors, direct).outputs
        got = [g if o is None or o is g else o.copy_(g) for o, g in zip(out, got)]
        return got[0] if self._single else got

    def launch(self, *tensors) -> LaunchResult:
        """Run the kernel(s); returns outputs, grid and (with ``count_visits``) visits."""
        if self.fallback is not None and not self.takes(tensors):
            return self.fallback.launch(*tensors)
        return self._run(self._setup(tensors, signature(tensors)), tensors)

    def takes(self, tensors, out=None) -> bool:
        """Whether this kernel can run on ``tensors`` (and ``out``): always, but a Gluon
        kernel needs CUDA tensors whose addresses and strides suit TMA (16 bytes)."""
        if not self._gluon:
            return True
        given = [o for o in out if o is not None] if out is not None else []
        return all(t.is_cuda for t in tensors) and aligned(list(tensors) + given) \
            and tma_strides(tensors)

    def _run(self, setup: _CallSetup, tensors, out=None) -> LaunchResult:
        import torch
        device = setup.device
        if device.type == "cuda" and device.index != torch.cuda.current_device():
            with torch.cuda.device(device):  # Triton launches on the current device
                return self._run(setup, tensors, out)
        by_tensor = dict(zip(setup.keys, tensors))
        # a given out tensor counts too (a view may start anywhere): the direct launch
        # runs the kernel Triton compiled for 16-byte aligned pointers
        addresses_aligned = aligned(tensors) and (
            out is None or aligned([o for o in out if o is not None]))
        is_aligned = device.type == "cuda" and addresses_aligned
        # every launch direct: the workspace is one buffer, addressed (launcher.py)
        direct = is_aligned and all(s.launcher is not None and s.launcher.direct is not None
                                    for s in setup.steps)
        buffers = []  # alive until every launch is enqueued (the allocator is stream-ordered)
        outs: list = []
        first = None
        for k, step in enumerate(setup.steps):
            if direct and step.scratch_bytes:
                buffers.append(torch.empty(step.scratch_bytes, dtype=torch.uint8,
                                           device=device))
                base = buffers[-1].data_ptr()
                outs = [Address(base + off) for off in step.scratch]
            elif out is not None and k == len(setup.steps) - 1:   # checked: _check_out
                outs = [o if o is not None else torch.empty(shape, dtype=dt, device=device)
                        for o, (shape, dt) in zip(out, step.outputs)]
            else:
                outs = [torch.empty(shape, dtype=dt, device=device)
                        for shape, dt in step.outputs]
            by_tensor.update(zip(step.output_keys, outs))
            run = self._launch_one(k, step, by_tensor, setup.sizes, device,
                                   None if first is None else first[1], is_aligned,
                                   addresses_aligned)
            first = run if first is None else first
        return LaunchResult(outs, first[0], first[1])

    def _setup(self, tensors, sig: tuple | None, checked=None,
               out_strides: tuple | None = None) -> _CallSetup:
        """The call setup of ``tensors``: cached per (shapes, strides, dtypes, devices).

        Everything a launch derives from its inputs besides their data -- bound sizes,
        grids, output shapes, the non-tensor arguments, the Triton function -- depends
        only on that signature, and the full :meth:`_check` passes or fails by it alone,
        so a signature seen before skips both (this was most of the host time per call).
        Tensor subclasses are never cached: their attributes may not be plain data.
        ``out_strides``: the strides of ``out`` tensors the last kernel writes (None:
        contiguous outputs), a part of the key.
        """
        if sig is not None and out_strides is not None:
            sig = (sig, out_strides)
        setup = self._setups.get(sig) if sig is not None else None
        if setup is not None:
            self._hits += 1
            return setup
        self._misses += 1
        sizes, device = self._check(tensors) if checked is None else checked
        if self._gathered is None:
            self._gathered = gathered_dims(self.outputs, self.inputs)
        check_gathered(self.specs[0].name, self.inputs, tensors, self._gathered)
        named = {self._size_names.get(s, s.name): v for s, v in sizes.items()}
        if self._reaches is None:
            self._reaches = reaches(self.outputs)
        check_reaches(f"kernel {self.specs[0].name}", self._reaches, named)
        if device.type == "cuda" and not self.from_cache:  # cached specs have run before
            self._check_resources(tensors, sizes, device)
        last = len(self.specs) - 1
        setup = _CallSetup(device, tuple(self._step(k, named, device, tensors,
                                                    out_strides if k == last else None)
                                         for k in range(len(self.specs))),
                           tuple(f"in{k}" for k in range(len(tensors))), named)
        if sig is not None:  # bounded: e.g. a decode loop's growing M
            remember(self._setups, sig, setup, _MAX_SETUPS)
        return setup

    def _check_resources(self, tensors, sizes: dict, device) -> None:
        """An explicit schedule that cannot fit the device: a ScheduleError naming it.

        What it checks (shared memory per program) depends on the device and the extents
        of the contraction and output columns, not on the row or loop lengths, so it runs
        once per device and column extents (a decode loop's growing KV length skips it)."""
        from ..codegen.program import extent_value
        prog = self.program
        key = (device, tuple(extent_value(a.extent, sizes) for a in prog.inner),
               None if prog.col is None else extent_value(prog.col.extent, sizes))
        if key in self._fits:
            return
        from ..schedule.cost import check_resources
        from ..schedule.space import device_of
        from .problem import problem_of
        check_resources(problem_of(prog, self.inputs, tensors, sizes, visits=False),
                        self.schedule,
                        device_of(device))
        self._fits.add(key)

    def _step(self, k: int, sizes: dict, device, tensors,
              out_strides: tuple | None = None) -> _Step:
        """Kernel ``k``'s launch step for these inputs: shared by every signature with the
        same device, input strides, values of the sizes that shape the outputs, grid and
        tile extents, 32-bit-ness of the size arguments (which Triton types by it) and, of
        the sizes Triton specialises on, whether each is 1 and a multiple of 16, and the
        ``LOOP_EVEN`` and ``ONE_TILE`` constexprs (the class whose compiled kernel the
        launcher keeps), and the strides of given ``out`` tensors (None: contiguous)."""
        spec = self.specs[k]
        shaping, size_args = self._shaping[k]
        key = (k, device, tuple(t.stride() for t in tensors),
               tuple(sizes[n] for n in shaping),
               tuple(-2 ** 31 <= sizes[n] < 2 ** 31 for n in size_args),
               tuple((sizes[n] == 1, sizes[n] % 16 == 0) for n in spec.specialized),
               tuple(flag_value(a, sizes) for a in spec.args if a[0] in _FLAGS),
               out_strides)
        step = self._steps.get(key)
        if step is None:
            step = self._new_step(k, spec, sizes, device, tensors, out_strides)
            remember(self._steps, key, step, _MAX_SETUPS)
        return step

    def _new_step(self, k: int, spec: KernelSpec, sizes: dict, device, tensors,
                  out_strides: tuple | None = None) -> _Step:
        outputs = tuple(_alloc(shape, dt, sizes) for _, shape, dt in spec.outputs)
        out_keys = tuple(key for key, _, _ in spec.outputs)
        # strides of every tensor argument: inputs' from the (signature-fixed) inputs,
        # outputs' those of a contiguous tensor of their shape (what torch.empty gives),
        # or of the out tensors given to the last kernel
        strides = {f"in{i}": t.stride() for i, t in enumerate(tensors)}
        for kk in range(k + 1):
            for key, shape, _ in self.specs[kk].outputs:
                strides[key] = contiguous_strides([_value(x, sizes) for x in shape])
        if out_strides is not None:
            strides.update((key, st) for key, st in zip(out_keys, out_strides)
                           if st is not None)
        grid1 = 1
        for g in spec.grid:
            grid1 *= _value(g, sizes)
        grid0 = -(-_value(spec.rows, sizes) // spec.block_m)
        if spec.row_programs and spec.dialect == "gluon":
            # a persistent grid over the (row block, grid index) items (codegen/gluon.py)
            grid0 = min(grid0 * grid1, spec.row_programs * _multiprocessors(device))
            grid1 = 1
        elif spec.row_programs and all(flag_value(a, sizes) for a in spec.args
                                       if a[0] == "one"):   # the one tile walks the rows
            others = 1
            for g in spec.grid:
                others *= _value(g, sizes)
            slots = spec.row_programs * _multiprocessors(device)
            grid0 = min(grid0, max(1, -(-slots // max(others, 1))))
        if spec.col_tile:                   # row tiles x column tiles, in program_id(0)
            ext, tile = spec.col_tile
            grid0 *= -(-_value(ext, sizes) // tile)
        grid = (grid0, grid1)
        if spec.splits:
            grid += (spec.splits,)
        elif spec.col_blocks > 1:
            grid += (spec.col_blocks,)
        interpret = device.type != "cuda"
        args: list[tuple[int, object]] = []
        descs: list = []
        for a in spec.args:
            kind = a[0]
            if kind == "tensor":
                args.append((_TENSOR, a[1]))
            elif kind == "stride":
                args.append((_CONST, strides[a[1]][a[2]]))
            elif kind == "size":
                args.append((_SIZE, a[1]))
            elif kind == "visits":
                args.append((_TENSOR, _VISITS))
            elif kind == "block":
                args.append((_CONST, a[1]))
            elif kind == "block_ext":   # ("block_ext", size[, cap]): see runtime/spec.py
                block = tile_extent(_value(a[1], sizes))
                args.append((_CONST, min(block, a[2]) if len(a) > 2 else block))
            elif kind == "tma":
                args.append((_CONST, tma_strides(tensors)))
            elif kind in _FLAGS:
                args.append((_CONST, flag_value(a, sizes)))
            elif kind == "dense":   # ("dense", key, strides): the input has exactly those
                args.append((_CONST, tuple(strides[a[1]]) == tuple(a[2])))
            elif kind == "desc":   # ("desc", key, box, swizzle, bits): made per launch
                descs.append((len(args), a[1], maker(tuple(a[2]), a[3], a[4])))
                args.append((_CONST, None))
            else:
                args.append((_CONST, interpret))
        tma_at = next((i for i, (a, (_, v)) in enumerate(zip(spec.args, args))
                       if a[0] == "tma" and v), None)
        opts = dict(num_warps=spec.num_warps, num_stages=spec.num_stages)
        if spec.dialect == "gluon":   # its last parameter, the constexpr STAGES, by position
            _gluon_ready(spec, device, tensors)   # (the direct launch passes args alone)
            args.append((_CONST, spec.num_stages))
        fn = self._function(k, interpret) if 0 not in grid else None
        scratch, nbytes = scratch_layout(outputs) if k < len(self.specs) - 1 else ((), 0)
        launcher = None
        if fn is not None and not interpret:
            consts = [("specialized" if tag == _SIZE and v in spec.specialized else a[0],
                       sizes[v] if tag == _SIZE else v)
                      for a, (tag, v) in zip(spec.args, args) if tag != _TENSOR]
            launcher = Launcher(fn, grid, opts, self._compiled,
                                (k, reuse_key(*zip(*consts)) if consts else ()),
                                device.index)
        return _Step(outputs, out_keys, grid, tuple(args), fn, interpret, opts,
                     launcher, scratch, nbytes, tma_at, spec.dialect == "gluon", tuple(descs))

    def _launch_one(self, k: int, step: _Step, by_tensor: dict, sizes: dict, device,
                    visits=None, is_aligned: bool = False, addresses_aligned: bool = False):
        """Launch kernel ``k`` per its ``step``; returns (grid, visits). ``is_aligned``:
        a CUDA call whose inputs are all 16-byte aligned (so the launch may skip Triton's
        dispatch); ``addresses_aligned``: the inputs are, on any device (descriptor
        loads may be used)."""
        import torch
        grid = step.grid
        if self.specs[k].count_visits and visits is None:
            # per (row block, grid point); split-k partial programs add into the same slot
            visits = torch.zeros((grid[0] * grid[1], 2), dtype=torch.int32, device=device)
        if step.fn is None:  # an empty grid
            return grid, visits
        by_tensor[_VISITS] = visits
        args = [v if tag == _CONST else by_tensor[v] if tag == _TENSOR else sizes[v]
                for tag, v in step.args]
        if step.needs_aligned and not addresses_aligned:
            from ..errors import FeedError
            raise FeedError(f"{self.specs[k].name}: a tensor's address is not 16-byte "
                            "aligned, and a Gluon kernel (Schedule.dialect='gluon') reads "
                            "every tile by TMA; pass aligned tensors (.contiguous() or "
                            ".clone()) or use dialect='triton'")
        if step.tma_at is not None and not addresses_aligned:
            args[step.tma_at] = False
        if step.descs:
            bind_context(device)
            for pos, key, make in step.descs:
                args[pos] = make(by_tensor[key])
        if step.interpret:
            with interpreted_launch():
                step.fn[grid](*args, **step.opts)
        else:
            step.launcher(args, is_aligned)
        return grid, visits

    # ------------------------------------------------------------------ checks
    def _check(self, tensors):
        return check_inputs(self.specs[0].name, self.inputs, tensors)

    def _check_out(self, out, setup: _CallSetup) -> None:
        """Every ``out`` tensor against its output in ``setup``."""
        for k, (o, (shape, dtype)) in enumerate(zip(out, setup.steps[-1].outputs)):
            if o is not None:
                check_out_tensor(f"kernel {self.specs[0].name}: out[{k}] (output "
                                 f"{self.outputs[k].name!r})", o, shape, dtype, setup.device)


def check_out_list(name: str, outputs, out) -> None:
    """``out`` of a compiled operator's call: a list with one torch tensor (or None) per
    output."""
    import torch
    names = ", ".join(o.name for o in outputs)
    if not isinstance(out, (list, tuple)) or len(out) != len(outputs):
        got = f"{len(out)} entries" if isinstance(out, (list, tuple)) else type(out).__name__
        raise FeedError(f"kernel {name}: out must be a list with one tensor (or None) per "
                        f"output ({names}), got {got}")
    for k, o in enumerate(out):
        if o is not None and not isinstance(o, torch.Tensor):
            raise FeedError(f"kernel {name}: out[{k}] (output {outputs[k].name!r}) must be a "
                            f"torch tensor or None, got {type(o).__name__}")


def check_out_tensor(what: str, o, shape: tuple, dtype, device) -> None:
    """One ``out`` tensor against its output: shape, dtype, device; any strides, but no two
    elements in one place (every element is written once)."""
    if tuple(o.shape) != tuple(shape) or o.dtype != dtype or o.device != device:
        raise FeedError(f"{what} is a {tuple(o.shape)} {o.dtype} tensor on {o.device}; pass "
                        f"a {tuple(shape)} {dtype} tensor on {device} (or None for a new one)")
    if overlaps_itself(o):
        raise FeedError(f"{what} has strides {tuple(o.stride())}: some of its elements share "
                        "memory (an expand()ed view?); pass a tensor whose every element has "
                        "its own memory")


def overlaps_itself(t) -> bool:
    """Whether two elements of tensor ``t`` may share memory: taken by increasing stride,
    every dimension (of more than one element) must step past all that the smaller ones
    span (a stride 0 never does). Cheap; conservative for exotic interleaved layouts."""
    if t.numel() == 0:
        return False
    span = 0
    for n, s in sorted(((n, s) for n, s in zip(t.shape, t.stride()) if n > 1),
                       key=lambda d: d[1]):
        if s <= span:
            return True
        span += (n - 1) * s
    return False


def _unit_last(t) -> bool:
    """Whether ``t``'s last dimension has stride 1 (or at most one element)."""
    return t.dim() == 0 or t.shape[-1] <= 1 or t.stride(-1) == 1


def _out_strides(out) -> tuple | None:
    """The strides of the ``out`` tensors when one is not contiguous (its launch step
    writes through them), else None (the contiguous strides every step assumes)."""
    if out is None or all(o is None or o.is_contiguous() for o in out):
        return None
    return tuple(None if o is None else tuple(o.stride()) for o in out)


_FLAGS = ("even", "one")


def _multiprocessors(device) -> int:
    """The multiprocessors of a CUDA ``device``; 2 elsewhere (the interpreter runs
    programs one after another: two programs still walk more than one row block)."""
    if device.type != "cuda":
        return 2
    from ..schedule.space import device_of
    return device_of(device).sms


def flag_value(arg: tuple, sizes: dict):
    """A constexpr the launch sets from the sizes, ``(kind, length, BLOCK_N)``:
    ``"even"`` (``LOOP_EVEN``): whether the length is a multiple of BLOCK_N; ``"one"``
    (``ONE_TILE``): 2 when one tile is exactly the length, 1 when it covers a shorter
    length (masked), 0 when the loops run (codegen/source.generate)."""
    n = _value(arg[1], sizes)
    if arg[0] == "even":
        return n % arg[2] == 0
    return 2 if n == arg[2] else 1 if n < arg[2] else 0


def _value(ext, sizes: dict) -> int:
    """An extent's value: ``sizes`` maps size names to bound values."""
    return sizes[ext] if isinstance(ext, str) else int(ext)


def _shaping_sizes(specs, k: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Kernel ``k``'s sizes that shape its launch -- its rows, grid, outputs (and, for
    their strides, those of earlier kernels), tile extents -- and its size arguments."""
    spec = specs[k]
    exts = [spec.rows, *spec.grid, *spec.col_tile[:1]]
    for kk in range(k + 1):
        for _, shape, _ in specs[kk].outputs:
            exts.extend(shape)
    exts.extend(a[1] for a in spec.args if a[0] == "block_ext")
    shaping = tuple(sorted({e for e in exts if isinstance(e, str)}))
    return shaping, tuple(a[1] for a in spec.args if a[0] == "size")


def _alloc(shape, dtype: str, sizes: dict) -> tuple[tuple[int, ...], object]:
    import torch
    return tuple(_value(x, sizes) for x in shape), getattr(torch, dtype)


def _gluon_ready(spec: KernelSpec, device, tensors) -> None:
    """Refuse a Gluon kernel where it cannot run: off CUDA (the interpreter runs Triton
    only) or with a stride the copy engine cannot take."""
    from ..errors import FeedError
    if device.type != "cuda":
        raise CodegenError(f"{spec.name} was generated in the Gluon dialect "
                           "(Schedule.dialect='gluon'), which runs on CUDA GPUs of the Hopper "
                           f"class only; on {device.type} tensors use dialect='triton'")
    if not tma_strides(tensors):
        raise FeedError(f"{spec.name}: every stride but the last must be a multiple of 16 "
                        "bytes, and not 0 (a broadcast dimension), for a Gluon kernel "
                        "(Schedule.dialect='gluon': TMA loads); pass contiguous tensors or "
                        "use dialect='triton'")


def tma_strides(tensors) -> bool:
    """Whether every input's strides suit tensor descriptors: the last 1, each other a
    multiple of 16 bytes and, where the dimension has more than one element, not 0 (the
    copy engine's rules; a broadcast dimension has no box; addresses are checked per
    call)."""
    for t in tensors:
        st, size = t.stride(), t.element_size()
        if t.dim() and (st[-1] != 1 or any(x * size % 16 or (x == 0 and n > 1)
                                           for x, n in zip(st[:-1], t.shape))):
            return False
    return True
