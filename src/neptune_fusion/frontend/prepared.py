"""``nf.prepare_attention``: an attention call bound to one input signature (lean eager).

``prepared = nf.prepare_attention(q, k, v, **attention_keywords)`` does everything an
:func:`~.attention.attention` call derives from its inputs once -- checks, the mods'
traces, the kernel's choice (tuning a new shape class), the output and split-k workspace
allocation, the launch arguments -- and ``prepared(q, k, v)`` then only compares the
inputs' signature and launches the compiled kernels through their own launchers. It is
FlashInfer's plan/run split, for our kernels: a serving loop prepares once per batch shape
(with fixed-size caches and lengths on the device, one preparation serves every step).

The output tensor is allocated once and returned by every call, overwritten by the next
(copy it to keep it). Inputs whose signature differs (another shape, stride, dtype,
device or alignment, or an input that requires grad) take the general path,
:func:`~.attention.attention` with the same keywords: a new tensor, correct, slower.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..errors import FeedError
from ..runtime import torch_ops
from ..runtime.prepared import PreparedLaunch


class PreparedAttention:
    """``prepared(q, k, v, buffers=None, kv_lens=None, block_table=None)``: attention on
    inputs of the prepared signature (see the module docstring); ``buffers``, ``kv_lens``
    and ``block_table`` as given to :func:`prepare_attention` (with new values: a serving
    loop writes new lengths and pages into the same tensors, or passes others of the same
    signature)."""

    __slots__ = ("_launch", "_out", "_names", "_kv", "_general")

    def __init__(self, launch: PreparedLaunch, out, names: tuple[str, ...],
                 kv: tuple[bool, bool], general: Callable) -> None:
        self._launch, self._out, self._names, self._general = launch, out, names, general
        self._kv = kv

    def __call__(self, q, k, v, buffers: Mapping | None = None, kv_lens=None,
                 block_table=None):
        if torch_ops.compiling():   # traced: the op, as nf.attention is
            return self._general(q, k, v, buffers, kv_lens, block_table)
        if (kv_lens is not None, block_table is not None) != self._kv \
                or (self._names and buffers is None):   # the general path says what is off
            return self._general(q, k, v, buffers, kv_lens, block_table)
        tensors = [q, k, v]
        if self._names:
            tensors += [buffers[n] for n in self._names]
        if kv_lens is not None:
            tensors.append(kv_lens)
        if block_table is not None:
            tensors.append(block_table)
        if self._launch(tensors) is None:
            return self._general(q, k, v, buffers, kv_lens, block_table)
        return self._out

    @property
    def output(self):
        """The output tensor every matching call writes and returns."""
        return self._out


def prepare_attention(q, k, v, *, score_mod=None, mask_mod=None, scale=None,
                      enable_gqa: bool = False, q_offset=None, buffers=None, cache=None,
                      schedule=None, kv_lens=None, block_table=None) -> PreparedAttention:
    """Bind :func:`~.attention.attention` with these keywords to the signature of ``q``,
    ``k``, ``v`` (and ``buffers``): checks, tunes and allocates now; returns a
    :class:`PreparedAttention` whose calls only compare the signature and launch. CUDA
    tensors only, 16-byte aligned, last dimension contiguous; a
    :class:`~neptune_fusion.errors.FeedError` says which requirement failed."""
    from .attention import _resolve, attention
    kw = dict(score_mod=score_mod, mask_mod=mask_mod, scale=scale, enable_gqa=enable_gqa,
              q_offset=q_offset, cache=cache, schedule=schedule)
    setup, tensors = _resolve(q, k, v, score_mod, mask_mod, scale, enable_gqa, q_offset,
                              buffers, cache, schedule, kv_lens, block_table)
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
    if setup.packed:
        out = out.reshape(q.shape[0], q.shape[1], 1, v.shape[3])

    def general(q, k, v, buffers, kv_lens, block_table):
        return attention(q, k, v, buffers=buffers, kv_lens=kv_lens, block_table=block_table,
                         **kw)
    return PreparedAttention(launch, out, names, (kv_lens is not None,
                                                  block_table is not None), general)
