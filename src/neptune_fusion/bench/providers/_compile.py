"""torch.compile settings shared by the compiled providers.

Every (operator, length) pair is a new specialisation of the same Python function, so the
default recompile limit (8) is hit within one run, after which Dynamo silently runs the
function eagerly: FlexAttention would then fall back to its unfused path and be timed as
such. The limits are raised and, where this torch has the switch, hitting them is an error.
"""

from __future__ import annotations

import torch

RECOMPILE_LIMIT = 1024
ACCUMULATED_LIMIT = 8192


def raise_recompile_limits() -> None:
    """Raise Dynamo's per-function and accumulated recompile limits (names vary by version)."""
    cfg = torch._dynamo.config
    for name, value in (("cache_size_limit", RECOMPILE_LIMIT),
                        ("recompile_limit", RECOMPILE_LIMIT),
                        ("accumulated_cache_size_limit", ACCUMULATED_LIMIT),
                        ("accumulated_recompile_limit", ACCUMULATED_LIMIT)):
        if hasattr(cfg, name) and getattr(cfg, name) < value:
            setattr(cfg, name, value)
    if hasattr(cfg, "fail_on_recompile_limit_hit"):
        cfg.fail_on_recompile_limit_hit = True
