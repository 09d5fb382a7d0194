"""Test set-up for the benchmark harness: Triton interpreter on CPU, src layout on the path.

TRITON_INTERPRET must be set before any Triton kernel is defined (Triton reads it when
``@triton.jit`` runs), i.e. before ``neptune_fusion.bench.providers.baseline_fa2`` is
imported. It is set only where there is no GPU, so GPU machines keep compiled kernels for
other tests.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

SRC = Path(__file__).resolve().parents[2] / "src"
if importlib.util.find_spec("neptune_fusion") is None:
    sys.path.insert(0, str(SRC))
