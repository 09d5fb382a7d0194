"""The library form of a contraction (fusion/library.py) and its kernel
(runtime/library.py): which outputs qualify, and the results against float64 -- ragged
sizes, batched and transposed operands, a permuted output, float32 and bfloat16."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.bench.chains import CHAINS
from neptune_fusion.errors import UnschedulableError
from neptune_fusion.fusion.library import library_form
from neptune_fusion.runtime.auto import AutoKernel
from neptune_fusion.runtime.library import LibraryKernel
from neptune_fusion.schedule import cost as cost_model
from neptune_fusion.schedule.cost import library_estimate
from neptune_fusion.schedule.schedule import Schedule
from neptune_fusion.schedule.space import CPU, H200, Problem

LIBRARY = Schedule(strategy="library")
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _tensors(inputs, sizes: dict, dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    out = []
    for p in inputs:
        shape = [sizes[s.name] if not isinstance(s, int) else s for s in p.shape]
        out.append((torch.randn(shape, generator=g) + 0.5).to(dtype))
    return out


def _check(kernel, outs, inputs, tensors, dtype) -> None:
    got = kernel(*tensors)
    got = got[0] if isinstance(got, list) else got
    want = nf.evaluate(outs, dict(zip(inputs, [t.double().numpy() for t in tensors])))
    want = torch.as_tensor(np.asarray(want[0] if isinstance(want, list) else want))
    assert got.dtype == dtype and got.shape == want.shape
    err = float((got.double() - want).norm() / want.norm())
    assert err < TOL[dtype], err


@pytest.mark.parametrize("chain", ["rmsnorm-matmul", "layernorm-matmul", "l2norm-matmul"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_matmul_library(chain, dtype):
    outs, inputs = CHAINS[chain].build(str(dtype).removeprefix("torch."))
    form = library_form(outs)
    assert form is not None and form.a_dims == (0, 1) and form.b_dims == (0, 1)
    assert [c.name for c in form.computed] == ["y"]
    kernel = nf.compile(outs, inputs, schedule=LIBRARY, cache=False)
    assert isinstance(kernel, LibraryKernel) and not kernel.kernels   # tuned per call
    for seed, sizes in enumerate(({"N": 29, "D": 33, "K": 17}, {"N": 1, "D": 29, "K": 33})):
        _check(kernel, outs, inputs, _tensors(inputs, sizes, dtype, seed), dtype)
    assert kernel.kernels and "torch.matmul" in kernel.source


def _batched(transposed: bool, permuted: bool):
    """out[b, i, o] (or out[o, b, i]) = sum_c y[b, i, c] * W[c, o] (or W[o, c]), with
    y = x / sqrt(sum_c x^2): a batch axis the weight broadcasts along."""
    B, N, D, K = nf.sizes("B N D K")
    x = nf.placeholder((B, N, D), name="x")
    w = nf.placeholder((K, D) if transposed else (D, K), name="W")
    c = nf.reduce_axis(D, "c")
    ss = nf.compute((B, N), lambda b, i: nf.sum(x[b, i, c] * x[b, i, c], c), name="ss")
    y = nf.compute((B, N, D), lambda b, i, e: x[b, i, e] / nf.sqrt(ss[b, i]), name="y")

    def wt(cc, o):
        return w[o, cc] if transposed else w[cc, o]
    if permuted:
        out = nf.compute((K, B, N), lambda o, b, i: nf.sum(y[b, i, c] * wt(c, o), c),
                         name="out")
    else:
        out = nf.compute((B, N, K), lambda b, i, o: nf.sum(y[b, i, c] * wt(c, o), c),
                         name="out")
    return [out], [x, w]


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("permuted", [False, True])
def test_batched_transposed_permuted(transposed, permuted):
    outs, inputs = _batched(transposed, permuted)
    form = library_form(outs)
    assert form.a_dims == (0, 1, 2)
    assert form.b_dims == ((None, 1, 0) if transposed else (None, 0, 1))
    assert form.out_perm == ((2, 0, 1) if permuted else (0, 1, 2))
    kernel = nf.compile(outs, inputs, schedule=LIBRARY, cache=False)
    sizes = {"B": 3, "N": 5, "D": 33, "K": 7}
    _check(kernel, outs, inputs, _tensors(inputs, sizes, torch.float32, 7), torch.float32)
    # the output written into a given tensor (how a multi-pass kernel places it)
    tensors = _tensors(inputs, sizes, torch.float32, 8)
    shape = (7, 3, 5) if permuted else (3, 5, 7)
    target = torch.full(shape, float("nan"))
    [got] = kernel(*tensors, out=[target])
    assert got.data_ptr() == target.data_ptr()
    torch.testing.assert_close(target, kernel(*tensors)[0])


def _not_a_product():
    N, D, K = nf.sizes("N D K")
    x = nf.placeholder((N, D), name="x")
    w = nf.placeholder((D, K), name="W")
    v = nf.placeholder((D,), name="v")
    c = nf.reduce_axis(D, "c")
    u = nf.placeholder((N, K), name="u")
    three = nf.compute((N, K), lambda i, o: nf.sum(x[i, c] * w[c, o] * u[i, o], c), name="a")
    biggest = nf.compute((N, K), lambda i, o: nf.max(x[i, c] * w[c, o], c), name="b")
    shifted = nf.compute((N, K), lambda i, o: nf.sum(x[i, c] * w[c, o] + 1.0, c), name="d")
    lowp = nf.placeholder((D, K), nf.bfloat16, name="Wb")
    mixed = nf.compute((N, K), lambda i, o: nf.sum(x[i, c] * lowp[c, o], c), name="e")
    rowsum = nf.compute((N,), lambda i: nf.sum(x[i, c] * v[c], c), name="f")
    return three, biggest, shifted, mixed, rowsum


def test_what_is_not_a_product():
    for out in _not_a_product():
        assert library_form(out) is None, out.name
    assert library_form(list(_not_a_product()[:2])) is None      # two outputs
    with pytest.raises(UnschedulableError, match="strategy='library' needs an output"):
        nf.compile(_not_a_product()[0], schedule=LIBRARY, cache=False)


def test_auto_offers_the_library():
    """On the interpreter the fused kernel stays first (the library schedule is the
    fallback there); a multi-pass program whose output is a product (LayerNorm ->
    matmul) runs the product in the library; on an H200 at 4096^3 the model prices the
    library below the fused GEMM's FMA path for float32."""
    outs, inputs = CHAINS["rmsnorm-matmul"].build("float32")
    kernel = nf.compile(outs, inputs, cache=False)
    assert isinstance(kernel, AutoKernel)
    tensors = _tensors(inputs, {"N": 19, "D": 33, "K": 20}, torch.float32, 3)
    _check(kernel, outs, inputs, tensors, torch.float32)
    assert kernel.last_choice.schedule.strategy == "rolling"
    outs, inputs = CHAINS["layernorm-matmul"].build("float32")
    kernel = nf.compile(outs, inputs, cache=False)
    assert isinstance(kernel, LibraryKernel)
    _check(kernel, outs, inputs, _tensors(inputs, {"N": 19, "D": 33, "K": 20},
                                          torch.float32, 4), torch.float32)
    big = Problem(rows=4096, loop=4096, programs=1, inner=0, col=4096, itemsize=4,
                  fp32=True)
    tf32 = library_estimate(big, Schedule(strategy="library", fp32_precision="tf32"), H200)
    ieee = library_estimate(big, LIBRARY, H200)
    assert 0 < tf32.seconds < ieee.seconds
    assert library_estimate(big, LIBRARY, CPU).seconds >= 1e9


def test_schedule_field():
    assert Schedule.from_json(LIBRARY.to_json()) == LIBRARY
    with pytest.raises(nf.ScheduleError, match="splits=2 needs strategy='split'"):
        Schedule(strategy="library", splits=2).check()


def test_torch_compile_traces_it():
    outs, inputs = CHAINS["rmsnorm-matmul"].build("float32")
    kernel = nf.compile(outs, inputs, schedule=LIBRARY, cache=False)
    tensors = _tensors(inputs, {"N": 9, "D": 17, "K": 5}, torch.float32, 5)
    fn = torch.compile(lambda *t: kernel(*t)[0] * 2.0, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(fn(*tensors), kernel(*tensors)[0] * 2.0)


def test_inlined_left_side_becomes_its_own_compute():
    """RMSNorm written into the product (no named y, as a graph translated from plain
    PyTorch has it): the left side is materialised as ``out_lhs`` and the product runs
    in the library; also a weight's per-column factor stays with the left side."""
    N, D, K = nf.sizes("N D K")
    x = nf.placeholder((N, D), nf.bfloat16, name="x")
    w = nf.placeholder((D,), nf.bfloat16, name="w")
    W = nf.placeholder((D, K), nf.bfloat16, name="W")
    c, c2 = nf.reduce_axis(D, "c"), nf.reduce_axis(D, "c2")
    out = nf.compute((N, K), lambda i, o: nf.sum(nf.cast(
        nf.cast(x[i, c], nf.float32) * nf.rsqrt(nf.sum(
            nf.cast(x[i, c2], nf.float32) * nf.cast(x[i, c2], nf.float32), c2) / D + 1e-6)
        * nf.cast(w[c], nf.float32), nf.bfloat16) * W[c, o], c), name="out")
    form = library_form(out)
    assert [t.name for t in form.computed] == ["out_lhs"] and form.operands[1] is W
    kernel = nf.compile([out], [x, w, W], schedule=LIBRARY, cache=False)
    for seed, sizes in enumerate(({"N": 29, "D": 33, "K": 17}, {"N": 3, "D": 64, "K": 5})):
        _check(kernel, [out], [x, w, W], _tensors([x, w, W], sizes, torch.bfloat16, seed),
               torch.bfloat16)


def test_a_large_product_is_tuned_as_the_library_form_alone(monkeypatch):
    """On a GPU the tuner measures the library form beside fused tiles, but alone for a
    product of >= 2 * 2048^3 FLOP (fused GEMM candidates cost seconds of compile and lost
    by 1.5-4.6x at 4096^3); when the library candidate fails, the fused tiles are
    measured after all. The CUDA branch is reached with a stand-in device."""
    from types import SimpleNamespace

    from neptune_fusion.errors import CodegenError
    from neptune_fusion.runtime import auto
    from neptune_fusion.schedule import space
    from neptune_fusion.schedule.cost import library_alone
    big = Problem(rows=4096, loop=4096, programs=1, inner=0, col=4096)
    assert library_alone(big)
    assert not library_alone(Problem(rows=1024, loop=1024, programs=1, inner=0, col=1024))
    assert not library_alone(Problem(rows=4096, loop=32768, programs=1, inner=0, col=1,
                                     contraction=False))
    outs, inputs = CHAINS["rmsnorm-matmul"].build("float32")
    tensors = _tensors(inputs, {"N": 19, "D": 33, "K": 20}, torch.float32, 6)
    plain = auto.check_inputs

    def on_a_gpu(name, ins, ts):
        sizes, _ = plain(name, ins, ts)
        return sizes, SimpleNamespace(type="cuda")
    monkeypatch.setattr(auto, "check_inputs", on_a_gpu)
    monkeypatch.setattr(space, "device_of", lambda dev: H200)
    for alone, fails in ((True, False), (True, True), (False, False)):
        monkeypatch.setattr(cost_model, "LIBRARY_ALONE_FLOP", 1.0 if alone else 1e30)
        kernel = nf.compile(outs, inputs, cache=False)
        asked = []

        def measure(cands, *a, fails=fails, asked=asked):
            asked.append([c.schedule.strategy for c in cands])
            if fails and asked[-1] == ["library"]:
                raise CodegenError("every candidate schedule failed")
            return auto.Choice(cands[0].schedule, "measured")
        monkeypatch.setattr(kernel, "_measure", measure)
        kernel._choose(tensors)
        if alone and not fails:
            assert asked == [["library"]]
        elif alone:
            assert asked[0] == ["library"] and "rolling" in asked[1]
        else:
            assert len(asked) == 1 and asked[0][-1] == "library" and len(asked[0]) > 1
