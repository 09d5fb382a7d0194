"""Where a chain's training step through the backend spends its time, against Inductor.

A probe for ``jit_training.py``'s slow rows: the chain's plain PyTorch spelling with its
input requiring grad, one step = forward, then ``backward`` of a fixed cotangent; for
``inductor`` (``torch.compile``) and ``neptune_fusion`` (``nf.jit``), both compiled
first: the step's ``do_bench`` median, the forward alone under ``no_grad`` and with grad,
the host time of a step and of a forward (wall time of 100 calls issued without waiting
for the GPU, a step that is host-bound measures this), the profiler's CUDA kernels of
five steps and of five forwards under ``no_grad`` (the top rows by GPU time), and the
backend's report. ``--rounds N``: the two providers' steps timed in turn N more times (a
host-bound step's single-run ratio moves between runs); ``--cprofile``: the top Python
functions of 100 forwards with grad of ``nf.jit``. Prints text. Usage (GPU): ``PYTHONPATH=src python
benchmarks/jit_training_profile.py --chains softmax,layernorm-matmul [--dtype bfloat16]
[--rounds 5] [--cprofile]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def host_us(fn, calls: int = 100) -> float:
    """Microseconds of host time per call of ``fn``: calls issued back to back, timed up
    to the last issue (the GPU is waited for before, not after)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def main() -> None:
    from triton.testing import do_bench

    import neptune_fusion as nf
    from neptune_fusion.bench.chains import make_inputs, select_chains
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chains", default="softmax")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--cprofile", action="store_true")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    for chain in select_chains(args.chains.split(",")):
        xs = [x.detach().requires_grad_(x.is_floating_point())
              for x in make_inputs(chain, chain.sizes, dtype, "cuda")]
        with torch.no_grad():
            out = chain.plain(*xs)
        cot = torch.randn_like(out[0] if isinstance(out, (tuple, list)) else out)
        steps, fns = {}, {}
        for name, make in (("inductor", torch.compile), ("neptune_fusion", nf.jit)):
            torch._dynamo.reset()
            fns[name] = fn = make(chain.plain)

            def step(fn=fn, xs=xs, cot=cot):
                for x in xs:
                    x.grad = None
                o = fn(*xs)
                o = o[0] if isinstance(o, (tuple, list)) else o
                o.backward(cot)
            steps[name] = step
            step()
            step()
            with torch.no_grad():
                fn(*xs)
                fn(*xs)
        for name, step in steps.items():
            fn = fns[name]
            ms = do_bench(step, return_mode="median")
            with torch.no_grad():
                fwd = do_bench(lambda fn=fn, xs=xs: fn(*xs), return_mode="median")
            fwd_grad = do_bench(lambda fn=fn, xs=xs: fn(*xs), return_mode="median")
            host_fwd = host_us(lambda fn=fn, xs=xs: fn(*xs))
            print(f"== {chain.name} {args.dtype} {name}: step {ms:.3f} ms, forward "
                  f"no_grad {fwd:.3f} ms, forward with grad {fwd_grad:.3f} ms; host time "
                  f"{host_us(step):.0f} us a step, {host_fwd:.0f} us a forward with grad",
                  flush=True)
            with torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12,
                                            max_name_column_width=70), flush=True)
            with torch.no_grad(), torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    fn(*xs)
                torch.cuda.synchronize()
            print("no_grad forward:", prof.key_averages().table(
                sort_by="cuda_time_total", row_limit=6, max_name_column_width=70), flush=True)
            reports = getattr(getattr(fn, "backend", None), "reports", [])
            for r in reports:
                print(str(r)[:1500], flush=True)
        if args.rounds:
            got = {name: [] for name in steps}
            for _ in range(args.rounds):
                for name, step in steps.items():
                    got[name].append(do_bench(step, return_mode="median"))
            med = {name: statistics.median(v) for name, v in got.items()}
            print(f"== {chain.name} {args.dtype}: {args.rounds} rounds in turn, step medians "
                  + ", ".join(f"{n} {m:.3f} ms" for n, m in med.items())
                  + f"; inductor / neptune_fusion {med['inductor'] / med['neptune_fusion']:.3f}"
                  + "; each round: " + ", ".join(
                      f"{a / b:.3f}" for a, b in zip(got["inductor"], got["neptune_fusion"])),
                  flush=True)
        if args.cprofile:
            import cProfile
            import pstats
            fn = fns["neptune_fusion"]
            with cProfile.Profile() as pr:
                for _ in range(100):
                    fn(*xs)
                torch.cuda.synchronize()
            pstats.Stats(pr).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
