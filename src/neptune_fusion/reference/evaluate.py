"""The unfused reference: every tensor materialised in float64, one after another."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..ir.nodes import Compute, Tensor
from .feeds import bind_feeds
from .interp import Interpreter


def as_outputs(outputs) -> tuple[list[Tensor], bool]:
    """Normalise ``outputs`` to a list; the flag says whether a single tensor was given."""
    from ..errors import NeptuneError
    single = isinstance(outputs, Tensor)
    outs = [outputs] if single else list(outputs)
    for o in outs:
        if not isinstance(o, Compute):
            raise NeptuneError(
                f"outputs must be tensors made by nf.compute, got {o!r}")
    return outs, single


def evaluate_unfused(outputs: list[Tensor], feeds: Mapping) -> list[np.ndarray]:
    """The plain float64 value of each output."""
    arrays, sizes = bind_feeds(outputs, feeds)
    interp = Interpreter(arrays, sizes)
    return [interp.tensor(o) for o in outputs]
