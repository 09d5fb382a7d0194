"""Tile loads through tensor descriptors (``Schedule.tma``, codegen/tma.py): the generated
source, results against the float64 reference on the interpreter (which runs the
descriptor loads), the fallback to pointer loads for inputs the copy engine cannot read,
schedule validation, and the search space (which does not offer them: docs/hopper.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.runtime.pipeline import compile
from neptune_fusion.schedule.schedule import Schedule
from neptune_fusion.schedule.space import H200, Problem, candidates


def _attention(d: int, causal: bool, dtype: str = "float32"):
    """Plain attention over (N, d) queries and (M, d) keys and values, scale 1/sqrt(d)."""
    n, m = nf.sizes("N M")
    q = nf.placeholder((n, d), dtype, name="q")
    k = nf.placeholder((m, d), dtype, name="k")
    v = nf.placeholder((m, d), dtype, name="v")
    c = nf.reduce_axis(d, "c")
    s = nf.compute((n, m), lambda i, j: nf.sum(q[i, c] * k[j, c], c) * d ** -0.5, name="s")
    if causal:
        s = nf.compute((n, m), lambda i, j: nf.where(j <= i, s[i, j], -float("inf")),
                       name="sm")
    j = nf.reduce_axis(m, "j")
    mx = nf.compute((n,), lambda i: nf.max(s[i, j], j), name="mx")
    den = nf.compute((n,), lambda i: nf.sum(nf.exp(s[i, j] - mx[i]), j), name="den")
    o = nf.compute((n, d), lambda i, e: nf.sum(nf.exp(s[i, j] - mx[i]) * v[j, e], j)
                   / den[i], name="o")
    return o, [q, k, v]


def _reference(o, xs):
    return nf.evaluate(o, {n: x.double().numpy() for n, x in zip("qkv", xs)})


def _descriptor_steps(kernel) -> int:
    """Launch steps that pass ``TMA=True`` to aligned calls."""
    return sum(s.tma_at is not None for s in kernel._steps.values())


def test_source_loads_q_k_v_through_descriptors():
    o, ins = _attention(32, causal=True)
    k = compile(o, ins, block_m=16, block_n=16, tma=True)
    src = k.source
    assert "TMA: tl.constexpr" in src
    assert src.count("tl.make_tensor_descriptor(") == 3, src
    assert "tl.trans(k_desc.load(" in src and "v_desc.load(" in src
    assert src.count("if TMA:") == 3 + 1 + 2 * 2, src   # descriptors, q, k and v per loop
    plain = compile(o, ins, block_m=16, block_n=16)
    assert "TMA" not in plain.source and "make_tensor_descriptor" not in plain.source


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n,m", [(29, 33), (48, 64), (16, 16)])
def test_descriptor_loads_match_float64(causal, n, m):
    o, ins = _attention(32, causal)
    k = compile(o, ins, block_m=16, block_n=16, tma=True)
    gen = torch.Generator().manual_seed(n * 100 + m)
    xs = [torch.randn(n, 32, generator=gen), torch.randn(m, 32, generator=gen),
          torch.randn(m, 32, generator=gen)]
    got = k(*xs)
    assert _descriptor_steps(k) == 1
    np.testing.assert_allclose(got.double().numpy(), _reference(o, xs), rtol=1e-4,
                               atol=1e-5)


def test_descriptor_loads_in_half_precision():
    o, ins = _attention(32, causal=True, dtype="float16")
    k = compile(o, ins, block_m=16, block_n=16, tma=True)
    gen = torch.Generator().manual_seed(7)
    xs = [torch.randn(40, 32, generator=gen).half() for _ in range(2)] + \
        [torch.randn(40, 32, generator=gen).half()]
    got = k(*xs)
    assert _descriptor_steps(k) == 1
    ref = _reference(o, xs)
    assert np.linalg.norm(got.double().numpy() - ref) / np.linalg.norm(ref) < 5e-3


def test_inputs_the_copy_engine_cannot_read_run_the_pointer_loads():
    o, ins = _attention(32, causal=False)
    k = compile(o, ins, block_m=16, block_n=16, tma=True)
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(40, 33, generator=gen)
    q = wide[:, 1:]                         # address 4 bytes in, row stride 132 bytes
    kv = [torch.randn(24, 32, generator=gen) for _ in range(2)]
    got = k(q, *kv)
    assert _descriptor_steps(k) == 0        # the stride rule fails: TMA=False per step
    np.testing.assert_allclose(got.double().numpy(), _reference(o, [q, *kv]), rtol=1e-4,
                               atol=1e-5)
    # aligned strides but an address off by 4 bytes: TMA=False for that call only
    base = torch.randn(40 * 32 + 1, generator=gen)
    q2 = base[1:].view(40, 32)
    got = k(q2, *kv)
    assert _descriptor_steps(k) == 1
    np.testing.assert_allclose(got.double().numpy(), _reference(o, [q2, *kv]), rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("options,match", [
    (dict(warp_specialize=True), "unknown"),
    (dict(tma=True, strategy="split", splits=2), "needs strategy='rolling'"),
    (dict(tma=1), "tma must be a bool"),
])
def test_schedule_rules(options, match):
    with pytest.raises(nf.ScheduleError, match=match):
        Schedule.from_dict(options)
    s = Schedule(tma=True)
    assert Schedule.from_json(s.to_json()) == s


def test_the_search_space_offers_no_descriptors():
    # opt-in only (docs/hopper.md: measured no faster through Triton 3.6 on the H200)
    p = Problem(rows=4096, loop=4096, programs=32, inner=128, col=128)
    assert not any(s.tma for s in candidates(p, H200))


def test_a_base_with_descriptors_keeps_them_on_rolling_schedules_only():
    # decode-shaped: few rows, a long loop, so split-k candidates are in the space
    p = Problem(rows=1, loop=65536, programs=8, inner=128, col=128)
    space = candidates(p, H200, Schedule(tma=True))
    assert any(s.strategy == "split" for s in space)
    for s in space:
        assert s.check().tma == (s.strategy == "rolling")
