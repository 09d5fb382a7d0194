"""Schedules as data (JSON, validation), the cost model's space, and schedule="auto" with
its persistent cache, on CPU (the interpreter: the cost model alone chooses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import neptune_fusion as nf
from algebra.chains import tanh_chain, variance
from neptune_fusion import ops
from neptune_fusion.errors import ScheduleError, UnschedulableError
from neptune_fusion.runtime.disk_cache import DiskCache
from neptune_fusion.schedule.cost import check_resources, estimate, rank
from neptune_fusion.schedule.schedule import Schedule
from neptune_fusion.schedule.space import CPU, H200, Problem, candidates, wants_split

SRC = Path(__file__).resolve().parents[2] / "src"
PREFILL = Problem(rows=16384, loop=16384, programs=32, inner=128, col=128)
DECODE = Problem(rows=1, loop=16384, programs=32, inner=128, col=128)


# ------------------------------------------------------------------ schedules as data
def test_json_round_trip():
    s = Schedule(block_m=64, block_n=32, num_warps=4, num_stages=2, exp2=False,
                 strategy="split", splits=7)
    text = s.to_json()
    assert json.loads(text)["splits"] == 7
    assert Schedule.from_json(text) == s
    assert Schedule.from_dict(s.to_dict()) == s
    assert Schedule.from_json('{"block_n": 128}') == Schedule(block_n=128)


@pytest.mark.parametrize("fields,msg", [
    ({"block_m": 48}, "block_m must be a power of two in"),
    ({"block_n": 0}, "block_n must be a power of two in"),
    ({"block_n": True}, "block_n must be a power of two"),
    ({"num_warps": 3}, "num_warps must be one of 1, 2, 4, 8, 16"),
    ({"num_stages": 0}, r"num_stages must be an int in \[1, 8\]"),
    ({"fp32_precision": "tf64"}, "fp32_precision must be one of ieee, tf32"),
    ({"strategy": "multipass"}, "strategy must be one of rolling, split"),
    ({"strategy": "split", "splits": 0}, "splits must be an int >= 1"),
    ({"splits": 4}, "splits=4 needs strategy='split'"),
    ({"exp2": 1}, "exp2 must be a bool"),
    ({"tiles": 3}, r"unknown field\(s\) tiles"),
])
def test_every_validation_error(fields, msg):
    with pytest.raises(ScheduleError, match=msg):
        Schedule.from_json(json.dumps(fields))


def test_bad_json():
    with pytest.raises(ScheduleError, match="not JSON"):
        Schedule.from_json("{block_m: 64")
    with pytest.raises(ScheduleError, match="must be an object"):
        Schedule.from_json("[64]")


def test_shared_memory_exceeded():
    big = Schedule(block_m=128, block_n=128, num_stages=4)
    with pytest.raises(ScheduleError, match=r"shared memory exceeded: block_m=128, "
                                            r"block_n=128, num_stages=4 .* 288 KiB"):
        check_resources(PREFILL, big, H200)
    check_resources(PREFILL, Schedule(block_m=128, block_n=128, num_stages=3), H200)
    assert not estimate(PREFILL, big, H200).feasible


def test_strategy_the_plan_cannot_run():
    outs, _ = tanh_chain()
    with pytest.raises(UnschedulableError, match="strategy 'rolling': the plan is not "
                                                 "single-pass"):
        nf.compile(outs, schedule=Schedule(), require_single_pass=True)
    var, feeds = variance()
    # split-k of a running sum's consumer is legal since 2026-12-04
    # (tests/codegen/test_split_epilogue.py); a mask-partitioned one is refused there
    nf.compile(var, schedule=Schedule(block_m=16, block_n=16, strategy="split", splits=2))
    with pytest.raises(ScheduleError, match="schedule must be 'auto', a Schedule"):
        nf.compile(var, schedule="fastest")


# ------------------------------------------------------------------ the space and the model
def test_space_strategy_from_shapes():
    assert wants_split(DECODE, H200) and not wants_split(PREFILL, H200)
    dec = candidates(DECODE, H200)
    assert dec and all(s.strategy == "split" and s.block_m == 16 for s in dec)
    assert {s.splits for s in dec} == {2, 4, 9, 18}        # around 2 programs per SM
    pre = candidates(PREFILL, H200)
    assert pre and all(s.strategy == "rolling" for s in pre)
    assert len(pre) == len(set(pre)) == 36


def test_rank_drops_infeasible_and_orders():
    ranked = rank(PREFILL, candidates(PREFILL, H200), H200)
    assert all(e.feasible for e in ranked)
    assert all(a.seconds <= b.seconds for a, b in zip(ranked, ranked[1:]))
    assert len(ranked) < 36                                   # 4 stages of 128-wide tiles
    best = ranked[0].schedule
    assert best.block_m == 128 and best.num_warps == 8       # big tiles for prefill


# ------------------------------------------------------------------ schedule="auto" + cache
def _small_causal():
    [o], ins = ops.definition("PF-Causal", "float32", 32, 2, 2)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 2, 70, 32, generator=g)
    k = torch.randn(1, 2, 70, 32, generator=g)
    v = torch.randn(1, 2, 70, 32, generator=g)
    return o, ins, (q, k, v)


def _ref(q, k, v):
    s = (q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5
    n = s.shape[-1]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v.double()


def test_auto_cache_miss_hit_and_corruption(tmp_path):
    o, ins, (q, k, v) = _small_causal()
    store = DiskCache(tmp_path)
    first = nf.compile(o, ins, cache=store)
    assert isinstance(first, nf.AutoKernel)
    out = first(q, k, v)
    assert (out.double() - _ref(q, k, v)).abs().max() < 1e-4
    assert first.last_choice.source == "model"                 # CPU: the cost model chose
    [entry] = store.entries()
    assert Schedule.from_dict(entry["record"]["schedule"]) == first.last_choice.schedule
    # a new compile (think: a new process) finds it on disk
    again = nf.compile(o, ins, cache=store)
    again(q, k, v)
    assert again.last_choice.source == "cache"
    assert again.last_choice.schedule == first.last_choice.schedule
    # a corrupt entry is ignored (never trusted), the choice remade and the file rewritten
    path = store.path(again.last_choice.key)
    path.write_text(path.read_text()[:-20])
    third = nf.compile(o, ins, cache=store)
    assert (third(q, k, v).double() - _ref(q, k, v)).abs().max() < 1e-4
    assert third.last_choice.source == "model"
    assert store.get(third.last_choice.key) is not None
    # a well-formed entry holding an invalid schedule is not trusted either
    store.put(third.last_choice.key, {"schedule": {"block_m": 48}})
    fourth = nf.compile(o, ins, cache=store)
    fourth(q, k, v)
    assert fourth.last_choice.source == "model"


def _empty_then_one(device, tmp_path):
    """An auto kernel called with no rows and keys, then with one of each: the same shape
    class (sizes go to the next power of two, 0 to 1)."""
    o, ins, tensors = _small_causal()
    store = DiskCache(tmp_path)
    kern = nf.compile(o, ins, cache=store)
    q, k, v = (t.to(device) for t in tensors)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = kern(q[:, :, :0], k[:, :, :0], v[:, :, :0])
    assert out.shape == (1, 2, 0, 32)
    empty = kern.last_choice
    got = kern(q[:, :, :1], k[:, :, :1], v[:, :, :1]).cpu()
    assert (got.double() - _ref(*(t[:, :, :1].cpu() for t in (q, k, v)))).abs().max() < 1e-4
    return empty, kern.last_choice, store, [str(w.message) for w in seen]


def test_an_empty_call_neither_tunes_nor_is_remembered(tmp_path):
    """A zero size has nothing to time: the cost model's pick, kept neither on disk nor
    for the class, whose next (non-empty) call chooses afresh and is stored."""
    empty, one, store, _ = _empty_then_one("cpu", tmp_path)
    assert empty.source == "model"
    assert one.source == "model" and one.key == empty.key
    [entry] = store.entries()
    assert Schedule.from_dict(entry["record"]["schedule"]) == one.schedule


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_an_empty_call_is_not_tuned_on_the_gpu(tmp_path):
    """On a GPU an empty call used to be tuned: every candidate timed by capturing a launch
    of nothing (torch warned "The CUDA Graph is empty" per candidate) and the pick stored
    for the class of size 1."""
    empty, one, store, seen = _empty_then_one("cuda", tmp_path)
    assert empty.source == "model" and not any("Graph is empty" in m for m in seen)
    assert one.source == "measured" and len(store.entries()) == 1


def test_auto_key_separates_shape_classes(tmp_path):
    o, ins, (q, k, v) = _small_causal()
    store = DiskCache(tmp_path)
    kern = nf.compile(o, ins, cache=store)
    kern(q, k, v)
    kern(q[:, :, :20], k[:, :, :20], v[:, :, :20])           # 70 -> bucket 128, 20 -> 32
    assert len(store.entries()) == 2
    kern(q[:, :, :65], k[:, :, :65], v[:, :, :65])           # 65 shares 70's bucket
    assert len(store.entries()) == 2


def test_auto_log(tmp_path, capsys):
    o, ins, (q, k, v) = _small_causal()
    nf.compile(o, ins, cache=DiskCache(tmp_path), log=True)(q, k, v)
    err = capsys.readouterr().err
    assert "cost model only" in err and "block_m" in err
    nf.compile(o, ins, cache=DiskCache(tmp_path), log=True)(q, k, v)
    assert "schedule from the cache" in capsys.readouterr().err
    nf.compile(o, ins, cache=DiskCache(tmp_path), log=False)(q, k, v)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("sched", [
    Schedule(block_m=16, block_n=16, num_warps=4, num_stages=2),
    Schedule(block_m=32, block_n=64, partition=False, exp2=False),
    Schedule(block_m=16, block_n=32, strategy="split", splits=3),
])
def test_explicit_schedules_are_correct(sched):
    o, ins, (q, k, v) = _small_causal()
    kern = nf.compile(o, ins, schedule=sched.to_json() and json.loads(sched.to_json()))
    assert kern.schedule == sched
    assert (kern(q, k, v).double() - _ref(q, k, v)).abs().max() < 1e-4


WRITER = r"""
import sys, torch
sys.path.insert(0, {src!r})
import neptune_fusion as nf
from neptune_fusion import ops
[o], ins = ops.definition("PF-Causal", "float32", 32, 2, 2)
t = [torch.randn(1, 2, 70, 32) for _ in range(3)]
for n in (70, 40, 20, 10):
    nf.compile(o, ins)(*(x[:, :, :n] for x in t))
print("ok")
"""


def test_two_processes_share_the_cache(tmp_path):
    env = dict(os.environ, NEPTUNE_FUSION_CACHE_DIR=str(tmp_path))
    code = WRITER.format(src=str(SRC))
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and out.strip() == "ok", err[-2000:]
    store = DiskCache(tmp_path)
    entries = store.entries()
    assert len(entries) == 4                 # one per bucket, whoever wrote it last
    assert all(Schedule.from_dict(e["record"]["schedule"]) for e in entries)
    assert not list((tmp_path / "schedules").glob(".tmp-*"))


def test_cpu_device_model():
    assert CPU.sms == 8 and wants_split(Problem(1, 200, 2, 64, 64), CPU)


WARM = r"""
import sys, time
sys.path.insert(0, {src!r})
import torch
from neptune_fusion import ops
import neptune_fusion as nf
[o], ins = ops.definition("PF-Causal", "float32", 32, 2, 2)
x = [torch.randn(1, 2, 40, 32, generator=torch.Generator().manual_seed(k)) for k in range(3)]
t0 = time.perf_counter()
kern = nf.compile(o, ins)
inner = kern.kernel_for(*x)
t1 = time.perf_counter()
out = kern(*x)
print("sympy" in sys.modules, inner.from_cache, round((t1 - t0) * 1e3, 1),
      float(out.double().abs().sum()))
"""


def test_warm_compile_needs_no_algebra(tmp_path):
    """A second process compiles from the stored kernel specs: no SymPy, no lowering,
    the same result; the plan is still there on demand."""
    env = dict(os.environ, NEPTUNE_FUSION_CACHE_DIR=str(tmp_path))
    code = WARM.format(src=str(SRC))
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=300) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    cold, warm = (r.stdout.split() for r in runs)
    assert cold[:2] == ["True", "False"]
    assert warm[:2] == ["False", "True"]           # no SymPy imported, specs from the cache
    assert cold[3] == warm[3]                        # bit-identical output


def test_corrupt_launch_specs_are_rebuilt(tmp_path):
    o, ins, (q, k, v) = _small_causal()
    sched = Schedule(block_m=16, block_n=32)
    store = DiskCache(tmp_path)
    first = nf.compile(o, ins, schedule=sched, cache=store)
    assert not first.from_cache
    want = first(q, k, v)
    second = nf.compile(o, ins, schedule=sched, cache=store)
    assert second.from_cache and torch.equal(second(q, k, v), want)
    assert second.plan.single_pass and second.program.name == first.program.name
    launches = DiskCache(tmp_path, subdir="specs")
    for e in launches.entries():
        if "specs" in e["record"]:
            broken = {"specs": [dict(e["record"]["specs"][0], args=[["bogus"]])]}
            launches.put(e["key"], broken)
    third = nf.compile(o, ins, schedule=sched, cache=store)
    assert not third.from_cache and torch.equal(third(q, k, v), want)
    assert nf.compile(o, ins, schedule=sched, cache=store).from_cache    # rewritten


def test_measure_drops_wrong_and_failing_candidates(monkeypatch):
    """The GPU tuner's loop, run on CPU with a fake timer: a candidate that computes a
    wrong answer or fails to build never wins; the fastest correct one does."""
    import triton.testing

    from neptune_fusion.runtime import tune
    from neptune_fusion.runtime.kernel import LaunchResult
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    o, ins, (q, k, v) = _small_causal()
    auto = nf.compile(o, ins, cache=False)
    problem, device, space = auto.space_for(q, k, v)
    ranked = rank(problem, space, H200)[:4]
    wrong, broken = ranked[0].schedule, ranked[1].schedule
    fake_ms = {ranked[2].schedule: 2.0, ranked[3].schedule: 1.0, wrong: 0.1}

    class Wrong:
        schedule = wrong

        def launch(self, *t):
            return LaunchResult([torch.zeros(1, 2, t[0].shape[2], 32)], (1, 1), None)

    def build(s):
        if s == wrong:
            return Wrong()
        if s == broken:
            raise nf.CodegenError("no kernel for you")
        return auto.kernel_of(s)

    current = {}

    def fake_bench(fn, **kw):
        return fake_ms[fn.__defaults__[0].schedule]   # the kernel the timed lambda binds

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", fake_bench)

    def step(trial):
        current.pop("s", None)

    real_build = build

    def tracking_build(s):
        current["s"] = s
        return real_build(s)

    trials = tune.measure(tracking_build, ranked, [q, k, v], inputs=ins, outputs=[o],
                          sizes={s: 70 if s.name in "NM" else 1 for p in ins
                                 for s in p.shape if not isinstance(s, int)},
                          top_k=4, on_step=step)
    by = {t.schedule: t for t in trials}
    assert by[wrong].measured_s is None and "reference check" in by[wrong].error
    assert by[broken].measured_s is None and "no kernel for you" in by[broken].error
    assert tune.best(trials).schedule == ranked[3].schedule


def test_problem_streams_fp16_with_an_fp32_side_buffer():
    """ALiBi's float32 slopes must not make fp16 attention look like fp32 to the model."""
    [o], ins = ops.definition("DC-ALiBi", "float16", 64, 4, 4)
    auto = nf.compile(o, ins, cache=False)
    t = [torch.randn(1, 4, 1, 64).half(), torch.randn(1, 4, 300, 64).half(),
         torch.randn(1, 4, 300, 64).half()] + [torch.rand(4) for _ in ins[3:]]
    problem = auto.space_for(*t)[0]
    assert problem.itemsize == 2 and not problem.fp32
    assert problem.streamed == 2 * 4 * 300 * 64 * 2


def test_growing_kv_length_reuses_the_shape_class(monkeypatch):
    """A decode loop (KV length + 1 per step, a slice of a preallocated cache): one
    schedule choice per size bucket, every step correct."""
    [o], ins = ops.definition("DC-Causal", "float32", 32, 2, 2)
    auto = nf.compile(o, ins, cache=False)
    calls = []
    real = auto._choose
    monkeypatch.setattr(auto, "_choose", lambda t: calls.append(1) or real(t))
    g = torch.Generator().manual_seed(3)
    kc, vc = torch.randn(1, 2, 90, 32, generator=g), torch.randn(1, 2, 90, 32, generator=g)
    q = torch.randn(1, 2, 1, 32, generator=g)
    for n in range(70, 75):
        k, v = kc[:, :, :n], vc[:, :, :n]
        s = (q.double() @ k.double().transpose(-1, -2)) * 32 ** -0.5
        want = torch.softmax(s, -1) @ v.double()
        assert (auto(q, k, v).double() - want).abs().max() < 1e-4
    assert len(calls) == 1


def test_a_changed_compiler_does_not_reuse_the_cache(tmp_path, monkeypatch):
    """Cache keys carry a hash of the package's sources: what an older compiler stored
    (schedules, generated kernels) is not reused after the code changes."""
    from neptune_fusion import _version
    o, ins, (q, k, v) = _small_causal()
    store = DiskCache(tmp_path)
    sched = Schedule(block_m=16, block_n=32)
    nf.compile(o, ins, schedule=sched, cache=store)
    nf.compile(o, ins, cache=store)(q, k, v)
    assert nf.compile(o, ins, schedule=sched, cache=store).from_cache
    monkeypatch.setattr(_version, "_code_version", lambda: "another-compiler")
    assert not nf.compile(o, ins, schedule=sched, cache=store).from_cache
    again = nf.compile(o, ins, cache=store)
    again(q, k, v)
    assert again.last_choice.source == "model"
    assert again.last_choice.key["versions"]["code"] == "another-compiler"


def test_visited_share_matches_the_kernels_tile_count():
    """The cost model's visited-tile share: exactly the partition's own count when every
    row block is sampled, below 1 for causal, 1 for full attention."""
    from neptune_fusion.codegen.visits import tile_visits, visited_fraction
    from neptune_fusion.runtime.inputs import check_inputs
    o, ins, (q, k, v) = _small_causal()
    kern = nf.compile(o, ins, schedule=Schedule(block_m=16, block_n=16), cache=False)
    sizes, _ = check_inputs("t", kern.inputs, (q, k, v))
    counts = tile_visits(kern.program, sizes)        # per program, grid point innermost
    per_row_block = [sum(counts[i]) for i in range(0, len(counts), 2)]
    full = -(-70 // 16)
    exact = sum(per_row_block) / (len(per_row_block) * full)
    assert visited_fraction(kern.program, sizes, 16, 16, samples=64) == pytest.approx(exact)
    assert 0.5 < exact < 0.7
    problem, _, _ = nf.compile(o, ins, cache=False).space_for(q, k, v)
    shares = {(bm, bn): f for bm, bn, f in problem.visits}
    assert all(0 < f <= 1 for f in shares.values()) and shares[(64, 32)] < 0.9
    [g], gins = ops.definition("PF-Global", "float32", 32, 2, 2)
    gprob, _, _ = nf.compile(g, gins, cache=False).space_for(q, k, v)
    assert {f for _, _, f in gprob.visits} == {1.0}


def test_tuning_refuses_a_cuda_graph_capture(monkeypatch):
    """Tuning times and synchronises: during a CUDA graph capture the first call of a
    shape class says to warm up first, instead of a capture failure from the driver."""
    from neptune_fusion.runtime import auto as auto_mod
    monkeypatch.setattr(auto_mod, "_capturing", lambda: True)
    o, ins, (q, k, v) = _small_causal()
    kern = nf.compile(o, ins, cache=False)
    problem, device, space = kern.space_for(q, k, v)
    from neptune_fusion.runtime.inputs import check_inputs
    sizes, _ = check_inputs("t", kern.inputs, (q, k, v))
    with pytest.raises(nf.ScheduleError, match="call it once before the capture"):
        kern._measure(rank(problem, space, H200), [q, k, v], sizes, {})


@pytest.mark.parametrize("measured_ms, warns", [(8.0, True), (0.3, False), (0.04, False)])
def test_a_choice_far_slower_than_the_model_says_is_reported(monkeypatch, measured_ms,
                                                              warns):
    """The fastest measured schedule at over 4x the cost model's estimate (and over
    50 us) warns with SlowKernelWarning, naming the schedule and both times: a training
    forward whose epilogue stored one column a step measured 40x its estimate on an H100
    and nothing said so. Within the factor, or too short to tell from a launch's cost,
    no warning."""
    from neptune_fusion.runtime import tune
    from neptune_fusion.runtime.inputs import check_inputs
    from neptune_fusion.runtime.tune import SlowKernelWarning, Trial
    o, ins, (q, k, v) = _small_causal()
    kern = nf.compile(o, ins, cache=False)
    problem, device, space = kern.space_for(q, k, v)
    ranked = rank(problem, space, H200)[:2]
    fake = [Trial(e.schedule, 2e-4, measured_ms * 1e-3 * (1 + n))
            for n, e in enumerate(ranked)]
    monkeypatch.setattr(tune, "measure", lambda *a, **kw: fake)
    sizes, _ = check_inputs("t", kern.inputs, (q, k, v))
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        choice = kern._measure(ranked, [q, k, v], sizes, {})
    assert choice.schedule == fake[0].schedule
    slow = [w for w in got if issubclass(w.category, SlowKernelWarning)]
    assert bool(slow) is warns, [str(w.message) for w in got]
    if warns:
        assert "40x" in str(slow[0].message) and fake[0].schedule.brief() in \
            str(slow[0].message)


def test_brief_names_what_differs_from_the_portable_rolling_kernel():
    assert Schedule(num_stages=2).brief() == "rolling 128x64 warps=8 stages=2"
    s = Schedule(block_n=128, num_stages=2, dialect="gluon").brief()
    assert s == "rolling 128x128 warps=8 stages=2 gluon"
    assert Schedule(strategy="split", splits=8, block_m=16, block_n=128, num_warps=4,
                    num_stages=3).brief() == "split 16x128 warps=4 stages=3 splits=8"
    assert "row_programs=2" in Schedule(block_m=1, row_programs=2).brief()
