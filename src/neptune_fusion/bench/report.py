"""The markdown report written next to ``results.json``."""

from __future__ import annotations

from collections.abc import Sequence

from .clocks import clock_lines, mhz_text
from .metrics import Comparison
from .record import Record
from .table import fmt_err, fmt_ratio
from .timing import TIMERS


def _num(x: float | None, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def records_table(records: Sequence[Record], smoke: bool) -> list[str]:
    """One markdown row per record (timing columns omitted in the smoke run)."""
    if smoke:
        lines = ["| operator | S | provider | status | rel. error | reason / note |",
                 "|---|---:|---|---|---:|---|"]
    else:
        lines = ["| operator | S | provider | status | ms | spread | SM MHz | throughput | "
                 "% ceiling | rel. error | compile s | reason / note |",
                 "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in records:
        text = _escape(r.reason or r.note)
        if smoke:
            lines.append(f"| {r.op} | {r.seq} | {r.provider} | {r.status} | "
                         f"{fmt_err(r.error)} | {text} |")
            continue
        rate = "—" if r.throughput is None else f"{r.throughput:.3g} {r.unit}"
        pct = "—" if r.fraction_of_ceiling is None else f"{100 * r.fraction_of_ceiling:.0f}%"
        comp = _num(None if r.compile_ms is None else r.compile_ms / 1e3, ".2f")
        spread = "—" if r.ms_spread is None else f"{100 * r.ms_spread:.1f}%"
        mhz = mhz_text(r.sm_mhz_min, r.sm_mhz_max, r.power_capped)
        lines.append(f"| {r.op} | {r.seq} | {r.provider} | {r.status} | {_num(r.ms, '.4f')} | "
                     f"{spread} | {mhz} | {rate} | {pct} | {fmt_err(r.error)} | {comp} | "
                     f"{text} |")
    return lines


def comparisons_table(comparisons: Sequence[Comparison]) -> list[str]:
    """neptune-fusion against the fastest baseline and compiler, one row per point."""
    lines = ["| operator | S | neptune-fusion ms | fastest baseline | ms | speedup | "
             "fastest compiler | ms | speedup |",
             "|---|---:|---:|---|---:|---:|---|---:|---:|"]
    for c in comparisons:
        lines.append(f"| {c.op} | {c.seq} | {_num(c.neptune_ms, '.4f')} | {c.baseline or '—'} | "
                     f"{_num(c.baseline_ms, '.4f')} | {fmt_ratio(c.vs_baseline)} | "
                     f"{c.compiler or '—'} | {_num(c.compiler_ms, '.4f')} | "
                     f"{fmt_ratio(c.vs_compiler)} |")
    return lines


def header(doc: dict, title: str) -> list[str]:
    """A report's first lines, shared by both suites: title, the smoke warning, device and
    versions."""
    env = doc["environment"]
    out = [f"# {title}, {doc['date']}", ""]
    if doc["mode"] == "cpu-smoke":
        out += ["**CPU smoke run** (Triton interpreter, tiny shapes): correctness only; "
                "no timing in this report means anything.", ""]
    return out + [f"* device: {env['gpu'] or env['device']}",
                  f"* torch {env['torch']}, Triton {env['triton']}, Python {env['python']}, "
                  f"CUDA {env['cuda']}"]


def ceiling_lines(ceil: dict) -> list[str]:
    """The report section on the ceilings measured in the run, shared by both suites."""
    return ["## Ceilings (measured in this run)", "",
            f"* fp16 matmul {'x'.join(map(str, ceil['matmul_shape']))}: "
            f"{_num(ceil['matmul_tflops'], '.1f')} TFLOP/s",
            f"* device-to-device copy of {ceil['copy_bytes'] / 2**30:.0f} GiB "
            f"(read + write): {_num(ceil['copy_tbps'], '.2f')} TB/s", ""]


def markdown(doc: dict, records: Sequence[Record], comparisons: Sequence[Comparison],
             plots: Sequence[str], plot_note: str) -> str:
    """The whole report as markdown, from the results document and its records."""
    cfg, ceil = doc["config"], doc["ceilings"]
    smoke = doc["mode"] == "cpu-smoke"
    out = header(doc, "neptune-fusion benchmark")
    out += [
            f"* dtype {cfg['dtype']}, batch {cfg['batch']}, head dim {cfg['head_dim']}, "
            f"sequence lengths {', '.join(map(str, cfg['seqs']))}",
            f"* correctness gate: relative Frobenius error against float64 <= "
            f"{cfg['threshold']:g}"]
    if not smoke:
        out.append(f"* times: {TIMERS.get(cfg.get('timer', 'bench'), cfg.get('timer'))}; "
                   "the ceilings with do_bench")
    out.append("")
    if not smoke:
        out += ceiling_lines(ceil) + [
                "## neptune-fusion against the baselines", "",
                "Speedup = other time / neptune-fusion time (above 1: neptune-fusion is "
                "faster).", ""]
        for phase, s in doc["summary"].items():
            out.append(f"* {phase}: geometric mean {fmt_ratio(s['geomean_vs_baseline'])} over "
                       f"the fastest baseline ({s['points_vs_baseline']} points), "
                       f"{fmt_ratio(s['geomean_vs_compiler'])} over the fastest compiler "
                       f"({s['points_vs_compiler']} points)")
        out += [""] + comparisons_table(comparisons) + [""] + clock_lines(records)
    out += ["## Every measurement", ""] + records_table(records, smoke) + [""]
    out += ["## Plots", ""]
    out += [f"![{p}]({p})" for p in plots] or [plot_note or "No plots."]
    out.append("")
    return "\n".join(out)
