"""Kernels through the backend do no more work than the same operator written in the
language (CPU: the generated source, at one schedule; answers against float64 where
they run).

* A softmax computes one exponential per element in its one-tile kernel, as the chain
  written in the language does (codegen/reuse.py): the translated graph reads a 16-bit
  maximum through a widening cast, which the rule reads through (before 2026-12-05 it
  did not, and bf16 softmax through the backend ran at 0.92x the language's kernel on
  an H100).
* Each single-pass chain of the suite and each of the ten attention operators: no more
  distinct exponentials, logarithms, roots and loads than the language's kernel (found
  a tile loaded twice by variance and layer statistics, fixed in ``TileOps.load``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import neptune_fusion as nf
from codegen.test_row_tiles import _one_tile_branch as _branch
from neptune_fusion.bench import chains as bench_chains
from neptune_fusion.ops import OPERATORS

FORMS = {"chain-suite": bench_chains.CHAINS["softmax"].plain,
         "torch.softmax": lambda x: torch.softmax(x, -1),
         "float32 softmax cast back": lambda x: torch.softmax(x.float(), -1).to(x.dtype)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_softmax_through_the_backend_computes_one_exponential_per_element(dtype, form,
                                                                          grad):
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(6, 40, generator=g) * 4).to(dtype)
    fn = nf.jit(FORMS[form])
    torch._dynamo.reset()
    with torch.set_grad_enabled(grad):
        got = fn(x.clone().requires_grad_(grad))
    want = torch.softmax(x.double(), -1)
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-3)
    [report] = fn.backend.reports
    [fused] = report.fused
    kernel = fused.kernel
    src = (kernel.kernel_for(x) if hasattr(kernel, "kernel_for") else kernel).source
    one = _branch(src)
    assert "tl.exp(" not in one, one
    assert one.count("tl.exp2(") == 1, one


OPS = ("tl.exp2(", "tl.exp(", "tl.log(", "tl.log2(", "tl.sqrt(", "rsqrt(", "tl.load(")


def _calls(src: str) -> dict:
    """``op`` -> the distinct calls of it in ``src`` (by their argument text: the same
    call written twice is one value, which Triton's compiler computes once)."""
    out = {}
    for op in OPS:
        seen, at = set(), src.find(op)
        while at >= 0:
            depth, k = 1, at + len(op)
            while depth and k < len(src):
                depth += {"(": 1, ")": -1}.get(src[k], 0)
                k += 1
            seen.add(src[at + len(op):k])
            at = src.find(op, k)
        out[op] = len(seen)
    return out


def _one_tile(src: str) -> str:
    """Each kernel function of ``src`` up to its branches, and its masked one-tile
    branch: what a program runs when one masked tile holds its rows (the whole function
    where it has no such branches: a GEMM's)."""
    parts = []
    for body in src.split("@triton.jit")[1:]:
        if not body.lstrip().startswith("def nf_") and "\ndef nf_" not in body[:200]:
            continue   # a helper (_nf_max)
        if "if ONE_TILE" in body:
            body = body[:body.index("if ONE_TILE")] + _branch(body)
        parts.append(body)
    return "\n".join(parts)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("name", list(bench_chains.CHAINS))
def test_translated_chain_computes_no_more_than_the_languages(name, dtype):
    """Each chain of the suite in plain PyTorch through the backend, at a row one tile
    holds (a norm -> projection at its smoke sizes, its GEMM loop and all): its kernel
    computes no more exponentials, logarithms, square roots and loads than the same
    chain written in the language at the same schedule (its masked one-tile branch).
    The translated graph's casts and spellings must not cost work; the bf16 softmax's
    second exponential (above) is the kind this finds."""
    chain = bench_chains.CHAINS[name]
    sizes = chain.smoke if chain.contraction else {**chain.smoke, "M": 40}
    args = bench_chains.make_inputs(chain, sizes, dtype, "cpu")
    torch._dynamo.reset()
    fn = nf.jit(chain.plain, rest="eager")
    with torch.no_grad():
        fn(*args)
    [report] = fn.backend.reports
    [fused] = report.fused
    auto = fused.kernel
    schedule = auto.last_choice.schedule
    translated = _one_tile(auto._kernel(schedule).source)
    assert chain.contraction or "for " not in translated, translated   # one tile
    outs, ins = chain.build(str(dtype).removeprefix("torch."))
    kernel = nf.compile(outs, ins, schedule=schedule, cache=False)
    written = _one_tile(getattr(kernel, "source", None) or kernel.kernel_for(*args).source)
    got, want = _calls(translated), _calls(written)
    more = {op: (got[op], want[op]) for op in OPS if got[op] > want[op]}
    assert not more, (more, translated, written)


def _small_operator(op):
    kv = 4 if op.kv_heads == op.q_heads else 2
    return dataclasses.replace(op, q_heads=4, kv_heads=kv, head_dim=16,
                               window=3 if op.window else None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name", list(OPERATORS))
def test_translated_attention_computes_no_more_than_nf_attention(name, dtype):
    """Each of the ten operators in plain PyTorch (the bench's spelling) through the
    backend, built at the schedule ``nf.attention`` chose for it: no more distinct
    exponentials, logarithms, roots and loads than ``nf.attention``'s kernel. ALiBi is
    allowed one exponential more: the translated graph computes each head's slope
    (``exp2(-2 (h + 1))``, a scalar per program) where ``nf.attention`` loads it from
    its slopes buffer -- one load fewer, which is asserted too."""
    from neptune_fusion.bench.providers.compiled import plain_attention
    from neptune_fusion.bench.workloads import attention_options
    from neptune_fusion.frontend.prepared import prepare_attention
    from neptune_fusion.ops import _keywords
    op, seq = _small_operator(OPERATORS[name]), 40
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, op.q_heads, op.q_len(seq), op.head_dim, generator=g).to(dtype)
    k, v = (torch.randn(1, op.kv_heads, seq, op.head_dim, generator=g).to(dtype)
            for _ in range(2))
    torch._dynamo.reset()
    fn = nf.jit(plain_attention(op, seq), rest="eager")
    with torch.no_grad():
        fn(q, k, v)
    [report] = fn.backend.reports
    [fused] = report.fused
    o = attention_options(op, seq, q.device)
    kw = _keywords(q, k, o["scale"], o["causal"], o.get("q_start", 0),
                   o.get("alibi_slopes"), o.get("softcap"), o.get("window"), None, None)
    written = prepare_attention(q, k, v, **kw)._launch.kernel
    translated = fused.kernel._kernel(written.schedule)
    got, want = _calls(translated.source), _calls(written.source)
    if "ALiBi" in name:
        assert got["tl.load("] == want["tl.load("] - 1, (got, want)
        want["tl.exp2("] += 1
        want["tl.load("] -= 1
    more = {op: (got[op], want[op]) for op in OPS if got[op] > want[op]}
    assert not more, (more, translated.source, written.source)
