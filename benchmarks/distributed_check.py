"""Context parallelism on two GPUs (issue 21): sharded decode and ring prefill against one
GPU, every result checked against the one-GPU output first.

* decode: each GPU holds ``S`` keys (DC-Causal, DC-GQA; S = 64k, 128k, 256k), the two
  together a cache of ``2 S``; :func:`neptune_fusion.distributed.sharded_decode` against
  one GPU's decode of its own ``S`` keys (goal: <= 1.15x its latency), eager and as
  the replay of one step captured in a CUDA graph on both sides (a serving loop's form;
  the all_gather is captured too);
* prefill: PF-Global and PF-Causal at 32k and 64k tokens in total, half per GPU,
  :func:`neptune_fusion.distributed.ring_attention` against ``nf.attention`` on the whole
  sequence on one GPU (goal: >= 1.7x its throughput), causal in both layouts
  (contiguous, zigzag); the overlap is shown by timing the ring's compute alone (its
  chunks, no transfer) and its transfers alone.

Every rank runs the same fixed number of calls (a timer that picks its own repetition
count per rank, such as ``do_bench``, would leave the ranks in different collectives), in
CUDA events, ``--rounds`` rounds of ``--iters`` calls (``--prefill-iters`` for prefill);
a time is the median over rounds of the slowest rank. The single-GPU baselines run on
rank 0 alone, timed the same way and with ``neptune_fusion.bench.timing.gpu_timer``
(do_bench) as a cross-check. Writes
``distributed_check.json`` and ``report.md`` (versions, date) to ``--out``.

    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 benchmarks/distributed_check.py --out DIR
    NCCL_NVLS_ENABLE=0 PYTHONPATH=src python benchmarks/distributed_check.py --out DIR
    PYTHONPATH=src python benchmarks/distributed_check.py --smoke --out /tmp/dc  # CPU, gloo

Without torchrun it spawns ``--nproc`` processes itself. ``--smoke`` runs tiny shapes on
CPU with gloo (heads / 8, a few hundred keys): a dry run of this script; its times mean
nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from neptune_fusion import ops
from neptune_fusion.bench.gate import relative_error, threshold_for
from neptune_fusion.bench.timing import gpu_timer, synchronize
from neptune_fusion.bench.workloads import smoke_variant
from neptune_fusion.distributed import layout_segments, ring_attention, shard, sharded_decode
from neptune_fusion.distributed.shards import chunk
from neptune_fusion.frontend.attention import attention

DECODE_OPS = ("DC-Causal", "DC-GQA")
PREFILL_OPS = ("PF-Global", "PF-Causal")


def kwargs_of(op) -> dict:
    """nf.attention's keywords for ``op`` (the same for one GPU and for the shards)."""
    kw = dict(scale=op.scale, enable_gqa=op.q_heads != op.kv_heads)
    if op.causal:
        kw["mask_mod"] = ops.Causal()
    return kw


def make(op, n: int, m: int, seed: int, dtype, device):
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return tuple(torch.randn((1, h, s, op.head_dim), generator=g, device=device,
                             dtype=torch.float32).to(dtype)
                 for h, s in ((op.q_heads, n), (op.kv_heads, m), (op.kv_heads, m)))


class Clock:
    """Fixed-count timing, the same on every rank (module docstring)."""

    def __init__(self, device, iters: int, rounds: int, group_wide: bool) -> None:
        self.device, self.iters, self.rounds, self.group_wide = device, iters, rounds, group_wide

    def __call__(self, fn) -> float:
        fn()  # warm-up (compiles, tunes, connects)
        times = []
        for _ in range(self.rounds):
            if self.group_wide:
                dist.barrier()
            synchronize(self.device)
            t0 = time.perf_counter()
            if self.device.type == "cuda":
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                for _ in range(self.iters):
                    fn()
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end) / self.iters
            else:
                for _ in range(self.iters):
                    fn()
                ms = (time.perf_counter() - t0) * 1e3 / self.iters
            if self.group_wide:  # the slowest rank's time
                t = torch.tensor([ms], dtype=torch.float64, device=self.device)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                ms = float(t)
            times.append(ms)
        return statistics.median(times)


def on_rank0(fn, device):
    """``fn()`` on rank 0 while the others wait; its value on every rank."""
    val = fn() if dist.get_rank() == 0 else 0.0
    t = torch.tensor([val], dtype=torch.float64, device=device)
    dist.broadcast(t, 0)
    return float(t)


def decode_point(op, keys: int, args, device, clock, solo) -> dict:
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = getattr(torch, args.dtype)
    q, k, v = make(op, 1, keys * world, 1000 + keys, dtype, device)
    kw = kwargs_of(op)
    one = attention(q, k, v, q_offset="end", **kw)           # one GPU, the whole cache
    a, b = rank * keys, (rank + 1) * keys
    kl, vl = k[:, :, a:b].contiguous(), v[:, :, a:b].contiguous()
    del k, v
    call = lambda: sharded_decode(q, kl, vl, kv_offset=a, **kw)  # noqa: E731
    err = relative_error(call(), one.double())
    ms = clock(call)
    fast = lambda: sharded_decode(q, kl, vl, kv_offset=a, q_offset=keys * world - 1,  # noqa: E731
                                  check=False, **kw)
    err = max(err, relative_error(fast(), one.double()))
    del one
    ms_fast = clock(fast)
    base = lambda: attention(q, kl, vl, q_offset="end", **kw)  # noqa: E731
    base_ms = on_rank0(lambda: solo(base), device)
    base_bench = on_rank0(lambda: args.bench(base), device)
    graph = {}
    if device.type == "cuda":   # one decode step captured in a CUDA graph on both sides
        replay, why = captured(fast, device)
        graph["graph_ms"] = clock(replay) if replay else None
        graph["graph_error"] = why
        base_replay, base_why = (captured(base, device) if rank == 0 else (None, None))
        graph["one_gpu_half_graph_ms"] = on_rank0(
            lambda: solo(base_replay) if base_replay else float("nan"), device)
        graph["one_gpu_graph_error"] = base_why
        if graph["graph_ms"]:
            graph["graph_ratio"] = graph["graph_ms"] / graph["one_gpu_half_graph_ms"]
            graph["ok_goal_graph"] = graph["graph_ratio"] <= 1.15
    return {"op": op.name, "keys_per_gpu": keys, "total_keys": keys * world, "ms": ms,
            "ms_check_false": ms_fast, "ratio_check_false": ms_fast / base_ms,
            "ok_goal_check_false": ms_fast / base_ms <= 1.15,
            "one_gpu_half_ms": base_ms, "one_gpu_half_do_bench_ms": base_bench,
            "ratio": ms / base_ms, "goal": "<= 1.15", "ok_goal": ms / base_ms <= 1.15,
            "rel_err_vs_one_gpu": err, "correct": err <= threshold_for(dtype), **graph}


def captured(fn, device):
    """``(replay, None)``: ``fn`` captured in a CUDA graph (after warm-up calls on the
    capture's side stream), or ``(None, reason)`` when capture fails."""
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        torch.cuda.synchronize(device)
        return g.replay, None
    except Exception as e:  # noqa: BLE001 - reported in the results
        return None, f"{type(e).__name__}: {e}"[:300]


def prefill_point(op, tokens: int, layouts: list[str], args, device, clock,
                  solo) -> list[dict]:
    world = dist.get_world_size()
    dtype = getattr(torch, args.dtype)
    q, k, v = make(op, tokens, tokens, 2000 + tokens, dtype, device)
    kw = kwargs_of(op)
    whole = lambda: attention(q, k, v, **kw)  # noqa: E731
    one = whole()
    base_ms = on_rank0(lambda: solo(whole), device)
    base_bench = on_rank0(lambda: args.bench(whole), device)
    lengths = [tokens * (r + 1) // world - tokens * r // world for r in range(world)]
    out = [_ring_layout(op, layout, lengths, (q, k, v), one, kw, dtype, clock)
           for layout in layouts]
    for rec in out:
        rec.update(one_gpu_ms=base_ms, one_gpu_do_bench_ms=base_bench,
                   speedup=base_ms / rec["ms"], ok_goal=base_ms / rec["ms"] >= 1.7)
    return out


def _ring_layout(op, layout, lengths, whole, one, kw, dtype, clock) -> dict:
    world, rank = dist.get_world_size(), dist.get_rank()
    segs = layout_segments(lengths, layout)
    ql, kl, vl = (shard(t, rank, world, layout) for t in whole)
    mine = torch.cat([one[:, :, a:a + n] for a, _, n in segs[rank]], 2)
    call = lambda: ring_attention(ql, kl, vl, layout=layout, **kw)  # noqa: E731
    err = relative_error(call(), mine.double())
    del mine
    ms = clock(call)

    def compute_only():
        # the ring's chunks computed alone (this rank's KV standing in for each rank's:
        # the shapes are the same), no transfer
        for step in range(world):
            for q0, qa, qn in segs[rank]:
                for k0, ka, kn in segs[(rank - step) % world]:
                    chunk(ql.narrow(2, qa, qn), kl.narrow(2, ka, kn), vl.narrow(2, ka, kn),
                          q0, k0, kw, "check")
    compute_ms = clock(compute_only)
    transfer_ms = clock(lambda: _ring_transfers(kl, vl, world))
    hidden = compute_ms + transfer_ms - ms
    return {"op": op.name, "layout": layout, "tokens": sum(lengths),
            "tokens_per_gpu": ql.shape[2], "ms": ms, "goal": ">= 1.7",
            "compute_alone_ms": compute_ms, "transfers_alone_ms": transfer_ms,
            "overlapped_ms": hidden,
            "overlap_fraction": hidden / transfer_ms if transfer_ms > 0 else None,
            "rel_err_vs_one_gpu": err, "correct": err <= threshold_for(dtype)}


def _ring_transfers(k, v, world: int) -> None:
    rank = dist.get_rank()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    cur = (k, v)
    for _ in range(world - 1):
        got = (torch.empty_like(k), torch.empty_like(v))
        works = dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, cur[0], nxt), dist.P2POp(dist.isend, cur[1], nxt),
             dist.P2POp(dist.irecv, got[0], prv), dist.P2POp(dist.irecv, got[1], prv)])
        for w in works:
            w.wait()
        cur = got


def _k(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def table(records: list[dict]) -> str:
    lines = ["| point | multi-GPU ms | one GPU ms | ratio | goal | met | rel err vs one GPU |",
             "|---|---:|---:|---:|---|---|---:|"]
    for r in records:
        if "keys_per_gpu" in r:
            name = f"{r['op']} decode, {_k(r['keys_per_gpu'])} keys/GPU"
            base = r["one_gpu_half_ms"]
            ratio = (f"{r['ratio']:.2f}x latency ({r['ratio_check_false']:.2f}x with "
                     "check=False")
            if r.get("graph_ratio"):
                ratio += (f"; CUDA graph {r['graph_ms']:.3f} vs "
                          f"{r['one_gpu_half_graph_ms']:.3f} ms: {r['graph_ratio']:.2f}x")
            ratio += ")"
        else:
            name = f"{r['op']} ring prefill ({r['layout']}), {_k(r['tokens'])} tokens"
            base, ratio = r["one_gpu_ms"], f"{r['speedup']:.2f}x throughput"
        lines.append(f"| {name} | {r['ms']:.3f} | {base:.3f} | {ratio} | {r['goal']} | "
                     f"{'yes' if r['ok_goal'] else 'no'} | {r['rel_err_vs_one_gpu']:.2e} |")
    pre = [r for r in records if "tokens" in r]
    if pre:
        lines += ["", "Ring timeline (ms): the chunks computed alone, the transfers alone, "
                  "and how much of the transfers the ring hides.", "",
                  "| point | ring | compute alone | transfers alone | hidden | hidden / "
                  "transfers |", "|---|---:|---:|---:|---:|---:|"]
        for r in pre:
            frac = r["overlap_fraction"]
            lines.append(f"| {r['op']} {r['layout']} {_k(r['tokens'])} | {r['ms']:.3f} | "
                         f"{r['compute_alone_ms']:.3f} | {r['transfers_alone_ms']:.3f} | "
                         f"{r['overlapped_ms']:.3f} | "
                         f"{'-' if frac is None else f'{frac:.2f}'} |")
    return "\n".join(lines)


def run(args) -> int:
    rank = dist.get_rank()
    if args.smoke:
        device = torch.device("cpu")
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        device = torch.device("cuda", torch.cuda.current_device())
    clock = Clock(device, args.iters, args.rounds, True)
    solo = Clock(device, args.iters, args.rounds, False)
    # prefill calls take 10-150 ms: fewer of them (the whole run stays under 5 minutes)
    pclock = Clock(device, args.prefill_iters, args.rounds, True)
    psolo = Clock(device, args.prefill_iters, args.rounds, False)
    args.bench = gpu_timer() if device.type == "cuda" else solo
    pick = (lambda op: smoke_variant(op)) if args.smoke else (lambda op: op)
    records = []
    for name in args.decode_ops:
        for keys in args.decode_keys:
            records.append(decode_point(pick(ops.OPERATORS[name]), keys, args, device, clock,
                                        solo))
            _say(rank, records[-1])
    for name in args.prefill_ops:
        op = pick(ops.OPERATORS[name])
        layouts = [x for x in args.layouts if op.causal or x == "contiguous"]
        for tokens in args.prefill_tokens:
            for rec in prefill_point(op, tokens, layouts, args, device, pclock, psolo):
                records.append(rec)
                _say(rank, rec)
    if rank == 0:
        import triton
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        env = {"torch": torch.__version__, "triton": triton.__version__,
               "backend": dist.get_backend(), "world": dist.get_world_size(),
               "device": torch.cuda.get_device_name() if device.type == "cuda"
               else "cpu (smoke: times mean nothing)",
               "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE"),
               "python": platform.python_version(),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                   timespec="seconds"),
               "dtype": args.dtype, "iters": args.iters, "prefill_iters": args.prefill_iters,
               "rounds": args.rounds}
        ok = all(r["correct"] for r in records)
        (out / "distributed_check.json").write_text(json.dumps(
            {"environment": env, "all_correct": ok, "records": records}, indent=2))
        report = (f"# distributed_check ({env['date']})\n\n"
                  f"{env['world']} x {env['device']}, {env['backend']}, torch {env['torch']}, "
                  f"Triton {env['triton']}, {args.dtype}, NCCL_NVLS_ENABLE="
                  f"{env['NCCL_NVLS_ENABLE']}; median of {args.rounds} rounds of "
                  f"{args.iters} calls ({args.prefill_iters} for prefill; slowest rank). "
                  "`benchmarks/distributed_check.py`.\n\n"
                  f"{table(records)}\n\nAll outputs match the one-GPU output: {ok}.\n")
        (out / "report.md").write_text(report)
        print(report)
    dist.barrier()
    return 0 if all(r["correct"] for r in records) else 1


def _say(rank: int, rec: dict) -> None:
    if rank == 0:
        print(json.dumps(rec), flush=True)


def _worker(rank: int, world: int, port: int, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    code = _init_and_run(args)
    if code:
        raise SystemExit(code)


def _init_and_run(args) -> int:
    backend = "gloo" if args.smoke else "nccl"
    if not args.smoke:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    try:
        return run(args)
    finally:
        dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for the JSON and report.md")
    p.add_argument("--nproc", type=int, default=2, help="processes to spawn without torchrun")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    p.add_argument("--decode-ops", nargs="*", default=list(DECODE_OPS), choices=DECODE_OPS)
    p.add_argument("--decode-keys", type=int, nargs="*", default=[65536, 131072, 262144],
                   help="keys per GPU")
    p.add_argument("--prefill-ops", nargs="*", default=list(PREFILL_OPS), choices=PREFILL_OPS)
    p.add_argument("--prefill-tokens", type=int, nargs="*", default=[32768, 65536],
                   help="tokens in total")
    p.add_argument("--layouts", nargs="*", default=["contiguous", "zigzag"],
                   choices=["contiguous", "zigzag"],
                   help="ring layouts (zigzag for causal operators only)")
    p.add_argument("--iters", type=int, default=20, help="calls per timed round")
    p.add_argument("--prefill-iters", type=int, default=3,
                   help="calls per timed round of a prefill point")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds (median)")
    p.add_argument("--smoke", action="store_true",
                   help="CPU dry run with gloo: tiny shapes, times that mean nothing")
    args = p.parse_args(argv)
    if args.smoke:
        given = argv if argv is not None else sys.argv
        if "--decode-keys" not in given:
            args.decode_keys = [96]
        if "--prefill-tokens" not in given:
            args.prefill_tokens = [64]
        args.iters, args.rounds = min(args.iters, 1), min(args.rounds, 1)
        args.prefill_iters = 1
    elif not torch.cuda.is_available():
        print("distributed_check: needs CUDA devices (or --smoke)", file=sys.stderr)
        return 2
    if "RANK" in os.environ:   # launched by torchrun
        return _init_and_run(args)
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_worker, args=(args.nproc, port, args), nprocs=args.nproc,
                       start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
