"""Top-level entry points that tie the layers together."""

from __future__ import annotations

from collections.abc import Mapping

from .errors import NeptuneError
from .reference.evaluate import as_outputs, evaluate_unfused

MODES = ("unfused", "rolling", "split")


def plan(outputs, require_single_pass: bool = False, *, budget: float | None = None):
    """The :class:`~neptune_fusion.fusion.plan.FusionPlan` of ``outputs``.

    It lists the fused groups (one loop each), their producers, consumers and carried
    state, the proved repair of every consumer, and the dependencies that could not be
    broken with the reason. ``require_single_pass=True`` raises :class:`FusionError`
    instead of planning several passes. ``budget``: the seconds each repair derivation
    may take (default ``$NEPTUNE_FUSION_SYNTH_BUDGET``; ``math.inf``: no limit).
    """
    from .fusion.plan import plan as _plan
    return _plan(outputs, require_single_pass=require_single_pass, budget=budget)


def evaluate(outputs, feeds: Mapping, mode: str = "unfused", tile: int = 8, splits: int = 3):
    """Evaluate ``outputs`` in float64 NumPy.

    ``mode="unfused"`` (default) is the plain reference: every tensor materialised.
    ``mode="rolling"`` runs the fusion plan over tiles of ``tile`` elements of each fused
    reduction axis, carrying state and applying the derived repairs; ``mode="split"``
    computes ``splits`` independent partial states per axis and merges them with the
    repairs. All three must agree; the fused modes are how the algebra is checked.

    ``feeds`` maps placeholders (or their names) to NumPy arrays or torch tensors.
    Returns one NumPy array, or a list when ``outputs`` is a list.
    """
    outs, single = as_outputs(outputs)
    if mode == "unfused":
        vals = evaluate_unfused(outs, feeds)
    elif mode in ("rolling", "split"):
        from .fusion.reference import evaluate_fused
        vals = evaluate_fused(outs, feeds, mode=mode, tile=tile, splits=splits)
    else:
        raise NeptuneError(f"evaluate: mode {mode!r} is not one of {', '.join(MODES)}")
    return vals[0] if single else vals
