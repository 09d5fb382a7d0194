"""The terminal report: one rich table per phase, geometric means, and the reasons.

Rows are (operator, S); each provider has a column holding its time, its throughput and
the fraction of the measured ceiling; the last two columns are neptune-fusion's speedup
over the fastest baseline and over the fastest compiler. The CPU smoke run shows only the
status and the relative error of every cell: it makes no speed claims.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from .metrics import Comparison, phase_summary
from .providers.base import Provider
from .record import Record

PHASE_TITLES = {"PF": "Prefill (arithmetic-bound: TFLOP/s, % of matmul ceiling)",
                "DC": "Decode (bandwidth-bound: TB/s of K+V, % of copy ceiling)"}
PHASE_NAMES = {"PF": "Prefill", "DC": "Decode"}
SHORT_UNITS = {"TFLOP/s": "TF/s", "TB/s": "TB/s"}


def fmt_ratio(x: float | None) -> str:
    """``1.23x`` or an em dash."""
    return "—" if x is None else f"{x:.2f}x"


def fmt_err(x: float | None) -> str:
    """A relative error in short scientific notation."""
    return "—" if x is None else f"{x:.1e}"


def cell(rec: Record | None, smoke: bool, fastest: bool) -> str:
    """The rich markup of one provider's cell."""
    if rec is None:
        return ""
    if rec.status == "unsupported":
        return "[dim]n/a[/]"
    if rec.status == "error":
        return "[bold red]ERROR[/]"
    if rec.status == "wrong":
        return f"[bold red]WRONG[/] {fmt_err(rec.error)}"
    if smoke:
        return f"[green]ok[/] {fmt_err(rec.error)}"
    ms = f"{rec.ms:.3f} ms"
    ms = f"[bold]{ms}[/]" if fastest else ms
    rate = f"{rec.throughput:.3g} {SHORT_UNITS.get(rec.unit, rec.unit)}"
    if rec.fraction_of_ceiling is not None:
        rate += f" {100 * rec.fraction_of_ceiling:.0f}%"
    return f"{ms}\n[dim]{rate}[/]"


def phase_table(phase: str, records: Sequence[Record], comparisons: Sequence[Comparison],
                providers: Sequence[Provider], smoke: bool) -> Table | None:
    """The table of one phase, or None when the run has no operator of that phase."""
    comps = [c for c in comparisons if c.phase == phase]
    if not comps:
        return None
    title = f"{PHASE_NAMES[phase]} (correctness only)" if smoke else PHASE_TITLES[phase]
    table = Table(title=title, show_lines=True, title_justify="left")
    table.add_column("operator")
    table.add_column("S", justify="right")
    for p in providers:
        table.add_column(p.label, justify="right")
    if not smoke:
        table.add_column("NF vs fastest baseline", justify="right")
        table.add_column("NF vs fastest compiler", justify="right")
    by_point = {(r.op, r.seq, r.provider): r for r in records}
    for c in comps:
        row = [c.op, str(c.seq)]
        row += [cell(by_point.get((c.op, c.seq, p.name)), smoke, p.name == c.baseline)
                for p in providers]
        if not smoke:
            row.append(f"{fmt_ratio(c.vs_baseline)}\n[dim]{c.baseline or ''}[/]")
            row.append(f"{fmt_ratio(c.vs_compiler)}\n[dim]{c.compiler or ''}[/]")
        table.add_row(*row)
    return table


def reasons(records: Sequence[Record]) -> list[tuple[str, str, str, str]]:
    """(provider, status, reason, where) for every non-ok outcome, grouped by provider (in
    order of first appearance) and reason."""
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for r in records:
        if r.status != "ok":
            where = grouped.setdefault((r.provider, r.status, r.reason), [])
            where.append(f"{r.op}@{r.seq}")
    order = {name: i for i, name in enumerate(dict.fromkeys(r.provider for r in records))}
    rows = [(p, s, why, ", ".join(where)) for (p, s, why), where in grouped.items()]
    return sorted(rows, key=lambda row: order[row[0]])


def render(console: Console, records: Sequence[Record], comparisons: Sequence[Comparison],
           providers: Sequence[Provider], smoke: bool) -> None:
    """Print the phase tables, the geometric means and the reasons to ``console``."""
    if smoke:
        console.print("[bold yellow]CPU smoke run[/]: tiny shapes, Triton interpreter. "
                      "Only correctness is shown; timings here mean nothing.")
    for phase in ("PF", "DC"):
        table = phase_table(phase, records, comparisons, providers, smoke)
        if table is not None:
            console.print(table)
    if not smoke:
        for phase, s in phase_summary(comparisons).items():
            if any(c.phase == phase for c in comparisons):
                console.print(
                    f"[bold]{phase}[/] geometric mean speedup of neptune-fusion: "
                    f"{fmt_ratio(s['geomean_vs_baseline'])} over the fastest baseline "
                    f"({s['points_vs_baseline']} points), "
                    f"{fmt_ratio(s['geomean_vs_compiler'])} over the fastest compiler "
                    f"({s['points_vs_compiler']} points)")
    rows = reasons(records)
    if rows:
        notes = Table(title="Not timed", title_justify="left", show_lines=False)
        for name in ("provider", "status", "reason", "where"):
            notes.add_column(name, overflow="fold")
        for provider, status, why, where in rows:
            notes.add_row(provider, status, why, where)
        console.print(notes)
