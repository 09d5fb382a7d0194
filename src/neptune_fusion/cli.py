"""The ``neptune-fusion`` command line (also ``python -m neptune_fusion``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import numpy as np
from rich.console import Console
from rich.syntax import Syntax

from ._version import __version__
from .bench import cli as bench_cli  # the harness's options only: no torch, no providers
from .ops import OPERATORS

DEMO_TOLERANCE = 1e-10
KERNEL_TOLERANCE = 1e-4  # the kernel computes in float32 (fp32 inputs, fp32 accumulation)


def numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """Attention written directly in float64 NumPy: the demo's independent check."""
    s = (q @ k.T) * scale
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p @ v) / p.sum(axis=1, keepdims=True)


def run_demo(args: argparse.Namespace, console: Console) -> int:
    """Define plain attention, print it, evaluate it, and compare with NumPy."""
    from .api import evaluate
    from .frontend.examples import plain_attention
    from .ir.printer import program_str
    from .ir.verify import verify

    [o], (q, k, v) = plain_attention("N", "M", "D")
    verify(o)
    console.rule("[bold]plain attention, as written")
    console.print(Syntax(program_str(o), "python", theme="ansi_dark"), soft_wrap=True)
    rng = np.random.default_rng(args.seed)
    n, m, d = args.n, args.m, args.d
    feeds = {q: rng.standard_normal((n, d)), k: rng.standard_normal((m, d)),
             v: rng.standard_normal((m, d))}
    got = evaluate(o, feeds)
    want = numpy_attention(feeds[q], feeds[k], feeds[v], 1.0 / np.sqrt(d))
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    console.rule("[bold]reference evaluation (float64)")
    console.print(f"sizes: N={n} M={m} D={d}  seed={args.seed}", markup=False)
    console.print(f"max abs error vs hand-written NumPy attention: {err:.3e}", markup=False)
    ok = err <= DEMO_TOLERANCE  # also catches NaN
    if not ok:
        console.print(f"[bold red]FAIL[/]: error exceeds {DEMO_TOLERANCE:g}")
    else:
        console.print(f"[bold green]OK[/]: within {DEMO_TOLERANCE:g}")
    return 0 if (ok and _demo_kernel(args, console, o, [q, k, v], feeds, got)) else 1


def _demo_kernel(args, console: Console, o, inputs, feeds, want) -> bool:
    """Compile the same definition, show the plan and the kernel's outline, run it and
    compare with ``want``, the float64 reference."""
    import torch

    from . import compile as nf_compile
    from .codegen.outline import outline
    kernel = nf_compile(o, inputs, block_m=16, block_n=16)
    console.rule("[bold]derived fusion plan")
    console.print(str(kernel.plan), markup=False, soft_wrap=True)
    console.rule("[bold]generated Triton kernel (outline)")
    for line in outline(kernel.program):
        console.print(line, markup=False, soft_wrap=True)
    if args.source:
        console.print(Syntax(kernel.source, "python", theme="ansi_dark"), soft_wrap=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tensors = [torch.tensor(feeds[p], dtype=torch.float32, device=device) for p in inputs]
    got = kernel(*tensors).double().cpu().numpy()
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    console.rule("[bold]kernel run (float32)")
    how = "compiled for CUDA" if device == "cuda" else "Triton interpreter on CPU"
    console.print(f"device: {device} ({how}); 1 kernel, {kernel.source.count(chr(10))} "
                  "lines of Triton", markup=False)
    console.print(f"max abs error of the kernel vs the float64 reference: {err:.3e}",
                  markup=False)
    if not err <= KERNEL_TOLERANCE:
        console.print(f"[bold red]FAIL[/]: kernel error exceeds {KERNEL_TOLERANCE:g}")
        return False
    console.print(f"[bold green]OK[/]: kernel within {KERNEL_TOLERANCE:g}")
    return True


def run_cache(args: argparse.Namespace, console: Console) -> int:
    """List the tuned schedules in the cache, or clear everything the package wrote."""
    from .errors import NeptuneError
    from .runtime.disk_cache import DiskCache, clear_all
    from .schedule.schedule import Schedule
    store = DiskCache(args.dir)
    if args.clear:
        n = clear_all(store.root)
        old = f", and {n['kernels']} kernel file(s) of an earlier version" \
            if n["kernels"] else ""
        console.print(f"removed {n['schedules']} tuned schedule(s) and {n['specs']} stored "
                      f"kernel record(s) from {store.root}{old}", markup=False)
        return 0
    entries = store.entries()
    console.print(f"{len(entries)} tuned schedule(s) in {store.directory}", markup=False)
    for e in entries:
        key, rec = e["key"], e["record"]
        sizes = " ".join(f"{n}<={v}" for n, v in key.get("sizes", []))
        try:
            sched = Schedule.from_dict(rec.get("schedule", {})).brief()
        except NeptuneError as err:   # a record of another version: say so, list the rest
            sched = f"unreadable schedule ({str(err).splitlines()[0]})"
        console.print(f"  {key.get('device', '?')}  {key.get('program', '?')[:12]}  {sizes}: "
                      f"{sched} ({rec.get('source', '?')})", markup=False)
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seed(text: str) -> int:
    value = int(text)
    if not 0 <= value < 2 ** 63:   # what NumPy's generators take
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to 2**63 - 1, got {value}")
    return value


SHOW_EXAMPLE = """\
    import neptune_fusion as nf

    def softmax():
        N, M = nf.sizes("N M")
        x = nf.placeholder((N, M), "float32", name="x")
        j = nf.reduce_axis(M, "j")
        m = nf.compute((N,), lambda i: nf.max(x[i, j], j), name="m")
        e = nf.compute((N, M), lambda i, jj: nf.exp(x[i, jj] - m[i]), name="e")
        s = nf.compute((N,), lambda i: nf.sum(e[i, j], j), name="s")
        return nf.compute((N, M), lambda i, jj: e[i, jj] / s[i], name="y")
"""


def show_help() -> str:
    """The epilog of ``show --help``: targets, the program contract, sizes, what runs."""
    paragraphs = [
        f"TARGET is an operator of neptune_fusion.ops ({', '.join(OPERATORS)}; any case) "
        "or a program in a Python file, FILE.py:FUNCTION. FUNCTION is called with no "
        "arguments and must return the program's outputs: an nf tensor made by "
        "nf.compute, a list of them, or a pair (outputs, inputs) whose inputs (a list of "
        "placeholders) fix the kernel's argument order. For example:",
        None,
        "Sizes (--shape): an operator has S (the sequence length: prefill N = M = S, "
        "decode M = S with one query), or B, N, M directly; defaults B=1 and S=1024 "
        "(prefill) or S=4096 (decode); heads and head dim are the operator's. A program's "
        "symbolic sizes are named as in its nf.sizes(...); each one not given is 128.",
        "--schedule and --source run nothing and need no GPU. On CPU they show the "
        "auto-scheduler's pick (the cost model's best schedule: there is nothing to "
        "measure under Triton's interpreter); on a GPU, the cost model's best, which the "
        "first call of that shape class measures against the next few before keeping the "
        "fastest. Several views may be combined; none given means --plan. Errors exit "
        "with status 2 and one line on stderr."]
    return "\n\n".join(SHOW_EXAMPLE.rstrip() if p is None else _wrap(p) for p in paragraphs)


def _wrap(text: str) -> str:
    import textwrap
    return textwrap.fill(text, width=88, break_on_hyphens=False)


def run_show(args: argparse.Namespace, console: Console) -> int:
    """Print the requested views of an operator or a program (see SHOW_HELP)."""
    from . import explain as ex
    wanted = [v for v in ("ir", "plan", "schedule", "source") if getattr(args, v)] or ["plan"]
    try:
        target = ex.resolve(args.target, ex.parse_shape(args.shape), args.dtype)
        choice = ex.choose(target) if {"schedule", "source"} & set(wanted) else None
        views = {"ir": lambda: ex.ir_text(target), "plan": lambda: ex.plan_text(target),
                 "schedule": lambda: ex.schedule_text(target, choice, args.top),
                 "source": lambda: ex.source_text(target, choice)}
        texts = [(v, views[v]()) for v in wanted]
    except ex.ShowError as err:
        print(f"neptune-fusion show: error: {err}", file=sys.stderr)
        return 2
    for view, text in texts:
        if len(texts) > 1:
            console.rule(f"[bold]{view}")
        print(text)
    return 0


def _add_show(sub) -> None:
    show = sub.add_parser(
        "show", help="print the plan, generated source or chosen schedule of an operator "
                     "or a program",
        description=_wrap("Show what neptune-fusion makes of TARGET: the fusion plan, the "
                          "generated Triton source, the schedule the auto-scheduler picks "
                          "on this machine, or the program itself."),
        epilog=show_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    show.add_argument("target", metavar="TARGET", help="an operator name or FILE.py:FUNCTION")
    show.add_argument("--plan", action="store_true",
                      help="the fusion plan: fused groups, carried state, proved repairs")
    show.add_argument("--source", action="store_true",
                      help="the generated Triton source under the chosen schedule (every "
                           "kernel: two for split-k)")
    show.add_argument("--schedule", action="store_true",
                      help="the chosen schedule as JSON and the cost model's best candidates "
                           "with their predicted times")
    show.add_argument("--ir", action="store_true", help="the program as written")
    show.add_argument("--shape", action="append", metavar="NAME=N[,NAME=N]",
                      help="sizes, e.g. S=4096 or N=4096,M=4096 (repeatable)")
    show.add_argument("--dtype", default=None,
                      help="operators only: float16 (default), bfloat16 or float32")
    show.add_argument("--top", type=_positive, default=5,
                      help="candidates listed by --schedule (default 5)")
    show.set_defaults(handler=run_show)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: global options and one sub-parser per command."""
    parser = argparse.ArgumentParser(
        prog="neptune-fusion",
        description="Plain reduction chains (attention, softmax, norms) in; fused "
                    "single-pass kernels out.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo", help="define plain attention, evaluate it, compile it, run the kernel",
        description="Define plain attention in the language, print it, evaluate it with the "
                    "float64 reference on random inputs and compare with NumPy; then print "
                    "the derived fusion plan and the generated kernel's outline, run the "
                    "kernel (CUDA if present, else Triton's interpreter) and compare. Exits "
                    f"1 if the reference error exceeds {DEMO_TOLERANCE:g} or the kernel's "
                    f"exceeds {KERNEL_TOLERANCE:g}.")
    demo.add_argument("--n", type=_positive, default=16, help="queries (default 16)")
    demo.add_argument("--m", type=_positive, default=64, help="keys and values (default 64)")
    demo.add_argument("--d", type=_positive, default=32, help="head dimension (default 32)")
    demo.add_argument("--seed", type=_seed, default=0,
                      help="random seed, >= 0 (default 0)")
    demo.add_argument("--source", action="store_true",
                      help="also print the generated Triton source")
    demo.set_defaults(handler=run_demo)
    cache = sub.add_parser(
        "cache", help="list or clear the tuned schedules on disk",
        description="List the schedules the auto-scheduler stored (device, program hash, "
                    "size buckets, schedule, how it was chosen), or remove everything "
                    "neptune-fusion wrote there with --clear. The cache is "
                    "$NEPTUNE_FUSION_CACHE_DIR, else ~/.cache/neptune-fusion; a directory "
                    "another user owns or can write is not used (docs/cache.md).")
    cache.add_argument("--clear", action="store_true",
                       help="remove every stored schedule and kernel record (and the "
                            "kernels/ folder of earlier versions)")
    cache.add_argument("--dir", default=None, help="cache directory (default: as above)")
    cache.set_defaults(handler=run_cache)
    _add_show(sub)
    bench = bench_cli.add_arguments(sub.add_parser(
        "bench", help="benchmark the ten attention operators against SDPA, FlexAttention, "
                      "Triton and torch.compile, or (--suite chains) reduction chains against "
                      "torch eager and torch.compile (plots need the [bench] extra)",
        description=bench_cli.DESCRIPTION + " Same as python -m neptune_fusion.bench."))
    bench.set_defaults(handler=lambda args, console: run_bench(args, bench))
    return parser


def run_bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The benchmark harness (:mod:`neptune_fusion.bench.cli`)."""
    return bench_cli.run(args, parser.print_usage)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        parser.print_help()
        return 2
    return args.handler(args, Console(highlight=False))
