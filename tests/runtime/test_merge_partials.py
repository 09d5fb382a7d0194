"""merge_partials: associative, order-independent merge of partial attention states."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from neptune_fusion.errors import NeptuneError
from neptune_fusion.frontend.examples import plain_attention
from neptune_fusion.fusion.plan import plan
from neptune_fusion.reference.evaluate import evaluate_unfused
from neptune_fusion.runtime.merge import Partial, merge_partials

N, M, D = 3, 23, 8
[OUT], INS = plain_attention("N", "M", D, "float32")
PLAN = plan(OUT)
RNG = np.random.default_rng(0)
Q, K, V = (RNG.standard_normal((n, D)) * 2 for n in (N, M, M))
SCALE = D ** -0.5
EXPECTED = evaluate_unfused([OUT], dict(zip([p.name for p in INS], (Q, K, V))))[0]


def _partial(lo: int, hi: int) -> Partial:
    """The state of keys [lo, hi) computed directly (float64)."""
    s = torch.from_numpy(Q @ K[lo:hi].T * SCALE)
    m = s.max(1).values if hi > lo else torch.full((N,), -np.inf, dtype=torch.float64)
    safe_m = torch.where(torch.isfinite(m), m, torch.zeros(()))
    p = torch.exp(s - safe_m[:, None])
    return Partial({"m": (m,), "l": (p.sum(1),), "o_sum": (p @ torch.from_numpy(V[lo:hi]),)},
                   hi - lo)


def _out(p: Partial) -> np.ndarray:
    return (p.states["o_sum"][0] / p.states["l"][0][:, None]).numpy()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, M), max_size=6), st.randoms(use_true_random=False))
def test_any_split_any_order(cuts, rnd):
    bounds = [0] + sorted(cuts) + [M]
    parts = [_partial(a, b) for a, b in zip(bounds, bounds[1:])]
    rnd.shuffle(parts)
    whole = merge_partials(PLAN, parts)
    np.testing.assert_allclose(_out(whole), EXPECTED, rtol=1e-10, atol=1e-12)
    # associativity: merge halves first, then the merged halves
    k = len(parts) // 2
    halves = [merge_partials(PLAN, h) for h in (parts[:k], parts[k:]) if
              any(p.count for p in h)]
    np.testing.assert_allclose(_out(merge_partials(PLAN, halves)), EXPECTED,
                               rtol=1e-10, atol=1e-12)


def test_dict_partials_and_errors():
    a, b = _partial(0, 10), _partial(10, M)
    got = merge_partials(PLAN, [{k: v[0] for k, v in a.states.items()}, b])
    np.testing.assert_allclose(_out(got), EXPECTED, rtol=1e-10)
    with pytest.raises(NeptuneError, match="no state for 'l'"):
        merge_partials(PLAN, [Partial({"m": a.states["m"], "o_sum": a.states["o_sum"]}, 10)])
    with pytest.raises(NeptuneError, match="no non-empty partial"):
        merge_partials(PLAN, [_partial(5, 5)])
