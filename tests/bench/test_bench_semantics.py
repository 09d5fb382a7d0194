"""The reference's score semantics, and the baselines' expression of them (run eagerly).

FlexAttention's score_mod/block mask and the plain PyTorch attention are checked here
without torch.compile (compiling takes tens of seconds on CPU); the compiled versions run
in the CPU smoke run and on the GPU.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from bench_helpers import inputs, tiny

from neptune_fusion.bench.gate import relative_error
from neptune_fusion.bench.providers.compiled import plain_attention
from neptune_fusion.bench.reference import additive_bias, reference_attention
from neptune_fusion.bench.workloads import make_inputs
from neptune_fusion.ops import OPERATORS

NAMES = list(OPERATORS)


def test_decode_is_the_last_row_of_causal_prefill():
    pf, dc = tiny("PF-ALiBi"), tiny("DC-ALiBi")
    q, k, v = make_inputs(pf, 64, torch.float16, "cpu")
    full = reference_attention(pf, q, k, v)
    last = reference_attention(dc, q[:, :, -1:], k, v)
    torch.testing.assert_close(last, full[:, :, -1:])


def test_alibi_and_window_bias():
    op = tiny("PF-ALiBi")
    bias = additive_bias(op, 8, dtype=torch.float64, device="cpu")
    slopes = op.alibi_slopes().double()
    assert bias.shape == (op.q_heads, 8, 8)
    assert bias[0, 5, 5] == 0 and bias[0, 5, 6] == float("-inf")
    assert bias[0, 5, 3] == pytest.approx(-2 * slopes[0].item())
    assert slopes[0] == pytest.approx(2 ** (-8 / op.q_heads))
    win = tiny("PF-Window")  # window 32
    wb = additive_bias(win, 64, dtype=torch.float32, device="cpu")
    assert wb[0, 40, 8] == float("-inf") and wb[0, 40, 9] == 0  # 40 - 9 = 31 < 32


def test_no_bias_when_nothing_is_masked():
    assert additive_bias(tiny("PF-Global"), 64, dtype=torch.float32, device="cpu") is None
    assert additive_bias(tiny("DC-GQA"), 64, dtype=torch.float32, device="cpu") is None


@pytest.mark.parametrize("name", NAMES)
def test_plain_attention_matches_reference(name):
    op = tiny(name)
    q, k, v, ref = inputs(op)
    assert relative_error(plain_attention(op, 64)(q, k, v), ref) < 2e-3


@pytest.mark.parametrize("name", ["PF-ALiBi", "PF-Window", "DC-ALiBi", "PF-GQA"])
def test_flex_score_and_mask_mods_match_reference(name):
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    from neptune_fusion.bench.providers.flex import mask_mod_for, score_mod_for
    op = tiny(name)
    q, k, v, ref = inputs(op)
    mask_mod = mask_mod_for(op, 64)
    block_mask = None if mask_mod is None else flex.create_block_mask(
        mask_mod, None, None, op.q_len(64), 64, device="cpu", BLOCK_SIZE=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile"
        out = flex.flex_attention(q, k, v, score_mod=score_mod_for(op, 64, q.device),
                                  block_mask=block_mask, scale=op.scale,
                                  enable_gqa=op.group > 1)
    assert relative_error(out, ref) < 2e-3
