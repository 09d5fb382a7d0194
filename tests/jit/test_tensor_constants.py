"""A tensor constant of the compiled function (``torch.tensor(0.2)``, a literal mask) read
by a fused region: the region's input is the graph's ``get_attr`` node, a real tensor,
which the fake mode propagating the rewritten graph's values (ours, then Inductor's)
refused as an op's input, so every such function raised ``BackendCompilerFailed`` (a
fuzzing find, 2026-12-04: ``softmax(maximum(x, torch.tensor(0.2)))``). The call now reads
it lifted (``lift_fresh_copy``), as torch's own graphs read a constant. Against float64,
fused."""

from __future__ import annotations

import pytest
import torch

from neptune_fusion.dynamo import Backend

CASES = {
    "0-d in a map": lambda x: torch.softmax(torch.maximum(x, torch.tensor(0.2)), -1),
    "0-d after the chain": lambda x: torch.minimum(torch.log_softmax(x, -1),
                                                   torch.tensor(-1.0)),
    "0-d in a where": lambda x: torch.softmax(torch.where(x > 0, x, torch.tensor(-1.0)), -1),
    "a row": lambda x: torch.softmax(x + torch.tensor([1.0, 2, 3, 4, 5, 6, 7, 8]), -1),
    "a bool mask": lambda x: torch.softmax(x.masked_fill(
        torch.tensor([False, True, False, False, True, False, False, False]),
        float("-inf")), -1),
}


@pytest.mark.parametrize("rest", ["eager", "inductor"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_tensor_constant_read_by_a_fused_region(name, rest):
    fn = CASES[name]
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(len(name)))
    torch._dynamo.reset()
    backend = Backend(rest=rest)
    with torch.no_grad():
        got = torch.compile(fn, backend=backend)(x)
    assert backend.reports[0].fused, backend.reports[0]
    torch.testing.assert_close(got.double(), fn(x.double()), rtol=1e-5, atol=1e-6)
