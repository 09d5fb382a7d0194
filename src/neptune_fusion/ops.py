"""The ten attention operators of BENCHMARKS.md: the one table of their facts.

Each operator is plain data (:class:`OpSpec`: phase, head layout, causal, ALiBi, soft-cap,
window, head dim) in :data:`OPERATORS`, the only place these facts are written down; the
benchmark harness (:mod:`neptune_fusion.bench`) reads it and adds only workload sizes.
:func:`definition` gives an operator's plain nf definition (for plans, the reference, the
generated source) and :func:`run` (or the per-operator functions ``pf_global`` ...
``dc_softcap``) computes it on torch tensors through
:func:`neptune_fusion.frontend.attention.attention`.

Score semantics, query position ``i`` and key ``j``::

    s = scale * q_i . k_j                   # scale = 1 / sqrt(head_dim)
    s = cap * tanh(s / cap)                 # soft-cap, when ``softcap`` is set
    s = s + slope_h * (j - i)               # ALiBi, slope_h = 2^(-8 (h + 1) / H)
    s = -inf where j > i (causal) or i - j >= window (sliding window)
    out_i = softmax_j(s) @ v

Prefill (``PF``) has query length = key length = S; decode (``DC``) has one query at
absolute position S - 1, so a causal decode query sees every key and needs no mask.

:func:`attention` is the entry point the benchmark harness calls
(:mod:`neptune_fusion.bench.providers.neptune`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from .frontend import lang as nf
from .frontend.attention import AttentionCache, AttentionSpec, attention_definition
from .frontend.attention import attention as _attention

HEAD_DIM = 128
Phase = Literal["PF", "DC"]


def alibi_exponent(head1, heads: int):
    """``log2`` of ALiBi's slope for the 1-based head ``head1`` of ``heads``:
    ``-8 head1 / heads``. ``head1`` may be a number, an nf expression or a torch tensor,
    so the kernels' score_mod and the harness's slope tensors share this one formula."""
    return -8.0 * head1 / heads


# ------------------------------------------------------------------ mods (plain data)


@dataclass(frozen=True)
class Causal:
    """mask_mod: key ``j`` at or before query ``i``."""

    def __call__(self, b, h, i, j, **_):
        return j <= i


@dataclass(frozen=True)
class SlidingWindow:
    """mask_mod: causal, and at most ``window - 1`` positions back (``i - j < window``)."""

    window: int

    def __call__(self, b, h, i, j, **_):
        return (j <= i) & (i - j < self.window)


@dataclass(frozen=True)
class SoftCap:
    """score_mod: ``cap * tanh(s / cap)``."""

    cap: float

    def __call__(self, s, b, h, i, j, **_):
        return self.cap * nf.tanh(s / self.cap)


@dataclass(frozen=True)
class Alibi:
    """score_mod: ``s + 2^(-8 (h + 1) / heads) * (j - i)`` (:func:`alibi_exponent`)."""

    heads: int

    def __call__(self, s, b, h, i, j, **_):
        slope = nf.exp2(alibi_exponent(nf.cast(h + 1, "float32"), self.heads))
        return s + slope * nf.cast(j - i, "float32")


@dataclass(frozen=True)
class AlibiSlopes:
    """score_mod: ``s + slopes[h] * (j - i)`` with the slopes given as a buffer."""

    def __call__(self, s, b, h, i, j, slopes=None, **_):
        return s + slopes[h] * nf.cast(j - i, "float32")


@dataclass(frozen=True)
class Chain:
    """score_mod: ``mods`` applied in order."""

    mods: tuple

    def __call__(self, s, b, h, i, j, **bufs):
        for mod in self.mods:
            s = mod(s, b, h, i, j, **bufs)
        return s


def score_mod_of(softcap: float | None, alibi: Alibi | AlibiSlopes | None):
    """The score_mod of a soft-cap then an ALiBi bias (either may be absent)."""
    mods = tuple(m for m in (SoftCap(softcap) if softcap is not None else None, alibi)
                 if m is not None)
    return None if not mods else mods[0] if len(mods) == 1 else Chain(mods)


def mask_mod_of(causal: bool, window: int | None):
    if window is not None:
        if not causal:
            raise ValueError("a sliding window is only defined for causal attention")
        return SlidingWindow(int(window))
    return Causal() if causal else None


# ------------------------------------------------------------------ the operators


@dataclass(frozen=True, slots=True)
class OpSpec:
    """One operator: attention of a phase, a head layout and a score variant (scale
    ``1/sqrt(head_dim)``; see the module docstring for the semantics)."""

    name: str
    phase: Phase        # "PF" prefill (N = M = S) | "DC" decode (N = 1 at S - 1)
    q_heads: int
    kv_heads: int
    causal: bool = True
    alibi: bool = False
    softcap: float | None = None
    window: int | None = None
    head_dim: int = HEAD_DIM

    def __post_init__(self) -> None:
        if self.phase not in ("PF", "DC"):
            raise ValueError(f"{self.name}: phase must be 'PF' or 'DC', got {self.phase!r}")
        if self.q_heads % self.kv_heads:
            raise ValueError(f"{self.name}: q_heads {self.q_heads} is not a multiple of "
                             f"kv_heads {self.kv_heads}")
        if self.window is not None and not self.causal:
            raise ValueError(f"{self.name}: a sliding window is only defined for causal "
                             "attention")

    @property
    def scale(self) -> float:
        """Softmax scale 1/sqrt(head_dim)."""
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def group(self) -> int:
        """Query heads per kv head (1 without GQA); kv head of query head h is h // group."""
        return self.q_heads // self.kv_heads

    def q_len(self, seq: int) -> int:
        """Number of query rows at key length ``seq``."""
        return seq if self.phase == "PF" else 1

    def q_start(self, seq: int) -> int:
        """Absolute position of the first query row."""
        return 0 if self.phase == "PF" else seq - 1

    def needs_mask(self, seq: int) -> bool:
        """True when some (i, j) pair is masked out (decode at S - 1 sees every key)."""
        if self.window is not None and self.window < seq:
            return True
        return self.causal and self.phase == "PF" and seq > 1

    def alibi_slopes(self, device="cpu"):
        """Per-query-head ALiBi slopes 2^(-8 (h + 1) / H) as a float32 tensor, or None."""
        if not self.alibi:
            return None
        import torch
        h = torch.arange(1, self.q_heads + 1, dtype=torch.float64, device=device)
        return torch.exp2(alibi_exponent(h, self.q_heads)).to(torch.float32)

    def score_mod(self):
        return score_mod_of(self.softcap, Alibi(self.q_heads) if self.alibi else None)

    def mask_mod(self):
        return mask_mod_of(self.causal, self.window)


OPERATORS: dict[str, OpSpec] = {op.name: op for op in (
    OpSpec("PF-Global", "PF", 32, 32, causal=False),
    OpSpec("PF-Causal", "PF", 32, 32),
    OpSpec("PF-GQA", "PF", 64, 8),
    OpSpec("PF-ALiBi", "PF", 32, 32, alibi=True),
    OpSpec("PF-SoftCap", "PF", 32, 16, softcap=50.0),
    OpSpec("PF-Window", "PF", 32, 8, softcap=50.0, window=4096),
    OpSpec("DC-Causal", "DC", 32, 32),
    OpSpec("DC-GQA", "DC", 64, 8),
    OpSpec("DC-ALiBi", "DC", 32, 32, alibi=True),
    OpSpec("DC-SoftCap", "DC", 32, 16, softcap=50.0),
)}
PREFILL = tuple(n for n, op in OPERATORS.items() if op.phase == "PF")
DECODE = tuple(n for n, op in OPERATORS.items() if op.phase == "DC")


def operator(name: str) -> OpSpec:
    """The operator called ``name`` (case-insensitive); ValueError listing the names."""
    op = OPERATORS.get(name) or {n.lower(): o for n, o in OPERATORS.items()}.get(name.lower())
    if op is None:
        raise ValueError(f"unknown operator {name!r}; choose from {', '.join(OPERATORS)}")
    return op


def definition(name: str, dtype: str = "float16", head_dim: int | None = None,
               q_heads: int | None = None, kv_heads: int | None = None,
               packed: bool = False):
    """The plain nf definition of operator ``name``: ``([o], [q, k, v])``.

    Head counts and head dim default to the operator's; pass smaller ones for small tests.
    ``packed`` (decode with GQA only) gives the form :func:`run` compiles for one query:
    q is (B, Hkv, group, D), the group's query heads packed into the rows.
    """
    op = operator(name)
    hq = op.q_heads if q_heads is None else q_heads
    hkv = op.kv_heads if kv_heads is None else kv_heads
    d = op.head_dim if head_dim is None else head_dim
    if packed and (op.phase != "DC" or hq == hkv):
        raise ValueError(f"{op.name}: packed applies to decode with GQA only")
    spec = AttentionSpec(
        dtype=dtype, q_heads=hq, kv_heads=hkv, head_dim=d, v_head_dim=d, scale=d ** -0.5,
        score_mod=score_mod_of(op.softcap, Alibi(hq) if op.alibi else None),
        mask_mod=op.mask_mod(), q_offset="end" if op.phase == "DC" else 0, packed=packed)
    return attention_definition(spec)


def run(name: str, q, k, v, *, cache: AttentionCache | None = None, schedule=None,
        kv_lens=None, block_table=None):
    """Operator ``name`` on (B, Hq, N, D) ``q`` and (B, Hkv, M, D) ``k``, ``v``.

    Decode operators take the query as the last position (``q_offset = M - N``). The
    ALiBi slopes follow the heads of ``q``. ``kv_lens`` and ``block_table``: a ragged or
    paged cache, as for :func:`neptune_fusion.frontend.attention.attention`; with
    ``kv_lens`` every operator's queries are the last ones of each sequence (a chunked
    prefill for the PF operators).
    """
    op = operator(name)
    alibi = Alibi(q.shape[1]) if op.alibi else None
    return _attention(q, k, v, score_mod=score_mod_of(op.softcap, alibi),
                      mask_mod=op.mask_mod(), enable_gqa=q.shape[1] != k.shape[1],
                      q_offset=None if kv_lens is not None else
                      "end" if op.phase == "DC" else 0, cache=cache,
                      schedule=schedule, kv_lens=kv_lens, block_table=block_table)


def _runner(name: str):
    def fn(q, k, v, **kw):
        return run(name, q, k, v, **kw)
    fn.__name__ = fn.__qualname__ = name.lower().replace("-", "_")
    fn.__doc__ = f"Operator {name} on torch tensors (see :data:`OPERATORS`, :func:`run`)."
    return fn


pf_global = _runner("PF-Global")
pf_causal = _runner("PF-Causal")
pf_gqa = _runner("PF-GQA")
pf_alibi = _runner("PF-ALiBi")
pf_softcap = _runner("PF-SoftCap")
pf_window = _runner("PF-Window")
dc_causal = _runner("DC-Causal")
dc_gqa = _runner("DC-GQA")
dc_alibi = _runner("DC-ALiBi")
dc_softcap = _runner("DC-SoftCap")


def attention(q, k, v, *, scale: float, causal: bool, q_start: int = 0,
              alibi_slopes=None, softcap: float | None = None, window: int | None = None,
              cache: AttentionCache | None = None, schedule=None, kv_lens=None,
              block_table=None):
    """The benchmark harness's entry point (see :mod:`neptune_fusion.bench.providers.neptune`).

    ``q_start`` is the absolute position of query row 0 (``S - 1`` in decode);
    ``alibi_slopes`` a (Hq,) float32 tensor of per-head slopes (bias ``slope * (j - i)``).
    ``cache``, ``schedule``, ``kv_lens`` and ``block_table`` as for
    :func:`neptune_fusion.frontend.attention.attention` (with ``kv_lens`` the queries end
    at each sequence's length and ``q_start`` is not used).
    """
    return _attention(q, k, v, **_keywords(q, k, scale, causal, q_start, alibi_slopes,
                                           softcap, window, cache, schedule, kv_lens,
                                           block_table))


def prepare(q, k, v, *, scale: float, causal: bool, q_start: int = 0, alibi_slopes=None,
            softcap: float | None = None, window: int | None = None,
            cache: AttentionCache | None = None, schedule=None, kv_lens=None,
            block_table=None):
    """:func:`attention`'s call prepared for the signature of ``q, k, v``
    (:func:`neptune_fusion.prepare_attention`): returns ``run(q, k, v)``, whose
    ``schedule`` is the schedule it launches."""
    from .frontend.prepared import prepare_attention
    kw = _keywords(q, k, scale, causal, q_start, alibi_slopes, softcap, window, cache,
                   schedule, kv_lens, block_table)
    prepared, buffers = prepare_attention(q, k, v, **kw), kw["buffers"]

    def run(q, k, v):
        return prepared(q, k, v, buffers, kv_lens, block_table)
    run.schedule = prepared.schedule   # what it launches (the bench's notes name it)
    return run


def _keywords(q, k, scale, causal, q_start, alibi_slopes, softcap, window, cache,
              schedule, kv_lens=None, block_table=None) -> dict:
    """nf.attention's keywords for the harness's arguments."""
    buffers = None
    alibi = None
    if alibi_slopes is not None:
        import torch
        slopes = alibi_slopes
        if slopes.device != q.device or slopes.dtype != torch.float32 \
                or not slopes.is_contiguous():  # converted only when needed: per call
            slopes = slopes.to(device=q.device, dtype=torch.float32).contiguous()
        buffers = {"slopes": slopes}
        alibi = AlibiSlopes()
    return dict(score_mod=score_mod_of(softcap, alibi), mask_mod=mask_mod_of(causal, window),
                scale=scale, enable_gqa=q.shape[1] != k.shape[1],
                q_offset=None if kv_lens is not None else q_start,
                buffers=buffers, cache=cache, schedule=schedule, kv_lens=kv_lens,
                block_table=block_table)
