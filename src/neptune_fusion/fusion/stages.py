"""Multi-pass plans: a program that is not one fused loop, split into single-pass programs.

:func:`split_passes` is a pure function of the program: it plans ``outputs``; while the
plan has more than one fused group, it takes the first group (lowest pass: it reads no
other group's reductions), makes each of its members an output of a new *pass program*
over the members' spatial axes, and replaces every use of those reductions in the rest by
a load of a new placeholder holding them (an *intermediate*). The rest is planned again.
The last pass program holds the last group and the outputs that read it (or share its
outputs' axes); every other output, a map of intermediates, gets a pass per set of axes.
For
``t = sum_j tanh(x[i, j] - max_j x[i, j])`` (``tanh`` proves no repair)::

    before:  t[i] = sum(tanh(x[i, j] - max(x[i, j], j)), j)

    after:   pass 0:  max0[i] = max(x[i, j], j)                  (an intermediate)
             pass 1:  t[i] = sum(tanh(x[i, j] - max0[i]), j)     (read as a placeholder)

The pipeline uses this split when the passes are not phases of one kernel (over different
axes or rows; a chain over one axis of one row, like this one, is lowered as phases by
``codegen/lower.py``). Each pass program is single-pass, so it compiles through the
ordinary pipeline (rolling or split-k, its own schedule);
:class:`~neptune_fusion.runtime.staged.StagedKernel` runs them in order. Intermediates of
a floating-point dtype narrower than float32 are stored in float32 (what the fused
kernel's state holds); an output whose dtype would change by it is cast back. An output
that is exactly an intermediate is not recomputed: it is that intermediate
(``Staging.aliases``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import build
from ..ir.dtypes import float32
from ..ir.graph import placeholders
from ..ir.nodes import Compute, Expr, IndexVar, Load, Placeholder, Reduce, Size, fresh_uid
from ..ir.traverse import substitute, walk


@dataclass(frozen=True)
class Pass:
    """One pass program: ``outputs`` (intermediates and/or program outputs) computed from
    ``inputs`` (program inputs and earlier intermediates) in one fused loop."""

    index: int
    outputs: tuple[Compute, ...]
    inputs: tuple[Placeholder, ...]


@dataclass(frozen=True)
class Staging:
    """The passes of a program in launch order.

    ``intermediates`` maps each intermediate's placeholder to ``(pass index, position)``
    of the pass output that fills it; ``results`` says where each program output comes
    from, ``(pass index, position)``, in the order of the program's outputs.
    """

    passes: tuple[Pass, ...]
    intermediates: tuple[tuple[Placeholder, int, int], ...]
    results: tuple[tuple[int, int], ...]

    @property
    def single_pass(self) -> bool:
        return len(self.passes) == 1


_NARROW = ("float16", "bfloat16")


def split_passes(outputs, *, max_passes: int = 64) -> Staging:
    """The passes of ``outputs`` (module docstring): one per fused group of its plan."""
    from ..reference.evaluate import as_outputs
    from .plan import plan as make_plan
    outs, _ = as_outputs(outputs)
    taken = {t.name for t in placeholders(outs)} | {o.name for o in outs}
    rest = list(outs)
    final_dtypes = [o.dtype for o in outs]
    passes: list[Pass] = []
    inter: list[tuple[Placeholder, int, int]] = []
    made: dict[Placeholder, Compute] = {}     # intermediate -> the pass output filling it
    while True:
        p = make_plan(rest)
        if not p.groups or len(passes) >= max_passes or \
                (len(p.groups) == 1 and rows_apart(p, maps_aside=True) is None):
            break
        order = list(reversed(p.context))      # outermost spatial variable first
        mapping: dict[Expr, Expr] = {}
        computes = []
        for m in _first_members(p):
            # no spatial axis (a full reduction to one value): a 0-d intermediate, which
            # the pipeline compiles with a unit row (fusion/scalars.py)
            axes = tuple(v for v in order if v in m.node.free_vars)
            name = fresh_name(m.name, taken)
            body: Expr = m.node
            if body.dtype.name in _NARROW:
                body = build.cast(body, float32)
            c = Compute(name, tuple(a.extent for a in axes), axes, body, fresh_uid())
            ph = Placeholder(name, c.shape, c.dtype, fresh_uid())
            load: Expr = Load(ph, axes)
            mapping[m.node] = load
            computes.append(c)
            inter.append((ph, len(passes), len(computes) - 1))
            made[ph] = c
        passes.append(Pass(len(passes), tuple(computes), tuple(placeholders(computes))))
        rest = [_rebuilt(o, body, ax, mapping)
                for o, body, ax in zip(rest, p.bodies, p.out_axes)]
    # outputs that are exactly an intermediate are that intermediate; the rest make the
    # last pass -- one per set of axes when no reduction is left (maps of intermediates
    # over different rows, as a row output beside a 0-d one, share no kernel), and with
    # the last group the outputs that read it or share its outputs' axes, a pass per set
    # of axes for the other maps (LayerNorm's x - mean beside a projection of another
    # width: the group's kernel has the projection's columns, not the row's)
    results: list[tuple[int, int] | None] = []
    keys: list = []
    last: list[list[Compute]] = []
    where = {ph: (k, n) for ph, k, n in inter}
    reads = [any(isinstance(x, Reduce) for x in walk(body)) for body in p.bodies]
    group_axes = {frozenset(ax) for ax, r in zip(p.out_axes, reads) if r}
    for o, dt, ax, r in zip(rest, final_dtypes, p.out_axes, reads):
        ph = _alias(o)
        if ph is not None and made[ph].dtype == dt:
            results.append(where[ph])
            continue
        if o.dtype != dt:
            o = Compute(o.name, o.shape, o.axes, build.cast(o.body, dt), o.uid)
        key = None if p.groups and (r or frozenset(ax) in group_axes) else frozenset(o.axes)
        if key not in keys:
            keys.append(key)
            last.append([])
        k = keys.index(key)
        results.append((len(passes) + k, len(last[k])))
        last[k].append(o)
    program_inputs = placeholders(outs)
    for outs_ in last:
        passes.append(Pass(len(passes), tuple(outs_), _pass_inputs(outs_, program_inputs)))
    return Staging(tuple(passes), tuple(inter), tuple(results))  # type: ignore[arg-type]


def _pass_inputs(outs, program_inputs) -> tuple[Placeholder, ...]:
    """The placeholders ``outs`` read, and then a program input for each symbolic size
    they use that none of those has in its shape (a map of intermediates that divides by
    the row's width ``D`` reads no tensor of width ``D``; the kernel binds sizes from its
    inputs' shapes, so it takes one, unread)."""
    ins = list(placeholders(outs))
    bound = {s for p in ins for s in p.shape if isinstance(s, Size)}
    used = {x for o in outs for x in walk(o.body) if isinstance(x, Size)}
    used |= {s for o in outs for s in o.shape if isinstance(s, Size)}
    for s in sorted(used - bound, key=lambda s: s.name):
        carrier = next((p for p in program_inputs if s in p.shape), None)
        if carrier is not None and carrier not in ins:
            ins.append(carrier)
    return tuple(ins)


def rows_apart(p, maps_aside: bool = False) -> str | None:
    """Why plan ``p``'s first group cannot share one kernel with the outputs' rows, or
    None: the kernels block over a row axis that every member depends on and every
    output has. A member that no output row depends on (``y[i] = x[i] - max_r x[r]``) or
    an output without the members' rows (a row output ``lse[i]`` beside the loss
    ``sum_i lse[i]`` that inlines it) makes that group a pass of its own.
    ``maps_aside``: outputs that read no reduction do not count (:func:`split_passes`
    gives them passes of their own: the rotated keys a sliding-window cache stores,
    beside the attention that reads them)."""
    if not p.groups or not any(p.out_axes):
        return None
    members = p.groups[0].members
    for m in members:
        if not set(p.context) & m.node.free_vars:
            return f"{m.name} reduces to a value that no output row depends on"
    rows = set(p.context).intersection(*(m.node.free_vars for m in members))
    for o, body, axes in zip(p.outputs, p.bodies, p.out_axes):
        if maps_aside and not any(isinstance(x, Reduce) for x in walk(body)):
            continue
        if not rows & set(axes):
            return f"output {o.name} has none of the rows {members[0].name} is reduced per"
    return None


def _first_members(p) -> tuple:
    """The members of plan ``p``'s first group that the next pass computes: the group,
    or only the members that no output row depends on when the others do and none of
    those reads them. One token's RMSNorm statistic beside the projections that read it
    plans as one group over the row's width; as a whole it would come back, unchanged,
    as the next pass's program (H200, Llama-1B decode, 2026-12-03)."""
    members = p.groups[0].members
    free = [m for m in members if not set(p.context) & m.node.free_vars]
    if not free or len(free) == len(members):
        return members
    rest = {id(m.node) for m in members if not any(m is f for f in free)}
    if any(id(x) in rest for m in free for x in walk(m.node)):
        return members
    return tuple(free)


def _rebuilt(o: Compute, body: Expr, axes: tuple[IndexVar, ...], mapping: dict) -> Compute:
    """Output ``o`` with its canonical ``body`` over ``axes``, the group's reductions
    replaced by loads of their intermediates."""
    new = substitute(body, mapping)
    if new is body and o.body is body:
        return o
    return Compute(o.name, o.shape, axes, new, o.uid)


def _alias(o: Compute) -> Placeholder | None:
    """The intermediate ``o`` is exactly (same axes, same order), if any."""
    b = o.body
    if isinstance(b, Load) and isinstance(b.tensor, Placeholder) \
            and len(b.indices) == len(o.axes) \
            and all(i is a for i, a in zip(b.indices, o.axes)):
        return b.tensor
    return None


def fresh_name(name: str, taken: set[str]) -> str:
    base = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name) or "r"
    out, k = base, 1
    while out in taken:
        k += 1
        out = f"{base}_{k}"
    taken.add(out)
    return out

