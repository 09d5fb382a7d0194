"""Context parallelism over torch.distributed: attention and reduction chains whose
reduction axis is split across the ranks of a process group (docs/distributed.md).

* :func:`sharded_decode`: a KV cache split by position across ranks, the same queries on
  every rank; one all_gather of the small partial states.
* :func:`ring_attention`: sequence-parallel prefill; key/value chunks travel the ring,
  overlapped with the compute of the current chunk.
* :func:`all_merge`: the derived merge of any compiled chain's partial states.

Communication is torch.distributed's (gloo on CPU, NCCL on GPUs); nothing of our own.
"""

from __future__ import annotations

from ..errors import DistributedError
from .decode import sharded_decode
from .merge import all_merge
from .ring import layout_segments, ring_attention, shard
from .states import as_partial, merge_stacked, merge_states

__all__ = ["DistributedError", "all_merge", "as_partial", "layout_segments", "merge_stacked",
           "merge_states", "ring_attention", "shard", "sharded_decode"]
