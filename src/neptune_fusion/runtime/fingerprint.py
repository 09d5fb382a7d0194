"""The program fingerprint: the key under which the disk cache finds a definition.

Both the tuned schedules (:mod:`.auto`) and the stored kernel specs (the pipeline's
:class:`~neptune_fusion.runtime.pipeline.Builder`) are keyed by it, so it must be stable
across processes: it hashes the printed program, which names tensors and sizes but prints
constants rounded, plus every constant's exact ``repr``.
"""

from __future__ import annotations

import hashlib


def fingerprint(outputs) -> str:
    """A stable hash of the program: its printed form plus every constant exactly."""
    from ..ir.graph import tensors_in_order
    from ..ir.nodes import Compute, Const
    from ..ir.printer import program_str
    from ..ir.traverse import walk
    h = hashlib.sha256(program_str(list(outputs)).encode())
    for t in tensors_in_order(list(outputs)):
        if isinstance(t, Compute):
            for node in walk(t.body):
                if isinstance(node, Const):
                    h.update(repr(node.value).encode() + b";")
    return h.hexdigest()[:32]
