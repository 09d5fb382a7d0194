"""The chain suite's table: three spellings that agree, inputs, work counts, selection."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.bench.chains import (
    CHAINS,
    VARIANCE_MEAN,
    as_outputs,
    make_inputs,
    reference,
    select_chains,
)

REQUIRED = ("rmsnorm-matmul", "layernorm-matmul", "l2norm-matmul", "logsumexp",
            "logsumexp-128k", "log-softmax", "softmax", "softmax-denominator", "variance",
            "layer-stats", "tanh-sum")


def test_the_suite_has_the_chains_of_issue_14():
    assert set(REQUIRED) <= set(CHAINS)
    assert [c.name for c in CHAINS.values() if not c.single_pass] == ["tanh-sum"]
    assert CHAINS["rmsnorm-matmul"].sizes == {"N": 4096, "D": 4096, "K": 4096}
    assert CHAINS["logsumexp"].sizes == {"N": 4096, "M": 32768}
    assert CHAINS["logsumexp-128k"].sizes["M"] == 131072
    assert CHAINS["variance"].mean == VARIANCE_MEAN == 100.0


@pytest.mark.parametrize("name", list(CHAINS))
def test_reference_matches_the_program_and_the_plain_form(name):
    """float64 torch reference == nf.evaluate of the program == plain form (in float32)."""
    chain = CHAINS[name]
    tensors = make_inputs(chain, chain.smoke, torch.float32, "cpu")
    assert all(bool((t != 0).all()) for t in tensors if t.is_floating_point())  # random
    ref = reference(chain, tensors)
    outputs, inputs = chain.build("float32")
    assert [p.name for p in inputs] == list(chain.shapes(chain.smoke))
    feeds = {p.name: (t.double() if t.is_floating_point() else t).numpy()
             for p, t in zip(inputs, tensors)}
    got = nf.evaluate(outputs, feeds)
    got = got if isinstance(got, (list, tuple)) else [got]
    assert len(got) == len(ref) == len(chain.outputs)
    assert [tuple(r.shape) for r in ref] == chain.output_shapes(chain.smoke)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(np.asarray(g), r.numpy(), rtol=1e-9, atol=1e-9)
    plain = as_outputs(chain.plain(*tensors))
    assert all(p.is_floating_point() for p in plain)
    for p, r in zip(plain, ref):
        assert p.dtype == torch.float32
        np.testing.assert_allclose(p.double().numpy(), r.numpy(), rtol=1e-5, atol=1e-5)


def test_inputs_are_seeded_random_with_the_declared_moments():
    chain = CHAINS["variance"]
    sizes = {"N": 64, "M": 256}
    x, = make_inputs(chain, sizes, torch.float32, "cpu")
    again, = make_inputs(chain, sizes, torch.float32, "cpu")
    assert torch.equal(x, again) and x.shape == (64, 256)
    assert abs(float(x.mean()) - 100.0) < 0.1 and abs(float(x.std()) - 1.0) < 0.05
    x16, w, b, big_w = make_inputs(CHAINS["layernorm-matmul"], {"N": 8, "D": 64, "K": 32},
                                   torch.bfloat16, "cpu")
    assert x16.dtype == big_w.dtype == torch.bfloat16 and big_w.shape == (64, 32)
    assert abs(float(w.float().mean()) - 1.0) < 0.1 and float(b.float().abs().max()) < 1.0


def test_cross_entropy_targets_are_class_ids_and_count_at_eight_bytes():
    ce = CHAINS["cross-entropy"]
    x, t = make_inputs(ce, {"N": 512, "M": 7}, torch.bfloat16, "cpu")
    assert t.dtype == torch.int64 and x.dtype == torch.bfloat16
    assert int(t.min()) == 0 and int(t.max()) == 6          # every class drawn, none past
    assert ce.bytes_moved({"N": 4, "M": 10}, 2) == (40 + 4) * 2 + 4 * 8


def test_bytes_and_flops():
    lse = CHAINS["logsumexp"]
    assert lse.bytes_moved(lse.sizes, 4) == (4096 * 32768 + 4096) * 4
    assert lse.flops(lse.sizes) == 0
    sm = CHAINS["softmax"]
    assert sm.bytes_moved(sm.sizes, 2) == 2 * 4096 * 32768 * 2
    stats = CHAINS["layer-stats"]
    assert stats.bytes_moved({"N": 4, "M": 10}, 4) == (40 + 8) * 4
    rms = CHAINS["rmsnorm-matmul"]
    assert rms.flops(rms.sizes) == 2 * 4096 ** 3
    assert rms.bytes_moved({"N": 2, "D": 3, "K": 5}, 2) == (6 + 3 + 15 + 10) * 2


def test_select_chains():
    assert [c.name for c in select_chains(["Variance", "logsumexp"])] == ["logsumexp",
                                                                          "variance"]
    assert len(select_chains(None)) == len(CHAINS)
    with pytest.raises(ValueError, match="unknown chain.*nope"):
        select_chains(["nope"])
