"""The benchmark operators through the generated kernel (Triton interpreter on CPU).

Each case runs the harness entry point :func:`neptune_fusion.ops.attention` with the
benchmark's own semantics and compares with its float64 reference
(:func:`neptune_fusion.bench.reference.reference_attention`) by relative Frobenius error.
Head counts are scaled down (same ratios); the window shrinks with the sequence.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from neptune_fusion import ops
from neptune_fusion.bench.reference import reference_attention
from neptune_fusion.codegen.visits import tile_visits
from neptune_fusion.frontend.attention import AttentionCache
from neptune_fusion.runtime.pipeline import compile as nf_compile
from neptune_fusion.schedule.schedule import Schedule

TOL = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}
SMALL = Schedule(block_m=32, block_n=16)


HEADS = {1: (2, 2), 2: (4, 2), 4: (4, 1), 8: (8, 1)}  # group size -> (q heads, kv heads)


def small(name: str, head_dim: int, window: int = 24):
    op = ops.OPERATORS[name]
    hq, hkv = HEADS[op.q_heads // op.kv_heads]
    return dataclasses.replace(op, q_heads=hq, kv_heads=hkv, head_dim=head_dim,
                               window=window if op.window else None)


def inputs(op, seq: int, dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    n = op.q_len(seq)
    mk = lambda h, s: torch.randn(1, h, s, op.head_dim, generator=g).to(dtype)  # noqa: E731
    return mk(op.q_heads, n), mk(op.kv_heads, seq), mk(op.kv_heads, seq)


def run_op(op, q, k, v, cache, schedule=SMALL):
    seq = k.shape[2]
    return ops.attention(q, k, v, scale=op.scale, causal=op.causal, q_start=op.q_start(seq),
                         alibi_slopes=op.alibi_slopes(), softcap=op.softcap, window=op.window,
                         cache=cache, schedule=schedule)


def rel_err(got, want) -> float:
    return float((got.double() - want).norm() / want.norm())


CASES = [(name, torch.float16, 64, 77) for name in ops.PREFILL] + \
        [(name, torch.float32, 64, 50) for name in ops.PREFILL] + \
        [(name, torch.bfloat16, 64, 61) for name in ("PF-Causal", "PF-GQA", "PF-SoftCap")] + \
        [(name, torch.float16, 128, 40) for name in ("PF-Global", "PF-ALiBi", "PF-Window")] + \
        [(name, torch.float16, 64, 70) for name in ops.DECODE]


@pytest.mark.parametrize("name, dtype, head_dim, seq", CASES,
                         ids=[f"{c[0]}-{str(c[1])[6:]}-d{c[2]}-s{c[3]}" for c in CASES])
def test_operator_matches_float64_reference(name, dtype, head_dim, seq):
    op = small(name, head_dim)
    q, k, v = inputs(op, seq, dtype, seed=seq + head_dim)
    cache = AttentionCache()
    got = run_op(op, q, k, v, cache)
    assert got.dtype == dtype and got.shape == q.shape
    err = rel_err(got, reference_attention(op, q, k, v))
    assert err < TOL[dtype], f"{name} {dtype}: relative error {err:.2e}"
    assert len(cache) == 1
    (kernel,) = cache.kernels()
    assert len(kernel.kernels) == 1  # one generated kernel, one launch


def test_default_schedule_and_named_operators():
    op = small("PF-SoftCap", 128, window=None)
    q, k, v = inputs(op, 37, torch.float16, seed=1)
    want = reference_attention(op, q, k, v)
    assert rel_err(run_op(op, q, k, v, AttentionCache(), schedule=None), want) < 5e-3
    assert rel_err(ops.pf_softcap(q, k, v, cache=AttentionCache()), want) < 5e-3
    dc = small("DC-GQA", 64)
    q, k, v = inputs(dc, 45, torch.float16, seed=2)
    assert rel_err(ops.dc_gqa(q, k, v, cache=AttentionCache()),
                   reference_attention(dc, q, k, v)) < 5e-3


def _brute_force_live(op, n, m, i0, i1, t, bn):
    """(any, all) of the mask over rows [i0, i1] x keys [t, t + bn) within the axis."""
    cells = []
    for i in range(i0, i1 + 1):
        for j in range(t, min(t + bn, m)):
            ok = (not op.causal or j <= i) and (op.window is None or i - j < op.window)
            cells.append(ok)
    return any(cells), all(cells) and t + bn <= m


@pytest.mark.parametrize("name", ["PF-Global", "PF-Causal", "PF-Window"])
@pytest.mark.parametrize("bm, bn", [(32, 16), (16, 32)])
def test_masked_out_tiles_are_never_visited(name, bm, bn):
    op = small(name, 64)
    [o], ins = ops.definition(name, "float16", 64, op.q_heads, op.kv_heads)
    if op.window is not None:  # the definition's window is 4096; use the small one
        from neptune_fusion.frontend.attention import AttentionSpec, attention_definition
        [o], ins = attention_definition(AttentionSpec(
            "float16", op.q_heads, op.kv_heads, 64, 64, op.scale,
            mask_mod=ops.SlidingWindow(op.window)))
    kernel = nf_compile(o, ins, block_m=bm, block_n=bn, count_visits=True)
    seq = 77
    q, k, v = inputs(op, seq, torch.float16, seed=3)
    launch = kernel.launch(q, k, v)
    assert rel_err(launch.outputs[0], reference_attention(op, q, k, v)) < 5e-3
    sizes = {s: {"B": 1, "N": seq, "M": seq}[s.name] for s in kernel.program.sizes}
    host = tile_visits(kernel.program, sizes)
    assert launch.visits.tolist() == [list(x) for x in host]
    heads = launch.grid[1]
    for pid, (masked, interior) in enumerate(host):
        i0 = (pid // heads) * bm
        i1 = min(i0 + bm, seq) - 1
        live = [_brute_force_live(op, seq, seq, i0, i1, t, bn) for t in range(0, seq, bn)]
        assert masked + interior == sum(a for a, _ in live)  # no dead tile is visited
        assert interior == sum(f for _, f in live)           # every full tile runs unmasked
