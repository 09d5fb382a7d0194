"""One run of the chain suite: ceilings, the points, ``results.json`` and ``report.md``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress

from .chain_report import build_chain_document, chain_markdown, compare_chains, render_chains
from .chain_runner import CHAIN_THRESHOLDS, TF32_THRESHOLD, run_chains
from .chains import Chain
from .clocks import print_clock_line, watched
from .providers.base import RunContext
from .providers.chains import ChainProvider, dtype_name
from .results import environment, write_json
from .session import run_ceilings, run_timer
from .timing import graph_timer


@dataclass(frozen=True, slots=True)
class ChainSession:
    """Everything a chain-suite run needs, fixed before it starts."""

    chains: tuple[Chain, ...]
    dtypes: tuple[torch.dtype, ...]
    providers: tuple[ChainProvider, ...]
    device: torch.device
    smoke: bool
    warmup_ms: int = 25
    rep_ms: int = 100
    timer: str = "bench"   # "bench": do_bench of eager calls; "graph": CUDA-graph replay
    rounds: int = 1        # each point's providers timed in this many interleaved rounds

    def config(self) -> dict:
        """The ``config`` section of results.json."""
        return {"suite": "chains", "dtypes": [dtype_name(d) for d in self.dtypes],
                "chains": [c.name for c in self.chains],
                "sizes": {c.name: c.smoke if self.smoke else c.sizes for c in self.chains},
                "providers": [p.name for p in self.providers],
                "thresholds": {dtype_name(d): t for d, t in CHAIN_THRESHOLDS.items()},
                "tf32_threshold": TF32_THRESHOLD,
                "warmup_ms": self.warmup_ms, "rep_ms": self.rep_ms, "timer": self.timer,
                "rounds": self.rounds}

    def run(self, console: Console, progress: Progress, out_dir: Path, now: datetime) -> dict:
        """Run every point, write results.json and report.md to ``out_dir``, print the
        table; returns the results document."""
        plain = graph_timer(self.rep_ms) if self.timer == "graph" and not self.smoke else \
            run_timer(self.smoke, self.warmup_ms, self.rep_ms)
        steps = len(self.chains) * len(self.dtypes) * len(self.providers)
        with torch.no_grad(), progress, watched(plain, self.device, self.smoke) as timer:
            ctx = RunContext(device=self.device, dtype=self.dtypes[0], timer=timer,
                             smoke=self.smoke)
            task = progress.add_task("measuring ceilings", total=steps + 1)
            # the ceilings always with do_bench: a 1 GiB copy and an 8192^3 matmul are long
            # enough for its launch to vanish, and a copy captured in a CUDA graph becomes
            # a copy-engine memcpy node (2.7 TB/s on the H200, not the SMs' 4.2)
            ceilings = run_ceilings(console, run_timer(self.smoke, self.warmup_ms,
                                                       self.rep_ms), self.device, self.smoke)
            progress.advance(task)
            records = run_chains(self.chains, self.dtypes, self.providers, ctx, ceilings,
                                 on_start=lambda d: progress.update(task, description=d),
                                 on_record=lambda rec: progress.advance(task),
                                 rounds=self.rounds)
        comparisons = compare_chains(records)
        doc = build_chain_document(date=now, mode="cpu-smoke" if self.smoke else "gpu",
                                   env=environment(self.device), config=self.config(),
                                   providers=self.providers, ceilings=ceilings,
                                   records=records, comparisons=comparisons)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json(doc, out_dir / "results.json")
        (out_dir / "report.md").write_text(chain_markdown(doc, records, comparisons))
        render_chains(console, comparisons, records, self.smoke)
        print_clock_line(console, records)
        console.print(f"results: {out_dir / 'results.json'}, report: {out_dir / 'report.md'}")
        return doc
