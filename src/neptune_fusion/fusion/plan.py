"""The fusion plan: which reductions share a loop, and how each keeps its state exact.

``plan(outputs)`` runs a flat pipeline of named passes::

    inline+canonicalise -> normalise -> centre -> reduction graph -> repair synthesis
    -> pass assignment (stages) -> groups

and returns an immutable :class:`FusionPlan`. A *group* is one loop over a reduction axis
(one pass over the data); its members are reductions over axes of the same extents, and
every member that reads another member's value carries a proved :class:`Repair`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..algebra.budget import TimedOut
from ..algebra.synth import Repair, synthesize
from ..analysis.canon import SpatialVars, canonical_binders, canonical_output
from ..analysis.centre import centre
from ..analysis.chains import (
    ReductionGraph,
    maximal_hoistable,
    reaches_through_other,
    reduction_graph,
    same_extents,
)
from ..analysis.normalize import normalize
from ..errors import FusionError
from ..ir.graph import tensors_in_order
from ..ir.nodes import Compute, Expr, IndexVar, Reduce
from ..ir.verify import verify_body
from ..settings import dump as _dump
from ..settings import synth_budget, verify_enabled


@dataclass(frozen=True)
class Member:
    """One reduction of a group; ``repair`` is ``None`` when it reads no member's value."""

    name: str
    node: Reduce
    repair: Repair | None

    @property
    def producers(self) -> tuple[Reduce, ...]:
        return self.repair.producers if self.repair else ()

    @property
    def state_names(self) -> tuple[str, ...]:
        n = len(self.repair.terms) if self.repair else 1
        return (self.name,) + tuple(f"{self.name}.{i}" for i in range(1, n))


@dataclass(frozen=True)
class FusedGroup:
    """One loop over a reduction axis, carrying the state of all its members."""

    index: int
    stage: int
    members: tuple[Member, ...]

    @property
    def axes(self) -> tuple[IndexVar, ...]:
        return self.members[0].node.axes

    @property
    def extents(self) -> tuple:
        return tuple(a.extent for a in self.axes)

    @property
    def producers(self) -> tuple[Member, ...]:
        used = {id(p) for m in self.members for p in m.producers}
        return tuple(m for m in self.members if id(m.node) in used)

    @property
    def consumers(self) -> tuple[Member, ...]:
        return tuple(m for m in self.members if m.repair is not None)

    @property
    def state(self) -> tuple[str, ...]:
        return tuple(n for m in self.members for n in m.state_names)


@dataclass(frozen=True)
class Unfused:
    """A dependency left unbroken: ``consumer`` reads ``producer``'s final value.
    ``timed_out``: the repair was not derived within the synthesis budget (a larger
    budget may find one; the reason names the setting)."""

    consumer: str
    producer: str
    reason: str
    timed_out: bool = False


@dataclass(frozen=True)
class FusionPlan:
    outputs: tuple[Compute, ...]
    bodies: tuple[Expr, ...]            # canonical, normalised output bodies
    out_axes: tuple[tuple[IndexVar, ...], ...]
    context: tuple[IndexVar, ...]       # shared spatial variables, innermost first
    groups: tuple[FusedGroup, ...]
    unfused: tuple[Unfused, ...]
    names: dict

    @property
    def single_pass(self) -> bool:
        """Whether every reduction chain was fused (no dependency left unbroken)."""
        return not self.unfused

    @property
    def timed_out(self) -> tuple[Unfused, ...]:
        """The dependencies left unbroken because their repair was not derived within
        the synthesis budget: the plan is then not what a larger budget would give."""
        return tuple(u for u in self.unfused if u.timed_out)

    def name(self, r: Reduce) -> str:
        return self.names[r]

    def __str__(self) -> str:
        from .render import render_plan
        return render_plan(self)

    def to_dict(self) -> dict:
        """JSON-ready description (stable keys; see docs/algebra.md)."""
        from .render import plan_dict
        return plan_dict(self)


# ----------------------------------------------------------------------------- passes


def _canonicalise(outputs: list[Compute], memo: dict):
    """Every output's body inlined on shared canonical axes, normalised, then centred
    (``analysis/centre.py``: the sums a variance subtracts as means, with the map from
    each to its centred form); with verification on, the IR verifier checks the bodies
    after each pass."""
    sv = SpatialVars()
    bodies, axes = [], []
    check = verify_enabled()
    for o in outputs:
        b, ax = canonical_output(o, sv, memo)
        _dump("canon", lambda o=o, b=b: f"{o.name} = {b}")
        if check:
            verify_body(b, ax, f"after canon: output {o.name!r}")
        b = canonical_binders(normalize(b), sv.binders)
        _dump("normalize", lambda o=o, b=b: f"{o.name} = {b}")
        if check:
            verify_body(b, ax, f"after normalize: output {o.name!r}")
        bodies.append(b)
        axes.append(ax)
    bodies, centred = centre(bodies)
    if centred:
        _dump("centre", lambda: "\n".join(f"{o.name} = {b}" for o, b in zip(outputs, bodies)))
        if check:
            for o, b, ax in zip(outputs, bodies, axes):
                verify_body(b, ax, f"after centre: output {o.name!r}")
    return bodies, axes, sv, centred


def _names(outputs: list[Compute], graph: ReductionGraph, sv: SpatialVars,
           outer: frozenset, memo: dict, centred: dict) -> dict:
    names: dict[Reduce, str] = {}
    taken: set[str] = set()

    def give(r: Reduce, n: str) -> None:
        r = centred.get(r, r)
        if r in names or r not in graph.deps:
            return
        while n in taken:
            n += "'" if n.endswith("_") else "_"
        names[r] = n
        taken.add(n)

    scratch = sv.copy()  # same canonical variables, without adding to sv
    for t in tensors_in_order(outputs):
        if not isinstance(t, Compute):
            continue
        b, _ = canonical_output(t, scratch, memo)
        b = canonical_binders(normalize(b), scratch.binders)
        if isinstance(b, Reduce):
            give(b, t.name)
        tops = [r for r in maximal_hoistable(b, outer) if r not in names]
        for k, r in enumerate(tops):
            give(r, f"{t.name}_{r.op}" if len(tops) == 1 else f"{t.name}_{r.op}{k}")
    for k, r in enumerate(graph.order):
        give(r, f"{r.op}{k}")
    return names


def _costly(c: Reduce, rep: Repair, outer: frozenset, names: dict) -> str | None:
    """Why fusing ``c`` by ``rep`` costs more than a second pass, or None.

    A consumer with an axis its producers lack (a matmul's output columns: LayerNorm
    followed by a matmul) whose repair is augmented carries one matrix accumulator, and
    one matmul, per term of the repair, and rescales them all every tile; reading the
    producers' final values in a later pass re-reads only the rows. (Rewriting the sum
    into uncentred parts instead would fuse cheaply but lose the centring's accuracy.)
    """
    mine = c.free_vars & outer
    if rep.method != "augmented" or len(rep.terms) < 2 or \
            all(mine <= (p.free_vars & outer) for p in rep.producers):
        return None
    return (f"fusing needs {len(rep.terms)} accumulators over the columns of {names[c]} "
            f"(an augmented repair of a matmul), costlier than a second pass that reads the "
            "final value (require_single_pass=True fuses it anyway)")


def _repairs(graph: ReductionGraph, outer: frozenset, names: dict, thrifty: bool = True,
             budget: float = math.inf):
    """Repair every consumer against its same-extent producers; collect what fails (the
    reason, or the :class:`TimedOut` of a derivation past ``budget`` seconds). With
    ``thrifty``, a repair that costs more than a pass (:func:`_costly`) is refused too."""
    banned: dict[tuple[int, int], str | TimedOut] = {}
    repairs: dict[Reduce, Repair] = {}
    while True:
        repairs.clear()
        for c in graph.order:
            cands = [p for p in graph.deps[c]
                     if same_extents(p, c) and (id(p), id(c)) not in banned]
            while cands:
                got = synthesize(c, cands, outer, budget)
                why = _costly(c, got, outer, names) \
                    if thrifty and isinstance(got, Repair) else None
                if why is not None:
                    for p in cands:
                        banned[(id(p), id(c))] = why
                    break
                if isinstance(got, Repair):
                    repairs[c] = got
                    break
                alone = {id(p): synthesize(c, [p], outer, budget) for p in cands} \
                    if len(cands) > 1 else {id(cands[0]): got}
                bad = [p for p in cands if not isinstance(alone[id(p)], Repair)] or cands
                for p in bad:
                    banned[(id(p), id(c))] = got if isinstance(alone[id(p)], Repair) \
                        else alone[id(p)]
                cands = [p for p in cands if all(p is not b for b in bad)]
        fused = {(p, c) for c, rep in repairs.items() for p in rep.producers}
        conflict = False
        for p, c in fused:
            via = reaches_through_other(graph, p, c, fused)
            if via is not None:
                banned[(id(p), id(c))] = (
                    f"{names[c]} also reads {names[p]} through {names[via]}, which needs "
                    f"the final {names[p]}")
                conflict = True
                continue
            # p's own repaired producers share p's pass, so c's pass: c cannot read one
            # of them final (KL divergence: the loss repairs the target's sum, which
            # repairs the target's maximum, and reads that maximum unrepaired)
            final = next((q for q in _pass_mates(p, repairs)
                          if any(q is d for d in graph.deps[c]) and (q, c) not in fused),
                         None)
            if final is not None:
                banned[(id(p), id(c))] = (
                    f"{names[c]} reads {names[final]} final, which fusing {names[p]} "
                    f"into {names[c]} puts in {names[c]}'s pass")
                conflict = True
        if not conflict:
            return repairs, banned


def _pass_mates(p: Reduce, repairs: dict) -> list[Reduce]:
    """The producers repaired into ``p``, theirs, and so on: they share ``p``'s pass."""
    out, todo = [], list(repairs[p].producers) if p in repairs else []
    while todo:
        q = todo.pop()
        if all(q is not r for r in out):
            out.append(q)
            todo.extend(repairs[q].producers if q in repairs else ())
    return out


def _stages(graph: ReductionGraph, repairs: dict) -> dict[Reduce, int]:
    fused = {(id(p), id(c)) for c, rep in repairs.items() for p in rep.producers}
    stage = {r: 0 for r in graph.order}
    for _ in range(4 * len(graph.order) + 4):
        changed = False
        for c in graph.order:
            need = max((stage[p] + (0 if (id(p), id(c)) in fused else 1)
                        for p in graph.deps[c]), default=0)
            if need > stage[c]:
                stage[c], changed = need, True
        for c, rep in repairs.items():
            for p in rep.producers:
                if stage[p] < stage[c]:
                    stage[p], changed = stage[c], True
        if not changed:
            return stage
    raise AssertionError("pass assignment did not converge")  # pragma: no cover


def plan(outputs, require_single_pass: bool = False, *,
         fuse_all: bool | None = None, budget: float | None = None) -> FusionPlan:
    """Find the reduction chains of ``outputs`` and how to fuse each into one pass.

    A fusion that would cost more than a second pass is left unfused (:func:`_costly`)
    unless ``fuse_all`` (default: ``require_single_pass``) takes every provable fusion.
    Each repair derivation may take ``budget`` seconds (default
    ``$NEPTUNE_FUSION_SYNTH_BUDGET``; ``math.inf``: no limit); a chain whose repair is not
    derived in time is left unfused, with ``timed_out`` set and the reason naming the
    setting. With ``require_single_pass=True`` a chain that cannot be fused raises
    :class:`FusionError` naming the consumer, the producer and the failed condition.
    """
    if fuse_all is None:
        fuse_all = require_single_pass
    if budget is None:
        budget = synth_budget()
    from ..reference.evaluate import as_outputs
    outs, _ = as_outputs(outputs)
    memo: dict = {}
    bodies, out_axes, sv, centred = _canonicalise(outs, memo)
    context = sv.context
    outer = frozenset(context)
    graph = reduction_graph(bodies, outer)
    names = _names(outs, graph, sv, outer, memo, centred)
    _dump("graph", lambda: "\n".join(
        f"{names[r]} <- {', '.join(names[p] for p in graph.deps[r]) or '(inputs)'}"
        for r in graph.order))
    repairs, banned = _repairs(graph, outer, names, thrifty=not fuse_all, budget=budget)
    stage = _stages(graph, repairs)
    buckets: dict[tuple, list[Reduce]] = {}
    for r in graph.order:
        key = (stage[r],) + tuple(a.extent if isinstance(a.extent, int) else id(a.extent)
                                  for a in r.axes)
        buckets.setdefault(key, []).append(r)
    ordered = sorted(buckets.values(), key=lambda rs: (stage[rs[0]], graph.order.index(rs[0])))
    groups = tuple(
        FusedGroup(k, stage[rs[0]], tuple(Member(names[r], r, repairs.get(r)) for r in rs))
        for k, rs in enumerate(ordered))
    by_id = {id(r): r for r in graph.order}
    unfused = tuple(Unfused(names[by_id[c]], names[by_id[p]], str(why),
                            isinstance(why, TimedOut))
                    for (p, c), why in banned.items())
    result = FusionPlan(tuple(outs), tuple(bodies), tuple(out_axes), context, groups,
                        unfused, names)
    _dump("plan", lambda: str(result))
    if require_single_pass and unfused:
        u = unfused[0]
        raise FusionError(
            f"cannot fuse consumer {u.consumer} with producer {u.producer} into one pass: "
            f"{u.reason}")
    return result
