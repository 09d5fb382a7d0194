"""How well the cost model ranks schedules, offline, against recorded exhaustive searches.

Usage: PYTHONPATH=src python benchmarks/model_fit.py [results/*.json ...]
(default: benchmarks/results/2026-11-30-h200-autotune/run*.json)

For every operator in the given ``autotune_check.py`` results (which time *every* schedule
of the search space on the GPU), rank the same schedules with the current cost model and
report: where the measured-best schedule lands in the model's order, and how close to
the best the auto-scheduler would get if it measured only the model's top k (k = 1..6).
No GPU needed: it replays measurements, so changes to the model can be checked before
the next GPU session. The problems were recorded at fp16.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from neptune_fusion.schedule.cost import rank
from neptune_fusion.schedule.schedule import Schedule
from neptune_fusion.schedule.space import H200, Problem

DEFAULT = sorted(Path(__file__).parent.glob("results/2026-11-30-h200-autotune/run*.json"))


def visits_of(op_name: str, seq: int) -> tuple:
    """The visited-tile shares of operator ``op_name`` at ``seq`` (the recorded problems
    predate them): from the plain definition's tile program, on CPU."""
    import torch

    import neptune_fusion as nf
    from neptune_fusion import ops
    from neptune_fusion.bench.workloads import select_operators
    (op,) = select_operators([op_name])
    [o], ins = ops.definition(op_name)
    n = 1 if op.phase == "DC" else seq
    q = torch.empty(1, op.q_heads, n, 128, dtype=torch.float16)
    k = torch.empty(1, op.kv_heads, seq, 128, dtype=torch.float16)
    if op.phase == "DC" and op.q_heads != op.kv_heads:   # packed GQA
        q = q.reshape(1, op.kv_heads, op.q_heads // op.kv_heads, 128)
    problem, _, _ = nf.compile(o, ins, cache=False).space_for(q, k, k)
    return problem.visits


def evaluate(row: dict, ks=range(1, 7), seq: int = 16384) -> dict:
    # recorded at fp16; the first runs took ALiBi's fp32 slopes for the element size
    problem = replace(Problem(**row["problem"]), itemsize=2, fp32=False)
    if not problem.visits and row["op"].startswith("PF"):
        problem = replace(problem, visits=visits_of(row["op"], seq))
    # older records carry the removed split-k "merge" field (always "kernel" there)
    measured = {Schedule.from_dict({k: v for k, v in r["schedule"].items() if k != "merge"}):
                r["ms"] for r in row["rows"]}
    ok = {s: ms for s, ms in measured.items() if ms is not None}
    best = min(ok.values())
    order = [e.schedule for e in rank(problem, list(measured), H200)]
    ranked_ok = [s for s in order if s in ok]
    pos = ranked_ok.index(min(ok, key=ok.get)) + 1 if ranked_ok else None
    top = {k: min((ok[s] for s in order[:k] if s in ok), default=float("inf")) / best
           for k in ks}
    predicted_bad = sum(1 for s in measured if s not in order)
    failed_kept = sum(1 for s in order if s not in ok)
    return {"op": row["op"], "best_ms": best, "best_rank": pos, "top": top,
            "pruned": predicted_bad, "failed_but_kept": failed_kept,
            "space": len(measured)}


def main(paths: list[str]) -> None:
    rows = []
    for p in paths or [str(x) for x in DEFAULT]:
        for r in json.loads(Path(p).read_text())["results"]:
            if "rows" in r:
                rows.append(evaluate(r))
    print("| op | best ms | rank of best | top1 | top2 | top3 | top4 | top5 | top6 | "
          "pruned | failed kept |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for e in rows:
        tops = " | ".join(f"{e['top'][k]:.3f}" for k in range(1, 7))
        print(f"| {e['op']} | {e['best_ms']:.4f} | {e['best_rank']} | {tops} | "
              f"{e['pruned']} | {e['failed_but_kept']} |")
    for k in range(1, 7):
        within = sum(1 for e in rows if e["top"][k] <= 1.05)
        print(f"top {k}: within 5 % of the best on {within} of {len(rows)}")


if __name__ == "__main__":
    main(sys.argv[1:])
