"""An augmented state shares the member a producer already accumulates.

Entropy's repair closed as ``[g, g + exp(x - m)]``: two accumulators, each reduced per tile
with its own per-element term. The same span has the basis ``[g, exp(x - m)]``, whose
second member is the softmax sum ``l`` itself (algebra/augmented.py, "Shared
components"): the kernel reads ``l``'s state for it and reduces one tile sum less. KL
divergence likewise shares the target's sum. Each compiled result is compared with
float64 on fresh data under several tiles (a masked last one), one tile and split-k, and
with peaked rows, where the running maximum jumps by tens between tiles; a plain
producer (the variance's mean) is never shared, so the Welford state stays centred.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import neptune_fusion as nf
from neptune_fusion.bench.chains import CHAINS
from neptune_fusion.codegen.source import generate
from neptune_fusion.fusion.plan import plan
from neptune_fusion.runtime.pipeline import build_programs
from neptune_fusion.schedule.schedule import Schedule

SCHEDULES = {
    "tiles": Schedule(block_m=2, block_n=16, num_warps=1),
    "one-tile": Schedule(block_m=2, block_n=128, num_warps=1),
    "split": Schedule(block_m=2, block_n=16, num_warps=1, strategy="split", splits=3),
}


def _entropy(d):
    n = nf.size("N")
    x = nf.placeholder((n, d), name="x")
    k = nf.reduce_axis(d, "k")
    m = nf.compute((n,), lambda i: nf.max(x[i, k], k), name="m")
    l = nf.compute((n,), lambda i: nf.sum(nf.exp(x[i, k] - m[i]), k), name="l")  # noqa: E741
    h = nf.compute((n,), lambda i: -nf.sum(nf.exp(x[i, k] - m[i]) / l[i]
                                           * (x[i, k] - m[i] - nf.log(l[i])), k), name="h")
    return [h], [x]


def _kl(d):
    n = nf.size("N")
    x = nf.placeholder((n, d), name="x")
    y = nf.placeholder((n, d), name="y")
    k = nf.reduce_axis(d, "k")

    def stats(t, nm):
        m = nf.compute((n,), lambda i: nf.max(t[i, k], k), name=f"m{nm}")
        s = nf.compute((n,), lambda i: nf.sum(nf.exp(t[i, k] - m[i]), k), name=f"l{nm}")
        return lambda i: t[i, k] - m[i] - nf.log(s[i])
    lx, ly = stats(x, "x"), stats(y, "y")
    kl = nf.compute((n,), lambda i: nf.sum(nf.exp(ly(i)) * (ly(i) - lx(i)), k), name="kl")
    return [kl], [x, y]


def _data(rng, shape, peaked):
    x = rng.standard_normal(shape)
    if peaked:   # the maximum moves by tens between tiles: the repair's shift is large
        ramp = np.linspace(0.0, 40.0, shape[1])[::-1]
        x = x * 12.0 + ramp * (rng.random(shape[0]) > 0.5)[:, None]
    return x.astype(np.float32)


def _want_entropy(x):
    return torch.distributions.Categorical(logits=x.double()).entropy()


def _want_kl(x, y):
    lx, ly = torch.log_softmax(x.double(), -1), torch.log_softmax(y.double(), -1)
    return (ly.exp() * (ly - lx)).sum(-1)


def test_entropy_and_kl_share_the_producers_sum_and_the_variance_does_not():
    for name, member, producer in (("softmax-entropy", "entropy", "l"),
                                   ("kl-divergence", "kl", "ly")):
        outs, _ = CHAINS[name].build("float32")
        p = plan(outs)
        [m] = [m for g in p.groups for m in g.members if m.name.startswith(member)]
        assert m.repair.method == "augmented"
        [(i, k)] = m.repair.shared
        assert i == 1 and p.name(m.repair.producers[k]) == producer
        assert f"{m.state_names[1]} = {producer}" in str(p)
    for name in ("variance", "layer-stats"):
        outs, _ = CHAINS[name].build("float32")
        members = [m for g in plan(outs).groups for m in g.members]
        assert all(not m.repair or not m.repair.shared for m in members)


def test_the_entropy_loop_reduces_one_sum_less():
    """Per tile: the maximum, ``l`` and the entropy's own sum -- not a fourth."""
    outs, ins = _entropy(64)
    [prog] = build_programs(plan(outs), ins, SCHEDULES["tiles"], "h")
    loop = generate(prog).split("for k0 in range(")[1].split("# boundary tiles")[0]
    assert len(re.findall(r"tl\.sum\(", loop)) == 2
    assert len(re.findall(r"_nf_max\(", loop)) == 1


@pytest.mark.parametrize("peaked", [False, True])
@pytest.mark.parametrize("how", list(SCHEDULES))
@pytest.mark.parametrize("shape", [(3, 45), (4, 100)])
def test_entropy_matches_float64(shape, how, peaked, rng):
    x = torch.tensor(_data(rng, shape, peaked))
    outs, ins = _entropy(shape[1])
    [h] = nf.compile(outs, inputs=ins, schedule=SCHEDULES[how])(x)
    want = _want_entropy(x)
    assert torch.allclose(h.double(), want, rtol=2e-5, atol=2e-5), (h, want)


@pytest.mark.parametrize("peaked", [False, True])
@pytest.mark.parametrize("how", list(SCHEDULES))
@pytest.mark.parametrize("shape", [(3, 45), (4, 100)])
def test_kl_matches_float64(shape, how, peaked, rng):
    x = torch.tensor(_data(rng, shape, peaked))
    y = torch.tensor(_data(rng, shape, peaked))
    outs, ins = _kl(shape[1])
    [kl] = nf.compile(outs, inputs=ins, schedule=SCHEDULES[how])(x, y)
    want = _want_kl(x, y)
    assert torch.allclose(kl.double(), want, rtol=5e-5, atol=2e-5), (kl, want)
