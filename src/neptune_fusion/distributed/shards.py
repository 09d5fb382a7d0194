"""What :func:`sharded_decode` and :func:`ring_attention` share: checking the tensors,
each rank's signature, the local attention of one chunk with absolute positions."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import DistributedError
from .group import dtype_code, dtype_name
from .positions import hidden, shifted_kwargs

# the leading fields of an attention signature: equal on every rank
FIELDS = ("batch size", "query heads", "head dim", "key/value heads", "value head dim",
          "q dtype", "k dtype", "v dtype", "q_offset")
NAMES = {"q dtype": dtype_name, "k dtype": dtype_name, "v dtype": dtype_name,
         "q_offset": lambda x: "'end'" if x == _END else ("None" if x == _NONE else x)}
_END, _NONE = -(2 ** 62), -(2 ** 62) + 1   # q_offset "end" / None in a signature


def check_local(what: str, **tensors) -> None:
    """4-d torch tensors, before anything is gathered (a signature needs their shapes)."""
    import torch
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = (f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor)
                   else type(t).__name__)
            raise DistributedError(f"{what}: {name} must be a 4-d torch tensor (B, H, S, D), "
                                   f"got {got}")


def offset_code(q_offset, what: str) -> int:
    if q_offset is None:
        return _NONE
    if isinstance(q_offset, str) and q_offset == "end":
        return _END
    if not isinstance(q_offset, int) or isinstance(q_offset, bool):
        raise DistributedError(f"{what}: q_offset must be an int, 'end' or None, got "
                               f"{q_offset!r}")
    return q_offset


def signature(q, k, v, kwargs: Mapping, what: str) -> list[int]:
    """The fields every rank must agree on (:data:`FIELDS`)."""
    return [q.shape[0], q.shape[1], q.shape[3], k.shape[1], v.shape[3], dtype_code(q.dtype),
            dtype_code(k.dtype), dtype_code(v.dtype),
            offset_code(kwargs.get("q_offset"), what)]


def chunk(q, k, v, q0: int, k0: int, kwargs: Mapping, what: str):
    """``(o, lse)`` of local queries (absolute start ``q0``) over keys starting at ``k0``;
    ``None`` when the mask hides the whole chunk (or it is empty): nothing is computed."""
    from ..frontend.attention import attention
    dtype = str(q.dtype).removeprefix("torch.")
    if hidden(kwargs.get("mask_mod"), q0, q.shape[2], k0, k.shape[2], dtype, q.shape[1],
              kwargs.get("buffers")):
        return None
    kw = shifted_kwargs(kwargs, q0, k0, q.device, what)
    return attention(q, k, v, return_lse=True, **kw)


def empty_state(q, v):
    """The state of no key: o = 0 (q's dtype), lse = -inf."""
    import torch
    b, h, n = q.shape[:3]
    o = torch.zeros((b, h, n, v.shape[3]), dtype=q.dtype, device=q.device)
    return o, torch.full((b, h, n), -float("inf"), dtype=torch.float32, device=q.device)


def reject(kwargs: Mapping, what: str) -> None:
    if "return_lse" in kwargs:
        raise DistributedError(f"{what}: pass return_lse as {what}'s own keyword")
