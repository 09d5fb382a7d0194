"""Rendering a :class:`FusionPlan` for people (``str``) and programs (``to_dict``)."""

from __future__ import annotations

import sympy as sp

from ..ir.dtypes import float32
from ..ir.nodes import Expr, Param, Reduce
from ..ir.printer import expr_str
from ..ir.reducers import combined_with, reducer
from ..ir.traverse import substitute

_LONG = 28


class _Legend:
    """Short display names for long loop operands (``c0 = sum(q[i, d] * k[j, d], d)``)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._by_text: dict[str, str] = {}

    def name_for(self, text: str) -> str:
        if len(text) <= _LONG:
            return text
        got = self._by_text.get(text)
        if got is None:
            got = self._by_text[text] = f"c{len(self._by_text)}"
            self.lines.append(f"{got} = {text}")
        return got


def _finals_text(plan, e: Expr, whole: bool = False) -> str:
    """``e`` with every hoisted reduction inside it (or ``e`` itself) shown by name."""
    names = {r: Param(n, float32) for r, n in plan.names.items()}
    if isinstance(e, Reduce) and not whole:
        return expr_str(Reduce(e.op, substitute(e.body, names), e.axes))
    return expr_str(substitute(e, names))


def _on_loop(member, group_axes) -> dict:
    """Rename a member's binders to its group's loop variables (as the fused loop does)."""
    return dict(zip(member.node.axes, group_axes))


def member_rules(plan, member, legend: _Legend, group_axes=None) -> list[str]:
    """The update rules of one member, e.g. ``l' = l*exp(m - m') + sum_tile(...)``."""
    n, op, rep = member.name, member.node.op, member.repair
    loop = _on_loop(member, group_axes or member.node.axes)
    if rep is None:
        body = legend.name_for(_finals_text(plan, substitute(substitute(
            member.node.body, {r: Param(n, float32) for r, n in plan.names.items()}), loop)))
        return [f"{n}' = " + reducer(op).formula.format(a=n, b=f"{op}_tile({body})")]
    env = {}
    for s, meaning in rep.meaning.items():
        nm = s.name
        if nm.startswith("r") and nm.endswith("_new"):
            env[s] = sp.Symbol(plan.name(rep.producers[int(nm[1:-4])]) + "'")
        elif nm.startswith("r") and nm[1:].isdigit():
            env[s] = sp.Symbol(plan.name(rep.producers[int(nm[1:])]))
        elif nm.startswith("t") and nm[1:].isdigit():
            env[s] = sp.Symbol(member.state_names[int(nm[1:])])
        elif nm[0] == "d" and nm[1:].isdigit():
            p = plan.name(rep.producers[int(nm[1:])])
            env[s] = sp.Symbol(f"({p}' - {p})")
        elif nm[0] in "cp":
            env[s] = sp.Symbol(legend.name_for(_finals_text(plan, substitute(meaning, loop))))
    by_name = {s.name: s for s in rep.meaning}
    moved = {s: env[by_name[s.name + "_new"]] for s in rep.meaning
             if s.name.startswith("r") and s.name[1:].isdigit()}
    formula = reducer(combined_with(op, rep.method)).formula
    lines = []
    shared = dict(rep.shared)
    for i, name in enumerate(member.state_names):
        if i in shared:
            lines.append(f"{name} = {plan.name(rep.producers[shared[i]])}    "
                         "(that sum's own state, shared)")
            continue
        h = str(rep.sym_update[i].xreplace(env))
        term = str(rep.sym_terms[i].xreplace(moved).xreplace(env))
        lines.append(f"{name}' = " + formula.format(a=h, b=f"{op}_tile({term})"))
    return lines


def render_plan(plan) -> str:
    legend = _Legend()
    passes = len({g.stage for g in plan.groups})
    head = "every chain fused" if plan.single_pass else \
        f"{len(plan.unfused)} dependency(ies) left unfused"
    out = [f"FusionPlan: {len(plan.groups)} group(s) in {passes} pass(es), {head}"]
    for g in plan.groups:
        axes = ", ".join(f"{a.name} < {a.extent}" for a in g.axes)
        out.append(f"group {g.index} (pass {g.stage}): one loop over {axes}; "
                   f"state {', '.join(g.state)}")
        for m in g.members:
            how = f"{m.repair.method}" if m.repair else "plain"
            out.append(f"  {m.name} = {_finals_text(plan, m.node)}    [{how}]")
            out.extend(f"    {line}" for line in member_rules(plan, m, legend, g.axes))
            if m.repair:
                out.append(f"    proved: {m.repair.proof}")
    for o, body, axes in zip(plan.outputs, plan.bodies, plan.out_axes):
        idx = ", ".join(a.name for a in axes)
        out.append(f"output {o.name}[{idx}] = {_finals_text(plan, body, whole=True)}")
    for u in plan.unfused:
        out.append(f"unfused: {u.consumer} reads the final {u.producer}: {u.reason}")
    if legend.lines:
        out.append("where " + "; ".join(legend.lines))
    return "\n".join(out)


def plan_dict(plan) -> dict:
    legend = _Legend()
    groups = []
    for g in plan.groups:
        members = []
        for m in g.members:
            rep = m.repair
            members.append({
                "name": m.name,
                "reduce": m.node.op,
                "definition": _finals_text(plan, m.node),
                "producers": [plan.name(p) for p in m.producers],
                "state": list(m.state_names),
                "update": member_rules(plan, m, legend, g.axes),
                "repair": None if rep is None else {"method": rep.method, "proof": rep.proof},
            })
        groups.append({"index": g.index, "pass": g.stage,
                       "axes": [a.name for a in g.axes],
                       "extents": [str(e) for e in g.extents],
                       "producers": [m.name for m in g.producers],
                       "consumers": [m.name for m in g.consumers],
                       "state": list(g.state), "members": members})
    return {
        "single_pass": plan.single_pass,
        "groups": groups,
        "unfused": [{"consumer": u.consumer, "producer": u.producer, "reason": u.reason,
                     "timed_out": u.timed_out} for u in plan.unfused],
        "outputs": [{"name": o.name, "definition": _finals_text(plan, b, whole=True)}
                    for o, b in zip(plan.outputs, plan.bodies)],
        "legend": legend.lines,
    }

