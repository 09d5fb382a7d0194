"""The direct launch path (runtime/launcher.py) with a stand-in for Triton's objects.

CPU CI has no compiled kernels, so a fake JIT function records which path each launch
took: Triton's dispatch (``fn[grid](...)``, which compiles and returns the compiled
kernel) or the compiled kernel's own launcher. On the GPU the same logic is exercised by
``benchmarks/host_overhead.py`` (outputs checked against float64 on both paths).
"""

from __future__ import annotations

import pytest
import torch

from neptune_fusion.runtime import launcher as launcher_mod
from neptune_fusion.runtime.launcher import (
    Address,
    Launcher,
    aligned,
    direct_runner,
    reuse_key,
    scratch_layout,
)


@pytest.fixture(autouse=True)
def _no_cuda_stream(monkeypatch):
    """No CUDA here: launchers look the current stream up as 0."""
    monkeypatch.setattr(launcher_mod, "stream_getter", lambda index: (lambda: 0))


class FakeCompiled:
    function = object()

    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):   # Triton's runner: no .run, so direct_runner uses it
        return lambda *args, stream=None: self.log.append(("direct", grid, args))


class FakeJit:
    def __init__(self):
        self.log = []

    def __getitem__(self, grid):
        def run(*args, **opts):
            self.log.append(("dispatch", grid, args, opts))
            return FakeCompiled(self.log)
        return run


def test_dispatch_first_then_direct_only_when_aligned():
    fn = FakeJit()
    la = Launcher(fn, (4, 2), {"num_warps": 4})
    la([1, 2], is_aligned=False)          # unaligned: Triton's dispatch, nothing kept
    assert la.direct is None
    la([1, 2], is_aligned=True)           # aligned: dispatch once, keep the launcher
    la([3, 4], is_aligned=True)           # then direct, on a 3-d grid
    la([5, 6], is_aligned=False)          # unaligned again: dispatch (its own variant)
    assert [e[0] for e in fn.log] == ["dispatch", "dispatch", "direct", "dispatch"]
    assert fn.log[2] == ("direct", (4, 2, 1), (3, 4))
    assert fn.log[3][3] == {"num_warps": 4}


def test_no_direct_launcher_without_a_compiled_kernel():
    assert direct_runner(None, (1,)) is None
    assert direct_runner(object(), (1,)) is None


def test_aligned():
    base = torch.empty(64, dtype=torch.float16)
    assert aligned([base, base[8:]])       # 16 bytes in
    assert not aligned([base, base[1:]])   # 2 bytes in


def test_scratch_layout_packs_at_256_byte_offsets():
    offsets, total = scratch_layout([((16, 8, 8), torch.float32),     # 4096 bytes
                                     ((3,), torch.float16),           # 6 -> 256
                                     ((16, 8, 8, 128), torch.float32)])
    assert offsets == (0, 4096, 4352) and total == 4352 + 16 * 8 * 8 * 128 * 4
    assert Address(4096).data_ptr() == 4096


def test_plans_with_one_key_share_the_compiled_kernel():
    fn, shared = FakeJit(), {}
    first = Launcher(fn, (4, 2), {}, shared, ("k", 1))
    first([1], is_aligned=True)              # dispatch, compiled kernel shared
    other = Launcher(fn, (8, 2), {}, shared, ("k", 1))   # another plan, same key
    other([2], is_aligned=True)              # straight to the compiled kernel
    third = Launcher(fn, (4, 2), {}, shared, ("k", 2))   # another key: dispatched
    third([3], is_aligned=True)
    assert [e[0] for e in fn.log] == ["dispatch", "direct", "dispatch"]
    assert fn.log[1] == ("direct", (8, 2, 1), (2,))


def test_reuse_key_keeps_values_but_only_the_width_of_sizes():
    kinds = ("stride", "size", "block")
    assert reuse_key(kinds, (128, 16384, 64)) == reuse_key(kinds, (128, 16385, 64))
    assert reuse_key(kinds, (128, 16384, 64)) != reuse_key(kinds, (128, 2 ** 31, 64))
    assert reuse_key(kinds, (128, 5, 64)) != reuse_key(kinds, (256, 5, 64))
