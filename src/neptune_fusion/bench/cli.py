"""``neptune-fusion bench`` / ``python -m neptune_fusion.bench``: run, report, write results.

The arguments are defined once (:func:`add_arguments`) for both entry points: the
``bench`` subcommand of :mod:`neptune_fusion.cli` and this module's own parser. Importing
this module is cheap (no torch, no providers) so that the main command line can offer
``bench --help`` without loading the harness.

Exit status: 0 when the run completed (whatever each provider's status), 2 for a usage
error or when there is no GPU and ``--cpu-smoke`` was not given.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

from ..ops import OPERATORS
from ..settings import set_triton_interpret, triton_interpret
from .providers import OPT_IN, PROVIDER_NAMES

DTYPES = ("bfloat16", "float16")
CHAIN_DTYPES = ("float32", "bfloat16")
SUITES = ("attention", "chains", "serving")
DEFAULT_SEQS = (1024, 4096, 16384)
SMOKE_SEQS = (64,)
DESCRIPTION = ("Benchmark neptune-fusion attention against SDPA, FlexAttention, a "
               "baseline Triton FA2 kernel and torch.compile (--suite attention, the "
               "default), or reduction chains against torch eager and torch.compile "
               "(--suite chains), or batched decode over ragged and paged KV caches "
               "(--suite serving); each output gated by a float64 reference.")
NO_GPU = ("No CUDA GPU is visible: performance is only measured on a GPU.\n"
          "Run with --cpu-smoke to check the harness end to end on CPU "
          "(tiny shapes, Triton interpreter, no speed claims).")


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _seqs(text: str) -> tuple[int, ...]:
    try:
        seqs = tuple(int(t) for t in _csv(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seqs wants integers, got {text!r}") from None
    if not seqs or any(s < 1 for s in seqs):
        raise argparse.ArgumentTypeError(f"--seqs wants positive integers, got {text!r}")
    return seqs


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The benchmark's options, added to ``p``; returns ``p``."""
    p.add_argument("--suite", choices=SUITES, default="attention",
                   help="attention operators (default), reduction chains, or serving "
                        "decode over ragged and paged KV caches")
    p.add_argument("--ops", type=_csv, default=None,
                   help=f"comma-separated operators (default all: {','.join(OPERATORS)}) "
                        "or, with --suite chains, chains (default all), or, with --suite "
                        "serving, scenarios: B1,B8,B64, 32/8,32/32, ragged,paged16,paged64 "
                        "(default all)")
    p.add_argument("--seqs", type=_seqs, default=None,
                   help="comma-separated key lengths (default 1024,4096,16384; smoke: 64)")
    p.add_argument("--dtype", choices=sorted({*DTYPES, *CHAIN_DTYPES}), default=None,
                   help="input dtype (attention: bfloat16 or float16, default float16; "
                        "chains: float32 or bfloat16, default both in one run; serving: "
                        "float16 or bfloat16, default both)")
    p.add_argument("--providers", type=_csv, default=None,
                   help=f"comma-separated providers of {','.join(PROVIDER_NAMES)} (default "
                        f"all but the opt-in {','.join(OPT_IN)})")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default benchmarks/results/<date>-<gpu>)")
    p.add_argument("--backward", action="store_true",
                   help="attention suite: time forward + backward (out.backward(dout)) of "
                        "neptune-fusion, FlexAttention and SDPA, gradients gated against "
                        "float64 autograd (default ops PF-Causal,PF-GQA,PF-SoftCap,"
                        "PF-Window; seqs 4096,16384; providers flex,sdpa,neptune)")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="tiny shapes on CPU under the Triton interpreter; no speed claims")
    p.add_argument("--timer", choices=("bench", "graph"), default=None,
                   help="attention (forward) and chain suites: how times are taken, every "
                        "provider alike: bench (default: do_bench of one eager call, L2 "
                        "cleared, launch and host work included) or graph (CUDA-graph "
                        "replay: GPU time alone)")
    p.add_argument("--rounds", type=int, default=None,
                   help="attention (forward) and chain suites: time each point's providers in "
                        "this many "
                        "interleaved rounds, the order turned each round; the median counts "
                        "and the report gives the spread (default 3; 1 in --cpu-smoke)")
    p.add_argument("--warmup-ms", type=int, default=25, help="do_bench warm-up (ms)")
    p.add_argument("--rep-ms", type=int, default=100, help="do_bench repetition time (ms)")
    p.add_argument("--no-plots", action="store_true",
                   help="skip the PNG plots (they need matplotlib: the [bench] extra)")
    return p


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m neptune_fusion.bench``."""
    return add_arguments(argparse.ArgumentParser(prog="neptune-fusion bench",
                                                 description=DESCRIPTION))


def slug(text: str) -> str:
    """A folder-name-safe lower-case slug ("NVIDIA H200" -> "nvidia-h200")."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def default_out_dir(now: datetime, device_name: str, suite: str = "") -> Path:
    """benchmarks/results/<date>-<device>[-<suite>] relative to the working directory."""
    tail = f"-{suite}" if suite else ""
    return (Path("benchmarks") / "results"
            / f"{now:%Y-%m-%d-%H%M%S}-{slug(device_name)}{tail}")


def run(args: argparse.Namespace, print_usage: Callable[[], None] = lambda: None) -> int:
    """Run the benchmark for parsed ``args`` (:func:`add_arguments`); the exit status."""
    import torch
    from rich.console import Console
    console = Console()
    if args.cpu_smoke:
        # Triton reads this when a kernel is defined: before any provider module is imported.
        set_triton_interpret()
        device = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            console.print(f"[bold red]error:[/] {NO_GPU}")
            return 2
        if triton_interpret():
            console.print("[bold red]error:[/] TRITON_INTERPRET is set: unset it to time "
                          "compiled kernels on the GPU (it is only for --cpu-smoke).")
            return 2
        device = torch.device("cuda", torch.cuda.current_device())

    if args.timer is not None and (args.suite == "serving" or args.backward):
        return _usage_error(console, print_usage, "--timer is an option of the attention "
                            "suite's forward and of the chain suite")
    if args.rounds is not None and (args.suite == "serving" or args.backward):
        return _usage_error(console, print_usage, "--rounds is an option of the attention "
                            "suite's forward and of the chain suite")
    if args.rounds is not None and args.rounds < 1:
        return _usage_error(console, print_usage, f"--rounds must be at least 1, not "
                            f"{args.rounds}")
    if args.timer == "graph" and args.cpu_smoke:
        return _usage_error(console, print_usage, "--timer graph needs a GPU (the smoke "
                            "run's times are wall-clock)")
    if args.backward:
        if args.suite != "attention":
            return _usage_error(console, print_usage,
                                "--backward is a flag of the attention suite")
        return run_backward(args, console, device, print_usage)
    if args.suite == "chains":
        return run_chains(args, console, device, print_usage)
    if args.suite == "serving":
        return run_serving(args, console, device, print_usage)
    if args.dtype not in (None, *DTYPES):
        print_usage()
        console.print(f"[bold red]error:[/] the attention suite takes --dtype "
                      f"{' or '.join(DTYPES)}, not {args.dtype}")
        return 2
    from .providers import select_providers
    from .workloads import select_operators
    try:
        ops = select_operators(args.ops)
        providers = select_providers(args.providers)
    except ValueError as exc:
        print_usage()
        console.print(f"[bold red]error:[/] {exc}")
        return 2
    seqs = args.seqs or (SMOKE_SEQS if args.cpu_smoke else DEFAULT_SEQS)

    from .session import Session
    session = Session(ops=ops, seqs=seqs, providers=providers,
                      dtype=getattr(torch, args.dtype or "float16"), device=device,
                      smoke=args.cpu_smoke,
                      warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, plots=not args.no_plots,
                      timer_kind=args.timer or "bench",
                      rounds=args.rounds or (1 if args.cpu_smoke else 3))
    now = datetime.now(timezone.utc)
    device_name = "cpu-smoke" if args.cpu_smoke else torch.cuda.get_device_name(device)
    out_dir = args.out or default_out_dir(now, device_name)
    session.run(console, _progress(console), out_dir, now)
    return 0


def _progress(console):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                    transient=True)


def run_chains(args: argparse.Namespace, console, device,
               print_usage: Callable[[], None]) -> int:
    """``--suite chains``: every chain (or ``--ops``) at each dtype; the exit status."""
    import torch

    from .chains import select_chains
    from .providers.chains import select_chain_providers
    error = ""
    if args.dtype is not None and args.dtype not in CHAIN_DTYPES:
        error = (f"the chain suite takes --dtype {' or '.join(CHAIN_DTYPES)}, "
                 f"not {args.dtype}")
    elif args.seqs is not None:
        error = "--seqs is for the attention suite; chain sizes are fixed per chain"
    else:
        try:
            chains = select_chains(args.ops)
            providers = select_chain_providers(args.providers)
        except ValueError as exc:
            error = str(exc)
    if error:
        return _usage_error(console, print_usage, error)
    from .chain_session import ChainSession
    dtypes = (args.dtype,) if args.dtype else CHAIN_DTYPES
    session = ChainSession(chains=chains, dtypes=tuple(getattr(torch, d) for d in dtypes),
                           providers=providers, device=device, smoke=args.cpu_smoke,
                           warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                           timer=args.timer or "bench",
                           rounds=args.rounds or (1 if args.cpu_smoke else 3))
    return _run_session(args, console, session, device, "chains")


def _usage_error(console, print_usage: Callable[[], None], error: str) -> int:
    print_usage()
    console.print(f"[bold red]error:[/] {error}")
    return 2


def _run_session(args: argparse.Namespace, console, session, device, topic: str) -> int:
    """Run a suite's session into ``--out`` (default: a dated folder named by ``topic``)."""
    import torch
    now = datetime.now(timezone.utc)
    device_name = "cpu-smoke" if args.cpu_smoke else torch.cuda.get_device_name(device)
    out_dir = args.out or default_out_dir(now, device_name, topic)
    session.run(console, _progress(console), out_dir, now)
    return 0


def run_backward(args: argparse.Namespace, console, device,
                 print_usage: Callable[[], None]) -> int:
    """``--backward``: forward + backward of the attention operators (docs/benchmarks.md)."""
    import torch

    from .backward import DEFAULT_SEQS as BACKWARD_SEQS
    from .backward import PROVIDERS as BACKWARD_PROVIDERS
    from .backward import SMOKE_SEQS as BACKWARD_SMOKE_SEQS
    from .backward import select_operators as select_backward_operators
    error = ""
    providers = tuple(args.providers or BACKWARD_PROVIDERS)
    unknown = sorted(set(providers) - set(BACKWARD_PROVIDERS))
    if args.dtype not in (None, *DTYPES):
        error = (f"--backward takes --dtype {' or '.join(DTYPES)}, not {args.dtype}")
    elif unknown:
        error = (f"unknown --backward provider(s) {', '.join(unknown)}; choose from "
                 f"{', '.join(BACKWARD_PROVIDERS)}")
    else:
        try:
            ops = select_backward_operators(args.ops)
        except ValueError as exc:
            error = str(exc)
    if error:
        return _usage_error(console, print_usage, error)
    from .backward_session import BackwardSession
    seqs = args.seqs or (BACKWARD_SMOKE_SEQS if args.cpu_smoke else BACKWARD_SEQS)
    session = BackwardSession(ops=ops, seqs=seqs, providers=providers,
                              dtype=getattr(torch, args.dtype or "float16"), device=device,
                              smoke=args.cpu_smoke, warmup_ms=args.warmup_ms,
                              rep_ms=args.rep_ms)
    return _run_session(args, console, session, device, "backward")


def run_serving(args: argparse.Namespace, console, device,
                print_usage: Callable[[], None]) -> int:
    """``--suite serving``: batched decode over ragged and paged KV caches (docs/serving.md)."""
    import torch

    from .serving import points
    from .serving_session import PROVIDERS, ServingSession
    error = ""
    providers = tuple(args.providers or PROVIDERS)
    if args.dtype is not None and args.dtype not in DTYPES:
        error = f"the serving suite takes --dtype {' or '.join(DTYPES)}, not {args.dtype}"
    elif args.seqs is not None:
        error = "--seqs is for the attention suite; serving lengths are drawn per sequence"
    elif set(providers) - set(PROVIDERS):
        error = (f"unknown serving provider(s) {', '.join(sorted(set(providers) - set(PROVIDERS)))}"
                 f"; choose from {', '.join(PROVIDERS)}")
    else:
        try:
            pts = points(args.cpu_smoke, args.ops)
        except ValueError as exc:
            error = str(exc)
    if error:
        return _usage_error(console, print_usage, error)
    dtypes = (args.dtype,) if args.dtype else ("float16", "bfloat16")
    session = ServingSession(points=pts, dtypes=tuple(getattr(torch, d) for d in dtypes),
                             providers=providers, device=device, smoke=args.cpu_smoke,
                             rep_ms=args.rep_ms)
    return _run_session(args, console, session, device, "serving")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the benchmark; see ``--help``. Returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    return run(args, parser.print_usage)
