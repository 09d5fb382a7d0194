"""``nf.attention``: FlexAttention-style attention, written plainly and compiled.

``score_mod(score, b, h, i, j)`` and ``mask_mod(b, h, i, j)`` are written with nf
expressions (``i`` is the absolute query position, ``j`` the key position)::

    causal = lambda b, h, i, j: j <= i
    softcap = lambda s, b, h, i, j: 30.0 * nf.tanh(s / 30.0)
    out = nf.attention(q, k, v, score_mod=softcap, mask_mod=causal)

The definition built is the *plain* one (max, exp, sum, matmul, divide); the compiler
derives the online softmax. Kernels are cached per *shape class* -- dtypes, head counts,
head dims, what the mods compute (their traces, :mod:`.mods`: a mod whose captured values
change gets a new kernel), the scale, the query-offset mode and the schedule -- never per
sequence length or batch: those are symbolic sizes bound at call time. A query row with
no key (every key masked, or M = 0) gives 0, as SDPA and FlexAttention do. The cache is an
explicit :class:`AttentionCache`; :data:`DEFAULT_CACHE` is the one used when none is given.
"""

from __future__ import annotations

import functools
import math
import numbers
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import FeedError
from ..ir.fold import fold
from ..ir.nodes import Compute, Placeholder
from ..runtime import torch_ops
from ..runtime.inputs import check_no_grad, plain_types, remember
from ..runtime.kernel import overlaps_itself
from ..runtime.prepared import PreparedLaunch, signed
from ..schedule.schedule import Schedule
from . import kv
from . import lang as nf
from .bound import BOUND_MAX_QUERIES, BoundCalls
from .mods import ModTrace, Probes, apply, guard, probes, trace

INF = float("inf")
_DTYPES = ("float16", "bfloat16", "float32")


@functools.cache
def _torch_dtypes() -> dict:
    import torch
    return {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


@dataclass(frozen=True)
class AttentionSpec:
    """The shape class of an attention kernel: everything a kernel is specialised on."""

    dtype: str
    q_heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    scale: float
    # a function (traced when the definition is built) or its trace (the cache's keys:
    # what the mod computes, never the function object -- see :mod:`.mods`)
    score_mod: Callable | ModTrace | None = None
    mask_mod: Callable | ModTrace | None = None
    q_offset: int | str = 0          # an int, or "end": queries are the last M - N rows
    buffers: tuple[tuple[str, tuple[int, ...], str], ...] = ()  # (name, shape, dtype)
    # decode (one query) with the query heads of a key/value group packed into the row
    # axis: q is (B, Hkv, group, D), row r is query head hkv * group + r, at position
    # ``offset``; so one program's row block serves the whole group (tl.dot's M >= 16)
    packed: bool = False
    # a second output ``lse`` (float32, (B, heads, rows)): the row's log-sum-exp
    # ``m + log(l)`` (-inf for a row with no key), for merging shards (docs/distributed.md)
    lse: bool = False
    # a ragged cache: an int32 ``kv_lens`` (B,) input; queries of sequence b sit at
    # ``kv_lens[b] - N ...``, keys at or past ``kv_lens[b]`` are masked and not loaded
    kv_lens: bool = False
    # a paged cache (page_size > 0): k, v are page pools (P, Hkv, page_size, D) and an
    # int32 ``block_table`` (B, max_pages) input maps key j to page table[b, j // size];
    # the key axis is static, max_pages * page_size (frontend/kv.py)
    page_size: int = 0
    max_pages: int = 0


def attention_definition(spec: AttentionSpec) -> tuple[list[Compute], list[Placeholder]]:
    """The plain attention of ``spec`` over (B, H, N, D) tensors: ``([o], [q, k, v, ...])``.

    Sizes B (batch), N (queries) and M (keys) are symbolic. Score of query ``i`` (absolute
    position ``i + offset``) and key ``j``: ``s = scale * q_i . k_j``, then ``score_mod``,
    then ``-inf`` where ``mask_mod`` is false; ``o = softmax_j(s) @ v`` written as
    ``sum_j exp(s - max_j s) v_j / sum_j exp(s - max_j s)``.
    """
    if spec.q_heads % spec.kv_heads:
        raise FeedError(f"{spec.q_heads} query heads are not a multiple of "
                        f"{spec.kv_heads} key/value heads")
    B, N, M = nf.sizes("B N M")
    hq, hkv, d, dv = spec.q_heads, spec.kv_heads, spec.head_dim, spec.v_head_dim
    group = hq // hkv
    # (heads, rows) of q and o: (Hq, N), or packed decode (Hkv, group)
    heads, rows = (hkv, group) if spec.packed else (hq, N)
    q = nf.placeholder((B, heads, rows, d), spec.dtype, name="q")
    ps = spec.page_size
    if ps:
        P = nf.size("P")
        M = spec.max_pages * ps
        k = nf.placeholder((P, hkv, ps, d), spec.dtype, name="k")
        v = nf.placeholder((P, hkv, ps, dv), spec.dtype, name="v")
        table = nf.placeholder((B, spec.max_pages), "int32", name="block_table")
    else:
        k = nf.placeholder((B, hkv, M, d), spec.dtype, name="k")
        v = nf.placeholder((B, hkv, M, dv), spec.dtype, name="v")
    lens = nf.placeholder((B,), "int32", name="kv_lens") if spec.kv_lens else None
    bufs = {n: nf.placeholder(shape, dt, name=n) for n, shape, dt in spec.buffers}
    p = probes(spec.dtype, hq, spec.buffers)
    score_mod, mask_mod = trace(spec.score_mod, "score", p), trace(spec.mask_mod, "mask", p)
    offset = M - N if spec.q_offset == "end" else spec.q_offset
    if spec.packed and spec.q_offset == "end":
        offset = M - 1
    c = nf.reduce_axis(d, "c")
    j = nf.reduce_axis(M, "j")

    def kv_head(h):
        return h // group if group > 1 and not spec.packed else h

    def kv_at(t, b, h, jj, x):
        """Key/value ``jj`` of sequence ``b``: a page of the pool (an indirect load) or a
        row of the contiguous cache; past ``kv_lens[b]``, 0 (a masked load: never read)."""
        got = t[table[b, jj // ps], kv_head(h), jj % ps, x] if ps else \
            t[b, kv_head(h), jj, x]
        return nf.where(jj < lens[b], got, 0.0) if lens is not None else got

    def score(b, h, i, jj):
        dot = nf.sum(q[b, h, i, c] * kv_at(k, b, h, jj, c), c)
        s, bb, hh = dot * spec.scale, b, h
        # a ragged cache: the queries end at the sequence's own length
        at = offset if lens is None else lens[b] - (1 if spec.packed else N)
        if spec.packed:  # row i is query head h * group + i, the one query at ``offset``
            h, pos = h * group + i, at
        else:
            pos = i + at if not (isinstance(at, int) and at == 0) else i
        if score_mod is not None:
            s = apply(score_mod, s, b, h, pos, jj, bufs)
        if mask_mod is not None:
            s = nf.where(apply(mask_mod, None, b, h, pos, jj, bufs), s, -INF)
        if lens is not None:
            s = nf.where(jj < lens[b], s, -INF)
        if not {bb, hh, i, jj} <= fold(s).free_vars:
            # a score that does not depend on the query or key (scale 0, a constant or
            # key-only score_mod: uniform attention) gets ``+ 0 * q.k``: the plan then
            # sees every member depend on the rows, batch and heads, as the kernel needs,
            # and the code generator folds the term away (0 * x = 0, x finite)
            s = s + dot * 0.0
        return s

    s = nf.compute((B, heads, rows, M), score, name="s")
    mx = nf.compute((B, heads, rows), lambda b, h, i: nf.max(s[b, h, i, j], j), name="m")
    p = nf.compute((B, heads, rows, M),
                   lambda b, h, i, jj: nf.exp(s[b, h, i, jj] - mx[b, h, i]), name="p")
    l = nf.compute((B, heads, rows), lambda b, h, i: nf.sum(p[b, h, i, j], j),  # noqa: E741
                   name="l")
    # the output has the inputs' dtype, whatever a score_mod computes in; a row with no
    # key (all masked, or M = 0) gives 0, as SDPA and FlexAttention do, and a row with a
    # NaN score NaN, as SDPA does. The kernels tell them apart by l (0 for no key, NaN),
    # the reference by the maximum: there l is NaN for both (exp(-inf - -inf)), and the
    # maximum -inf only for no key. (``l > 0`` first keeps the kernels' state order, l's
    # update before the output's product; a backward from the saved log-sum-exp reads l
    # as 1, which folds the guard away: autodiff/softmax.py)
    o = nf.compute((B, heads, rows, dv), lambda b, h, i, e: nf.where(
        (l[b, h, i] > 0) | (mx[b, h, i] != -INF),
        nf.sum(p[b, h, i, j] * kv_at(v, b, h, j, e), j) / l[b, h, i], 0.0),
        name="o", dtype=spec.dtype)
    extra = ([lens] if lens is not None else []) + ([table] if ps else [])
    if spec.lse:
        # -inf for a row with no key, under the output's guard: in the reference l is NaN
        # there (m + log(l) would be NaN), and the kernels read l settled, NaN too (the
        # guard makes both -inf and lets them read it as it is: codegen/settle.py)
        lse = nf.compute((B, heads, rows), lambda b, h, i: nf.where(
            (l[b, h, i] > 0) | (mx[b, h, i] != -INF), mx[b, h, i] + nf.log(l[b, h, i]),
            -INF), name="lse", dtype="float32")
        return [o, lse], [q, k, v] + list(bufs.values()) + extra
    return [o], [q, k, v] + list(bufs.values()) + extra


class AttentionCache:
    """Compiled attention kernels keyed by shape class (and schedule). Thread-safe: one
    lock guards the tables, and a kernel is compiled once however many threads ask for it
    at the same time (the others wait for it; a compile holds only its key's lock).

    ``store`` is where kernels remember their tuned schedules and kernel specs across
    processes (a :class:`~neptune_fusion.runtime.disk_cache.DiskCache` or a directory;
    ``None``: the default ``~/.cache/neptune-fusion``; ``False``: nowhere -- nothing is
    read from or written to disk). See docs/cache.md.
    """

    def __init__(self, store=None) -> None:
        torch_ops.referable(self)   # traced code names it by number (torch_ops)
        self.store = store
        self._kernels: dict = {}
        self._building: dict = {}   # key -> the lock held while that kernel compiles
        # per-call derived objects (spec, schedule, kernel, packing) keyed by everything
        # they depend on -- see :func:`_call_key`; bounded, oldest dropped first
        self._calls: dict[tuple, _CallSetup] = {}
        # the mods' probes per (dtype, heads, buffers): equal mods then trace to the
        # identical (interned) expression, the kernels' key (see :mod:`.mods`)
        self._probes: dict[tuple, Probes] = {}
        self._guarded: dict[tuple, ModTrace] = {}   # traces by the mods' guards
        self._backward: dict = {}   # forward kernel -> (backward kernel, group)
        self.bound = BoundCalls()   # eager decode calls bound per signature (bound.py)
        self._lock = threading.Lock()
        self.hits = 0      # kernel lookups answered from the cache (a call setup is one)
        self.misses = 0    # kernels compiled
        self._call_hits = self._call_misses = 0

    def __len__(self) -> int:
        return len(self._kernels)

    def cache_info(self):
        """The compiled kernels (a :class:`~neptune_fusion.runtime.inputs.CacheInfo`):
        lookups answered from the cache (hits), kernels compiled (misses); unbounded."""
        from ..runtime.inputs import CacheInfo
        with self._lock:
            return CacheInfo(self.hits, self.misses, None, len(self._kernels))

    def call_info(self):
        """The call setups (what :func:`attention` derives from a call's key, see
        :func:`_call_key`): calls that found theirs (hits) and plans made (misses)."""
        from ..runtime.inputs import CacheInfo
        with self._lock:
            return CacheInfo(self._call_hits, self._call_misses, _MAX_CALLS, len(self._calls))

    def kernels(self) -> list:
        """The compiled kernels, in no particular order."""
        with self._lock:
            return list(self._kernels.values())

    def clear(self) -> None:
        with self._lock:
            self._kernels.clear()
            self._calls.clear()
            self._guarded.clear()
            self._probes.clear()
            self._backward.clear()
            self.bound.clear()
            self.hits = self.misses = 0
            self._call_hits = self._call_misses = 0

    def _traces(self, dtype: str, q_heads: int, buffers: tuple, score_mod, mask_mod):
        """The traces of the mods (what they compute now), with this cache's probes."""
        key = (dtype, q_heads, buffers)
        p = self._probes.get(key)
        if p is None:
            with self._lock:
                p = self._probes.get(key) or probes(dtype, q_heads, buffers)
                remember(self._probes, key, p, _MAX_CALLS)
        return self._trace(score_mod, "score", p, key), self._trace(mask_mod, "mask", p, key)

    def _trace(self, mod, kind: str, p: Probes, probes_key: tuple) -> ModTrace | None:
        """``mod``'s trace, remembered under its guard when it has one (see :mod:`.mods`)."""
        g = guard(mod) if mod is not None else None
        if g is None:
            return trace(mod, kind, p)
        key = (kind, probes_key, g)
        got = self._guarded.get(key)
        if got is None:
            got = trace(mod, kind, p)
            with self._lock:
                remember(self._guarded, key, got, _MAX_CALLS)
        return got

    def _call_setup(self, key: tuple | None) -> _CallSetup | None:
        """The cached setup of a call ``key``, counted as a kernel hit; None if unseen."""
        if key is None:
            return None
        with self._lock:
            try:
                setup = self._calls.get(key)
            except TypeError:  # an unhashable schedule: the full path reports it
                return None
            if setup is not None:
                self.hits += 1  # the kernel lookup this setup stands for
                self._call_hits += 1
        return setup

    def _remember(self, key: tuple | None, setup: _CallSetup) -> None:
        if key is None:
            return
        with self._lock:
            # bounded: e.g. a decode loop's growing key length
            remember(self._calls, key, setup, _MAX_CALLS)
            self._call_misses += 1

    def backward(self, kernel):
        """``(backward kernel, group)`` of a forward ``kernel``: derived and compiled on
        first use (:mod:`.attention_grad`; a :class:`DerivativeError` names what cannot
        be derived)."""
        from .attention_grad import build_backward
        with self._lock:
            got = self._backward.get(kernel)
        if got is None:
            got = build_backward(kernel, self.store)
            with self._lock:
                got = self._backward.setdefault(kernel, got)
        return got

    def kernel(self, spec: AttentionSpec, schedule):
        """The kernel of ``spec`` under ``schedule``, compiled on first use."""
        key = (spec, schedule)
        with self._lock:
            got = self._kernels.get(key)
            if got is not None:
                self.hits += 1
                return got
            building = self._building.setdefault(key, threading.Lock())
        with building:  # one compile per key: the others wait here, then find it
            with self._lock:
                got = self._kernels.get(key)
                if got is not None:
                    self.hits += 1
                    return got
            try:
                from ..runtime.pipeline import compile as nf_compile
                outs, ins = attention_definition(spec)
                kern = nf_compile(outs if spec.lse else outs[0], ins, schedule=schedule,
                                  name="attention", cache=self.store)
                with self._lock:
                    self.misses += 1
                    self._kernels[key] = kern
            finally:
                with self._lock:
                    self._building.pop(key, None)
        return kern


@dataclass(frozen=True)
class _CallSetup:
    """What :func:`attention` derives from a call's key: the kernel and the packing."""

    kernel: object
    packed: bool
    group: int
    page_size: int = 0     # a paged cache's page size (0: contiguous)


_MAX_CALLS = 1024   # call setups kept per AttentionCache


def _call_key(q, k, v, scale, enable_gqa, q_offset, bufs: dict, schedule,
              cache: AttentionCache, score_mod, mask_mod, kv_lens=None,
              block_table=None) -> tuple | None:
    """Everything :func:`attention`'s checks and derived objects depend on, or None.

    The mods enter as their traces (what they compute now, see :mod:`.mods`), never as
    objects: a mod whose captured values changed gets a new key.

    Plain tensors and parameters only (another subclass's attributes may not be plain
    data). The key length M
    is not part of it, only the query-offset mode it gives (``"end"`` for ``M - N``), so a
    decode loop whose K/V grow by one per step keeps one call setup; K and V must agree in
    M (the full path reports otherwise). Anything odd (not 4-d, a bool or float offset)
    gets None: the full path checks it and says what is wrong.
    """
    plain = plain_types()   # tensors and parameters (gpt-oss's sinks are one)
    if not (type(q) in plain and type(k) in plain and type(v) in plain
            and all(type(t) in plain for t in bufs.values())):
        return None
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or k.shape[2] != v.shape[2]:
        return None
    # a ragged or paged cache: the tensors' signature (never their values) joins the key
    cache_sig: tuple = ()
    for t in (kv_lens, block_table):
        if t is not None and type(t) not in plain:
            return None
        cache_sig += (None,) if t is None else (t.shape, t.dtype, t.device)
    m = k.shape[2]   # the cache length: a paged cache's is max_pages * page_size
    if block_table is not None:
        if block_table.dim() != 2:
            return None
        cache_sig += (k.shape[2],)   # the page size
        m = block_table.shape[1] * k.shape[2]
    if q.dtype not in _torch_dtypes() or type(scale) not in (float, int, type(None)) \
            or not isinstance(schedule, (str, Schedule, type(None))):
        return None
    if q_offset is None or isinstance(q_offset, str):
        mode = q_offset
    elif type(q_offset) is int and kv_lens is None:
        # (with kv_lens an int offset is refused: the full path says so, every call)
        mode = _offset_mode(q_offset, q.shape[2], m)
    else:
        return None
    ks, vs = k.shape, v.shape
    buffers = _buffers(bufs)
    mods = cache._traces(_torch_dtypes()[q.dtype], q.shape[1], buffers, score_mod, mask_mod)
    return (q.shape, ks[0], ks[1], ks[3], vs[0], vs[1], vs[3], q.dtype, k.dtype, v.dtype,
            q.device, k.device, v.device, mods, scale, bool(enable_gqa), mode,
            schedule, buffers, tuple(t.device for t in bufs.values()), cache_sig)


def _buffers(bufs: dict) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    """The buffers' signature: (name, shape, dtype) each (see :attr:`AttentionSpec.buffers`)."""
    return tuple((n, tuple(t.shape), str(t.dtype).removeprefix("torch."))
                 for n, t in bufs.items())


DEFAULT_CACHE = AttentionCache()
"""The cache :func:`attention` uses when it is given none (the only module-level state)."""


def _check(q, k, v, enable_gqa: bool, paged: bool = False) -> None:
    import torch
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise FeedError(f"attention: {name} must be a torch tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise FeedError(f"attention: {name} must be 4-d (B, H, S, D), got shape "
                            f"{tuple(t.shape)}")
        if str(t.dtype).removeprefix("torch.") not in _DTYPES:
            raise FeedError(f"attention: {name} is {t.dtype}; use float16, bfloat16 or float32")
    if not (q.dtype == k.dtype == v.dtype):
        raise FeedError(f"attention: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, "
                        f"{v.dtype}")
    if not (q.device == k.device == v.device):
        raise FeedError(f"attention: q, k, v must be on one device, got {q.device}, "
                        f"{k.device}, {v.device}")
    if not paged and not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise FeedError(f"attention: batch sizes differ: q {q.shape[0]}, k {k.shape[0]}, "
                        f"v {v.shape[0]}")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise FeedError(f"attention: k {tuple(k.shape)} and v {tuple(v.shape)} must agree in "
                        "heads and sequence length")
    if q.shape[3] != k.shape[3]:
        raise FeedError(f"attention: q has head dim {q.shape[3]} but k has {k.shape[3]}")
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv and not enable_gqa:
        raise FeedError(f"attention: q has {hq} heads and k/v {hkv}; pass enable_gqa=True "
                        "for grouped-query attention")
    if hkv == 0 or hq % hkv:
        raise FeedError(f"attention: {hq} query heads are not a multiple of {hkv} kv heads")


def _check_out(out, q, k, v) -> None:
    """``out`` of :func:`attention`: a tensor of the result's shape, dtype and device,
    not in the memory of ``q``, ``k`` or ``v`` (every program reads them while others
    write), no two of its elements in one place."""
    import torch
    if not isinstance(out, torch.Tensor):
        raise FeedError(f"attention: out must be a torch tensor, got {type(out).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if isinstance(t, torch.Tensor) and t.device == out.device and \
                t.untyped_storage().data_ptr() == out.untyped_storage().data_ptr():
            raise FeedError(f"attention: out shares memory with {name}; the kernel reads "
                            f"{name} while it writes out: pass another tensor")
    shape = (*q.shape[:3], v.shape[3]) if q.dim() == 4 and v.dim() == 4 else None
    if shape is None or tuple(out.shape) != shape:
        raise FeedError(f"attention: out has shape {tuple(out.shape)}; the result is "
                        f"(B, Hq, N, Dv) = {shape}")
    if out.dtype != q.dtype or out.device != q.device:
        raise FeedError(f"attention: out is {out.dtype} on {out.device}; the result is "
                        f"{q.dtype} on {q.device} (q's)")
    if overlaps_itself(out):
        raise FeedError(f"attention: out has strides {tuple(out.stride())}: some of its "
                        "elements share memory (an expand()ed view?); pass a tensor whose "
                        "every element has its own memory")


def _flag(name: str, value) -> bool:
    """A bool parameter of :func:`attention` (a Python or NumPy bool), as a bool."""
    if value is not True and value is not False:
        import numpy as np
        if not isinstance(value, np.bool_):
            raise FeedError(f"attention: {name} must be True or False, got {value!r}")
    return bool(value)


def _scale(scale, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if not isinstance(scale, numbers.Real) or isinstance(scale, bool) \
            or not math.isfinite(scale):
        raise FeedError(f"attention: scale must be a finite number (or None for "
                        f"1/sqrt(head dim)), got {scale!r}")
    return float(scale)


def _check_buffers(buffers) -> dict:
    import torch
    if buffers is None:
        return {}
    if not isinstance(buffers, Mapping):
        raise FeedError(f"attention: buffers must map names to tensors (a dict), got "
                        f"{type(buffers).__name__}")
    for name, t in buffers.items():
        if not isinstance(name, str) or not name.isidentifier() or name in _RESERVED:
            raise FeedError(f"attention: buffer name {name!r} must be an identifier other "
                            f"than {', '.join(_RESERVED)} (the mods get the buffers as "
                            "keyword arguments)")
        if not isinstance(t, torch.Tensor):
            raise FeedError(f"attention: buffer {name!r} must be a torch tensor, got "
                            f"{type(t).__name__}")
    return dict(buffers)


_RESERVED = ("q", "k", "v", "kv_lens", "block_table")   # the definition's own inputs


def _offset_mode(q_offset, n: int, m: int) -> int | str:
    if q_offset is None:
        return 0
    if q_offset == "end":
        return "end"
    if not isinstance(q_offset, int) or isinstance(q_offset, bool):
        raise FeedError(f"attention: q_offset must be an int, 'end' or None, got {q_offset!r}")
    # the common offsets get one kernel for every length: 0, and M - N (decode, chunks)
    return "end" if q_offset == m - n and q_offset != 0 else q_offset


def attention(q, k, v, *, score_mod: Callable | None = None,
              mask_mod: Callable | None = None, scale: float | None = None,
              enable_gqa: bool = False, q_offset: int | str | None = None,
              buffers: Mapping | None = None, cache: AttentionCache | None = None,
              schedule=None, return_lse: bool = False, kv_lens=None, block_table=None,
              sinks=None, out=None):
    """Attention of (B, Hq, N, D) ``q`` over (B, Hkv, M, D) ``k`` and (B, Hkv, M, Dv) ``v``.

    ``scale`` defaults to ``1/sqrt(D)``. ``q_offset`` is the absolute position of query
    row 0 (default 0; ``"end"`` or ``M - N`` puts the queries at the end: decode).
    ``buffers`` maps names to extra tensors the mods index (passed to them as keyword
    arguments, as placeholders), e.g. per-head ALiBi slopes. ``schedule`` is ``"auto"``
    (default: chosen, on a GPU tuned, per shape class and remembered; split-k for decode)
    or an explicit :class:`~neptune_fusion.schedule.schedule.Schedule`. Returns a tensor
    of ``q``'s dtype, computed by generated kernels (interpreted for CPU tensors).
    Traced by torch.compile or torch.export, a call is one ``neptune_fusion::attention``
    op (see docs/torch.md). ``return_lse=True`` (eager only) returns ``(o, lse)``: ``lse``
    is each row's log-sum-exp of its scores, float32 (B, Hq, N), ``-inf`` for a row with
    no key; the same kernel writes both (docs/distributed.md: a partial state to merge).

    A ragged or paged KV cache (docs/serving.md): ``kv_lens`` (int32, ``(B,)``) is each
    sequence's key length, its queries the last ones (positions ``kv_lens[b] - N ...``);
    ``block_table`` (int32, ``(B, max_pages)``) makes ``k`` and ``v`` page pools
    ``(num_pages, Hkv, page_size, D)``. Both are read by the kernels on the device: new
    lengths or pages compile nothing and sync nothing.

    ``sinks`` (a float tensor ``(Hq,)``): attention sinks, one more logit per query head
    with a zero value row (gpt-oss); merged into each row's state after the kernel
    (:mod:`.sinks`); differentiable, the sinks included, also under torch.compile.

    ``out``: a ``(B, Hq, N, Dv)`` tensor of ``q``'s dtype and device, any strides, that
    receives the result and is returned (e.g. ``o.transpose(1, 2)`` of a ``(B, N, Hq, Dv)``
    buffer: the layout a model's output projection reads, with no copy afterwards). The
    kernel writes it directly where it can (eager, one kernel output); elsewhere the
    result is copied into it. Not with inputs that require grad.
    """
    enable_gqa, return_lse = _flag("enable_gqa", enable_gqa), _flag("return_lse", return_lse)
    if cache is not None and not isinstance(cache, AttentionCache):
        raise FeedError(f"attention: cache must be an AttentionCache (or None for the "
                        f"default one), got {type(cache).__name__}")
    if out is not None:
        _check_out(out, q, k, v)
        if _wants_grad(q, k, v):
            raise FeedError("attention: out= does not support automatic differentiation "
                            "(q, k or v requires grad); call without out=")
        direct = sinks is None and not return_lse and not torch_ops.compiling()
        if direct:
            return _eager(q, k, v, score_mod, mask_mod, scale, enable_gqa, q_offset,
                          buffers, cache, schedule, kv_lens, block_table, out=out)
        got = attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod, scale=scale,
                        enable_gqa=enable_gqa, q_offset=q_offset, buffers=buffers,
                        cache=cache, schedule=schedule, return_lse=return_lse,
                        kv_lens=kv_lens, block_table=block_table, sinks=sinks)
        out.copy_(got[0] if return_lse else got)
        return (out, got[1]) if return_lse else out
    if sinks is not None:
        from .sinks import check_sinks, merge_sinks
        check_sinks(sinks, q)
        o, lse = attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod, scale=scale,
                           enable_gqa=enable_gqa, q_offset=q_offset, buffers=buffers,
                           cache=cache, schedule=schedule, return_lse=True,
                           kv_lens=kv_lens, block_table=block_table)
        return merge_sinks(o, lse, sinks, return_lse)
    # differentiable: a contiguous cache (a paged one keeps refusing grad, traced too),
    # eagerly here, traced through the op (_traced)
    if _wants_grad(q, k, v):
        if block_table is not None:
            raise FeedError("attention: a paged cache (block_table=) has no backward: q, k "
                            "or v requires grad; run it under torch.no_grad() or pass "
                            "detached tensors (a contiguous cache is differentiable)")
        if not torch_ops.compiling():
            return _differentiable(q, k, v, score_mod, mask_mod, scale, enable_gqa,
                                   q_offset, buffers, cache, schedule, return_lse, kv_lens)
    if return_lse:
        if torch_ops.compiling():
            return _traced(q, k, v, score_mod, mask_mod, scale, enable_gqa, q_offset,
                           buffers, cache, schedule, kv_lens, block_table, lse=True)
        return _eager(q, k, v, score_mod, mask_mod, scale, enable_gqa, q_offset, buffers,
                      cache, schedule, kv_lens, block_table, lse=True)
    if torch_ops.compiling():
        return _traced(q, k, v, score_mod, mask_mod, scale, enable_gqa, q_offset, buffers,
                       cache, schedule, kv_lens, block_table)
    return _eager(q, k, v, score_mod, mask_mod, scale, enable_gqa, q_offset, buffers, cache,
                  schedule, kv_lens, block_table)


def _wants_grad(q, k, v) -> bool:
    import torch
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))


def _differentiable(q, k, v, score_mod, mask_mod, scale, enable_gqa, q_offset, buffers,
                    cache, schedule, return_lse: bool = False, kv_lens=None):
    """:func:`attention` with a ``grad_fn`` (docs/autodiff.md): the forward kernel with
    the row log-sum-exp, the backward derived from its definition; with ``return_lse``
    the log-sum-exp is a differentiable output too. ``kv_lens`` (a ragged contiguous
    cache) is an input of both, not differentiated."""
    from . import attention_grad
    cache = cache if cache is not None else DEFAULT_CACHE

    def run(q, k, v, bufs):
        setup, tensors = _resolve(q, k, v, score_mod, mask_mod, scale, enable_gqa,
                                  q_offset, bufs, cache, schedule, kv_lens, lse=True)
        o, lse = setup.kernel(*tensors)
        return o, lse, setup.kernel, tensors
    bufs = _check_buffers(buffers)
    return attention_grad.apply(run, cache.backward, q, k, v, bufs, return_lse)


def _eager(q, k, v, score_mod, mask_mod, scale, enable_gqa, q_offset, buffers, cache,
           schedule, kv_lens=None, block_table=None, lse: bool = False, out=None):
    """:func:`attention` run now (eagerly; also the op's real implementation). A call
    seen before with this signature launches its bound kernels (frontend/bound.py).
    ``out`` (checked, no ``lse``): written by the kernel itself unless the call is a
    bound (at most 16 queries) or packed decode, whose result is copied into it."""
    if not lse and (out is None or q.shape[2] <= BOUND_MAX_QUERIES):
        c = cache if cache is not None else DEFAULT_CACHE
        got = c.bound.call(q, k, v, score_mod, mask_mod, scale, enable_gqa, q_offset,
                           buffers, c, schedule, kv_lens, block_table, _resolve)
        if got is not None:
            return got if out is None else out.copy_(got)
    setup, tensors = _resolve(q, k, v, score_mod, mask_mod, scale, enable_gqa, q_offset,
                              buffers, cache, schedule, kv_lens, block_table, lse)
    if out is not None:
        if setup.packed:
            got = setup.kernel(*tensors)
            return out.copy_(got.reshape(out.shape))
        return setup.kernel(*tensors, out=[out])
    out = setup.kernel(*tensors)
    if lse:  # [o, lse]; packed decode: (B, Hkv, group) rows are the query heads
        o, row_lse = out
        if setup.packed:
            o = o.reshape(q.shape[0], q.shape[1], 1, v.shape[3])
            row_lse = row_lse.reshape(q.shape[0], q.shape[1], 1)
        return o, row_lse
    return out.reshape(q.shape[0], q.shape[1], 1, v.shape[3]) if setup.packed else out


def _resolve(q, k, v, score_mod, mask_mod, scale, enable_gqa, q_offset, buffers, cache,
             schedule, kv_lens=None, block_table=None, lse: bool = False):
    """A call's checked setup (spec, schedule, kernel; cached per call key) and the
    tensors its kernel takes: ``(setup, [q, k, v, *buffers, kv_lens?, block_table?])``,
    the query reshaped for
    packed decode and any input whose last dimension is strided made contiguous."""
    if buffers is not None and not isinstance(buffers, Mapping):
        _check(q, k, v, enable_gqa)   # bad buffers: report bad q, k, v first, as before
    bufs = _check_buffers(buffers)
    check_no_grad((q, k, v, *bufs.values()), ("q", "k", "v", *bufs))
    cache = cache if cache is not None else DEFAULT_CACHE
    key = _call_key(q, k, v, scale, enable_gqa, q_offset, bufs, schedule, cache, score_mod,
                    mask_mod, kv_lens, block_table)
    if lse and key is not None:
        key = key + ("lse",)
    setup = cache._call_setup(key)
    if setup is None:  # first call of this key: full checks, then remember what they gave
        setup = _setup_call(q, k, v, score_mod, mask_mod, scale, enable_gqa, q_offset, bufs,
                            cache, schedule, kv_lens, block_table, lse)
        cache._remember(key, setup)
    kvs = [t for t in (kv_lens, block_table) if t is not None]
    if kvs and kv.wants_values_checked(q.device):
        kv.check_values(k, kv_lens, block_table, setup.page_size)
    qin = q.reshape(q.shape[0], k.shape[1], setup.group, q.shape[3]) if setup.packed else q
    return setup, [t if t.dim() == 0 or t.stride(-1) == 1 else t.contiguous()
                   for t in [qin, k, v] + list(bufs.values()) + kvs]


def _traced(q, k, v, score_mod, mask_mod, scale, enable_gqa, q_offset, buffers, cache,
            schedule, kv_lens=None, block_table=None, lse: bool = False):
    """:func:`attention` as the ``neptune_fusion::attention`` op (code Dynamo traces): the
    arguments that are not tensors enter the op's table, the buffers go as a list (then
    ``kv_lens`` and ``block_table``, when given); ``(o, lse)`` with ``lse``. Where no
    gradient is wanted, the op is ``attention_infer`` (``attention_infer_lse``), the same
    call without a derivative or its per-call wrapper."""
    import torch
    names = None if buffers is None else tuple(buffers)
    bufs = [] if names is None else [buffers[n] for n in names]
    has = (kv_lens is not None, block_table is not None)
    bufs += [t for t in (kv_lens, block_table) if t is not None]
    key = torch_ops.constant_key
    h = torch_ops.handle(_OpEntry, key(score_mod), key(mask_mod), scale, enable_gqa, q_offset,
                         names, key(cache), key(schedule), has)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if grad:   # the output and its log-sum-exp, which the backward reads
        o, row_lse = torch.ops.neptune_fusion.attention(q, k, v, bufs, h)
        return (o, row_lse) if lse else o
    if lse:   # no autograd wrapper per call
        return torch.ops.neptune_fusion.attention_infer_lse(q, k, v, bufs, h)
    return torch.ops.neptune_fusion.attention_infer(q, k, v, bufs, h)


OP_PREPARED_MAX_QUERIES = 16   # decode and speculative steps; a prefill is not bound
OP_PREPARED_SIGNATURES = 64    # bound launches kept per call site (then all dropped)
_OP_LOCK = threading.Lock()


class _OpEntry:
    """The op entry of one call site's non-tensor arguments (see runtime/torch_ops.py):
    ``run`` is the eager :func:`attention`, ``fake`` its output from the shapes."""

    def __init__(self, score_mod, mask_mod, scale, enable_gqa, q_offset, names, cache,
                 schedule, has=(False, False)) -> None:
        self.kw = dict(score_mod=score_mod, mask_mod=mask_mod, scale=scale,
                       enable_gqa=enable_gqa, q_offset=q_offset, cache=cache,
                       schedule=schedule)
        self.names = names
        self.has = has   # whether kv_lens, block_table follow the buffers
        self._prepared: dict = {}   # input signature -> bound decode launch (or False)

    def _buffers(self, tensors):
        return None if self.names is None else dict(zip(self.names, tensors[3:]))

    def _kv(self, tensors) -> list:
        rest = list(tensors[3 + len(self.names or ()):])
        return [rest.pop(0) if h else None for h in self.has]

    def _args(self, tensors) -> tuple:
        """The positional arguments of :func:`_eager` and :func:`_resolve` for the op's
        ``tensors``: q, k, v, this call site's keywords, the buffers, kv_lens, block_table."""
        kw = self.kw
        return (*tensors[:3], kw["score_mod"], kw["mask_mod"], kw["scale"], kw["enable_gqa"],
                kw["q_offset"], self._buffers(tensors), kw["cache"], kw["schedule"],
                *self._kv(tensors))

    def run(self, tensors) -> list:
        if tensors[0].shape[2] <= OP_PREPARED_MAX_QUERIES:
            got = self._prepared_run(tensors)
            if got is not None:
                return [got]
        return [_eager(*self._args(tensors))]

    def _prepared_run(self, tensors):
        """A decode step inside a compiled graph: the call bound once per input signature
        (as ``nf.prepare_attention`` binds it: no call key, checks or setup per call),
        with a fresh output per call (an op returns a tensor of its own). None where a bound
        launch does not apply (the general path then runs and says what is wrong)."""
        cuda = tensors[0].is_cuda
        sig, vals = signed(tensors, cuda)   # once: the key, and the launch's values
        sig = tuple(sig)
        got = self._prepared.get(sig)
        if got is None:
            q = tensors[0]
            try:
                setup, ktens = _resolve(*self._args(tensors))
                if any(g.data_ptr() != t.data_ptr() for g, t in zip(tensors, ktens)):
                    raise FeedError("strided input")
                kern = setup.kernel
                kern = kern.kernel_for(*ktens) if hasattr(kern, "kernel_for") else kern
                launch = PreparedLaunch(kern, ktens, list(tensors), fresh=True,
                                        transient=True)   # holds no device memory
                got = (launch, setup.packed, q.shape, tensors[2].shape[3], setup.page_size)
            except FeedError:
                got = False
            with _OP_LOCK:
                if len(self._prepared) >= OP_PREPARED_SIGNATURES:
                    self._prepared.clear()
                self._prepared[sig] = got
        if got is False:
            return None
        launch, packed, qshape, d, page_size = got
        lens, table = self._kv(tensors)
        if (lens is not None or table is not None) and kv.wants_values_checked(
                tensors[0].device):   # as the general path checks them, every call
            kv.check_values(tensors[1], lens, table, page_size)
        outs = launch.launch(vals)   # the key is the signature it was bound for
        if outs is None:
            return None
        return outs[0].reshape(qshape[0], qshape[1], 1, d) if packed else outs[0]

    def run_lse(self, tensors) -> list:
        """``[o, lse]``: the output and its rows' log-sum-exp ``(B, Hq, N)``, float32 (the
        differentiable op's forward: the backward reads both, nothing is recomputed)."""
        return list(_eager(*self._args(tensors), lse=True))

    def backward(self, tensors, out, lse, grad, grad_lse=None) -> list:
        """``[dq, dk, dv]`` for the cotangents ``grad`` of the op's output ``out`` and
        ``grad_lse`` of its log-sum-exp ``lse`` (either may be None), from the forward's
        saved ``out`` and ``lse`` through the derived backward kernels (the
        ``neptune_fusion::attention_backward`` op's real implementation)."""
        from . import attention_grad
        if self._kv(tensors)[1] is not None:
            raise FeedError("attention: no gradient with block_table (a paged serving "
                            "cache); see docs/autodiff.md")
        setup, ktens = _resolve(*self._args(tensors), lse=True)
        cache = self.kw["cache"] if self.kw["cache"] is not None else DEFAULT_CACHE
        rows = ktens[0].shape[:-1]   # the kernel's rows (packed decode: the group's heads)
        o = out.reshape(*rows, out.shape[-1]).contiguous()
        shapes = tuple(t.shape for t in tensors[:3])
        return attention_grad.grads(cache.backward(setup.kernel), ktens, o,
                                    lse.reshape(rows), grad, grad_lse, shapes)

    def fake(self, tensors, lse: bool = False) -> list:
        q, k, v = tensors[:3]
        lens, table = self._kv(tensors)
        _check(q, k, v, self.kw["enable_gqa"], paged=table is not None)
        kv.check_kv(q, k, v, lens, table)
        _check_buffers(self._buffers(tensors))
        _scale(self.kw["scale"], q.shape[3])
        _offset_mode(self.kw["q_offset"], q.shape[2], k.shape[2])
        o = q.new_empty((q.shape[0], q.shape[1], q.shape[2], v.shape[3]))
        if not lse:
            return [o]
        import torch
        return [o, q.new_empty((q.shape[0], q.shape[1], q.shape[2]), dtype=torch.float32)]


def _setup_call(q, k, v, score_mod, mask_mod, scale, enable_gqa, q_offset, bufs: dict,
                cache: AttentionCache, schedule, kv_lens=None, block_table=None,
                lse: bool = False) -> _CallSetup:
    """Check a call and derive its spec, schedule and kernel (see :func:`attention`)."""
    _check(q, k, v, enable_gqa, paged=block_table is not None)
    page = kv.check_kv(q, k, v, kv_lens, block_table)
    if kv_lens is not None and q_offset not in (None, "end"):
        raise FeedError(f"attention: q_offset={q_offset!r} with kv_lens: the queries of "
                        "sequence b sit at kv_lens[b] - N ... kv_lens[b] - 1 (pass "
                        "q_offset=None)")
    n, m, d = q.shape[2], k.shape[2], q.shape[3]
    pages = block_table.shape[1] if page else 0
    if page:
        m = pages * page   # the cache length
    group = q.shape[1] // k.shape[1]
    # decode GQA: the group's query heads become the rows of one program; the mods see
    # the query head as ``h * group + row`` (a per-head buffer such as ALiBi's slopes is
    # read at that index: a scalar plus the row variable, which loads lower)
    packed = n == 1 and group > 1
    dtype, buffers = str(q.dtype).removeprefix("torch."), _buffers(bufs)
    score_mod, mask_mod = cache._traces(dtype, q.shape[1], buffers, score_mod, mask_mod)
    spec = AttentionSpec(
        dtype=dtype, q_heads=q.shape[1], kv_heads=k.shape[1], head_dim=d,
        v_head_dim=v.shape[3], scale=_scale(scale, d), score_mod=score_mod,
        mask_mod=mask_mod, q_offset=_offset_mode(q_offset, n, m), buffers=buffers,
        packed=packed, kv_lens=kv_lens is not None, page_size=page, max_pages=pages,
        lse=lse)
    sched = "auto" if schedule is None else schedule
    if not (sched == "auto" or isinstance(sched, Schedule)):
        raise FeedError(f"attention: schedule must be 'auto', None or a Schedule, got "
                        f"{schedule!r}")
    return _CallSetup(cache.kernel(spec, sched), packed, group, page)
