"""``ring_attention``: sequence-parallel attention (prefill) over the ranks of a group.

Rank ``r`` holds the ``r``-th contiguous chunk of the queries and of the keys/values
(``layout="contiguous"``; chunks may be uneven or empty). The key/value chunks travel the
ring: at step ``s`` rank ``r`` holds the chunk of rank ``r - s``, sends it on to ``r + 1``
and receives the next from ``r - 1`` with ``torch.distributed.batch_isend_irecv``, started
*before* computing on the current chunk and waited *after* it, so the transfer overlaps
the kernel. Each chunk's ``(o, lse)`` (one kernel, absolute positions for the mods) is
merged into the running state (:func:`.states.merge_states`); a chunk the mask hides
entirely (a causal mask's future chunks) is not computed, only forwarded.
"""

from __future__ import annotations

from ..errors import DistributedError
from . import shards
from .group import agree, gather_ints, ranks
from .states import merge_states

WHAT = "ring_attention"
LAYOUTS = ("contiguous",)


def ring_attention(q_local, k_local, v_local, *, group=None, layout: str = "contiguous",
                   return_lse: bool = False, **attention_kwargs):
    """Attention of this rank's queries ``q_local`` (B, Hq, N_r, D) over the keys and
    values of every rank (``k_local``, ``v_local``: (B, Hkv, T_r, D)); returns this rank's
    rows of the output, (B, Hq, N_r, Dv) (``(o, lse)`` with ``return_lse=True``).

    Positions are absolute: rank ``r``'s queries start at ``q_offset + N_0 + ... +
    N_{r-1}`` (``q_offset``: an int, default 0, or ``"end"``: all keys minus all queries)
    and its keys at ``T_0 + ... + T_{r-1}``; ``attention_kwargs`` are
    :func:`neptune_fusion.attention`'s, so ``mask_mod=causal`` is causal prefill over the
    whole sequence. Only ``layout="contiguous"`` exists so far.
    """
    shards.reject(attention_kwargs, WHAT)
    if layout not in LAYOUTS:
        raise DistributedError(f"{WHAT}: layout must be one of {', '.join(LAYOUTS)}, got "
                               f"{layout!r}")
    shards.check_local(WHAT, q_local=q_local, k_local=k_local, v_local=v_local)
    kwargs = dict(attention_kwargs)
    where = ranks(group, WHAT)
    sig = shards.signature(q_local, k_local, v_local, kwargs, WHAT)
    rows = gather_ints(sig + [q_local.shape[2], k_local.shape[2]], q_local.device, where)
    agree(rows, shards.FIELDS, WHAT, shards.NAMES)
    ns, ts = [r[-2] for r in rows], [r[-1] for r in rows]
    base = kwargs.get("q_offset")
    base = sum(ts) - sum(ns) if base == "end" else base or 0
    r, p = where.rank, where.size
    q0 = base + sum(ns[:r])
    k_starts = [sum(ts[:s]) for s in range(p)]
    k_cur, v_cur = k_local.contiguous(), v_local.contiguous()
    o_acc = lse_acc = None
    for step in range(p):
        src = (r - step) % p
        pending, nxt = [], None
        if step < p - 1:   # start passing the chunk on before computing with it
            pending, nxt = _pass_on(k_cur, v_cur, ts[src], ts[(src - 1) % p], where)
        got = shards.chunk(q_local, k_cur, v_cur, q0, k_starts[src], kwargs, WHAT)
        if got is not None:
            if o_acc is None:
                o_acc, lse_acc = got
            else:
                o_acc, lse_acc = merge_states([o_acc, got[0]], [lse_acc, got[1]])
        for work in pending:
            work.wait()
        if nxt is not None:
            k_cur, v_cur = nxt
    if o_acc is None:
        o_acc, lse_acc = shards.empty_state(q_local, v_local)
    o = o_acc.to(q_local.dtype)
    return (o, lse_acc) if return_lse else o


def _pass_on(k, v, t_send: int, t_recv: int, where):
    """Send this chunk (``t_send`` keys) to the next rank and receive the previous rank's
    (``t_recv`` keys); empty chunks do not travel. Returns (works, (k, v) received)."""
    import torch
    import torch.distributed as dist
    nxt = where.global_rank((where.rank + 1) % where.size)
    prv = where.global_rank((where.rank - 1) % where.size)
    shape_k = (k.shape[0], k.shape[1], t_recv, k.shape[3])
    shape_v = (v.shape[0], v.shape[1], t_recv, v.shape[3])
    k_in = torch.empty(shape_k, dtype=k.dtype, device=k.device)
    v_in = torch.empty(shape_v, dtype=v.dtype, device=v.device)
    ops = []
    if t_send > 0 and k.numel() > 0:
        ops += [dist.P2POp(dist.isend, k, nxt, where.group),
                dist.P2POp(dist.isend, v, nxt, where.group)]
    if t_recv > 0 and k_in.numel() > 0:
        ops += [dist.P2POp(dist.irecv, k_in, prv, where.group),
                dist.P2POp(dist.irecv, v_in, prv, where.group)]
    return (dist.batch_isend_irecv(ops) if ops else []), (k_in, v_in)
