"""What one key tile of the serving decode costs in instructions, on any machine.

The split-k partial kernel of a B = 1 decode (32 query heads, ``--kv-heads``, head dim
128, fp16, the schedule ``--schedule``: splits x key tile / warps / stages, the
gathered loop pipelined ``2s - 1`` deep as the tuner asks at B = 1) is generated on the
CPU for a contiguous cache and for page pools of ``--pages``, compiled for sm_90 with
Triton's compiler and ``ptxas`` (``sm90.compile_triton_sm90``; needs a Triton with the
NVIDIA backend, 3.6 as on the device), and each tile loop's SASS counted
(``sm90.sass_loops``): interior tiles first, then the masked ones. A paged kernel is
compiled twice, with its pools' strides as constants (``k_DENSE``, a dense pool) and
as arguments (any other layout). Static counts, not time: docs/serving.md says what
they predicted and what the GPU measured.

Usage: ``PYTHONPATH=<triton 3.6>:src:benchmarks python benchmarks/paged_sass.py``.
"""
import argparse
import os

import torch


class _Generated(Exception):
    """Raised by the loader: the kernels are generated, not run, here."""


def sources(page: int, hkv: int, schedule: str) -> str:
    """The partial kernel's source for pages of ``page`` keys (0: a contiguous cache)."""
    os.environ["TRITON_INTERPRET"] = "1"     # the CPU path: tensors need no GPU
    from neptune_fusion.frontend.attention import AttentionCache, attention
    from neptune_fusion.runtime import kernel as kernel_mod
    from neptune_fusion.schedule.schedule import Schedule

    got = {}
    plain = kernel_mod.load_kernel_module

    def load(source, name, interpret):
        got[name] = source
        raise _Generated
    ks, warps, stages = schedule.split("/")
    splits, bn = (int(x) for x in ks.split("x"))
    s = Schedule(block_m=16, block_n=bn, num_warps=int(warps), num_stages=int(stages),
                 strategy="split", splits=splits, gather_stages=2 * int(stages) - 1)
    keys, d = 2048, 128
    q = torch.randn(1, 32, 1, d, dtype=torch.float16)
    if page:
        k = torch.randn(2 * keys // page, hkv, page, d, dtype=torch.float16)
        table = torch.arange(keys // page, dtype=torch.int32)[None]
    else:
        k, table = torch.randn(1, hkv, keys, d, dtype=torch.float16), None
    kernel_mod.load_kernel_module = load
    try:
        attention(q, k, k, kv_lens=torch.tensor([keys - 3], dtype=torch.int32),
                  block_table=table, enable_gqa=hkv != 32, schedule=s,
                  cache=AttentionCache(store=False))
    except _Generated:
        pass
    finally:
        kernel_mod.load_kernel_module = plain
    [(name, src)] = [(n, t) for n, t in got.items() if n.endswith("_partial")]
    return name, src, bn, int(warps), int(stages)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", default="16,64", help="page sizes (the contiguous cache too)")
    ap.add_argument("--kv-heads", type=int, default=32)
    ap.add_argument("--schedule", default="4x128/4/3", help="splits x tile / warps / stages")
    a = ap.parse_args()
    from sm90 import compile_triton_sm90, sass_loops, sass_paths

    from neptune_fusion.runtime.loader import load_kernel_module

    for page in [0] + [int(p) for p in a.pages.split(",")]:
        name, src, bn, warps, stages = sources(page, a.kv_heads, a.schedule)
        fn = getattr(load_kernel_module(src, name, False), name)
        dense = [(False,)] if not page else [(True,), (False,)]
        for (flag,) in dense:
            consts = dict(BLOCK_M=16, BLOCK_N=bn, BLOCK_E=128, BLOCK_C=128, INTERPRET=False)
            if page:
                consts.update(k_DENSE=flag, v_DENSE=flag)
            k, info = compile_triton_sm90(fn, consts, warps, stages)
            what = "contiguous" if not page else \
                f"pages of {page}, strides {'constant' if flag else 'arguments'}"
            print(f"{what}: {info}")
            for (n, ops), (_, short, long) in zip(sass_loops(k), sass_paths(k)):
                print(f"  loop of {n} instructions (a pass: {short}-{long}): {ops}")


if __name__ == "__main__":
    main()
