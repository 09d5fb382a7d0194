"""Advanced indexing with an index read from a tensor, inside a chain, through the backend.

A hand-written cross-entropy reads its log-softmax at ``[arange(n), target]``; before,
the target (an index read from a tensor, which PyTorch wraps when negative) was refused
and the whole loss went to Inductor. Now the index is wrapped as PyTorch wraps it,
``where(t < 0, t + V, t)``, and gathered in the chain's kernel. Negative targets and a
row permutation (``x[perm]`` before a softmax) included; outputs against float64."""

from __future__ import annotations

import torch

from neptune_fusion.dynamo import Backend


def _compile(fn):
    torch._dynamo.reset()
    backend = Backend()
    return torch.compile(fn, backend=backend), backend


def test_hand_written_cross_entropy_fuses_with_negative_targets():
    def ce(x, t):
        return -torch.log_softmax(x, -1)[torch.arange(x.shape[0]), t]
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 40, generator=gen) * 3.0
    t = torch.tensor([0, 39, -1, -40, 7, -13])
    fn, backend = _compile(ce)
    got = fn(x, t)
    want = ce(x.double(), t)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    [report] = backend.reports
    assert report.fused and not report.left, report
    assert any("index" in c.ops for c in report.fused), report


def test_rows_picked_by_a_tensor_before_a_softmax():
    def pick(x, perm):
        return torch.softmax(x[perm], -1)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(5, 33, generator=gen)
    perm = torch.tensor([4, -1, 0, 2, -4, 1, 1])
    fn, backend = _compile(pick)
    got = fn(x, perm)
    torch.testing.assert_close(got.double(), pick(x.double(), perm), rtol=1e-5, atol=1e-6)
    [report] = backend.reports
    assert report.fused and any("index" in c.ops for c in report.fused), report


def test_take_along_dim_wraps_its_indices_with_remainder():
    """``take_along_dim`` wraps negative indices by ``remainder`` (now translated for
    integers), then gathers: the whole loss is one chain."""
    def ce(x, t):
        return -torch.log_softmax(x, -1).take_along_dim(t[:, None], -1)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 40, generator=gen)
    t = torch.tensor([0, 39, -1, -40, 7, -13])
    fn, backend = _compile(ce)
    got = fn(x, t)
    torch.testing.assert_close(got.double(), ce(x.double(), t), rtol=1e-5, atol=1e-5)
    [report] = backend.reports
    assert report.fused and not report.left, report
    assert "remainder" in report.fused[0].ops, report



def test_tensor_indices_under_dynamic_shapes():
    """One graph for every size: the wrap adds the dimension's symbolic extent."""
    def ce(x, t):
        return -torch.log_softmax(x, -1)[torch.arange(x.shape[0]), t]
    torch._dynamo.reset()
    backend = Backend()
    fn = torch.compile(ce, backend=backend, dynamic=True)
    gen = torch.Generator().manual_seed(8)
    for n, v in ((6, 40), (9, 33)):
        x = torch.randn(n, v, generator=gen)
        t = torch.randint(-v, v, (n,), generator=gen)
        torch.testing.assert_close(fn(x, t).double(), ce(x.double(), t), rtol=1e-5, atol=1e-5)
    [report] = backend.reports
    assert report.dynamic and report.fused and not report.left, report


def test_an_embedding_joins_its_layer_norm():
    """``embedding`` is a gather of the table's rows (the kernel clamps an id into the
    table): BERT's embeddings, summed and normalised, are one kernel."""
    gen = torch.Generator().manual_seed(9)
    words, pos = torch.randn(50, 32, generator=gen), torch.randn(12, 32, generator=gen)

    def embed(ids, words, pos):
        at = torch.arange(ids.shape[1])
        x = torch.nn.functional.embedding(ids, words) + torch.nn.functional.embedding(at, pos)
        return torch.nn.functional.layer_norm(x, (32,))
    ids = torch.randint(0, 50, (3, 12), generator=gen)
    fn, backend = _compile(embed)
    torch.testing.assert_close(fn(ids, words, pos).double(),
                               embed(ids, words.double(), pos.double()), rtol=1e-5, atol=1e-5)
    [report] = backend.reports
    assert len(report.fused) == 1 and not report.left, report
    assert report.fused[0].ops.count("embedding") == 2, report
