"""Can Triton 3.6 merge split-k states across the CTAs of a thread-block cluster?

Issue 17's last point (B = 1, 32/32 heads, shuffled pages of 16 against cuDNN) is the
split-k combine's 2-3 us (docs/serving.md). A Hopper-native decode merges a head's splits
inside one launch: each split one CTA of a cluster, the states exchanged through
distributed shared memory. In Gluon (Triton 3.6, the device's) a cluster is a launch with
``num_ctas > 1`` and a layout whose ``cga_layout`` spreads a dimension over the CTAs. This
probe compiles, for sm_90 on any machine, the two ways such a merge could be written:

* ``reduce``: the states as one ``[S, D]`` tensor, its split axis over the S CTAs, merged
  by ``gl.max`` / ``gl.sum`` along that axis;
* ``convert``: the same tensor first converted to a layout every CTA holds whole
  (``gl.convert_layout``), then merged in each CTA.

Each variant compiles in its own process (a failed lowering may abort). Found on
2026-12-06 (Triton 3.6.0): neither compiles -- ``reduce`` stops at the assertion
``isReduceWithinCTA`` in ``ReduceOpConversion`` and ``convert`` at ``nvvm.mapa``'s result
address space (the lowering of a cross-CTA conversion); the front end also needs
``cga_layout`` as tuples of ints (it compares layouts rebuilt from the IR, whose bases
are lists). So the cluster merge needs inline PTX or another vehicle.

Usage (CPU): ``PYTHONPATH=/path/to/triton-3.6 python benchmarks/cluster_probe.py``.
"""
import subprocess
import sys

VARIANTS = ("reduce", "convert")


def _compile(variant: str, splits: int = 4, cols: int = 128) -> dict:
    """Compile ``variant`` for sm_90 with ``num_ctas=splits``; which cluster
    instructions its PTX holds."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.experimental.gluon.language import _layouts

    plain = _layouts.BlockedLayout.__post_init__

    def tuples(self):  # the front end's layout comparison needs hashable int bases
        plain(self)
        object.__setattr__(self, "cga_layout", tuple(
            tuple(int(getattr(v, "value", v)) for v in base) for base in self.cga_layout))
    _layouts.BlockedLayout.__post_init__ = tuples

    @gluon.jit
    def merge(x_ptr, o_ptr, S: gl.constexpr, D: gl.constexpr, CONVERT: gl.constexpr):
        split: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, 4], [1, 0],
                                               ((1, 0), (2, 0)))
        whole: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, 4], [1, 0],
                                               ((0, 0), (0, 0)))
        rows = gl.arange(0, S, layout=gl.SliceLayout(1, split))
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, split))
        x = gl.load(x_ptr + rows[:, None] * D + cols[None, :])
        if CONVERT:
            x = gl.convert_layout(x, whole)
        m = gl.max(x, axis=0)
        y = gl.sum(gl.exp(x - m[None, :]), axis=0)
        out = gl.arange(0, D, layout=y.type.layout)
        gl.store(o_ptr + out, y)

    sig = {"x_ptr": "*fp32", "o_ptr": "*fp32", "S": "constexpr", "D": "constexpr",
           "CONVERT": "constexpr"}
    k = triton.compile(GluonASTSource(merge, sig, {"S": splits, "D": cols,
                                                   "CONVERT": variant == "convert"}),
                       target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4, "num_ctas": splits})
    ptx = k.asm["ptx"]
    return {w: ptx.count(w) for w in ("mapa", "shared::cluster", "barrier.cluster")}


def main() -> None:
    if len(sys.argv) == 2:  # the child: one variant
        print(_compile(sys.argv[1]))
        return
    import triton
    print(f"Triton {triton.__version__}, sm_90, 4 CTAs a cluster, 128 columns")
    for variant in VARIANTS:
        run = subprocess.run([sys.executable, __file__, variant], capture_output=True,
                             text=True)
        lines = (run.stdout + run.stderr).splitlines()
        why = [line for line in lines if "Assertion" in line or "error:" in line]
        got = [line for line in lines if line.startswith("{")]
        said = got[0] if run.returncode == 0 and got else (why or lines)[0]
        print(f"{variant:8s} {'compiled' if run.returncode == 0 else 'failed':9s} {said[:220]}")


if __name__ == "__main__":
    main()
