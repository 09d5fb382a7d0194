"""Shared fixtures: a fresh, seeded random generator per test; golden files."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Kernels and tuned schedules go to a per-run directory, never the user's cache."""
    old = os.environ.get("NEPTUNE_FUSION_CACHE_DIR")
    os.environ["NEPTUNE_FUSION_CACHE_DIR"] = str(tmp_path_factory.mktemp("nf-cache"))
    yield
    if old is None:
        os.environ.pop("NEPTUNE_FUSION_CACHE_DIR", None)
    else:
        os.environ["NEPTUNE_FUSION_CACHE_DIR"] = old


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator seeded from the test's name: fresh data per test, reproducible runs."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


GOLDEN = Path(__file__).resolve().parent / "golden"


def pytest_addoption(parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite the golden files under tests/golden from current output")


@pytest.fixture
def golden(request):
    """``golden(name, text)``: compare ``text`` with tests/golden/<name> (or rewrite it
    under ``--update-golden``)."""
    update = request.config.getoption("--update-golden")

    def check(name: str, text: str) -> None:
        path = GOLDEN / name
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        assert path.exists(), f"no golden file {path}; run pytest --update-golden"
        want = path.read_text()
        assert text == want, (f"{name} differs from its golden file; inspect the diff and "
                              "run pytest --update-golden if the change is intended")
    return check
