"""The tensor graph: which tensors an output reads, in dependency order."""

from __future__ import annotations

from .nodes import Compute, Load, Placeholder, Tensor
from .traverse import walk


def tensor_inputs(t: Tensor) -> list[Tensor]:
    """The tensors ``t`` loads from directly, in first-use order."""
    if not isinstance(t, Compute):
        return []
    out: list[Tensor] = []
    for e in walk(t.body):
        if isinstance(e, Load) and e.tensor not in out:
            out.append(e.tensor)
    return out


def tensors_in_order(outputs: list[Tensor]) -> list[Tensor]:
    """Every tensor reachable from ``outputs``, each after the tensors it reads."""
    order: list[Tensor] = []
    state: dict[Tensor, int] = {}
    for root in outputs:
        stack = [(root, False)]
        while stack:
            t, done = stack.pop()
            if done:
                state[t] = 2
                order.append(t)
                continue
            if t in state:
                continue
            state[t] = 1
            stack.append((t, True))
            stack.extend((u, False) for u in reversed(tensor_inputs(t)) if u not in state)
    return order


def placeholders(outputs: list[Tensor]) -> list[Placeholder]:
    """The inputs the outputs depend on, in dependency order."""
    return [t for t in tensors_in_order(outputs) if isinstance(t, Placeholder)]
