"""The tuner's reference check: the float64 reference at a sample of output elements,
within a fixed element budget, whatever the problem size (static sizes included)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from algebra.chains import FUSABLE, min_chain, prod_chain, tanh_chain
from neptune_fusion.frontend.examples import plain_attention
from neptune_fusion.ir.graph import placeholders
from neptune_fusion.reference.sample import (
    ELEMENT_BUDGET,
    PER_AXIS,
    BudgetExceeded,
    ElementBudget,
    TorchSource,
    evaluate_at,
    pick,
    sampled_reference,
)

CHAINS = dict(FUSABLE, tanh_chain=tanh_chain, prod_chain=prod_chain, min_chain=min_chain)


class Synthetic:
    """An input too large to hold: element ``flat`` is ``sin(flat * 0.754877 + 0.3)``,
    computed only where a load reads it; counts what it was asked for."""

    def __init__(self, shape) -> None:
        self.shape = tuple(shape)
        self.gathered = 0

    def value(self, flat):
        return np.sin(np.asarray(flat, dtype=np.float64) * 0.754877666 + 0.3)

    def gather(self, idx):
        flat = 0
        for ix, stride in zip(idx, self.strides()):
            flat = flat + ix * stride
        got = self.value(flat)
        self.gathered += got.size
        return got

    def strides(self):
        return [math.prod(self.shape[d + 1:]) for d in range(len(self.shape))]

    def rows(self, *lead):
        """The full trailing block at leading indices ``lead`` (for the direct check)."""
        base = sum(i * s for i, s in zip(lead, self.strides()))
        n = math.prod(self.shape[len(lead):])
        return self.value(base + np.arange(n)).reshape(self.shape[len(lead):])


def _sources(outputs, feeds):
    by_name = {p.name: p for p in placeholders(outputs)}
    return {by_name[k]: TorchSource(torch.as_tensor(np.asarray(v))) for k, v in feeds.items()}


@pytest.mark.parametrize("name", sorted(CHAINS))
@pytest.mark.parametrize("per_axis", [(None,), (4,), (2,), (1,)])
def test_sampled_reference_equals_the_plain_one(name, per_axis, rng):
    outputs, feeds = CHAINS[name]()
    f = feeds(rng)
    want = nf.evaluate(outputs, f)
    got = sampled_reference(outputs, _sources(outputs, f), seed=int(rng.integers(1 << 30)),
                            per_axis=per_axis)
    assert got.skipped is None and 0 < got.elements <= ELEMENT_BUDGET
    for grid, val, w, o in zip(got.grids, got.values, want, outputs):
        assert len(grid) == len(o.shape)
        if per_axis == (None,):
            assert val.shape == w.shape
        assert np.abs(val).max() > 0     # the data is random, not zeros
        np.testing.assert_allclose(val, w[np.ix_(*grid)] if grid else w, rtol=1e-12,
                                   atol=1e-12, equal_nan=True)


def test_symbolic_sizes_and_a_torch_source_on_the_sample(rng):
    (o,), _ = plain_attention()
    f = {"q": rng.standard_normal((29, 16)), "k": rng.standard_normal((33, 16)),
         "v": rng.standard_normal((33, 16))}
    want = nf.evaluate([o], f)[0]
    got = sampled_reference([o], _sources([o], f), seed=3, per_axis=(4,))
    (rows, cols), = got.grids
    assert rows[-1] == 28 and rows[0] == 0 and len(rows) == 4 and len(cols) == 4
    np.testing.assert_allclose(got.values[0], want[np.ix_(rows, cols)], rtol=1e-12)


def test_pick_keeps_the_boundary_and_is_distinct():
    r = np.random.default_rng(0)
    assert pick(100, 1, r).tolist() == [99]
    assert pick(100, 2, r).tolist() == [0, 99]
    got = pick(100, 4, r)
    assert len(set(got.tolist())) == 4 and got[0] == 0 and got[-1] == 99
    assert pick(3, 4, r).tolist() == [0, 1, 2] and pick(5, None, r).tolist() == list(range(5))


def test_budget_refuses_before_making_a_value(rng):
    outputs, feeds = FUSABLE["softmax"]()
    f = feeds(rng)
    src = _sources(outputs, f)
    grids = [tuple(np.arange(n) for n in np.asarray(f["x"]).shape)]
    with pytest.raises(BudgetExceeded, match="budget of 10"):
        evaluate_at(outputs, src, grids, ElementBudget(10))
    got = sampled_reference(outputs, src, seed=0, budget=10)
    assert got.skipped and "reference check skipped" in got.skipped and got.values == ()
    assert got.elements <= len(PER_AXIS) * 10


def _static_attention(heads=32, n=4096, d=64):
    """Attention with Python-int sizes, written with nf.compute: 32 x 4096 x 4096 x 64."""
    q, k, v = (nf.placeholder((heads, n, d), name=x) for x in "qkv")
    c, j = nf.reduce_axis(d, "c"), nf.reduce_axis(n, "j")
    s = nf.compute((heads, n, n), lambda h, i, jj: nf.sum(q[h, i, c] * k[h, jj, c], c)
                   * (1 / math.sqrt(d)), name="s")
    m = nf.compute((heads, n), lambda h, i: nf.max(s[h, i, j], j), name="m")
    l = nf.compute((heads, n), lambda h, i: nf.sum(nf.exp(s[h, i, j] - m[h, i]), j),  # noqa: E741
                   name="l")
    o = nf.compute((heads, n, d), lambda h, i, e: nf.sum(
        nf.exp(s[h, i, j] - m[h, i]) * v[h, j, e], j) / l[h, i], name="o")
    return o, (q, k, v)


def test_check_of_a_large_static_attention_stays_small():
    o, (q, k, v) = _static_attention()
    src = {p: Synthetic(p.shape) for p in (q, k, v)}
    got = sampled_reference([o], src, seed=5)
    # the full float64 reference would make the 32 x 4096 x 4096 scores several times
    # (over 5e8 elements each); the sample stays within its budget per attempt
    assert got.skipped is None
    assert got.elements <= len(PER_AXIS) * ELEMENT_BUDGET
    assert sum(s.gathered for s in src.values()) <= len(PER_AXIS) * ELEMENT_BUDGET
    (hs, rows, cols), = got.grids
    assert len(hs) * len(rows) * len(cols) >= 1 and rows[-1] == 4095
    for a, h in enumerate(hs):          # the same elements computed directly in NumPy
        kk, vv = src[k].rows(h), src[v].rows(h)
        for b, i in enumerate(rows):
            sc = kk @ src[q].rows(h, i) / 8.0
            p = np.exp(sc - sc.max())
            want = (p @ vv) / p.sum()
            np.testing.assert_allclose(got.values[0][a, b], want[cols], rtol=1e-10)


def test_check_of_a_wide_static_softmax_stays_small():
    rows, cols = 4096, 1 << 20
    x = nf.placeholder((rows, cols), name="x")
    j = nf.reduce_axis(cols, "j")
    m = nf.compute((rows,), lambda i: nf.max(x[i, j], j), name="m")
    l = nf.compute((rows,), lambda i: nf.sum(nf.exp(x[i, j] - m[i]), j), name="l")  # noqa: E741
    y = nf.compute((rows, cols), lambda i, jj: nf.exp(x[i, jj] - m[i]) / l[i], name="y")
    src = {x: Synthetic(x.shape)}
    got = sampled_reference([y], src, seed=9)
    assert got.skipped is None
    assert got.elements <= len(PER_AXIS) * ELEMENT_BUDGET
    (rs, cs), = got.grids
    for a, i in enumerate(rs):
        row = src[x].rows(i)
        p = np.exp(row - row.max())
        np.testing.assert_allclose(got.values[0][a], p[cs] / p.sum(), rtol=1e-10)


# ------------------------------------------------------------------ the tuner's use of it
def _softmax(rows, cols):
    x = nf.placeholder((rows, cols), name="x")
    j = nf.reduce_axis(cols, "j")
    m = nf.compute((rows,), lambda i: nf.max(x[i, j], j), name="m")
    l = nf.compute((rows,), lambda i: nf.sum(nf.exp(x[i, j] - m[i]), j), name="l")  # noqa: E741
    y = nf.compute((rows, cols), lambda i, jj: nf.exp(x[i, jj] - m[i]) / l[i], name="y")
    return y, x


@pytest.mark.parametrize("static", [True, False])
def test_the_tuners_check_accepts_a_kernel_and_catches_a_wrong_element(static):
    from neptune_fusion.runtime.tune import (
        check_sample,
        check_sizes,
        random_inputs,
        reference_sample,
    )
    rows, cols = (29, 33) if static else (nf.size("R"), nf.size("C"))
    y, x = _softmax(rows, cols)
    kern = nf.compile(y, [x])
    sizes = {} if static else {rows: 29, cols: 200}         # C shrinks to 80 + 200 % 16
    feeds = random_inputs([x], check_sizes(sizes), "cpu", seed=7)
    assert feeds[0].shape == ((29, 33) if static else (29, 88))
    assert feeds[0].std() > 0.5                               # fresh N(0, 1) data
    got = kern.kernel_for(*feeds).launch(*feeds).outputs
    sample = reference_sample([y], [x], feeds, seed=7, budget=None)
    assert sample.skipped is None and sample.grids[0][0].size == 29   # all of it fits
    assert check_sample(got, sample, ["float32"]) is None
    got[0][-1, -1] += 0.5                                     # the last element: sampled
    assert "reference check: max error" in check_sample(got, sample, ["float32"])
    small = reference_sample([y], [x], feeds, seed=7, budget=3000)  # only a few elements
    assert small.skipped is None and small.grids[0][0].size < 29
    assert "reference check" in check_sample(got, small, ["float32"])


def test_first_launches_pool_and_errors():
    """Candidates' first launches in threads: each result lands under its schedule, a
    build or launch failure is returned (not raised) for that candidate alone, and a
    kernel without generated specs (a library schedule) is left to the caller."""
    import threading

    from neptune_fusion.runtime.tune import first_launches
    from neptune_fusion.schedule.schedule import Schedule
    seen = set()

    class Fake:
        specs = ("spec",)

        def __init__(self, s):
            self.s = s

        def launch(self, *t):
            seen.add(threading.get_ident())
            if self.s.block_m == 32:
                raise RuntimeError("out of resource: shared memory")
            return type("R", (), {"outputs": [t[0] * self.s.block_m]})()

    class Library:
        def launch(self, *t):
            raise AssertionError("not launched here")

    scheds = [Schedule(block_m=m) for m in (16, 32, 64, 128)] + \
        [Schedule(strategy="library")]

    def build(s):
        if s.block_m == 128 and s.strategy != "library":
            raise nf.CodegenError("no kernel")
        return Library() if s.strategy == "library" else Fake(s)
    x = torch.ones(3)
    got = first_launches(build, scheds, [x])
    assert set(got) == set(scheds[:4])
    kern, outs, secs = got[scheds[0]]
    assert kern.s == scheds[0] and torch.equal(outs[0], x * 16) and secs >= 0
    assert torch.equal(got[scheds[2]][1][0], x * 64)
    assert isinstance(got[scheds[1]], RuntimeError)
    assert isinstance(got[scheds[3]], nf.CodegenError)
    assert threading.get_ident() not in seen           # pooled: launched in threads
    assert first_launches(build, scheds[:1] + scheds[2:3], [x], threads=False) == {}


def test_a_float32_output_of_bfloat16_inputs_is_checked_at_bfloat16s_tolerance():
    """The gradient kernels of a bf16 GQA attention write float32 ``d_k``, ``d_v`` per
    query head (summed over the group after) but round ``p`` and ``dS`` to bf16 for
    their products: on the GPU the tuner checked them at float32's tolerance and refused
    every candidate ("every candidate schedule failed") for most random check problems.
    The same check on the interpreter, at bf16's."""
    from neptune_fusion.frontend.attention import AttentionSpec, attention_definition
    from neptune_fusion.frontend.attention_grad import build_backward
    from neptune_fusion.ops import Causal
    from neptune_fusion.runtime.tune import (
        check_dtypes,
        check_sample,
        check_sizes,
        random_inputs,
        reference_sample,
    )

    class Forward:
        def __init__(self):
            spec = AttentionSpec(dtype="bfloat16", q_heads=2, kv_heads=1, head_dim=64,
                                 v_head_dim=64, scale=0.125, score_mod=None,
                                 mask_mod=Causal(), q_offset=0, lse=True)
            self.outputs, self.inputs = attention_definition(spec)

    dkv = build_backward(Forward(), False)[0].dkv
    assert [o.dtype.name for o in dkv.outputs] == ["float32", "float32"]
    assert check_dtypes(dkv.outputs) == ["bfloat16", "bfloat16"]
    sizes = {d: 1 if d.name == "B" else 200 for p in dkv.inputs for d in p.shape
             if not isinstance(d, int)}
    small = check_sizes(sizes)                                # 200 -> 88
    strict = 0
    for seed in range(3):
        feeds = random_inputs(dkv.inputs, small, "cpu", seed=seed)
        assert all(t.float().std() > 0.5 for t in feeds)        # fresh N(0, 1) data
        want = reference_sample(dkv.outputs, dkv.inputs, feeds, seed)
        got = dkv.kernel_for(*feeds).launch(*feeds).outputs
        assert check_sample(got, want, check_dtypes(dkv.outputs)) is None
        strict += check_sample(got, want, ["float32", "float32"]) is not None
    assert strict >= 1          # what the check said before: it can fail here
    got[0][0, 0, -1, 0] += 0.2 * float(got[0].abs().max())    # a wrong element: caught
    assert "reference check" in check_sample(got, want, check_dtypes(dkv.outputs))


def test_failures_name_each_reason_once_with_its_schedules():
    from neptune_fusion.runtime.tune import Trial, failures
    from neptune_fusion.schedule.schedule import Schedule
    a, b, c = (Schedule(block_m=m, block_n=64) for m in (16, 32, 64))
    got = failures([Trial(a, 1e-6, error="reference check: max error 0.3 > 0.2"),
                    Trial(b, 1e-6, error="cannot print"),
                    Trial(c, 1e-6, error="reference check: max error 0.3 > 0.2")])
    assert got == (f"reference check: max error 0.3 > 0.2 ({a.brief()}, {c.brief()}); "
                   f"cannot print ({b.brief()})")
