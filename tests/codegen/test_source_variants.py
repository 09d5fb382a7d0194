"""``benchmarks/source_variants.py`` edits generated attention source for measurements
(docs/hopper.md). The edits that keep the math -- launching row blocks in either order,
moving the masked loop first -- are run on the interpreter against float64; the others
are checked as text."""

from __future__ import annotations

import builtins
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from neptune_fusion.runtime import kernel as kernel_module
from neptune_fusion.runtime.pipeline import compile

from .test_tma import _attention, _reference


def _script():
    path = Path(__file__).parents[2] / "benchmarks" / "source_variants.py"
    spec = importlib.util.spec_from_file_location("source_variants", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_causal_kernels_launch_the_heaviest_row_blocks_first():
    o, ins = _attention(32, causal=True)
    assert _script().REVERSE in compile(o, ins, block_m=16, block_n=16).source
    o, ins = _attention(32, causal=False)
    assert _script().FORWARD in compile(o, ins, block_m=16, block_n=16).source


@pytest.mark.parametrize("form", ["light", "swap", "light+swap"])
def test_edits_that_keep_the_math_match_float64(form, monkeypatch):
    edit = _script().edit
    load = kernel_module.load_kernel_module
    seen = []

    def patched(src, name, interpret):
        seen.append(edit(src, form))
        return load(seen[-1], name, interpret)
    monkeypatch.setattr(kernel_module, "load_kernel_module", patched)
    o, ins = _attention(32, causal=True)
    k = compile(o, ins, block_m=16, block_n=16)
    gen = torch.Generator().manual_seed(11)
    xs = [torch.randn(45, 32, generator=gen) for _ in range(3)]
    got = k(*xs)
    assert seen and f"# form {form}" in seen[0]
    if "swap" in form:
        assert seen[0].index("# boundary tiles") < seen[0].index("# interior tiles")
    np.testing.assert_allclose(got.double().numpy(), _reference(o, xs), rtol=1e-4,
                               atol=1e-5)


def test_text_only_edits():
    script = _script()
    o, ins = _attention(32, causal=False)
    src = compile(o, ins, block_m=16, block_n=16, tma=True).source
    assert script.edit(src, "asis") == src
    ws = script.edit(src, "drop+ws")
    assert "# boundary tiles" not in ws and "warp_specialize=True)" in ws
    # the guard as nf.attention's kernels spell it (their state is named m)
    assert "m_run = m_new\n" in script.edit(f"        {script.GUARD}\n", "noguard")
    builtins.compile(ws, "<edited>", "exec")    # still Python
