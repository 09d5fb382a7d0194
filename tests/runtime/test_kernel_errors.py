"""One negative test per bad call: each raises a NeptuneError naming the argument."""

from __future__ import annotations

import pytest
import torch

import neptune_fusion as nf
from algebra.chains import tanh_chain
from neptune_fusion import ops
from neptune_fusion.errors import CodegenError, FeedError, NeptuneError, SizeBindingError
from neptune_fusion.frontend.attention import AttentionCache, attention
from neptune_fusion.runtime.pipeline import compile as nf_compile


@pytest.fixture(scope="module")
def kernel():
    [o], ins = ops.definition("PF-Causal", "float16", 64, 2, 2)
    return nf_compile(o, ins, block_m=16, block_n=16)


def qkv(n=20, m=20, h=2, d=64, dtype=torch.float16):
    return (torch.randn(1, h, n, d).to(dtype), torch.randn(1, h, m, d).to(dtype),
            torch.randn(1, h, m, d).to(dtype))


def test_wrong_number_of_tensors(kernel):
    q, k, _ = qkv()
    with pytest.raises(FeedError, match=r"takes 3 tensor\(s\) \(q, k, v\), got 2"):
        kernel(q, k)


def test_not_a_tensor(kernel):
    q, k, v = qkv()
    with pytest.raises(FeedError, match=r"argument 2 \('v'\) must be a torch tensor"):
        kernel(q, k, v.numpy())


def test_wrong_dtype(kernel):
    q, k, v = qkv()
    with pytest.raises(FeedError, match=r"argument 1 \('k'\) must be float16, got float32"):
        kernel(q, k.float(), v)


def test_wrong_rank(kernel):
    q, k, v = qkv()
    with pytest.raises(FeedError, match="input 'v' must have 4 dimension"):
        kernel(q, k, v[0])


def test_fixed_size_mismatch(kernel):
    q, k, v = qkv(h=3)
    with pytest.raises(FeedError, match="input 'q' must have shape"):
        kernel(q, k, v)


def test_symbolic_sizes_bound_consistently(kernel):
    q, k, _ = qkv(m=20)
    _, _, v = qkv(m=21)
    with pytest.raises(SizeBindingError, match="size M is bound to 20 by dimension 2 of 'k' "
                                               "but to 21 by dimension 2 of 'v'"):
        kernel(q, k, v)


def test_device_mix(kernel):
    q, k, v = qkv()
    with pytest.raises(FeedError, match=r"argument 1 \('k'\) is on meta but 'q' is on cpu"):
        kernel(q, k.to("meta"), v)


def test_unsupported_device(kernel):
    q, k, v = (t.to("meta") for t in qkv())
    with pytest.raises(FeedError, match="the kernel runs on CUDA or CPU tensors"):
        kernel(q, k, v)


def test_non_unit_last_stride(kernel):
    q, k, v = qkv()
    k2 = torch.randn(1, 2, 64, 20).to(torch.float16).transpose(2, 3)
    with pytest.raises(FeedError, match=r"'k'\) must have unit stride .*contiguous\(\)"):
        kernel(q, k2, v)


def test_strided_inputs_are_fine(kernel):
    q, k, v = qkv()
    big = torch.randn(1, 2, 20, 128).to(torch.float16)
    out = kernel(q, big[..., :64], v)  # a row stride of 128 is not contiguous: fine
    assert torch.allclose(out, kernel(q, big[..., :64].contiguous(), v))


def test_compile_rejects_what_it_cannot_lower():
    outs, _ = tanh_chain()
    with pytest.raises(CodegenError, match="not single-pass"):
        nf_compile(outs, require_single_pass=True)
    [o], (q, k, v) = ops.definition("PF-Causal", "float16", 64, 2, 2)
    with pytest.raises(CodegenError, match="not among the inputs"):
        nf_compile(o, [q, k])
    with pytest.raises(NeptuneError, match=r"inputs\[1\] must be a placeholder"):
        nf_compile(o, [q, "k", v])
    x = nf.placeholder((4,), "float64", name="x")
    with pytest.raises(NeptuneError, match="input 'x' is float64"):
        nf_compile(o, [q, k, v, x])


@pytest.mark.parametrize("change, text", [
    (lambda q, k, v: (q[0], k, v), "q must be 4-d"),
    (lambda q, k, v: (q.double(), k.double(), v.double()), "use float16, bfloat16"),
    (lambda q, k, v: (q, k.float(), v), "must share a dtype"),
    (lambda q, k, v: (q, k[:, :1], v[:, :1]), "pass enable_gqa=True"),
    (lambda q, k, v: (q, k, v[:, :, :5]), "must agree in heads and sequence length"),
    (lambda q, k, v: (q[..., :32], k, v), "q has head dim 32 but k has 64"),
    (lambda q, k, v: (q, k, v.to("meta")), "must be on one device"),
])
def test_attention_argument_errors(change, text):
    with pytest.raises(FeedError, match=text):
        attention(*change(*qkv()), cache=AttentionCache())


def test_attention_q_offset_must_be_an_int():
    with pytest.raises(FeedError, match="q_offset must be an int"):
        attention(*qkv(), q_offset=1.5, cache=AttentionCache())
