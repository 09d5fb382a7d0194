"""The one-tile path of a row reduction gives every state its tile's shape: a value over
fewer axes (LayerNorm's element count, the same for every row) is broadcast, since
Triton's compiler requires both branches of ``if D <= BLOCK_N`` to agree (the
interpreter does not check; found on the H200)."""

from __future__ import annotations

import re

import neptune_fusion as nf
from neptune_fusion.bench.chains import CHAINS
from neptune_fusion.fusion.library import library_form
from neptune_fusion.ir.graph import placeholders


def test_row_independent_state_is_broadcast():
    outs, _ = CHAINS["layernorm-matmul"].build("bfloat16")
    y = library_form(outs).computed[0]
    k = nf.compile(y, list(placeholders([y])), cache=False,
                   schedule=nf.Schedule(block_m=2, block_n=4096, num_warps=8, num_stages=1))
    src = k.source
    one_tile = src.split("if ONE_TILE == 2:")[1].split("elif ONE_TILE == 1:")[0]
    [assign] = [ln for ln in one_tile.splitlines() if re.match(r"\s+mean_sum, ", ln)]
    states = [s.strip() for s in assign.split("=")[0].split(",")]
    values = assign.split("=", 1)[1].strip()
    assert states == ["mean_sum", "var_sum", "var_sum_1", "var_sum_2"]
    # the row-independent count is broadcast to the row tile; the rest are per-row
    # tile reductions already
    assert values == ("mean_sum_new, var_sum_new, var_sum_1_new, "
                      "tl.full([BLOCK_M], 0.0, tl.float32) + var_sum_2_new"), assign
