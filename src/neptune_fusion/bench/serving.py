"""``--suite serving``: batched decode over a ragged or paged KV cache (issue 17, item 3).

A point is a batch of ``B`` sequences with one query each, KV lengths drawn uniformly
from ``[1024, 32768]`` (seeded: the same lengths every run), ``Hq/Hkv`` query and
key/value heads, head dim 128, in one of three layouts:

* ``ragged``: a contiguous cache ``(B, Hkv, max_len, D)`` and ``kv_lens``;
* ``paged16`` / ``paged64``: page pools ``(pages, Hkv, page, D)`` holding exactly the
  pages the sequences use, in a shuffled order, a ``block_table`` and ``kv_lens``.

Providers (each output gated against a float64 reference first, :mod:`.gate`):

* ``neptune``: ``nf.attention(q, k, v, kv_lens=..., block_table=...)``;
* ``flex``: FlexAttention compiled; ragged: a block mask built from the lengths
  (``kv < kv_lens[b]``); paged: ``torch.nn.attention.experimental._paged_attention``'s
  ``PagedAttention`` (its page table set to ours, its block mask converted from the
  logical one) over a copy of the pool in its own ``(1, Hkv, pages * page, D)`` layout;
* ``sdpa-cudnn``: SDPA's cuDNN backend on the *padded* batch: every sequence computed to
  the batch's longest length (what a serving engine without ragged support pays). Its
  gate is the float64 reference of that padded problem.

Times are GPU time (CUDA-graph replay, :func:`~.timing.graph_timer`); bandwidth counts
the bytes actually read -- each sequence's own keys and values, the queries, the output
written (and, paged, the block table) -- for every provider, so the padded baseline is
charged for the same useful bytes. After timing, ``neptune``'s captured graph is replayed
once more with *new, shorter* lengths written into ``kv_lens`` in place, and gated again:
one graph serves every length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

HEAD_DIM = 128
LENGTHS = (1024, 32768)            # KV lengths: uniform in this range (inclusive)
SEED = 17
BATCHES = (1, 8, 64)
HEADS = ((32, 8), (32, 32))
LAYOUTS = ("ragged", "paged16", "paged64")
# the CPU smoke run: tiny sizes, same structure
SMOKE = dict(lengths=(1, 80), batches=(1, 3), heads=((4, 2), (2, 2)), head_dim=32)


@dataclass(frozen=True, slots=True)
class ServingPoint:
    """One scenario: batch, heads, layout (``page`` 0: contiguous)."""

    batch: int
    q_heads: int
    kv_heads: int
    layout: str
    head_dim: int = HEAD_DIM
    lengths: tuple[int, int] = LENGTHS

    @property
    def page(self) -> int:
        return int(self.layout.removeprefix("paged")) if self.layout != "ragged" else 0

    @property
    def name(self) -> str:
        return f"B{self.batch}-H{self.q_heads}/{self.kv_heads}-{self.layout}"


def points(smoke: bool, only: list[str] | None = None) -> tuple[ServingPoint, ...]:
    """Every scenario (tiny ones for the smoke run), filtered by ``only``: tokens
    ``B<n>`` select batches, ``<hq>/<hkv>`` head layouts, layout names layouts; facets
    intersect, tokens of one facet unite. ValueError for an unknown token."""
    cfg = SMOKE if smoke else dict(lengths=LENGTHS, batches=BATCHES, heads=HEADS,
                                   head_dim=HEAD_DIM)
    # the head facets are named by the full-size heads, whatever the smoke run uses
    heads = dict(zip((f"{a}/{b}" for a, b in HEADS), cfg["heads"]))
    want_b, want_h, want_l = set(), set(), set()
    for tok in only or ():
        if tok in LAYOUTS:
            want_l.add(tok)
        elif tok in heads:
            want_h.add(tok)
        elif tok[:1] == "B" and tok[1:].isdigit() and int(tok[1:]) in BATCHES:
            want_b.add(BATCHES.index(int(tok[1:])))
        else:
            raise ValueError(f"unknown serving scenario {tok!r}; use B1, B8, B64, "
                             f"{', '.join(heads)}, {', '.join(LAYOUTS)}")
    out = []
    for bi, b in enumerate(cfg["batches"]):
        for hname, (hq, hkv) in heads.items():
            for lay in LAYOUTS:
                if (want_b and bi not in want_b) or (want_h and hname not in want_h) \
                        or (want_l and lay not in want_l):
                    continue
                out.append(ServingPoint(b, hq, hkv, lay, cfg["head_dim"], cfg["lengths"]))
    return tuple(out)


@dataclass
class ServingInputs:
    """The tensors of one point (on the device) and the per-sequence lengths (host)."""

    q: torch.Tensor
    k: torch.Tensor            # ragged: (B, Hkv, max_len, D); paged: the pool
    v: torch.Tensor
    kv_lens: torch.Tensor      # int32 (B,)
    lens: list[int]
    block_table: torch.Tensor | None = None   # int32 (B, max_pages)


def lengths(point: ServingPoint, seed: int = SEED) -> list[int]:
    """The point's KV lengths, uniform in ``point.lengths`` (seeded)."""
    g = torch.Generator().manual_seed(seed + point.batch)
    lo, hi = point.lengths
    return torch.randint(lo, hi + 1, (point.batch,), generator=g).tolist()


def make_inputs(point: ServingPoint, dtype: torch.dtype, device) -> ServingInputs:
    """Random N(0, 1) data. The cache past each length holds data too (as a reused cache
    does: a kernel that reads it into the result fails the gate) and the table past each
    sequence's pages an id outside the pool. (The CPU tests put NaN there.)"""
    lens = lengths(point)
    b, hq, hkv, d = point.batch, point.q_heads, point.kv_heads, point.head_dim
    q = torch.randn(b, hq, 1, d, device=device, dtype=dtype)
    kv_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    if not point.page:
        m = max(lens)
        k = torch.randn(b, hkv, m, d, device=device, dtype=dtype)
        v = torch.randn(b, hkv, m, d, device=device, dtype=dtype)
        return ServingInputs(q, k, v, kv_lens, lens)
    ps = point.page
    need = [-(-n // ps) for n in lens]
    pages = sum(need)
    max_pages = -(-point.lengths[1] // ps)
    g = torch.Generator().manual_seed(SEED)
    order = torch.randperm(pages, generator=g).to(torch.int32)
    table = torch.full((b, max_pages), pages + 7, dtype=torch.int32)   # outside the pool
    at = 0
    for i, n in enumerate(need):
        table[i, :n] = order[at:at + n]
        at += n
    k = torch.randn(pages, hkv, ps, d, device=device, dtype=dtype)
    v = torch.randn(pages, hkv, ps, d, device=device, dtype=dtype)
    return ServingInputs(q, k, v, kv_lens, lens, table.to(device))


def sequence_kv(x: ServingInputs, point: ServingPoint, b: int, t: torch.Tensor):
    """Sequence ``b``'s valid keys (or values) of cache ``t``: (Hkv, lens[b], D)."""
    n = x.lens[b]
    if not point.page:
        return t[b, :, :n]
    ps = point.page
    pages = x.block_table[b, :-(-n // ps)].long()
    return t[pages].transpose(0, 1).reshape(t.shape[1], -1, t.shape[3])[:, :n]


def reference(x: ServingInputs, point: ServingPoint):
    """float64 decode attention per sequence over its own keys (the query is the last
    position: it sees them all)."""
    out = torch.empty(point.batch, point.q_heads, 1, point.head_dim, dtype=torch.float64,
                      device=x.q.device)
    for b in range(point.batch):
        out[b] = _attend(x.q[b], sequence_kv(x, point, b, x.k), sequence_kv(x, point, b, x.v))
    return out


def _attend(q, k, v):
    g = q.shape[0] // k.shape[0]
    k = k.double().repeat_interleave(g, 0)
    v = v.double().repeat_interleave(g, 0)
    s = (q.double() @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(s, -1) @ v


def padded(x: ServingInputs, point: ServingPoint):
    """The batch padded to its longest sequence, zeros past each length: ``(k, v)``
    ``(B, Hkv, max_len, D)`` (a copy: what an engine without ragged support stores)."""
    m = max(x.lens)
    shape = (point.batch, point.kv_heads, m, point.head_dim)
    k = torch.zeros(shape, dtype=x.k.dtype, device=x.k.device)
    v = torch.zeros(shape, dtype=x.v.dtype, device=x.v.device)
    for b, n in enumerate(x.lens):
        k[b, :, :n] = sequence_kv(x, point, b, x.k)
        v[b, :, :n] = sequence_kv(x, point, b, x.v)
    return k, v


def padded_reference(q, k, v):
    """float64 attention of the padded problem: every key up to the longest length."""
    return torch.stack([_attend(q[b], k[b], v[b]) for b in range(q.shape[0])])


def bytes_read(x: ServingInputs, point: ServingPoint, dtype: torch.dtype) -> int:
    """The bytes a decode step must move: each sequence's own K and V, the queries, the
    output written, and the lengths and block table."""
    e = torch.empty((), dtype=dtype).element_size()
    kv = 2 * sum(x.lens) * point.kv_heads * point.head_dim * e
    qo = 2 * point.batch * point.q_heads * point.head_dim * e
    meta = x.kv_lens.numel() * 4 + (x.block_table.numel() * 4 if point.page else 0)
    return kv + qo + meta
