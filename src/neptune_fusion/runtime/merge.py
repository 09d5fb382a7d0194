"""``merge_partials``: merge partial states of a fused group, computed anywhere.

A partial state covers some elements of the group's fused axis (one split of a split-k
kernel, one GPU's share of the key/value sequence). For attention it is ``(m, l, o_sum)``
with ``l`` and ``o_sum`` expressed at that partial's own ``m``. Merging is the fused
reference's split-k combine (:meth:`neptune_fusion.fusion.reference.GroupRunner.merge`)
on torch tensors: for each member in plan order, the producers' merged values first; then
every partial's consumer components repaired from the producer values they were computed
at (``running(k)``: the partial's own producer value, read through the reducer table's
guard: a max at ``-inf``, no key yet, as 0; ``+inf`` and NaN as they are) to the merged
ones (``moved(k)``), by evaluating the plan's derived ``update`` IR with torch ops; then
combined with the member's reducer. The result is again a :class:`Partial`, so merging is
associative and order-independent up to rounding: ``merge([merge(A), merge(B)]) ==
merge(A + B)``. The merged consumers are expressed at the merged producers' guarded
values, as a kernel's final state is before its outputs read it (``codegen/settle.py``
repairs a row whose maximum ended at ``-inf``; attention's output and log-sum-exp guard
that row themselves).

States are in the plan's natural domain (``exp``, not the kernels' ``exp2``-scaled maxima).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..algebra.synth import moved, running, state
from ..errors import FeedError, NeptuneError
from ..ir.nodes import Binary, Cast, Const, Expr, Param, Unary, Where
from ..ir.reducers import combined_with, reducer, running_array, safe_array

# The torch function of every elementwise op of the IR, by name (torch is imported only
# when merging; tests/test_op_tables.py checks that each op has a row).
TORCH_UNARY = {op: op for op in ("neg", "exp", "exp2", "log", "log2", "sqrt", "rsqrt",
                                 "tanh", "sigmoid", "erf", "abs")} | {"not": "logical_not"}
TORCH_BINARY = {op: op for op in ("add", "sub", "mul", "div", "pow", "maximum", "minimum",
                                  "lt", "le", "gt", "ge", "eq", "ne")} | {
    "floordiv": "floor_divide", "mod": "remainder", "and": "logical_and",
    "or": "logical_or"}


@dataclass(frozen=True)
class Partial:
    """The state of a fused group over ``count`` elements of its fused axis.

    ``states[name]`` is the tuple of state components of member ``name`` (component 0 is
    the member's value: ``m``, ``l``, ``o_sum`` for attention; augmented members carry
    more); consumers' components are expressed at the producers' values in the same
    partial. A component's dimensions are the member's free axes in the order of the
    plan's first output, then the rest of the plan's context (attention's output ``[i, e]``:
    ``m`` and ``l`` are ``[i]``, ``o_sum`` is ``[i, e]``); extra leading dimensions
    (batch, heads) are allowed when every component has them. ``count == 0`` marks an
    empty partial (it is ignored).
    """

    states: Mapping[str, tuple]
    count: int


def _group(plan):
    from ..fusion.plan import FusionPlan
    if not isinstance(plan, FusionPlan):
        name = getattr(plan, "name", None)
        what = type(plan).__name__ + (f" {name!r}" if isinstance(name, str) else "")
        raise FeedError(f"merge_partials: plan must be a fusion plan, got {what}; pass "
                        "nf.plan(outputs)")
    if len(plan.groups) != 1:
        raise NeptuneError(f"merge_partials: the plan has {len(plan.groups)} fused groups; "
                           "one is supported")
    return plan.groups[0]


def _as_partial(p, k: int) -> Partial:
    if isinstance(p, Mapping):
        p = Partial({n: v if isinstance(v, tuple) else (v,) for n, v in p.items()}, 1)
    if not isinstance(p, Partial):
        raise FeedError(f"merge_partials: partial {k} must be a Partial or a dict, got "
                        f"{type(p).__name__}")
    if not isinstance(p.count, int) or isinstance(p.count, bool) or p.count < 0:
        raise FeedError(f"merge_partials: partial {k} covers {p.count!r} elements; a count "
                        "is an int >= 0 (0: an empty partial, ignored)")
    return p


def _check_shapes(parts: list[Partial], members) -> None:
    """Every partial gives each member the same components, of the same shapes."""
    import torch
    for m in members:
        first = None
        for k, p in enumerate(parts):
            if m.name not in p.states:
                raise FeedError(f"merge_partials: partial {k} has no state for {m.name!r}; "
                                f"members are {[x.name for x in members]}")
            shapes = tuple(tuple(torch.as_tensor(c).shape) for c in p.states[m.name])
            if first is None:
                first = (k, shapes)
            elif shapes != first[1]:
                raise FeedError(f"merge_partials: the state of {m.name!r} has shapes "
                                f"{list(shapes)} in partial {k} but {list(first[1])} in "
                                f"partial {first[0]}; partials must agree")


def evaluate(e: Expr, env: Mapping[Param, object]):
    """``e`` on torch tensors: Params from ``env``; the ops of repair IR."""
    import torch
    if isinstance(e, Param):
        if e not in env:
            raise NeptuneError(f"merge_partials: the repair reads {e.name}, not bound")
        return env[e]
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Cast):
        return evaluate(e.x, env)
    if isinstance(e, (Unary, Binary)):
        table = TORCH_UNARY if isinstance(e, Unary) else TORCH_BINARY
        if e.op not in table:
            raise NeptuneError(f"merge_partials: op {e.op} in a repair is not evaluated")
        fn = getattr(torch, table[e.op])
        if isinstance(e, Unary):
            return fn(torch.as_tensor(evaluate(e.x, env), dtype=torch.float64))
        return fn(torch.as_tensor(evaluate(e.a, env)), torch.as_tensor(evaluate(e.b, env)))
    if isinstance(e, Where):
        return torch.where(torch.as_tensor(evaluate(e.cond, env)),
                           torch.as_tensor(evaluate(e.a, env)),
                           torch.as_tensor(evaluate(e.b, env)))
    raise NeptuneError(f"merge_partials: {type(e).__name__} in a repair is not evaluated")


def merge_partials(plan, partials: Sequence, *, extent: int | None = None) -> Partial:
    """Merge ``partials`` (:class:`Partial` or dicts name -> tensor(s)) of ``plan``'s one
    fused group with the derived repairs (see module docstring). ``extent`` is the length
    of the whole fused axis (default: the partials' total count); a ``sum`` producer's
    running value is extrapolated to it, as in the kernels and the fused reference."""
    import torch
    g = _group(plan)
    parts = [q for q in (_as_partial(p, k) for k, p in enumerate(partials)) if q.count > 0]
    if not parts:
        raise FeedError("merge_partials: no non-empty partial to merge")
    _check_shapes(parts, g.members)
    total = sum(p.count for p in parts)
    if extent is not None and (not isinstance(extent, int) or isinstance(extent, bool)
                               or extent < total):
        raise FeedError(f"merge_partials: extent is {extent!r}; it is the length of the "
                        f"whole fused axis, an int >= the partials' total count {total}")
    n = total if extent is None else extent
    by_node = {id(m.node): m for m in g.members}
    first = tuple(plan.out_axes[0]) if plan.out_axes else ()
    ctx = first + tuple(v for v in plan.context if all(v is not a for a in first))

    def axes_of(m):
        return [k for k, v in enumerate(ctx) if v in m.node.free_vars]

    def full(m, t):
        """``t`` with size-1 dimensions for the context axes ``m`` does not have."""
        t = torch.as_tensor(t)
        have = axes_of(m)
        lead = t.dim() - len(have)
        shape = list(t.shape[:lead]) + [1] * len(ctx)
        for k, d in zip(have, t.shape[lead:]):
            shape[lead + k] = d
        return t.reshape(shape)

    def back(m, t):
        drop = [k for k in range(len(ctx)) if k not in axes_of(m)]
        lead = t.dim() - len(ctx)
        for k in reversed(drop):
            t = t.squeeze(lead + k)
        return t

    def value(m, st, count):
        """Member ``m``'s running value (through the guard: an empty max's ``-inf`` read
        as 0) from a state over ``count`` of the ``n`` elements."""
        v = running_array(m.node.op, full(m, st[m.name][0]), count, n)
        return safe_array(m.node.op, torch.as_tensor(v), torch)

    merged: dict[str, tuple] = {}
    for m in g.members:
        if m.repair is None:
            acc = None
            for p in parts:
                c = torch.as_tensor(p.states[m.name][0])
                acc = c if acc is None else getattr(torch, reducer(m.node.op).torch)(acc, c)
            merged[m.name] = (acc,)
            continue
        prods = [by_node[id(p)] for p in m.repair.producers]
        goal = [value(p, merged, total) for p in prods]
        combine = getattr(torch, reducer(combined_with(m.node.op, m.repair.method)).torch)
        acc = None
        for p in parts:
            env = {state(i): full(m, c) for i, c in enumerate(p.states[m.name])}
            env.update({running(k): value(q, p.states, p.count) for k, q in enumerate(prods)})
            env.update({moved(k): v for k, v in enumerate(goal)})
            fixed = [torch.as_tensor(evaluate(u, env)) for u in m.repair.update]
            acc = fixed if acc is None else [combine(a, b) for a, b in zip(acc, fixed)]
        merged[m.name] = tuple(back(m, a) for a in acc)
    return Partial(merged, total)


__all__ = ["Partial", "evaluate", "merge_partials"]
