"""Absolute positions for a shard's attention: the mods see whole-sequence indices.

A shard computes attention of local query rows ``i`` over local keys ``j``; its queries
start at absolute position ``q0`` and its keys at ``k0``. The user's ``mask_mod`` and
``score_mod`` are wrapped (:class:`Shifted`) so that they see ``i + q0`` and ``j + k0``,
with ``(q0, k0)`` read from a two-element int32 buffer :data:`POSITIONS` at run time::

    mask_mod(b, h, i, j)  ->  mask_mod(b, h, i + nf_positions[0], j + nf_positions[1])

so every shard and every step of a decode loop shares one kernel (the offsets are data,
not part of the kernel's key). A causal mask stays affine in ``i`` and ``j``
(``j + k0 <= i + q0``), so the kernel still skips the tiles it hides: the loop bounds read
the buffer once per program (analysis/masks.py).

:func:`hidden` decides on the host, from the same mask with the offsets as constants,
whether a mask hides a whole (query chunk, key chunk) pair: then the chunk is not computed
at all (its partial state is the empty one, which the merge ignores).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import DistributedError
from ..ir import build
from ..ir.nodes import Const

POSITIONS = "nf_positions"   # the buffer's name: (absolute query start, key start)


class Shifted:
    """A ``score_mod`` or ``mask_mod`` seeing absolute positions (module docstring).

    Deliberately not a frozen dataclass of ``neptune_fusion.ops``: it has no guard, so it
    is traced on each call (tens of µs), which keeps no per-call entry in the cache's
    table of guarded traces."""

    __slots__ = ("mod", "kind")

    def __init__(self, mod, kind: str) -> None:
        self.mod, self.kind = mod, kind

    def __call__(self, *args, **bufs):
        pos = bufs.pop(POSITIONS)
        if self.kind == "score":
            s, b, h, i, j = args
            return self.mod(s, b, h, i + pos[0], j + pos[1], **bufs)
        b, h, i, j = args
        return self.mod(b, h, i + pos[0], j + pos[1], **bufs)


def shifted_kwargs(kwargs: Mapping, q0: int, k0: int, device, what: str) -> dict:
    """``kwargs`` for :func:`~neptune_fusion.frontend.attention.attention` of a shard whose
    queries start at ``q0`` and keys at ``k0``: mods wrapped, the positions buffer added,
    ``q_offset`` 0 (positions come from the buffer). Without mods nothing depends on
    positions and the kwargs are returned as they are."""
    import torch
    out = dict(kwargs)
    out.pop("q_offset", None)
    if out.get("score_mod") is None and out.get("mask_mod") is None:
        return out
    bufs = dict(out.get("buffers") or {})
    if POSITIONS in bufs:
        raise DistributedError(f"{what}: buffer name {POSITIONS!r} is reserved (it carries "
                               "the shard's absolute positions)")
    bufs[POSITIONS] = torch.tensor([q0, k0], dtype=torch.int32, device=device)
    out["buffers"] = bufs
    for kind in ("score", "mask"):
        mod = out.get(f"{kind}_mod")
        if mod is not None:
            out[f"{kind}_mod"] = Shifted(mod, kind)
    return out


def hidden(mask_mod, q0: int, n: int, k0: int, m: int, dtype: str, q_heads: int,
           buffers: Mapping | None) -> bool:
    """True when ``mask_mod`` provably hides every (query, key) pair of the chunk: queries
    at ``q0 .. q0 + n - 1``, keys at ``k0 .. k0 + m - 1`` (or the chunk is empty).

    Only comparisons affine in ``i`` and ``j`` whose remaining terms are constants are used
    (a causal mask, a window); anything else (a mask reading ``b``, ``h`` or a buffer, an
    ``|``) is never taken to hide a chunk: the kernel then computes it, correctly."""
    if n == 0 or m == 0:
        return True
    if mask_mod is None:
        return False
    from ..analysis.masks import Partition, conjuncts, constraint, evaluate, loop_bounds
    from ..frontend.mods import probes
    from ..ir.fold import iconst
    sig = tuple((name, tuple(t.shape), str(t.dtype).removeprefix("torch."))
                for name, t in (buffers or {}).items() if name != POSITIONS)
    p = probes(dtype, q_heads, sig)
    try:
        cond = build.as_expr(mask_mod(p.b, p.h, p.i + q0, p.j + k0, **p.bufs))
    except Exception:  # noqa: BLE001 - attention itself reports a failing mod, by name
        return False
    cons = [c for c in (constraint(x, p.i, p.j) for x in conjuncts(cond))
            if c is not None and isinstance(c.rest, Const)]
    if not cons:
        return False
    part = Partition(tuple(cons), tuple(cons))
    got = evaluate(loop_bounds(part, iconst(0), iconst(n - 1), iconst(m), iconst(1)), {})
    return got["hi"] <= got["lo"]
