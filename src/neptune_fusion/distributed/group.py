"""The process group's side of :mod:`neptune_fusion.distributed`: size and rank, and the
one small all_gather of a signature that lets every rank check every other rank.

A mismatch must be reported by *every* rank (a rank that raised alone would leave the
others waiting in the next collective), so checks run on the gathered signatures, which
all ranks hold alike, and raise the same :class:`~neptune_fusion.errors.DistributedError`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from ..errors import DistributedError

SLOTS = 32   # ints in the first gather; a longer signature costs a second one

DTYPES = ("float16", "bfloat16", "float32", "float64", "int32", "int64", "bool")


@dataclass(frozen=True)
class Ranks:
    """This process's place in ``group``: ``size`` ranks, this one is ``rank``."""

    group: object
    size: int
    rank: int

    def global_rank(self, r: int) -> int:
        """The global rank of group rank ``r`` (what point-to-point operations take)."""
        import torch.distributed as dist
        if self.group is None:
            return r
        return dist.get_global_rank(self.group, r)


def ranks(group, what: str) -> Ranks:
    """``group``'s size and this rank; a plain process (torch.distributed not initialised
    and no group given) is a group of one."""
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        if group is not None:
            raise DistributedError(f"{what}: group is given but torch.distributed is not "
                                   "initialised; call torch.distributed.init_process_group")
        return Ranks(None, 1, 0)
    return Ranks(group, dist.get_world_size(group), dist.get_rank(group))


def dtype_code(dtype) -> int:
    name = str(dtype).removeprefix("torch.")
    return DTYPES.index(name) if name in DTYPES else len(DTYPES)


def dtype_name(code: int) -> str:
    return DTYPES[code] if 0 <= code < len(DTYPES) else "another dtype"


def gather_ints(values: list[int], device, where: Ranks) -> list[list[int]]:
    """Every rank's ``values`` (a list of ints; lengths may differ), in rank order.

    One all_gather of :data:`SLOTS` int64s when every signature fits (length, CRC, the
    values); else a second one padded to the longest. A group of one communicates nothing.
    """
    if where.size == 1:
        return [list(values)]
    import torch
    raw = [int(x) for x in values]
    crc = zlib.crc32(",".join(map(str, raw)).encode())
    head = [len(raw), crc] + raw[:SLOTS - 2]
    mine = torch.zeros(SLOTS, dtype=torch.int64)
    mine[:len(head)] = torch.tensor(head, dtype=torch.int64)
    got = _all_gather(mine.to(device), where)
    rows = [r.tolist() for r in got]
    longest = max(r[0] for r in rows)
    if longest <= SLOTS - 2:
        return [r[2:2 + r[0]] for r in rows]
    full = torch.zeros(longest + 1, dtype=torch.int64)
    full[0] = len(raw)
    full[1:1 + len(raw)] = torch.tensor(raw, dtype=torch.int64)
    got = _all_gather(full.to(device), where)
    return [r.tolist()[1:1 + int(r[0])] for r in got]


def all_gather(t, where: Ranks) -> list:
    """Every rank's tensor ``t`` (equal shapes and dtypes: checked before), in rank order."""
    if where.size == 1:
        return [t]
    return _all_gather(t.contiguous(), where)


def all_gather_stacked(t, where: Ranks):
    """Every rank's ``t`` stacked, ``(size, *t.shape)``: one all_gather into one flat
    tensor (gloo and NCCL both take the flat form)."""
    if where.size == 1:
        return t.unsqueeze(0)
    import torch
    import torch.distributed as dist
    t = t.contiguous()
    out = torch.empty(where.size * t.numel(), dtype=t.dtype, device=t.device)
    dist.all_gather_into_tensor(out, t.reshape(-1), group=where.group)
    return out.reshape(where.size, *t.shape)


def _all_gather(t, where: Ranks) -> list:
    import torch
    import torch.distributed as dist
    out = [torch.empty_like(t) for _ in range(where.size)]
    dist.all_gather(out, t, group=where.group)
    return out


def agree(rows: list[list[int]], fields: tuple[str, ...], what: str,
          names: dict[str, object] | None = None) -> None:
    """Raise a :class:`DistributedError` naming the first of ``fields`` (the leading
    entries of each row) that differs between ranks. ``names`` turns a field's value into
    its name (e.g. a dtype code)."""
    names = names or {}
    for k, field in enumerate(fields):
        vals = [r[k] for r in rows]
        if any(v != vals[0] for v in vals):
            show = names.get(field, lambda x: x)
            bad = next(r for r, v in enumerate(vals) if v != vals[0])
            raise DistributedError(
                f"{what}: {field} differs across ranks: rank 0 has {show(vals[0])}, rank "
                f"{bad} has {show(vals[bad])}; every rank must pass the same {field}")
