"""Grouped-query decode through the backend: the query heads of a key/value group packed
into the rows of one program, as ``nf.attention``'s packed decode does.

Plain PyTorch GQA repeats K and V over the query heads (``repeat_interleave``), so the
translated program reads ``k[b, h // g, ...]``: each query head is its own program, and
with a few query rows (decode) its row block is mostly padding while every head of a
group reads the same keys again. When the region's output is ``(B, Hq, N, Dv)`` with
``N <= 16`` and the program uses the head ``h`` and the query row ``n`` only as

* ``q[b, h, n, ...]`` (a *query-like* input of shape ``(B, Hq, N, ...)``), and
* ``k[b, h // g, ...]`` for one constant ``g > 1`` (*key/value-like* inputs; with one
  key/value head, ``k[b, 0, ...]`` and ``g = Hq``),

it is translated again over ``(B, Hq / g, g * N, Dv)``: row ``r`` of key/value head
``hk`` is query head ``hk * g + r // N``, row ``r % N`` (``ir/index.py`` reads
``h // g`` as ``hk`` again). The query-like inputs are passed reshaped to
``(B, Hq / g, g * N, ...)`` and the result reshaped back (rewrite.py); both reshapes
are views of contiguous tensors. A use of ``h`` or ``n`` anywhere else (a per-head
bias, a mask on the query position) keeps the plain program.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.index import int_const
from ..ir.nodes import Binary, Const, Load
from ..ir.traverse import rewrite, walk

PACK_MAX_ROWS = 16   # query rows per head that are packed (decode, speculative steps)


@dataclass(frozen=True)
class Packing:
    """How a region is packed: ``group`` query heads per key/value head, ``rows`` (N)
    query rows per head, and the region's query-like input nodes."""

    group: int
    rows: int
    queries: frozenset

    def input_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A query-like input's shape as the kernel takes it."""
        b, hq, n, *rest = shape
        return (b, hq // self.group, self.group * n, *rest)

    def describe(self) -> str:
        return (f"GQA decode packed: the {self.group} query heads of each key/value head "
                f"({self.rows} row{'s' if self.rows > 1 else ''} each) are the rows of "
                "one program")


def packing(outs, phs, inputs, in_shapes, out_shapes) -> Packing | None:
    """The :class:`Packing` of a translated region (``outs``, its placeholders ``phs``
    in the order of the input nodes ``inputs``, the inputs' and outputs' shapes), or
    None. The output and the query-like inputs must have static shapes (a dynamic key
    length is fine: only the keys and values have it)."""
    if len(outs) != 1 or len(out_shapes[0]) != 4 \
            or not all(isinstance(n, int) for n in out_shapes[0]):
        return None
    b, hq, n, _ = out_shapes[0]
    if not 1 <= n <= PACK_MAX_ROWS or hq < 2:
        return None
    out = outs[0]
    h, row = out.axes[1], out.axes[2]
    queries, groups, shared = set(), set(), False
    for e in walk(out.body):
        if not isinstance(e, Load):
            continue
        idx = e.indices
        if len(idx) > 1 and e.tensor.shape[1] == 1 and int_const(idx[1]) == 0:
            shared = True   # one key/value head for all (MQA): its index folded to 0
        if h in idx[1].free_vars if len(idx) > 1 else False:
            if idx[1] is h and len(idx) > 2 and idx[2] is row:
                queries.add(e.tensor)
            elif isinstance(idx[1], Binary) and idx[1].op == "floordiv" and \
                    idx[1].a is h and int_const(idx[1].b) is not None:
                groups.add(int_const(idx[1].b))
            else:
                return None
    if not groups and shared:
        groups.add(hq)
    if len(groups) != 1 or not queries:
        return None
    (g,) = groups
    if g < 2 or hq % g:
        return None
    # h and the query row appear in those loads' head and row indices and nowhere else
    rest = rewrite(out.body, lambda e: _stub(e, h))
    if h in rest.free_vars or row in rest.free_vars:
        return None
    by_ph = dict(zip(phs, inputs))
    static = {n: all(isinstance(d, int) for d in shape) for n, shape in zip(inputs, in_shapes)}
    if not all(q in by_ph and len(q.shape) >= 3 and static[by_ph[q]] for q in queries):
        return None
    return Packing(g, n, frozenset(by_ph[q] for q in queries))


def _stub(e, h):
    """A load that reads ``h`` (checked to be one of the two forms) as a constant."""
    if isinstance(e, Load) and len(e.indices) > 1 and h in e.indices[1].free_vars:
        return Const(0.0, e.dtype) if e.dtype.is_float else Const(0, e.dtype)
    return None
