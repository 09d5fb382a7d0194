"""``nf.prepare_attention``: an attention call bound to one input signature (lean eager).

``prepared = nf.prepare_attention(q, k, v, **attention_keywords)`` does everything an
:func:`~.attention.attention` call derives from its inputs once -- checks, the mods'
traces, the kernel's choice (tuning a new shape class), the output and split-k workspace
allocation, the launch arguments -- and ``prepared(q, k, v)`` then only compares the
inputs' signature and launches the compiled kernels through their own launchers. It is
FlashInfer's plan/run split, for our kernels: a serving loop prepares once per batch shape
(with fixed-size caches and lengths on the device, one preparation serves every step).

The output tensor is allocated once and returned by every call, overwritten by the next
(copy it to keep it). With ``sinks=`` (attention sinks, :mod:`.sinks`) the kernel also
writes each row's log-sum-exp and the call merges the sinks into the output in place.
Inputs whose signature differs (another shape, stride, dtype, device or alignment, or an
input that requires grad) take the general path, :func:`~.attention.attention` with the
same keywords: a new tensor, correct, slower. The values of ``kv_lens`` and
``block_table`` are checked as the general path checks them (:mod:`.kv`, docs/serving.md
"Checks"): on CPU tensors every call, on CUDA ones only with ``NEPTUNE_FUSION_VALIDATE=1``
(a host sync per call). ``buffers`` must name exactly the prepared buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..errors import FeedError
from ..runtime import torch_ops
from ..runtime.inputs import plain_types
from ..runtime.prepared import PreparedLaunch, signed
from . import kv
from .sinks import check_sinks, merge_sinks_into


class PreparedAttention:
    """``prepared(q, k, v, buffers=None, kv_lens=None, block_table=None, sinks=None)``:
    attention on inputs of the prepared signature (see the module docstring);
    ``buffers``, ``kv_lens``, ``block_table`` and ``sinks`` as given to
    :func:`prepare_attention` (with new values: a serving loop writes new lengths and
    pages into the same tensors, or passes others of the same signature)."""

    __slots__ = ("_launch", "_out", "_names", "_kv", "_general", "_lse", "_page")

    def __init__(self, launch: PreparedLaunch, out, names: tuple[str, ...],
                 kv: tuple[bool, bool], general: Callable, lse=None,
                 page_size: int = 0) -> None:
        self._launch, self._out, self._names, self._general = launch, out, names, general
        self._kv, self._lse, self._page = kv, lse, page_size

    def __call__(self, q, k, v, buffers: Mapping | None = None, kv_lens=None,
                 block_table=None, sinks=None):
        if torch_ops.compiling():   # traced: the op, as nf.attention is
            return self._general(q, k, v, buffers, kv_lens, block_table, sinks)
        if (kv_lens is not None, block_table is not None) != self._kv \
                or (sinks is not None) != (self._lse is not None):
            return self._general(q, k, v, buffers, kv_lens, block_table, sinks)
        tensors = [q, k, v, *self._buffers(buffers)]
        if kv_lens is not None:
            tensors.append(kv_lens)
        if block_table is not None:
            tensors.append(block_table)
        plain = plain_types()
        if any(type(t) not in plain for t in tensors):   # the general path says what is off
            return self._general(q, k, v, buffers, kv_lens, block_table, sinks)
        sig, vals = signed(tensors, self._launch.cuda)
        if sig != self._launch.signature:
            return self._general(q, k, v, buffers, kv_lens, block_table, sinks)
        if (kv_lens is not None or block_table is not None) and \
                kv.wants_values_checked(q.device):   # as the general path checks them
            kv.check_values(k, kv_lens, block_table, self._page)
        if self._lse is not None:
            check_sinks(sinks, q)
        if self._launch.launch(vals) is None:
            return self._general(q, k, v, buffers, kv_lens, block_table, sinks)
        if self._lse is not None:
            return merge_sinks_into(self._out, self._lse, sinks)
        return self._out

    def _buffers(self, buffers) -> list:
        """The tensors of ``buffers`` in the prepared order; a :class:`FeedError` unless
        it maps exactly the prepared names (None: no buffers)."""
        if buffers is None:
            buffers = {}
        elif not isinstance(buffers, Mapping):
            raise FeedError(f"prepared attention: buffers must map names to tensors (a "
                            f"dict), got {type(buffers).__name__}")
        if len(buffers) != len(self._names) or any(n not in buffers for n in self._names):
            missing = [n for n in self._names if n not in buffers]
            extra = [n for n in buffers if n not in self._names]
            what = "; ".join(f"{label} {', '.join(map(repr, names))}" for label, names in
                             (("missing", missing), ("unexpected", extra)) if names)
            raise FeedError(f"prepared attention: buffers {what}: a prepared call takes "
                            f"the buffers it was prepared with "
                            f"({', '.join(map(repr, self._names)) or 'none'}), with new "
                            "values; prepare again for others")
        return [buffers[n] for n in self._names]

    @property
    def output(self):
        """The output tensor every matching call writes and returns."""
        return self._out

    @property
    def schedule(self):
        """The schedule of the kernel a matching call launches (the auto-scheduler's
        choice for this signature, or the one given)."""
        return self._launch.kernel.schedule


def prepare_attention(q, k, v, *, score_mod=None, mask_mod=None, scale=None,
                      enable_gqa: bool = False, q_offset=None, buffers=None, cache=None,
                      schedule=None, kv_lens=None, block_table=None,
                      sinks=None) -> PreparedAttention:
    """Bind :func:`~.attention.attention` with these keywords to the signature of ``q``,
    ``k``, ``v`` (and ``buffers``): checks, tunes and allocates now; returns a
    :class:`PreparedAttention` whose calls only compare the signature and launch. CUDA
    tensors only, 16-byte aligned, last dimension contiguous; a
    :class:`~neptune_fusion.errors.FeedError` says which requirement failed. ``sinks``:
    per-head sink logits (``(Hq,)``, as ``nf.attention``'s): the kernel writes each row's
    log-sum-exp too, and every call merges the sinks it is given into the output."""
    from .attention import _resolve, attention
    if sinks is not None:
        check_sinks(sinks, q)
    kw = dict(score_mod=score_mod, mask_mod=mask_mod, scale=scale, enable_gqa=enable_gqa,
              q_offset=q_offset, cache=cache, schedule=schedule)
    setup, tensors = _resolve(q, k, v, score_mod, mask_mod, scale, enable_gqa, q_offset,
                              buffers, cache, schedule, kv_lens, block_table,
                              lse=sinks is not None)
    names = tuple(buffers) if buffers else ()
    kvs = [(n, t) for n, t in (("kv_lens", kv_lens), ("block_table", block_table))
           if t is not None]
    given = [q, k, v, *(buffers[n] for n in names), *(t for _, t in kvs)]
    for name, g, t in zip(("q", "k", "v", *names, *(n for n, _ in kvs)), given, tensors):
        if g.data_ptr() != t.data_ptr():
            raise FeedError(f"prepare_attention: {name} {tuple(g.stride())} is not laid out "
                            "as the kernel reads it (its last dimension must be contiguous, "
                            "and a decode query must reshape to the KV heads as a view); "
                            "pass .contiguous()")
    kern = setup.kernel
    kern = kern.kernel_for(*tensors) if hasattr(kern, "kernel_for") else kern
    launch = PreparedLaunch(kern, tensors, given)
    out = launch.outputs[0]
    lse = launch.outputs[1] if sinks is not None else None
    if setup.packed:
        out = out.reshape(q.shape[0], q.shape[1], 1, v.shape[3])
        lse = None if lse is None else lse.reshape(q.shape[0], q.shape[1], 1)

    def general(q, k, v, buffers, kv_lens, block_table, sinks):
        return attention(q, k, v, buffers=buffers, kv_lens=kv_lens, block_table=block_table,
                         sinks=sinks, **kw)
    return PreparedAttention(launch, out, names, (kv_lens is not None,
                                                  block_table is not None), general, lse,
                             setup.page_size)
