"""NaN through the GPU kernels, as PyTorch gives it (a check, not a timing).

The CPU tests (tests/codegen/test_nan_propagation.py) run the interpreter, which cannot
run the Gluon kernels or Triton's compiled reductions. This runs the same cases on the
GPU at sizes the auto-scheduler sends to them: attention prefill (Gluon on sm_90 with
Triton 3.6, else Triton) and split-k decode, fp16 and bf16, head dims 64 and 128, with a
NaN in one key of head 0 (every row of that head NaN), a NaN query of head 1 (that row
NaN), and a causal mask whose first row sees one key (finite); and the max chains
(``amax``, ``softmax(relu(x))``) through ``nf.compile``; and a ragged prefill whose
cache rows past each length hold NaN (no output may see them). NaN positions must equal
float64 torch's (a hidden score is -inf whatever it was), the rest stay within the
dtype's tolerance of float64. Usage (GPU): ``PYTHONPATH=src python
benchmarks/nan_check.py`` (``--smoke``: tiny shapes on the CPU, under the interpreter);
prints one JSON line per case and exits 1 if any case differs. Also infinities: rows
holding +inf, -inf or only -inf through a softmax and a log-sum-exp written out, and
attention with an infinite key (as the float64 reference gives them). And data far
from 0: softmax and log-softmax of rows around 1e4 and 1e6 within a few times eager
float32's own error.
"""

from __future__ import annotations

import json
import sys

import torch

import neptune_fusion as nf
from neptune_fusion.dynamo import jit as nf_jit
from neptune_fusion.ir.graph import placeholders

NAN = float("nan")


def _reference(q, k, v, causal: bool):
    """float64 attention whose causal mask replaces a hidden score, NaN or not, by -inf
    (the IR's definition; SDPA's math backend adds a -inf bias instead, which keeps a
    hidden NaN)."""
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        n, m = s.shape[-2:]
        keep = torch.ones(n, m, dtype=torch.bool, device=q.device).tril(m - n)
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1) @ v


def _compare(name: str, got, want, tol: float) -> bool:
    same_nan = torch.equal(got.isnan(), want.isnan())
    fin = ~want.isnan()
    err = (got.double()[fin] - want[fin]).abs().max().item() if fin.any() else 0.0
    ok = same_nan and err <= tol
    rows = got.isnan() if got.dim() == 1 else got.isnan().any(-1)
    print(json.dumps({"case": name, "ok": ok, "nan_positions_equal": same_nan,
                      "nan_rows": int(rows.sum()), "max_err": err}),
          flush=True)
    return ok


def attention_cases(dev, small: bool) -> bool:
    ok = True
    shapes = ((2048, 2048, True), (2048, 2048, False), (1, 8192, False))
    if small:
        shapes = ((130, 130, True), (1, 300, False))
    for dtype, tol in ((torch.float16, 2e-2), (torch.bfloat16, 6e-2)):
        for d in (64, 128):
            for n, m, causal in shapes:
                g = torch.Generator(device=dev).manual_seed(n + d)
                q, k, v = (torch.randn(1, 4, s, d, device=dev, dtype=dtype, generator=g)
                           for s in (n, m, m))
                k[0, 0, 100, 3] = NAN
                if n > 1:
                    q[0, 1, 7, 0] = NAN
                mask = (lambda b, h, i, j: j <= i) if causal else None
                got = nf.attention(q, k, v, mask_mod=mask)
                want = _reference(q, k, v, causal)
                name = f"attention {str(dtype)[6:]} d{d} {n}x{m}{' causal' if causal else ''}"
                ok &= _compare(name, got, want, tol)
    return ok


def ragged_cases(dev, small: bool) -> bool:
    """A ragged prefill (``kv_lens``): the cache rows at and past each length hold NaN,
    which no output may see; lengths that end inside a tile (the Gluon kernel reads
    that tile through a descriptor ending at the length) and on a tile's edge. GQA 4/2,
    causal, the queries the last ``n`` positions of each sequence; the automatic schedule
    and the Gluon one (on the GPU)."""
    from neptune_fusion.schedule.schedule import Schedule
    ok, n, slots = True, (40 if small else 300), (200 if small else 2048)
    lens = [n, 130, 197] if small else [300, 1000, 1777, 1024]
    schedules = {"auto": None}
    if not small:
        schedules["gluon 128x128"] = Schedule(block_m=128, block_n=128, num_warps=8,
                                              num_stages=2, dialect="gluon")
    causal = lambda b, h, i, j: j <= i   # noqa: E731  (absolute positions)
    for dtype, tol in ((torch.float16, 2e-2), (torch.bfloat16, 6e-2)):
        for d in (64, 128):
            g = torch.Generator(device=dev).manual_seed(d)
            q = torch.randn(len(lens), 4, n, d, device=dev, dtype=dtype, generator=g)
            k, v = (torch.randn(len(lens), 2, slots, d, device=dev, dtype=dtype,
                                generator=g) for _ in range(2))
            for b, L in enumerate(lens):
                k[b, :, L:] = NAN
                v[b, :, L:] = NAN
            kv_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
            want = torch.cat([_reference(q[b:b + 1], k[b:b + 1, :, :L].repeat_interleave(
                2, 1), v[b:b + 1, :, :L].repeat_interleave(2, 1), True)
                for b, L in enumerate(lens)])
            for name, sched in schedules.items():
                got = nf.attention(q, k, v, mask_mod=causal, kv_lens=kv_lens,
                                   enable_gqa=True, schedule=sched)
                ok &= _compare(f"ragged {str(dtype)[6:]} d{d} {name}", got, want, tol)
    return ok


def chain_cases(dev, small: bool) -> bool:
    ok = True
    N, D = nf.size("N"), 64 if small else 4096
    x = nf.placeholder((N, D), name="x")
    kk = nf.reduce_axis(D, "k")
    amax = nf.compute((N,), lambda i: nf.max(x[i, kk], kk), name="y")
    r = nf.compute(x.shape, lambda i, j: nf.maximum(x[i, j], 0.0), name="r")
    m = nf.compute((N,), lambda i: nf.max(r[i, kk], kk), name="m")
    s = nf.compute((N,), lambda i: nf.sum(nf.exp(r[i, kk] - m[i]), kk), name="s")
    soft = nf.compute(x.shape, lambda i, j: nf.exp(r[i, j] - m[i]) / s[i], name="y")
    xs = torch.randn(16 if small else 1024, D, device=dev) * 3
    xs[5, 17] = NAN
    xs[9, :] = NAN
    for name, out, eager in (("amax", amax, lambda t: t.amax(-1)),
                             ("softmax(relu)", soft, lambda t: torch.softmax(t.relu(), -1))):
        got = nf.compile(out, placeholders([out]), cache=False)(xs)
        ok &= _compare(f"chain {name}", got, eager(xs.double()), 1e-5)
    return ok


def _softmax_rows(small: bool):
    """``(x, m, s, softmax)``: a row maximum and the sum of ``exp(x - m)`` over rows of
    64 (smoke) or 4096, and the softmax they give."""
    N, D = nf.size("N"), 64 if small else 4096
    x = nf.placeholder((N, D), name="x")
    kk = nf.reduce_axis(D, "k")
    m = nf.compute((N,), lambda i: nf.max(x[i, kk], kk), name="m")
    s = nf.compute((N,), lambda i: nf.sum(nf.exp(x[i, kk] - m[i]), kk), name="s")
    return x, m, s, nf.compute(x.shape, lambda i, j: nf.exp(x[i, j] - m[i]) / s[i], name="y")


def infinity_cases(dev, small: bool) -> bool:
    """Rows holding +inf (softmax: a NaN row, as torch gives it), a row of -inf (the
    denominator and log-sum-exp written out: NaN) and a -inf element (the softmax
    finite), through ``nf.compile``; attention with a +inf score (that row NaN) and a
    causal row that sees one key (finite)."""
    ok = True
    x, m, s, soft = _softmax_rows(small)
    lse = nf.compute(m.shape, lambda i: m[i] + nf.log(s[i]), name="y")
    xs = torch.randn(16 if small else 1024, x.shape[1], device=dev) * 3
    xs[3, 11] = float("inf")
    xs[6, :] = float("-inf")
    xs[8, 2] = float("-inf")
    x64 = xs.double()
    mx = x64.amax(-1, keepdim=True)
    written = (mx + (x64 - mx).exp().sum(-1, keepdim=True).log())[:, 0]
    for name, out, want in (("softmax with infinities", soft, torch.softmax(x64, -1)),
                            ("max + log sum exp(x - max) with infinities", lse, written)):
        got = nf.compile(out, placeholders([out]), cache=False)(xs)
        ok &= _compare(f"chain {name}", got, want, 1e-5)
    n = 130 if small else 2048
    for dtype, tol in ((torch.float16, 2e-2), (torch.bfloat16, 6e-2)):
        g = torch.Generator(device=dev).manual_seed(7)
        q, k, v = (torch.randn(1, 2, n, 64, device=dev, dtype=dtype, generator=g)
                   for _ in range(3))
        k[0, 1, 40, :] = float("inf")   # q . k = +-inf or NaN at key 40 of head 1
        got = nf.attention(q, k, v, mask_mod=lambda b, h, i, j: j <= i)
        ok &= _compare(f"attention {str(dtype)[6:]} with an infinite key", got,
                       _reference(q, k, v, True), tol)
    return ok


def far_cases(dev, small: bool) -> bool:
    """Data far from 0 (a check of the natural maxima, codegen/exp2.py): softmax and
    log-softmax of float32 rows around 1e4 and 1e6, through
    ``nf.compile`` and the torch.compile backend, within eager float32's error of
    float64 (the GPU's ``exp2`` and ``log2`` are approximations; eager's are not exact
    either: the tolerances are a few times eager's own error)."""
    ok = True
    x, m, s, soft = _softmax_rows(small)
    outs = {"softmax": (soft, lambda t: torch.softmax(t, -1)),
            "log_softmax": (nf.compute(x.shape, lambda i, j: x[i, j] - m[i] - nf.log(s[i]),
                                       name="y"), lambda t: torch.log_softmax(t, -1))}
    for offset in (1e4, 1e6):
        xs = torch.randn(16 if small else 1024, x.shape[1], device=dev) * 2 + offset
        for name, (out, eager) in outs.items():
            want = eager(xs.double())
            tol = 4 * (eager(xs) - want).abs().max().item() + 1e-6
            got = nf.compile(out, placeholders([out]), cache=False)(xs)
            ok &= _compare(f"chain {name} near {offset:g}", got, want, tol)
            jit = nf_jit(eager)   # the backend (no entry point needed: not installed)
            ok &= _compare(f"jit {name} near {offset:g}", jit(xs), want, tol)
    return ok


def main() -> None:
    small = "--smoke" in sys.argv   # tiny shapes on the CPU (TRITON_INTERPRET=1)
    dev = torch.device("cpu" if small else "cuda")
    ok = attention_cases(dev, small)
    ok &= ragged_cases(dev, small)
    ok &= chain_cases(dev, small)
    ok &= infinity_cases(dev, small)
    ok &= far_cases(dev, small)
    print(json.dumps({"all_ok": ok, "device": "cpu" if small else torch.cuda.get_device_name(),
                      "torch": torch.__version__}), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
