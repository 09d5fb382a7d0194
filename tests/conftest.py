"""Shared fixtures: a fresh, seeded random generator per test (and torch's global one
seeded per test); golden files."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import settings

# CI draws the same examples every run (a random example that sends SymPy into a long
# simplification must not make one CI run slow and the next fast); a developer's runs
# stay random, and NF_HYPO raises the example count of the random-chain tests.
settings.register_profile("ci", derandomize=True, print_blob=True)
if __import__("os").environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Kernels and tuned schedules go to a per-run directory, never the user's cache; the
    checks between passes are on."""
    mp = pytest.MonkeyPatch()
    mp.setenv("NEPTUNE_FUSION_CACHE_DIR", str(tmp_path_factory.mktemp("nf-cache")))
    mp.setenv("NEPTUNE_FUSION_VERIFY", "1")  # invariants checked between passes
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def _seeded_torch(request):
    """torch's global generator seeded from the test's name: a test that draws from it
    sees the same data whatever ran before it (CI runs the suite in another order and
    with other plugins than a developer's subset)."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


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
