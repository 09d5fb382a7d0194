"""Device-to-device copy bandwidth by size: how much of the 1 GiB ceiling a short
transfer can reach at all (launch, first-load latency and tail are fixed costs).

Usage on a GPU: PYTHONPATH=src python benchmarks/copy_sizes.py

For each size (bytes moved = read + write), ``torch`` copies timed with
``triton.testing.do_bench`` (the bench's eager timing, L2 flushed between calls) and with
CUDA-graph replay, as TB/s and as a share of the 1 GiB copy timed the same way.
"""

from __future__ import annotations

import torch
import triton.testing


def main() -> None:
    dev = torch.device("cuda")
    rows = []
    for mib in (16, 32, 64, 128, 256, 1024):
        n = mib * (1 << 20) // 2 // 2   # fp16 elements per buffer: half read, half written
        src = torch.randn(n, dtype=torch.float16, device=dev)
        dst = torch.empty_like(src)
        moved = 2 * n * 2
        def copy(dst=dst, src=src):
            return dst.copy_(src)
        eager = triton.testing.do_bench(copy, rep=100, return_mode="median")
        graph = triton.testing.do_bench_cudagraph(copy, rep=100, return_mode="median")
        rows.append((mib, eager * 1e3, moved / (eager * 1e-3) / 1e12,
                     graph * 1e3, moved / (graph * 1e-3) / 1e12))
    top_e, top_g = rows[-1][2], rows[-1][4]
    print("| MiB moved | do_bench us | TB/s | of 1 GiB | graph us | TB/s | of 1 GiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for mib, eu, et, gu, gt in rows:
        print(f"| {mib} | {eu:.1f} | {et:.2f} | {et / top_e:.0%} | {gu:.1f} | {gt:.2f} | "
              f"{gt / top_g:.0%} |")


if __name__ == "__main__":
    main()
