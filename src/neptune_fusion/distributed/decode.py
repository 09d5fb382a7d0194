"""``sharded_decode``: attention of a few queries over a KV cache split across ranks.

Rank ``r`` holds keys ``kv_offset .. kv_offset + T_r - 1`` of the cache; every rank holds
the same queries. Each rank runs the (split-k) decode kernel on its shard with absolute
positions (:mod:`.positions`), which also writes each row's log-sum-exp; the small states
``(o, lse)`` cross once (one all_gather), and every rank merges them
(one compiled kernel, :func:`.states.merge_kernel`: the closed form of
:func:`.states.merge_stacked`) into attention over the whole cache.
"""

from __future__ import annotations

from ..errors import DistributedError
from . import shards
from .group import agree, all_gather_stacked, gather_ints, ranks
from .states import merge_flat, pack

WHAT = "sharded_decode"


def sharded_decode(q, k_local, v_local, *, kv_offset: int, group=None,
                   return_lse: bool = False, check: bool = True, **attention_kwargs):
    """Attention of ``q`` (B, Hq, N, D), the same on every rank, over the whole KV cache,
    whose keys ``kv_offset .. kv_offset + T - 1`` this rank holds in ``k_local``,
    ``v_local`` (B, Hkv, T, D); every rank returns the same output (B, Hq, N, Dv).

    ``attention_kwargs`` are :func:`neptune_fusion.attention`'s; the mods see absolute
    positions. ``q_offset`` is the absolute position of query row 0; the default,
    ``"end"``, puts the queries at the end of the whole cache (the last key's position
    ``+ 1 - N``). ``return_lse=True`` returns ``(o, lse)`` (lse float32 (B, Hq, N)).
    Shards may be uneven or empty, and need not be in rank order, but must not overlap.
    A group of one, or a process without torch.distributed, communicates nothing.

    ``check=False`` skips the signature gather that checks the ranks against each other
    (one small all_gather and a host synchronisation per call), for a decode loop known to
    be consistent; ``q_offset`` must then be an int (``"end"`` needs every rank's length).
    """
    shards.reject(attention_kwargs, WHAT)
    shards.check_local(WHAT, q=q, k_local=k_local, v_local=v_local)
    if not isinstance(kv_offset, int) or isinstance(kv_offset, bool) or kv_offset < 0:
        raise DistributedError(f"{WHAT}: kv_offset must be an int >= 0 (the absolute "
                               f"position of this rank's first key), got {kv_offset!r}")
    kwargs = dict(attention_kwargs)
    kwargs.setdefault("q_offset", "end")
    where = ranks(group, WHAT)
    sig = shards.signature(q, k_local, v_local, kwargs, WHAT)
    n = q.shape[2]
    if not check:
        if not isinstance(kwargs["q_offset"], int) or isinstance(kwargs["q_offset"], bool):
            raise DistributedError(f"{WHAT}: check=False needs q_offset as an int (the "
                                   f"absolute position of query row 0), got "
                                   f"{kwargs['q_offset']!r}")
        return _run(q, k_local, v_local, kv_offset, kwargs["q_offset"], kwargs, where,
                    return_lse)
    rows = gather_ints(sig + [n, k_local.shape[2], kv_offset], q.device, where)
    agree(rows, shards.FIELDS + ("query length",), WHAT, shards.NAMES)
    spans = sorted((r[-1], r[-1] + r[-2], rank) for rank, r in enumerate(rows) if r[-2] > 0)
    for (a0, a1, ra), (b0, b1, rb) in zip(spans, spans[1:]):
        if b0 < a1:
            raise DistributedError(f"{WHAT}: the shards of rank {ra} (keys {a0}..{a1 - 1}) "
                                   f"and rank {rb} (keys {b0}..{b1 - 1}) overlap; each key "
                                   "must live on one rank (check kv_offset)")
    q_offset = kwargs["q_offset"]
    if q_offset == "end":
        q_offset = max((a1 for _, a1, _ in spans), default=0) - n
    elif q_offset is None:
        q_offset = 0
    return _run(q, k_local, v_local, kv_offset, q_offset, kwargs, where, return_lse)


def _run(q, k_local, v_local, kv_offset: int, q_offset: int, kwargs, where, return_lse):
    """The local states, one all_gather of them, the merge."""
    got = shards.chunk(q, k_local, v_local, q_offset, kv_offset, kwargs, WHAT)
    o, lse = got if got is not None else shards.empty_state(q, v_local)
    if where.size > 1:
        got = all_gather_stacked(pack(o, lse), where)
        o, lse = merge_flat(got, o.shape, lse.shape, o.dtype)
    return (o, lse) if return_lse else o
