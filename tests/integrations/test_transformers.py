"""Hugging Face models with ``attn_implementation="neptune_fusion"`` against eager.

Tiny random-weight models built from configs (no download), float32 on the CPU (the
kernels run under Triton's interpreter): logits of a prefill match transformers' eager
attention, and greedy ``generate()`` gives the same tokens. Skipped without transformers
(``pip install 'neptune-fusion[transformers]'``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip(
    "transformers", minversion="4.56",
    reason="the transformers integration needs transformers >= 4.56 (the "
           "'transformers' extra)")

import neptune_fusion as nf  # noqa: E402
from neptune_fusion.frontend.attention import DEFAULT_CACHE  # noqa: E402
from neptune_fusion.integrations import transformers as nft  # noqa: E402

VOCAB, NEW = 96, 8


def _config(name: str):
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64, pad_token_id=0)
    if name == "llama":
        return transformers.LlamaConfig(**common)
    if name == "mistral":  # a window (4) much shorter than the prompt (11) + 8 new tokens
        return transformers.MistralConfig(**common, sliding_window=4)
    if name == "gemma2":   # soft-capped logits, sliding/full layers, scaling != head_dim**-0.5
        return transformers.Gemma2Config(**common, head_dim=16, sliding_window=5,
                                         query_pre_attn_scalar=24,
                                         attn_logit_softcapping=2.0,
                                         final_logit_softcapping=None,
                                         initializer_range=0.2)  # scores reach the cap
    if name == "gpt_oss":  # sinks, sliding/full layers, a small mixture of experts
        return transformers.GptOssConfig(**common, head_dim=16, sliding_window=4,
                                         num_local_experts=4, num_experts_per_tok=2,
                                         layer_types=["sliding_attention", "full_attention"])
    raise AssertionError(name)


def _model(name: str, seed: int = 0):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(_config(name),
                                                          attn_implementation="eager")
    model.eval()
    with torch.no_grad():  # gpt-oss initialises its sinks to 0: give them weight
        for mod in model.modules():
            if isinstance(getattr(mod, "sinks", None), torch.nn.Parameter):
                mod.sinks.normal_(0.0, 1.0)
    return model


def _calls() -> int:
    info = DEFAULT_CACHE.cache_info()
    return info.hits + info.misses


@pytest.fixture(scope="module", autouse=True)
def _registered():
    nft.register()


def _rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2", "gpt_oss"])
def test_logits_and_greedy_tokens_match_eager(name):
    model = _model(name)
    ids = torch.randint(1, VOCAB, (1, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
        want_tokens = model.generate(ids, max_new_tokens=NEW, do_sample=False)
        model.set_attn_implementation(nft.NAME)
        before = _calls()
        got = model(ids).logits
        assert _calls() - before == 2          # one nf.attention call per layer
        assert _rel(got, want) <= 1e-4
        got_tokens = model.generate(ids, max_new_tokens=NEW, do_sample=False)
    assert got_tokens.shape[1] == ids.shape[1] + NEW
    assert torch.equal(got_tokens, want_tokens)


def test_from_config_with_padding_and_gqa_batch():
    """attn_implementation at construction; a left-padded batch of two prompts."""
    torch.manual_seed(0)
    # one config each: a model keeps (and set_attn_implementation changes) its config
    ours = transformers.AutoModelForCausalLM.from_config(_config("mistral"),
                                                         attn_implementation=nft.NAME)
    eager = transformers.AutoModelForCausalLM.from_config(_config("mistral"),
                                                          attn_implementation="eager")
    eager.load_state_dict(ours.state_dict())
    ours.eval(), eager.eval()
    assert ours.config._attn_implementation == nft.NAME
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0          # the second prompt is 6 tokens, left-padded
    ids[1, :3] = 0
    with torch.no_grad():
        want = eager(ids, attention_mask=mask).logits
        before = _calls()
        got = ours(ids, attention_mask=mask).logits
        assert _calls() - before == 2
        # padded query rows see no key in eager's softmax either way: compare real rows
        assert _rel(got[0], want[0]) <= 1e-4
        assert _rel(got[1, 3:], want[1, 3:]) <= 1e-4
        want_tokens = eager.generate(ids, attention_mask=mask, max_new_tokens=4,
                                     do_sample=False)
        got_tokens = ours.generate(ids, attention_mask=mask, max_new_tokens=4,
                                   do_sample=False)
    assert torch.equal(got_tokens, want_tokens)


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_static_cache_decode_matches_eager(name):
    """A static cache: keys past the queries are unused slots, masked by position.
    Gemma2's sliding layers keep a window-sized cache at host offsets (no ``kv_lens``):
    their steps are prepared on a signature's second sighting."""
    model = _model(name)
    ids = torch.randint(1, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))
    kw = dict(max_new_tokens=4, do_sample=False, cache_implementation="static",
              return_dict_in_generate=True, output_logits=True)
    with torch.no_grad():
        want = model.generate(ids, **kw)
        model.set_attn_implementation(nft.NAME)
        got = model.generate(ids, **kw)
    assert torch.equal(got.sequences, want.sequences)
    assert len(got.logits) == 4
    # each layer's decode steps ran one prepared call (nf.prepare_attention), built once;
    # the prefill's signature was seen once (None) and never prepared
    tables = [m.__dict__["_nf_prepared"] for m in model.modules()
              if "_nf_prepared" in m.__dict__]
    assert len(tables) == model.config.num_hidden_layers
    for t in tables:
        built = [p for p in t.values() if p is not None]
        assert len(built) == 1 and isinstance(built[0], nf.PreparedAttention)
    for a, b in zip(got.logits, want.logits):   # each step's logits, not just the argmax
        assert _rel(a, b) <= 1e-4


def test_dynamic_cache_decode_is_never_prepared():
    """A dynamic cache grows a key per step: no signature repeats, so no step is prepared
    (each is seen once), and the general call gives eager attention's tokens."""
    model = _model("llama")
    ids = torch.randint(1, VOCAB, (1, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=5, do_sample=False)
        model.set_attn_implementation(nft.NAME)
        got = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert torch.equal(got, want)
    tables = [m.__dict__["_nf_prepared"] for m in model.modules()
              if "_nf_prepared" in m.__dict__]
    assert tables and all(len(t) >= 4 and all(p is None for p in t.values())
                          for t in tables)


@pytest.mark.parametrize("name", ["llama", "gemma2", "gpt_oss"])
def test_compiled_model_has_no_graph_break(name):
    """torch.compile of a whole model: prefill and a dynamic-cache decode step trace with
    no graph break (fullgraph) and give eager attention's logits."""
    model = _model(name)
    ids = torch.randint(1, VOCAB, (1, 7), generator=torch.Generator().manual_seed(5))
    tok = torch.tensor([[4]])
    with torch.no_grad():
        want = model(ids, use_cache=True)
        want_next = model(tok, past_key_values=want.past_key_values).logits
        model.set_attn_implementation(nft.NAME)
        torch._dynamo.reset()
        fwd = torch.compile(model.forward, fullgraph=True, backend="aot_eager")
        got = fwd(input_ids=ids, use_cache=True)
        got_next = fwd(input_ids=tok, past_key_values=got.past_key_values).logits
    assert _rel(got.logits, want.logits) <= 1e-4
    assert _rel(got_next, want_next) <= 1e-4


def test_static_cache_compiles_to_one_graph_for_every_step():
    """A static cache's offset stays on the device (kv_lens): prefill and decode steps
    trace with no graph break, give eager attention's logits, and later steps compile
    nothing new (one kernel, one graph for every length)."""
    from transformers import StaticCache
    model = _model("llama")
    cfg = model.config
    ids = torch.randint(1, VOCAB, (1, 6), generator=torch.Generator().manual_seed(7))

    def run(fwd):
        cache = StaticCache(config=cfg, max_cache_len=12)
        out = [fwd(input_ids=ids, past_key_values=cache, cache_position=torch.arange(6))
               .logits]
        for t, tok in enumerate((3, 9, 4)):
            out.append(fwd(input_ids=torch.tensor([[tok]]), past_key_values=cache,
                           cache_position=torch.tensor([6 + t])).logits)
        return out

    with torch.no_grad():
        want = run(model.forward)
        model.set_attn_implementation(nft.NAME)
        torch._dynamo.reset()
        got = run(torch.compile(model.forward, fullgraph=True, backend="aot_eager",
                                dynamic=False))
        before = len(DEFAULT_CACHE)
        run(model.forward)   # eager, same shapes: nothing new to compile
        assert len(DEFAULT_CACHE) == before
    for a, b in zip(got, want):
        assert _rel(a, b) <= 1e-4


def test_mask_structure_from_either_signature():
    """transformers 5.x passes q_length/q_offset, 4.5x the queries' cache_position."""
    from transformers.masking_utils import causal_mask_function
    new = nft.mask_structure(1, q_length=3, kv_length=9, q_offset=6, kv_offset=0,
                             mask_function=causal_mask_function)
    old = nft.mask_structure(1, kv_length=9, kv_offset=0, cache_position=torch.arange(6, 9),
                             mask_function=causal_mask_function)
    fields = lambda st: (st.causal, st.window, st.q_length, st.kv_length,  # noqa: E731
                         st.q_offset, st.kv_offset, st.padding)
    assert fields(new) == fields(old) == (True, None, 3, 9, 6, 0, None)


def test_unsupported_requests_raise_named_errors():
    model = _model("llama")
    attn = model.model.layers[0].self_attn
    q = torch.randn(1, 4, 3, 16)
    k = v = torch.randn(1, 2, 3, 16)
    with pytest.raises(nf.NeptuneError, match="dropout"):
        nft.attention_forward(attn, q, k, v, None, scaling=0.25, dropout=0.1)
    with pytest.raises(nf.NeptuneError, match="dense or custom mask"):
        nft.attention_forward(attn, q, k, v, torch.zeros(1, 1, 3, 3), scaling=0.25)
    with pytest.raises(nf.NeptuneError, match="mask function"):
        nft.mask_structure(1, 3, 3, mask_function=lambda b, h, i, j: i >= 0)
    from transformers.masking_utils import packed_sequence_mask_function
    with pytest.raises(nf.NeptuneError, match="packed_sequence_mask_function"):
        nft.mask_structure(1, 3, 3, mask_function=packed_sequence_mask_function(
            torch.zeros(1, 3, dtype=torch.long)))


def _reference(q, k, v, scale, window, softcap, sinks, q_pos, padding):
    """Float64 attention of (B, Hq, N, D) q over unexpanded (B, Hkv, M, D) k, v: queries at
    absolute positions ``q_pos + i``, keys at ``j``; a sink logit per head (value 0)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(q.shape[2])[:, None] + q_pos
    j = torch.arange(k.shape[2])[None, :]
    ok = (j <= i) & ((j > i - window) if window else True)
    ok = ok[None, None] & padding[:, None, None, :].bool()
    s = s.masked_fill(~ok, -float("inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.double()[None, :, None, None].expand(*s.shape[:3], 1)], -1)
    p = torch.softmax(s, -1)[..., :k.shape[2]]
    return (p @ v).transpose(1, 2)


@pytest.mark.parametrize("window, softcap, sink, pad", [
    (None, None, True, False), (3, None, True, True), (6, 7.5, False, True)])
def test_layer_against_float64(window, softcap, sink, pad):
    """One layer call: decode-like chunk (3 queries at the end of 9 keys), GQA 6:2."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 6, 3, 16, generator=g)
    k, v = torch.randn(2, 2, 9, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g)
    sinks = torch.randn(6, generator=g) if sink else None
    padding = torch.ones(2, 9, dtype=torch.bool)
    if pad:
        padding[1, [1, 5]] = False   # key 5: inside every window of query 6
    from transformers.masking_utils import (
        causal_mask_function,
        sliding_window_causal_mask_function,
    )
    fn = sliding_window_causal_mask_function(window) if window else causal_mask_function
    st = nft.mask_structure(2, 3, 9, q_offset=6, kv_offset=0, mask_function=fn,
                            attention_mask=padding)
    assert (st.causal, st.window, st.padding is None) == (True, window, not pad)

    class Module:
        is_causal = True

    out, weights = nft.attention_forward(Module(), q, k, v, st, scaling=0.3, s_aux=sinks,
                                         sliding_window=window, softcap=softcap)
    want = _reference(q, k, v, 0.3, window, softcap, sinks, 6, padding)
    if pad:  # the padding changes the answer
        plain = _reference(q, k, v, 0.3, window, softcap, sinks, 6, torch.ones_like(padding))
        assert not torch.allclose(plain, want, rtol=1e-3, atol=1e-4)
    assert weights is None and out.shape == (2, 3, 6, 16)
    assert torch.allclose(out.double(), want, rtol=1e-4, atol=1e-5)
    if sink:  # the sinks change the answer: without them it differs
        plain = _reference(q, k, v, 0.3, window, softcap, None, 6, padding)
        assert not torch.allclose(plain, want, rtol=1e-3, atol=1e-4)


def test_decode_with_sinks_merges_them_and_copies_no_cache():
    """gpt-oss decode (a few queries at the end of the cache): the sinks are merged after
    the kernel (``sinks=``), not prepended as a zero key (a copy of the whole cache per
    step). The first call of a signature runs the general call, the second prepares it
    (the prepared call merges in place), the third runs the prepared call: each against
    float64."""
    g = torch.Generator().manual_seed(7)
    sinks = torch.randn(6, generator=g)
    from transformers.masking_utils import causal_mask_function
    st = nft.mask_structure(2, 2, 11, q_offset=9, kv_offset=0,
                            mask_function=causal_mask_function, attention_mask=None)

    class Module:
        is_causal = True
    layer = Module()
    for step in range(3):
        q = torch.randn(2, 6, 2, 16, generator=g)
        k, v = torch.randn(2, 2, 11, 16, generator=g), torch.randn(2, 2, 11, 16, generator=g)
        out, _ = nft.attention_forward(layer, q, k, v, st, scaling=0.3, s_aux=sinks)
        want = _reference(q, k, v, 0.3, None, None, sinks, 9, torch.ones(2, 11, dtype=bool))
        assert torch.allclose(out.double(), want, rtol=1e-4, atol=1e-5), step
    [prepared] = layer._nf_prepared.values()
    assert prepared and prepared._lse is not None   # prepared, with the sinks merged


def test_docs_example_runs():
    doc = Path(__file__).resolve().parents[2] / "docs" / "transformers.md"
    code = re.findall(r"^```python\n(.*?)^```", doc.read_text(), flags=re.S | re.M)
    assert len(code) == 1
    exec(compile(code[0], str(doc), "exec"), {})


@pytest.mark.parametrize("name", ["llama", "gpt_oss"])
def test_a_training_step_matches_eager_attention(name):
    """nf.attention is differentiable: one loss.backward() of a tiny model gives every
    parameter's gradient as transformers' eager attention does -- gpt-oss's sinks too
    (merged after the kernel with sinks= when they require grad)."""
    ids = torch.tensor([[5, 9, 2, 7, 3, 8, 11, 4, 6, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]])
    grads = {}
    for impl in ("eager", "neptune_fusion"):
        model = _model(name)
        model.train()
        model.set_attn_implementation(impl)
        model(ids, labels=ids).loss.backward()
        grads[impl] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads["neptune_fusion"].keys() == grads["eager"].keys()
    assert any("sinks" in n for n in grads["eager"]) == (name == "gpt_oss")
    for n, want in grads["eager"].items():
        assert _rel(grads["neptune_fusion"][n], want) < 1e-4, n


def test_a_compiled_training_step_gives_the_sinks_their_gradient():
    """gpt-oss under torch.compile (fullgraph), one loss.backward(): every parameter's
    gradient as transformers' eager attention gives it, the sinks' included (merged
    after the traced kernel, not a detached key)."""
    ids = torch.tensor([[5, 9, 2, 7, 3, 8, 11, 4, 6, 1, 2, 3]])
    grads = {}
    for impl in ("eager", "neptune_fusion"):
        model = _model("gpt_oss")
        model.train()
        model.set_attn_implementation(impl)
        torch._dynamo.reset()
        fwd = torch.compile(model.forward, fullgraph=True, backend="aot_eager")
        fwd(input_ids=ids, labels=ids).loss.backward()
        grads[impl] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert grads["neptune_fusion"].keys() == grads["eager"].keys()
    assert any("sinks" in n for n in grads["eager"])
    for n, want in grads["eager"].items():
        assert _rel(grads["neptune_fusion"][n], want) < 1e-4, n


def test_a_static_cache_builds_kv_lens_once_per_forward(monkeypatch):
    """The filled length of a static cache is built on the device once, by the mask, and
    every layer reads that tensor (not three small kernels per layer); the logits are
    eager attention's."""
    from transformers import StaticCache
    model = _model("llama")
    cfg = model.config
    assert cfg.num_hidden_layers >= 2
    ids = torch.randint(1, VOCAB, (1, 5), generator=torch.Generator().manual_seed(3))

    calls = []

    def run():
        cache = StaticCache(config=cfg, max_cache_len=9)
        first = model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(5))
        calls.clear()
        nxt = model(input_ids=torch.tensor([[4]]), past_key_values=cache,
                    cache_position=torch.tensor([5]))
        return first.logits, nxt.logits

    with torch.no_grad():
        want = run()
        model.set_attn_implementation(nft.NAME)
        built = nft._kv_lens
        monkeypatch.setattr(nft, "_kv_lens", lambda *a: calls.append(a) or built(*a))
        got = run()
    assert len(calls) == 1          # the decode step: once, by the mask, not per layer
    st = nft.mask_structure(2, q_length=3, kv_length=9, q_offset=torch.tensor(4),
                            kv_offset=0)
    assert st.kv_lens.dtype == torch.int32 and st.kv_lens.tolist() == [7, 7]
    for a, b in zip(got, want):
        assert _rel(a, b) <= 1e-4


def test_prefill_writes_the_model_layout_with_no_copy(monkeypatch):
    """A prefill (more than 16 queries) hands the kernel a transposed (B, S, Hq, D)
    buffer as ``out=``: the layer returns that buffer itself, no transposing copy."""
    import neptune_fusion.frontend.attention as fa
    g = torch.Generator().manual_seed(9)
    q = torch.randn(1, 20, 6, 16, generator=g).transpose(1, 2)   # as the projections give
    k, v = torch.randn(1, 2, 20, 16, generator=g), torch.randn(1, 2, 20, 16, generator=g)
    from transformers.masking_utils import causal_mask_function
    st = nft.mask_structure(1, 20, 20, mask_function=causal_mask_function)
    given = []
    real = fa.attention
    monkeypatch.setattr(fa, "attention", lambda *a, **kw: given.append(kw["out"]) or
                        real(*a, **kw))

    class Module:
        is_causal = True
    out, _ = nft.attention_forward(Module(), q, k, v, st, scaling=0.25)
    assert out.is_contiguous() and out.data_ptr() == given[0].data_ptr()
    want = _reference(q, k, v, 0.25, None, None, None, 0, torch.ones(1, 20, dtype=bool))
    assert torch.allclose(out.double(), want, rtol=1e-4, atol=1e-5)


def test_llama_in_plain_pytorch_through_the_backend():
    """transformers' own SDPA attention (no integration) under ``torch.compile`` with the
    neptune_fusion backend: each layer's attention -- RoPE, ``repeat_kv``, the mask
    transformers builds from positions, SDPA's empty-row guard -- is one fused chain, its output
    projection stays with the rest, and a second prompt length compiles one dynamic
    graph that fuses the same; logits within float32 rounding of eager."""
    from neptune_fusion.dynamo import Backend
    model = _model("llama")
    model.set_attn_implementation("sdpa")
    backend = Backend(rest="eager")
    torch._dynamo.reset()
    fwd = torch.compile(model.forward, backend=backend)
    with torch.no_grad():
        for n in (7, 13, 20):
            ids = torch.randint(1, VOCAB, (1, n), generator=torch.Generator().manual_seed(n))
            assert _rel(fwd(input_ids=ids, use_cache=False).logits,
                        model(input_ids=ids, use_cache=False).logits) <= 1e-5
    assert len(backend.reports) == 2   # static 7, then one dynamic graph for 13 and 20
    for report in backend.reports:
        attention = [f for f in report.fused if "bmm" in f.ops and "amax" in f.ops]
        assert len(attention) == 2, str(report)   # one per layer
        # the mask is built inline from positions (advanced indexing of cache_position,
        # the packed-sequence ids as data): causal structure, the key loop ends early
        assert all("i_last + 1" in f.kernel.kernels()[0].source for f in attention)
        assert sum("a matmul after the chain" in x.reason for x in report.left) == 2
        # a region fused already (its op, the getitems of its results) cuts no chain
        assert not any("getitem" in x.reason or "fused has" in x.reason for x in report.left)


def _same_greedy_steps(model, compiled, prompt: int, steps: int, cache_len: int) -> None:
    """A prefill of ``prompt`` tokens and ``steps`` greedy decode steps over a static
    cache, through ``model.forward`` and through ``compiled``: each step's last logits
    within 1e-5 of eager's."""
    def run(fwd):
        cache = transformers.StaticCache(config=model.config, max_cache_len=cache_len)
        ids = torch.randint(1, VOCAB, (1, prompt), generator=torch.Generator().manual_seed(4))
        out = [fwd(input_ids=ids, past_key_values=cache, cache_position=torch.arange(prompt),
                   use_cache=True).logits[:, -1]]
        for s in range(steps):
            tok = out[-1].argmax(-1, keepdim=True)
            out.append(fwd(input_ids=tok, past_key_values=cache, use_cache=True,
                           cache_position=torch.tensor([prompt + s])).logits[:, -1])
        return out
    with torch.no_grad():
        want, got = run(model.forward), run(compiled)
    for a, b in zip(got, want):
        assert _rel(a, b) <= 1e-5


@pytest.mark.parametrize("rest", ["eager", "inductor"])
def test_llama_static_cache_decode_through_the_backend(rest):
    """transformers' SDPA path with a static cache under ``torch.compile`` with the
    neptune_fusion backend: the prefill graph and the decode-step graph (one for every
    step: the cache's shapes are static) each fuse both layers' attention; the cache
    writes (``index_copy``) stay with the rest, and no fused region is several kernels
    (backend.refuse_staged_matmul). Each step's logits within 1e-5 of eager, with
    Inductor as the rest too: there the graph keeps its input mutations (the cache rows,
    a position counter), written in place after the fused calls read the old values
    (docs/jit.md, "Input mutations stay in the graph")."""
    from neptune_fusion.dynamo import Backend
    model = _model("llama")
    model.set_attn_implementation("sdpa")
    backend = Backend(rest=rest)
    torch._dynamo.reset()
    compiled = torch.compile(model.forward, backend=backend)

    _same_greedy_steps(model, compiled, prompt=6, steps=4, cache_len=16)
    assert len(backend.reports) == 2   # the prefill, then one graph for every decode step
    for report in backend.reports:
        assert sum("amax" in f.ops and "bmm" in f.ops for f in report.fused) == 2
        assert all(len(getattr(f.kernel, "passes", ())) < 2 for f in report.fused)


@pytest.mark.parametrize("name,impl", [("llama", "eager"), ("mistral", "sdpa"),
                                       ("gemma2", "eager"), ("gpt_oss", "eager")])
def test_plain_attention_of_each_model_is_fused_through_the_backend(name, impl):
    """transformers' own attention code under ``torch.compile(backend="neptune_fusion")``:
    the eager path's float mask (filled with float32's minimum, which ``exp2``'s scaling
    took past float32: codegen/exprs.py), gpt-oss's sink logits concatenated to the
    scores (dynamo/rules.py: the reductions split at the sink's entry) and the
    sliding-window cache's rotated keys beside the attention (a map pass, not a reason to
    split it: fusion/stages.py) kept each from being fused. The prefill graph fuses both
    layers' attention (Gemma2: soft-cap and a sliding window on alternate layers;
    gpt-oss: sinks); prefill and decode logits within 1e-5 of eager. The decode graph,
    made dynamic by the prefill before it, fuses them too: its mask reads the step's
    position and a sliding window's first key ``Max(0, s - w + 1)``, symbolic ints no
    input shape gives, passed as 0-d tensors (dynamo/symbolic.py)."""
    from neptune_fusion.dynamo import Backend
    model = _model(name)
    model.set_attn_implementation(impl)
    backend = Backend(rest="eager")
    torch._dynamo.reset()
    compiled = torch.compile(model.forward, backend=backend)

    _same_greedy_steps(model, compiled, prompt=9, steps=3, cache_len=24)
    assert len(backend.reports) == 2   # the prefill, then a dynamic graph for the steps
    for report in backend.reports:
        assert sum("amax" in f.ops and "bmm" in f.ops for f in report.fused) == 2, str(report)


def _padded_batch_through_the_backend(model, seed: int) -> list:
    """``model`` on two sequences of 9 tokens, the second padded after 6, compiled with
    the backend (the rest eager): its hidden states against eager's; the fused chains'
    ops."""
    from neptune_fusion.dynamo import Backend
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (2, 9), generator=g)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    backend = Backend(rest="eager")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        got = compiled(input_ids=ids, attention_mask=mask).last_hidden_state
        want = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert _rel(got, want) <= 1e-5
    return [f.ops for r in backend.reports for f in r.fused]


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_bert_encoder_through_the_backend(impl):
    """A BERT encoder (bidirectional, a padding mask as data) under ``torch.compile``
    with the backend: each layer's attention and both LayerNorms (with their residual
    adds) are fused, and the hidden states match eager. With eager attention the additive
    mask is expanded from the padding mask by an index read from a tensor, gathered in
    the attention's kernel (until 2026-12-05 it was left out as the region's prologue)."""
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=128,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    cfg._attn_implementation = impl
    torch.manual_seed(0)
    fused = _padded_batch_through_the_backend(transformers.BertModel(cfg).eval(), seed=11)
    assert sum("bmm" in ops and "amax" in ops for ops in fused) == 2, fused
    assert sum("rsqrt" in ops for ops in fused) >= 4, fused


def test_bloom_eager_attention_through_the_backend():
    """Bloom's eager attention: ``baddbmm`` of the ALiBi bias and the scores, its mask
    built from the padding mask by an index read from a tensor, a float32 softmax, the
    ``bmm``: one fused chain per layer, the hidden states as eager's. Its cache's first
    update concatenates a 1-d empty piece beside 4-d ones, which the backend's check of
    ``cat`` indexed past the empty piece's rank and raised (found 2026-12-05)."""
    cfg = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    fused = _padded_batch_through_the_backend(transformers.BloomModel(cfg).eval(), seed=12)
    assert sum("baddbmm" in ops and "amax" in ops and "bmm" in ops for ops in fused) == 2, \
        fused


MORE_MODELS = {
    "gpt2": lambda: (transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4,
                                             bos_token_id=1, eos_token_id=2),
                     transformers.GPT2Model),
    "falcon": lambda: (transformers.FalconConfig(vocab_size=VOCAB, hidden_size=64,
                                                 num_hidden_layers=2, num_attention_heads=4,
                                                 bos_token_id=1, eos_token_id=2),
                       transformers.FalconModel),
    "mixtral": lambda: (transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=96, num_local_experts=4,
        num_experts_per_tok=2), transformers.MixtralModel),
}


@pytest.mark.parametrize("name", list(MORE_MODELS))
def test_more_architectures_through_the_backend(name):
    """A robustness sweep (2026-12-05: a tiny Bloom had raised out of torch.compile):
    GPT-2, Falcon and Mixtral (its router's softmax too), eager attention, a padded
    batch: never an error, the hidden states as eager's at the tokens that are not
    padding, every layer's softmax fused (T5's encoder passed too, left out of CI for
    its 9 s: docs/jit.md)."""
    from neptune_fusion.dynamo import Backend
    cfg, cls = MORE_MODELS[name]()
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = cls(cfg).eval()
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    backend = Backend(rest="eager")
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(input_ids=ids, attention_mask=mask)
        want = model(input_ids=ids, attention_mask=mask)
    keep = mask.bool()[..., None]
    assert _rel(got.last_hidden_state * keep, want.last_hidden_state * keep) <= 1e-5
    softmaxes = sum("amax" in f.ops for r in backend.reports for f in r.fused)
    assert softmaxes >= 2, [str(r) for r in backend.reports]


def _training_step_against_float64(model, seed: int):
    """One training step of ``model`` (in ``train()``) through the backend, the rest
    eager: the loss and every parameter's gradient against a float64 copy (a gradient
    that is 0 in exact arithmetic -- GPT-2's key bias under the softmax's shift -- is
    compared on the scale of the largest one). Returns the backend."""
    import copy

    from neptune_fusion.dynamo import Backend
    ref = copy.deepcopy(model).double()
    ids = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(seed))
    backend = Backend(rest="eager")
    torch._dynamo.reset()
    loss = torch.compile(model, backend=backend)(input_ids=ids, labels=ids).loss
    loss.backward()
    want = ref(input_ids=ids, labels=ids).loss
    want.backward()
    assert abs(loss.item() - want.item()) <= 1e-5 * abs(want.item())
    scale = max(float(q.grad.abs().max()) for q in ref.parameters())
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert float((p.grad.double() - q.grad).abs().max()) <= 1e-5 * scale, name
    # no kernel stores an output axis as a scalar loop around its epilogue (GPT-2's
    # first layer norm in training did, codegen/lower._roles)
    assert all(getattr(getattr(f.kernel, "program", None), "epi", ()) == ()
               for r in backend.reports for f in r.fused), [str(r) for r in backend.reports]
    return backend


def test_a_gpt2_training_step_through_the_backend_matches_float64():
    """A training step of a tiny GPT-2 (eager attention, no dropout) through the backend:
    AOTAutograd splits it with the min-cut partitioner; the layer norms and the loss's
    log-softmax are fused with what the backward saves among their outputs (a layer
    norm's result leaves for the next Linear layer and, transposed, for its weight's
    gradient: the matmul and the views run with the rest; before 2026-12-05 every layer
    norm before a Linear layer was refused in training). The attention becomes SDPA's
    call with ``is_causal=True`` (dynamo/written_attention.py: transformers' mask is
    built from positions); the layer norm after it, joined to it through the
    positions both read, fuses on its own. The loss and every parameter's gradient
    against the same model in float64."""
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4,
                                  bos_token_id=1, eos_token_id=2, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    backend = _training_step_against_float64(transformers.GPT2LMHeadModel(cfg).train(), 3)
    fused = [f.ops for r in backend.reports for f in r.fused]
    # each layer's two norms and the final one (the second of a layer since 2026-12-05:
    # partition.pieces splits it from the refused attention)
    assert sum("rsqrt" in ops for ops in fused) == 5, [str(r) for r in backend.reports]
    assert any("amax" in ops and "log" in ops for ops in fused), fused
    # transformers' causal mask, built from positions: flash attention's is_causal
    assert sum(len(x.ops) for r in backend.reports for x in r.left
               if "is_causal=True" in x.reason) == 2, [str(r) for r in backend.reports]


def test_a_bloom_training_step_takes_nf_attention_for_its_alibi():
    """A tiny Bloom (eager attention: ALiBi through ``baddbmm``, transformers' causal mask
    built from positions, a float32 softmax, ``bmm``) in a training step through the
    backend: each layer's attention becomes ``nf.attention``'s op with the bias read as
    data and its derived backward (dynamo/alibi_attention.py; it ran unfused before, its
    probabilities saved); the loss and every gradient against float64."""
    cfg = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4,
                                   hidden_dropout=0.0, attention_dropout=0.0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    backend = _training_step_against_float64(transformers.BloomForCausalLM(cfg).train(), 5)
    made = [x for r in backend.reports for x in r.left if "nf.attention's op" in x.reason]
    assert sum(len(x.ops) for x in made) == 2, [str(r) for r in backend.reports]
    # the op runs our kernels: never reported as a piece that cuts a chain, left to the rest
    assert not any("attention has no translation rule" in x.reason
                   for r in backend.reports for x in r.left), [str(r) for r in backend.reports]


def test_a_llama_training_step_with_eager_attention_takes_sdpa():
    """A tiny Llama with transformers' eager attention (GQA through ``repeat_kv``, an
    additive causal mask, the softmax in float32 cast back) in a training step through
    the backend: each layer's attention becomes SDPA's call with its own backward
    (dynamo/written_attention.py); the loss and every gradient against float64."""
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    backend = _training_step_against_float64(transformers.LlamaForCausalLM(cfg).train(), 4)
    made, causal = (sum(len(x.ops) for r in backend.reports for x in r.left if why in x.reason)
                    for why in ("made SDPA's call", "is_causal=True"))
    assert made == causal == 2, [str(r) for r in backend.reports]
