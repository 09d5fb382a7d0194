"""Random attention calls in a training step traced by torch.compile (``fullgraph=True``,
``aot_eager``): the ``neptune_fusion::attention`` op, its saved output and log-sum-exp
and its registered backward, with the campaign's score and mask mods, GQA, ragged caches
(``kv_lens``), ``return_lse=True`` and ``sinks=``, in float32, float16 and bfloat16;
the loss's value (its output and log-sum-exp in 16 bits) and the gradients of q, k, v
(and the sinks) against float64 autograd of the same attention written in torch. (The
16-bit draws came after the tuner refused every candidate of a bf16 GQA gradient kernel
on the GPU, 2026-12-06: docs/scheduling.md, "The check's tolerance".)

A difference between the compiled step and the eager one was a defect here before
(gpt-oss's sinks got no gradient under torch.compile), so this campaign checks the
traced path on its own. Sizes as in tests/fuzz/test_fuzz.py (``NF_FUZZ``).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from neptune_fusion.frontend.attention import AttentionCache, attention

from .test_fuzz import DTYPES, FUZZ, MASKS, SCORE_MODS, _examples, modded

CACHE = AttentionCache(store=False)
GPU_CACHE = AttentionCache(store=False)
DRAWS = dict(b=st.integers(1, 2), hkv=st.integers(1, 2), group=st.sampled_from((1, 2)),
             n=st.integers(1, 10), m=st.integers(1, 20),
             score=st.sampled_from(sorted(SCORE_MODS)), mask=st.sampled_from(sorted(MASKS)),
             offset=st.sampled_from(("none", "end")), ragged=st.booleans(),
             lse=st.booleans(), sinks=st.booleans(), dtype=st.sampled_from(sorted(DTYPES)),
             seed=st.integers(0, 2 ** 31 - 1))


@settings(max_examples=_examples(8, 150), **FUZZ)
@given(**DRAWS)
def test_fuzz_compiled_training_step(**drawn):
    check_compiled_training("cpu", CACHE, **drawn)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@settings(max_examples=max(2, _examples(8, 150) // 40), **FUZZ)
@given(**DRAWS)
def test_fuzz_compiled_training_step_on_gpu(**drawn):
    """The same draws, the kernels compiled for the GPU; a fortieth as many examples
    (``NF_FUZZ=400``: 10): every shape class drawn tunes its forward and backward
    kernels on the device (on an H100 on 2026-12-06, 10 float32 examples passed in
    89 s; the 16-bit draws came after and have not run on a GPU yet)."""
    check_compiled_training("cuda", GPU_CACHE, **drawn)


def check_compiled_training(device, cache, b, hkv, group, n, m, score, mask, offset,
                            ragged, lse, sinks, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    hq, d = hkv * group, 8
    tdtype, tol = DTYPES[dtype]
    q, k, v = (torch.randn(b, h, rows, d, generator=gen).to(tdtype)
               for h, rows in ((hq, n), (hkv, m), (hkv, m)))
    sink = torch.randn(hq, generator=gen)
    slopes = torch.rand(hq, generator=gen) * 0.5 if score == "slopes" else None
    # ragged: each sequence's length (its queries the last n positions of it)
    lens = torch.randint(n, m + 1, (b,), generator=gen) if ragged and m >= n else None
    score_mod, score_ref = SCORE_MODS[score]
    mask_mod, keep = MASKS[mask]

    def ref_scores(qd, kd, bi):
        m_b = m if lens is None else int(lens[bi])
        s = qd[bi] @ kd[bi].repeat_interleave(group, 0)[:, :m_b].transpose(-1, -2) * d ** -0.5
        off = m_b - n if (offset == "end" or lens is not None) else 0
        return modded(s, torch.arange(n) + off, m_b, score_ref, keep, slopes)

    # a row that sees no key has lse = -inf: its lse has no gradient to compare (unless a
    # sink gives the row a finite one)
    with torch.no_grad():
        empty = any(torch.isinf(ref_scores(q.double(), k.double(), bi)).all(-1).any()
                    for bi in range(b))
    assume(not (lse and empty and not sinks))

    bufs = {"slopes": slopes.to(device)} if slopes is not None else None
    kv_lens = None if lens is None else lens.to(device, torch.int32)

    def step(q, k, v, sink):
        got = attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod,
                        enable_gqa=group > 1,
                        q_offset="end" if offset == "end" and lens is None else None,
                        buffers=bufs, kv_lens=kv_lens, sinks=sink if sinks else None,
                        return_lse=lse, cache=cache)
        return got if lse else (got, None)

    w_o = torch.randn(b, hq, n, d, generator=gen)
    w_l = torch.randn(b, hq, n, generator=gen)
    xs = [t.clone().to(device).requires_grad_() for t in (q, k, v, sink)]
    torch._dynamo.reset()
    o, row_lse = torch.compile(step, fullgraph=True, backend="aot_eager")(*xs)
    loss = (o.cpu().float() * w_o).sum() + ((row_lse.cpu() * w_l).sum() if lse else 0.0)
    loss.backward()

    want = [t.double().requires_grad_() for t in (q, k, v, sink)]
    qd, kd, vd, sd = want
    outs, lses = [], []
    for bi in range(b):
        s = ref_scores(qd, kd, bi)
        vv = vd[bi].repeat_interleave(group, 0)[:, :s.shape[-1]]
        if sinks:
            s = torch.cat([s, sd.view(hq, 1, 1).expand(hq, n, 1)], -1)
            vv = torch.cat([vv, vv.new_zeros(hq, 1, d)], 1)
        seen = torch.isfinite(s).any(-1, keepdim=True)
        p = torch.where(seen, torch.softmax(torch.where(seen, s, 0.0), -1), 0.0)
        outs.append(p @ vv)
        lses.append(torch.logsumexp(s, -1) if lse else None)
    ref = (torch.stack(outs) * w_o.double()).sum()
    if lse:
        ref = ref + (torch.stack(lses) * w_l.double()).sum()
    if tdtype == torch.float32:
        torch.testing.assert_close(loss.detach().double(), ref.detach(), rtol=1e-4, atol=1e-4)
    else:   # 16-bit: the loss's sum cancels; its parts are compared, as the forward fuzz
        _near("o", o, torch.stack(outs), tol)
        if lse:
            _near("lse", row_lse, torch.stack(lses), tol)
    ref.backward()
    for name, g, r in zip(("q", "k", "v", "sinks"), xs, want):
        if name == "sinks" and not sinks:
            continue
        r = torch.zeros_like(r) if r.grad is None else r.grad
        if tdtype == torch.float32:
            torch.testing.assert_close(g.grad.double().cpu(), r, rtol=1e-3, atol=1e-4,
                                       msg=lambda msg, name=name: f"d_{name}: {msg}")
        else:
            _near(f"d_{name}", g.grad, r, tol)


def _near(name, got, want, tol):
    """16-bit results as tests/fuzz/test_fuzz.py compares them: the largest error within
    ``tol`` of the largest reference value (at least 1); rows that see no key (-inf lse)
    must match exactly."""
    got, want = got.detach().double().cpu(), want.detach()
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), fin), name
    err = float((got[fin] - want[fin]).abs().max()) if fin.any() else 0.0
    assert err <= tol * max(1.0, float(want[fin].abs().max()) if fin.any() else 1.0), \
        (name, err)
