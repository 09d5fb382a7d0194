"""One run of the serving suite (:mod:`.serving`): providers, the points, ``results.json``
and ``report.md``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from .clocks import clock_lines, print_clock_line, watched
from .gate import check
from .providers.base import Prepared, Unsupported
from .results import environment, write_json
from .runner import classify_failure, measure_point, release_memory
from .serving import (
    ServingInputs,
    ServingPoint,
    bytes_read,
    lengths,
    make_inputs,
    padded,
    padded_reference,
    reference,
)
from .session import run_ceilings
from .timing import graph_timer, synchronize, wall_timer

PROVIDERS = ("neptune", "neptune-split4", "flex", "sdpa-cudnn")
# an explicit split-k schedule beside the auto-scheduler's choice: with mixed lengths the
# longest sequence's programs set a rolling kernel's time; the auto-scheduler prices that
# (docs/scheduling.md, "Ragged decode"), and this column checks its choice
SPLIT4 = dict(block_m=16, block_n=64, num_warps=4, num_stages=3, strategy="split", splits=4)


# ------------------------------------------------------------------------ providers


def _neptune(x: ServingInputs, point: ServingPoint, smoke: bool, schedule=None):
    from ..frontend.attention import AttentionCache
    from ..frontend.attention import attention as nf_attention
    from ..schedule.schedule import Schedule
    cache = AttentionCache()
    sched = Schedule(**schedule) if schedule else None

    def fn():
        return nf_attention(x.q, x.k, x.v, kv_lens=x.kv_lens, block_table=x.block_table,
                            enable_gqa=point.q_heads != point.kv_heads, cache=cache,
                            schedule=sched)
    how = f", block_table=): pages of {point.page}" if point.page else \
        "): contiguous cache"
    return Prepared(fn, "nf.attention(kv_lens=" + how + (
        f", schedule {sched.to_json()}" if sched else ", auto schedule"))


def _flex(x: ServingInputs, point: ServingPoint, smoke: bool):
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as exc:
        return Unsupported(f"torch {torch.__version__} has no FlexAttention ({exc})")
    from .providers._compile import raise_recompile_limits
    raise_recompile_limits()   # one compile per point: never the silent eager fallback
    dev, lens, gqa = x.q.device, x.kv_lens, point.q_heads != point.kv_heads
    run = flex_attention if smoke else torch.compile(flex_attention, dynamic=False,
                                                     fullgraph=True)
    if not point.page:
        def valid(b, h, q_idx, kv_idx):
            return kv_idx < lens[b]
        mask = create_block_mask(valid, point.batch, None, 1, x.k.shape[2], device=dev)
        k, v, note = x.k, x.v, "block mask from the lengths (kv < kv_lens[b])"
    else:
        from torch.nn.attention.experimental._paged_attention import PagedAttention
        ps, pages = point.page, x.k.shape[0]
        # it wants at least as many pages as a sequence may have (max_pages)
        room = max(pages, x.block_table.shape[1])
        paged = PagedAttention(room, ps, point.batch, device=str(dev))
        table = x.block_table.long()
        paged.page_table[:, :table.shape[1]] = torch.where(table < pages, table, -1)
        for b, n in enumerate(x.lens):
            used = table[b, :-(-n // ps)]
            paged.physical_to_logical[b, used] = torch.arange(len(used), device=dev)
        # its layout: (1, Hkv, pages * page, D), page-major rows (a copy of the pool)
        k, v = (torch.zeros(1, point.kv_heads, room * ps, point.head_dim, dtype=t.dtype,
                            device=dev) for t in (x.k, x.v))
        k[0, :, :pages * ps] = x.k.transpose(0, 1).reshape(point.kv_heads, -1, point.head_dim)
        v[0, :, :pages * ps] = x.v.transpose(0, 1).reshape(point.kv_heads, -1, point.head_dim)

        def valid(b, h, q_idx, kv_idx):
            return kv_idx < lens[b]
        logical = create_block_mask(valid, point.batch, None, 1, table.shape[1] * ps,
                                    device=dev, BLOCK_SIZE=(128, ps))
        mask = paged.convert_logical_block_mask(logical, kv_len=lens.long())
        note = ("torch.nn.attention.experimental._paged_attention.PagedAttention: our "
                "page table, its converted block mask")
    scale = point.head_dim ** -0.5

    def fn():
        return run(x.q, k, v, block_mask=mask, scale=scale, enable_gqa=gqa)
    return Prepared(fn, note)


def _cudnn(x: ServingInputs, point: ServingPoint, smoke: bool, kv):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    k, v = kv
    backend = SDPBackend.MATH if smoke else SDPBackend.CUDNN_ATTENTION
    gqa = point.q_heads != point.kv_heads
    if gqa and not smoke:   # cuDNN takes no enable_gqa: the heads expanded, as users do
        k = k.repeat_interleave(point.q_heads // point.kv_heads, 1)
        v = v.repeat_interleave(point.q_heads // point.kv_heads, 1)
        gqa = False

    def fn():
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(x.q, k, v,
                                                                    enable_gqa=gqa)
    return Prepared(fn, f"padded to {k.shape[2]} keys" + (
        " (smoke: the math backend)" if smoke else ""))


# ------------------------------------------------------------------------ the run


@dataclass(frozen=True, slots=True)
class ServingSession:
    """Everything a serving-suite run needs, fixed before it starts."""

    points: tuple[ServingPoint, ...]
    dtypes: tuple[torch.dtype, ...]
    providers: tuple[str, ...]
    device: torch.device
    smoke: bool
    rep_ms: int = 100

    def config(self) -> dict:
        return {"suite": "serving", "dtypes": [str(d).removeprefix("torch.")
                                               for d in self.dtypes],
                "points": [p.name for p in self.points], "providers": list(self.providers),
                "lengths": list(self.points[0].lengths) if self.points else [],
                "rep_ms": self.rep_ms, "timer": "wall (smoke)" if self.smoke
                else "CUDA-graph replay (triton.testing.do_bench_cudagraph), median"}

    def run(self, console: Console, progress: Progress, out_dir: Path, now: datetime) -> dict:
        plain = wall_timer() if self.smoke else graph_timer(self.rep_ms)
        records: list[dict] = []
        with torch.no_grad(), progress, watched(plain, self.device, self.smoke) as timer:
            task = progress.add_task("measuring ceilings",
                                     total=len(self.points) * len(self.dtypes) + 1)
            ceilings = run_ceilings(console, timer, self.device, self.smoke)
            progress.advance(task)
            for dtype in self.dtypes:
                for point in self.points:
                    progress.update(task, description=f"{point.name} {dtype}")
                    records += self._point(point, dtype, timer, ceilings.copy_tbps)
                    progress.advance(task)
                    release_memory(self.device)
        doc = {"suite": "serving", "date": now.isoformat(),
               "mode": "cpu-smoke" if self.smoke else "gpu",
               "environment": environment(self.device), "config": self.config(),
               "copy_tbps": ceilings.copy_tbps, "records": records}
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json(doc, out_dir / "results.json")
        (out_dir / "report.md").write_text(markdown(doc))
        _print(console, records, self.smoke)
        print_clock_line(console, records)
        console.print(f"results: {out_dir / 'results.json'}, report: {out_dir / 'report.md'}")
        return doc

    def _point(self, point: ServingPoint, dtype, timer, copy_tbps) -> list[dict]:
        base = dict(point=point.name, batch=point.batch, q_heads=point.q_heads,
                    kv_heads=point.kv_heads, layout=point.layout,
                    dtype=str(dtype).removeprefix("torch."))
        try:
            x = make_inputs(point, dtype, self.device)
            ref = reference(x, point)
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory: a record, go on
            return [dict(base, provider=p, status="error",
                         reason="inputs/reference failed: " + classify_failure(exc)[1])
                    for p in self.providers]
        nbytes = bytes_read(x, point, dtype)
        base["lengths"] = [min(x.lens), max(x.lens), sum(x.lens)]
        base["bytes"] = nbytes

        def rate(ms: float):
            tbps = nbytes / (ms * 1e-3) / 1e12
            return tbps, (tbps / copy_tbps if copy_tbps else None)

        out = []
        for name in self.providers:
            gate_ref, kv = ref, None
            if name == "sdpa-cudnn":
                try:
                    kv = padded(x, point)
                    gate_ref = padded_reference(x.q, *kv)
                except Exception as exc:  # noqa: BLE001
                    out.append(dict(base, provider=name, status="error",
                                    reason="padded batch failed: " + classify_failure(exc)[1]))
                    continue
            prepare: Callable = functools.partial(_PREPARE[name], x, point, self.smoke, kv)
            rec = measure_point(functools.partial(dict, base, provider=name), prepare,
                                functools.partial(_gate, ref=gate_ref, dtype=dtype), timer,
                                self.device, rate)
            if name == "neptune" and rec["status"] == "ok" and not self.smoke:
                rec["replay_new_lengths"] = _replay(x, point, dtype)
            out.append(rec)
            kv = gate_ref = None
            release_memory(self.device, collect=False)
        return out


def _gate(out, ref, dtype):
    return check(out, ref, dtype)


_PREPARE = {"neptune": lambda x, point, smoke, kv: _neptune(x, point, smoke),
            "neptune-split4": lambda x, point, smoke, kv: _neptune(x, point, smoke, SPLIT4),
            "flex": lambda x, point, smoke, kv: _flex(x, point, smoke),
            "sdpa-cudnn": lambda x, point, smoke, kv: _cudnn(x, point, smoke, kv)}


def _replay(x: ServingInputs, point: ServingPoint, dtype) -> str:
    """Capture one call in a CUDA graph, write new (shorter) lengths into ``kv_lens`` in
    place, replay, gate: one graph serves every length. Returns "ok" or why not."""
    from ..frontend.attention import AttentionCache
    from ..frontend.attention import attention as nf_attention
    try:
        cache = AttentionCache()
        gqa = point.q_heads != point.kv_heads

        def call():
            return nf_attention(x.q, x.k, x.v, kv_lens=x.kv_lens, block_table=x.block_table,
                                enable_gqa=gqa, cache=cache)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call()
        new = [max(1, n // 2 + k % 7) for k, n in enumerate(lengths(point, seed=99))]
        new = [min(a, b) for a, b in zip(new, x.lens)]   # within the pages they have
        x.kv_lens.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        synchronize(x.q.device)
        old, x.lens = x.lens, new
        try:
            got = check(out, reference(x, point), dtype)
        finally:
            x.lens = old
            x.kv_lens.copy_(torch.tensor(old, dtype=torch.int32))
        return "ok" if got.passed else f"wrong: {got.reason}"
    except Exception as exc:  # noqa: BLE001
        return "error: " + classify_failure(exc)[1]


# ------------------------------------------------------------------------ the report


def _speedups(records: list[dict]) -> list[dict]:
    """Per (point, dtype): our time, the baselines', the ratios (above 1: we are faster)."""
    rows: dict[tuple, dict] = {}
    for r in records:
        row = rows.setdefault((r["point"], r["dtype"]), {"point": r["point"],
                                                          "dtype": r["dtype"]})
        row[r["provider"]] = r.get("ms") if r["status"] == "ok" else None
        if r["provider"] == "neptune":
            row["tbps"] = r.get("throughput")
            row["share"] = r.get("fraction_of_ceiling")
            row["replay"] = r.get("replay_new_lengths", "")
    for row in rows.values():
        ours = row.get("neptune")
        for p in ("neptune-split4", "flex", "sdpa-cudnn"):
            theirs = row.get(p)
            row[f"vs {p}"] = theirs / ours if ours and theirs else None
    return list(rows.values())


def _f(x, fmt: str = ".4f") -> str:
    return "n/a" if x is None else format(x, fmt)


def markdown(doc: dict) -> str:
    """The report: the table of times and ratios, then every failure with its reason."""
    smoke = doc["mode"] == "cpu-smoke"
    lines = [f"# Serving decode ({doc['mode']}, {doc['date'][:10]})", "",
             "Batched decode over ragged and paged KV caches, KV lengths uniform in "
             f"{doc['config']['lengths']} (seeded). GPU time from CUDA-graph replay, ms; "
             "bandwidth on the bytes actually read; a ratio above 1 means neptune-fusion is "
             "faster (neptune: the auto-scheduler's choice; neptune split-k x4: an explicit "
             "4-way split-k schedule, for the mixed-length tail). sdpa-cudnn runs the batch "
             "padded to its longest sequence.", ""]
    if smoke:
        lines += ["CPU smoke run: the Triton interpreter, no times (they would mean "
                  "nothing); the gate's relative error per provider.", "",
                  "| point | dtype | " + " | ".join(PROVIDERS) + " |",
                  "|---|---|" + "---|" * len(PROVIDERS)]
        lines += [f"| {p} | {d} | " + " | ".join(cells) + " |"
                  for (p, d), cells in _gates(doc["records"]).items()]
        return "\n".join(lines + _failures(doc)) + "\n"
    lines += ["| point | dtype | neptune | neptune split-k x4 | flex | sdpa-cudnn (padded) "
              "| TB/s | of copy | vs flex | vs cuDNN | one graph, new lengths |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in _speedups(doc["records"]):
        lines.append(f"| {r['point']} | {r['dtype']} | {_f(r.get('neptune'))} | "
                     f"{_f(r.get('neptune-split4'))} | "
                     f"{_f(r.get('flex'))} | {_f(r.get('sdpa-cudnn'))} | "
                     f"{_f(r.get('tbps'), '.2f')} | {_f(r.get('share'), '.0%')} | "
                     f"{_f(r.get('vs flex'), '.2f')} | {_f(r.get('vs sdpa-cudnn'), '.2f')} | "
                     f"{r.get('replay', '')} |")
    clocks = clock_lines(doc["records"])
    return "\n".join(lines + ([""] + clocks[:1] if clocks else []) + _failures(doc)) + "\n"


def _failures(doc: dict) -> list[str]:
    lines = []
    bad = [r for r in doc["records"] if r["status"] != "ok"]
    if bad:
        lines += ["", "Not measured:", ""]
        lines += [f"* {r['point']} {r['dtype']} {r['provider']}: {r['status']}: "
                  f"{r.get('reason', '')}" for r in bad]
    notes = sorted({(r["provider"], r.get("note", "")) for r in doc["records"]
                    if r.get("note")})
    if notes:
        lines += ["", "How each provider ran:", ""]
        lines += [f"* {p}: {n}" for p, n in notes]
    return lines


def _gates(records: list[dict]) -> dict[tuple, list[str]]:
    """Per (point, dtype), each provider's gate: ``ok (error)`` or its status."""
    out: dict[tuple, dict] = {}
    for r in records:
        cell = f"ok ({r['error']:.1e})" if r["status"] == "ok" else r["status"]
        out.setdefault((r["point"], r["dtype"]), {})[r["provider"]] = cell
    return {k: [v.get(p, "-") for p in PROVIDERS] for k, v in out.items()}


def _print(console: Console, records: list[dict], smoke: bool) -> None:
    if smoke:   # no times: the gate results only
        table = Table(title="serving decode, CPU smoke run: gate (relative error)")
        for col in ("point", "dtype", *PROVIDERS):
            table.add_column(col)
        for (p, d), cells in _gates(records).items():
            table.add_row(p, d, *cells)
        console.print(table)
        return
    table = Table(title="serving decode (GPU time, ms)")
    for col in ("point", "dtype", "neptune", "split-k x4", "flex", "sdpa-cudnn", "TB/s",
                "vs flex", "vs cuDNN"):
        table.add_column(col)
    for r in _speedups(records):
        table.add_row(r["point"], r["dtype"], _f(r.get("neptune")),
                      _f(r.get("neptune-split4")), _f(r.get("flex")),
                      _f(r.get("sdpa-cudnn")), _f(r.get("tbps"), ".2f"),
                      _f(r.get("vs flex"), ".2f"), _f(r.get("vs sdpa-cudnn"), ".2f"))
    console.print(table)
