"""Compile a Gluon or Triton kernel for sm_90 on any machine (no GPU): Triton's compiler
and its own ``ptxas``, which reports registers and spills, and ``nvdisasm``, whose SASS
is counted. Shared by the probes (``gluon_probe.py``, ``gluon_generated.py``,
``paged_sass.py``); needs a Triton whose API the kernel is written in (3.6, the
device's)."""
import os
import re
import subprocess
import tempfile

# a predicate (@P0, @!UPT, ...) before an instruction; a branch and its label
_PRED = r"@!?U?P[T\d]+\s+"
_BRANCH = re.compile(r"BRA\s+`?\(?(\.L_x_\d+)")


def compile_sm90(fn, signature: dict, constexprs: dict, num_warps: int):
    """``(compiled kernel, ptxas's register and spill lines)``; raises what Triton
    raises."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    k = triton.compile(GluonASTSource(fn, signature, constexprs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    return k, _ptxas(k)


def _tool(name: str) -> str:
    import triton.backends.nvidia as nvidia
    return os.path.join(os.path.dirname(nvidia.__file__), "bin", name)


def _ptxas(kernel) -> str:
    """ptxas's register and spill lines for ``kernel``'s PTX (sm_90a)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(kernel.asm["ptx"])
        out = subprocess.run([_tool("ptxas"), "-v", "--gpu-name", "sm_90a", path, "-o",
                              path + ".o"], capture_output=True, text=True).stderr
    return " | ".join(line.split(":", 1)[-1].strip() for line in out.splitlines()
                      if "registers" in line or "spill" in line)


def _sass(kernel) -> str:
    """``kernel``'s SASS (``nvdisasm`` of its cubin)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        return subprocess.run([_tool("nvdisasm"), "-c", path], capture_output=True,
                              text=True).stdout


def sass_counts(kernel, opcodes=("I2FP", "I2F", "FFMA", "FMUL", "FADD", "MUFU", "IADD3",
                                 "VIADD")) -> dict:
    """Static counts of some opcodes in ``kernel``'s sm_90 SASS (``nvdisasm`` of its
    cubin; every path of the kernel once, not per executed tile) and of all
    instructions: a CPU-side view of what an edit of the source changes."""
    sass = _sass(kernel)
    names = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:" + _PRED + r")?([A-Z][A-Z0-9_]*)", sass)
    return {"all": len(names), **{op: names.count(op) for op in opcodes}}


def compile_triton_sm90(fn, constexprs: dict, num_warps: int, num_stages: int,
                        dtype: str = "fp16"):
    """A generated Triton kernel (``fn``, loaded from its source) compiled for sm_90,
    its arguments typed as the JIT types those of a decode's tensors: ``*_ptr``
    pointers 16-byte aligned (``dtype``; int32 for ``kv_lens`` and ``block_table``, fp32
    for split-k workspaces), the strides ``*_s0`` .. ``*_s2`` (not the block table's)
    i32 multiples of 16, everything else plain i32. ``(kernel, ptxas's lines)``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = ("*i32" if name.startswith(("kv_lens", "block_table")) else
                         "*fp32" if name.startswith("ws_") else "*" + dtype)
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "i32"
            if re.fullmatch(r"(?!block_table)\w+_s[0-2]", name):
                attrs[(i,)] = [["tt.divisibility", 16]]
    k = triton.compile(ASTSource(fn, sig, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": num_warps, "num_stages": num_stages})
    return k, _ptxas(k)


def _instructions(kernel) -> tuple[dict, list]:
    """``({label: index}, [instruction text])`` of ``kernel``'s sm_90 SASS."""
    labels, ins = {}, []
    for line in _sass(kernel).splitlines():
        got = re.match(r"^(\.L_x_\d+):", line.strip())
        if got:
            labels[got.group(1)] = len(ins)
            continue
        got = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if got:
            ins.append(got.group(1))
    return labels, ins


def _loops(labels: dict, ins: list, least: int) -> list[tuple[int, int]]:
    """``(first, last)`` instruction of each loop: a backward branch to a label."""
    out = []
    for i, text in enumerate(ins):
        got = _BRANCH.search(text)
        if got and labels.get(got.group(1), i) < i and i + 1 - labels[got.group(1)] >= least:
            out.append((labels[got.group(1)], i))
    return out


def sass_loops(kernel, least: int = 60) -> list[tuple[int, dict]]:
    """The loops of ``kernel``'s sm_90 SASS (a backward branch to a label and the
    instructions from that label to it) of at least ``least`` instructions, in order:
    ``(instructions, {opcode: count})``, the most frequent opcodes first. The count
    holds every branch of the body once; :func:`sass_paths` gives what one pass costs."""
    from collections import Counter

    labels, ins = _instructions(kernel)
    loops = []
    for first, last in _loops(labels, ins, least):
        body = ins[first:last + 1]
        ops = Counter(re.match(r"(?:" + _PRED + r")?([A-Z][A-Z0-9_]*)", x).group(1)
                      for x in body)
        loops.append((len(body), dict(ops.most_common(12))))
    return loops


def sass_paths(kernel, least: int = 60) -> list[tuple[int, int, int]]:
    """Per loop of :func:`sass_loops`: ``(instructions, shortest, longest)``, the
    instructions issued by one pass from the loop's label to its backward branch along
    the shortest and the longest forward path (inner loops -- a barrier's wait -- counted
    once). For a tile loop whose body branches on the tile's kind, the shortest pass is
    usually an interior tile and the longest a masked one: what one tile costs each
    thread in issue slots."""
    labels, ins = _instructions(kernel)
    out = []
    for first, last in _loops(labels, ins, least):
        # forward-branch DAG over the body's instructions: best[i] = (short, long) from i
        best = {last + 1: (0, 0)}
        for i in range(last, first - 1, -1):
            text = ins[i]
            nxt = [i + 1] if i < last else [last + 1]
            got = _BRANCH.search(text)
            if got and i < last:
                to = labels.get(got.group(1))
                cond = re.match(_PRED, text) is not None
                if to is not None and i < to <= last + 1:
                    nxt = [to, i + 1] if cond else [to]
                elif to is not None and not cond:
                    nxt = [last + 1] if to > last else [i + 1]   # leaves, or an inner loop
            if re.match(r"(?:" + _PRED + r")?(EXIT|RET)", text):
                nxt = [last + 1]
            opts = [best[j] for j in nxt if j in best]
            best[i] = (1 + min(o[0] for o in opts), 1 + max(o[1] for o in opts))
        out.append((last + 1 - first, *best[first]))
    return out
