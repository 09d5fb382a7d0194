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

from ..errors import FeedError, NeptuneError
from ..runtime import torch_ops
from ..runtime.inputs import remember
from ..runtime.prepared import PreparedLaunch
from . import kv
from .mods import guard


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


BOUND_MAX_QUERIES = 16   # decode and speculative steps are bound; a prefill is not
BOUND_SIGNATURES = 64    # bound calls kept per attention cache (oldest dropped first)
_SEEN, _NEVER = "seen", "never"   # table entries besides bound calls: seen once; not bound


class BoundCalls:
    """Eager :func:`~.attention.attention` decode calls bound once per call signature
    (the lean eager call, issue 16/17): an :class:`~neptune_fusion.frontend.attention.
    AttentionCache` holds one (bounded; no global state).

    The key is the call's keywords -- the mods by their guards (what their traces depend
    on, :func:`~.mods.guard`; a mod without one is never bound), scale, GQA, offset,
    buffer names, schedule, which of ``kv_lens``/``block_table`` are given -- and the
    inputs' signature (:func:`~neptune_fusion.runtime.prepared.signed`). A key seen the
    second time is bound (a decode loop whose cache grows by one key per step never
    repeats a signature: it pays one lookup, never a binding); from then on a call with
    that key launches the bound kernels with a fresh output (one ``torch.empty``, never
    aliasing an earlier result) and the shared split-k workspace, on the stream it was
    bound on (another stream: the general path). Everything else -- a tensor subclass,
    more than 16 queries, inputs that require grad, a layout the kernel cannot read in
    place -- takes the general path, which checks and says what is wrong.
    """

    def __init__(self) -> None:
        import threading
        self._table: dict = {}
        self._lock = threading.Lock()
        self.hits = 0    # calls that launched a bound call

    def __len__(self) -> int:
        return len(self._table)

    def clear(self) -> None:
        with self._lock:
            self._table.clear()
            self.hits = 0

    def call(self, q, k, v, score_mod, mask_mod, scale, enable_gqa, q_offset, buffers,
             cache, schedule, kv_lens, block_table):
        """The output of a bound call of these arguments, or None (take the general
        path: not bindable, seen for the first time, or just bound)."""
        import torch

        from ..runtime.prepared import signed
        tensor = torch.Tensor
        if type(q) is not tensor or type(k) is not tensor or type(v) is not tensor \
                or q.dim() != 4 or q.shape[2] > BOUND_MAX_QUERIES:
            return None
        if buffers is None:
            names, tensors = (), [q, k, v]
        elif type(buffers) is dict:
            names, tensors = tuple(buffers), [q, k, v, *buffers.values()]
        else:
            return None
        if kv_lens is not None:
            tensors.append(kv_lens)
        if block_table is not None:
            tensors.append(block_table)
        if len(tensors) > 3 and any(type(t) is not tensor for t in tensors):
            return None
        mods = (None if score_mod is None else guard(score_mod),
                None if mask_mod is None else guard(mask_mod))
        if (score_mod is not None and mods[0] is None) \
                or (mask_mod is not None and mods[1] is None):
            return None
        cuda = q.is_cuda
        sig, vals = signed(tensors, cuda)
        key = (mods, type(scale), scale, bool(enable_gqa), type(q_offset), q_offset, names,
               schedule, kv_lens is None, block_table is None, *sig)
        try:
            got = self._table.get(key)
        except TypeError:   # an unhashable argument: the general path reports it
            return None
        if got is None or got is _SEEN:
            if got is _SEEN and cuda and torch.cuda.is_current_stream_capturing():
                return None   # no workspace allocated inside a capture: bind later
            with self._lock:
                remember(self._table, key, _SEEN if got is None else _NEVER,
                         BOUND_SIGNATURES)
            if got is None:
                return None
            got = self._bind(tensors, q, k, v, score_mod, mask_mod, scale, enable_gqa,
                             q_offset, buffers, cache, schedule, kv_lens, block_table) \
                or _NEVER
            with self._lock:
                self._table[key] = got
        if got is _NEVER:
            return None
        launch, packed, page_size = got
        if (kv_lens is not None or block_table is not None) and \
                kv.wants_values_checked(q.device):   # as the general path checks them
            kv.check_values(k, kv_lens, block_table, page_size)
        outs = launch.launch(vals)
        if outs is None:
            return None
        self.hits += 1
        return outs[0].reshape(q.shape[0], q.shape[1], 1, v.shape[3]) if packed else outs[0]

    @staticmethod
    def _bind(tensors, q, k, v, score_mod, mask_mod, scale, enable_gqa, q_offset, buffers,
              cache, schedule, kv_lens, block_table):
        """``(fresh-output PreparedLaunch, packed, page size)`` for these arguments, or
        None where a bound call does not apply."""
        from .attention import _resolve
        if any(t.requires_grad for t in tensors):
            return None   # the general path decides (differentiable, or refused)
        try:
            setup, ktens = _resolve(q, k, v, score_mod, mask_mod, scale, enable_gqa,
                                    q_offset, buffers, cache, schedule, kv_lens, block_table)
            if any(g.data_ptr() != t.data_ptr() for g, t in zip(tensors, ktens)):
                return None   # an input copied to be read (strided): not in place
            kern = setup.kernel
            kern = kern.kernel_for(*ktens) if hasattr(kern, "kernel_for") else kern
            return PreparedLaunch(kern, ktens, tensors, fresh=True), setup.packed, \
                setup.page_size
        except NeptuneError:
            return None
