"""Worker side of tests/distributed: spawned processes, a gloo group, named checks.

:func:`spawn` starts ``world`` processes with ``torch.multiprocessing.start_processes``
(``join=False``) and joins them with a deadline, so a hung collective fails the test
instead of hanging pytest. Each worker runs the checks of its scenario and writes
``{check: "ok" | traceback}`` to ``<out>/<rank>.json``.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
import traceback
from pathlib import Path

DIM, HQ, HKV = 16, 4, 2


def spawn(scenario: str, world: int, out: Path, timeout: float = 240.0) -> list[dict]:
    """Run ``scenario`` on ``world`` gloo ranks; every rank's results, in rank order."""
    import torch.multiprocessing as mp
    with socket.socket() as s:   # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.start_processes(_main, args=(world, port, str(out), scenario), nprocs=world,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"scenario {scenario!r} on {world} ranks ran past "
                               f"{timeout:.0f} s")
    return [json.loads((out / f"{r}.json").read_text()) for r in range(world)]


def _main(rank: int, world: int, port: int, out: str, scenario: str) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    results = {}
    try:
        for name, check in SCENARIOS[scenario]:
            try:
                check(rank, world)
                results[name] = "ok"
            except Exception:  # noqa: BLE001 - reported to the parent, by check
                results[name] = traceback.format_exc()
    finally:
        Path(out, f"{rank}.json").write_text(json.dumps(results))
        dist.destroy_process_group()


# ----------------------------------------------------------------- data and reference


def data(seed: int, n: int, m: int, hq: int = HQ, hkv: int = HKV, dtype=None):
    """Random q (1, hq, n, D), k, v (1, hkv, m, D): the same on every rank (seeded)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.float32
    return tuple(torch.randn(shape, generator=g).to(dtype) for shape in
                 ((1, hq, n, DIM), (1, hkv, m, DIM), (1, hkv, m, DIM)))


def reference(q, k, v, q0: int, *, causal=False, window=None, alibi=False):
    """float64 attention (o, lse) with queries at absolute q0.., keys at 0..."""
    import torch
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) * DIM ** -0.5
    i = torch.arange(q.shape[2], dtype=torch.float64)[:, None] + q0
    j = torch.arange(k.shape[2], dtype=torch.float64)[None, :]
    if alibi:
        h = torch.arange(1, q.shape[1] + 1, dtype=torch.float64)
        s = s + torch.exp2(-8.0 * h / q.shape[1])[:, None, None] * (j - i)
    keep = torch.ones_like(s, dtype=torch.bool)
    if causal:
        keep &= j <= i
    if window is not None:
        keep &= (i - j) < window
    s = s.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1).nan_to_num(0.0) @ v
    return o, lse


def close(got, want, what: str, tol: float = 2e-5) -> None:
    import torch
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol,
                               msg=lambda m: f"{what}: {m}")
    assert want.numel() == 0 or torch.isfinite(want).any(), f"{what}: no finite reference"


def bounds(lengths: list[int], r: int) -> tuple[int, int]:
    return sum(lengths[:r]), sum(lengths[:r + 1])


# ----------------------------------------------------------------- checks


def decode_uneven(rank, world):
    """Causal GQA decode (packed kernel), uneven shards, merged lse too."""
    from neptune_fusion import ops
    from neptune_fusion.distributed import sharded_decode
    lens = [37, 20, 9][:world]
    q, k, v = data(1, 1, sum(lens))
    a, b = bounds(lens, rank)
    o, lse = sharded_decode(q, k[:, :, a:b], v[:, :, a:b], kv_offset=a, enable_gqa=True,
                            mask_mod=ops.Causal(), return_lse=True)
    want_o, want_lse = reference(q, k, v, sum(lens) - 1, causal=True)
    close(o, want_o, "o")
    close(lse, want_lse, "lse")
    fast = sharded_decode(q, k[:, :, a:b], v[:, :, a:b], kv_offset=a, enable_gqa=True,
                          mask_mod=ops.Causal(), q_offset=sum(lens) - 1, check=False)
    close(fast, want_o, "o (check=False)")


def decode_positions(rank, world):
    """ALiBi and a sliding window see absolute positions; shards in reverse rank order,
    one of them empty, the window hides another entirely (not computed)."""
    from neptune_fusion import ops
    from neptune_fusion.distributed import sharded_decode
    lens = [0, 30, 25] if world == 3 else [30, 26]
    order = list(range(world))[::-1]   # rank r holds the (world - 1 - r)-th span
    spans = {r: bounds([lens[x] for x in order], order.index(r)) for r in range(world)}
    total = sum(lens)
    q, k, v = data(2, 3, total)
    a, b = spans[rank]
    o = sharded_decode(q, k[:, :, a:b], v[:, :, a:b], kv_offset=a, enable_gqa=True,
                       score_mod=ops.Alibi(HQ), mask_mod=ops.SlidingWindow(12))
    want, _ = reference(q, k, v, total - 3, causal=True, window=12, alibi=True)
    close(o, want, "o")


def decode_mismatch(rank, world):
    """A head dim that differs on one rank: every rank raises DistributedError naming it."""
    import torch

    from neptune_fusion.distributed import DistributedError, sharded_decode
    d = DIM if rank == 0 else DIM // 2
    q, k, v = (torch.randn(1, 2, n, d) for n in (1, 5, 5))
    try:
        sharded_decode(q, k, v, kv_offset=5 * rank)
    except DistributedError as err:
        assert "head dim differs across ranks" in str(err), str(err)
        return
    raise AssertionError("no DistributedError")


def decode_overlap(rank, world):
    import torch

    from neptune_fusion.distributed import DistributedError, sharded_decode
    q, k, v = (torch.randn(1, 2, n, DIM) for n in (1, 5, 5))
    try:
        sharded_decode(q, k, v, kv_offset=3 * rank)
    except DistributedError as err:
        assert "overlap" in str(err) and "rank 0" in str(err), str(err)
        return
    raise AssertionError("no DistributedError")


def ring_causal(rank, world):
    """Causal prefill, uneven chunks; the chunks a causal mask hides are skipped."""
    from neptune_fusion import ops
    from neptune_fusion.distributed import ring_attention
    lens = [9, 21, 14][:world]
    q, k, v = data(3, sum(lens), sum(lens))
    a, b = bounds(lens, rank)
    o, lse = ring_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], enable_gqa=True,
                            mask_mod=ops.Causal(), return_lse=True)
    want_o, want_lse = reference(q, k, v, 0, causal=True)
    close(o, want_o[:, :, a:b], "o")
    close(lse, want_lse[:, :, a:b], "lse")


def ring_alibi_global(rank, world):
    """Non-causal prefill with ALiBi (absolute j - i), queries and keys of other lengths
    (q_offset 'end': the queries are the last ones), an empty chunk on rank 0."""
    from neptune_fusion import ops
    from neptune_fusion.distributed import ring_attention
    qlens, klens = [0, 10, 7][:world], [0, 19, 16][:world]
    q, k, v = data(4, sum(qlens), sum(klens))
    qa, qb = bounds(qlens, rank)
    ka, kb = bounds(klens, rank)
    o = ring_attention(q[:, :, qa:qb], k[:, :, ka:kb], v[:, :, ka:kb], enable_gqa=True,
                       score_mod=ops.Alibi(HQ), q_offset="end")
    want, _ = reference(q, k, v, sum(klens) - sum(qlens), alibi=True)
    close(o, want[:, :, qa:qb], "o")


def ring_zigzag(rank, world):
    """Causal prefill in the zigzag layout (two segments per rank), uneven lengths, ALiBi;
    the output's rows are this rank's, in its local order."""
    import torch

    from neptune_fusion import ops
    from neptune_fusion.distributed import layout_segments, ring_attention, shard
    total = 29 + 6 * world
    q, k, v = data(6, total, total)
    mine = [shard(t, rank, world, "zigzag") for t in (q, k, v)]
    o = ring_attention(*mine, layout="zigzag", enable_gqa=True, mask_mod=ops.Causal(),
                       score_mod=ops.Alibi(HQ))
    want, _ = reference(q, k, v, 0, causal=True, alibi=True)
    lengths = [total * (r + 1) // world - total * r // world for r in range(world)]
    segs = layout_segments(lengths, "zigzag")[rank]
    assert len(segs) == 2 and segs[0][0] < segs[1][0]
    close(o, torch.cat([want[:, :, a:a + n] for a, _, n in segs], 2), "o")


def ring_dtype_mismatch(rank, world):
    import torch

    from neptune_fusion.distributed import DistributedError, ring_attention
    dt = torch.float32 if rank == 0 else torch.float16
    q, k, v = (torch.randn(1, 2, 4, DIM, dtype=dt) for _ in range(3))
    try:
        ring_attention(q, k, v)
    except DistributedError as err:
        assert "q dtype differs across ranks" in str(err) and "float16" in str(err), str(err)
        return
    raise AssertionError("no DistributedError")


def lse_vocab(rank, world):
    """all_merge of a log-sum-exp over a vocabulary sharded across ranks: each rank's
    partial state (m, l) comes from one compiled kernel of the chain."""
    import torch

    import neptune_fusion as nf
    from neptune_fusion.distributed import all_merge
    rows, lens = 5, [40, 0, 23][:world] if world == 3 else [40, 23]
    g = torch.Generator().manual_seed(5)
    x = torch.randn(rows, sum(lens), generator=g) * 3
    a, b = bounds(lens, rank)
    R, V = nf.sizes("R V")
    xs = nf.placeholder((R, V), name="x")
    j = nf.reduce_axis(V, "j")
    m = nf.compute((R,), lambda r: nf.max(xs[r, j], j), name="m")
    l = nf.compute((R,), lambda r: nf.sum(nf.exp(xs[r, j] - m[r]), j), name="l")  # noqa: E741
    lse = nf.compute((R,), lambda r: m[r] + nf.log(l[r]), name="lse")
    local = x[:, a:b].contiguous()
    if b > a:
        mv, lv = nf.compile([m, l])(local)
    else:  # an empty shard: the empty state
        mv, lv = torch.full((rows,), -math.inf), torch.zeros(rows)
    got = all_merge(nf.Partial({"m": (mv,), "l": (lv,)}, b - a), plan=nf.plan(lse))
    out = got.states["m"][0] + torch.log(got.states["l"][0])
    close(out, torch.logsumexp(x.double(), 1), "lse", tol=1e-5)
    assert got.count == sum(lens)


def merge_mismatch(rank, world):
    import torch

    import neptune_fusion as nf
    from neptune_fusion.distributed import DistributedError, all_merge
    n = 4 if rank == 0 else 3
    R, V = nf.sizes("R V")
    xs = nf.placeholder((R, V), name="x")
    j = nf.reduce_axis(V, "j")
    m = nf.compute((R,), lambda r: nf.max(xs[r, j], j), name="m")
    l = nf.compute((R,), lambda r: nf.sum(nf.exp(xs[r, j] - m[r]), j), name="l")  # noqa: E741
    part = nf.Partial({"m": (torch.zeros(n),), "l": (torch.ones(n),)}, 2)
    try:
        all_merge(part, plan=nf.plan(l))
    except DistributedError as err:
        assert "float32[4]" in str(err) and "float32[3]" in str(err), str(err)
        return
    raise AssertionError("no DistributedError")


SCENARIOS = {
    "two": [("decode_uneven", decode_uneven), ("decode_positions", decode_positions),
            ("decode_mismatch", decode_mismatch), ("decode_overlap", decode_overlap),
            ("ring_causal", ring_causal), ("ring_alibi_global", ring_alibi_global),
            ("ring_zigzag", ring_zigzag), ("ring_dtype_mismatch", ring_dtype_mismatch),
            ("lse_vocab", lse_vocab), ("merge_mismatch", merge_mismatch)],
    "three": [("decode_uneven", decode_uneven), ("decode_positions", decode_positions),
              ("ring_causal", ring_causal), ("ring_alibi_global", ring_alibi_global),
              ("ring_zigzag", ring_zigzag), ("lse_vocab", lse_vocab)],
}
os.environ.setdefault("OMP_NUM_THREADS", "1")
