"""The chain suite's comparisons, results document, markdown report and terminal table.

A ratio is ``other_ms / neptune_ms`` (above 1: neptune-fusion is faster). The summary's
geometric mean covers the single-pass chains (``Chain.single_pass``) where both
neptune-fusion and torch.compile are correct; multi-pass chains are listed on their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .chain_runner import ChainRecord
from .clocks import clock_lines
from .metrics import geomean, ratio
from .providers.chains import ChainProvider
from .report import _num, ceiling_lines, header
from .results import SCHEMA, SCHEMA_VERSION
from .table import fmt_err, fmt_ratio
from .timing import TIMERS, Ceilings

CHAIN_TOP_KEYS: tuple[str, ...] = ("schema", "schema_version", "suite", "date", "mode",
                                   "environment", "config", "providers", "ceilings",
                                   "records", "comparisons", "summary")
CHAIN_COMPARISON_KEYS: tuple[str, ...] = (
    "chain", "dtype", "single_pass", "bound", "neptune_status", "neptune_ms",
    "eager_ms", "torch_compile_ms", "vs_eager", "vs_torch_compile",
    "neptune_fraction_of_ceiling", "neptune_compile_ms", "torch_compile_compile_ms")
CHAIN_SUMMARY_KEYS: tuple[str, ...] = (
    "geomean_vs_torch_compile", "points", "below_1x", "multi_pass_vs_torch_compile",
    "neptune_not_ok")


@dataclass(frozen=True, slots=True)
class ChainComparison:
    """neptune-fusion against torch eager and torch.compile on one (chain, dtype)."""

    chain: str
    dtype: str
    single_pass: bool
    bound: str
    neptune: ChainRecord | None
    eager: ChainRecord | None
    compiled: ChainRecord | None

    @staticmethod
    def _ms(rec: ChainRecord | None) -> float | None:
        return rec.ms if rec is not None and rec.status == "ok" else None

    @property
    def vs_eager(self) -> float | None:
        return ratio(self._ms(self.eager), self._ms(self.neptune))

    @property
    def vs_torch_compile(self) -> float | None:
        return ratio(self._ms(self.compiled), self._ms(self.neptune))

    def to_json(self) -> dict:
        """Keys :data:`CHAIN_COMPARISON_KEYS`."""
        nf, ind = self.neptune, self.compiled
        return {"chain": self.chain, "dtype": self.dtype, "single_pass": self.single_pass,
                "bound": self.bound, "neptune_status": nf.status if nf else None,
                "neptune_ms": self._ms(nf), "eager_ms": self._ms(self.eager),
                "torch_compile_ms": self._ms(ind), "vs_eager": self.vs_eager,
                "vs_torch_compile": self.vs_torch_compile,
                "neptune_fraction_of_ceiling": nf.fraction_of_ceiling if nf else None,
                "neptune_compile_ms": nf.compile_ms if nf else None,
                "torch_compile_compile_ms": ind.compile_ms if ind else None}


def compare_chains(records: Sequence[ChainRecord]) -> list[ChainComparison]:
    """One comparison per (chain, dtype), in the order the points first appear."""
    points: dict[tuple[str, str], dict[str, ChainRecord]] = {}
    for r in records:
        points.setdefault((r.chain, r.dtype), {})[r.provider] = r
    out = []
    for (chain, dtype), recs in points.items():
        first = next(iter(recs.values()))
        out.append(ChainComparison(chain, dtype, first.single_pass, first.bound,
                                   recs.get("neptune"), recs.get("torch-eager"),
                                   recs.get("torch-compile")))
    return out


def chain_summary(comparisons: Sequence[ChainComparison]) -> dict[str, dict]:
    """Per dtype: the geometric mean over single-pass chains, chains below 1x, the
    multi-pass ratios and the chains neptune-fusion did not run correctly."""
    out: dict[str, dict] = {}
    for dtype in dict.fromkeys(c.dtype for c in comparisons):
        cs = [c for c in comparisons if c.dtype == dtype]
        single = [c for c in cs if c.single_pass and c.vs_torch_compile is not None]
        out[dtype] = {
            "geomean_vs_torch_compile": geomean(c.vs_torch_compile for c in single),
            "points": len(single),
            "below_1x": [c.chain for c in single if c.vs_torch_compile < 1.0],
            "multi_pass_vs_torch_compile": {c.chain: c.vs_torch_compile
                                            for c in cs if not c.single_pass},
            "neptune_not_ok": {c.chain: f"{c.neptune.status}: {c.neptune.reason}"
                               for c in cs if c.neptune and c.neptune.status != "ok"}}
    return out


def build_chain_document(*, date: datetime, mode: str, env: dict, config: dict,
                         providers: Sequence[ChainProvider], ceilings: Ceilings,
                         records: Sequence[ChainRecord],
                         comparisons: Sequence[ChainComparison]) -> dict:
    """The chain suite's results document, keys in :data:`CHAIN_TOP_KEYS` order."""
    doc = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "suite": "chains",
           "date": date.isoformat(timespec="seconds"), "mode": mode, "environment": env,
           "config": config,
           "providers": {p.name: {"label": p.label, "group": p.group,
                                  "description": p.description} for p in providers},
           "ceilings": {"matmul_tflops": ceilings.matmul_tflops,
                        "copy_tbps": ceilings.copy_tbps,
                        "matmul_shape": list(ceilings.matmul_shape),
                        "copy_bytes": ceilings.copy_bytes},
           "records": [r.to_json() for r in records],
           "comparisons": [c.to_json() for c in comparisons],
           "summary": chain_summary(comparisons)}
    assert tuple(doc) == CHAIN_TOP_KEYS
    return doc


def _secs(rec: ChainRecord | None) -> str:
    return "—" if rec is None or rec.compile_ms is None else f"{rec.compile_ms / 1e3:.2f}"


def _status(rec: ChainRecord | None) -> str:
    if rec is None:
        return "—"
    return rec.status if rec.error is None else f"{rec.status} {fmt_err(rec.error)}"


def _pct(rec: ChainRecord | None) -> str:
    if rec is None or rec.fraction_of_ceiling is None:
        return "—"
    return f"{100 * rec.fraction_of_ceiling:.0f}%"


def _sizes(sizes: dict) -> str:
    return "x".join(str(v) for v in sizes.values())


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def chain_rows(comparisons: Sequence[ChainComparison], smoke: bool) -> list[list[str]]:
    """The report's cells, one row per (chain, dtype)."""
    rows = []
    for c in comparisons:
        nf, ea, ind = c.neptune, c.eager, c.compiled
        sizes = _sizes((nf or ea or ind).sizes) if (nf or ea or ind) else ""
        kind = "1" if c.single_pass else "several"
        check = " / ".join(_status(r) for r in (nf, ea, ind))
        if smoke:
            rows.append([c.chain, c.dtype, sizes, kind, check])
            continue
        rows.append([c.chain, c.dtype, sizes, kind,
                     _num(c._ms(nf), ".4f"), _num(c._ms(ea), ".4f"), _num(c._ms(ind), ".4f"),
                     fmt_ratio(c.vs_torch_compile), fmt_ratio(c.vs_eager),
                     f"{_pct(nf)} / {_pct(ind)}", f"{_secs(nf)} / {_secs(ind)}", check])
    return rows


HEAD_SMOKE = ["chain", "dtype", "sizes", "passes", "correct (NF / eager / compile)"]
HEAD = ["chain", "dtype", "sizes", "passes", "neptune ms", "eager ms", "torch.compile ms",
        "vs torch.compile", "vs eager", "% ceiling (NF / compile)",
        "cold compile s (NF / compile)", "correct (NF / eager / compile)"]


def _rounds_note(cfg: dict, records: Sequence[ChainRecord]) -> str:
    """How many timing rounds, and the widest spread between a provider's rounds."""
    spread = [r for r in records if r.ms_spread is not None]
    if cfg.get("rounds", 1) <= 1 or not spread:
        return ""
    w = max(spread, key=lambda r: r.ms_spread)
    return (f"; each provider timed in {cfg['rounds']} interleaved rounds, the median "
            f"kept (widest spread between a provider's rounds: {100 * w.ms_spread:.1f} %, "
            f"{w.chain} {w.dtype} {w.provider})")


def chain_markdown(doc: dict, records: Sequence[ChainRecord],
                   comparisons: Sequence[ChainComparison]) -> str:
    """The chain suite's report.md."""
    cfg, ceil = doc["config"], doc["ceilings"]
    smoke = doc["mode"] == "cpu-smoke"
    out = header(doc, "neptune-fusion chain suite")
    out += [
            f"* dtypes {', '.join(cfg['dtypes'])}; every output checked against float64 "
            f"first (relative Frobenius error: float32 <= 1e-3, 5e-3 with a TF32 "
            f"projection; bfloat16 <= 2e-2)",
            "* ratio = other ms / neptune-fusion ms (above 1: neptune-fusion is faster); "
            "% ceiling: bytes moved once (inputs read, outputs written) per second over "
            "the copy ceiling for memory-bound chains, TFLOP/s over the fp16 matmul "
            "ceiling for the projections; cold compile = first call, both sides cold",
            f"* times: {TIMERS.get(cfg.get('timer', 'bench'), cfg.get('timer'))}; the "
            "ceilings with do_bench" + _rounds_note(cfg, records), ""]
    if not smoke:
        out += ceiling_lines(ceil) + [
                "## Summary", ""]
        for dtype, s in doc["summary"].items():
            multi = ", ".join(f"{k} {fmt_ratio(v)}"
                              for k, v in s["multi_pass_vs_torch_compile"].items()) or "none"
            out.append(f"* {dtype}: geometric mean {fmt_ratio(s['geomean_vs_torch_compile'])}"
                       f" vs torch.compile over {s['points']} single-pass chain(s); below 1x: "
                       f"{', '.join(s['below_1x']) or 'none'}; multi-pass: {multi}")
        out.append("")
        out += clock_lines(records)
    head = HEAD_SMOKE if smoke else HEAD
    out += ["## Per chain", "", "| " + " | ".join(head) + " |",
            "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(_escape(c) for c in row) + " |"
            for row in chain_rows(comparisons, smoke)]
    out += jit_lines(records, comparisons, smoke)
    failures = [r for r in records if r.status != "ok"]
    out += ["", "## Not timed", ""]
    out += [f"* {r.chain} {r.dtype} {r.provider}: {r.status}: {_escape(r.reason)}"
            for r in failures] or ["Every point was correct and timed."]
    out.append("")
    return "\n".join(out)


def jit_lines(records: Sequence[ChainRecord], comparisons: Sequence[ChainComparison],
              smoke: bool) -> list[str]:
    """The opt-in ``neptune-jit`` provider's points (the plain form through the
    torch.compile backend) against torch.compile and nf.compile; none when not run."""
    jit = {(r.chain, r.dtype): r for r in records if r.provider == "neptune-jit"}
    if not jit:
        return []
    out = ["", "## Through the torch.compile backend (neptune-jit)", "",
           "| chain | dtype | nf.jit ms | vs torch.compile | vs nf.compile | cold compile s "
           "| correct |", "|---|---|---:|---:|---:|---:|---|"]
    for c in comparisons:
        r = jit.get((c.chain, c.dtype))
        if r is None:
            continue
        ms = r.ms if r.status == "ok" and not smoke else None
        out.append(f"| {c.chain} | {c.dtype} | {_num(ms, '.4f')} | "
                   f"{fmt_ratio(ratio(c._ms(c.compiled), ms))} | "
                   f"{fmt_ratio(ratio(ms, c._ms(c.neptune)))} | {_secs(r)} | {_status(r)} |")
    out.append("")
    out.append("vs nf.compile = nf.jit ms / nf.compile ms (above 1: the backend is slower "
               "than the chain written in neptune-fusion's language).")
    return out


def render_chains(console: Console, comparisons: Sequence[ChainComparison],
                  records: Sequence[ChainRecord], smoke: bool) -> None:
    """The per-chain table, and every failure with its reason, on the terminal."""
    if smoke:
        console.print("[bold yellow]CPU smoke run[/]: tiny shapes, Triton interpreter. "
                      "Only correctness is shown; timings here mean nothing.")
    table = Table(title="Chain suite" + (" (correctness only)" if smoke else ""),
                  title_justify="left")
    for name in HEAD_SMOKE if smoke else HEAD:
        table.add_column(name, overflow="fold")
    for row in chain_rows(comparisons, smoke):
        table.add_row(*row)
    console.print(table)
    for r in records:
        if r.status != "ok":
            where = escape(f"{r.chain} {r.dtype} {r.provider}: {r.reason}")
            console.print(f"[red]{r.status}[/] {where}", highlight=False)
