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
body is one ``sum`` over one axis ``c`` (optionally cast to the output's dtype) of the
product of two loads; every index of both loads is a bare index variable spanning the
whole dimension it indexes (no offsets, no slices, no repeated variable); ``c`` indexes
both operands and not the output; every output axis indexes at least one operand, at
least one only the first operand (the rows ``i``) and one only the second (the columns
``o``); both operands and the output have the same floating-point dtype. The other
output axes are batch axes; an operand that a batch axis does not index is broadcast
along it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.nodes import Binary, Cast, Compute, IndexVar, Load, Reduce, Tensor

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
    prod = body.body
    if not (isinstance(prod, Binary) and prod.op == "mul"
            and isinstance(prod.a, Load) and isinstance(prod.b, Load)):
        return None
    a, b = prod.a, prod.b
    c = body.axes[0]
    axes = tuple(out.axes)
    if not (_plain(a) and _plain(b)) or c in axes:
        return None
    dt = out.dtype.name
    if dt not in _FLOATS or a.tensor.dtype.name != dt or b.tensor.dtype.name != dt:
        return None
    ia, ib = set(a.indices), set(b.indices)
    if c not in ia or c not in ib or (ia | ib) != set(axes) | {c}:
        return None
    only_a = [v for v in axes if v in ia and v not in ib]
    only_b = [v for v in axes if v in ib and v not in ia]
    if not only_a or not only_b:
        return None
    i, o = only_a[-1], only_b[-1]
    batch = [v for v in axes if v not in (i, o)]

    def dims(ld: Load, order) -> tuple[int | None, ...]:
        pos = {v: k for k, v in enumerate(ld.indices)}
        return tuple(pos.get(v) for v in order)

    a_dims = dims(a, batch + [i, c])
    b_dims = dims(b, batch + [c, o])
    made = batch + [i, o]
    out_perm = tuple(made.index(v) for v in axes)
    return LibraryForm(out, (a.tensor, b.tensor), a_dims, b_dims, out_perm)


def _plain(ld: Load) -> bool:
    """Every index a distinct bare variable over the whole dimension it indexes."""
    idx = ld.indices
    return (len(idx) == len(ld.tensor.shape) and len(set(idx)) == len(idx)
            and all(isinstance(v, IndexVar) and v.extent == d
                    for v, d in zip(idx, ld.tensor.shape)))
