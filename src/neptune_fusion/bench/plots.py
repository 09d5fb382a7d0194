"""PNG plots, one per operator across sequence lengths, one line per provider.

matplotlib is optional (``pip install 'neptune-fusion[bench]'``): it is imported only here,
when plots are requested, and its absence is reported as a note instead of an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .record import Record


def have_matplotlib() -> bool:
    """Whether matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_operators(records: Sequence[Record], ceilings: dict, out_dir: Path,
                   smoke: bool) -> tuple[list[Path], str]:
    """Write ``<op>.png`` per operator; returns (paths, note explaining any omission)."""
    if not have_matplotlib():
        return [], ("matplotlib is not installed: plots skipped "
                    "(pip install 'neptune-fusion[bench]').")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    # One colour per provider across every plot, even where some provider has no point.
    colour = {p: f"C{i % 10}" for i, p in enumerate(dict.fromkeys(r.provider for r in records))}
    for op in dict.fromkeys(r.op for r in records):
        recs = [r for r in records if r.op == op and r.status == "ok"]
        if not recs:
            continue
        phase, unit = recs[0].phase, recs[0].unit
        panels = 1 if smoke else 2
        fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.2), squeeze=False)
        for provider in dict.fromkeys(r.provider for r in recs):
            pts = sorted((r.seq, r.ms, r.throughput) for r in recs if r.provider == provider)
            seqs = [p[0] for p in pts]
            # neptune-fusion drawn heavier so it stands out among the baselines.
            ours = provider == "neptune"
            style = dict(marker="o", label=provider, color=colour[provider],
                         linewidth=2.5 if ours else 1.2, zorder=3 if ours else 2)
            axes[0][0].plot(seqs, [p[1] for p in pts], **style)
            if not smoke:
                axes[0][1].plot(seqs, [p[2] for p in pts], **style)
        axes[0][0].set(yscale="log", xlabel="sequence length S", ylabel="ms")
        axes[0][0].set_xscale("log", base=2)
        if not smoke:
            ceiling = ceilings.get("matmul_tflops" if phase == "PF" else "copy_tbps")
            ax = axes[0][1]
            if ceiling:
                ax.axhline(ceiling, linestyle="--", color="grey", label="measured ceiling")
            ax.set(xlabel="sequence length S", ylabel=unit)
            ax.set_xscale("log", base=2)
            top = max([ceiling or 0.0] + [r.throughput or 0.0 for r in recs])
            ax.set_ylim(0, 1.3 * top if top else None)
            ax.legend(fontsize=7, ncol=2, loc="upper left")
        axes[0][0].legend(fontsize=7, ncol=2, loc="upper left")
        title = op + (" (CPU smoke: interpreter times, not a measurement)" if smoke else "")
        fig.suptitle(title)
        fig.tight_layout()
        path = out_dir / f"{op}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths, "" if paths else "no correct measurement to plot."
