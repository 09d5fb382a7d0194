"""Triton's interpreter leaves ``triton.language`` as it found it after a CPU launch
(runtime/loader.interpreted_launch): a nested interpreted call patches
``triton.language.core`` without restoring it, and a GPU kernel compiled later in the
same process then failed in Triton's front end."""

from __future__ import annotations

import numpy as np
import torch

import neptune_fusion as nf


def _row_max():
    N, M = nf.sizes("N M")
    x = nf.placeholder((N, M), name="x")
    j = nf.reduce_axis(M, "j")
    return nf.compile(nf.compute((N,), lambda i: nf.max(x[i, j], j), name="m"), cache=False)


def test_a_cpu_launch_leaves_the_language_modules_unpatched():
    import triton.language as tl
    core = tl.core
    watched = [(core, "mul"), (core, "cast"), (core, "reduce"), (tl, "range"),
               (core.tensor, "__mul__"), (core.dtype, "to_ir"),
               (tl, "max"), (tl.standard, "max")]   # the JIT functions, not their twins
    before = [getattr(o, n) for o, n in watched]
    # the interpreter's patches are lambdas: none may be left by an earlier test's launch
    # (the bench's baseline FA2 kernel, launched without the restore, left them)
    assert not [n for o, n in watched if getattr(getattr(o, n), "__name__", "") == "<lambda>"]
    x = torch.tensor(np.random.default_rng(3).standard_normal((5, 37)), dtype=torch.float32)
    got = _row_max()(x)   # tl.max: an interpreted twin called from the kernel (nested)
    assert torch.equal(got, x.max(1).values)
    assert [getattr(o, n) for o, n in watched] == before


def test_a_gpu_kernel_compiles_after_a_cpu_launch():
    """The symptom: ``tensor * 2`` in a kernel compiled for sm_90 (no GPU needed) went
    through the interpreter's semantics after a CPU launch. Under Triton 3.6 (the H200
    machine's), whose ``tensor.__mul__`` calls ``core.mul``, this failed without the
    restore; 3.9's calls the semantics directly (the test above covers it there)."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget

    from neptune_fusion.settings import triton_interpret_as
    _row_max()(torch.randn(3, 20))

    with triton_interpret_as(False):   # a kernel for the GPU, whatever the suite set before
        @triton.jit
        def double(x_ptr, y_ptr, n, B: tl.constexpr):
            o = tl.program_id(0) * B + tl.arange(0, B)
            tl.store(y_ptr + o, tl.load(x_ptr + o, mask=o < n) * 2.0, mask=o < n)

    src = triton.compiler.ASTSource(double, {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32",
                                             "B": "constexpr"}, {"B": 64})
    assert "mul" in triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ttir"]
