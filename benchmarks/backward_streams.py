"""Would one launch of attention's two backward kernels help? Their time in sequence
against the same two kernels on two CUDA streams (so the GPU may run d_q programs beside
d_k, d_v ones, as FlexAttention's single backward kernel does).

For backward-suite points (default PF-Causal and PF-GQA at S = 4096, fp16, head dim
128): one forward + backward through ``nf.attention`` builds and tunes the kernels; then,
on the saved tensors, ``d_q`` and ``d_k, d_v`` are timed alone, in sequence and on two
streams (``do_bench`` medians, L2 flushed), each result checked equal to the sequential
one.

Usage (GPU): ``python benchmarks/backward_streams.py [--ops PF-Causal,PF-GQA]
[--seqs 4096]``. Results: benchmarks/results/2026-12-02-h200-backward-3.
"""
from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench

from neptune_fusion.bench.backward import make_grad_inputs, select_operators
from neptune_fusion.bench.workloads import attention_options
from neptune_fusion.frontend.attention import AttentionCache
from neptune_fusion.frontend.attention_grad import BackwardKernels
from neptune_fusion.ops import attention


def captured(op, seq: int, device: str = "cuda"):
    """``(backward kernels, their inputs)`` of one forward + backward of ``op``."""
    x = make_grad_inputs(op, seq, torch.float16 if device == "cuda" else torch.float32, device)
    cache = AttentionCache(store=False)
    seen = {}
    plain = BackwardKernels.__call__

    def spy(self, *args, d_lse=None):   # the backward's own tensors, kept
        seen["kern"], seen["args"] = self, args
        return plain(self, *args, d_lse=d_lse)
    BackwardKernels.__call__ = spy
    try:
        attention(x.q, x.k, x.v, cache=cache, **attention_options(op, seq, device)
                  ).backward(x.dout)
    finally:
        BackwardKernels.__call__ = plain
    kern = seen["kern"]
    q, k, v, o, d_o, lse, *bufs = (t.detach() for t in seen["args"])
    [delta] = kern.delta(o, d_o)
    return kern, (q, k, v, d_o, lse, delta, *bufs)


def measure(op, seq: int) -> str:
    kern, ins = captured(op, seq)
    [want_dq] = kern.dq(*ins)
    want_dk, want_dv = kern.dkv(*ins)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def both_streams():
        main = torch.cuda.current_stream()
        s1.wait_stream(main)
        s2.wait_stream(main)
        with torch.cuda.stream(s1):
            dq = kern.dq(*ins)
        with torch.cuda.stream(s2):
            dkv = kern.dkv(*ins)
        main.wait_stream(s1)
        main.wait_stream(s2)
        return dq, dkv

    (dq,), (dk, dv) = both_streams()
    torch.cuda.synchronize()
    same = all(torch.equal(g, w) for g, w in ((dq, want_dq), (dk, want_dk), (dv, want_dv)))
    t_dq = do_bench(lambda: kern.dq(*ins), return_mode="median")
    t_dkv = do_bench(lambda: kern.dkv(*ins), return_mode="median")
    t_seq = do_bench(lambda: (kern.dq(*ins), kern.dkv(*ins)), return_mode="median")
    t_two = do_bench(both_streams, return_mode="median")
    return (f"{op.name} S={seq}: d_q {t_dq:.4f} ms, d_k/d_v {t_dkv:.4f} ms, in sequence "
            f"{t_seq:.4f} ms, two streams {t_two:.4f} ms ({t_seq / t_two:.3f}x); same "
            f"results {same}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", default="PF-Causal,PF-GQA")
    ap.add_argument("--seqs", default="4096")
    a = ap.parse_args()
    for op in select_operators(a.ops.split(",")):
        for seq in (int(s) for s in a.seqs.split(",")):
            print(measure(op, seq), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
