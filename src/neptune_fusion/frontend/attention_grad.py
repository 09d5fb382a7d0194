"""``nf.attention`` under autograd: a :class:`torch.autograd.Function` whose backward runs
kernels compiled from the derived backward programs (:mod:`..autodiff.attention`).

The forward runs the forward kernel with ``return_lse``; saved for the backward are
``q, k, v``, the output ``o`` and the row log-sum-exp ``lse`` (float32, B x H x N):
O(B * H * N) beyond the inputs and output, never an N x M tensor.

With ``return_lse=True`` the row log-sum-exp is a second differentiable output. Its
cotangent needs no kernel of its own: ``d lse_i / d s_ij = p_ij``, so it adds
``d_lse_i p_ij`` to FlashAttention-2's ``dS_ij = p_ij (dP_ij - delta_i)``, which is the
same expression with ``delta_i - d_lse_i`` in place of ``delta_i`` (the derived kernels
read ``delta`` as an input). This is what a merge of partial states needs (attention
sinks, ring attention): their gradient reaches ``o`` and ``lse``. The backward kernel is
derived from the forward kernel's own definition and compiled with ``nf.compile`` once
per forward kernel (kept by the :class:`~.attention.AttentionCache`). The buffers (ALiBi
slopes, ...) get no gradient; one that requires grad is refused up front.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..autodiff.attention import attention_backward
from ..errors import DerivativeError, FeedError

INF = float("inf")
_MAX_SIGNATURES = 64   # input signatures whose backward ran once in sequence, per kernel


class BackwardKernels:
    """The compiled backward, as FlashAttention-2 splits it: ``delta = rowsum(d_o * o)``
    once (its own operator), then one operator for ``d_q`` (rows of queries, a loop over
    the keys) and one for ``d_k, d_v`` (rows of keys, a loop over the queries), both
    reading ``delta``; each is whatever plan ``nf.compile`` picks. Called with
    ``q, k, v, o, d_o, lse, *buffers``. (Compiled together, the planner puts the three in
    one staged pass whose key programs each copy d_q again.) ``delta`` None: the
    gradient programs compute it themselves (from ``o``; the d_k, d_v one per query tile
    in every key block).

    On a GPU, ``d_q`` runs on a second stream beside ``d_k, d_v`` (the GPU fills the
    programs of one with the other's: 4 % less backward time for PF-Causal at S = 4096
    on the H200, as FlexAttention's single backward kernel does), except at the first
    call of an input signature, which tunes the kernels -- each measured alone -- and
    inside CUDA graph capture.

    An input the output does not depend on (``q`` and ``k`` under ``scale=0`` or a
    score_mod that drops the score) has no kernel: ``dq`` None, a None in ``dkv``'s
    results, and the call returns None in its place (a zero gradient)."""

    def __init__(self, dq, dkv, delta=None) -> None:
        self.dq, self.dkv, self.delta = dq, dkv, delta
        self._tuned: dict = {}    # input signatures run once in sequence (bounded)
        self._side: dict = {}     # device -> the stream d_q runs on

    def __call__(self, q, k, v, o, d_o, lse, *bufs, d_lse=None):
        """``d_lse``: the cotangent of the row log-sum-exp, or None (module docstring).
        ``(dq, dk, dv)``, None for an input without a gradient kernel."""
        if self.delta is None:
            # the log-sum-exp's cotangent reaches q and k through the scores only (which
            # read k only in q . k): without d_q there is no d_k either, and d_v reads p
            if d_lse is not None and self.dq is not None:
                raise DerivativeError("attention: the gradient of the log-sum-exp needs "
                                      "delta = rowsum(d_o * o) as its own operator, and "
                                      "this definition's backward computes it inside")
            tensors = (q, k, v, o, d_o, lse, *bufs)
        else:
            [delta] = self.delta(o, d_o)
            if d_lse is not None:
                delta = delta - d_lse.reshape(delta.shape).to(delta.dtype)
            tensors = (q, k, v, d_o, lse, delta, *bufs)
        if self.dq is None:
            return (None, *self.dkv(*tensors))
        if self._concurrent(tensors):
            return self._two_streams(tensors)
        [dq] = self.dq(*tensors)
        dk, dv = self.dkv(*tensors)
        return dq, dk, dv

    def _concurrent(self, tensors) -> bool:
        """Whether to run ``d_q`` on the side stream: CUDA, not capturing, and a signature
        already run (so tuned) in sequence."""
        import torch
        if tensors[0].device.type != "cuda" or torch.cuda.is_current_stream_capturing():
            return False
        from ..runtime.inputs import remember, signature
        sig = signature(tensors)
        if sig is None or sig in self._tuned:
            return sig is not None
        remember(self._tuned, sig, True, _MAX_SIGNATURES)
        return False

    def _two_streams(self, tensors):
        import torch
        device = tensors[0].device
        main = torch.cuda.current_stream(device)
        side = self._side.get(device)
        if side is None:
            side = self._side[device] = torch.cuda.Stream(device)
        side.wait_stream(main)       # d_q reads what main computed (delta, d_o)
        with torch.cuda.stream(side):
            [dq] = self.dq(*tensors)
        dk, dv = self.dkv(*tensors)
        main.wait_stream(side)
        dq.record_stream(main)       # allocated on the side stream, used on main
        return dq, dk, dv


def build_backward(kernel, store):
    """``(backward kernels, group)`` for a forward attention kernel (outputs ``[o, lse]``):
    the derived programs compiled (any plan the compiler picks)."""
    from ..runtime.pipeline import compile as nf_compile
    bw = attention_backward(list(kernel.outputs), list(kernel.inputs))
    outs, group = bw.kernel_outputs()
    ins, delta = list(bw.inputs), None
    saved = bw.with_saved_delta(outs)
    if saved is not None:
        outs, ins = saved.outputs, list(saved.inputs)
        delta = nf_compile([saved.delta], [bw.inputs[3], bw.inputs[4]],
                           name="attention_backward_delta", cache=store)
    # d_k, d_v is compiled for its lengths' class (static_sizes): 12 % faster on the
    # H200 at S = 4096; d_q was 2 % slower so (docs/autodiff.md)
    # an input the output does not depend on (None) gets no kernel: a zero gradient
    dq = None if outs[0] is None else nf_compile(outs[:1], ins, name="attention_backward_dq",
                                                 cache=store)
    q, v = kernel.inputs[0], kernel.inputs[2]
    if q.shape[-1] == v.shape[-1] and None not in outs[1:]:
        dkv = nf_compile(outs[1:], ins, name="attention_backward_dkdv", cache=store,
                         static_sizes=True)
    else:   # one rolling kernel holds one column axis (d_k's and d_v's widths differ),
        # or one of them has no kernel
        dkv = _Apart([None if o is None else
                      nf_compile([o], ins, name=f"attention_backward_{n}", cache=store,
                                 static_sizes=True)
                      for o, n in zip(outs[1:], ("dk", "dv"))])
    return BackwardKernels(dq, dkv, delta), group


class _Apart:
    """``d_k`` and ``d_v`` as two operators, called as one: where the value head dim
    differs from the query/key one (each recomputes the probabilities), or where one of
    them has no kernel (None: it gives None, a zero gradient)."""

    def __init__(self, kernels) -> None:
        self.kernels = kernels

    def __call__(self, *tensors):
        out = []
        for k in self.kernels:
            if k is None:
                out.append(None)
                continue
            got = k(*tensors)
            out.append(got[0] if isinstance(got, (list, tuple)) else got)
        return out


def check_buffers(bufs: dict) -> None:
    for name, t in bufs.items():
        if getattr(t, "requires_grad", False):
            raise FeedError(f"attention: buffer {name!r} requires grad, but buffers get no "
                            f"gradient (only q, k and v do); pass {name}.detach()")


@functools.cache
def _function():
    """The Function class, made once on first use (torch is imported lazily)."""
    import torch

    class AttentionFunction(torch.autograd.Function):
        """``o = attention(q, k, v)`` (and its row log-sum-exp with ``with_lse``);
        backward: the derived programs' kernels."""

        @staticmethod
        def forward(ctx, run: Callable, backward: Callable, names, with_lse: bool, q, k, v,
                    *bufs):
            o, lse, kernel, tensors = run(q, k, v, dict(zip(names, bufs)))
            # tensors: the kernel's inputs, q, k, v, the buffers (and kv_lens, not an
            # input of this Function: the caller's ``run`` holds it)
            ctx.save_for_backward(*tensors, o, lse)
            ctx.kernel, ctx.backward, ctx.shapes = kernel, backward, (q.shape, k.shape,
                                                                     v.shape)
            ctx.n_bufs = len(bufs)
            ctx.set_materialize_grads(False)   # an unused output's cotangent stays None
            out = o.reshape(q.shape[0], q.shape[1], q.shape[2], v.shape[3])
            if not with_lse:
                return out
            row_lse = lse.reshape(q.shape[0], q.shape[1], q.shape[2])
            return out, row_lse

        @staticmethod
        def backward(ctx, d_out, d_lse=None):
            *tensors, o, lse = ctx.saved_tensors
            if d_out is None and d_lse is None:
                return (None,) * (7 + ctx.n_bufs)
            out = grads(ctx.backward(ctx.kernel), tensors, o, lse, d_out, d_lse, ctx.shapes)
            return (None, None, None, None, *out, *([None] * ctx.n_bufs))

    return AttentionFunction


def grads(backward, tensors, o, lse, d_out, d_lse, shapes) -> list:
    """``[dq, dk, dv]`` (shaped as ``shapes``, the caller's q, k, v) from the forward's
    saved state: ``backward`` is ``(backward kernel, group)`` of the forward kernel,
    ``tensors`` that kernel's inputs (q as the kernel took it, k, v, the buffers,
    ``kv_lens``), ``o`` and ``lse`` its outputs as it wrote them; ``d_out`` or ``d_lse``
    may be None (that output's cotangent is zero)."""
    import torch
    kern, group = backward
    qin, k, v, *bufs = tensors
    d_o = torch.zeros_like(o) if d_out is None else \
        d_out.reshape(o.shape).to(o.dtype).contiguous()
    # a row with no key (lse = -inf) recomputes p = exp(s - inf) = 0: no gradient
    lse = lse.masked_fill(lse == -INF, INF)
    got = kern(qin, k, v, o, d_o, lse, *bufs, d_lse=d_lse)
    out = []
    for n, (g, t, shape) in enumerate(zip(got, (qin, k, v), shapes)):
        if g is None:   # the output does not depend on it: zero, as autograd gives
            g = t.new_zeros(shape)
        elif group > 1 and n > 0:   # GQA: the group's query heads' sum into k, v
            g = g.reshape(shape[0], shape[1], group, *shape[2:]).sum(2)
        out.append(g.reshape(shape))
    return out


def apply(run: Callable, backward: Callable, q, k, v, bufs: dict, with_lse: bool = False):
    """``o`` (``(o, lse)`` with ``with_lse``) with a ``grad_fn``. ``run(q, k, v, bufs) ->
    (o, lse, kernel, tensors)`` is the forward (``tensors``: the forward kernel's inputs);
    ``backward(kernel)`` gives ``(backward kernel, group)``."""
    check_buffers(bufs)
    return _function().apply(run, backward, tuple(bufs), with_lse, q, k, v, *bufs.values())
