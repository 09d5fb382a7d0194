"""The cost model's choices for dense (not ragged) attention, pinned before the ragged
decode model was added (issue 17): a change there must not move these. The problems are
the recorded ones of the H200 autotune runs (benchmarks/results/2026-11-30-h200-autotune)
at fp16, plus a padded batched decode of the serving suite's shape."""

from __future__ import annotations

import pytest

from neptune_fusion.schedule.cost import rank
from neptune_fusion.schedule.space import H200, Problem, candidates

_CAUSAL = ((64, 32, 0.501953125), (64, 64, 0.501953125), (64, 128, 0.50390625),
           (128, 32, 0.50390625), (128, 64, 0.50390625), (128, 128, 0.50390625),
           (16384, 64, 1.0), (16384, 128, 1.0), (16384, 256, 1.0))

PROBLEMS = {
    "PF-Causal": Problem(rows=16384, loop=16384, programs=32, inner=128, col=128,
                         streamed=268435456, visits=_CAUSAL),
    "DC-Causal": Problem(rows=1, loop=16384, programs=32, inner=128, col=128,
                         streamed=268435456),
    "DC-GQA": Problem(rows=8, loop=16384, programs=8, inner=128, col=128, streamed=67108864),
    # the serving suite's B = 8 and 64 batches (32/8 heads, packed: 4 rows) at a fixed
    # length of 32K (a padded batch: no kv_lens)
    "dense-B8": Problem(rows=4, loop=32768, programs=64, inner=128, col=128,
                        streamed=64 * 32768 * 256 * 2),
    "dense-B64": Problem(rows=4, loop=32768, programs=512, inner=128, col=128,
                         streamed=512 * 32768 * 256 * 2),
}

# (strategy, block_m, block_n, splits, num_warps, num_stages) of the model's first four
TOP4 = {
    "PF-Causal": [("rolling", 128, 128, 1, 8, 3), ("rolling", 128, 64, 1, 8, 3),
                  ("rolling", 128, 64, 1, 8, 4), ("rolling", 128, 128, 1, 8, 2)],
    "DC-Causal": [("split", 16, 128, 4, 4, 3), ("split", 16, 128, 4, 4, 4),
                  ("split", 16, 128, 4, 8, 3), ("split", 16, 128, 4, 8, 4)],
    "DC-GQA": [("split", 16, 128, 16, 4, 3), ("split", 16, 128, 16, 4, 4),
               ("split", 16, 128, 16, 8, 3), ("split", 16, 128, 16, 8, 4)],
    "dense-B8": [("split", 16, 128, 2, 4, 3), ("split", 16, 128, 2, 4, 4),
                 ("split", 16, 128, 2, 8, 3), ("split", 16, 128, 2, 8, 4)],
    "dense-B64": [("rolling", 16, 32, 1, 4, 3), ("rolling", 16, 32, 1, 8, 3),
                  ("rolling", 16, 64, 1, 4, 3), ("rolling", 16, 64, 1, 4, 4)],
}


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_dense_ranking_is_pinned(name):
    p = PROBLEMS[name]
    top = [(e.schedule.strategy, e.schedule.block_m, e.schedule.block_n, e.schedule.splits,
            e.schedule.num_warps, e.schedule.num_stages)
           for e in rank(p, candidates(p, H200), H200)[:4]]
    assert top == TOP4[name]


def test_head_dim_64_ties_go_to_eight_warps():
    """At head dim 64 the model prices 128 x 64 tiles alike at 4 and 8 warps; 8 were
    measured faster (benchmarks/results/2026-12-02-h200-d64-tiles), so they rank first
    and the tuner's four measure them."""
    p = Problem(rows=16384, loop=16384, programs=64, inner=64, col=64,
                streamed=64 * 16384 * 2 * 64 * 2)
    top = [(e.schedule.block_m, e.schedule.block_n, e.schedule.num_warps,
            e.schedule.num_stages) for e in rank(p, candidates(p, H200), H200)[:4]]
    assert top == [(128, 128, 8, 3), (128, 128, 8, 4), (128, 64, 8, 3), (128, 64, 8, 4)]
