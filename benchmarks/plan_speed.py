"""How fast the algebra derives a plan: cold (fresh process) and memoised.

Usage: PYTHONPATH=src python benchmarks/plan_speed.py
Targets (issue "The algebra"): attention plan < 1 s cold, < 10 ms memoised.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

COLD = """
import time, sys
sys.path[:0] = {paths!r}
t0 = time.perf_counter()
import neptune_fusion as nf
from neptune_fusion.frontend.examples import plain_attention
outs, _ = plain_attention()
t1 = time.perf_counter()
nf.plan(outs)
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


def main() -> None:
    runs = []
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", COLD.format(paths=sys.path)],
                             capture_output=True, text=True, check=True).stdout.split()
        runs.append((float(out[0]), float(out[1])))
    imp = statistics.median(r[0] for r in runs)
    cold = statistics.median(r[1] for r in runs)
    import neptune_fusion as nf
    from neptune_fusion.frontend.examples import plain_attention
    nf.plan(plain_attention()[0])
    warm = []
    for _ in range(20):
        outs, _ = plain_attention()  # a new graph each time: only derivations are memoised
        t = time.perf_counter()
        nf.plan(outs)
        warm.append(time.perf_counter() - t)
    print(f"import neptune_fusion: {imp * 1e3:.0f} ms")
    print(f"attention plan, cold (SymPy import + derivation + proofs): {cold * 1e3:.0f} ms")
    print(f"attention plan, memoised derivation, new graph: {statistics.median(warm) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
