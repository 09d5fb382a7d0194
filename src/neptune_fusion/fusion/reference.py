"""The fused reference: a plan executed in NumPy, tile by tile, with the derived repairs.

``rolling`` walks each group's loop in tiles, carrying every member's state; after a tile
it moves the old state to the producers' new running values with the repair and adds the
tile's contribution (FlashAttention's loop, derived). ``split`` computes independent
partial states per chunk and merges them (FlashDecoding's combine, derived). Both must
equal the unfused reference: this is how the algebra is checked before any GPU code.

Running values. A consumer reads its producer's *running* value, which the repair makes
exact for any value; the choice only matters for rounding. The reducer table
(:mod:`neptune_fusion.ir.reducers`) says how: a ``max`` producer's running value is its
running maximum; a ``sum`` producer's is its partial sum scaled to the whole axis
(``partial * n / seen``), so a consumer of a mean is centred on the running mean: that is
what makes the variance and LayerNorm states Welford-like and stable in float32. A max's
running value at its identity ``-inf`` (an empty or fully masked prefix) is read as 0, the
derived form of FlashAttention's guard for fully masked rows; ``+inf`` and NaN are read
as they are (``reducers.safe_array``). A row whose maximum *ends* at ``-inf`` is settled
after the loop (:meth:`GroupRunner.settle`): its consumers' states are repaired from 0 to
``-inf``, so they give what the unfused reference gives (``exp(-inf - -inf)``: NaN).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..algebra.synth import moved, running, state
from ..errors import NeptuneError
from ..ir.dtypes import float32
from ..ir.nodes import Expr, IndexVar, Param, Reduce
from ..ir.reducers import combined_with, reducer, running_array, safe_array, settled_array
from ..ir.traverse import substitute
from ..reference.feeds import bind_feeds
from ..reference.interp import Interpreter, numeric, reduce_array
from .plan import FusedGroup, FusionPlan, Member, plan


@dataclass
class State:
    """A member's partial state over some elements of its loop."""

    comps: list[np.ndarray]
    seen: list[np.ndarray]  # producer values the components are expressed at
    count: int              # loop elements covered


class GroupRunner:
    """Executes one group of a plan with an interpreter over the plan's context."""

    def __init__(self, plan: FusionPlan, group: FusedGroup, base: Interpreter,
                 finals: dict[Reduce, Param], values: dict[Param, np.ndarray]):
        self.plan, self.group, self.base = plan, group, base
        self.finals, self.values = finals, values
        self.extent = base.extent(group.axes[0].extent)
        self.by_node = {id(m.node): m for m in group.members}

    # -- pieces ------------------------------------------------------------------------
    def _terms(self, m: Member) -> list[tuple[str, Expr]]:
        if m.repair is None:
            return [(m.node.op, substitute(m.node.body, self.finals))]
        op = combined_with(m.node.op, m.repair.method)
        return [(op, substitute(t, self.finals)) for t in m.repair.terms]

    def running_value(self, m: Member, st: State) -> np.ndarray:
        return running_array(m.node.op, st.comps[0], st.count, self.extent)

    def partial(self, m: Member, lo: int, hi: int, prod: list[np.ndarray]) -> State:
        seen = [safe_array(p.op, v, np) for p, v in zip(m.producers, prod)]
        params = dict(self.values)
        params.update({running(k): v for k, v in enumerate(seen)})
        axis = m.node.axes[0]
        interp = Interpreter(self.base.arrays, self.base.sizes, params,
                             {axis: np.arange(lo, hi, dtype=np.int64)}, self.base.ftype)
        comps = [interp.eval(Reduce(op, body, m.node.axes), self.plan.context)
                 for op, body in self._terms(m)]
        return State(comps, seen, hi - lo)

    def merge(self, m: Member, states: list[State], target: list[np.ndarray]) -> State:
        states = [s for s in states if s.count > 0]
        if m.repair is None or not states:
            comps = [states[0].comps[0]] if states else []
            for s in states[1:]:
                comps = [reducer(m.node.op).ufunc(comps[0], s.comps[0])]
            return State(comps, [], sum(s.count for s in states))
        goal = [safe_array(p.op, t, np) for p, t in zip(m.producers, target)]
        combine = reducer(combined_with(m.node.op, m.repair.method)).ufunc
        total: list[np.ndarray] | None = None
        for s in states:
            params = dict(self.values)
            params.update({state(i): c for i, c in enumerate(s.comps)})
            params.update({running(k): v for k, v in enumerate(s.seen)})
            params.update({moved(k): v for k, v in enumerate(goal)})
            interp = Interpreter(self.base.arrays, self.base.sizes, params,
                                 ftype=self.base.ftype)
            fixed = [interp.eval(substitute(u, self.finals), self.plan.context)
                     for u in m.repair.update]
            total = fixed if total is None else [combine(a, b) for a, b in zip(total, fixed)]
        return State(total, goal, sum(s.count for s in states))

    def settle(self, m: Member, st: State, target: list[np.ndarray]) -> np.ndarray:
        """Member ``m``'s final value from its state ``st`` over the whole (nonempty)
        axis: where a producer ended at the identity its consumers read as 0, the state
        repaired from 0 to that identity (``codegen/settle.py``, the same rule)."""
        value = st.comps[0]
        if m.repair is None:
            return value
        ends = [settled_array(p.op, t) for p, t in zip(m.producers, target)]
        ends = [e for e in ends if e is not None]
        if not ends:
            return value
        params = dict(self.values)
        params.update({state(i): c for i, c in enumerate(st.comps)})
        params.update({running(k): v for k, v in enumerate(st.seen)})
        params.update({moved(k): t for k, t in enumerate(target)})
        interp = Interpreter(self.base.arrays, self.base.sizes, params, ftype=self.base.ftype)
        with np.errstate(all="ignore"):
            fixed = interp.eval(substitute(m.repair.update[0], self.finals), self.plan.context)
        return np.where(np.logical_or.reduce(np.broadcast_arrays(*ends)), fixed, value)

    def _producer_values(self, m: Member, states: dict[int, State]) -> list[np.ndarray]:
        return [self.running_value(self.by_node[id(p)], states[id(p)]) for p in m.producers]

    # -- drivers -----------------------------------------------------------------------
    def rolling(self, lo: int, hi: int, tile: int) -> dict[int, State]:
        states: dict[int, State] = {}
        for start in range(lo, hi, tile):
            stop = min(start + tile, hi)
            for m in self.group.members:
                prod = self._producer_values(m, states)
                part = self.partial(m, start, stop, prod)
                old = states.get(id(m.node))
                states[id(m.node)] = part if old is None else self.merge(m, [old, part], prod)
        return states

    def split(self, splits: int) -> dict[int, State]:
        bounds = np.linspace(0, self.extent, splits + 1).round().astype(int)
        chunks = [self.rolling(a, b, max(b - a, 1)) for a, b in zip(bounds, bounds[1:])
                  if b > a]
        merged: dict[int, State] = {}
        for m in self.group.members:
            prod = self._producer_values(m, merged)
            merged[id(m.node)] = self.merge(m, [c[id(m.node)] for c in chunks], prod)
        return merged

    def run(self, mode: str, tile: int, splits: int) -> None:
        if self.extent == 0:
            states = {}
        elif mode == "rolling":
            states = self.rolling(0, self.extent, tile)
        else:
            states = self.split(splits)
        for k, m in enumerate(self.group.members):
            p = Param(f"final{self.group.index}_{k}", float32)
            st = states.get(id(m.node))
            if st is None or not st.comps:  # empty loop: the reducer's identity
                ident = reduce_array(m.node.op, np.zeros((0,), self.base.ftype), (0,))
                val = np.asarray(ident, self.base.ftype)
            else:
                val = self.settle(m, st, self._producer_values(m, states))
            self.finals[m.node] = p
            self.values[p] = val


def output_array(interp: Interpreter, body: Expr, ctx: tuple[IndexVar, ...],
                 axes: tuple[IndexVar, ...]) -> np.ndarray:
    """The value of an output body as an array in the output's own axis order."""
    arr = interp.eval(body, ctx)
    arr = arr.reshape((1,) * (len(ctx) - arr.ndim) + arr.shape)
    index = []
    for v in ctx:
        index.append(slice(None) if any(v is a for a in axes) else 0)
    arr = arr[tuple(index)]
    kept = [v for v in ctx if any(v is a for a in axes)]
    arr = np.broadcast_to(arr, tuple(len(interp.values(v)) for v in kept))
    return np.ascontiguousarray(np.transpose(arr, [kept.index(a) for a in axes]))


def evaluate_fused(outputs, feeds: Mapping, mode: str = "rolling", tile: int = 8,
                   splits: int = 3, precision: str = "float64") -> list[np.ndarray]:
    """Run the fusion plan of ``outputs`` in NumPy (see module docstring)."""
    if not isinstance(tile, int) or tile < 1:
        raise NeptuneError(f"evaluate: tile must be a positive int, got {tile!r}")
    if not isinstance(splits, int) or splits < 1:
        raise NeptuneError(f"evaluate: splits must be a positive int, got {splits!r}")
    ftype = {"float64": np.float64, "float32": np.float32}.get(precision)
    if ftype is None:
        raise NeptuneError(f"evaluate: precision must be 'float64' or 'float32', got {precision!r}")
    p = plan(outputs)
    arrays, sizes = bind_feeds(list(p.outputs), feeds)
    if ftype is not np.float64:
        arrays = {t: a.astype(ftype) if a.dtype.kind == "f" else a for t, a in arrays.items()}
    base = Interpreter(arrays, sizes, ftype=ftype)
    finals: dict[Reduce, Param] = {}
    values: dict[Param, np.ndarray] = {}
    for g in p.groups:
        GroupRunner(p, g, base, finals, values).run(mode, tile, splits)
    interp = Interpreter(arrays, sizes, values, ftype=ftype)
    out = []
    for o, body, axes in zip(p.outputs, p.bodies, p.out_axes):
        val = output_array(interp, substitute(body, finals), p.context, axes)
        out.append(val.astype(numeric(o.dtype)))
    return out
