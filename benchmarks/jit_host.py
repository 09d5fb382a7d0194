"""Host time of a decode call through the torch.compile backend, piece by piece (issue 19).

Usage:
    PYTHONPATH=src python benchmarks/jit_host.py [--ops DC-GQA,DC-SoftCap] [--seq 4096] \
        [--calls 1000] [--profile] [--out FILE.jsonl]

Per operator, the plain PyTorch attention of the bench's ``torch-compile`` provider
compiled by ``nf.jit`` (rest: Inductor), and beside it in one process:

* ``nf.attention`` as the bench's ``neptune`` provider calls it (the yardstick);
* the jit call;
* the fused region's ``neptune_fusion::kernel`` op called directly, and its entry's
  ``run`` (the Python behind the op): what the compiled graph adds around them is
  Dynamo's guards, AOTAutograd's runtime wrapper and Inductor's ``call``;
* Inductor alone (``torch.compile`` of the same function);
* both again with ``mode="reduce-overhead"`` (Inductor's CUDA graphs: one replay per
  call), the jit's output checked against float64 too;
* the floor: ``torch.compile`` (Inductor) of a function that only reshapes ``q`` (Dynamo's
  guards, AOTAutograd's wrapper and an Inductor ``call`` with nothing to launch).

Times are host time per call (a loop of calls, the best of 5 loops; with CUDA a
synchronisation after each loop, so they are per-call wall time when the GPU is the
bound). On a CPU the generated kernels' launches are stubbed (``host_python.py``), so
only Python is timed; on a GPU everything runs and outputs are checked against float64.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import host_python  # noqa: E402

from neptune_fusion import ops  # noqa: E402
from neptune_fusion.bench.providers._compile import raise_recompile_limits  # noqa: E402
from neptune_fusion.bench.providers.compiled import plain_attention  # noqa: E402
from neptune_fusion.bench.workloads import attention_options, make_inputs, select_operators  # noqa: E402,E501
from neptune_fusion.dynamo import jit  # noqa: E402
from neptune_fusion.runtime import torch_ops  # noqa: E402


def per_call_us(fn, calls: int) -> float:
    return host_python.per_call_us(fn, calls, sync=sync)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_op(name: str, seq: int, calls: int, profile: bool, device: str) -> dict:
    # every operator's plain attention is one code object: without a reset its graphs
    # pile up in one Dynamo cache, and past the recompile limit calls silently ran eagerly
    torch._dynamo.reset()
    raise_recompile_limits()
    (op,) = select_operators([name])
    dtype = torch.float16 if device == "cuda" else torch.float32
    q, k, v = make_inputs(op, seq, dtype, device)
    kw = attention_options(op, seq, device)
    plain = plain_attention(op, seq)
    compiled = jit(plain)
    t0 = time.perf_counter()
    got = compiled(q, k, v)
    sync()
    cold = time.perf_counter() - t0
    fused = [f for r in compiled.backend.reports for f in r.fused]
    row = {"op": name, "seq": seq, "device": device, "dtype": str(dtype).split(".")[1],
           "jit_cold_s": round(cold, 2), "fused": len(fused)}
    if device == "cuda":
        ref = plain(q.double(), k.double(), v.double())
        row["jit_err"] = ((got.double() - ref).norm() / ref.norm()).item()
    inductor = torch.compile(plain, dynamic=False)
    inductor(q, k, v)
    row["nf_attention_us"] = per_call_us(lambda: ops.attention(q, k, v, **kw), calls)
    entries = [torch_ops.entry(torch_ops.handle(torch_ops.KernelEntry,
                                                torch_ops.constant_key(f.kernel)))
               for f in fused]
    hits = sum(e.hits for e in entries)
    row["jit_us"] = per_call_us(lambda: compiled(q, k, v), calls)
    # the jit's calls that took a bound launch (runtime/torch_ops.KernelEntry)
    row["jit_bound_calls"] = sum(e.hits for e in entries) - hits
    row["inductor_us"] = per_call_us(lambda: inductor(q, k, v), calls)
    # CUDA graphs (Inductor's, through the backend and without it): a replay per call
    for key, fn in (("jit_graphs", jit(plain, dynamic=False, mode="reduce-overhead")),
                    ("inductor_graphs", torch.compile(plain, dynamic=False,
                                                      mode="reduce-overhead"))):
        for _ in range(3):   # warm-up, record, first replay
            out = fn(q, k, v)
        sync()
        if device == "cuda":
            row[f"{key}_err"] = ((out.double() - ref).norm() / ref.norm()).item()
        row[f"{key}_us"] = per_call_us(lambda f=fn: f(q, k, v), calls)
    views = torch.compile(lambda x: x.reshape(x.shape[0], -1).reshape(x.shape), dynamic=False)
    views(q)
    row["floor_us"] = per_call_us(lambda: views(q), calls)
    if len(fused) == 1:
        h = torch_ops.handle(torch_ops.KernelEntry, torch_ops.constant_key(fused[0].kernel))
        entry = torch_ops.entry(h)
        tensors = _kernel_inputs(compiled, q, k, v)
        if tensors is not None:
            row["op_us"] = per_call_us(
                lambda: torch.ops.neptune_fusion.fused(tensors, h), calls)
            row["entry_run_us"] = per_call_us(lambda: entry.run(tensors), calls)
    print(json.dumps(row))
    if profile:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(calls):
            compiled(q, k, v)
        pr.disable()
        print(f"--- {name}: {calls} jit calls (cumulative)")
        pstats.Stats(pr).sort_stats("cumulative").print_stats(40)
    return row


def _kernel_inputs(compiled, q, k, v):
    """The tensors the compiled graph passes to its one kernel op (caught in one call)."""
    seen = []
    run = torch_ops.KernelEntry.run

    def catch(self, tensors):
        seen.append(list(tensors))
        return run(self, tensors)
    torch_ops.KernelEntry.run = catch
    try:
        compiled(q, k, v)
    finally:
        torch_ops.KernelEntry.run = run
    return seen[0] if len(seen) == 1 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="DC-GQA,DC-SoftCap,DC-Causal,DC-ALiBi")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"torch {torch.__version__}, device {device}"
          + ("" if device == "cuda" else " (launches stubbed: Python only)"))
    stub = contextlib.nullcontext()
    if device == "cpu":
        stub = host_python.stubbed_launches()
    rows = []
    with stub:
        for name in args.ops.split(","):
            rows.append(run_op(name, args.seq, args.calls, args.profile, device))
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
