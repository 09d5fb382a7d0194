"""The IR verifier: checks that a tensor program, or a canonical output body, is well formed.

:func:`verify` checks what a user builds (every tensor the outputs need);
:func:`verify_body` checks the planner's canonical output bodies between its passes (with
``NEPTUNE_FUSION_VERIFY=1``), where every compute is inlined and binders are renamed.
"""

from __future__ import annotations

from ..errors import VerificationError
from .graph import tensors_in_order
from .nodes import (
    CMP_OPS,
    LOGIC_OPS,
    Binary,
    Compute,
    Expr,
    IndexVar,
    Load,
    Placeholder,
    Reduce,
    Tensor,
    Unary,
    Where,
)
from .traverse import walk


def verify_expr(e: Expr, bound: frozenset, where: str) -> None:
    """Check ``e`` in a scope where ``bound`` variables are defined."""
    loose = e.free_vars - bound
    if loose:
        names = ", ".join(sorted(v.name for v in loose))
        raise VerificationError(f"{where}: uses index variable(s) {names} that nothing binds")
    for x in walk(e):
        if isinstance(x, Load):
            if len(x.indices) != x.tensor.ndim:
                raise VerificationError(
                    f"{where}: {x} has {len(x.indices)} indices for a "
                    f"{x.tensor.ndim}-d tensor")
            for i in x.indices:
                if not i.dtype.is_int:
                    raise VerificationError(f"{where}: index {i} of {x} is not an integer")
        elif isinstance(x, Reduce):
            for a in x.axes:
                if a.kind != "reduce":
                    raise VerificationError(f"{where}: {x.op} binds {a.name}, not a reduce axis")
            if x.body.dtype.is_bool:
                raise VerificationError(f"{where}: {x.op} of a boolean")
        elif isinstance(x, Where):
            if not x.cond.dtype.is_bool:
                raise VerificationError(f"{where}: where-condition {x.cond} is not boolean")
        elif isinstance(x, Binary) and x.op in LOGIC_OPS:
            if not (x.a.dtype.is_bool and x.b.dtype.is_bool):
                raise VerificationError(f"{where}: {x} combines non-booleans")
        elif isinstance(x, Unary) and x.op == "not" and not x.x.dtype.is_bool:
            raise VerificationError(f"{where}: {x} negates a non-boolean")
        elif isinstance(x, Binary) and x.op in CMP_OPS and x.dtype.is_bool is False:
            raise VerificationError(f"{where}: comparison {x} is not boolean")  # pragma: no cover


def verify(outputs: Tensor | list[Tensor]) -> None:
    """Raise :class:`VerificationError` unless every tensor the outputs need is well formed."""
    outs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    for t in tensors_in_order(list(outs)):
        if not isinstance(t, Compute):
            continue
        where = f"tensor {t.name!r}"
        if len(t.axes) != len(t.shape):
            raise VerificationError(f"{where}: {len(t.axes)} axes for {len(t.shape)} dims")
        for a, s in zip(t.axes, t.shape):
            if not isinstance(a, IndexVar) or a.kind != "spatial" or a.extent is not s:
                if not (isinstance(s, int) and a.extent == s):
                    raise VerificationError(f"{where}: axis {a} does not match extent {s}")
        verify_expr(t.body, frozenset(t.axes), where)


def verify_body(body: Expr, axes: tuple[IndexVar, ...], where: str) -> None:
    """Check a canonical output body over the output's ``axes``: well formed (as
    :func:`verify_expr` checks), every compute inlined (it reads inputs only), and no
    reduction rebinding a variable that an enclosing reduction binds (the canonical
    binders keep nested reductions apart by height). Raises :class:`VerificationError`
    naming ``where`` and the broken invariant."""
    for a in axes:
        if not isinstance(a, IndexVar) or a.kind != "spatial":
            raise VerificationError(f"{where}: output axis {a} is not a spatial variable")
    verify_expr(body, frozenset(axes), where)
    for x in walk(body):
        if isinstance(x, Load) and not isinstance(x.tensor, Placeholder):
            raise VerificationError(f"{where}: {x} reads the compute {x.tensor.name!r}, "
                                    "which should have been inlined")
        if isinstance(x, Reduce):
            outer = frozenset(x.axes)
            for y in walk(x.body):
                if isinstance(y, Reduce) and outer & frozenset(y.axes):
                    names = ", ".join(sorted(a.name for a in outer & frozenset(y.axes)))
                    raise VerificationError(f"{where}: {y.op} inside {x.op} binds {names} "
                                            "again")
