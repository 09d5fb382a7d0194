"""The repo's baseline Triton FA2 kernel against the float64 reference (interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch
from bench_helpers import inputs, tiny

from neptune_fusion.bench.gate import relative_error
from neptune_fusion.bench.providers import baseline_fa2
from neptune_fusion.bench.providers.baseline_fa2 import BlockConfig, check_shapes, fa2_forward

INTERPRETED = type(baseline_fa2._fa2_forward).__name__ == "InterpretedFunction"
DEVICE = "cpu" if INTERPRETED else "cuda"
pytestmark = pytest.mark.skipif(not INTERPRETED and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or a GPU")


def run(name: str, cfg: BlockConfig, dtype=torch.float16):
    op = tiny(name)
    q, k, v, ref = inputs(op, 64, dtype)
    q, k, v = (t.to(DEVICE) for t in (q, k, v))
    out = fa2_forward(q, k, v, causal=op.causal, scale=op.scale, cfg=cfg)
    return relative_error(out.cpu(), ref)


# BLOCK_M > BLOCK_N makes the diagonal phase span two key tiles, one of them fully masked
# for the first rows: the case the finite "-inf" exists for.
@pytest.mark.parametrize("name", ["PF-Causal", "PF-GQA", "PF-Global"])
def test_matches_reference(name):
    assert run(name, BlockConfig(32, 16, num_stages=1)) < 2e-3


def test_square_blocks():
    assert run("PF-GQA", BlockConfig(32, 32, num_stages=1)) < 2e-3


@pytest.mark.skipif(INTERPRETED, reason="the Triton interpreter's bf16 tl.dot is wrong")
def test_bfloat16():
    assert run("PF-Causal", BlockConfig(32, 16, num_stages=1), torch.bfloat16) < 1.5e-2


def test_causal_mask_matters():
    op = tiny("PF-Causal")
    q, k, v, ref = inputs(op, 64)
    out = fa2_forward(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), causal=False, scale=op.scale,
                      cfg=BlockConfig(32, 16, num_stages=1))
    assert relative_error(out.cpu(), ref) > 0.1


def test_shapes_it_does_not_cover_are_explained():
    op = tiny("DC-GQA")
    q, k, v, _ = inputs(op, 64)
    cfg = BlockConfig(32, 16)
    assert "decode" in check_shapes(q, k, v, cfg)
    with pytest.raises(ValueError, match="decode is not supported"):
        fa2_forward(q, k, v, causal=True, cfg=cfg)
    op = tiny("PF-Causal")
    q, k, v, _ = inputs(op, 48)
    assert "not a multiple of the blocks" in check_shapes(q, k, v, cfg)
    assert "BLOCK_M" in check_shapes(q, k, v, BlockConfig(16, 32))
