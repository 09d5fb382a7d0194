"""torch ops (runtime/torch_ops.py): nf.attention and compiled operators inside
torch.compile(fullgraph=True) and torch.export, checked against eager and float64."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import neptune_fusion as nf
from neptune_fusion import ops
from neptune_fusion.errors import FeedError, ScheduleError
from neptune_fusion.frontend.attention import AttentionCache
from neptune_fusion.runtime import auto, torch_ops
from neptune_fusion.runtime.auto import AutoKernel
from neptune_fusion.runtime.staged import StagedKernel
from runtime.test_attention_api import reference, rel
from runtime.test_staged import SMALL, two_lengths

CAUSAL = ops.Causal()


def _softcap(s, b, h, i, j):
    return 20.0 * nf.tanh(s / 20.0)


def _randn(rng, *shape):
    return torch.tensor(rng.standard_normal(shape), dtype=torch.float32)


def _qkv(rng, hq=4, hkv=2, n=24, m=40, d=32, dv=16):
    return _randn(rng, 2, hq, n, d), _randn(rng, 2, hkv, m, d), _randn(rng, 2, hkv, m, dv)


def _attend(q, k, v):
    out = nf.attention(q, k, v, mask_mod=CAUSAL, score_mod=_softcap, enable_gqa=True,
                       q_offset="end")
    return out * 2.0 + 1.0


def _keep(h, i, j):
    return j <= i


def _ref(q, k, v):
    off = k.shape[2] - q.shape[2]
    return reference(q, k, v, keep=_keep, offset=off,
                     score_mod=lambda s, h, i, j: 20.0 * torch.tanh(s / 20.0)) * 2.0 + 1.0


def _softmax_kernel():
    N, M = nf.sizes("N M")
    x = nf.placeholder((N, M), name="x")
    j = nf.reduce_axis(M, "j")
    m = nf.compute((N,), lambda i: nf.max(x[i, j], j), name="m")
    l = nf.compute((N,), lambda i: nf.sum(nf.exp(x[i, j] - m[i]), j), name="l")  # noqa: E741
    y = nf.compute((N, M), lambda i, c: nf.exp(x[i, c] - m[i]) / l[i], name="y")
    return y


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_attention_compiles_without_graph_break(backend, rng):
    q, k, v = _qkv(rng)
    eager = _attend(q, k, v)
    got = torch.compile(_attend, fullgraph=True, backend=backend)(q, k, v)
    assert torch.equal(got, eager)   # the op runs the eager kernels
    assert rel(got, _ref(q, k, v)) < 1e-5
    # a new length in the same compiled function: right again (recompiled or dynamic)
    q2, k2, v2 = _qkv(rng, n=7, m=19)
    got2 = torch.compile(_attend, fullgraph=True, backend=backend)(q2, k2, v2)
    assert rel(got2, _ref(q2, k2, v2)) < 1e-5


@pytest.mark.parametrize("grad", [False, True])
def test_a_graph_without_gradients_calls_the_op_without_autograd(grad, rng):
    """Traced where no gradient is wanted, attention is ``attention_infer`` (no Python
    autograd wrapper per call: about 10 us of a 23 us bound call on the CPU); with inputs
    that require one, the differentiable ``attention``, whose gradients match float64."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append({str(n.target).removesuffix(".default") for n in gm.graph.nodes})
        return gm.forward

    q, k, v = (t.requires_grad_(grad) for t in _qkv(rng))
    got = torch.compile(_attend, fullgraph=True, backend=capture)(q, k, v)
    assert rel(got, _ref(q, k, v)) < 1e-5
    (targets,) = graphs
    want, other = ("attention", "attention_infer") if grad else ("attention_infer", "attention")
    assert f"neptune_fusion.{want}" in targets
    assert f"neptune_fusion.{other}" not in targets
    if grad:
        got.sum().backward()
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        _ref(q64, k64, v64).sum().backward()
        for t, t64 in ((q, q64), (k, k64), (v, v64)):
            assert rel(t.grad, t64.grad) < 1e-4


def test_explain_counts_no_graph_break(rng):
    q, k, v = _qkv(rng, n=1)   # decode: packed GQA, the output reshaped inside the op
    explained = torch._dynamo.explain(_attend)(q, k, v)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert "neptune_fusion.attention" in str(explained.graphs[0].graph)


class _Block(torch.nn.Module):
    """A projection, attention with an ALiBi-style buffer, a projection."""

    def __init__(self, d=32):
        super().__init__()
        self.inp = torch.nn.Linear(d, d)
        self.out = torch.nn.Linear(d, d)
        self.register_buffer("slopes", torch.tensor([0.5, 0.25]))

    def forward(self, x):                       # x: (B, H, S, D)
        h = self.inp(x)
        o = nf.attention(h, h, h, mask_mod=CAUSAL, buffers={"slopes": self.slopes},
                         score_mod=lambda s, b, hh, i, j, slopes: s - slopes[hh] * (i - j))
        return self.out(o)


def _block_ref(block, x):
    h = block.inp(x)
    slopes = block.slopes.double()[:, None, None]
    o = reference(h, h, h, keep=_keep, score_mod=lambda s, hh, i, j: s - slopes * (i - j))
    return torch.nn.functional.linear(o, block.out.weight.double(), block.out.bias.double())


def test_export_traces_a_module_calling_attention(rng):
    torch.manual_seed(int(rng.integers(1 << 30)))
    block = _Block().eval()
    x = _randn(rng, 1, 2, 20, 32)
    with torch.no_grad():
        eager = block(x)
        ep = torch.export.export(block, (x,))
        assert "neptune_fusion.attention" in str(ep.graph)
        got = ep.module()(x)
        assert torch.allclose(got, eager, rtol=1e-6, atol=1e-6)
        assert rel(got, _block_ref(block, x)) < 1e-5
        x2 = _randn(rng, 1, 2, 20, 32)   # the exported program on fresh data
        assert rel(ep.module()(x2), _block_ref(block, x2)) < 1e-5


def test_compiled_module_with_buffers(rng):
    block = _Block().eval()
    x = _randn(rng, 2, 2, 17, 32)
    with torch.no_grad():
        got = torch.compile(block, fullgraph=True, backend="aot_eager")(x)
        assert rel(got, _block_ref(block, x)) < 1e-5


@pytest.mark.parametrize("schedule", ["auto", SMALL], ids=["auto", "explicit"])
def test_compiled_softmax(schedule, rng):
    kernel = nf.compile(_softmax_kernel(), schedule=schedule, cache=False)

    def fn(x):
        return kernel(torch.relu(x)) + x

    x = _randn(rng, 9, 37)
    eager = fn(x)
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(got, eager)
    r = np.maximum(x.double().numpy(), 0)
    want = np.exp(r - r.max(1, keepdims=True))
    want = want / want.sum(1, keepdims=True) + x.double().numpy()
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    assert torch._dynamo.explain(fn)(x).graph_break_count == 0


def test_staged_kernel_and_out(rng):
    outs = two_lengths()
    kernel = nf.compile(outs, schedule=SMALL, cache=False)
    assert isinstance(kernel, StagedKernel)
    feeds = {"x": rng.standard_normal((7, 13)), "z": rng.standard_normal((7, 29))}
    a, b = (torch.tensor(feeds[p.name], dtype=torch.float32) for p in kernel.inputs)
    assert torch.equal(kernel(a, b)[0], got := torch.compile(
        lambda a, b: kernel(a, b)[0] * 1.0, fullgraph=True, backend="aot_eager")(a, b))
    np.testing.assert_allclose(got.numpy(), nf.evaluate(outs, feeds)[0], rtol=2e-5,
                               atol=2e-5)
    # Kernel(..., out=[...]) inside a compiled function: the result is copied into out
    soft = nf.compile(_softmax_kernel(), schedule=SMALL, cache=False)
    x = torch.tensor(feeds["x"], dtype=torch.float32)
    buf = torch.zeros(7, 13)

    def fill(a, o):
        return soft(a, out=[o])

    res = torch.compile(fill, fullgraph=True, backend="eager")(x, buf)
    want = np.exp(feeds["x"] - feeds["x"].max(1, keepdims=True))
    np.testing.assert_allclose(buf.numpy(), want / want.sum(1, keepdims=True), rtol=1e-5,
                               atol=1e-6)
    assert res.data_ptr() == buf.data_ptr()


def test_fake_shapes_and_dtypes():
    """The fake implementations give the real outputs' shapes and dtypes, from shapes."""
    cache = AttentionCache(store=False)
    mode = FakeTensorMode()
    with mode:
        q = torch.empty(3, 8, 1, 64, dtype=torch.bfloat16)
        k = torch.empty(3, 2, 77, 64, dtype=torch.bfloat16)
        v = torch.empty(3, 2, 77, 48, dtype=torch.bfloat16)
    h = torch_ops.handle(torch_ops_entry(), None, CAUSAL, None, True, "end", None, cache,
                         None)
    with mode:
        o, lse = torch.ops.neptune_fusion.attention(q, k, v, [], h)
        o_infer = torch.ops.neptune_fusion.attention_infer(q, k, v, [], h)
    assert (o.shape, o.dtype) == ((3, 8, 1, 48), torch.bfloat16)
    assert (lse.shape, lse.dtype) == ((3, 8, 1), torch.float32)
    assert (o_infer.shape, o_infer.dtype) == ((3, 8, 1, 48), torch.bfloat16)
    assert len(cache) == 0   # nothing compiled, tuned or launched for a fake call
    kernel = nf.compile(_softmax_kernel(), cache=False)
    N, M = nf.sizes("N M")
    x = nf.placeholder((N, M), nf.float16, name="x")
    j = nf.reduce_axis(M, "j")
    s = nf.compute((N,), lambda i: nf.sum(x[i, j], j), name="s", dtype=nf.float32)
    two = nf.compile([s, nf.compute((N, M), lambda i, c: x[i, c] * 2.0, name="y")],
                     cache=False)
    with mode:
        y, = torch.ops.neptune_fusion.kernel([torch.empty(5, 11)],
                                             torch_ops.handle(torch_ops.KernelEntry, kernel))
        got = torch.ops.neptune_fusion.kernel([torch.empty(5, 11, dtype=torch.float16)],
                                              torch_ops.handle(torch_ops.KernelEntry, two))
    assert (y.shape, y.dtype) == ((5, 11), torch.float32)
    assert [(t.shape, t.dtype) for t in got] == [((5,), torch.float32),
                                                  ((5, 11), torch.float16)]
    with mode, pytest.raises(FeedError, match=r"argument 0 \('x'\) must be float16"):
        torch.ops.neptune_fusion.kernel([torch.empty(5, 11)],
                                        torch_ops.handle(torch_ops.KernelEntry, two))


def torch_ops_entry():
    from neptune_fusion.frontend.attention import _OpEntry
    return _OpEntry


def test_bad_input_is_reported_at_trace_time(rng):
    q, k, v = _qkv(rng, hq=3, hkv=2)
    with pytest.raises(Exception, match="3 query heads are not a multiple of 2"):
        torch.compile(_attend, fullgraph=True, backend="eager")(q, k, v)


def test_untuned_shape_in_a_capture_surfaces_through_the_op(rng, monkeypatch):
    """A graph run that meets an untuned shape class inside a CUDA graph capture raises the
    auto-scheduler's error (CPU here: the capture and the GPU path are simulated)."""
    kernel = nf.compile(_softmax_kernel(), cache=False)
    assert isinstance(kernel, AutoKernel)
    monkeypatch.setattr(auto, "_capturing", lambda: True)
    monkeypatch.setattr(AutoKernel, "_first_buildable",
                        lambda self, ranked, key: self._measure(ranked, (), {}, key))
    fn = torch.compile(lambda x: kernel(x) * 1.0, fullgraph=True, backend="aot_eager")
    with pytest.raises(ScheduleError, match="cannot happen while a CUDA graph is being "
                                            "captured; call it once before the capture"):
        fn(_randn(rng, 4, 8))


def test_eager_calls_take_no_op(rng, monkeypatch):
    """Plain eager calls stay on the direct path (the op boundary costs host time)."""
    import neptune_fusion.frontend.attention as att
    from neptune_fusion.runtime import kernel as kmod

    def boom(*args):
        raise AssertionError("an eager call went through the op")

    monkeypatch.setattr(att, "_traced", boom)
    for mod in (kmod, auto):
        monkeypatch.setattr(mod, "call_kernel", boom)
    q, k, v = _qkv(rng)
    assert rel(_attend(q, k, v), _ref(q, k, v)) < 1e-5
    x = _randn(rng, 3, 20)
    for sched in ("auto", SMALL):
        got = nf.compile(_softmax_kernel(), schedule=sched, cache=False)(x)
        assert torch.allclose(got, torch.softmax(x, 1), atol=1e-6)
    assert not torch_ops.compiling()


def test_an_unknown_handle_says_why():
    with pytest.raises(FeedError, match="handle 123456 is not known in this process"):
        torch_ops.entry(123456)


@pytest.mark.skipif(not os.environ.get("NF_TEST_INDUCTOR"),
                    reason="Inductor's CPU build takes ~40 s; set NF_TEST_INDUCTOR=1")
def test_inductor(rng):
    q, k, v = _qkv(rng)
    got = torch.compile(_attend, fullgraph=True)(q, k, v)
    assert rel(got, _ref(q, k, v)) < 1e-5


def test_doc_example_runs():
    import re
    from pathlib import Path
    doc = Path(__file__).resolve().parents[2] / "docs" / "torch.md"
    code = re.findall(r"^```python\n(.*?)^```", doc.read_text(), flags=re.S | re.M)
    assert code
    for block in code:
        exec(compile(block, "torch.md", "exec"), {})


def test_a_new_operator_or_mod_is_not_served_a_stale_handle(rng):
    """The handle is a constant of the graph; Dynamo's guards on the objects it came from
    make another operator or mod trace anew."""
    N, M = nf.sizes("N M")
    x = nf.placeholder((N, M), name="x")
    j = nf.reduce_axis(M, "j")
    kmax = nf.compile(nf.compute((N,), lambda i: nf.max(x[i, j], j), name="m"), cache=False)
    ksum = nf.compile(nf.compute((N,), lambda i: nf.sum(x[i, j], j), name="s"), cache=False)
    f = torch.compile(lambda kern, t: kern(t) + 0.0, fullgraph=True, backend="eager")
    t = _randn(rng, 4, 16)
    assert torch.allclose(f(kmax, t), t.max(1).values)
    assert torch.allclose(f(ksum, t), t.sum(1), atol=1e-5)
    g = torch.compile(lambda q, mm: nf.attention(q, q, q, mask_mod=mm), fullgraph=True,
                      backend="eager")
    q = _randn(rng, 1, 2, 8, 16)
    for mm, keep in ((CAUSAL, _keep), (None, None),
                     (ops.SlidingWindow(2), lambda h, i, j: (j <= i) & (i - j < 2))):
        assert rel(g(q, mm), reference(q, q, q, keep=keep)) < 1e-5


def test_the_real_implementation_runs_eagerly_even_while_tracing(rng, monkeypatch):
    """An op's real implementation never routes back to the op (no recursion), e.g. when a
    compiler evaluates it at compile time."""
    from neptune_fusion.runtime import kernel as kmod
    from neptune_fusion.runtime import staged as smod
    for mod in (torch_ops, kmod, auto, smod):   # every call site "sees" a trace running
        monkeypatch.setattr(mod, "compiling", lambda: True)
    q, k, v = _qkv(rng)
    h = torch_ops.handle(torch_ops_entry(), _softcap, CAUSAL, None, True, "end", None, None,
                         None)
    got = torch.ops.neptune_fusion.attention(q, k, v, [], h)[0] * 2.0 + 1.0
    assert rel(got, _ref(q, k, v)) < 1e-5
    x = _randn(rng, 3, 20)
    for sched in ("auto", SMALL):
        kern = nf.compile(_softmax_kernel(), schedule=sched, cache=False)
        got, = torch.ops.neptune_fusion.kernel([x], torch_ops.handle(torch_ops.KernelEntry,
                                                                     kern))
        assert torch.allclose(got, torch.softmax(x, 1), atol=1e-6)
    staged = nf.compile(two_lengths(), schedule=SMALL, cache=False)
    shapes = {"x": (7, 13), "z": (7, 29)}
    a, b = (_randn(rng, *shapes[p.name]) for p in staged.inputs)
    got, = torch.ops.neptune_fusion.kernel([a, b], torch_ops.handle(torch_ops.KernelEntry,
                                                                    staged))
    assert torch.equal(got, staged.run((a, b))[0])


def test_constant_keys_rebuild_equal_objects():
    """What crosses into traced code as a constant key comes back equal (dataclasses,
    slotted or with init=False fields) or identical (referable objects)."""
    import dataclasses

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slotted:
        a: int
        b: tuple = ()
        c: float = dataclasses.field(init=False, default=2.5)

    cache = AttentionCache()
    for obj in (ops.Causal(), ops.SlidingWindow(3), Slotted(1, (ops.SoftCap(2.0),)),
                ops.Chain((ops.Causal(), ops.SoftCap(30.0))), nf.Schedule(block_m=16),
                None, 3, "end", (1, "a")):
        back = torch_ops.from_key(torch_ops.constant_key(obj))
        assert back == obj and type(back) is type(obj)
    assert torch_ops.from_key(torch_ops.constant_key(cache)) is cache


def test_compiled_decode_steps_run_a_bound_launch(rng):
    """Decode inside a compiled graph: the op binds its launch once per input signature
    (no call key or checks per step) and returns a copy; each step's output matches the
    eager call and float64 as the key cache fills (a new length is a new signature), and
    a kv_lens cache whose lengths change in place reuses one binding."""
    from neptune_fusion.frontend.attention import _OpEntry
    fn = torch.compile(_attend, fullgraph=True, backend="aot_eager")
    outs = []
    for m in (17, 18, 18):
        q, k, v = _qkv(rng, n=1, m=m)
        got = fn(q, k, v)
        assert torch.equal(got, _attend(q, k, v))
        assert rel(got, _ref(q, k, v)) < 1e-5
        outs.append(got)
    assert outs[1].data_ptr() != outs[2].data_ptr()   # a copy per call, never aliased
    bound = [e for e in torch_ops._ENTRIES if isinstance(e, _OpEntry) and e._prepared]
    assert bound and all(p is not False for e in bound for p in e._prepared.values())

    def ragged(q, k, v, lens):
        return nf.attention(q, k, v, enable_gqa=True, kv_lens=lens)
    cfn = torch.compile(ragged, fullgraph=True, backend="aot_eager")
    q, k, v = _qkv(rng, n=1, m=40)
    lens = torch.tensor([40, 23], dtype=torch.int32)
    before = sum(len(e._prepared) for e in torch_ops._ENTRIES if isinstance(e, _OpEntry))
    for n in (23, 31, 1):
        lens[1] = n
        got = cfn(q, k, v, lens)
        want = torch.cat([_attend_plain(q[b:b + 1], k[b:b + 1, :, :int(lens[b])],
                                        v[b:b + 1, :, :int(lens[b])]) for b in range(2)])
        assert rel(got, want) < 1e-5
    after = sum(len(e._prepared) for e in torch_ops._ENTRIES if isinstance(e, _OpEntry))
    assert after == before + 1


def _attend_plain(q, k, v):
    return reference(q, k, v, offset=k.shape[2] - q.shape[2])
