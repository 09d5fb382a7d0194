"""The bound launch of a compiled kernel (runtime/launcher.py ``direct_runner``) against
stand-ins for Triton's compiled-kernel objects of the two launcher layouts read (Triton
3.6: the C launch function takes the kernel arguments flat; 3.9: as one sequence, with
argument annotations). Each stand-in's runner and launcher pass arguments on as that
Triton version's do, and its C launch function records its arguments: the bound launch
must hand the C function exactly what Triton's own runner would, except that idle hooks
(an empty hook chain) go as None with no launch metadata built."""

from __future__ import annotations

import pytest
from triton import knobs

from neptune_fusion.runtime import launcher as launcher_mod
from neptune_fusion.runtime.launcher import direct_runner, launch_layout


class Launcher36:
    """Triton 3.6's CudaLauncher interface: scratch first, then the rest flat."""

    launch_cooperative_grid, launch_pdl = False, True
    global_scratch_size = profile_scratch_size = 0

    def __init__(self, log):
        self.launch = lambda *a: log.append(a)

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        scratch = "scratch" if self.global_scratch_size else None
        self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid,
                    self.launch_pdl, scratch, None, *args)


class Launcher39:
    """Triton 3.9's CudaLauncher interface: metadata and hooks named, arguments last as
    one sequence after their annotations and the packed kernel signature."""

    launch_cooperative_grid, launch_pdl = True, False
    global_scratch_size = profile_scratch_size = 0
    arg_annotations, kernel_signature = ("ann",), b"sig"

    def __init__(self, log):
        self.launch = lambda *a: log.append(a)

    def __call__(self, gridX, gridY, gridZ, stream, function, kernel_metadata,
                 launch_metadata, launch_enter_hook, launch_exit_hook, *args):
        scratch = "scratch" if self.global_scratch_size else None
        self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid,
                    self.launch_pdl, kernel_metadata, launch_metadata, launch_enter_hook,
                    launch_exit_hook, scratch, None, self.arg_annotations,
                    self.kernel_signature, args)


class Compiled:
    """A compiled kernel: handle, packed metadata, launcher, and Triton's runner."""

    function = 0xF00
    packed_metadata = (4, 1, 1024)

    def __init__(self, launcher_cls):
        self.log = []
        self.run = launcher_cls(self.log)

    def launch_metadata(self, grid, stream, *args):
        return {"grid": grid, "stream": stream, "args": args}

    def __getitem__(self, grid):
        def runner(*args, stream=None):
            self.run(grid[0], grid[1], grid[2], stream, self.function, self.packed_metadata,
                     self.launch_metadata(grid, stream, *args),
                     knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *args)
        return runner


def _idle(entry: tuple) -> tuple:
    """A recorded launch with empty hook chains as None (and, 3.9, the arguments as a
    tuple: the C function takes any sequence there)."""
    chain = knobs.HookChain
    return tuple(None if type(x) is chain and not x.calls else
                 tuple(x) if type(x) is list else x for x in entry)


ARGS = [0x7000, 0x8000, 17, 4096, True]   # two addresses, sizes, a constexpr


@pytest.mark.parametrize("cls,layout", [(Launcher36, "flat"), (Launcher39, "tuple")])
def test_bound_launch_hands_the_c_launcher_what_tritons_runner_does(cls, layout,
                                                                    monkeypatch):
    import triton
    monkeypatch.setattr(triton, "__version__", "3.6.0" if cls is Launcher36 else "3.9.0")
    compiled = Compiled(cls)
    run = direct_runner(compiled, (4, 2))
    assert run.path == f"raw ({layout} layout)"
    run(ARGS, 77)
    compiled[(4, 2, 1)](*ARGS, stream=77)
    ours, triton_s = map(_idle, compiled.log)
    want = list(triton_s)
    meta_at = 8 if layout == "tuple" else 10        # where launch metadata goes
    assert want[meta_at + 1] is None and want[meta_at + 2] is None   # idle hooks
    want[meta_at] = None                            # no metadata built for idle hooks
    assert ours == tuple(want)
    assert ours[:5] == (4, 2, 1, 77, 0xF00)


@pytest.mark.parametrize("cls", [Launcher36, Launcher39])
def test_a_set_hook_gets_the_launch_metadata(cls, monkeypatch):
    import triton
    monkeypatch.setattr(triton, "__version__", "3.6.1" if cls is Launcher36 else "3.9.0")
    seen = []
    compiled = Compiled(cls)
    run = direct_runner(compiled, (3,))
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        run(ARGS, 5)
        compiled[(3, 1, 1)](*ARGS, stream=5)
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    ours, triton_s = map(_idle, compiled.log)
    assert ours == triton_s   # the enter hook and its metadata, as Triton passes them
    assert {"grid": (3, 1, 1), "stream": 5, "args": tuple(ARGS)} in ours


def test_an_unread_layout_or_scratch_goes_through_the_launcher_object(monkeypatch):
    import triton
    monkeypatch.setattr(triton, "__version__", "3.4.0")   # flat, but not a version read
    assert launch_layout(Launcher36([]), "3.4.0") is None
    assert launch_layout(Launcher36([]), "3.6.0") == "flat"
    assert launch_layout(Launcher39([]), "3.4.0") == "tuple"   # recognised by its names
    for compiled in (Compiled(Launcher36), Compiled(Launcher39)):
        if isinstance(compiled.run, Launcher39):
            compiled.run.global_scratch_size = 128   # scratch per launch: Triton allocates
        run = direct_runner(compiled, (2, 2))
        assert run.path == "run"
        run(ARGS, 9)
        compiled[(2, 2, 1)](*ARGS, stream=9)
        assert compiled.log[0] == compiled.log[1]


def test_without_a_launcher_object_tritons_runner_is_used():
    log = []

    class Bare:
        function = 1

        def __getitem__(self, grid):
            return lambda *args, stream=None: log.append((grid, args, stream))

    run = direct_runner(Bare(), (8,))
    assert run.path == "runner"
    run([1, 2], 3)
    assert log == [((8, 1, 1), (1, 2), 3)]
    assert direct_runner(None, (1,)) is None


def test_the_launcher_uses_its_bound_launch_and_says_which(monkeypatch):
    import triton
    monkeypatch.setattr(triton, "__version__", "3.9.0")
    monkeypatch.setattr(launcher_mod, "stream_getter", lambda index: (lambda: 42))
    compiled = Compiled(Launcher39)

    class Jit:
        def __getitem__(self, grid):
            return lambda *args, **opts: compiled

    la = launcher_mod.Launcher(Jit(), (4, 2), {}, device_index=0)
    assert la.path == "dispatch"
    la(ARGS, is_aligned=True)     # dispatched (the fake dispatch launches nothing)
    assert la.path == "raw (tuple layout)" and compiled.log == []
    la(ARGS, is_aligned=True)
    assert compiled.log[0][:4] == (4, 2, 1, 42) and list(compiled.log[0][-1]) == ARGS
