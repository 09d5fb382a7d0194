"""``ring_attention``: sequence-parallel attention (prefill) over the ranks of a group.

The key/value chunks travel the ring: at step ``s`` rank ``r`` holds the keys of rank
``r - s``, sends them on to ``r + 1`` and receives the next from ``r - 1`` with
``torch.distributed.batch_isend_irecv``, started once the step's first kernel is queued
and waited after the step's last, so the transfer overlaps the kernels (and the GPU
does not wait for the transfer's host setup). Each (query segment, key
segment) pair gives ``(o, lse)`` (one kernel, absolute positions for the mods), merged
into the segment's running state (:func:`.states.merge_states`); a pair the mask hides
entirely (a causal mask's future) is not computed, only forwarded.

Layouts (:func:`layout_segments`: where each rank's rows sit in the whole sequence):

* ``"contiguous"``: rank ``r`` holds the ``r``-th chunk. Under a causal mask rank
  ``P - 1`` does ``P - 1/2`` chunks of work and rank 0 half of one.
* ``"zigzag"``: the sequence is cut into ``2P`` chunks and rank ``r`` holds chunks ``r``
  and ``2P - 1 - r`` (its local tensor is the two, concatenated; the first is the first
  ``len // 2`` rows): every rank does about the same causal work. :func:`shard` cuts a
  whole tensor so.
"""

from __future__ import annotations

from ..errors import DistributedError
from . import shards
from .group import agree, gather_ints, ranks
from .states import merge_states

WHAT = "ring_attention"
LAYOUTS = ("contiguous", "zigzag")


def layout_segments(lengths: list[int], layout: str) -> list[list[tuple[int, int, int]]]:
    """Per rank, its segments ``(absolute start, local start, length)``, given every
    rank's local length."""
    p = len(lengths)
    if layout == "contiguous":
        starts = [sum(lengths[:r]) for r in range(p)]
        return [[(starts[r], 0, lengths[r])] for r in range(p)]
    # zigzag: chunk c < p is rank c's first half, chunk 2p - 1 - r its second
    size = {}
    for r, n in enumerate(lengths):
        size[r], size[2 * p - 1 - r] = n // 2, n - n // 2
    start = {c: sum(size[x] for x in range(c)) for c in range(2 * p)}
    return [[(start[r], 0, size[r]), (start[2 * p - 1 - r], size[r], size[2 * p - 1 - r])]
            for r in range(p)]


def shard(x, rank: int, world: int, layout: str = "contiguous", dim: int = 2):
    """This rank's part of ``x`` (the whole sequence along ``dim``) under ``layout``: ranks
    get ``len // world`` rows or one more, placed by :func:`layout_segments`."""
    if layout not in LAYOUTS:
        raise DistributedError(f"shard: layout must be one of {', '.join(LAYOUTS)}, got "
                               f"{layout!r}")
    import torch
    n = x.shape[dim]
    lengths = [n * (r + 1) // world - n * r // world for r in range(world)]
    segs = layout_segments(lengths, layout)[rank]
    return torch.cat([x.narrow(dim, start, length) for start, _, length in segs], dim)


def ring_attention(q_local, k_local, v_local, *, group=None, layout: str = "contiguous",
                   return_lse: bool = False, **attention_kwargs):
    """Attention of this rank's queries ``q_local`` (B, Hq, N_r, D) over the keys and
    values of every rank (``k_local``, ``v_local``: (B, Hkv, T_r, D)); returns this rank's
    rows of the output, (B, Hq, N_r, Dv) (``(o, lse)`` with ``return_lse=True``).

    Positions are absolute: under ``layout="contiguous"`` rank ``r``'s queries start at
    ``q_offset + N_0 + ... + N_{r-1}`` (``q_offset``: an int, default 0, or ``"end"``: all
    keys minus all queries) and its keys at ``T_0 + ... + T_{r-1}``; ``"zigzag"`` (module
    docstring) balances a causal mask's work. ``attention_kwargs`` are
    :func:`neptune_fusion.attention`'s, so ``mask_mod=causal`` is causal prefill over the
    whole sequence.
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
    q_segs = layout_segments(ns, layout)[r]
    k_segs = layout_segments(ts, layout)
    states: list = [None] * len(q_segs)
    k_cur, v_cur = k_local.contiguous(), v_local.contiguous()
    pairs = [(n_seg, q_seg, k_seg) for n_seg, q_seg in enumerate(q_segs)
             for k_seg in range(len(k_segs[0]))]
    for step in range(p):
        src = (r - step) % p
        pending, nxt = [], None
        for n_pair, (n_seg, (q0, qa, qn), ks) in enumerate(pairs):
            k0, ka, kn = k_segs[src][ks]
            got = shards.chunk(q_local.narrow(2, qa, qn), k_cur.narrow(2, ka, kn),
                               v_cur.narrow(2, ka, kn), base + q0, k0, kwargs, WHAT)
            if got is not None:
                old = states[n_seg]
                states[n_seg] = got if old is None else merge_states(
                    [old[0], got[0]], [old[1], got[1]])
            if n_pair == 0 and step < p - 1:
                # pass the chunk on once the first kernel is queued: the transfer runs
                # beside the compute (and the GPU does not wait for its host setup)
                pending, nxt = _pass_on(k_cur, v_cur, ts[src], ts[(src - 1) % p], where)
        for work in pending:
            work.wait()
        if nxt is not None:
            k_cur, v_cur = nxt
    outs = [st if st is not None else shards.empty_state(q_local.narrow(2, qa, qn), v_local)
            for st, (_, qa, qn) in zip(states, q_segs)]
    import torch
    o = torch.cat([x[0].to(q_local.dtype) for x in outs], 2) if len(outs) > 1 \
        else outs[0][0].to(q_local.dtype)
    if not return_lse:
        return o
    return o, (torch.cat([x[1] for x in outs], 2) if len(outs) > 1 else outs[0][1])


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
