"""``nn.MultiheadAttention`` through the backend, its fused attention kernel timed every
way (issue 19; H200 only).

Usage: ``PYTHONPATH=src:benchmarks python benchmarks/jit_mha_probe.py`` (writes
``probe.json`` under ``$OUT``, or here).

For ``mha-causal`` and ``mha`` of ``jit_modules.py`` (fp16, 4 x 4096, 16 heads of 64):
the module through ``nf.jit`` and through Inductor; the fused op's inputs captured at a
call (``KernelEntry.run``), with their strides; then, each from CUDA-graph replay
(``do_bench_cudagraph``, microseconds): the op's bound call (``entry_us``), the kernel's
general call (``kern_graph_us``), the kernel on contiguous copies (``kern_clone_us``),
both modules twice (``jit_us``, ``inductor_us``), and cuDNN's SDPA on fresh
``(B, H, S, D)`` tensors; plus torch.profiler's kernel lists of the module's eager call,
of the kernel alone and of the module replayed from a CUDA graph. It separated the
attention kernel's own time from the copies around it (docs/jit.md, "Layouts").
"""
import json
import os

import jit_modules as jm
import torch
from jit_dynamic import kernels
from triton.testing import do_bench_cudagraph

from neptune_fusion.dynamo import jit
from neptune_fusion.runtime import torch_ops


def _bench(f) -> float:
    return round(do_bench_cudagraph(f, rep=200) * 1000, 1)


def probe(name: str, seen: dict) -> dict:
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    mod, args, fn = jm.WORK[name](True, torch.float16, "cuda", gen)
    mod = mod.eval().half()
    args = tuple(a.half() for a in args)
    torch._dynamo.reset()
    j, ind = jit(lambda *a: fn(mod, *a)), torch.compile(lambda *a: fn(mod, *a))
    r: dict = {}
    with torch.no_grad():
        j(*args)
        ind(*args)
        seen.clear()
        j(*args)
        torch.cuda.synchronize()
        big = [(k, v) for k, v in seen.items() if any(t.numel() > 1e6 for t in v[1])]
        kname, (entry, ts) = big[-1]
        ak = entry.kernel
        kern = ak.kernel_for(*ts) if hasattr(ak, "kernel_for") else ak
        r |= {"kernel": kname, "schedule": str(kern.schedule),
              "inputs": [[list(t.shape), list(t.stride()), str(t.dtype)] for t in ts]}
        r["entry_us"] = _bench(lambda: entry.run(ts))
        r["kern_graph_us"] = _bench(lambda: kern.call_signed(ts, None))
        cont = [t.contiguous().clone() for t in ts]
        r["kern_clone_us"] = _bench(lambda: kern.call_signed(cont, None))
        for k in ("", "_2"):
            r["jit_us" + k] = _bench(lambda: j(*args))
            r["inductor_us" + k] = _bench(lambda: ind(*args))
        b, s, e = args[0].shape
        q, k, v = (torch.randn(b, 16, s, e // 16, device="cuda", dtype=torch.half)
                   for _ in range(3))
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            causal = name == "mha-causal"
            r["cudnn_us"] = _bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=causal))
        r["prof_jit"] = kernels(lambda: j(*args), "cuda")
        r["prof_kern"] = kernels(lambda: kern.call_signed(ts, None), "cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            j(*args)
        r["prof_jit_graph"] = kernels(g.replay, "cuda")
    return r


def main() -> None:
    seen: dict = {}
    run = torch_ops.KernelEntry.run

    def spy(self, tensors):
        seen[self.kernel.name] = (self, tuple(tensors))
        return run(self, tensors)
    torch_ops.KernelEntry.run = spy
    res = {}
    for name in ("mha-causal", "mha"):
        res[name] = probe(name, seen)
        print(json.dumps(res[name]), flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "probe.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
