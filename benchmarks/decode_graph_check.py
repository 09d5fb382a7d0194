"""Where decode time goes: eager calls (host work included) vs CUDA-graph replay (GPU only).

Usage on a GPU: PYTHONPATH=src python benchmarks/decode_graph_check.py [--seqs 4096,16384,65536]
Prints, per decode operator and length: neptune-fusion eager ms, the same call replayed
from a CUDA graph (no Python, no launch overhead), and cuDNN SDPA eager ms where it applies;
plus the fraction of the copy ceiling the graph replay reaches. Output is checked against
the float64 reference first (relative Frobenius error).
"""

from __future__ import annotations

import argparse

import torch
import triton.testing

from neptune_fusion import ops
from neptune_fusion.bench.operators import make_inputs, select_operators
from neptune_fusion.bench.reference import reference_attention


def _time(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def measure(op, seq: int, dev: torch.device) -> tuple[float, float, float, str, int]:
    """(relative error, eager ms, graph-replay ms, cuDNN ms or "n/a", K+V bytes)."""
    q, k, v = make_inputs(op, seq, torch.float16, dev)
    kw = dict(scale=op.scale, causal=op.causal, q_start=op.q_start(seq),
              alibi_slopes=op.alibi_slopes(dev), softcap=op.softcap, window=op.window)

    def call():
        return ops.attention(q, k, v, **kw)

    out = call()
    ref = reference_attention(op, q, k, v)
    err = (torch.linalg.norm((out.double() - ref).flatten())
           / torch.linalg.norm(ref.flatten())).item()
    eager = _time(call)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    replay = _time(graph.replay)
    cudnn = "n/a"
    if op.softcap is None and op.alibi_slopes(dev) is None:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def sdpa():
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, scale=op.scale, enable_gqa=True)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            cudnn = f"{_time(sdpa):.4f}"
    return err, eager, replay, cudnn, 2 * k.numel() * k.element_size()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seqs", default="4096,16384,65536")
    args = p.parse_args()
    seqs = [int(s) for s in args.seqs.split(",")]
    dev = torch.device("cuda")
    a = torch.empty(1 << 28, dtype=torch.float32, device=dev)
    b = torch.empty_like(a)
    copy_ms = _time(lambda: b.copy_(a))
    copy_tbps = 2 * a.numel() * 4 / copy_ms / 1e9
    print(f"copy ceiling {copy_tbps:.2f} TB/s")
    print(f"{'operator':<11} {'S':>6} {'rel.err':>8} {'eager ms':>9} {'graph ms':>9} "
          f"{'graph TB/s':>10} {'% copy':>7} {'cuDNN ms':>9}")
    for op in select_operators(["DC-Causal", "DC-GQA", "DC-ALiBi", "DC-SoftCap"]):
        for seq in seqs:
            err, eager, replay, cudnn, nbytes = measure(op, seq, dev)
            tbps = nbytes / replay / 1e9
            print(f"{op.name:<11} {seq:>6} {err:>8.1e} {eager:>9.4f} {replay:>9.4f} "
                  f"{tbps:>10.2f} {tbps / copy_tbps:>6.0%} {cudnn:>9}")


if __name__ == "__main__":
    main()
