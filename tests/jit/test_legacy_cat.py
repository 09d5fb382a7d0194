"""``torch.cat`` skips a 1-d empty piece beside pieces of any rank (a legacy rule: a
transformers ``DynamicCache``'s first update concatenates ``torch.tensor([])`` with the
new keys, as Bloom's eager attention does). The backend's check of ``cat`` indexed the
empty piece at the concatenated dimension and raised IndexError out of ``torch.compile``
(found 2026-12-05 on a tiny Bloom, tests/integrations/test_transformers.py); now such a
``cat`` is refused by name and runs with the rest."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from neptune_fusion.dynamo.rules import RULES


def _node(*shapes, dim=-2):
    pieces = [SimpleNamespace(meta={"val": torch.empty(s)}) for s in shapes]
    out = torch.cat([p.meta["val"] for p in pieces], dim=dim)
    return SimpleNamespace(name="cat", args=(pieces, dim), kwargs={}, meta={"val": out})


def test_a_cat_with_a_legacy_empty_piece_is_refused_by_name():
    check = RULES[torch.ops.aten.cat.default].check
    assert "different ranks" in check(_node((0,), (2, 4, 9, 16)))
    assert check(_node((2, 4, 1, 16), (2, 4, 9, 16))) is None      # a sink beside a piece
    assert "several pieces" in check(_node((2, 4, 3, 16), (2, 4, 9, 16)))
