"""Where decode time goes: eager calls (host work included) vs CUDA-graph replay (GPU only).

Usage on a GPU: PYTHONPATH=src python benchmarks/decode_graph_check.py [--seqs 4096,16384,65536]
Prints, per decode operator and length: neptune-fusion eager ms, the same call replayed
from a CUDA graph (no Python, no launch overhead), and SDPA's cuDNN and FlashAttention-2
backends replayed from a CUDA graph where they apply (ALiBi as an additive mask; no
soft-cap); plus the fraction of the copy ceiling neptune-fusion's replay reaches. Every
output is checked against the float64 reference first (relative Frobenius error).
"""

from __future__ import annotations

import argparse

import torch
import triton

from neptune_fusion import ops
from neptune_fusion.bench.gate import relative_error
from neptune_fusion.bench.reference import reference_attention
from neptune_fusion.bench.timing import copy_tbps, gpu_timer, graph_timer
from neptune_fusion.bench.workloads import attention_options, make_inputs, select_operators

_time = gpu_timer(warmup_ms=25, rep_ms=200)   # eager: do_bench, L2 flushed, host included
_graph = graph_timer(rep_ms=100)              # GPU time only: CUDA-graph replay


def measure(op, seq: int, dev: torch.device) -> dict:
    """Relative error, eager and graph-replay ms of neptune-fusion, and graph-replay ms of
    SDPA's cuDNN and FlashAttention-2 backends where they apply; K+V bytes."""
    q, k, v = make_inputs(op, seq, torch.float16, dev)
    kw = attention_options(op, seq, dev)

    def call():
        return ops.attention(q, k, v, **kw)

    out = call()
    ref = reference_attention(op, q, k, v)
    row = {"op": op.name, "seq": seq, "bytes": 2 * k.numel() * k.element_size(),
           "rel_error": relative_error(out, ref),
           "eager_ms": _time(call), "graph_ms": _graph(call)}
    if op.softcap is None:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        slopes = op.alibi_slopes(dev)
        bias = None
        if slopes is not None:   # ALiBi at absolute positions: slope * (j - (S - 1))
            j = torch.arange(seq, device=dev, dtype=torch.float32) - (seq - 1)
            bias = (slopes.float()[:, None] * j[None, :])[None, :, None, :].to(q.dtype)
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("flash", SDPBackend.FLASH_ATTENTION)):
            def sdpa(backend=backend):
                with sdpa_kernel(backend):
                    return torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, attn_mask=bias, scale=op.scale, enable_gqa=True)
            try:
                got = sdpa()
                err = relative_error(got, ref)
                if not err < 1e-2:
                    raise RuntimeError(f"relative error {err:.2e}")
                row[f"{name}_graph_ms"] = _graph(sdpa)
            except Exception as exc:  # noqa: BLE001 - a backend that cannot run is noted
                row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seqs", default="4096,16384,65536")
    p.add_argument("--out", default=None, help="also write the rows as JSON here")
    args = p.parse_args()
    seqs = [int(s) for s in args.seqs.split(",")]
    dev = torch.device("cuda")
    ceiling = copy_tbps(_time, dev)
    print(f"copy ceiling {ceiling:.2f} TB/s (1 GiB, read + write, do_bench)")
    print(f"{'operator':<11} {'S':>6} {'rel.err':>8} {'eager ms':>9} {'graph ms':>9} "
          f"{'TB/s':>6} {'% copy':>7} {'cuDNN ms':>9} {'FA2 ms':>9}")
    rows = []
    for op in select_operators(["DC-Causal", "DC-GQA", "DC-ALiBi", "DC-SoftCap"]):
        for seq in seqs:
            r = measure(op, seq, dev)
            rows.append(r)
            tbps = r["bytes"] / r["graph_ms"] / 1e9
            base = [f"{r[k]:>9.4f}" if k in r else f"{'n/a':>9}"
                    for k in ("cudnn_graph_ms", "flash_graph_ms")]
            print(f"{op.name:<11} {seq:>6} {r['rel_error']:>8.1e} {r['eager_ms']:>9.4f} "
                  f"{r['graph_ms']:>9.4f} {tbps:>6.2f} {tbps / ceiling:>6.0%} "
                  + " ".join(base), flush=True)
    if args.out:
        import json
        import time
        meta = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(),
                "torch": torch.__version__, "triton": triton.__version__,
                "copy_tbps": ceiling}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
