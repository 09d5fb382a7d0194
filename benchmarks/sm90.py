"""Compile a Gluon kernel for sm_90 on any machine (no GPU): Triton's compiler and its
own ``ptxas``, which reports registers and spills. Shared by the Gluon probes
(``gluon_probe.py``, ``gluon_generated.py``); needs a Triton whose Gluon API the kernel is
written in (3.6)."""
import os
import subprocess
import tempfile


def compile_sm90(fn, signature: dict, constexprs: dict, num_warps: int):
    """``(compiled kernel, ptxas's register and spill lines)``; raises what Triton
    raises."""
    import triton
    import triton.backends.nvidia as nvidia
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    k = triton.compile(GluonASTSource(fn, signature, constexprs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    ptxas = os.path.join(os.path.dirname(nvidia.__file__), "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(k.asm["ptx"])
        out = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", path, "-o", path + ".o"],
                             capture_output=True, text=True).stderr
    info = [line.split(":", 1)[-1].strip() for line in out.splitlines()
            if "registers" in line or "spill" in line]
    return k, " | ".join(info)


def sass_counts(kernel, opcodes=("I2FP", "I2F", "FFMA", "FMUL", "FADD", "MUFU", "IADD3",
                                 "VIADD")) -> dict:
    """Static counts of some opcodes in ``kernel``'s sm_90 SASS (``nvdisasm`` of its
    cubin; every path of the kernel once, not per executed tile) and of all
    instructions: a CPU-side view of what an edit of the source changes."""
    import re

    import triton.backends.nvidia as nvidia
    nvdisasm = os.path.join(os.path.dirname(nvidia.__file__), "bin", "nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        sass = subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True).stdout
    names = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*)", sass)
    return {"all": len(names), **{op: names.count(op) for op in opcodes}}
