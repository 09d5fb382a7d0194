"""The benchmark harness: the ten attention operators of :mod:`neptune_fusion.ops` at
benchmark sizes, the baselines a user would pick instead (SDPA backends, FlexAttention, a
baseline Triton FA2 kernel, torch.compile), neptune-fusion, a float64 correctness gate,
and the reports. ``--suite chains`` runs the reduction chains of :mod:`.chains` (norms
before a projection, log-sum-exp, softmax, variance, a chain that cannot fuse) against
torch eager and torch.compile instead.

Run ``neptune-fusion bench --help`` (or ``python -m neptune_fusion.bench``); the plots
need matplotlib (``pip install 'neptune-fusion[bench]'``). The core package never
imports this one. Importing it is cheap: the providers and Triton kernels load only when
a run starts.
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``neptune-fusion bench``; returns the exit status."""
    from .cli import main as cli_main
    return cli_main(argv)


__all__ = ["main"]
