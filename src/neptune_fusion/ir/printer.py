"""Readable text for expressions and tensor programs."""

from __future__ import annotations

import math

from .nodes import (
    Binary,
    Cast,
    Compute,
    Const,
    Expr,
    IndexVar,
    Load,
    Param,
    Placeholder,
    Reduce,
    Size,
    Tensor,
    Unary,
    Where,
)

# Python's precedence, so printed text reads (and parses) as the user wrote it:
# comparisons bind loosest, then |, then &.
_INFIX = {"add": ("+", 4), "sub": ("-", 4), "mul": ("*", 5), "div": ("/", 5),
          "floordiv": ("//", 5), "mod": ("%", 5), "pow": ("**", 7),
          "lt": ("<", 1), "le": ("<=", 1), "gt": (">", 1), "ge": (">=", 1),
          "eq": ("==", 1), "ne": ("!=", 1), "and": ("&", 3), "or": ("|", 2)}
_CMP = {"lt", "le", "gt", "ge", "eq", "ne"}
_ATOM = 9


def _const_str(c: Const) -> str:
    v = c.value
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if v.is_integer() and abs(v) < 1e16:
            return f"{v:.1f}"
        return f"{v:.6g}"
    return str(v)


def _prec(e: Expr) -> int:
    if isinstance(e, Binary) and e.op in _INFIX:
        return _INFIX[e.op][1]
    if isinstance(e, Unary) and e.op in ("neg", "not"):
        return 6
    if isinstance(e, Const) and isinstance(e.value, (int, float)) and e.value < 0:
        return 6
    return _ATOM


def expr_str(e: Expr) -> str:
    """Infix text of ``e``; reductions print as ``sum(body, j)``."""
    memo: dict[Expr, str] = {}

    def go(x: Expr) -> str:
        s = memo.get(x)
        if s is None:
            s = memo[x] = render(x)
        return s

    def wrap(x: Expr, min_prec: int) -> str:
        s = go(x)
        return f"({s})" if _prec(x) < min_prec else s

    def render(x: Expr) -> str:
        if isinstance(x, Const):
            return _const_str(x)
        if isinstance(x, (Size, IndexVar, Param)):
            return x.name
        if isinstance(x, Load):
            return f"{x.tensor.name}[{', '.join(go(i) for i in x.indices)}]"
        if isinstance(x, Unary):
            if x.op == "neg":
                return "-" + wrap(x.x, 7)
            if x.op == "not":
                return "~" + wrap(x.x, 7)
            return f"{x.op}({go(x.x)})"
        if isinstance(x, Binary):
            if x.op in _INFIX:
                sym, p = _INFIX[x.op]
                # left-associative: the right operand needs parentheses at equal precedence;
                # comparisons would chain in Python, so both of their operands do
                rp = p + 1 if x.op != "pow" else p
                lp = p + 1 if x.op == "pow" or x.op in _CMP else p
                return f"{wrap(x.a, lp)} {sym} {wrap(x.b, rp)}"
            return f"{x.op}({go(x.a)}, {go(x.b)})"
        if isinstance(x, Where):
            return f"where({go(x.cond)}, {go(x.a)}, {go(x.b)})"
        if isinstance(x, Cast):
            return f"cast({go(x.x)}, {x.dtype})"
        if isinstance(x, Reduce):
            axes = x.axes[0].name if len(x.axes) == 1 else \
                "(" + ", ".join(a.name for a in x.axes) + ")"
            return f"{x.op}({go(x.body)}, {axes})"
        raise TypeError(f"cannot print {type(x).__name__}")  # pragma: no cover

    return go(e)


def tensor_decl(t: Tensor) -> str:
    """One line declaring ``t``."""
    dims = ", ".join(str(s) for s in t.shape)
    if isinstance(t, Placeholder):
        return f"{t.name} = placeholder([{dims}], {t.dtype})"
    assert isinstance(t, Compute)
    idx = ", ".join(a.name for a in t.axes)
    lhs = f"{t.name}[{idx}]" if t.axes else t.name
    return f"{lhs} = {expr_str(t.body)}    # [{dims}] {t.dtype}"


def program_str(outputs: Tensor | list[Tensor]) -> str:
    """Every tensor the outputs (one tensor or a list) depend on, one per line."""
    from .graph import tensors_in_order
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    return "\n".join(tensor_decl(t) for t in tensors_in_order(outs))
