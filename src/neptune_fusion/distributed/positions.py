"""Absolute positions for a shard's attention: the mods see whole-sequence indices.

A shard computes attention of local query rows ``i`` over local keys ``j``; its queries
start at absolute position ``q0`` and its keys at ``k0``. The user's ``mask_mod`` and
``score_mod`` are wrapped so that they see ``i + q0`` and ``j + k0``, with ``(q0, k0)``
read from a two-element int32 buffer :data:`POSITIONS` at run time::

    mask_mod(b, h, i, j)  ->  mask_mod(b, h, i + nf_positions[0], j + nf_positions[1])

so every shard and every step of a decode loop shares one kernel (the offsets are data,
not part of the kernel's key). A causal mask stays affine in ``i`` and ``j``
(``j + k0 <= i + q0``), so the kernel still skips the tiles it hides: the loop bounds read
the buffer once per program (analysis/masks.py).

:func:`hidden` decides on the host whether a mask hides a whole (query chunk, key chunk)
pair: then the chunk is not computed at all (its partial state is the empty one, which
the merge ignores).

Host cost: a call must not re-trace the mods (tens of µs each) or re-analyse the mask.
So the wrapper of a mod with a guard (:func:`~neptune_fusion.frontend.mods.guard`) is made
once per guard -- the attention cache then finds its trace by that guard -- and the mask's
constraints are derived once per guard, with the offsets as symbols, leaving integer
arithmetic per call. The memos are bounded tables of derived data (:data:`_MEMO`), as are
the positions buffers (:func:`position_buffer`); a mod without a guard is wrapped and
analysed on every call.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import DistributedError
from ..ir import build
from ..ir.dtypes import int64
from ..ir.nodes import Param

POSITIONS = "nf_positions"   # the buffer's name: (absolute query start, key start)
_MEMO = 256                  # entries per memo table
_WRAPPERS: dict = {}         # (kind, guard) -> the wrapped mod
_MASKS: dict = {}            # (guard, probes signature) -> the mask's constraints
_BUFFERS: dict = {}          # (device, q0, k0) -> the positions tensor (read-only)
_Q0, _K0 = Param("nf_q0", int64), Param("nf_k0", int64)


def _shifted(mod, kind: str):
    """``mod`` seeing ``i + nf_positions[0]``, ``j + nf_positions[1]``: a plain function
    (guardable: its only closure cell is ``mod``)."""
    if kind == "score":
        def score_mod(s, b, h, i, j, nf_positions, **bufs):
            return mod(s, b, h, i + nf_positions[0], j + nf_positions[1], **bufs)
        return score_mod

    def mask_mod(b, h, i, j, nf_positions, **bufs):
        return mod(b, h, i + nf_positions[0], j + nf_positions[1], **bufs)
    return mask_mod


def wrapped(mod, kind: str):
    """The wrapper of ``mod`` (one per guard; see the module docstring)."""
    from ..frontend.mods import guard
    from ..runtime.inputs import remember
    g = guard(mod)
    if g is None:
        return _shifted(mod, kind)
    got = _WRAPPERS.get((kind, g))
    if got is None:
        got = _shifted(mod, kind)
        remember(_WRAPPERS, (kind, g), got, _MEMO)
    return got


def shifted_kwargs(kwargs: Mapping, q0: int, k0: int, device, what: str) -> dict:
    """``kwargs`` for :func:`~neptune_fusion.frontend.attention.attention` of a shard whose
    queries start at ``q0`` and keys at ``k0``: mods wrapped, the positions buffer added,
    ``q_offset`` 0 (positions come from the buffer). Without mods nothing depends on
    positions and the kwargs are returned as they are."""
    out = dict(kwargs)
    out.pop("q_offset", None)
    if out.get("score_mod") is None and out.get("mask_mod") is None:
        return out
    bufs = dict(out.get("buffers") or {})
    if POSITIONS in bufs:
        raise DistributedError(f"{what}: buffer name {POSITIONS!r} is reserved (it carries "
                               "the shard's absolute positions)")
    bufs[POSITIONS] = position_buffer(q0, k0, device)
    out["buffers"] = bufs
    for kind in ("score", "mask"):
        mod = out.get(f"{kind}_mod")
        if mod is not None:
            out[f"{kind}_mod"] = wrapped(mod, kind)
    return out


def position_buffer(q0: int, k0: int, device):
    """The int32 device tensor ``[q0, k0]``, without a host synchronisation: the kernels
    only read it, so one per (device, q0, k0) is kept (a ring call reuses its offsets on
    every call); a new one is copied from pinned memory without blocking. (A plain
    ``torch.tensor(..., device=cuda)`` copies from pageable memory and waits for the
    stream: measured on two H200s, 2026-12-01, it made every ring step and decode call
    wait for the GPU's earlier work.)"""
    import torch

    from ..runtime.inputs import remember
    key = (str(device), q0, k0)
    got = _BUFFERS.get(key)
    if got is None:
        host = torch.tensor([q0, k0], dtype=torch.int32)
        if torch.device(device).type == "cuda":
            got = host.pin_memory().to(device, non_blocking=True)
        else:
            got = host.to(device)
        remember(_BUFFERS, key, got, _MEMO)
    return got


def constraints(mask_mod, dtype: str, q_heads: int, buffers: Mapping | None
                ) -> tuple[tuple[int, int, int, int, int], ...]:
    """The conjuncts of ``mask_mod`` at query ``i + q0`` and key ``j + k0`` that read
    ``i``, ``j`` and the offsets only: ``a i + b j + c0 + cq q0 + ck k0 <= 0`` each, as
    ``(a, b, c0, cq, ck)`` with ``b = +-1``. Others (reading ``b``, ``h`` or a buffer, an
    ``|``) are left out: they never prove a chunk hidden."""
    from ..frontend.mods import guard, probes
    from ..runtime.inputs import remember
    sig = tuple((name, tuple(t.shape), str(t.dtype).removeprefix("torch."))
                for name, t in (buffers or {}).items() if name != POSITIONS)
    g = guard(mask_mod)
    key = None if g is None else (g, dtype, q_heads, sig)
    got = _MASKS.get(key) if key is not None else None
    if got is None:
        got = _analyse(mask_mod, probes(dtype, q_heads, sig))
        if key is not None:
            remember(_MASKS, key, got, _MEMO)
    return got


def _analyse(mask_mod, p) -> tuple:
    from ..analysis.masks import _linear, conjuncts, constraint
    try:
        cond = build.as_expr(mask_mod(p.b, p.h, p.i + _Q0, p.j + _K0, **p.bufs))
    except Exception:  # noqa: BLE001 - attention itself reports a failing mod, by name
        return ()
    out = []
    for x in conjuncts(cond):
        c = constraint(x, p.i, p.j)
        lin = None if c is None else _linear(c.rest)
        if lin is None or not set(lin[0]) <= {_Q0, _K0}:
            continue
        out.append((c.row, c.loop, lin[1], lin[0].get(_Q0, 0), lin[0].get(_K0, 0)))
    return tuple(out)


def hidden(mask_mod, q0: int, n: int, k0: int, m: int, dtype: str, q_heads: int,
           buffers: Mapping | None) -> bool:
    """True when ``mask_mod`` provably hides every (query, key) pair of the chunk: queries
    at ``q0 .. q0 + n - 1``, keys at ``k0 .. k0 + m - 1`` (or the chunk is empty): the
    keys some query row may see, over all rows, form an empty range (the kernels' loop
    bounds, analysis/masks.py, on the whole chunk)."""
    if n == 0 or m == 0:
        return True
    if mask_mod is None:
        return False
    lo, hi = 0, m
    for a, b, c0, cq, ck in constraints(mask_mod, dtype, q_heads, buffers):
        c = c0 + cq * q0 + ck * k0
        ends = (a * 0 + c, a * (n - 1) + c)   # a i + c at the first and last row
        if b == 1:    # j <= -(a i + c): the greatest bound over the rows
            hi = min(hi, -min(ends) + 1)
        else:         # j >= a i + c: the least bound over the rows
            lo = max(lo, min(ends))
    return hi <= lo
