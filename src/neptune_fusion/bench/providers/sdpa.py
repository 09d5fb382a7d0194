"""``torch.nn.functional.scaled_dot_product_attention`` pinned to one backend.

* Causal prefill uses ``is_causal=True``. Decode needs no mask: the query sits at S - 1 and
  SDPA's ``is_causal`` would align the mask top-left (query 0 sees key 0 only), so it is
  not passed.
* ALiBi and the sliding window become a dense additive bias of the input dtype, shape
  (1, H, Sq, S) (ALiBi) or (1, 1, Sq, S) (mask only), built in ``prepare``; backends that
  take no bias report unsupported.
* SDPA cannot express a soft-cap: unsupported.
* GQA: ``enable_gqa=True`` first; if the backend rejects it, K and V are repeated to the
  query heads in ``prepare`` (outside the timed call) and the record's note says so.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ...ops import OpSpec
from ..reference import dense_bias
from .base import NO_KERNEL_MARKERS, Prepared, Provider, RunContext, Unsupported


def _is_no_kernel(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in NO_KERNEL_MARKERS)


def _why(exc: BaseException, caught: list[warnings.WarningMessage]) -> str:
    """SDPA says why a backend was skipped in warnings; keep the first useful one."""
    for w in caught:
        text = str(w.message).strip()
        if "not used because" in text or "requires" in text or "support" in text:
            return text.splitlines()[0]
    return str(exc).splitlines()[0]


def _attempt(call: Callable[[], torch.Tensor]) -> tuple[torch.Tensor | None, str]:
    """Run ``call`` once; (output, "") on success, (None, reason) when no kernel applies."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return call(), ""
        except RuntimeError as exc:
            if not _is_no_kernel(exc):
                raise
            return None, _why(exc, caught)


def _make(backend: SDPBackend) -> Callable[..., Prepared | Unsupported]:
    def prepare(op: OpSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                ctx: RunContext) -> Prepared | Unsupported:
        if op.softcap is not None:
            return Unsupported("SDPA cannot express a soft-cap")
        seq = k.shape[2]
        bias = dense_bias(op, seq, dtype=q.dtype, device=q.device) if (
            op.alibi or op.window is not None) else None
        causal = bias is None and op.needs_mask(seq)
        notes = []
        if bias is not None:
            notes.append(f"dense additive bias {tuple(bias.shape)}")

        def run(kk: torch.Tensor, vv: torch.Tensor, gqa: bool) -> Callable[[], torch.Tensor]:
            def fn() -> torch.Tensor:
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(
                        q, kk, vv, attn_mask=bias, is_causal=causal, scale=op.scale,
                        enable_gqa=gqa)
            return fn

        fn = run(k, v, op.group > 1)
        out, reason = _attempt(fn)
        if out is None and op.group > 1:
            kk = k.repeat_interleave(op.group, dim=1)
            vv = v.repeat_interleave(op.group, dim=1)
            fn = run(kk, vv, False)
            out, reason2 = _attempt(fn)
            if out is not None:
                notes.append(f"GQA by repeated kv heads (enable_gqa rejected: {reason})")
            reason = reason2
        elif op.group > 1:
            notes.append("GQA via enable_gqa=True")
        if out is None:
            return Unsupported(f"{backend.name}: {reason}")
        return Prepared(fn, "; ".join(notes))

    return prepare


FLASH = Provider("sdpa-flash", "SDPA flash", "library",
                 "SDPA with SDPBackend.FLASH_ATTENTION (FlashAttention-2)",
                 _make(SDPBackend.FLASH_ATTENTION))
CUDNN = Provider("sdpa-cudnn", "SDPA cuDNN", "library",
                 "SDPA with SDPBackend.CUDNN_ATTENTION", _make(SDPBackend.CUDNN_ATTENTION))
EFFICIENT = Provider("sdpa-efficient", "SDPA mem-eff", "library",
                     "SDPA with SDPBackend.EFFICIENT_ATTENTION (takes an additive bias)",
                     _make(SDPBackend.EFFICIENT_ATTENTION))
