"""Shared helpers for the bench tests: tiny operators, inputs, fake providers."""

from __future__ import annotations

import torch

from neptune_fusion.bench.providers.base import Prepared, Provider, RunContext, Unsupported
from neptune_fusion.bench.reference import reference_attention
from neptune_fusion.bench.workloads import make_inputs, smoke_variant
from neptune_fusion.ops import OPERATORS, OpSpec

SEQ = 64


def tiny(name: str) -> OpSpec:
    """The smoke variant of the operator called ``name``."""
    return smoke_variant(OPERATORS[name])


def inputs(op: OpSpec, seq: int = SEQ, dtype: torch.dtype = torch.float16):
    """q, k, v and the float64 reference on CPU."""
    q, k, v = make_inputs(op, seq, dtype, "cpu")
    return q, k, v, reference_attention(op, q, k, v)


def fake(name: str, prepare, group: str = "compiler") -> Provider:
    """A provider around a prepare function."""
    return Provider(name, name, group, f"test provider {name}", prepare)


def correct_prepare(op, q, k, v, ctx: RunContext):
    """A correct provider: the float64 reference rounded to the input dtype."""
    return Prepared(lambda: reference_attention(op, q, k, v).to(q.dtype), "reference")


def unsupported_prepare(op, q, k, v, ctx: RunContext):
    """A provider that cannot express anything."""
    return Unsupported("this provider only exists in tests")
