"""PyTorch modules through the torch.compile backend: ``nn.MultiheadAttention``,
``nn.GroupNorm`` (also at batch 1: ``group-norm-b1``), ``nn.InstanceNorm2d``, a batch
norm's training statistics (``batch-norm-stats``), Bloom's eager attention
(``bloom-attention``), a per-pixel cross-entropy (``pixel-cross-entropy``) and an
activation before a log-softmax (``mish-log-softmax``) (issue 19).

Usage:
    PYTHONPATH=src python benchmarks/jit_modules.py [--work mha,mha-causal,group-norm,...] \
        [--out FILE.jsonl] [--profile]

Each workload is a module in inference (``eval()``, no gradient), called through three
providers in one process: ``eager`` (the module itself), ``inductor``
(``torch.compile(module)``) and ``jit`` (``nf.jit(module)``). The jit opens
``nn.MultiheadAttention``'s SDPA kernel to its math and fuses the attention
(docs/jit.md, "nn.MultiheadAttention is opened at SDPA's device kernel"), and fuses group
norm's statistics, normalisation and affine on the group view. Every output is checked
against a float64 copy of the module first (relative error, printed); GPU time from
CUDA-graph replay (``gpu_ms``) and an eager call's time (``ms``, ``do_bench``). On a CPU
the sizes are tiny, the kernels run under the interpreter and times mean nothing.
"""

from __future__ import annotations

import copy
import json

import torch
from jit_dynamic import cli, first_call, kernels, timers

from neptune_fusion.dynamo import jit


def _mha(causal: bool):
    def make(big: bool, dtype, dev, gen):
        e, h, b, n = (1024, 16, 4, 4096) if big else (32, 4, 2, 10)
        m = torch.nn.MultiheadAttention(e, h, batch_first=True, device=dev)
        x = torch.randn(b, n, e, device=dev, generator=gen)
        kw = {"need_weights": False}
        if causal:
            kw |= {"attn_mask": torch.nn.Transformer.generate_square_subsequent_mask(
                n, device=dev), "is_causal": True}

        def fn(mod, x):
            mask = kw.get("attn_mask")
            extra = {} if mask is None else {"attn_mask": mask.to(x.dtype)}
            return mod(x, x, x, **{**kw, **extra})[0]
        return m, (x,), fn
    return make


def _group_norm(silu: bool, batch: int = 16):
    def make(big: bool, dtype, dev, gen):
        n, c, hw, g = (batch, 512, 64, 32) if big else (2, 16, 5, 4)
        m = torch.nn.GroupNorm(g, c, device=dev)
        with torch.no_grad():
            m.weight.normal_(generator=gen)
            m.bias.normal_(generator=gen)
        x = torch.randn(n, c, hw, hw, device=dev, generator=gen) * 2.0 + 1.0

        def fn(mod, x):
            y = mod(x)
            return torch.nn.functional.silu(y) if silu else y
        return m, (x,), fn
    return make


def _instance_norm(big: bool, dtype, dev, gen):
    n, c, hw = (16, 256, 64) if big else (2, 3, 5)
    m = torch.nn.InstanceNorm2d(c, affine=True, device=dev)
    with torch.no_grad():
        m.weight.normal_(generator=gen)
        m.bias.normal_(generator=gen)
    x = torch.randn(n, c, hw, hw, device=dev, generator=gen) * 2.0 + 1.0
    return m, (x,), lambda mod, x: mod(x)


def _batch_norm(big: bool, dtype, dev, gen):
    """A batch norm's training statistics (``F.batch_norm(..., training=True)``, no
    running statistics) over ``(0, 2, 3)``: axes that are not adjacent. Fused as one
    reduction over their merge it ran at 0.07x Inductor (2026-12-05); the op now stays
    with Inductor (``chains fused`` 0), and ``bn_probe.py`` times the kernels."""
    n, c, hw = (32, 64, 56) if big else (3, 4, 5)
    m = torch.nn.BatchNorm2d(c, device=dev)
    with torch.no_grad():
        m.weight.normal_(generator=gen)
        m.bias.normal_(generator=gen)
    x = torch.randn(n, c, hw, hw, device=dev, generator=gen) * 2.0 + 1.0
    return m, (x,), lambda mod, x: torch.nn.functional.batch_norm(
        x, None, None, mod.weight, mod.bias, training=True, eps=mod.eps)


def _wide(x):
    """16-bit data computed in float32 (the float64 reference stays float64)."""
    return x.float() if x.element_size() < 4 else x


def _bloom_attention(big: bool, dtype, dev, gen):
    """Bloom's eager attention: ``baddbmm`` of its ALiBi bias and the scaled scores, a
    causal ``masked_fill`` with ``finfo.min`` (not -inf: every tile is visited), a float32
    softmax, ``bmm`` with the values (``baddbmm`` had no rule before 2026-12-05)."""
    bh, n, d = (32, 2048, 128) if big else (4, 9, 16)
    q, k, v = (torch.randn(bh, n, d, device=dev, generator=gen) for _ in range(3))
    bias = torch.randn(bh, 1, n, device=dev, generator=gen)
    keep_out = torch.triu(torch.ones(n, n, dtype=torch.bool, device=dev), 1)

    def fn(mod, q, k, v, bias):
        s = torch.baddbmm(bias, q, k.transpose(1, 2), beta=1.0, alpha=d ** -0.5)
        s = s.masked_fill(keep_out, torch.finfo(s.dtype).min)
        p = torch.nn.functional.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.bmm(p, v)
    return torch.nn.Identity(), (q, k, v, bias), fn


def _pixel_cross_entropy(big: bool, dtype, dev, gen):
    """A segmentation loss: ``F.cross_entropy`` over ``(N, C, H, W)`` per pixel
    (``nll_loss2d``, a gather along the classes since 2026-12-05)."""
    n, c, hw = (8, 19, 256) if big else (2, 5, 4)
    x = torch.randn(n, c, hw, hw, device=dev, generator=gen) * 3.0
    t = torch.randint(0, c, (n, hw, hw), device=dev, generator=gen)
    return torch.nn.Identity(), (x, t), lambda mod, x, t: torch.nn.functional.cross_entropy(
        _wide(x), t, reduction="none")


def _activation_softmax(big: bool, dtype, dev, gen):
    """``log_softmax(mish(x))``: the activation joins the chain's kernel (2026-12-05;
    before, a kernel of its own wrote ``mish(x)`` whole)."""
    n, v = (4096, 8192) if big else (3, 40)
    x = torch.randn(n, v, device=dev, generator=gen) * 2.0
    return torch.nn.Identity(), (x,), lambda mod, x: torch.log_softmax(
        torch.nn.functional.mish(_wide(x)), -1)


WORK = {"mha": _mha(False), "mha-causal": _mha(True), "group-norm": _group_norm(False),
        "group-norm-silu": _group_norm(True), "instance-norm": _instance_norm,
        # a diffusion model's decoder at batch 1: 32 groups, fewer rows than multiprocessors
        "group-norm-b1": _group_norm(False, batch=1), "batch-norm-stats": _batch_norm,
        "bloom-attention": _bloom_attention, "pixel-cross-entropy": _pixel_cross_entropy,
        "mish-log-softmax": _activation_softmax}


def run(name: str, device: str, profile: bool = False) -> list[dict]:
    big = device == "cuda"
    dtype = torch.float16 if big else torch.float32
    gen = torch.Generator(device=device)
    gen.manual_seed(7)
    mod, args, fn = WORK[name](big, dtype, device, gen)
    mod = mod.eval()
    ref_mod = copy.deepcopy(mod).double()
    mod = mod.to(dtype)
    args = tuple(a.to(dtype) if a.is_floating_point() else a for a in args)
    with torch.no_grad():
        ref = fn(ref_mod, *(a.double() if a.is_floating_point() else a for a in args))
    torch._dynamo.reset()
    providers = {"eager": lambda *a: fn(mod, *a),
                 "inductor": torch.compile(lambda *a: fn(mod, *a)),
                 "jit": jit(lambda *a: fn(mod, *a))}
    time_of = timers(device)
    rows = []
    with torch.no_grad():
        for pname, call in providers.items():
            out, first = first_call(call, args, device)
            reports = getattr(getattr(call, "backend", None), "reports", None)
            row = {"work": name, "provider": pname, "shape": [list(a.shape) for a in args],
                   "dtype": str(dtype).removeprefix("torch."),
                   "first_call_s": round(first, 3),
                   "rel_err": float((out.double() - ref).norm() / ref.norm()),
                   "fused": sum(len(r.fused) for r in reports) if reports else None}
            row |= {k: t(lambda c=call: c(*args)) for k, t in time_of.items()}
            if profile:
                row["kernels"] = kernels(lambda c=call: c(*args), device)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    key = "gpu_ms" if all("gpu_ms" in r for r in rows) else "ms"
    out = [f"| work | dtype | eager {key} | inductor {key} | jit {key} | x eager | "
           "x inductor | chains fused | jit first call s | jit rel. err |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    by = {(r["work"], r["provider"]): r for r in rows}
    for (work, p), r in by.items():
        if p != "jit":
            continue
        e, i = by[(work, "eager")], by[(work, "inductor")]
        out.append(f"| {work} | {r['dtype']} | {e[key]:.4f} | {i[key]:.4f} | {r[key]:.4f} | "
                   f"{e[key] / r[key]:.2f}x | {i[key] / r[key]:.2f}x | {r['fused']} | "
                   f"{r['first_call_s']:.2f} | {r['rel_err']:.1e} |")
    return "\n".join(out)


def main() -> None:
    cli(WORK, run, table, __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
