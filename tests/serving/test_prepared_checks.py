"""``nf.prepare_attention``'s calls check what ``nf.attention`` checks (docs/serving.md,
"Checks"): the values of ``kv_lens`` and ``block_table`` on CPU tensors every call (on
CUDA only with ``NEPTUNE_FUSION_VALIDATE=1``: no host sync per call), and the
``buffers`` argument against the prepared names; good calls still match float64."""

from __future__ import annotations

import pytest
import torch

import neptune_fusion as nf
from neptune_fusion import ops
from neptune_fusion.errors import FeedError
from neptune_fusion.frontend import kv
from neptune_fusion.frontend.attention import AttentionCache
from neptune_fusion.schedule.schedule import Schedule
from serving.test_kv_cache import _Causal, _contiguous, _paged, _reference, _tol

SPLIT = Schedule(block_m=16, block_n=16, num_warps=4, strategy="split", splits=3)


class _Plain:
    softcap, alibi, causal = None, False, False


def _lens(*xs):
    return torch.tensor(xs, dtype=torch.int32)


def test_ragged_lengths_are_checked_every_call():
    q, k, v, lens = _contiguous([5, 32], 2, 2, 1, 32, torch.float32, seed=1)
    kw = dict(cache=AttentionCache(store=False), schedule=SPLIT)
    step = nf.prepare_attention(q, k, v, kv_lens=lens, **kw)
    for bad, msg in ((_lens(5, 1000), r"kv_lens\[1\] = 1000 is outside \[0, 32\]"),
                     (_lens(-1, 32), r"kv_lens\[0\] = -1 is outside")):
        with pytest.raises(FeedError, match=msg):
            step(q, k, v, kv_lens=bad)
        with pytest.raises(FeedError, match=msg):   # as nf.attention says
            nf.attention(q, k, v, kv_lens=bad, **kw)
    for new in ([3, 17], [0, 32]):   # good lengths, written into the same tensor
        lens.copy_(_lens(*new))
        out = step(q, k, v, kv_lens=lens)
        assert out is step.output
        want = _reference(q, list(k), list(v), new, _Plain())
        torch.testing.assert_close(out.double(), want, **_tol(torch.float32))


def test_page_ids_and_lengths_of_a_paged_step_are_checked_every_call():
    q, kp, vp, lens, table, keys, vals = _paged([5, 20], 4, 2, 1, 2, torch.float32, 2)
    pool = kp.shape[0]
    step = nf.prepare_attention(q, kp, vp, kv_lens=lens, block_table=table,
                                enable_gqa=True, mask_mod=ops.Causal(),
                                cache=AttentionCache(store=False), schedule=SPLIT)
    good = table.clone()
    for b, p, page in ((1, 1, 99), (0, 0, -1)):
        table.copy_(good)
        table[b, p] = page
        with pytest.raises(FeedError, match=rf"block_table\[{b}, {p}\] = {page} is outside "
                                            rf"the pool of {pool} pages"):
            step(q, kp, vp, kv_lens=lens, block_table=table)
    table.copy_(good)
    with pytest.raises(FeedError, match=r"kv_lens\[0\] = -3 is outside \[0, 32\]"):
        step(q, kp, vp, kv_lens=_lens(-3, 20), block_table=table)
    with pytest.raises(FeedError, match=r"kv_lens\[1\] = 33 is outside \[0, 32\]"):
        step(q, kp, vp, kv_lens=_lens(5, 33), block_table=table)
    table[0, 1] = 99   # a page past a sequence's length is never read: not an error
    out = step(q, kp, vp, kv_lens=lens, block_table=table)
    assert out is step.output
    want = _reference(q, keys, vals, [5, 20], _Causal())
    torch.testing.assert_close(out.double(), want, **_tol(torch.float32))


def test_on_cuda_values_are_checked_only_when_asked(monkeypatch):
    """The GPU policy (no host sync per call unless NEPTUNE_FUSION_VALIDATE=1) is
    :func:`kv.wants_values_checked`'s: where it says no, the call reads no value."""
    q, k, v, lens = _contiguous([5, 32], 2, 2, 1, 32, torch.float32, seed=3)
    step = nf.prepare_attention(q, k, v, kv_lens=lens, cache=AttentionCache(store=False),
                                schedule=SPLIT)
    asked = []

    def never(*args):
        raise AssertionError("values read without being asked")
    monkeypatch.setattr(kv, "wants_values_checked", lambda device: asked.append(device))
    monkeypatch.setattr(kv, "check_values", never)
    out = step(q, k, v, kv_lens=lens)
    assert asked == [q.device] and out is step.output
    want = _reference(q, list(k), list(v), [5, 32], _Plain())
    torch.testing.assert_close(out.double(), want, **_tol(torch.float32))


def test_buffers_must_name_the_prepared_buffers():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g) for n in (1, 30, 30))
    slopes = torch.tensor([0.5, 0.25])
    step = nf.prepare_attention(q, k, v, score_mod=ops.AlibiSlopes(), q_offset="end",
                                buffers={"slopes": slopes}, schedule=SPLIT,
                                cache=AttentionCache(store=False))
    for bad, msg in (({"sl": slopes}, "missing 'slopes'; unexpected 'sl'"),
                     ({"slopes": slopes, "x": slopes}, "unexpected 'x'"),
                     (None, "missing 'slopes'"),
                     ([slopes], "buffers must map names to tensors .*got list")):
        with pytest.raises(FeedError, match=msg):
            step(q, k, v, buffers=bad)
    with pytest.raises(FeedError, match="buffer 'slopes' must be a torch tensor"):
        step(q, k, v, buffers={"slopes": [0.5, 0.25]})   # the general path's check
    other = torch.tensor([0.125, 1.0])
    out = step(q, k, v, buffers={"slopes": other})
    assert out is step.output
    s = q.double() @ k.double().transpose(-1, -2) / 4.0
    s = s + other.double().view(1, 2, 1, 1) * (torch.arange(30.0) - 29.0)
    torch.testing.assert_close(out.double(), s.softmax(-1) @ v.double(), rtol=1e-5,
                               atol=1e-5)

    plain = nf.prepare_attention(q, k, v, q_offset="end", schedule=SPLIT,
                                 cache=AttentionCache(store=False))
    with pytest.raises(FeedError, match="unexpected 'slopes'.*prepared with \\(none\\)"):
        plain(q, k, v, buffers={"slopes": slopes})
    assert plain(q, k, v, buffers={}) is plain.output
