"""The compiled backward of attention as the H200 would get it (docs/autodiff.md, "The
generated kernels"): ``delta`` once, kernels that do not recompute it per tile, and a
cost-model problem whose schedules fit the device.

The kernels are built for CPU stand-ins (nothing runs); the schedule is ranked with the
cost model's description of the H200, as the auto-scheduler does on that GPU.
"""

from __future__ import annotations

import pytest
import torch

from neptune_fusion.frontend.attention import AttentionSpec, attention_definition
from neptune_fusion.frontend.attention_grad import BackwardKernels, build_backward
from neptune_fusion.ops import Causal, SoftCap
from neptune_fusion.runtime.staged import StagedKernel
from neptune_fusion.schedule import space
from neptune_fusion.schedule.cost import rank
from neptune_fusion.schedule.space import candidates

S = 4096


class _Forward:
    """What :func:`build_backward` reads of a forward kernel: its definition."""

    def __init__(self, head_dim: int, hq: int = 16, hkv: int = 16, score_mod=None) -> None:
        spec = AttentionSpec(dtype="float16", q_heads=hq, kv_heads=hkv, head_dim=head_dim,
                             v_head_dim=head_dim, scale=head_dim ** -0.5,
                             score_mod=score_mod, mask_mod=Causal(), q_offset=0, lse=True)
        self.outputs, self.inputs = attention_definition(spec)


def _stand_ins(kernel) -> list[torch.Tensor]:
    out = []
    for p in kernel.inputs:
        shape = [d if isinstance(d, int) else (1 if d.name == "B" else S) for d in p.shape]
        row = torch.empty(shape[-1:], dtype=getattr(torch, p.dtype.name))
        out.append(row.expand(shape))
    return out


def _h200_best(kernel):
    problem, _, _ = kernel.space_for(*_stand_ins(kernel))
    return problem, rank(problem, candidates(problem, space.H200, kernel.base), space.H200)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_delta_once_and_schedules_that_fit_an_h200(head_dim):
    kernels, group = build_backward(_Forward(head_dim), False)
    assert isinstance(kernels, BackwardKernels) and group == 1
    assert [p.name for p in kernels.delta.inputs] == ["o", "d_o"]
    for k in (kernels.dq, kernels.dkv):
        # one fused loop each (no staged delta pass), reading delta, not o
        assert not isinstance(k, StagedKernel)
        assert [p.name for p in k.inputs] == ["q", "k", "v", "d_o", "lse", "delta"]
        problem, ranked = _h200_best(k)
        # the two score-side dots (q.k over c, d_o.v over e) stream a tile each: their
        # widths add up (they were multiplied, 64 x 64: no schedule fitted shared memory)
        assert problem.inner == 2 * head_dim and problem.col == head_dim
        # fp16 tiles; the float32 lse and delta streamed beside them do not make it fp32
        assert problem.itemsize == 2 and not problem.fp32
        assert ranked and ranked[0].schedule.block_m >= 64
        src = "\n".join(g.source for g in k.kernel_of(ranked[0].schedule).kernels)
        assert "o_ptr" not in src.replace("d_o_ptr", "")
        # no reduction in the loop bodies but the dots: delta is loaded, not recomputed
        assert "tl.sum(" not in src


def test_gqa_and_softcap_backward_keep_delta_apart():
    kernels, group = build_backward(_Forward(64, hq=8, hkv=2, score_mod=SoftCap(50.0)), False)
    assert group == 4 and kernels.delta is not None
    _, ranked = _h200_best(kernels.dkv)
    assert ranked


def _loop_bodies(src: str) -> list[str]:
    """The text of each ``for`` loop of a kernel's source (its indented body; a loop
    inside ``if not LOOP_EVEN:`` too)."""
    bodies, cur, depth = [], None, 0
    for line in src.splitlines():
        indent = len(line) - len(line.lstrip())
        if line.lstrip().startswith("for "):
            cur, depth = [], indent
            bodies.append(cur)
        elif cur is not None and indent > depth:
            cur.append(line)
        else:
            cur = None
    return ["\n".join(b) for b in bodies]


@pytest.mark.parametrize("head_dim", [64, 128])
def test_each_tile_is_loaded_once_per_iteration(head_dim):
    """``k[j, c]`` for ``q . k`` (over ``c``) and ``k[j, c']`` for ``dS . k`` (output
    column ``c'``) are one tile: loaded once, the second use ``tl.trans`` of the first (as
    ``q``/``qT`` and ``d_o``/``d_oT`` in the d_k, d_v loop). They were loaded twice."""
    kernels, _ = build_backward(_Forward(head_dim), False)
    for k, reused in ((kernels.dq, ("k",)), (kernels.dkv, ("q", "d_o"))):
        _, ranked = _h200_best(k)
        src = "\n".join(g.source for g in k.kernel_of(ranked[0].schedule).kernels)
        bodies = _loop_bodies(src)
        assert len(bodies) >= 2
        for body in bodies:
            for name in ("q", "k", "v", "d_o", "lse", "delta"):
                assert body.count(f"tl.load({name}_base ") <= 1, (name, body)
            for name in reused:
                assert body.count(f"tl.load({name}_base ") == 1
                assert f"= tl.trans({name}T" in body, body


def test_each_kernel_launches_its_longest_row_blocks_first():
    """Causal d_q: the last query rows visit the most key tiles, so the row blocks run
    last to first. d_k, d_v: the *first* key rows visit the most query tiles (their loop
    runs from the diagonal to the end), so the natural order is the heaviest first; it
    was reversed (the inner bound ``full_hi`` reads the row), leaving the longest
    programs for the grid's tail."""
    kernels, _ = build_backward(_Forward(64), False)
    reverse = "pid_row = tl.num_programs(0) - 1 - tl.program_id(0)"
    for k, want in ((kernels.dq, True), (kernels.dkv, False)):
        _, ranked = _h200_best(k)
        src = "\n".join(g.source for g in k.kernel_of(ranked[0].schedule).kernels)
        assert (reverse in src) is want, src


def test_the_backward_source_script_prints_both_kernels(capsys):
    """``benchmarks/backward_source.py`` (for the lead's dumps on the GPU machine)."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).parents[2] / "benchmarks" / "backward_source.py"
    spec = importlib.util.spec_from_file_location("backward_source", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["PF-Causal", "--head-dim", "64", "--seq", "1024", "--top", "2"]) == 0
    out = capsys.readouterr().out
    for name in ("delta", "dq", "dkv"):
        assert f"##### {name}: NVIDIA H200" in out
    assert "def attention_backward_dq(" in out and "def attention_backward_dkdv(" in out
    assert "# [1] rolling " in out


def test_dkdv_is_compiled_per_length_class_and_skips_an_empty_tail():
    """d_k, d_v: ``static_sizes`` (12 % on the H200 at S = 4096) and its ragged-tail loop
    (queries past the last multiple of BLOCK_N; causal bounds the loop from below only)
    compiled out when the length divides (``LOOP_EVEN``: 4 % more). d_q keeps one kernel
    for every length (specialised, it measured 2 % slower)."""
    kernels, _ = build_backward(_Forward(128), False)
    assert kernels.dkv.base.static_sizes and not kernels.dq.base.static_sizes
    _, ranked = _h200_best(kernels.dkv)
    src = kernels.dkv.kernel_of(ranked[0].schedule).kernels[0].source
    assert "do_not_specialize" not in src and "LOOP_EVEN: tl.constexpr" in src
    tail = src[src.index("    if not LOOP_EVEN:\n"):]
    assert tail.splitlines()[1].startswith("        for ") and "range(i_full_hi, N," in tail
    _, ranked = _h200_best(kernels.dq)
    src = kernels.dq.kernel_of(ranked[0].schedule).kernels[0].source
    assert "do_not_specialize" in src and "LOOP_EVEN" not in src


def test_masked_tiles_compute_p_once():
    """A mask's derivative that ``p`` already applies is dropped (``autodiff/masks.py``):
    ``d_qk = where(j <= i, d_s, 0) * scale`` is ``d_s * scale``, since ``p = exp(s -
    lse)`` is 0 where the mask fails. The d_k, d_v kernel's masked tiles computed ``p``
    twice (the select folded into one exponent, not the other), the d_q kernel's anded
    the mask with itself."""
    kernels, _ = build_backward(_Forward(128), False)
    for k in (kernels.dq, kernels.dkv):
        _, ranked = _h200_best(k)
        src = "\n".join(g.source for g in k.kernel_of(ranked[0].schedule).kernels)
        for body in _loop_bodies(src):
            assert body.count("tl.exp2(") == 1, body
            assert body.count("offs_jj[None, :] <= offs_i[:, None]") <= 1, body


def test_the_library_form_never_materialises_the_scores():
    """d_q = dS . k is a product the library could run, but only after writing the rows x
    keys dS (1 GiB here): it is not offered (on the H200 the large-product rule had
    picked it, 1.6 ms against 0.41 for the fused kernel). A norm before a projection,
    whose computed operand is the size of its input, still gets it."""
    import neptune_fusion as nf
    kernels, _ = build_backward(_Forward(128, hq=32, hkv=32), False)
    problem, _ = _h200_best(kernels.dq)
    assert problem.contraction and kernels.dq._library(problem, space.H200) == []
    n, d, e = 4096, 4096, 4096
    x = nf.placeholder((n, d), "float16", name="x")
    w = nf.placeholder((d, e), "float16", name="w")
    r = nf.reduce_axis(d, "r")
    ms = nf.compute((n,), lambda i: nf.sum(x[i, r] * x[i, r], r) / d, name="ms")
    y = nf.compute((n, e), lambda i, c: nf.sum(x[i, r] * nf.rsqrt(ms[i] + 1e-6) * w[r, c], r),
                   name="y")
    proj = nf.compile([y])
    stand = [torch.empty(d, dtype=torch.float16).expand(n, d),
             torch.empty(e, dtype=torch.float16).expand(d, e)]
    problem, _, _ = proj.space_for(*stand)
    assert [e.schedule.strategy for e in proj._library(problem, space.H200)] == ["library"]
