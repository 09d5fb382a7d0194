"""Training steps of the chain suite through the torch.compile backend, against Inductor.

A measurement tool (docs/jit.md, "Training graphs"): each chain of the chain suite in
its plain PyTorch spelling (``bench/chains.py``), its inputs requiring gradients, one
step = forward, then ``backward`` of a fixed random cotangent. Three providers in one
process: eager PyTorch, ``torch.compile`` (Inductor) and the ``"neptune_fusion"``
backend through ``nf.jit`` (the forward's chains fused; the backward as AOTAutograd
derives it). Every provider's outputs and gradients are checked against float64
autograd of the chain's reference spelling first (relative Frobenius error per tensor,
bf16 <= 3e-2, fp32 <= 1e-3 or 5e-3 with a TF32 projection); then each step is timed
(``do_bench`` median, ``ms``) and its cold compile (first step) reported, with its GPU
time (``gpu_ms``: the profiler's kernel time over ten steps, a tenth of it). A step of
these sizes is host-bound on the H100 host (0.3-1.1 ms of Python a step against about
0.6 ms of kernels), and its ``do_bench`` ratio moved 0.48-1.40x between seven rounds
of one process (2026-12-05, ``jit_training_profile.py --rounds 7``): ``vs_inductor``
compares GPU times, ``wall_vs_inductor`` the ``do_bench`` medians. Usage (GPU):
``PYTHONPATH=src python benchmarks/jit_training.py --out f.jsonl [--chains ...]
[--dtypes ...]``; ``--smoke`` on CPU at the suite's smoke sizes.
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import torch


def step(fn, xs, couts):
    """One training step: the outputs, then the gradients of sum(out * cout)."""
    for x in xs:
        x.grad = None
    out = fn(*xs)
    outs = out if isinstance(out, (list, tuple)) else [out]
    torch.autograd.backward([o for o in outs], [c.to(o.dtype) for o, c in zip(outs, couts)])
    return [o.detach() for o in outs] + [x.grad for x in xs if x.requires_grad]


def gpu_ms(fn, steps: int = 10) -> float:
    """Milliseconds of GPU kernel time a call of ``fn``: the profiler's device time of
    ``steps`` calls, summed over its kernels (memsets and copies included)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()) / steps / 1e3


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main(argv=None) -> None:
    from neptune_fusion.bench.chains import make_inputs, select_chains
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chains", default="rmsnorm-matmul,layernorm-matmul,log-softmax,"
                    "softmax,variance")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    import neptune_fusion as nf  # nf.jit: the backend without the installed entry point
    dev = torch.device("cpu" if args.smoke else "cuda")
    for chain in select_chains(args.chains.split(",")):
        sizes = chain.smoke if args.smoke else chain.sizes
        for dt in args.dtypes.split(","):
            dtype = getattr(torch, dt)
            xs = [x.detach().requires_grad_(x.is_floating_point())   # not the targets
                  for x in make_inputs(chain, sizes, dtype, dev)]
            g = torch.Generator(device=dev).manual_seed(1)
            with torch.no_grad():
                outs = chain.plain(*xs)
                outs = outs if isinstance(outs, (list, tuple)) else [outs]
                couts = [torch.randn(o.shape, device=dev, generator=g) for o in outs]
            x64 = [x.detach().double().requires_grad_() if x.is_floating_point() else x
                   for x in xs]
            want = step(chain.reference, x64, couts)   # float64 library functions
            tol = 3e-2 if dt == "bfloat16" else (5e-3 if chain.contraction else 1e-3)
            provs = {"eager": chain.plain,
                     "inductor": torch.compile(chain.plain),
                     "neptune_fusion": nf.jit(chain.plain)}
            times, walls = {}, {}
            for name, fn in provs.items():
                if name != "eager":   # each backend compiles afresh (Dynamo's cache is
                    torch._dynamo.reset()   # per code object)
                rec = {"chain": chain.name, "dtype": dt, "provider": name}
                try:
                    t0 = time.perf_counter()
                    got = step(fn, xs, couts)
                    rec["cold_s"] = round(time.perf_counter() - t0, 2)
                    rec["max_rel_err"] = max(rel(a, b) for a, b in zip(got, want))
                    if rec["max_rel_err"] > tol:
                        rec["error"] = f"wrong: {rec['max_rel_err']:.2e} > {tol}"
                    elif not args.smoke:
                        from triton.testing import do_bench
                        call = functools.partial(step, fn, xs, couts)
                        rec["ms"] = walls[name] = do_bench(call, return_mode="median")
                        rec["gpu_ms"] = times[name] = gpu_ms(call)
                except Exception as err:   # recorded, not fatal
                    rec["error"] = f"{type(err).__name__}: {err}"[:300]
                if name == "neptune_fusion" and "ms" in rec:
                    rec["vs_inductor"] = times.get("inductor", float("nan")) / rec["gpu_ms"]
                    rec["vs_eager"] = times.get("eager", float("nan")) / rec["gpu_ms"]
                    rec["wall_vs_inductor"] = walls.get("inductor", float("nan")) / rec["ms"]
                line = json.dumps(rec)
                print(line, flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(line + "\n")


if __name__ == "__main__":
    main()
