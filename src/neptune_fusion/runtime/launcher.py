"""One generated Triton kernel on one grid, launched without Triton's per-call dispatch.

``fn[grid](*args)`` binds and specialises every argument, hashes the specialisation and
looks the compiled kernel up on every call. For a decode call (two launches of kernels
that run for a few tens of microseconds) that dispatch was the largest host cost
(benchmarks/results/2026-11-30-h200-eager). A :class:`Launcher` belongs to one launch
plan, whose integer arguments are fixed by the input signature, so once it knows the
compiled kernel it launches it directly -- on the current device and stream, with
Triton's launch hooks, as ``fn[grid]`` does -- through :func:`direct_runner`: the compiled
kernel's C launch function called with everything fixed per plan bound once (grid,
function handle, packed metadata), only the stream and the arguments per call. The one
specialisation the signature does not fix is the tensors' 16-byte alignment (Triton
compiles an aligned and an unaligned variant); callers say whether every tensor is
aligned, and only aligned calls take the direct path (the kernel kept is the aligned
variant). ``NEPTUNE_FUSION_DIRECT_LAUNCH=0`` (read when the launcher is made) keeps every
launch on Triton's dispatcher.

The call setups of one kernel share their compiled kernels by a ``key``: the values of
every non-tensor argument, except that a symbolic size counts only by whether it fits
32 bits -- and, for a size Triton specialises on, whether it is 1 and a multiple of 16.
Generated kernels specialise on no size but the output column's extent
(``do_not_specialize``, codegen/source.unspecialized_sizes), so two plans with one key are
given the same compiled kernel by Triton; a decode loop whose key length grows by one per
step therefore dispatches once, not once per step.

On the direct path a split-k workspace (the partial states one kernel writes and the next
reads) is one allocation: the launcher reads a pointer argument through ``data_ptr()``,
so an :class:`Address` inside one buffer stands in for each workspace tensor.
"""

from __future__ import annotations

from contextlib import contextmanager

from ..settings import direct_launch

_ALIGN = 16  # Triton specialises pointer arguments on divisibility by 16 bytes
_SCRATCH_ALIGN = 256  # each workspace tensor's offset inside the shared buffer

# where a kernel argument's value comes from in an argument list (kernel.py builds them,
# prepared.py binds them), and the list's key of the visit-count tensor
ARG_CONST, ARG_TENSOR, ARG_SIZE = 0, 1, 2
VISITS = "visits"


def aligned(tensors) -> bool:
    """Whether every tensor's address is a multiple of 16 bytes."""
    return all(t.data_ptr() % _ALIGN == 0 for t in tensors)


class Launcher:
    """Launch ``fn`` on ``grid`` with ``opts`` (``num_warps``, ``num_stages``) on the
    current stream of CUDA device ``device_index``."""

    __slots__ = ("fn", "grid", "opts", "direct", "shared", "key", "allow_direct", "stream")

    def __init__(self, fn, grid: tuple[int, ...], opts: dict, shared: dict | None = None,
                 key=None, device_index: int | None = None) -> None:
        self.fn = fn
        self.grid = grid
        self.opts = opts
        self.direct = None  # the bound launch (direct_runner) for this grid, once known
        self.shared = {} if shared is None else shared  # key -> compiled kernel
        self.key = key
        self.allow_direct = direct_launch()
        self.stream = stream_getter(device_index)   # () -> the current raw stream

    def __call__(self, args: list, is_aligned: bool) -> None:
        is_aligned = is_aligned and self.allow_direct
        if is_aligned:
            if self.direct is None and self.key in self.shared:
                self.direct = direct_runner(self.shared[self.key], self.grid)
            if self.direct is not None:
                self.direct(args, self.stream())
                return
        with scratch_allocator():
            compiled = self.fn[self.grid](*args, **self.opts)
        if is_aligned and self.direct is None:
            self.direct = direct_runner(compiled, self.grid)
            if self.direct is not None:
                self.shared[self.key] = compiled

    @property
    def path(self) -> str:
        """How an aligned launch goes now: the bound launch's path (see
        :func:`direct_runner`), or ``"dispatch"`` (Triton's ``fn[grid](...)``)."""
        return "dispatch" if self.direct is None else self.direct.path


def stream_getter(device_index: int | None):
    """``() -> int``: the current raw CUDA stream of ``device_index`` (None: the current
    device), looked up as Triton's own launches look it up (its driver uses torch's
    raw-stream getter)."""
    import torch
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get is None:   # an older torch: what Triton falls back to
        return lambda: torch.cuda.current_stream(device_index).cuda_stream
    if device_index is None:
        return lambda: get(torch.cuda.current_device())
    return lambda: get(device_index)


def reuse_key(kinds, values) -> tuple:
    """The key under which call setups share a compiled kernel: the non-tensor argument
    ``values`` with each symbolic size reduced to what Triton distinguishes: for an
    unspecialised one (kind ``"size"``) whether it fits 32 bits, for a specialised one
    (kind ``"specialized"``) also whether it is 1 and whether a multiple of 16."""
    def key(kind, v):
        fits = -2 ** 31 <= v < 2 ** 31 if kind in ("size", "specialized") else None
        if kind == "size":
            return ("size", fits)
        if kind == "specialized":
            return ("size", fits, v == 1, v % 16 == 0)
        return (kind, v)
    return tuple(key(kind, v) for kind, v in zip(kinds, values))


def direct_runner(compiled, grid: tuple[int, ...]):
    """A launch of Triton's ``compiled`` kernel on ``grid``: ``run(args, stream)``, with
    ``run.path`` naming how it launches; None when ``compiled`` is not a compiled kernel.

    ``args`` are the kernel's arguments as ``fn[grid](*args)`` takes them (constexprs
    included; a pointer may be a plain address). Everything fixed per launch is resolved
    here, once: the grid, the function handle, the packed metadata and the launcher. Per
    call the bound launch reads Triton's launch hooks and builds launch metadata only when
    a hook is set, as Triton does. Three paths, the first that applies (detected once):

    * ``"raw"``: the C launch function of the kernel's launcher, called with the
      argument layout of the Triton version it recognises (:func:`launch_layout`),
      when the launcher needs no per-launch scratch (no global or profile scratch, no
      sanitizer): what ``CompiledKernel.__getitem__``'s runner and ``CudaLauncher``
      would do, minus their Python;
    * ``"run"``: the kernel's launcher object with the calling convention of Triton's
      ``JITFunction.run`` (the same in every version read): it allocates scratch;
    * ``"runner"``: ``compiled[grid]``, Triton's own runner, given the stream.
    """
    if compiled is None or not hasattr(type(compiled), "__getitem__") \
            or not hasattr(compiled, "function"):
        return None
    grid = tuple(grid) + (1,) * (3 - len(grid))
    runner = compiled[grid]   # loads the module: .function and .run exist from here on
    bound = _bind_raw(compiled, grid) or _bind_run(compiled, grid)
    if bound is not None:
        return bound

    def run(args, stream):
        runner(*args, stream=stream)
    run.path = "runner"
    return run


# launcher __call__ parameters (after self) -> the layout of its C launch function's
# arguments; "flat" only for the Triton versions read (its inner layout changed before)
_CALL_PARAMS = {
    ("gridX", "gridY", "gridZ", "stream", "function", "kernel_metadata", "launch_metadata",
     "launch_enter_hook", "launch_exit_hook", "args"): "tuple",     # Triton 3.9
    ("gridX", "gridY", "gridZ", "stream", "function", "args"): "flat",  # Triton 3.6
}
_FLAT_VERSIONS = ("3.6.",)
_LAYOUT_ATTRS = {"tuple": ("arg_annotations", "kernel_signature"), "flat": ()}


def launch_layout(launcher, version: str) -> str | None:
    """The argument layout of ``launcher.launch`` (the C launch function of a Triton
    ``CudaLauncher``), recognised from the parameters of the launcher's ``__call__`` and
    its attributes; None when not recognised (then the launch goes through Triton).

    * ``"tuple"`` (Triton 3.9): ``launch(gx, gy, gz, stream, function, cooperative, pdl,
      packed_metadata, launch_metadata, enter_hook, exit_hook, global_scratch,
      profile_scratch, arg_annotations, kernel_signature, args)``, ``args`` one sequence;
    * ``"flat"`` (Triton 3.6): ``launch(gx, gy, gz, stream, function, cooperative, pdl,
      global_scratch, profile_scratch, packed_metadata, launch_metadata, enter_hook,
      exit_hook, *args)``.
    """
    import inspect
    call = vars(type(launcher)).get("__call__")   # its own, not inherited
    try:
        params = tuple(inspect.signature(call).parameters)[1:]
    except (TypeError, ValueError):
        return None
    layout = _CALL_PARAMS.get(params)
    if layout == "flat" and not version.startswith(_FLAT_VERSIONS):
        return None
    needed = ("launch", "global_scratch_size", "profile_scratch_size",
              "launch_cooperative_grid", "launch_pdl")
    if layout is None or not all(hasattr(launcher, a)
                                 for a in needed + _LAYOUT_ATTRS[layout]):
        return None
    return layout


def _hooks():
    """``() -> (enter, exit)``: Triton's launch hooks, each None when none is set (an
    empty hook chain counts as none: Triton 3.6 and 3.9 keep one by default)."""
    from triton import knobs
    rt = knobs.runtime
    chain = getattr(knobs, "HookChain", None)

    def hooks():
        enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
        if enter is not None and type(enter) is chain and not enter.calls:
            enter = None
        if leave is not None and type(leave) is chain and not leave.calls:
            leave = None
        return enter, leave
    return hooks


def _bind_raw(compiled, grid: tuple[int, int, int]):
    """The ``"raw"`` path of :func:`direct_runner`, or None where it does not apply."""
    import triton
    try:
        launcher = compiled.run
        fn, meta = compiled.function, compiled.packed_metadata
    except AttributeError:
        return None
    layout = launch_layout(launcher, getattr(triton, "__version__", ""))
    if layout is None or launcher.global_scratch_size or launcher.profile_scratch_size \
            or getattr(launcher, "gsan_enabled", False):
        return None
    raw, hooks, metadata = launcher.launch, _hooks(), compiled.launch_metadata
    gx, gy, gz = grid
    coop, pdl = launcher.launch_cooperative_grid, launcher.launch_pdl
    if layout == "tuple":
        notes, ksig = launcher.arg_annotations, launcher.kernel_signature

        def run(args, stream):
            enter, leave = hooks()
            if enter is None and leave is None:
                raw(gx, gy, gz, stream, fn, coop, pdl, meta, None, None, None, None, None,
                    notes, ksig, args)
            else:
                raw(gx, gy, gz, stream, fn, coop, pdl, meta,
                    metadata(grid, stream, *args), enter, leave, None, None, notes, ksig,
                    args)
    else:
        def run(args, stream):
            enter, leave = hooks()
            if enter is None and leave is None:
                raw(gx, gy, gz, stream, fn, coop, pdl, None, None, meta, None, None, None,
                    *args)
            else:
                raw(gx, gy, gz, stream, fn, coop, pdl, None, None, meta,
                    metadata(grid, stream, *args), enter, leave, *args)
    run.path = f"raw ({layout} layout)"
    return run


def _bind_run(compiled, grid: tuple[int, int, int]):
    """The ``"run"`` path of :func:`direct_runner`, or None where it does not apply."""
    try:
        from triton import knobs
    except ImportError:   # a Triton without knobs: its runner
        return None
    try:
        launcher, fn = compiled.run, compiled.function
        meta, metadata = compiled.packed_metadata, compiled.launch_metadata
    except AttributeError:
        return None
    rt = knobs.runtime
    gx, gy, gz = grid

    def run(args, stream):
        launcher(gx, gy, gz, stream, fn, meta, metadata(grid, stream, *args),
                 rt.launch_enter_hook, rt.launch_exit_hook, *args)

    if getattr(launcher, "global_scratch_size", 0):   # device-side tensor descriptors
        plain = run

        def run(args, stream):
            with scratch_allocator():
                plain(args, stream)
    run.path = "run"
    return run


def _torch_scratch(size: int, alignment: int, stream):
    import torch
    return torch.empty(size, dtype=torch.uint8, device="cuda")   # the current device


@contextmanager
def scratch_allocator():
    """Within it, Triton's launch-time allocator (the global scratch a kernel with
    device-side tensor descriptors needs: codegen/tma.py) is torch's caching allocator,
    unless the caller has set one of their own. Scoped (Triton keeps it in a context
    variable), so nothing outside the launches changes."""
    try:
        from triton.runtime import _allocation
        var, null = _allocation._allocator, _allocation.NullAllocator
    except (ImportError, AttributeError):   # a Triton without launch-time allocation
        yield
        return
    if not isinstance(var.get(), null):
        yield
        return
    token = var.set(_torch_scratch)
    try:
        yield
    finally:
        var.reset(token)


class Address:
    """A device address where a compiled kernel's launcher takes a tensor."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


def scratch_layout(outputs) -> tuple[tuple[int, ...], int]:
    """Byte offsets of ``outputs`` ((shape, torch dtype) pairs) packed into one buffer,
    each at a multiple of 256 bytes, and the buffer's size."""
    offsets, total = [], 0
    for shape, dtype in outputs:
        offsets.append(total)
        n = dtype.itemsize
        for x in shape:
            n *= x
        total += -(-n // _SCRATCH_ALIGN) * _SCRATCH_ALIGN
    return tuple(offsets), total
