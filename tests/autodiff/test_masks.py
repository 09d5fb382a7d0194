"""``autodiff/masks.py``: a mask's derivative is dropped only where ``p`` already applies
it (``exp`` of ``-inf`` less the saved ``lse`` wherever the mask fails)."""

from __future__ import annotations

import math

from neptune_fusion.autodiff.masks import zero_unless
from neptune_fusion.ir.dtypes import float32
from neptune_fusion.ir.nodes import (
    Binary,
    Const,
    IndexVar,
    Load,
    Placeholder,
    Unary,
    Where,
    fresh_uid,
)


def _setup():
    i = IndexVar("i", 4, "spatial", fresh_uid())
    j = IndexVar("j", 4, "spatial", fresh_uid())
    x = Load(Placeholder("x", (4, 4), float32, fresh_uid()), (i, j))
    lse = Placeholder("lse", (4,), float32, fresh_uid())
    return i, j, x, lse, Binary("le", j, i)


def _p(score, lse, i):
    return Unary("exp", Binary("sub", score, Load(lse, (i,))))


def test_the_mask_p_applies_is_implied():
    i, j, x, lse, c = _setup()
    masked = Where(c, Binary("mul", x, Const(0.5, float32)), Const(-math.inf, float32))
    assert zero_unless(Binary("mul", x, _p(masked, lse, i)), c, lse)


def test_other_masks_and_other_normalisers_are_not():
    i, j, x, lse, c = _setup()
    masked = Where(c, x, Const(-math.inf, float32))
    other = Binary("lt", i, j)
    assert not zero_unless(Binary("mul", x, _p(masked, lse, i)), other, lse)
    # a normaliser that may be -inf (not the saved lse, which the caller keeps > -inf)
    stranger = Placeholder("m", (4,), float32, fresh_uid())
    assert not zero_unless(_p(masked, stranger, i), c, lse)
    # unmasked scores: p is not 0 where c fails
    assert not zero_unless(_p(x, lse, i), c, lse)
    # a select to a finite value, not -inf
    assert not zero_unless(_p(Where(c, x, Const(-1e4, float32)), lse, i), c, lse)
