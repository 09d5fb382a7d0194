"""Hugging Face transformers: ``attn_implementation="neptune_fusion"``.

:func:`register` adds two entries under the name ``"neptune_fusion"``:

* to ``AttentionMaskInterface`` :func:`mask_structure`, which turns what transformers
  would build a mask from (the query and key offsets, the key length, the 2-d padding
  mask and the mask *function*) into a small :class:`MaskStructure` -- no dense mask is
  ever built. The mask function is recognised, not evaluated: transformers' causal mask,
  and its ``and_masks`` of causal with a sliding-window overlay (read from the closures
  transformers builds; anything else, e.g. packed sequences or a custom ``or``/``and``
  mask, raises :class:`~neptune_fusion.NeptuneError` naming it);
* to ``AttentionInterface`` :func:`attention_forward`, which maps that structure,
  ``scaling``, ``sliding_window``, ``softcap`` and the sinks ``s_aux`` onto one
  :func:`neptune_fusion.attention` call (``mask_mod``/``score_mod`` plus buffers) over the
  unexpanded (B, Hkv, M, D) keys and values, and returns ``(B, S, Hq, D)`` and ``None``.

Positions. Query row ``i`` is at absolute position ``q_offset + i`` and key ``j`` at
``kv_offset + j``. When the queries are the last keys (no cache, a dynamic cache, a
dynamic sliding-window cache) the call uses ``q_offset="end"``: one kernel for every
length. A static cache hands over all its slots and the queries' offset as a device
tensor: the call passes ``kv_lens = q_offset + S`` (per batch row, on the device), so the
kernel's key loop stops at the filled slots and nothing syncs with the host -- one kernel
and one CUDA graph for every decode step. (A static cache whose key offset is not 0, or
an offset given as an int, takes the host path: the empty slots past the last query are
dropped, a view of K and V.)

Sinks (gpt-oss). A sink is one more logit per head with a zero value row: softmax over
``[scores, sink]``. A decode step (at most 16 queries) and a call whose sinks want a
gradient (training: ``s_aux`` requires grad, grad mode on) pass them as
``nf.attention(..., sinks=s_aux)`` (or a prepared call's ``sinks=``): the kernel writes
each row's log-sum-exp and the sinks are merged after it (``o * sigmoid(lse - sink)``,
one pass over the small output; differentiable, the sinks included: docs/autodiff.md),
eagerly or traced by torch.compile. A prefill whose sinks want no gradient adds the sink
as a key at index 0 whose score is ``s_aux[h]`` (the ``score_mod``) and which every query
sees (the ``mask_mod``), with zero key and value rows prepended: a copy of K and V per
call, less than the merge's pass over the output when there are more queries than keys
per KV head (GQA). (The zero key at every decode step copied the whole cache.)

Training. ``nf.attention`` is differentiable, so a model trains with this attention in
eager mode (gradients of every parameter match transformers' eager attention; tests).

Padding. A 2-d padding mask with a masked key travels as a (B, M) buffer read by the
``mask_mod``; its shape is part of the kernel's shape class, so each key length compiles
its own kernel (fine for one prefill, slow for batched padded decoding).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import FeedError, NeptuneError

NAME = "neptune_fusion"


class UnsupportedAttention(NeptuneError, ValueError):
    """What a model asked of attention that this integration does not do (named)."""


@dataclass(frozen=True, eq=False)
class MaskStructure:
    """The mask transformers asked for, as structure: what :func:`attention_forward` reads.

    ``causal``: keys after the query are masked; ``window``: also keys ``window`` or more
    positions before it (transformers' ``kv > q - window``); ``padding``: a (B, kv_length)
    bool tensor (True: attend) or None when nothing is padded; ``q_offset``/``kv_offset``:
    absolute positions of query row 0 and key 0 (ints; ``q_offset`` may be a 0-d device
    tensor: a static cache's, read by the kernel through ``kv_lens``); ``kv_lens``: then
    the (B,) int32 device tensor ``q_offset + q_length``, built once per forward for
    every layer (a layer with another batch or query length builds its own).
    """

    causal: bool
    window: int | None
    q_length: int
    kv_length: int
    q_offset: object = 0
    kv_offset: int = 0
    padding: object = None
    kv_lens: object = None

    # transformers' code asks a mask for its shape and ndim (e.g. a mask that generate()
    # built is passed to the model again); answer as a (B, 1, q, kv) mask would
    ndim = 4

    @property
    def shape(self):
        b = 1 if self.padding is None else self.padding.shape[0]
        return (b, 1, self.q_length, self.kv_length)


def _closure(fn) -> dict:
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    if code is None:
        return {}
    return {n: c.cell_contents for n, c in zip(code.co_freevars, cells)}


def _recognise(fn) -> tuple[bool, int | None]:
    """``(causal, window)`` of a transformers mask function, or UnsupportedAttention."""
    from transformers import masking_utils as mu

    def parts(f):
        name = getattr(f, "__qualname__", "")
        if name.startswith("and_masks.") and "mask_functions" in _closure(f):
            return [p for g in _closure(f)["mask_functions"] for p in parts(g)]
        return [f]

    causal, window = False, None
    for p in parts(fn):
        name = getattr(p, "__qualname__", repr(p))
        w = _closure(p).get("sliding_window")
        if p is mu.causal_mask_function:
            causal = True
        elif name.startswith("sliding_window_overlay.") and isinstance(w, int) \
                and not isinstance(w, bool) and w > 0 and window is None:
            window = w
        else:
            raise UnsupportedAttention(
                f"neptune_fusion attention: mask function {name} is not supported (only "
                "transformers' causal mask and its sliding-window overlay are; packed "
                "sequences, bidirectional and custom or_/and_mask functions are not)")
    if window is not None and not causal:
        raise UnsupportedAttention("neptune_fusion attention: a sliding window without the "
                                   "causal mask is not supported")
    return causal, window


# Under torch.compile, Dynamo calls it at trace time and keeps the result as a constant
# (torch.compiler.assume_constant_result): it reads functions' names and closures, which
# Dynamo does not trace; a mask function is a constant of the model's code.
_recognise._dynamo_marked_constant = True


def mask_structure(batch_size: int = 1, q_length: int | None = None, kv_length: int = 0,
                   q_offset=0, kv_offset=0, mask_function=None, attention_mask=None,
                   cache_position=None, **_ignored) -> MaskStructure:
    """The ``AttentionMaskInterface`` entry: a :class:`MaskStructure`, no dense mask.

    Takes transformers 5.x's arguments (``q_length``, ``q_offset``) and 4.5x's
    (``cache_position``: the queries' absolute positions, assumed consecutive).
    """
    if isinstance(attention_mask, MaskStructure):
        return attention_mask   # built already (generate() builds the masks of a step)
    if mask_function is None:
        from transformers.masking_utils import causal_mask_function as mask_function
    causal, window = _recognise(mask_function)
    if q_length is None:
        if cache_position is None:
            raise FeedError("neptune_fusion mask: got neither q_length nor cache_position")
        q_length, q_offset = int(cache_position.shape[0]), cache_position[0]
    padding = None
    if attention_mask is not None:
        if attention_mask.dim() != 2:
            raise UnsupportedAttention(
                f"neptune_fusion mask: attention_mask of shape {tuple(attention_mask.shape)}; "
                "only a 2-d (batch, keys) padding mask is supported")
        padding = _slice_padding(attention_mask.bool(), kv_length, kv_offset)
        if not _tracing() and bool(padding.all()):   # traced: no host sync, keep it
            padding = None
    # a static cache's query offset is a 0-d tensor the cache advances in place when a
    # layer writes its keys (before its attention runs): keep a copy of its value now, on
    # the device (attention_forward passes it as kv_lens), when the key offset is 0
    device_offset = _is_tensor(q_offset) and not _is_tensor(kv_offset) and kv_offset == 0
    kv_lens = _kv_lens(q_offset, int(q_length), int(batch_size)) if device_offset else None
    return MaskStructure(causal, window, int(q_length), int(kv_length),
                         q_offset.clone() if device_offset else int(q_offset),
                         int(kv_offset), padding, kv_lens)


def _kv_lens(q_offset, n: int, batch: int):
    """(batch,) int32: a static cache's filled length after ``n`` queries at the device
    offset ``q_offset`` (device ops, no host sync)."""
    import torch
    return (q_offset.reshape(()).to(torch.int32) + n).expand(batch).contiguous()


def _is_tensor(x) -> bool:
    import torch
    return isinstance(x, torch.Tensor)


def _tracing() -> bool:
    import torch
    return torch.compiler.is_compiling()


def _slice_padding(mask, kv_length: int, kv_offset):
    """The padding mask's columns for keys ``kv_offset .. kv_offset + kv_length``, padded
    with True (attend) past its end, as transformers' own mask builders do."""
    import torch
    start = int(kv_offset)
    cols = mask[:, start:start + kv_length]
    if cols.shape[1] < kv_length:
        pad = torch.ones(mask.shape[0], kv_length - cols.shape[1], dtype=torch.bool,
                         device=mask.device)
        cols = torch.cat([cols, pad], dim=1)
    return cols


# -- the mods: built from plain scalars only, so nf.attention's guard reuses their traces
# (their code and captured values: frontend/mods.guard), made again on every call
def _mask_mod(causal: bool, window: int | None, shift: int, with_padding: bool):
    """Key ``j`` (the real key ``j - shift``; ``shift`` 1: a sink at 0) for query ``i``
    (its position in key coordinates: nf's ``"end"`` offset)."""
    def mask(b, h, i, j, **bufs):
        ok = j >= shift
        if causal:
            ok = ok & (j <= i)
        if window is not None:
            ok = ok & (j > i - window)
        if with_padding:
            ok = ok & (bufs["padding"][b, j] > 0)
        if shift:
            ok = ok | (j < shift)
        return ok
    return mask


def _score_mod(softcap: float | None, sinks: bool):
    from ..frontend import lang

    def score(s, b, h, i, j, **bufs):
        if softcap is not None:
            s = softcap * lang.tanh(s / softcap)
        if sinks:
            s = lang.where(j < 1, bufs["sinks"][h], s)
        return s
    return score


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      sliding_window=None, softcap=None, s_aux=None, **kwargs):
    """The ``AttentionInterface`` entry: (B, Hq, S, D) ``query`` over (B, Hkv, M, D)
    ``key``/``value`` -> ``((B, S, Hq, D), None)``. See the module docstring."""
    import torch


    if dropout:
        raise UnsupportedAttention(f"neptune_fusion attention: dropout={dropout} is not "
                                   "supported (the fused kernel applies no dropout); set the "
                                   "model's attention_dropout to 0")
    if kwargs.get("output_attentions"):
        raise UnsupportedAttention("neptune_fusion attention: output_attentions=True needs "
                                   "the attention weights, which the fused kernel never forms")
    if scaling is None:
        scaling = getattr(module, "scaling", None)
    if scaling is None:
        raise UnsupportedAttention("neptune_fusion attention: no scaling given (neither the "
                                   "scaling argument nor module.scaling)")
    n, m = query.shape[2], key.shape[2]
    if attention_mask is None:
        # no mask built (a model calling attention directly): causal per the module
        causal = bool(getattr(module, "is_causal", True))
        st = MaskStructure(causal, sliding_window if causal else None, n, m, m - n, 0)
    elif isinstance(attention_mask, MaskStructure):
        st = attention_mask
    else:
        raise UnsupportedAttention(
            f"neptune_fusion attention: got an attention_mask of type "
            f"{type(attention_mask).__name__}; a dense or custom mask is not supported (the "
            f"mask must come from transformers' causal or sliding-window mask builders, "
            f"registered by neptune_fusion.integrations.transformers.register())")
    if st.kv_length != m:
        raise UnsupportedAttention(f"neptune_fusion attention: the mask covers {st.kv_length} "
                                   f"keys but the layer has {m}")
    window = st.window
    if sliding_window is not None and window is None and st.causal:
        window = int(sliding_window)   # a sliding layer given a full causal mask
    if window is not None and sliding_window is not None and int(sliding_window) != window:
        raise UnsupportedAttention(f"neptune_fusion attention: the layer's sliding_window "
                                   f"{sliding_window} and its mask's window {window} differ")

    bufs = {}
    padding = st.padding
    qo, ko = st.q_offset, st.kv_offset
    kv_lens = None
    if _is_tensor(qo) and not st.causal:
        qo = int(qo)   # a static cache without a causal mask: the host path says no
    if _is_tensor(qo):
        # a static cache, offsets on the device: the filled slots end after the queries
        kv_lens = st.kv_lens if st.kv_lens is not None and st.q_length == n and \
            st.kv_lens.shape[0] == query.shape[0] else _kv_lens(qo, n, query.shape[0])
    elif qo + n != ko + m:
        # a static cache: the keys past the last query are empty slots. A causal mask hides
        # them, so drop them (a view) and the queries are the last keys again. (Keeping them
        # with the offset in a buffer would share one kernel across decode steps, but a
        # mask bound that reads a buffer fails in the core's cost model: see the docs.)
        valid = qo + n - ko
        if not st.causal or not 0 < valid <= m:
            raise UnsupportedAttention(
                f"neptune_fusion attention: queries at positions {qo}..{qo + n - 1} over keys "
                f"at {ko}..{ko + m - 1}; only queries that end at or before the last key "
                f"under a causal mask are supported")
        key, value, m = key[:, :, :valid], value[:, :, :valid], valid
        if padding is not None:
            padding = padding[:, :valid]
    if s_aux is not None and (s_aux.dim() != 1 or s_aux.shape[0] != query.shape[1]):
        raise UnsupportedAttention(f"neptune_fusion attention: s_aux has shape "
                                   f"{tuple(s_aux.shape)}; one sink per query head "
                                   f"({query.shape[1]},) is supported")
    # training (the sinks want a gradient) and decode: the sinks merged after the kernel
    # (nf.attention's sinks=, eager or traced); else a zero key in front whose score is
    # the sink
    trained = s_aux is not None and s_aux.requires_grad and torch.is_grad_enabled()
    merged = s_aux is not None and (trained or query.shape[2] <= _PREPARED_MAX_QUERIES)
    sinks = s_aux is not None and not merged
    shift = 1 if sinks else 0
    if padding is not None:
        pad = padding.to(device=query.device, dtype=torch.int32)
        if sinks:
            pad = torch.cat([pad.new_ones(pad.shape[0], 1), pad], dim=1)
        if pad.shape[0] != query.shape[0]:
            pad = pad.expand(query.shape[0], -1)
        bufs["padding"] = pad.contiguous()
    if sinks:
        bufs["sinks"] = s_aux.detach().to(device=query.device, dtype=torch.float32)
        zk = key.new_zeros(key.shape[0], key.shape[1], 1, key.shape[3])
        zv = value.new_zeros(value.shape[0], value.shape[1], 1, value.shape[3])
        key, value = torch.cat([zk, key], dim=2), torch.cat([zv, value], dim=2)
    cap = float(softcap) if softcap is not None else None
    what = (st.causal, window, shift, "padding" in bufs, cap, sinks, float(scaling),
            query.shape[1] != key.shape[1])
    if kv_lens is not None:
        kv_lens = kv_lens + shift
    if trained:
        from ..frontend.attention import attention
        out = attention(query, key, value, buffers=bufs or None, kv_lens=kv_lens,
                        sinks=s_aux.to(query.device), **_keywords(what, kv_lens))
    else:
        out = _attend(module, what, query, key, value, bufs or None, kv_lens,
                      s_aux.detach().to(query.device, torch.float32) if merged else None)
    return out.transpose(1, 2).contiguous(), None


_PREPARED_MAX_QUERIES = 16   # decode and speculative steps; a prefill is not prepared
_PREPARED_PER_LAYER = 8      # prepared calls a layer keeps (oldest dropped first)


def _attend(module, what: tuple, query, key, value, bufs, kv_lens, sinks=None):
    """``nf.attention`` for a layer: ``what`` = (causal, window, shift, padding, softcap,
    sinks, scale, gqa); ``sinks``: the sink logits to merge after the kernel, or None. A
    decode step (at most 16 queries) runs a call prepared once per layer and input
    signature (:func:`neptune_fusion.prepare_attention`: a signature
    compare and the kernels' own launchers, no per-call checks or allocation): at once
    with a static cache's device lengths (``kv_lens``: every step has the same shapes),
    and on a signature's second sighting without them (a sliding-window cache of fixed
    size repeats its shapes; a dynamic cache grows a key per step and never does, so it is
    never prepared for nothing). A prefill, anything traced, and anything not preparable
    run the general call."""
    import torch

    from ..frontend.attention import attention
    from ..runtime.prepared import cheap_signature
    if query.shape[2] > _PREPARED_MAX_QUERIES or _tracing():
        # eager prefill (no gradient): the kernel writes the (B, S, Hq, D) layout the
        # caller returns (a transposed view), so no copy follows (1 ms of a Llama-1B
        # 8192 prefill)
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        out = None if _tracing() or sinks is not None or grad else query.new_empty(
            query.shape[0], query.shape[2], query.shape[1], value.shape[3]).transpose(1, 2)
        return attention(query, key, value, buffers=bufs, kv_lens=kv_lens, sinks=sinks,
                         out=out, **_keywords(what, kv_lens))
    tensors = (query, key, value, *(bufs or {}).values(), *(() if kv_lens is None
                                                            else (kv_lens,)))
    table = module.__dict__.setdefault("_nf_prepared", {})
    sig = (what, tuple(bufs or ()), sinks is not None, cheap_signature(tensors))
    prepared = table.get(sig)
    if prepared is None:
        first = sig not in table and kv_lens is None
        if not first:   # the mods and keywords are built only here, once per signature
            from ..frontend.prepared import prepare_attention
            try:
                prepared = prepare_attention(query, key, value, buffers=bufs,
                                             kv_lens=kv_lens, sinks=sinks,
                                             **_keywords(what, kv_lens))
            except FeedError:   # not preparable (a strided view): the general call always
                prepared = False
        if sig not in table and len(table) >= _PREPARED_PER_LAYER:
            table.pop(next(iter(table)))
        table[sig] = prepared   # None: seen once
    if not prepared:
        return attention(query, key, value, buffers=bufs, kv_lens=kv_lens, sinks=sinks,
                         **_keywords(what, kv_lens))
    return prepared(query, key, value, bufs, kv_lens, sinks=sinks)


def _keywords(what: tuple, kv_lens) -> dict:
    """``nf.attention``'s keywords for a layer's ``what`` (see :func:`_attend`)."""
    causal, window, shift, padded, cap, sinks, scale, gqa = what
    return dict(scale=scale, enable_gqa=gqa,
                mask_mod=_mask_mod(causal, window, shift, padded)
                if (causal or shift or padded) else None,
                score_mod=_score_mod(cap, sinks) if (cap is not None or sinks) else None,
                q_offset="end" if kv_lens is None else None)


def register() -> None:
    """Register ``"neptune_fusion"`` with transformers' attention and mask interfaces.

    Then ``AutoModelForCausalLM.from_config(cfg, attn_implementation="neptune_fusion")``
    and ``model.set_attn_implementation("neptune_fusion")`` work. Idempotent."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as err:
        raise NeptuneError("neptune_fusion.integrations.transformers needs transformers with "
                           "AttentionInterface and AttentionMaskInterface (>= 4.56); "
                           "pip install 'neptune-fusion[transformers]'") from err
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, mask_structure)
