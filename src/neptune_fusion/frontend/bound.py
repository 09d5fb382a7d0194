"""Eager calls bound once per call signature: the lean eager ``nf.attention``.

:class:`BoundCalls` (one per :class:`~.attention.AttentionCache`) turns a repeated eager
decode call into a prepared launch (:class:`~neptune_fusion.runtime.prepared.
PreparedLaunch`, as ``nf.prepare_attention`` makes) with a fresh output per call; see
docs/serving.md, "The lean eager call".
"""

from __future__ import annotations

from ..errors import NeptuneError
from ..runtime.inputs import plain_types, remember, wants_grad
from ..runtime.prepared import PreparedLaunch
from . import kv
from .mods import guard

# a call with an ``out`` tensor is bound up to this many queries (its result is then copied
# into ``out``: cheap for a decode step; a prefill writes ``out`` through the general path)
BOUND_MAX_QUERIES = 16
BOUND_SIGNATURES = 64    # bound calls kept per attention cache (oldest dropped first)
_SEEN, _NEVER = "seen", "never"   # table entries besides bound calls: seen once; not bound


class BoundCalls:
    """Eager :func:`~.attention.attention` calls bound once per call signature (the lean
    eager call, issue 16/17; decode steps first, prefills too since 2026-12-04): an
    :class:`~neptune_fusion.frontend.attention.AttentionCache` holds one (bounded; no
    global state).

    The key is the call's keywords -- the mods by their guards (what their traces depend
    on, :func:`~.mods.guard`; a mod without one is never bound), scale, GQA, offset,
    buffer names, schedule, which of ``kv_lens``/``block_table`` are given -- and the
    inputs' signature (:func:`~neptune_fusion.runtime.prepared.signed`). A key seen the
    second time is bound (a decode loop whose cache grows by one key per step never
    repeats a signature: it pays one lookup, never a binding); from then on a call with
    that key launches the bound kernels with a fresh output (one ``torch.empty``, never
    aliasing an earlier result) and the shared split-k workspace, on the stream it was
    bound on (another stream: the general path). Everything else -- a tensor subclass,
    an ``out`` tensor with more than 16 queries (the general path writes it in place),
    inputs that require grad while grad mode is on (the key holds the grad mode: a
    binding made under ``no_grad``, where a module's parameters still require grad, serves
    only ``no_grad`` calls), a layout the kernel cannot read in place -- takes the
    general path, which checks and says what is wrong. Parameters are taken as tensors.

    A prefill is bound like a decode step: its general path spent 150-180 us of host
    time per call on the H200 host (2026-12-04: resolving the call, three host TMA
    descriptors through Triton's objects, the launch), as long as the head-dim-64 causal
    kernel at 4096 tokens runs (184 us), so ``do_bench`` (an L2 flush before each call)
    timed 0.215 ms where the GPU took 0.187.
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
             cache, schedule, kv_lens, block_table, resolve):
        """The output of a bound call of these arguments, or None (take the general
        path: not bindable, seen for the first time, or just bound). ``resolve``:
        :func:`~.attention._resolve` (passed in: attention.py imports this module)."""
        import torch

        from ..runtime.prepared import signed
        plain = plain_types()   # tensors and parameters
        if type(q) not in plain or type(k) not in plain or type(v) not in plain \
                or q.dim() != 4:
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
        if len(tensors) > 3 and any(type(t) not in plain for t in tensors):
            return None
        mods = (None if score_mod is None else guard(score_mod),
                None if mask_mod is None else guard(mask_mod))
        if (score_mod is not None and mods[0] is None) \
                or (mask_mod is not None and mods[1] is None):
            return None
        cuda = q.is_cuda
        sig, vals = signed(tensors, cuda)
        key = (mods, type(scale), scale, bool(enable_gqa), type(q_offset), q_offset, names,
               schedule, kv_lens is None, block_table is None, torch.is_grad_enabled(),
               *sig)   # a binding made under no_grad serves only no_grad calls
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
            got = _bind(resolve, tensors, q, k, v, score_mod, mask_mod, scale, enable_gqa,
                        q_offset, buffers, cache, schedule, kv_lens, block_table) or _NEVER
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


def _bind(resolve, tensors, q, k, v, score_mod, mask_mod, scale, enable_gqa, q_offset,
          buffers, cache, schedule, kv_lens, block_table):
    """``(fresh-output PreparedLaunch, packed, page size)`` for these arguments, or None
    where a bound call does not apply."""
    if wants_grad(tensors):
        return None   # the general path decides (differentiable, or refused)
    try:
        setup, ktens = resolve(q, k, v, score_mod, mask_mod, scale, enable_gqa, q_offset,
                               buffers, cache, schedule, kv_lens, block_table)
        if any(g.data_ptr() != t.data_ptr() for g, t in zip(tensors, ktens)):
            return None   # an input copied to be read (strided): not in place
        kern = setup.kernel
        kern = kern.kernel_for(*ktens) if hasattr(kern, "kernel_for") else kern
        return PreparedLaunch(kern, ktens, tensors, fresh=True), setup.packed, \
            setup.page_size
    except NeptuneError:
        return None
