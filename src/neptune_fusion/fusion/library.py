"""The library form of a contraction: a matrix product handed to the vendor library.

An output that is a plain product of two tensors over one shared axis,

    out[..., i, o] = sum_c a[..., i, c] * b[..., c, o]     (any order of the indices),

can run as ``torch.matmul`` (cuBLAS on a GPU) once its operands exist as tensors. When an
operand is itself computed -- RMSNorm's ``y[i, c] = x[i, c] * rsqrt(ms[i] + eps) * w[c]``
-- our own kernel materialises it first (one row-reduction pass: it reads ``x`` once and
writes ``y``), and the product reads it. This is the plan torch.compile runs for a norm
followed by a matmul; the fused plan (the norm as the GEMM's prologue, one kernel) saves
the write and the read of ``y`` but runs the product in a Triton GEMM. Which is faster
depends on the shapes and the device, so the auto-scheduler measures both
(``Schedule(strategy="library")``, docs/scheduling.md).

:func:`library_form` is a pure function of the program: the :class:`LibraryForm` of its
single output, or None when the output is not such a product. Legal when: the output's
body is one ``sum`` over one axis ``c`` (optionally cast to the output's dtype) of a
product one factor of which is a plain load ``b`` -- every index a bare index variable
spanning the whole dimension it indexes (no offsets, no slices, no repeated variable) --
and the rest, ``a``, an expression over the output's axes and ``c`` alone; ``c`` indexes
both and not the output; every output axis indexes at least one side, at least one only
``a`` (the rows ``i``) and one only ``b`` (the columns ``o``); ``b`` and the output have
the same floating-point dtype, and ``a`` that dtype or float32 (rounded to it, as a
16-bit matmul rounds its operand). An ``a`` that is not itself a plain load becomes a
compute of its own (``<out>_lhs[.., i, c]``: what a user who wrote ``y = norm(x)`` and
``y @ W`` as one expression would have named), materialised first. The other output
axes are batch axes; an operand that a batch axis does not index is broadcast along it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import build
from ..ir.nodes import Cast, Compute, Expr, IndexVar, Load, Placeholder, Reduce, Tensor, fresh_uid
from ..ir.traverse import factors, product, substitute

_FLOATS = ("float16", "bfloat16", "float32")


@dataclass(frozen=True)
class LibraryForm:
    """How ``output`` runs as ``torch.matmul(A, B)``.

    ``operands`` are the two tensors read (placeholders or computes); ``a_dims`` and
    ``b_dims`` give, for each dimension of the matmul operands ``A`` (batch..., i, c) and
    ``B`` (batch..., c, o), the dimension of the operand tensor it is, or None where the
    operand is broadcast (a batch axis it does not have); ``out_perm`` orders the product
    ``(batch..., i, o)`` as the output's axes."""

    output: Compute
    operands: tuple[Tensor, Tensor]
    a_dims: tuple[int | None, ...]
    b_dims: tuple[int | None, ...]
    out_perm: tuple[int, ...]

    @property
    def computed(self) -> tuple[Compute, ...]:
        """The operands our kernels must materialise first (distinct, in order)."""
        out: list[Compute] = []
        for t in self.operands:
            if isinstance(t, Compute) and t not in out:
                out.append(t)
        return tuple(out)


def library_form(outputs) -> LibraryForm | None:
    """The :class:`LibraryForm` of ``outputs`` (one output), or None (module docstring)."""
    from ..reference.evaluate import as_outputs
    outs, _ = as_outputs(outputs)
    if len(outs) != 1:
        return None
    out = outs[0]
    body = out.body
    if isinstance(body, Cast):
        body = body.x
    if not (isinstance(body, Reduce) and body.op == "sum" and len(body.axes) == 1):
        return None
    c = body.axes[0]
    axes = tuple(out.axes)
    dt = out.dtype.name
    if c in axes or dt not in _FLOATS:
        return None
    fs = factors(body.body)
    # the right operand: a plain load (a weight); the left: the product of the rest
    # a placeholder (a weight) first, then the last factor first: `y * W` keeps y left
    order = sorted(range(len(fs)), key=lambda k: (
        not (isinstance(fs[k], Load) and isinstance(fs[k].tensor, Placeholder)), -k))
    for k in order:
        b = fs[k]
        if not (isinstance(b, Load) and _plain(b) and b.tensor.dtype.name == dt):
            continue
        rest = fs[:k] + fs[k + 1:]
        if not rest:
            continue
        left = product(rest)
        got = _form(out, axes, c, left, b, dt)
        if got is not None:
            return got
    return None


def _form(out: Compute, axes, c: IndexVar, left: Expr, b: Load, dt: str):
    ib = set(b.indices)
    la = left.free_vars
    if left.dtype.name == "float32" and dt in ("float16", "bfloat16"):
        left = build.cast(left, dt)   # rounded as a 16-bit matmul rounds its operand
    if c not in ib or c not in la or not la <= set(axes) | {c} or \
            (la | ib) != set(axes) | {c} or left.dtype.name != dt:
        return None
    only_a = [v for v in axes if v in la and v not in ib]
    only_b = [v for v in axes if v in ib and v not in la]
    if not only_a or not only_b:
        return None
    i, o = only_a[-1], only_b[-1]
    batch = [v for v in axes if v not in (i, o)]
    if isinstance(left, Load) and _plain(left):
        a, a_tensor = left, left.tensor
    else:   # the left side computed: its own compute over its axes, then c
        own = [v for v in axes if v in la] + [c]
        fresh = [IndexVar(v.name, v.extent, "spatial", fresh_uid()) for v in own]
        a_tensor = Compute(f"{out.name}_lhs", tuple(v.extent for v in own), tuple(fresh),
                           substitute(left, dict(zip(own, fresh))), fresh_uid())
        a = Load(a_tensor, tuple(own))

    def dims(ld: Load, order) -> tuple[int | None, ...]:
        pos = {v: k for k, v in enumerate(ld.indices)}
        return tuple(pos.get(v) for v in order)

    made = batch + [i, o]
    return LibraryForm(out, (a_tensor, b.tensor), dims(a, batch + [i, c]),
                       dims(b, batch + [c, o]), tuple(made.index(v) for v in axes))


def _plain(ld: Load) -> bool:
    """Every index a distinct bare variable over the whole dimension it indexes."""
    idx = ld.indices
    return (len(idx) == len(ld.tensor.shape) and len(set(idx)) == len(idx)
            and all(isinstance(v, IndexVar) and v.extent == d
                    for v, d in zip(idx, ld.tensor.shape)))
