"""The attention call of a Llama-1B prefill over a static cache, alone: our tiles and
cuDNN's SDPA on the same tensors.

A measurement tool (docs/transformers.md, "Speed"): the call the Hugging Face
integration makes for an 8192-token prefill of the Llama-1B-shaped model (bf16, 32 query
heads over 8 key/value heads of 64, a static cache of ``--slots`` slots of which
``kv_lens = 8192`` are filled, the causal ``mask_mod``, ``q`` a transposed view of the
projection's (B, S, H, D) output). Times (``do_bench``, ms): the automatic schedule (tuned
here; ``NEPTUNE_FUSION_LOG=1`` prints the tuner's table), each ``--tiles`` schedule
explicitly, the same call without ``kv_lens`` over the 8192 filled keys, the call with
``out=`` a (B, S, H, D) buffer against the call plus the transposing copy, and cuDNN's
SDPA (``is_causal``, ``enable_gqa``) over the filled keys. Every output is checked
against float64 on two heads first. Usage (GPU): ``PYTHONPATH=src:benchmarks python
benchmarks/hf_attention_probe.py --out DIR``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def reference_heads(q, k, v, n_valid: int, heads=(0, 31)):
    """float64 causal attention of the queries at the end of ``n_valid`` keys, per head."""
    out = {}
    group = q.shape[1] // k.shape[1]
    for h in heads:
        qh = q[0, h].double()
        kh, vh = k[0, h // group, :n_valid].double(), v[0, h // group, :n_valid].double()
        s = qh @ kh.T * qh.shape[-1] ** -0.5
        i = torch.arange(qh.shape[0], device=q.device)[:, None] + n_valid - qh.shape[0]
        j = torch.arange(n_valid, device=q.device)[None, :]
        out[h] = torch.softmax(s.masked_fill(j > i, float("-inf")), -1) @ vh
    return out


def worst_error(o, ref) -> float:
    return max(float((o[0, h].double() - r).norm() / r.norm()) for h, r in ref.items())


def main(argv=None) -> None:
    from triton.testing import do_bench

    import neptune_fusion as nf
    from neptune_fusion.frontend.attention import AttentionCache
    from neptune_fusion.integrations.transformers import _mask_mod
    from neptune_fusion.schedule.schedule import Schedule
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt", type=int, default=8192)
    ap.add_argument("--slots", type=int, default=8456)
    ap.add_argument("--tiles", default="128x64x8x3,128x64x4x3,128x128x8x3,64x64x4x3")
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    n, dev, dt = args.prompt, "cuda", torch.bfloat16
    q = torch.randn(1, n, 32, 64, device=dev, dtype=dt).transpose(1, 2)
    k, v = (torch.randn(1, 8, args.slots, 64, device=dev, dtype=dt) for _ in range(2))
    lens = torch.tensor([n], device=dev, dtype=torch.int32)
    ref = reference_heads(q, k, v, n)
    mask = _mask_mod(True, None, 0, False)
    rows = []

    def record(name, fn, **extra):
        o = fn()
        err = worst_error(o, ref)
        ms = do_bench(fn)
        rows.append(dict(name=name, ms=ms, error=err, **extra))
        print(json.dumps(rows[-1]), flush=True)

    def ours(schedule=None, cache=None, out=None, kv=True):
        kk, vv = (k, v) if kv else (k[:, :, :n], v[:, :, :n])
        return nf.attention(q, kk, vv, mask_mod=mask, scale=0.125, enable_gqa=True,
                            kv_lens=lens if kv else None, q_offset=None if kv else "end",
                            schedule=schedule, cache=cache, out=out)
    auto = AttentionCache()
    record("auto", lambda: ours(cache=auto))
    from neptune_fusion.frontend.attention import _resolve
    setup, tensors = _resolve(q, k, v, None, mask, 0.125, True, None, None, auto, None,
                              lens, None)
    chosen = setup.kernel.kernel_for(*tensors).schedule
    print("chosen:", chosen, flush=True)
    fresh = AttentionCache()
    record("chosen-explicit", lambda: ours(schedule=chosen, cache=fresh), schedule=str(chosen))
    for tile in args.tiles.split(","):
        bm, bn, w, st = map(int, tile.split("x"))
        s = Schedule(block_m=bm, block_n=bn, num_warps=w, num_stages=st)
        c = AttentionCache()
        try:
            record(f"tile {tile}", lambda s=s, c=c: ours(schedule=s, cache=c))
        except Exception as err:   # a tile that does not fit: recorded
            rows.append(dict(name=f"tile {tile}", error=repr(err)[:200]))
    no_kv = AttentionCache()
    record("auto, no kv_lens (8192 keys, q at the end)", lambda: ours(cache=no_kv, kv=False))
    buf = torch.empty(1, n, 32, 64, device=dev, dtype=dt)
    record("auto, out= (B, S, H, D)", lambda: ours(cache=auto, out=buf.transpose(1, 2)))
    record("auto + transpose copy", lambda: ours(cache=auto).transpose(1, 2).contiguous()
           .transpose(1, 2))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        record("cuDNN SDPA", lambda: sdpa(q, k[:, :, :n], v[:, :, :n], is_causal=True,
                                          enable_gqa=True, scale=0.125))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hf_attention_probe.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
