"""A loop that loads through a table (a paged KV cache) under ``Schedule.gather_stages =
2 * num_stages - 1`` keeps as many tiles in flight as a loop of direct loads
(``codegen/source._loop_range``); the search space asks for it where one program per
multiprocessor runs (``schedule/space.gather_depth``). Checked where it matters, in what
Triton builds for an H200 (sm_90, compiled on the CPU: no GPU needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from neptune_fusion.frontend.attention import AttentionCache
from neptune_fusion.frontend.attention import attention as nf_attention
from neptune_fusion.schedule.schedule import Schedule

D, HQ, HKV, CAP = 128, 8, 2, 512
SPLIT = Schedule(block_m=16, block_n=128, num_warps=4, num_stages=3, strategy="split",
                 splits=2)
DEEP = replace(SPLIT, gather_stages=5)


def _partial_source(page: int, schedule: Schedule = SPLIT) -> str:
    """The split-k partial kernel of a one-query decode over a contiguous (page 0) or a
    paged cache, fp16, head dim 128, 128-key tiles, 3 stages."""
    g = torch.Generator().manual_seed(page)
    q = torch.randn(1, HQ, 1, D, generator=g, dtype=torch.float16)
    kl = torch.tensor([300], dtype=torch.int32)
    if page:
        pages = CAP // page
        k = torch.randn(pages, HKV, page, D, generator=g, dtype=torch.float16)
        table = torch.randperm(pages, generator=g).to(torch.int32).reshape(1, -1)
    else:
        k, table = torch.randn(1, HKV, CAP, D, generator=g, dtype=torch.float16), None
    cache = AttentionCache(store=False)
    nf_attention(q, k, k, kv_lens=kl, block_table=table, enable_gqa=True, cache=cache,
                 schedule=schedule)
    [kern] = cache.kernels()
    return kern.kernels[0].source


def test_only_a_table_indexed_loop_gets_the_deeper_pipeline():
    paged, dense = _partial_source(16, DEEP), _partial_source(0, DEEP)
    assert paged.count("tl.range(") == 2 and "num_stages=5)" in paged
    assert "tl.range(" not in dense
    # gather_stages 0 (the default): Triton's own placement at num_stages
    assert "tl.range(" not in _partial_source(16)


_BUILD = r"""
import importlib.util, inspect, json, re, sys
import triton
from triton.backends.compiler import GPUTarget
spec = importlib.util.spec_from_file_location("nf_table_kernel", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
fn = mod.attention_partial
consts = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_E=128, BLOCK_C=128, INTERPRET=False)
sig, attrs = {}, {}
for i, name in enumerate(inspect.signature(fn.fn).parameters):
    if name in consts:
        sig[name] = "constexpr"
    elif name.endswith("_ptr"):
        sig[name] = "*i32" if name.startswith(("kv_lens", "block_table")) else \
            "*fp32" if name.startswith("ws_") else "*fp16"
        attrs[(i,)] = [["tt.divisibility", 16]]
    else:   # sizes and strides, divisible by 16 as the launcher's of a contiguous cache
        sig[name] = "i32"
        if re.fullmatch(r"[kvq]_s[0-2]|ws_\w+_s[0-2]", name):
            attrs[(i,)] = [["tt.divisibility", 16]]
c = triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts,
                                             attrs=attrs),
                   target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=3))
bufs = re.findall(r"ttg\.local_alloc : \(\) -> !ttg\.memdesc<([0-9x]+)xf16", c.asm["ttgir"])
print(json.dumps({"buffers": bufs, "shared": c.metadata.shared}))
"""


def _sm90_shared_buffers(source: str, tmp_path) -> tuple[list[str], int]:
    """The fp16 shared-memory buffers (shapes) and bytes Triton allocates for
    ``source``'s partial kernel at 3 stages on sm_90. Built in a fresh process: this one
    has Triton's language patched for the interpreter."""
    pytest.importorskip("triton")
    tmp_path.mkdir()
    (tmp_path / "kernel.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    got = subprocess.run([sys.executable, "-c", _BUILD, str(tmp_path / "kernel.py")],
                         capture_output=True, text=True, env=env, timeout=300)
    if got.returncode:   # a Triton build without the CUDA backend, say
        pytest.skip("cannot build for sm_90 here: " + got.stderr.strip()[-300:])
    out = json.loads(got.stdout.strip().splitlines()[-1])
    return out["buffers"], out["shared"]


def test_paged_keys_and_values_are_double_buffered_as_contiguous_ones(tmp_path):
    """At 3 stages a direct load keeps 2 tiles in flight. At gather_stages 0 a
    table-indexed one keeps 1 (Triton 3.6 and 3.9: one 128 x 128 buffer for K and one for
    V, 72 KiB of shared memory against 136 KiB)."""
    dense, dense_smem = _sm90_shared_buffers(_partial_source(0), tmp_path / "d")
    paged, paged_smem = _sm90_shared_buffers(_partial_source(16, DEEP), tmp_path / "p")
    assert dense and set(dense) == {"2x128x128"}   # K and V, per loop
    assert paged == dense
    assert abs(paged_smem - dense_smem) < 4096     # plus the page ids' small buffers
