"""The float64 reference at a few output elements, within a fixed element budget.

The plain reference (:mod:`.evaluate`) materialises every tensor in float64 on the host:
at a realistic static size (attention over 32 heads of 4096 x 4096, a 1 << 20-wide
softmax) that is gigabytes. The autotuner only needs the reference at a *sample* of
output elements, so this evaluator works on demand:

* an output is evaluated on a sub-grid of its index space (a few indices per axis);
* a load of an intermediate compute evaluates that compute only at the indices the load
  reads (per dimension, the distinct in-range indices: a sub-grid again), memoised per
  sub-grid, so a producer shared by several consumers is evaluated once;
* inputs are *sources* that gather the elements a load reads (:class:`TorchSource`: a
  tensor on any device, copied to the host element by element read, never whole).

Every array the evaluation produces is counted against an :class:`ElementBudget`; a value
that would leave the budget raises :class:`BudgetExceeded` before it is made. So host memory
and time are bounded by the budget, whatever the problem size.

    out[i, j] = exp(x[i, j] - m[i]) / l[i]     sampled at i in {4095, 0}, j in {9, 17}
    -> m, l evaluated at i in {0, 4095} only (each reads x[{0, 4095}, :])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import NeptuneError
from ..ir.graph import placeholders
from ..ir.nodes import Compute, Load, Placeholder, Tensor
from .feeds import bind_sizes
from .interp import Interpreter, numeric

# elements (float64: 8 bytes each) one sampled evaluation may produce: 64 MiB
ELEMENT_BUDGET = 1 << 23
# indices per output axis, tried in turn until the evaluation fits the budget: every
# index (small problems: the whole output is checked), then 4, then 1 (the last: the
# ragged boundary tile)
PER_AXIS = (None, 4, 1)


class BudgetExceeded(NeptuneError):
    """A sampled evaluation would produce more elements than its budget allows."""


@dataclass
class ElementBudget:
    """Counts the elements an evaluation produces; refuses to pass ``limit``."""

    limit: int
    used: int = 0

    def need(self, n: int) -> None:
        """Refuse a value of ``n`` elements before it is made."""
        if self.used + n > self.limit:
            raise BudgetExceeded(f"a value of {n} elements would pass the budget of "
                                 f"{self.limit} ({self.used} used)")

    def take(self, n: int) -> None:
        self.need(n)
        self.used += n


class TorchSource:
    """An input tensor (any device) read element by element: loads gather on its device
    and copy only what they read to the host, in float64 / int64 / bool."""

    def __init__(self, tensor) -> None:
        self.tensor = tensor
        self.shape = tuple(tensor.shape)

    def gather(self, idx: list[np.ndarray]) -> np.ndarray:
        import torch
        t = self.tensor
        got = t[tuple(torch.as_tensor(i, device=t.device) for i in idx)] if idx else t
        if got.is_floating_point():
            got = got.to(torch.float64)
        elif got.dtype != torch.bool:
            got = got.to(torch.int64)
        return got.detach().to("cpu").numpy()


@dataclass
class _Shared:
    budget: ElementBudget
    sizes: dict
    sources: dict
    grids: dict = field(default_factory=dict)   # (compute, sub-grid) -> value


class _Sampled(Interpreter):
    """The interpreter on a sub-grid (``ranges``) with on-demand intermediates."""

    def __init__(self, shared: _Shared, ranges: dict) -> None:
        super().__init__({}, shared.sizes, ranges=ranges)
        self.shared = shared

    def _length(self, v) -> int:
        r = self.ranges.get(v)
        return len(r) if r is not None else self.extent(v.extent)

    def _eval(self, e, ctx):
        self.shared.budget.need(math.prod(self._length(v) for v in ctx))
        got = super()._eval(e, ctx)
        self.shared.budget.take(int(np.size(got)))
        return got

    def tensor(self, t: Tensor):  # pragma: no cover - every load goes through _load
        raise AssertionError(f"the sampled reference never materialises {t.name}")

    def _load(self, e: Load, ctx) -> np.ndarray:
        t = e.tensor
        idx = [self.eval(i, ctx).astype(np.int64) for i in e.indices]
        extents = [self.extent(s) for s in t.shape]
        bad = None
        clipped = []
        for ix, n in zip(idx, extents):
            out = (ix < 0) | (ix >= n)
            if out.any():
                bad = out if bad is None else (bad | out)
                ix = np.clip(ix, 0, max(n - 1, 0))
            clipped.append(ix)
        shape = np.broadcast_shapes(*(i.shape for i in idx)) if idx else ()
        if any(n == 0 for n in extents):   # nothing to read: every index is out of range
            return np.full(shape, np.nan if t.dtype.is_float else 0,
                           dtype=numeric(t.dtype))
        self.shared.budget.need(math.prod(shape))
        if isinstance(t, Compute):
            val = self._compute_at(t, clipped)
        else:
            val = self.shared.sources[t].gather(clipped)
        if bad is not None:
            val = np.where(bad, np.nan if val.dtype.kind == "f" else 0, val)
        return val

    def _compute_at(self, t: Compute, clipped: list[np.ndarray], grid=None) -> np.ndarray:
        """``t`` at the index arrays ``clipped``: evaluated on the sub-grid of the
        distinct indices per dimension (``grid`` when the caller knows it), gathered."""
        if grid is None:
            grid = tuple(_distinct(ix) for ix in clipped)
        key = (t, tuple(g.tobytes() for g in grid))
        val = self.shared.grids.get(key)
        if val is None:
            sub = _Sampled(self.shared, dict(zip(t.axes, grid)))
            shape = tuple(len(g) for g in grid)
            self.shared.budget.need(math.prod(shape))
            val = np.array(np.broadcast_to(sub.eval(t.body, tuple(t.axes)), shape),
                           dtype=numeric(t.dtype))
            self.shared.budget.take(val.size)
            self.shared.grids[key] = val
        local = [np.searchsorted(g, ix) for g, ix in zip(grid, clipped)]
        return val[tuple(local)] if local else val[()]


def evaluate_at(outputs: list[Compute], sources: dict[Placeholder, object],
                grids: list[tuple[np.ndarray, ...]], budget: ElementBudget
                ) -> list[np.ndarray]:
    """The float64 reference of each output on its sub-grid (``grids[k]``: sorted index
    arrays, one per axis of ``outputs[k]``): an array of shape ``(len(g) for g in ...)``.

    ``sources`` maps every input the outputs read to an object with ``shape`` and
    ``gather(index_arrays) -> np.ndarray`` (:class:`TorchSource`). Raises
    :class:`BudgetExceeded` when the evaluation would pass ``budget``.
    """
    sizes: dict = {}
    origin: dict = {}
    for p in placeholders(list(outputs)):
        bind_sizes(p, tuple(sources[p].shape), sizes, origin)
    shared = _Shared(budget, sizes, sources)
    for g in grids:
        budget.need(math.prod(len(x) for x in g))
    return [_Sampled(shared, {})._compute_at(o, list(np.ix_(*g)) if g else [], tuple(g))
            for o, g in zip(outputs, grids)]


def _distinct(ix: np.ndarray) -> np.ndarray:
    """The sorted distinct values of ``ix`` (a sort: NumPy's hashing unique was slower
    on the million-element index ranges of a long row)."""
    flat = np.sort(ix, axis=None)
    if flat.size < 2:
        return flat
    return flat[np.concatenate(([True], flat[1:] != flat[:-1]))]


def pick(extent: int, count: int | None, rng: np.random.Generator) -> np.ndarray:
    """``count`` sorted distinct indices of ``[0, extent)`` (None: all): the last (the
    ragged boundary tile), the first, then random ones."""
    if count is None or count >= extent:
        return np.arange(extent, dtype=np.int64)
    chosen = [extent - 1, 0][:count]
    if count > 2:
        rest = rng.choice(np.arange(1, extent - 1), size=count - 2, replace=False)
        chosen += [int(i) for i in rest]
    return np.array(sorted(chosen), dtype=np.int64)


@dataclass(frozen=True)
class Sample:
    """A sampled reference: per output, its sub-grid and float64 values; ``elements`` the
    elements every attempt produced; ``skipped`` why there are none (even one element
    per axis needs more than the budget)."""

    grids: tuple
    values: tuple
    elements: int
    skipped: str | None = None


def sampled_reference(outputs, sources: dict, *, seed: int,
                      budget: int = ELEMENT_BUDGET, per_axis=PER_AXIS) -> Sample:
    """The reference at as many output elements as fit ``budget``: the whole output if it
    fits, else ``per_axis``'s next count of indices per axis. Produces at most
    ``len(per_axis) * budget`` elements in all, whatever the outputs' sizes."""
    outputs = list(outputs)
    sizes: dict = {}
    origin: dict = {}
    for p in placeholders(outputs):
        bind_sizes(p, tuple(sources[p].shape), sizes, origin)
    rng = np.random.default_rng(seed)
    spent = 0
    why = "no attempt"
    for count in per_axis:
        grids = tuple(tuple(pick(s if isinstance(s, int) else sizes[s], count, rng)
                            for s in o.shape) for o in outputs)
        used = ElementBudget(budget)
        try:
            values = evaluate_at(outputs, sources, list(grids), used)
        except BudgetExceeded as err:
            spent += used.used
            why = str(err)
            continue
        return Sample(grids, tuple(values), spent + used.used)
    return Sample((), (), spent, f"reference check skipped: even one element per output "
                                 f"axis needs more than {budget} elements ({why})")
