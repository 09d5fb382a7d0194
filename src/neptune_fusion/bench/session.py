"""One benchmark session: ceilings, the plan, and every output file.

Outputs in the session's folder: ``results.json`` (schema in :mod:`.results`),
``report.md`` and ``plots/<operator>.png``; the terminal gets the tables of :mod:`.table`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress

from ..ops import HEAD_DIM, OpSpec
from .clocks import print_clock_line, watched
from .gate import threshold_for
from .metrics import compare
from .plots import plot_operators
from .providers.base import Provider, RunContext, Timer
from .report import markdown
from .results import build_document, environment, write_json
from .runner import Plan, first_line, run_plan
from .table import render
from .timing import Ceilings, gpu_timer, graph_timer, measure_ceilings, wall_timer
from .workloads import BATCH, SMOKE_HEAD_DIVISOR


def run_timer(smoke: bool, warmup_ms: int, rep_ms: int) -> Timer:
    """do_bench medians on a GPU; a wall-clock timer for the smoke run."""
    return wall_timer() if smoke else gpu_timer(warmup_ms, rep_ms)


def run_ceilings(console: Console, timer: Timer, device: torch.device,
                 smoke: bool) -> Ceilings:
    """Measured ceilings (none in the smoke run, and none if measuring them fails)."""
    if smoke:
        return Ceilings(None, None)
    try:
        return measure_ceilings(timer, device)
    except Exception as exc:  # noqa: BLE001 - report without fractions rather than stop
        console.print(f"[yellow]warning:[/] ceilings not measured: {first_line(exc)}")
        return Ceilings(None, None)


@dataclass(frozen=True, slots=True)
class Session:
    """Everything a run needs, fixed before it starts."""

    ops: tuple[OpSpec, ...]
    seqs: tuple[int, ...]
    providers: tuple[Provider, ...]
    dtype: torch.dtype
    device: torch.device
    smoke: bool
    warmup_ms: int = 25
    rep_ms: int = 100
    plots: bool = True
    timer_kind: str = "bench"   # "bench": do_bench of eager calls; "graph": CUDA-graph replay
    rounds: int = 1             # each point's providers timed in this many interleaved rounds

    def timer(self) -> Timer:
        """do_bench medians on a GPU (or CUDA-graph replays: ``timer_kind="graph"``); a
        wall-clock timer for the smoke run."""
        if self.timer_kind == "graph" and not self.smoke:
            return graph_timer(self.rep_ms)
        return run_timer(self.smoke, self.warmup_ms, self.rep_ms)

    def config(self) -> dict:
        """The ``config`` section of results.json."""
        cfg = {"dtype": str(self.dtype).removeprefix("torch."),
               "ops": [op.name for op in self.ops], "seqs": list(self.seqs),
               "providers": [p.name for p in self.providers], "batch": BATCH,
               "head_dim": HEAD_DIM, "threshold": threshold_for(self.dtype),
               "warmup_ms": self.warmup_ms, "rep_ms": self.rep_ms, "timer": self.timer_kind,
               "rounds": self.rounds}
        if self.smoke:
            cfg["smoke_head_divisor"] = SMOKE_HEAD_DIVISOR
        return cfg

    def ceilings(self, console: Console, timer: Timer) -> Ceilings:
        """Measured ceilings (none in the smoke run, and none if measuring them fails)."""
        return run_ceilings(console, timer, self.device, self.smoke)

    def run(self, console: Console, progress: Progress, out_dir: Path, now: datetime) -> dict:
        """Run everything, write the outputs to ``out_dir``, print the tables; returns the
        results document."""
        plan = Plan(self.ops, self.seqs, self.providers)
        with torch.no_grad(), progress, watched(self.timer(), self.device,
                                                self.smoke) as timer:
            ctx = RunContext(device=self.device, dtype=self.dtype, timer=timer,
                             smoke=self.smoke)
            task = progress.add_task("measuring ceilings", total=plan.steps + 1)
            # the ceilings always with do_bench (a copy captured in a CUDA graph runs on
            # the copy engine: chain_session.py)
            ceilings = self.ceilings(console, run_timer(self.smoke, self.warmup_ms,
                                                        self.rep_ms))
            progress.advance(task)
            records = run_plan(plan, ctx, ceilings,
                               on_start=lambda desc: progress.update(task, description=desc),
                               on_record=lambda rec: progress.advance(task),
                               rounds=self.rounds)
        comparisons = compare(records)
        doc = build_document(date=now, mode="cpu-smoke" if self.smoke else "gpu",
                             env=environment(self.device), config=self.config(),
                             providers=self.providers, ceilings=ceilings, records=records,
                             comparisons=comparisons)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json(doc, out_dir / "results.json")
        plot_paths, plot_note = [], "plots disabled (--no-plots)."
        if self.plots:
            plot_paths, plot_note = plot_operators(records, doc["ceilings"], out_dir / "plots",
                                                   self.smoke)
        rel = [str(p.relative_to(out_dir)) for p in plot_paths]
        (out_dir / "report.md").write_text(markdown(doc, records, comparisons, rel, plot_note))
        render(console, records, comparisons, self.providers, self.smoke)
        print_clock_line(console, records)
        if plot_note:
            console.print(f"[yellow]note:[/] {plot_note}")
        console.print(f"results: {out_dir / 'results.json'}, report: {out_dir / 'report.md'}, "
                      f"{len(plot_paths)} plot(s) in {out_dir / 'plots'}")
        return doc
