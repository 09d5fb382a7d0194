"""Every schedule of a row chain's search space measured on the GPU, beside Inductor.

For a chain of the suite (``neptune_fusion.bench.chains``), compiles it with ``top_k``
large enough that the tuner measures every candidate (CUDA-graph replay, after the
float64 check), then times the chosen kernel eagerly (``do_bench``) and Inductor's
compile of the same plain PyTorch. Writes one JSON line per (chain, dtype): the eager
times, the tuner's eight fastest candidates with the cost model's predictions, and the
model's rank of the fastest.

Usage (GPU): ``python benchmarks/rows_exhaustive.py --chains variance,layer-stats
--dtypes bfloat16 --out DIR`` (about 100 s per pair on the H200: 259 candidates).
"""
from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    import torch
    from triton.testing import do_bench

    import neptune_fusion as nf
    from neptune_fusion.bench import chains

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chains", default="variance,layer-stats")
    p.add_argument("--dtypes", default="bfloat16")
    p.add_argument("--out", default=".")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "rows_exhaustive.jsonl"), "a")

    def timed(fn, *a):
        return do_bench(lambda: fn(*a))
    for name in args.chains.split(","):
        chain = chains.CHAINS[name]
        for dt in args.dtypes.split(","):
            torch.manual_seed(0)
            x = (torch.randn(4096, 32768, device="cuda") + 100.0).to(getattr(torch, dt))
            outs, ins = chain.build(dt)
            kernel = nf.compile(outs, ins, cache=False, top_k=10 ** 6, log=False)
            t0 = time.time()
            kernel(x)
            torch.cuda.synchronize()
            tune_s = time.time() - t0
            inductor = torch.compile(chain.plain)
            inductor(x)
            choice = kernel.last_choice
            trials = sorted((t for t in choice.trials if t.measured_s),
                            key=lambda t: t.measured_s)
            rec = dict(chain=name, dtype=dt, eager_ms=timed(kernel, x),
                       inductor_eager_ms=timed(inductor, x), candidates=len(choice.trials),
                       tune_s=round(tune_s, 1), chosen=choice.schedule.to_dict(),
                       fastest=[dict(graph_ms=t.measured_s * 1e3, model_ms=t.predicted_s * 1e3,
                                     block_m=t.schedule.block_m, block_n=t.schedule.block_n,
                                     warps=t.schedule.num_warps, stages=t.schedule.num_stages,
                                     strategy=t.schedule.strategy, splits=t.schedule.splits)
                                for t in trials[:8]],
                       model_rank_of_fastest=[i for i, t in enumerate(choice.trials)
                                              if trials and t is trials[0]])
            print(json.dumps(rec), flush=True)
            log.write(json.dumps(rec) + "\n")
            log.flush()


if __name__ == "__main__":
    main()
