"""neptune_fusion.distributed on gloo: 2 and 3 spawned CPU processes (bounded time), each
result against float64 attention on the concatenated data; then in-process checks (a
group of one, the merge of (o, lse) states, the host's hidden-chunk test)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dist_workers as W  # noqa: E402

import neptune_fusion as nf  # noqa: E402
from neptune_fusion import ops  # noqa: E402
from neptune_fusion.distributed import (  # noqa: E402
    DistributedError,
    as_partial,
    layout_segments,
    merge_stacked,
    merge_states,
    ring_attention,
    shard,
    sharded_decode,
)
from neptune_fusion.distributed.positions import hidden, position_buffer  # noqa: E402
from neptune_fusion.distributed.states import merge_flat, pack  # noqa: E402
from neptune_fusion.frontend.attention import AttentionSpec, attention_definition  # noqa: E402


@pytest.mark.parametrize("scenario,world", [("two", 2), ("three", 3)])
def test_gloo_ranks(scenario, world, tmp_path):
    results = W.spawn(scenario, world, tmp_path)
    assert len(results) == world
    failed = {f"rank {r} {name}": res for r, got in enumerate(results)
              for name, res in got.items() if res != "ok"}
    assert not failed, "\n".join(f"{k}:\n{v}" for k, v in failed.items())
    assert set(results[0]) == {name for name, _ in W.SCENARIOS[scenario]}


def test_group_of_one_is_attention():
    """No torch.distributed: a group of one, no communication; equals the reference."""
    q, k, v = W.data(7, 1, 23)
    o, lse = sharded_decode(q, k[:, :, 5:], v[:, :, 5:], kv_offset=5, enable_gqa=True,
                            mask_mod=ops.SlidingWindow(10), return_lse=True)
    want_o, want_lse = W.reference(q[:, :, :], k, v, 22, causal=True, window=10)
    W.close(o, want_o, "decode o")
    W.close(lse, want_lse, "decode lse")
    q, k, v = W.data(8, 13, 13)
    o = ring_attention(q, k, v, enable_gqa=True, mask_mod=ops.Causal(),
                       score_mod=ops.Alibi(W.HQ))
    W.close(o, W.reference(q, k, v, 0, causal=True, alibi=True)[0], "ring o")


def test_merge_states_is_the_derived_merge(rng):
    """The closed form equals merge_partials with the attention plan on (o, lse) states,
    rows no shard saw included; and it is attention over the concatenated keys."""
    q, k, v = W.data(9, 6, 30)
    q0 = -2   # causal: rows 0 and 1 (positions -2, -1) see no key of any shard
    parts = []
    for a, b in ((0, 4), (4, 4), (4, 17), (17, 30)):
        got = nf.attention(q, k[:, :, a:b], v[:, :, a:b], enable_gqa=True,
                           mask_mod=lambda bb, h, i, j, a=a: j + a <= i + q0,
                           return_lse=True)
        parts.append(got)
    o, lse = merge_states([p[0] for p in parts], [p[1] for p in parts])
    want_o, want_lse = W.reference(q, k, v, q0, causal=True)
    W.close(o, want_o, "o")
    W.close(lse, want_lse, "lse")
    so, sl = merge_stacked(torch.stack([p[0] for p in parts]),
                           torch.stack([p[1] for p in parts]))
    W.close(so, want_o, "o (stacked)")
    W.close(sl, want_lse, "lse (stacked)")
    assert torch.isneginf(lse[:, :, :2]).all() and (o[:, :, :2] == 0).all()
    assert torch.isfinite(lse[:, :, 2:]).all()
    assert math.isinf(parts[2][1][0, 0, 5].item())   # row 5 (position 3) sees no key >= 4
    # the compiled merge of a decode step (one all_gather of packed states)
    flat = torch.stack([pack(p[0], p[1]) for p in parts])
    ko, kl = merge_flat(flat, parts[0][0].shape, parts[0][1].shape, parts[0][0].dtype)
    W.close(ko, want_o, "o (compiled)")
    W.close(kl, want_lse, "lse (compiled)")
    assert torch.isneginf(kl[:, :, :2]).all() and (ko[:, :, :2] == 0).all()
    outs, _ = attention_definition(AttentionSpec("float32", W.HQ, W.HKV, W.DIM, W.DIM, 1.0))
    counts = (4, 0, 13, 13)
    merged = nf.merge_partials(nf.plan(outs[0]),
                               [as_partial(o_, l_, c) for (o_, l_), c in zip(parts, counts)])
    st = merged.states
    el = st["l"][0][..., None]
    torch.testing.assert_close(torch.where(el > 0, st["o_sum"][0] / el, 0.0), o.double(),
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(st["m"][0] + torch.log(st["l"][0]), lse.double(),
                               rtol=1e-5, atol=1e-6)


def test_return_lse_is_one_kernel_and_packed():
    """nf.attention(return_lse=True): o as without it, lse the reference's, for the packed
    GQA decode kernel under split-k (one kernel: the lse is combined with the rest) and
    for prefill; a row with no key gives o = 0 and lse = -inf."""
    cache = nf.AttentionCache(store=False)
    q, k, v = W.data(10, 1, 300)
    split = nf.Schedule(strategy="split", splits=3, block_m=16, block_n=32)
    o, lse = nf.attention(q, k, v, enable_gqa=True, q_offset="end", cache=cache,
                          schedule=split, return_lse=True)
    assert o.shape == (1, W.HQ, 1, W.DIM) and lse.shape == (1, W.HQ, 1)
    assert lse.dtype == torch.float32
    want_o, want_lse = W.reference(q, k, v, 299)
    W.close(o, want_o, "o")
    W.close(lse, want_lse, "lse")
    (kern,) = cache.kernels()
    assert type(kern) is nf.Kernel and kern.schedule.strategy == "split"
    W.close(nf.attention(q, k, v, enable_gqa=True, q_offset="end", cache=cache,
                         schedule=split), want_o, "o without lse")
    q, k, v = W.data(11, 5, 9)
    o, lse = nf.attention(q, k, v, enable_gqa=True, mask_mod=ops.Causal(), q_offset=-2,
                          cache=cache, return_lse=True)
    assert torch.isneginf(lse[:, :, :2]).all() and (o[:, :, :2] == 0).all()
    W.close(lse[:, :, 2:], W.reference(q, k, v, -2, causal=True)[1][:, :, 2:], "lse")
    W.close(o, W.reference(q, k, v, -2, causal=True)[0], "o")


def test_hidden_chunks():
    """The host's test for a chunk a mask hides entirely (then it is not computed)."""
    args = ("float32", 2, None)
    causal = ops.Causal()
    assert hidden(causal, 0, 8, 8, 8, *args)          # the future chunk
    assert not hidden(causal, 8, 8, 8, 8, *args)      # the diagonal one
    assert not hidden(causal, 8, 8, 0, 8, *args)      # the past
    assert hidden(ops.SlidingWindow(4), 20, 2, 0, 10, *args)
    assert not hidden(ops.SlidingWindow(4), 20, 2, 0, 18, *args)
    assert hidden(None, 0, 0, 0, 5, *args) and not hidden(None, 0, 3, 0, 5, *args)
    # a conjunct that hides suffices; one that reads the head or an | never hides
    assert hidden(lambda b, h, i, j: (j <= i) & (h >= 0), 0, 8, 8, 8, *args)
    assert not hidden(lambda b, h, i, j: j <= i + 8 * h, 0, 8, 8, 8, *args)
    assert not hidden(lambda b, h, i, j: (j <= i) | (h == 0), 0, 8, 8, 8, *args)


def test_local_errors():
    q, k, v = W.data(12, 1, 5)
    with pytest.raises(DistributedError, match="kv_offset must be an int >= 0"):
        sharded_decode(q, k, v, kv_offset=-1, enable_gqa=True)
    with pytest.raises(DistributedError, match="layout must be one of contiguous, zigzag"):
        ring_attention(q, k, v, layout="striped")
    with pytest.raises(DistributedError, match="k_local must be a 4-d torch tensor"):
        ring_attention(q, k[0], v)
    with pytest.raises(DistributedError, match="reserved"):
        sharded_decode(q, k, v, kv_offset=0, enable_gqa=True, mask_mod=ops.Causal(),
                       buffers={"nf_positions": torch.zeros(2)})
    with pytest.raises(DistributedError, match="check=False needs q_offset as an int"):
        sharded_decode(q, k, v, kv_offset=0, enable_gqa=True, check=False)
    with pytest.raises(DistributedError, match="group is given"):
        ring_attention(q, k, v, group=object())


@pytest.mark.parametrize("lengths", [[5, 5], [0, 7, 3], [1, 0], [8, 9, 10, 11]])
def test_layouts_tile_the_sequence(lengths):
    """Every layout gives each rank its local length and covers the sequence once."""
    for layout in ("contiguous", "zigzag"):
        segs = layout_segments(lengths, layout)
        assert [sum(n for _, _, n in s) for s in segs] == lengths
        for s in segs:   # local starts follow one another
            assert [a for _, a, _ in s] == [sum(n for _, _, n in s[:k]) for k in range(len(s))]
        cover = sorted((a, a + n) for s in segs for a, _, n in s if n)
        assert [c for pair in cover for c in pair][1:-1:2] == [c[0] for c in cover][1:]
        assert (cover[0][0], cover[-1][1]) == (0, sum(lengths))
    x = torch.arange(20.0)[None, None, :, None]
    got = [shard(x, r, 3, "zigzag")[0, 0, :, 0].tolist() for r in range(3)]
    assert got == [[0, 1, 2, 17, 18, 19], [3, 4, 5, 13, 14, 15, 16], [6, 7, 8, 9, 10, 11, 12]]


def test_docs_example_runs(tmp_path):
    """docs/distributed.md's example, as a reader would run it (two gloo processes)."""
    import re
    import subprocess
    doc = Path(__file__).resolve().parents[2] / "docs" / "distributed.md"
    (code,) = re.findall(r"^```python\n(.*?)^```", doc.read_text(), flags=re.S | re.M)
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]


def test_wrapped_mods_follow_their_captured_values():
    """A mod is wrapped once per guard: the same wrapper for an equal mod, a new one when
    a captured value changes -- and each call computes with its own value."""
    from neptune_fusion.distributed.positions import wrapped
    assert wrapped(ops.SlidingWindow(4), "mask") is wrapped(ops.SlidingWindow(4), "mask")
    assert wrapped(ops.SlidingWindow(4), "mask") is not wrapped(ops.SlidingWindow(5), "mask")
    q, k, v = W.data(13, 2, 30)
    w = 9

    def window(b, h, i, j):   # the same function, its captured w changed between calls
        return (j <= i) & (i - j < w)
    o = sharded_decode(q, k[:, :, 10:], v[:, :, 10:], kv_offset=10, enable_gqa=True,
                       mask_mod=window)
    W.close(o, W.reference(q, k, v, 28, causal=True, window=9)[0], "window 9")
    w = 4
    o = sharded_decode(q, k[:, :, 10:], v[:, :, 10:], kv_offset=10, enable_gqa=True,
                       mask_mod=window)
    W.close(o, W.reference(q, k, v, 28, causal=True, window=4)[0], "window 4")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dv", [16, 7])
def test_compiled_merge_in_narrow_dtypes(dtype, dv):
    """Packed (o in the inputs' dtype, lse's float32 bits beside it, padded to 4 bytes for
    an odd count) and merged by the compiled kernel: the float64 closed form, within the
    dtype's rounding; rows no rank saw give o = 0 and lse = -inf."""
    g = torch.Generator().manual_seed(dv)
    lse = torch.randn((3, 1, 4, 2), generator=g) * 4
    lse[:, 0, 1, 0] = -math.inf
    lse[1, 0, 2, 1] = -math.inf
    o = torch.randn((3, 1, 4, 2, dv), generator=g).to(dtype)
    o[torch.isinf(lse)] = 0
    got = torch.stack([pack(o[r], lse[r]) for r in range(3)])
    mo, ml = merge_flat(got, o.shape[1:], lse.shape[1:], dtype)
    want_o, want_l = merge_stacked(o.double(), lse.double())
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}[dtype]
    assert mo.dtype == dtype and ml.dtype == torch.float32
    torch.testing.assert_close(mo.double(), want_o, rtol=tol, atol=tol)
    torch.testing.assert_close(ml.double(), want_l, rtol=1e-6, atol=1e-6)
    assert ml[0, 1, 0].item() == -math.inf and (mo[0, 1, 0] == 0).all()


def test_position_buffers_are_reused():
    """One read-only [q0, k0] tensor per (device, offsets): a ring call's chunks find
    theirs instead of copying (and, on a GPU, synchronising) again."""
    a = position_buffer(3, 70, "cpu")
    assert a.tolist() == [3, 70] and a.dtype == torch.int32
    assert position_buffer(3, 70, "cpu") is a
    assert position_buffer(4, 70, "cpu").tolist() == [4, 70]
