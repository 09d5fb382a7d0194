"""Attention's backward programs, derived from its forward definition.

The forward (``frontend/attention.py``, any score_mod / mask_mod, GQA) is a plain
program ``s, m, p, l, o`` plus the row log-sum-exp ``lse`` its kernel already writes.
Here: :func:`~.softmax.use_saved_lse` recomputes ``p = exp(s - lse)`` instead of the
max and sum, reverse mode (:func:`~.reverse.gradients`) differentiates ``o`` with the
cotangent ``d_o``, and the simplifier with the saved output ``o`` turns the log-sum-exp's
cotangent into ``delta = rowsum(d_o * o)``. The result, for every mod::

    d_p[b, h, i, j] = sum(d_o[b, h, i, e] * v[b, h // G, j, e], e)
    d_s[b, h, i, j] = (d_p[b, h, i, j] - delta[b, h, i]) * p[b, h, i, j]
    d_q[b, h, i, c] = sum(<d_s through the score_mod> * k[b, h // G, j, c] * scale, j)
    d_k[b, hk, j, c] = sum(<d_s through the score_mod> * q[b, hk * G + g, i, c] * scale,
                           (g, i))
    d_v[b, hk, j, e] = sum(p[b, hk * G + g, i, j] * d_o[b, hk * G + g, i, e], (g, i))

The score_mod's derivative is whatever reverse mode gives for its expression (soft-cap:
``1 - tanh^2``; ALiBi: 1; a mask: 0 where masked). The buffers get no gradient. An input
the output does not depend on (``q`` and ``k`` when the score ignores them: ``scale=0``,
a constant or key-position-only score_mod) has no gradient program (None): its gradient
is zero, as autograd gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import DerivativeError
from ..ir.fold import is_const
from ..ir.graph import tensors_in_order
from ..ir.nodes import (
    Binary,
    Cast,
    Compute,
    Expr,
    Load,
    Placeholder,
    Reduce,
    Tensor,
    fresh_uid,
)
from ..ir.traverse import rewrite, walk
from .masks import drop_implied_masks
from .reverse import gradients
from .softmax import lse_link, saved_output_rule, use_saved_lse


@dataclass(frozen=True, eq=False)
class AttentionBackward:
    """The gradient programs ``d_q, d_k, d_v`` over ``inputs`` (``q, k, v, o, d_o, lse``
    and the buffers), None for an input the output does not depend on (a zero
    gradient); ``s``, ``p``: the recomputed scores and probabilities."""

    grads: tuple[Compute | None, Compute | None, Compute | None]
    inputs: tuple[Placeholder, ...]
    s: Compute
    p: Compute

    def kernel_outputs(self) -> tuple[list[Compute], int]:
        """``(outputs, group)``: what a kernel computes -- ``d_q`` and, under GQA, the
        per-query-head ``d_k_h, d_v_h`` (their group sum, ``d_k[b, hk] = sum_g
        d_k_h[b, hk * G + g]``, is left to the caller: an index mixing a head and a
        reduce axis is not lowered yet) -- and the group size ``G``; None where
        :attr:`grads` has None."""
        out, group = [self.grads[0]], 1
        for g in self.grads[1:]:
            if g is None:
                out.append(None)
                continue
            body = g.body.x if isinstance(g.body, Cast) else g.body
            if isinstance(body, Reduce) and len(body.axes) == 1 \
                    and isinstance(body.body, Load) and isinstance(body.body.tensor, Compute):
                out.append(body.body.tensor)
                group = body.axes[0].extent
            else:
                out.append(g)
        return out, group

    def with_saved_delta(self, outputs: Sequence[Compute]) -> SavedDelta | None:
        """FlashAttention-2's preprocessing pass: ``delta[r] = sum_e(d_o[r, e] o[r, e])``
        as its own program, and ``outputs`` rewritten to read it as a placeholder
        ``delta`` instead of ``o`` -- else the d_k, d_v kernel (a loop over query tiles per
        key block) recomputes each query tile's delta, loading its ``o`` and ``d_o``
        again, in every key block. None when there is no such compute (exactly one, a
        sum reading ``d_o`` and ``o`` only) or something else reads ``o``. A None in
        ``outputs`` (no gradient) stays None."""
        q, k, v, saved_o, d_o, lse, *bufs = self.inputs
        order = tensors_in_order([o for o in outputs if o is not None])
        found = [t for t in order if isinstance(t, Compute) and isinstance(t.body, Reduce)
                 and t.body.op == "sum" and _reads(t.body) == {saved_o, d_o}]
        if len(found) != 1:
            return None
        delta = found[0]
        ph = Placeholder("delta", delta.shape, delta.dtype, fresh_uid())
        new: dict[Tensor, Tensor] = {delta: ph}

        def put(e: Expr) -> Expr | None:
            if isinstance(e, Load) and e.tensor in new:
                return Load(new[e.tensor], e.indices)
            return None
        for t in order:
            if isinstance(t, Compute) and t is not delta:
                body = rewrite(t.body, put)
                new[t] = t if body is t.body else Compute(t.name, t.shape, t.axes, body,
                                                          fresh_uid())
        outs = [None if o is None else new[o] for o in outputs]
        if any(isinstance(t, Compute) and saved_o in _reads(t.body)
               for t in tensors_in_order([o for o in outs if o is not None])):
            return None
        return SavedDelta(delta, outs, (q, k, v, d_o, lse, ph, *bufs))


@dataclass(frozen=True, eq=False)
class SavedDelta:
    """The gradient ``outputs`` reading ``delta`` (a program over ``o, d_o``) as an input
    (None where there is no gradient program): ``inputs`` is ``q, k, v, d_o, lse,
    delta`` and the buffers."""

    delta: Compute
    outputs: list[Compute | None]
    inputs: tuple[Placeholder, ...]


def _reads(e: Expr) -> set[Tensor]:
    return {n.tensor for n in walk(e) if isinstance(n, Load)}


def attention_backward(outputs: Sequence[Compute], inputs: Sequence[Placeholder]
                       ) -> AttentionBackward:
    """The backward of the attention forward ``outputs`` (``[o, lse]``) over ``inputs``
    (``[q, k, v, *buffers]``, as :func:`~..frontend.attention.attention_definition`
    returns them). A gradient the output does not depend on is None (zero: the score
    ignores ``q`` and ``k`` under ``scale=0`` or a score_mod that drops the score)."""
    if len(outputs) != 2 or len(inputs) < 3:
        raise DerivativeError("attention's backward needs the forward's outputs [o, lse] "
                              "and inputs [q, k, v, *buffers]")
    o_fwd, lse_fwd = outputs
    q, k, v, *bufs = inputs
    (o,), lse, s, p = use_saved_lse([o_fwd, lse_fwd], drop=[lse_fwd])
    saved_o = Placeholder("o", o_fwd.shape, o_fwd.dtype, fresh_uid())
    d_o = Placeholder("d_o", o_fwd.shape, o_fwd.dtype, fresh_uid())
    grads = gradients([o], [d_o], [q, k, v], links=[lse_link(lse, s, p)],
                      extra_rules=(saved_output_rule({o: saved_o}),))
    kept = iter(drop_implied_masks([g for g in grads if g is not None], lse))
    grads = tuple(None if g is None else next(kept) for g in grads)
    if q not in tensors_in_order([s]):   # the score ignores q and k: keep reading them
        grads, s, p = _reading_the_rows(grads, s, p, o_fwd, q)
    return AttentionBackward(grads, (q, k, v, saved_o, d_o, lse, *bufs), s, p)


def _reading_the_rows(grads, s: Compute, p: Compute, o_fwd: Compute, q: Placeholder):
    """``(grads, s, p)`` with the recomputed score ``s`` given back the forward's
    ``+ q.k * 0`` (a score that ignores ``q`` and ``k``: the fold of the saved
    log-sum-exp dropped it). As in the forward definition, the term makes every member
    depend on the rows and read an input of each size it uses -- ``p`` alone reads only
    ``lse``, which has no key length (``d_v``'s library form compiles ``p`` as its own
    kernel) -- and the code generator folds it away. After reverse mode: ``q`` and ``k``
    still get no gradient program."""
    fwd = next((t for t in tensors_in_order([o_fwd]) if isinstance(t, Compute)
                and t.name == s.name and t.axes == s.axes), None)
    terms = [] if fwd is None else [
        e for e in walk(fwd.body) if isinstance(e, Binary) and e.op == "mul"
        and is_const(e.b, 0.0) and isinstance(e.a, Reduce) and q in _reads(e.a)]
    if not terms:
        return grads, s, p
    body = Binary("add", s.body, terms[0])
    if body.dtype != s.dtype:
        body = Cast(body, s.dtype)
    new: dict[Tensor, Tensor] = {s: Compute(s.name, s.shape, s.axes, body, fresh_uid())}

    def put(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.tensor in new:
            return Load(new[e.tensor], e.indices)
        return None
    for t in tensors_in_order([g for g in grads if g is not None]):
        if isinstance(t, Compute) and t not in new:
            body = rewrite(t.body, put)
            if body is not t.body:
                new[t] = Compute(t.name, t.shape, t.axes, body, fresh_uid())
    return tuple(None if g is None else new.get(g, g) for g in grads), new[s], \
        new.get(p, p)
