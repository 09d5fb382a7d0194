"""A gpt-oss decode step with attention sinks: the merge after the kernel against the zero
key in front.

A measurement tool (docs/transformers.md, "Attention sinks"): one layer of gpt-oss's
shape (64 query heads, 8 key/value heads of 64, bf16, batch 1, one query over a static
cache of ``--slots`` slots with ``kv_lens`` on the device) through the Hugging Face
integration's per-layer call (``integrations.transformers._attend``, prepared on the
first call), two ways:

* ``merge``: the sinks merged after the kernel (what decode does now: the kernel also
  writes the row log-sum-exp, the output is scaled by ``sigmoid(lse - sink)`` in place);
* ``zero_key``: a zero key and value row prepended to the cache (a copy of K and V per
  call) whose score is the sink (what decode did before, and prefill still does).

Both outputs are checked against float64 first; then each is called ``--iters`` times in
an eager loop (host and GPU time per call, what a decode loop sees). Usage (GPU):
``PYTHONPATH=src python benchmarks/sinks_decode.py --out f.jsonl``; ``--smoke`` on CPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import torch


def reference(q, k, v, sinks, n, scale):
    """float64: softmax over [sink, scores of the first n keys], the sink's value 0."""
    hq, hkv = q.shape[1], k.shape[1]
    kk = k[:, :, :n].double().repeat_interleave(hq // hkv, 1)
    vv = v[:, :, :n].double().repeat_interleave(hq // hkv, 1)
    s = q.double() @ kk.transpose(-1, -2) * scale
    sink = sinks.double().view(1, hq, 1, 1).expand(*s.shape[:-1], 1)
    p = torch.softmax(torch.cat([sink, s], -1), -1)[..., 1:]
    return p @ vv


def merge(layer, q, k, v, sinks, kv_lens, scale):
    """The sinks merged after the kernel (the per-layer call's decode path)."""
    from neptune_fusion.integrations import transformers as hf
    what = (True, None, 0, False, None, False, scale, True)
    return hf._attend(layer, what, q, k, v, None, kv_lens, sinks)


def zero_key(layer, q, k, v, sinks, kv_lens, scale):
    """A zero key and value row in front, its score the sink (a copy of the cache)."""
    from neptune_fusion.integrations import transformers as hf
    what = (True, None, 1, False, None, True, scale, True)
    zk = k.new_zeros(k.shape[0], k.shape[1], 1, k.shape[3])
    kz, vz = torch.cat([zk, k], 2), torch.cat([zk, v], 2)
    return hf._attend(layer, what, q, kz, vz, {"sinks": sinks}, kv_lens + 1)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slots", type=int, default=32768)
    ap.add_argument("--lens", default="4096,32000")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    dev = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    slots, lens = (64, [5, 64]) if args.smoke else (args.slots, map(int, args.lens.split(",")))
    iters = 3 if args.smoke else args.iters
    hq, hkv, d, scale = 64, 8, 64, 64 ** -0.5
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(1, hq, 1, d, device=dev, generator=g).to(dtype)
    k = torch.randn(1, hkv, slots, d, device=dev, generator=g).to(dtype)
    v = torch.randn(1, hkv, slots, d, device=dev, generator=g).to(dtype)
    sinks = torch.randn(hq, device=dev, generator=g)
    for n in lens:
        kv_lens = torch.tensor([n], device=dev, dtype=torch.int32)
        want = reference(q, k, v, sinks, n, scale)
        layer = type("Layer", (), {})
        forms = (("merge", functools.partial(merge, layer(), q, k, v, sinks, kv_lens, scale)),
                 ("zero_key", functools.partial(zero_key, layer(), q, k, v, sinks, kv_lens,
                                                scale)))
        for name, fn in forms:
            rec = {"form": name, "kv_len": n, "slots": slots}
            got = fn()
            fn()
            rec["rel_err"] = ((got.double() - want).norm() / want.norm()).item()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            rec["us_per_call"] = (time.perf_counter() - t0) / iters * 1e6
            line = json.dumps(rec)
            print(line, flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(line + "\n")


if __name__ == "__main__":
    main()
