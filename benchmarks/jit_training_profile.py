"""Where a chain's training step through the backend spends its GPU time, against Inductor.

A probe for ``jit_training.py``'s slow rows: the chain's plain PyTorch spelling with its
input requiring grad, one step = forward, then ``backward`` of a fixed cotangent; for
``inductor`` (``torch.compile``) and ``neptune_fusion`` (``nf.jit``) in turn: the step's
``do_bench`` median, the forward alone under ``no_grad`` and with grad, and the
profiler's CUDA kernels of five steps (the top rows by GPU time). Prints text.
Usage (GPU): ``PYTHONPATH=src python benchmarks/jit_training_profile.py --chains
softmax,layernorm-matmul [--dtype bfloat16]``.
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    from triton.testing import do_bench

    import neptune_fusion as nf
    from neptune_fusion.bench.chains import make_inputs, select_chains
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chains", default="softmax")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    for chain in select_chains(args.chains.split(",")):
        xs = [x.detach().requires_grad_(x.is_floating_point())
              for x in make_inputs(chain, chain.sizes, dtype, "cuda")]
        with torch.no_grad():
            out = chain.plain(*xs)
        cot = torch.randn_like(out[0] if isinstance(out, (tuple, list)) else out)
        for name, make in (("inductor", torch.compile), ("neptune_fusion", nf.jit)):
            torch._dynamo.reset()
            fn = make(chain.plain)

            def step(fn=fn, xs=xs, cot=cot):
                for x in xs:
                    x.grad = None
                o = fn(*xs)
                o = o[0] if isinstance(o, (tuple, list)) else o
                o.backward(cot)
            step()
            step()
            ms = do_bench(step, return_mode="median")
            with torch.no_grad():
                fwd = do_bench(lambda fn=fn, xs=xs: fn(*xs), return_mode="median")
            fwd_grad = do_bench(lambda fn=fn, xs=xs: fn(*xs), return_mode="median")
            print(f"== {chain.name} {args.dtype} {name}: step {ms:.3f} ms, forward "
                  f"no_grad {fwd:.3f} ms, forward with grad {fwd_grad:.3f} ms", flush=True)
            with torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12,
                                            max_name_column_width=70), flush=True)
            reports = getattr(getattr(fn, "backend", None), "reports", [])
            for r in reports:
                print(str(r)[:1500], flush=True)


if __name__ == "__main__":
    main()
