"""Stage ``separate``: per-row terms out of the tile maxima and exponentials
(codegen/separate.py), checked on the IR and against float64 on the interpreter."""

from __future__ import annotations

import torch

import neptune_fusion as nf
from neptune_fusion import ops
from neptune_fusion.codegen.program import I_FIRST
from neptune_fusion.codegen.separate import separate
from neptune_fusion.frontend.attention import AttentionCache, attention
from neptune_fusion.fusion.plan import plan
from neptune_fusion.ir.nodes import Cast, Reduce, Unary, Where
from neptune_fusion.ir.traverse import walk
from neptune_fusion.runtime.pipeline import build_programs
from neptune_fusion.schedule.schedule import Schedule

SCHED = Schedule(block_m=128, block_n=128, num_warps=8, num_stages=2)


def _program(name: str):
    [o], ins = ops.definition(name, "float16", 128)
    [prog] = build_programs(plan([o]), ins, SCHED, name.lower().replace("-", "_"))
    return prog


def _element_part(node):
    """What a tile maximum (``max_j(A) + R``) or an exponential (``exp2(A + R)``)
    computes per element: ``A``, without a boundary select's condition."""
    e = node.body if isinstance(node, Reduce) else node.x.a
    return e.a if isinstance(e, Where) else e


def _casts_rows(e, i) -> bool:
    return any(isinstance(x, Cast) and i in x.free_vars for x in walk(e))


def test_alibi_row_terms_leave_the_element_work():
    prog = _program("PF-ALiBi")
    i, j = prog.row.var, prog.loop.var
    assert any("per-row terms" in r for r in prog.rules)
    maxima = exps = 0
    for seg in prog.segments:
        for _, e in seg.body:
            for node in walk(e):
                if isinstance(node, Reduce) and node.op == "max" and node.axes == (j,):
                    maxima += 1
                    part = _element_part(node)
                    # the element work converts the columns' distance (j - i0), not the
                    # distance of every element
                    assert not _casts_rows(part, i) and I_FIRST in set(walk(part)), part
                if isinstance(node, Unary) and node.op == "exp2" and j in node.x.free_vars:
                    exps += 1
                    assert not _casts_rows(_element_part(node), i)
    assert maxima and exps


def test_programs_without_a_row_term_keep_their_body():
    for name in ("PF-Causal", "PF-SoftCap", "PF-Window", "DC-GQA"):
        [o], ins = ops.definition(name, "float16", 128)
        from neptune_fusion.codegen.exp2 import apply_exp2
        from neptune_fusion.codegen.lower import lower
        from neptune_fusion.codegen.variants import partition_loop
        prog = partition_loop(apply_exp2(lower(plan([o]), list(ins), SCHED, name="x")))
        assert separate(prog) is prog, name


def _reference(q, k, v, slopes, offset, keep_causal=True):
    q, k, v = (t.double() for t in (q, k, v))
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    i = torch.arange(q.shape[2])[:, None] + offset
    j = torch.arange(k.shape[2])[None, :]
    s = s + slopes.double()[:, None, None] * (j - i)
    if keep_causal:
        s = s.masked_fill(j > i, float("-inf"))
    return torch.softmax(s, -1) @ v


def test_alibi_far_from_the_first_key_keeps_fp32_accuracy():
    """Queries at positions near 3000 and slopes up to 1: the distributed bias is recentred
    on the position of the block's first row, so fp32 keeps its accuracy (2e-7 here, as
    without the stage; recentred on row 0, ignoring the query offset, it was 5e-5)."""
    g = torch.Generator().manual_seed(3)
    m, n = 3000, 5
    q = torch.randn(1, 4, n, 32, generator=g)
    k, v = torch.randn(1, 4, m, 32, generator=g), torch.randn(1, 4, m, 32, generator=g)
    slopes = torch.tensor([1.0, 0.5, 0.0625, 2.0 ** -8])
    out = attention(q, k, v, score_mod=ops.AlibiSlopes(), mask_mod=ops.Causal(),
                    buffers={"slopes": slopes}, q_offset=m - n, cache=AttentionCache(),
                    schedule=Schedule(block_m=16, block_n=64))
    want = _reference(q, k, v, slopes, m - n)
    assert float((out.double() - want).norm() / want.norm()) < 1e-6


def test_a_per_row_bias_of_a_user_score():
    """``score + bias[h, i]`` (a per-row term the softmax cancels, here exactly) and a
    non-causal distance: the same answer as float64."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 40, 32, generator=g) for _ in range(3))
    bias = torch.randn(2, 40, generator=g) * 30

    def score_mod(s, b, h, i, j, bias):
        return s + bias[h, i] + 0.3 * nf.cast(j - i, "float32")

    out = attention(q, k, v, score_mod=score_mod, buffers={"bias": bias},
                    cache=AttentionCache(), schedule=Schedule(block_m=16, block_n=16))
    qd, kd, vd = (t.double() for t in (q, k, v))
    s = qd @ kd.transpose(-1, -2) * 32 ** -0.5
    s = s + bias.double()[:, :, None] + 0.3 * (torch.arange(40)[None, :] -
                                              torch.arange(40)[:, None])
    want = torch.softmax(s, -1) @ vd
    assert float((out.double() - want).norm() / want.norm()) < 2e-6
