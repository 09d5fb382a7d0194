"""A graph with nothing to fuse reaches Inductor as Inductor's own: the same ATen graph
after decomposition. A batch norm's statistics over ``(0, 2, 3)`` stay with Inductor,
but our ``var_mean`` decomposition had split them into a mean and a sum of squares, two
passes where Inductor's own Welford reduction makes one: 0.93x Inductor on an H100
(2026-12-05). Compared through Inductor's post-grad hook, which sees the graph either
way."""

from __future__ import annotations

import pytest
import torch
import torch._inductor.config as inductor_config
import torch.nn.functional as F

from neptune_fusion.dynamo import Backend


def _batch_norm(x, w, b):
    return F.batch_norm(x, None, None, w, b, training=True)


def _variance_of_all(x, w, b):
    return x.var() * w.sum() + b.sum()


@pytest.mark.parametrize("fn", [_batch_norm, _variance_of_all])
def test_inductor_gets_its_own_graph(fn):
    seen = []
    gen = torch.Generator().manual_seed(1)
    args = (torch.randn(4, 8, 6, 6, generator=gen), torch.rand(8, generator=gen),
            torch.randn(8, generator=gen))
    outs = []
    with torch.no_grad(), inductor_config.patch(
            post_grad_custom_pre_pass=lambda g: seen.append(str(g))):
        for backend in ("inductor", Backend(rest="inductor")):
            torch._dynamo.reset()
            outs.append(torch.compile(fn, backend=backend)(*args))
    assert len(seen) == 2 and seen[0] == seen[1], "\n=====\n".join(seen)
    want = fn(*(a.double() for a in args))
    for out in outs:
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
