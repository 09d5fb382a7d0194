"""The split-k combine guards a split past the end of the key axis only where its stored
(initial) state would not merge as the identity (``codegen/split.combine_steps``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion import ops
from neptune_fusion.codegen.program import SPLIT_ID
from neptune_fusion.codegen.split import combine_steps
from neptune_fusion.frontend.attention import AttentionCache
from neptune_fusion.ir.nodes import Binary, Where
from neptune_fusion.ir.traverse import walk
from neptune_fusion.schedule.schedule import Schedule

# 64 keys in 16-key tiles over 7 splits: chunks of 16, so splits 4, 5 and 6 are empty
SPLIT7 = Schedule(block_m=16, block_n=16, num_warps=4, strategy="split", splits=7)


def _chunk_test(cond) -> bool:
    """``split_id * chunk < n``: the test whether a split's chunk starts inside the axis."""
    return isinstance(cond, Binary) and cond.op == "lt" and isinstance(cond.a, Binary) \
        and cond.a.op == "mul" and cond.a.a == SPLIT_ID


def _guarded(kernel) -> list[bool]:
    """Per merged state of the combine: whether its new value tests the split's chunk."""
    [prog] = [g.program for g in kernel.kernels if g.program.split.stage == "combine"]
    out = []
    for group in combine_steps(prog):
        for _, new in group:
            out.append(any(isinstance(x, Where) and _chunk_test(x.cond) for x in walk(new)))
    return out


def test_attention_merges_every_split_unguarded():
    """max, then sum and weighted sum repaired linearly: an empty split's -inf, 0 and 0
    merge as the identity, so no state is guarded; the result matches float64."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 32, generator=g) for n in (1, 64, 64))
    cache = AttentionCache(store=False)
    out = ops.attention(q, k, v, scale=0.25, causal=True, q_start=63, cache=cache,
                        schedule=SPLIT7)
    [kern] = cache.kernels()
    assert _guarded(kern) == [False, False, False]
    ref = torch.softmax((q.double() @ k.double().transpose(-1, -2)) * 0.25, -1) @ v.double()
    assert (out.double() - ref).abs().max().item() < 1e-5


@pytest.mark.parametrize("n", [64, 29])
def test_augmented_consumer_keeps_the_guard(n):
    """sum_j (x - max_j x)^2 carries (count, linear, square) states whose repairs mix
    components: empty splits stay guarded and the result still matches float64 (29
    keys: the last non-empty chunk is ragged)."""
    N, M = nf.sizes("N M")
    x = nf.placeholder((N, M), name="x")
    j = nf.reduce_axis(M, "j")
    m = nf.compute((N,), lambda i: nf.max(x[i, j], j), name="m")
    s = nf.compute((N,), lambda i: nf.sum((x[i, j] - m[i]) * (x[i, j] - m[i]), j), name="s")
    kern = nf.compile(s, schedule=SPLIT7)
    t = torch.randn(3, n, generator=torch.Generator().manual_seed(n))
    got = kern(t)
    want = nf.evaluate(s, {"x": t.double().numpy()})
    assert np.allclose(got.double().numpy(), want, rtol=1e-5)
    flags = _guarded(kern)
    assert flags[0] is False and any(flags[1:])
