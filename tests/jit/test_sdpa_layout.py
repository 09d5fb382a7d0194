"""``F.scaled_dot_product_attention`` through the backend returns eager's layout: with a
query that is a transposed view (``x.view(B, L, H, E).transpose(1, 2)``, ``(B, L, H, E)``
in memory) the CPU's flash kernel, as its meta kernel says, allocates the output like the
query, so ``out.transpose(1, 2).view(B, L, H * E)`` works in eager. The fused output
came back contiguous ``(B, H, L, E)`` and that view raised (the 2026-12-04 evening
fuzzing session). ``decomp.swap_sdpa`` now lays the math's result out as the traced
SDPA's fake value (``layout``), and the kernel writes it in that order
(``rewrite.output_orders``). Values against float64, strides against eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neptune_fusion.dynamo import Backend

B, H, E = 2, 4, 8


def _query(x):
    b, n, he = x.shape
    return x.view(b, n, H, he // H).transpose(1, 2)


def plain(x, k, v):
    return F.scaled_dot_product_attention(_query(x), k, v)


def causal(x, k, v):
    return F.scaled_dot_product_attention(_query(x), k, v, is_causal=True)


def masked(x, k, v):
    i, j = torch.arange(x.shape[1]), torch.arange(k.shape[2])
    keep = (i[:, None] - j[None, :]).abs() < 5   # a band built from positions
    return F.scaled_dot_product_attention(_query(x), k, v, attn_mask=keep)


def scaled(x, k, v):
    return F.scaled_dot_product_attention(_query(x), k, v, scale=0.3)


CASES = {f.__name__: f for f in (plain, causal, masked, scaled)}


def _args(n, gen):
    return (torch.randn(B, n, H * E, generator=gen), torch.randn(B, H, n, E, generator=gen),
            torch.randn(B, H, n, E, generator=gen))


@pytest.mark.parametrize("rest", ["eager", "inductor"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_transposed_query_gives_eagers_layout(name, rest):
    """Three lengths: a static graph, then the dynamic one ``dynamic=None`` compiles."""
    fn, gen = CASES[name], torch.Generator().manual_seed(len(name))
    torch._dynamo.reset()
    backend = Backend(rest=rest)
    compiled = torch.compile(fn, backend=backend)
    for n in (16, 24, 40):
        args = _args(n, gen)
        with torch.no_grad():
            got = compiled(*args)
        eager = fn(*args)
        assert eager.stride() != eager.contiguous().stride()   # the case in question
        assert got.shape == eager.shape and got.stride() == eager.stride(), \
            (n, got.stride(), eager.stride())
        torch.testing.assert_close(got.double(), fn(*(a.double() for a in args)),
                                   rtol=1e-5, atol=1e-5)
        merged = got.transpose(1, 2).view(B, n, H * E)   # raised: a contiguous output
        assert merged.data_ptr() == got.data_ptr()
    assert len(backend.reports) == 2 and backend.reports[1].dynamic
    assert all(len(r.fused) == 1 for r in backend.reports), backend.reports


@pytest.mark.parametrize("rest", ["eager", "inductor"])
def test_the_kernel_writes_the_layout_itself(rest):
    """The fused kernel's output is ``(B, L, H, E)`` (the value in memory order), and the
    graph returns a view of it: no copy after the kernel."""
    gen = torch.Generator().manual_seed(3)
    torch._dynamo.reset()
    backend = Backend(rest=rest)
    args = _args(32, gen)
    with torch.no_grad():
        got = torch.compile(plain, backend=backend)(*args)
    [fused] = backend.reports[0].fused
    assert [tuple(map(int, o.shape)) for o in fused.kernel.outputs] == [(B, 32, H, E)]
    torch.testing.assert_close(got.double(), plain(*(a.double() for a in args)),
                               rtol=1e-5, atol=1e-5)


def test_heads_merged_inside_the_function():
    """``o.transpose(1, 2).reshape(B, L, H * E) @ w`` in the function: the merge is a view
    of the kernel's output, as in eager; values against float64."""
    gen = torch.Generator().manual_seed(4)

    def fn(x, k, v, w):
        o = F.scaled_dot_product_attention(_query(x), k, v)
        return o.transpose(1, 2).reshape(x.shape) @ w
    torch._dynamo.reset()
    backend = Backend(rest="inductor")
    args = (*_args(24, gen), torch.randn(H * E, 5, generator=gen))
    with torch.no_grad():
        got = torch.compile(fn, backend=backend)(*args)
    assert backend.reports[0].fused
    torch.testing.assert_close(got.double(), fn(*(a.double() for a in args)),
                               rtol=1e-5, atol=1e-5)


def test_a_contiguous_query_keeps_the_contiguous_output():
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(B, H, 24, E, generator=gen) for _ in range(3))
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(F.scaled_dot_product_attention,
                            backend=Backend(rest="eager"))(q, k, v)
    assert got.is_contiguous()
    torch.testing.assert_close(got.double(), F.scaled_dot_product_attention(
        q.double(), k.double(), v.double()), rtol=1e-5, atol=1e-5)
