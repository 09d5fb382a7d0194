"""``neptune-fusion show``: what the compiler makes of an operator or a program.

A *target* is one of the ten operators of :mod:`neptune_fusion.ops` (``PF-Causal``) or a
function in a Python file (``path/to/file.py:function``). The function is called with no
arguments and returns its program's outputs: an nf tensor, a list of them, or a pair
``(outputs, inputs)`` whose ``inputs`` (a list of placeholders) fixes the kernel's
argument order, as :func:`neptune_fusion.frontend.examples.plain_attention` does.

Each view is a pure function of the target: :func:`ir_text` (the program as written),
:func:`plan_text` (the fusion plan), :func:`schedule_text` (the schedule the
auto-scheduler picks for the target's sizes on this machine, and the cost model's best
candidates) and :func:`source_text` (the generated Triton source of that schedule, every
kernel of it). Sizes come from ``--shape``; every failure a user can cause is a
:class:`ShowError` with a one-line message.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from . import ops
from .errors import NeptuneError
from .ir.graph import placeholders
from .ir.nodes import Compute, Placeholder, Size, Tensor

FILE_SIZE_DEFAULT = 128            # a program's symbolic sizes not given by --shape
OPERATOR_SEQ_DEFAULT = {"PF": 1024, "DC": 4096}
OPERATOR_SIZES = ("S", "B", "N", "M")
DTYPES = ("float16", "bfloat16", "float32")


class ShowError(Exception):
    """A mistake in what was asked (unknown operator, missing file or function, bad
    ``--shape``), or a program the compiler refuses: one line for the user."""


@dataclass(frozen=True)
class Target:
    """A program to show: its outputs and inputs, the sizes its symbolic sizes take
    (by name, in input order), and which of those were left at their default."""

    label: str
    outputs: tuple
    inputs: tuple
    sizes: dict
    defaulted: tuple[str, ...] = ()

    def shape_text(self) -> str:
        """``B=1 N=1024 M=1024`` (defaults marked), or ``no symbolic sizes``."""
        if not self.sizes:
            return "no symbolic sizes"
        return " ".join(f"{n}={v}" + ("*" if n in self.defaulted else "")
                        for n, v in self.sizes.items()) + \
            (" (* default)" if self.defaulted else "")


def parse_shape(texts: list[str] | None) -> dict[str, int]:
    """``["S=4096"]`` or ``["N=4096,M=2048"]`` -> sizes by name (later ones win)."""
    sizes: dict[str, int] = {}
    for text in texts or ():
        for item in (t.strip() for t in text.split(",")):
            name, eq, value = item.partition("=")
            name, value = name.strip(), value.strip()
            if not (eq and name.isidentifier() and value.isdigit() and int(value) > 0):
                raise ShowError(f"bad --shape {item!r}: want NAME=POSITIVE_INT, several "
                                "separated by commas (e.g. S=4096 or N=4096,M=4096)")
            sizes[name] = int(value)
    return sizes


# ------------------------------------------------------------------ targets


def resolve(target: str, shape: dict[str, int], dtype: str | None) -> Target:
    """An operator name or ``file.py:function`` with its sizes bound."""
    if ":" in target or target.endswith(".py"):
        if dtype is not None:
            raise ShowError("--dtype applies to operators; a program's placeholders carry "
                            "their own dtypes")
        return file_target(target, shape)
    return operator_target(target, shape, dtype or "float16")


def operator_target(name: str, shape: dict[str, int], dtype: str) -> Target:
    """Operator ``name`` at ``shape``: ``S`` is the sequence length (prefill N = M = S,
    decode M = S with one query); ``B``, ``N``, ``M`` set the definition's sizes."""
    try:
        op = ops.operator(name)
    except ValueError as err:
        raise ShowError(str(err)) from None
    if dtype not in DTYPES:
        raise ShowError(f"--dtype {dtype!r}: choose from {', '.join(DTYPES)}")
    unknown = sorted(set(shape) - set(OPERATOR_SIZES))
    if unknown:
        raise ShowError(f"--shape {', '.join(unknown)}: an operator's sizes are "
                        f"{', '.join(OPERATOR_SIZES)} (S: sequence length)")
    if "S" in shape and ({"N", "M"} & set(shape)):
        raise ShowError("--shape: give S (the sequence length) or N and M, not both")
    seq = shape.get("S", OPERATOR_SEQ_DEFAULT[op.phase])
    given = {"B": shape.get("B"), "N": shape.get("N"), "M": shape.get("M")}
    if "S" in shape:
        given["N"], given["M"] = op.q_len(seq), seq
    defaults = {"B": 1, "N": op.q_len(seq), "M": seq}
    sizes = {n: given[n] if given[n] is not None else defaults[n] for n in ("B", "N", "M")}
    # as nf.attention compiles it: decode GQA with one query packs the group into rows
    packed = op.phase == "DC" and op.group > 1 and sizes["N"] == 1
    outs, ins = ops.definition(op.name, dtype, packed=packed)
    names = {s.name for p in ins for s in p.shape if isinstance(s, Size)}
    sizes = {n: v for n, v in sizes.items() if n in names}
    return Target(f"{op.name} ({dtype})", tuple(outs), tuple(ins), sizes,
                  tuple(n for n in sizes if given[n] is None))


def file_target(spec: str, shape: dict[str, int]) -> Target:
    """The program returned by ``function`` of ``path`` (``path:function``)."""
    path_text, _, func = spec.rpartition(":")
    if not path_text or not func:
        raise ShowError(f"{spec!r}: a program is named FILE.py:FUNCTION")
    path = Path(path_text)
    if not path.is_file():
        raise ShowError(f"no such file: {path}")
    module = _load(path)
    fn = getattr(module, func, None)
    if not callable(fn):
        raise ShowError(f"{path} defines no function {func!r}")
    try:
        result = fn()
    except Exception as err:  # noqa: BLE001 - the user's code: report it in one line
        raise ShowError(f"{spec}() raised {_one_line(err)}") from None
    outs, ins = _program(spec, result)
    sizes: dict[str, int] = {}
    for p in ins:
        for s in p.shape:
            if isinstance(s, Size) and s.name not in sizes:
                sizes[s.name] = shape.get(s.name, FILE_SIZE_DEFAULT)
    unknown = sorted(set(shape) - set(sizes))
    if unknown:
        have = ", ".join(sizes) or "none"
        raise ShowError(f"--shape {', '.join(unknown)}: not a size of {spec} (its sizes: "
                        f"{have})")
    return Target(spec, outs, ins, sizes, tuple(n for n in sizes if n not in shape))


def _load(path: Path):
    name = f"_neptune_fusion_show_{abs(hash(str(path.resolve())))}"
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ShowError(f"cannot import {path} (not a Python file?)")
    module = importlib.util.module_from_spec(loader_spec)
    sys.path.insert(0, str(path.resolve().parent))  # its own imports, as `python file.py`
    try:
        loader_spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - the user's code: report it in one line
        raise ShowError(f"importing {path} raised {_one_line(err)}") from None
    finally:
        sys.path.remove(str(path.resolve().parent))
    return module


def _program(spec: str, result) -> tuple[tuple, tuple]:
    """``(outputs, inputs)`` from what a program function returned (module docstring)."""
    outs, ins = result, None
    if isinstance(result, (tuple, list)) and len(result) == 2 \
            and isinstance(result[1], (tuple, list)):
        outs, ins = result
    outs = [outs] if isinstance(outs, Tensor) else list(outs) \
        if isinstance(outs, (tuple, list)) else [outs]
    if not outs or not all(isinstance(o, Compute) for o in outs):
        raise ShowError(f"{spec}() must return nf tensors made by nf.compute (or "
                        f"(outputs, inputs)), got {type(result).__name__}")
    ins = placeholders(outs) if ins is None else list(ins)
    if not all(isinstance(p, Placeholder) for p in ins):
        raise ShowError(f"{spec}(): the inputs it returns must be nf placeholders")
    return tuple(outs), tuple(ins)


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


# ------------------------------------------------------------------ views


def ir_text(t: Target) -> str:
    """The program as written (the IR printer's form)."""
    from .ir.printer import program_str
    return program_str(list(t.outputs))


def plan_text(t: Target) -> str:
    """The fusion plan: fused groups, carried state, proved repairs, what stayed apart."""
    from .api import plan
    try:
        return str(plan(list(t.outputs)))
    except NeptuneError as err:
        raise ShowError(f"{t.label}: {_one_line(err)}") from None


@dataclass(frozen=True)
class Choice:
    """The auto-scheduler's view of a target on this machine."""

    kernel: object          # the AutoKernel
    schedule: object        # the schedule it picks (CPU) or the cost model's best (GPU)
    ranked: tuple           # cost-model estimates of the feasible candidates, fastest first
    space: int              # candidates in the search space
    device: object          # the cost model's Device
    on_gpu: bool


def stand_ins(t: Target, device) -> list:
    """Tensors with the inputs' shapes and dtypes and no data (every row a view of one)."""
    import torch
    out = []
    for p in t.inputs:
        shape = [t.sizes[s.name] if isinstance(s, Size) else int(s) for s in p.shape]
        dtype = getattr(torch, p.dtype.name)
        row = torch.empty(shape[-1:] or [], dtype=dtype, device=device)
        out.append(row.expand(shape))
    return out


def choose(t: Target) -> Choice:
    """What ``schedule="auto"`` does at the first call of these sizes, without running
    anything: on CPU its pick (the cost model's best schedule that builds), on a GPU the
    cost model's best (the first call measures the best few and keeps the fastest)."""
    import torch

    from . import compile as nf_compile
    from .schedule.cost import rank
    on_gpu = torch.cuda.is_available()
    tensors = stand_ins(t, "cuda" if on_gpu else "cpu")
    try:
        kernel = nf_compile(list(t.outputs), list(t.inputs), cache=False)
        if not hasattr(kernel, "space_for"):   # a StagedKernel: a schedule per pass
            raise ShowError(
                f"{t.label}: the plan runs as {len(kernel.passes)} kernels one after "
                "another (a staged plan, see --plan); --schedule and --source show one "
                "kernel's choice, and each pass here is scheduled at its first call")
        problem, device, space = kernel.space_for(*tensors)
        ranked = tuple(rank(problem, space, device))
        if not ranked:
            raise ShowError(f"{t.label}: no schedule of the search space fits {device.name}")
        # on CPU, the auto-scheduler itself (it only builds: nothing runs)
        chosen = ranked[0].schedule if on_gpu else kernel.schedule_for(*tensors)
    except NeptuneError as err:
        raise ShowError(f"{t.label}: {_one_line(err)}") from None
    return Choice(kernel, chosen, ranked, len(space), device, on_gpu)


def schedule_text(t: Target, c: Choice, top: int = 5) -> str:
    """The chosen schedule as JSON, how it was chosen, and the best few candidates."""
    k = c.kernel.top_k
    if c.on_gpu:
        how = (f"# the cost model's best for {c.device.name}: the first call of this shape "
               f"class measures\n# the best {k} below (each checked against float64) and "
               "keeps the fastest")
    else:
        how = ("# chosen by the cost model alone: on CPU (Triton's interpreter) the "
               f"auto-scheduler\n# takes its best schedule as is (a GPU measures the best "
               f"{k} and keeps the fastest)")
    lines = [f"# {t.label} at {t.shape_text()}", how,
             json.dumps(c.schedule.to_dict(), indent=2),
             f"# best {min(top, len(c.ranked))} of {len(c.ranked)} feasible candidates "
             f"({c.space} in the search space), predicted by the cost model for "
             f"{c.device.name}:"]
    for k, est in enumerate(c.ranked[:top], 1):
        mark = "   <- chosen" if est.schedule == c.schedule else ""
        lines.append(f"#  {k}. {est.schedule.brief():<40} {est.seconds * 1e3:10.4f} ms{mark}")
    return "\n".join(lines)


def source_text(t: Target, c: Choice) -> str:
    """The generated Triton source under the chosen schedule, every kernel of it."""
    try:
        kernel = c.kernel.kernel_of(c.schedule)
    except NeptuneError as err:
        raise ShowError(f"{t.label}: {_one_line(err)}") from None
    n = len(kernel.kernels)
    parts = [f"# {t.label} at {t.shape_text()}; schedule: {c.schedule.brief()}"]
    for k, gk in enumerate(kernel.kernels, 1):
        parts.append(f"# ---- kernel {k} of {n}: {gk.name}, grid {gk.grid}\n{gk.source}")
    return "\n".join(parts)
