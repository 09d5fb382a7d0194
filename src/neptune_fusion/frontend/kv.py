"""Ragged and paged KV caches for ``nf.attention``: the arguments' checks.

``kv_lens`` (int32, ``(B,)``) is each sequence's valid key length; the ``S`` queries of
sequence ``b`` sit at positions ``kv_lens[b] - S ... kv_lens[b] - 1``. ``block_table``
(int32, ``(B, max_pages)``) makes ``k`` and ``v`` page pools ``(num_pages, Hkv,
page_size, D)``: key ``j`` of sequence ``b`` is row ``j % page_size`` of page
``block_table[b, j // page_size]``. Both are read by the kernels from device memory (see
:func:`~.attention.attention_definition`), so nothing here depends on their *values*
except :func:`check_values`, which needs them on the host:

* dtypes, devices and shapes are checked on every new call signature (cheap);
* values (a length above the cache, a page id outside the pool) are checked when the
  tensors are on the CPU (no device sync to pay) or when ``NEPTUNE_FUSION_VALIDATE=1``
  (a host sync per call: not for CUDA-graph capture). Otherwise a page id outside the
  pool reads a page inside it (the kernel clamps every gathered index into its
  dimension: an undefined result, never a fault) and a length above the cache counts
  only the keys the cache has.
"""

from __future__ import annotations

from ..errors import FeedError

MIN_PAGE = 16   # page sizes: powers of two from 16 (vLLM's default), tl.dot's K tile


def check_kv(q, k, v, kv_lens, block_table) -> int:
    """Check ``kv_lens`` and ``block_table`` against ``q, k, v`` (dtypes, shapes,
    devices); return the page size (0: a contiguous cache). Values: :func:`check_values`."""
    import torch
    b = q.shape[0]
    for name, t in (("kv_lens", kv_lens), ("block_table", block_table)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise FeedError(f"attention: {name} must be a torch tensor, got {type(t).__name__}")
        if t.dtype != torch.int32:
            raise FeedError(f"attention: {name} must be int32, got {t.dtype}")
        if t.device != q.device:
            raise FeedError(f"attention: {name} is on {t.device} but q is on {q.device}")
    if kv_lens is not None and tuple(kv_lens.shape) != (b,):
        raise FeedError(f"attention: kv_lens must have shape (B,) = ({b},), one length per "
                        f"sequence, got {tuple(kv_lens.shape)}")
    if block_table is None:
        return 0
    if block_table.dim() != 2 or block_table.shape[0] != b or block_table.shape[1] < 1:
        raise FeedError(f"attention: block_table must have shape (B, max_pages) with B = {b} "
                        f"and max_pages >= 1, got {tuple(block_table.shape)}")
    if k.shape[0] != v.shape[0] or k.shape[2] != v.shape[2]:
        raise FeedError(f"attention: with a block_table, k {tuple(k.shape)} and v "
                        f"{tuple(v.shape)} are page pools (num_pages, Hkv, page_size, D) "
                        "and must agree in num_pages and page_size")
    if k.shape[0] < 1:   # the kernels clamp a page id into the pool: it needs a page
        raise FeedError(f"attention: with a block_table, k {tuple(k.shape)} and v are page "
                        "pools (num_pages, Hkv, page_size, D) and need at least one page; "
                        "got num_pages = 0")
    ps = k.shape[2]
    if ps < MIN_PAGE or ps & (ps - 1):
        raise FeedError(f"attention: page size (dimension 2 of k with a block_table) must be "
                        f"a power of two >= {MIN_PAGE}, got {ps}")
    return ps


def check_values(k, kv_lens, block_table, page_size: int) -> None:
    """The values' checks (a host read): every ``kv_lens`` entry in ``[0, cache length]``
    and every page a sequence uses inside the pool. :class:`FeedError` naming the entry."""
    import torch
    cache = block_table.shape[1] * page_size if block_table is not None else k.shape[2]
    if kv_lens is not None:
        lens = kv_lens.tolist()
        for b, n in enumerate(lens):
            if not 0 <= n <= cache:
                raise FeedError(f"attention: kv_lens[{b}] = {n} is outside [0, {cache}], the "
                                "cache length" + (f" (max_pages {block_table.shape[1]} x "
                                                  f"page_size {page_size})"
                                                  if block_table is not None else ""))
    else:
        lens = [cache] * (block_table.shape[0] if block_table is not None else 0)
    if block_table is None:
        return
    pages = k.shape[0]
    used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] * page_size
    used = used < torch.tensor(lens, device=block_table.device)[:, None]
    bad = used & ((block_table < 0) | (block_table >= pages))
    if bool(bad.any()):
        b, p = (int(x) for x in bad.nonzero()[0])
        raise FeedError(f"attention: block_table[{b}, {p}] = {int(block_table[b, p])} is "
                        f"outside the pool of {pages} pages (sequence {b} uses its first "
                        f"{-(-lens[b] // page_size)} pages)")


def wants_values_checked(device) -> bool:
    """Whether :func:`check_values` runs: on CPU tensors, or with
    ``NEPTUNE_FUSION_VALIDATE=1``."""
    from ..settings import validate_enabled
    return device.type == "cpu" or validate_enabled()
