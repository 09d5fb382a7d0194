"""The torch.compile backend: capture, fuse the chains, hand the rest on.

    Dynamo FX graph --AOTAutograd (decomp.py's table, inference)--> ATen graph
      --partition.regions--> regions --translate--> nf program --has_chain?-->
      nf.compile + one trial call (once per region structure: memo.py)
      --> the region replaced by neptune_fusion::fused
      --> the rewritten graph to Inductor (inductor.py: compile_fx_inner) or run eagerly

Static and dynamic graphs alike: a dynamic graph's symbolic sizes are the program's sizes
(symbolic.py), and its symbolic-int inputs are values, not kernel arguments.

A graph that needs a backward (grad enabled and an input requiring grad) is split by
AOTAutograd into a forward and a backward graph, both derived from the original ATen ops;
the forward is fused as an inference graph is -- every value the backward saves is used
outside its region, so it is one of the kernel's outputs -- and the backward goes to the
rest as it is (the kernel op needs no derivative: autograd never sees it). Any failure
of a region --
no rule, a refused translation, a compiler error, a failed trial call -- leaves that
region in the graph with the reason in the report; the backend never raises for it.
"""

from __future__ import annotations

import functools
import sys
import time

import torch

from .. import settings
from .alibi_attention import alibi_attention_to_nf
from .decomp import KEPT_WHOLE, decompositions, over, sdpa_calls, swap_sdpa
from .gqa import packing
from .inductor import GraphArgs, compile_rest, inductor_patches, partition
from .memo import Compiled, region_key
from .partition import (
    LINEAR_PRODUCTS,
    boundaries,
    depends_on_itself,
    has_chain,
    pieces,
    prologue_with_unit_rows,
    recomputed_extremum,
    regions,
    why_not_fusible,
    without_prologue,
    without_trailing_matmuls,
    without_views,
    without_written_operands,
)
from .refused import Refused
from .report import Fused, GraphReport, Left
from .rewrite import finish, output_orders, propagate, replace_region, trial
from .rules import RULES
from .sink import sink_views
from .symbolic import arg_shape, hints_of, is_scalar_value, shape_of, unbound_scalars
from .translate import translate_region
from .written_attention import causal_masks_to_is_causal, written_attention_to_sdpa

RESTS = ("inductor", "eager")
_CHAIN_KINDS = {"reduction", "contraction"}


def fp32_precision() -> str:
    """The ``tl.dot`` precision of float32 products, as torch's own setting has it for its
    matmuls (what Inductor follows too): ``"tf32"`` when
    ``torch.backends.cuda.matmul.allow_tf32`` is on or the float32 matmul precision is
    not ``"highest"``, else exact. (A translated float32 RMSNorm -> matmul ran 6.7x
    slower than the same chain under TF32 on the H200 while torch used TF32.)"""
    tf32 = torch.backends.cuda.matmul.allow_tf32 or \
        torch.get_float32_matmul_precision() != "highest"
    return "tf32" if tf32 else "ieee"


def fuse(gm, example_inputs, report: GraphReport, rest: str, prefix: str,
         training: bool = False) -> None:
    """Rewrite ``gm`` (an ATen inference graph, or a training forward: ``training``) in
    place: every region with a dependent chain that compiles becomes one kernel call;
    ``report`` gets each outcome."""
    hints = hints_of(example_inputs)   # a dynamic graph's symbols: example values
    report.dynamic = {str(sym): v for sym, v in sorted(hints.items(), key=str)}
    changed, seen, memo = False, set(), {}
    if sink_views(gm.graph):   # maps after a reshape join the chain before it (sink.py)
        propagate(gm, example_inputs)
    for node in gm.graph.nodes:   # a reduction no rule takes: no region says why
        rule = RULES.get(node.target) if node.op == "call_function" else None
        why = why_not_fusible(node) if rule is not None and rule.kind == "reduction" \
            else KEPT_WHOLE.get(node.target) if node.op == "call_function" else None
        if why is not None:
            seen.add(node.name)
            report.left.append(Left((node.name,), f"a reduction left out: {why}", rest))
    for k, region in enumerate(regions(gm.graph)):
        if not region.kinds() & _CHAIN_KINDS or not region.outputs:
            continue
        for node, why in boundaries(region):
            # our own ops (nf.attention's, a compiled operator's) run our kernels: not left
            if node.name not in seen and \
                    getattr(node.target, "namespace", None) != "neptune_fusion":
                seen.add(node.name)
                report.left.append(Left((node.name,), f"cuts a chain: {why}", rest))
        name, fused = f"{prefix}_{k}", len(report.fused)
        left = _fuse_region(gm, memo, region, hints, name, report, rest, training)
        if left is not None:   # refused: its parts joined only through copies, in turn
            parts = [p for p in pieces(region) if p.kinds() & _CHAIN_KINDS and p.outputs]
            lefts = [_fuse_region(gm, memo, part, hints, f"{name}_{j}", report, rest,
                                  training) for j, part in enumerate(parts)]
            if len(report.fused) == fused:
                report.left.append(left)   # the whole region's reason says most
            else:
                report.left += [why for why in lefts if why is not None]
        changed = changed or len(report.fused) > fused
    if changed:
        finish(gm, example_inputs)


def _fuse_region(gm, memo: dict, region, hints: dict, name: str, report: GraphReport,
                 rest: str, training: bool):
    """Compile ``region`` (or the first of its smaller forms that compiles, ``_TRIMS``),
    replace it in ``gm`` with the kernel's call and add it to ``report.fused``; None, or
    the :class:`Left` that says why it was refused (not yet added to the report)."""
    start = time.perf_counter()
    extremum = recomputed_extremum(region) if training else None
    if extremum is not None:
        return Left(tuple(region.ops), f"a training forward saves {extremum.name} of "
                    "values the backward computes again, to find where it was attained: "
                    "the kernel's may round otherwise", rest)
    written = without_written_operands(region)
    if written is not None:
        kept = set(written.nodes)
        report.left.append(Left(tuple(op for n, op in zip(region.nodes, region.ops)
                                      if n not in kept), _WRITTEN, rest))
        region = written
    try:
        got = _compile_once(memo, region, hints, name)
    except Exception as err:   # noqa: BLE001 - a region that fails stays in the graph
        smaller = _trimmed(memo, region, hints, name)
        if smaller is None:
            return Left(tuple(region.ops), _reason(err), rest)
        got, trimmed, why = smaller
        kept = set(trimmed.nodes)
        report.left.append(Left(tuple(op for n, op in zip(region.nodes, region.ops)
                                      if n not in kept), f"{why}; with it: {_reason(err)}",
                                rest))
        region = trimmed
    else:
        flat = _flattened(memo, region, hints, name, got)
        if flat is not None:
            got, trimmed = flat
            kept = set(trimmed.nodes)
            report.left.append(Left(tuple(op for n, op in zip(region.nodes, region.ops)
                                          if n not in kept), _FLAT, rest))
            region = trimmed
    same_as, (args, casts, kernel, packed, plan) = got
    replace_region(gm.graph, region, args, casts, kernel, packed)
    report.fused.append(Fused(name, tuple(region.ops), tuple(n.name for n in args),
                              tuple(n.name for n in region.outputs), plan, kernel,
                              time.perf_counter() - start, same_as))
    return None


_WRITTEN = ("a matmul whose computed operand the chain writes anyway (saved for the "
            "backward, or read elsewhere): left out of its kernel, the product runs in "
            "the vendor library")


# a refused region's smaller forms, tried in turn, with what the report says of the rest
_TRIMS = ((without_trailing_matmuls, "a matmul after the chain, left out of its kernel"),
          # a training forward: the chain's result also leaves transposed, for the
          # product's weight gradient
          (lambda r: (s := without_trailing_matmuls(r)) and without_views(s),
           "a matmul after the chain and views of its results, left out of its kernel"),
          (without_views, "views of the chain's results, taken on them outside its kernel"),
          (functools.partial(without_views, leading=True, broadcasts=True),
           "views of the chain's inputs (but broadcasts) and results, taken outside its "
           "kernel"),
          (functools.partial(without_views, leading=True),
           "views of the chain's inputs and results, taken outside its kernel"),
          (prologue_with_unit_rows, "the maps and views before its first reduction or "
           "product (and a matmul after it), computed outside its kernel, but the views "
           "it reads rows through"),
          (without_prologue, "the maps and views before its first reduction or product "
                             "(and a matmul after it), computed outside its kernel"))


_FLAT = ("views of the chain's inputs and results, taken outside its kernel: on its own "
         "shapes the kernel writes whole rows, where on the views' it would loop over an "
         "output axis in its epilogue")


def _epilogue_loops(got) -> tuple:
    """The epilogue's own loop axes (``TileProgram.epi``) of a compiled region's kernel."""
    kernel = got[1][2]
    return getattr(getattr(kernel, "program", None), "epi", ())


def _flattened(memo: dict, region, hints: dict, name: str, got):
    """``(compiled, smaller region)`` when ``region``'s kernel (``got``) loops over an
    output axis in its epilogue (an instance norm's ``h``: the reductions read ``h * w``
    as one axis, the result has both) and the region without its views
    (:func:`without_views`, leading too) compiles to a kernel that does not; else None.
    The views then run outside, on the kernel's contiguous result."""
    if not _epilogue_loops(got):
        return None
    smaller = without_views(region, leading=True)
    if smaller is None:
        return None
    try:
        flat = _compile_once(memo, smaller, hints, name)
    except Exception:   # noqa: BLE001 - the region as it is, then
        return None
    return None if _epilogue_loops(flat) else (flat, smaller)


def _trimmed(memo: dict, region, hints: dict, name: str):
    """``(compiled, smaller region, what was left out)`` for the first of a refused
    region's smaller forms (``_TRIMS``) that compiles, or None (the whole region's reason
    is then the one reported)."""
    for trim, why in _TRIMS:
        smaller = trim(region)
        if smaller is not None:
            try:
                return _compile_once(memo, smaller, hints, name), smaller, why
            except Exception:   # noqa: BLE001, S112 - the next form, or the region's reason
                continue
    return None


def _inputs(region) -> list:
    """The nodes outside ``region`` that it reads, in the order its nodes read them."""
    inside, inputs = set(region.nodes), []
    for n in region.nodes:
        inputs += [a for a in n.all_input_nodes if a not in inside and a not in inputs]
    return inputs


def _compile_once(memo: dict, region, hints: dict, name: str):
    """``(same_as, compiled)``: :func:`_compile_region`'s result, or its failure raised
    again, for the first region of each structure in the graph; ``same_as`` names that
    region when ``region`` takes its kernel (memo.py)."""
    if depends_on_itself(region):   # a fact of the graph around it, not of its structure
        raise Refused("an input of the region is computed from its own result through ops "
                      "outside it")
    inputs = _inputs(region)
    key = region_key(region, inputs)
    if key not in memo:
        try:
            memo[key] = Compiled.of(name, inputs, _compile_region(region, inputs, hints, name))
        except Exception as err:   # noqa: BLE001 - the same region fails the same way
            memo[key] = err
    got = memo[key]
    if isinstance(got, Exception):
        raise got
    return ("" if got.name == name else got.name), got.on(inputs)


def _compile_region(region, inputs: list, hints: dict, name: str):
    """``(args, casts, kernel, packed, plan)`` of a region translated, compiled and called
    once; raises :class:`Refused` or the compiler's error."""
    # the kernel's arguments: a symbolic int (a dynamic size) is read from the shapes,
    # unless no shape gives it (then a 0-d tensor: symbolic.unbound_scalars)
    passed = set(unbound_scalars(inputs))
    args = [a for a in inputs if not is_scalar_value(a.meta.get("val")) or a in passed]
    if passed and len(passed) == len(args):
        raise Refused("the region reads no tensor, only symbolic ints: nothing gives the "
                      "device their 0-d tensors would live on")
    orders = output_orders(region)   # graph outputs in eager's layout (rewrite.py)
    outs, phs, casts = translate_region(RULES, inputs, region.nodes, region.outputs,
                                        hints=hints, orders=orders)
    if not has_chain(outs):
        raise Refused("no dependent reduction chain (a lone reduction or matmul is "
                      "Inductor's job)")
    # the region's products (refuse_staged_matmul): any, and a Linear layer's among them
    products = "contraction" in region.kinds(), \
        any(n.target in LINEAR_PRODUCTS for n in region.nodes)
    packed = None if any(orders) else \
        packing(outs, phs, args, [arg_shape(n) for n in args],
                [shape_of(n.meta["val"]) for n in region.outputs])
    kernel = None
    if packed is not None:   # GQA decode: a group's query heads as rows (gqa.py)
        try:
            kernel, casts = _compiled(translate_region(
                RULES, inputs, region.nodes, region.outputs, packed, hints),
                args, packed, name, hints, products)
        except Exception:   # noqa: BLE001 - the plain program below instead
            packed = None
    if kernel is None:   # compile errors surface here, not in a graph run
        kernel, casts = _compiled((outs, phs, casts), args, None, name, hints, products)
    plan = str(kernel.plan) if packed is None else f"{packed.describe()}\n{kernel.plan}"
    return args, casts, kernel, packed, plan


def _reason(err: Exception) -> str:
    return str(err) if isinstance(err, Refused) else \
        f"the compiler refused it: {type(err).__name__}: {err}"


def _compiled(translated, inputs, packed, name: str, hints: dict,
              products: tuple[bool, bool]):
    """``(kernel, casts)``: a translated region compiled and called once (the trial, at
    the example's sizes); ``products``: whether the region has products, and a Linear
    layer's among them (:func:`refuse_staged_matmul`)."""
    from ..runtime.pipeline import compile as nf_compile
    outs, phs, casts = translated
    kernel = nf_compile(outs, phs, name=name, fp32_precision=fp32_precision())
    late = _timed_out(kernel)
    if late:   # a repair not derived within the synthesis budget: the rest's region
        u = late[0]
        raise Refused(f"{u.consumer} reads the final {u.producer}: {u.reason}")
    has_products, linear = products
    if has_products:
        refuse_staged_matmul(kernel, linear=linear)
    trial(kernel, inputs, casts, packed, hints)
    return kernel, casts


def _timed_out(kernel) -> tuple:
    """The dependencies of ``kernel``'s plan (or its operands' plans) left unfused because
    their repair was not derived within the synthesis budget (fusion/plan.py)."""
    got = getattr(kernel.plan, "timed_out", None)
    if got is not None:
        return got
    return tuple(u for k in getattr(kernel, "operand_kernels", ()) for u in _timed_out(k))


def refuse_staged_matmul(kernel, linear: bool = True) -> None:
    """Raise :class:`Refused` for a region with a product (the caller knows which kind)
    that the compiler builds as several kernels -- unless its products are all batched
    ones (``bmm``: attention's scores and values, not a Linear layer's ``mm``), the
    kernels share no workspace and one of them fuses a dependent chain: the others are
    then maps beside the attention, launches Inductor would make too (a sliding-window
    cache's rotated keys beside the attention that reads them: Mistral, Gemma2).

    Refused: Llama's RMSNorm -> gate and up projections beside the residual sum. Split
    with workspaces, the projections' outputs made a float32 round trip through memory
    that Inductor's cuBLAS calls, writing their own outputs, do not. Split without (the
    sum a map pass), the norm's bf16 cast inside the projections keeps the statistic a
    repaired dependency, and the rolling kernel's two rescaled accumulators ran Llama-1B's
    8192-token prefill at 64.0 ms against 44.1 ms with the region Inductor's (H200,
    2026-12-03): a norm -> matmul chain gains at most the statistic's one pass over the
    input (1.00-1.01x Inductor in the chain suite). One decode token makes the
    projections row-vector products, which no pass builds with ``tl.dot``: each pass is a
    launch more than Inductor's norm kernel and two matrix-vector calls, plus the staged
    kernel's Python. Checked before the trial call, so nothing is tuned for it."""
    passes = getattr(kernel, "passes", ())
    if len(passes) < 2:
        return
    if not linear and not kernel.staging.intermediates and any(_repairs(p) for p in passes):
        return
    raise Refused(f"the fused form is {len(passes)} kernels"
                  + (" with float32 workspaces between them" if kernel.staging.intermediates
                     else "")
                  + (", a Linear layer's matmul among them: Inductor's cuBLAS calls do "
                     "as well or better (docs/jit.md)" if linear else
                     ", none with a dependent chain"))


def _repairs(kernel) -> bool:
    """Whether ``kernel``'s plan fuses a member by a repair (a dependent chain)."""
    try:
        groups = kernel.plan.groups
    except AttributeError:   # a pass compiled as a definition of its own (a 0-d result)
        return False
    return any(m.repair is not None for g in groups for m in g.members)


class Backend:
    """``torch.compile(fn, backend=Backend(rest="eager"))``; ``backend="neptune_fusion"``
    is ``Backend()``. ``reports`` collects a :class:`GraphReport` per compiled graph;
    ``log`` (default ``$NEPTUNE_FUSION_LOG``) prints each to stderr. ``mode`` and
    ``options`` are torch.compile's, for the Inductor that compiles the rest
    (:func:`inductor_patches`)."""

    def __init__(self, rest: str = "inductor", log: bool | None = None,
                 mode: str | None = None, options: dict | None = None) -> None:
        from ..errors import NeptuneError
        if rest not in RESTS:
            raise NeptuneError(f"rest={rest!r}: choose one of {', '.join(RESTS)}")
        if rest == "eager" and (mode not in (None, "default") or options):
            raise NeptuneError(f"mode={mode!r}, options={options!r}: they configure the "
                               "Inductor that compiles the rest; rest='eager' has none")
        self.rest = rest
        self.log = log
        self.patches = inductor_patches(mode, options)
        self.reports: list[GraphReport] = []

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.common import aot_autograd
        report = GraphReport(len(self.reports))
        self.reports.append(report)
        if _inference(example_inputs):
            swap_sdpa(gm)
        else:
            # written-out attention with a baddbmm bias (Bloom's ALiBi): nf.attention's
            # op and its derived backward (alibi_attention.py)
            if biased := alibi_attention_to_nf(gm):
                report.left.append(Left(("attention",) * biased, "written out with a "
                                        "baddbmm bias (ALiBi) in a training graph, made "
                                        "nf.attention's op: its derived backward saves no "
                                        "probabilities", "nf.attention"))
            # written-out attention: SDPA's kernel and backward (written_attention.py)
            if written := written_attention_to_sdpa(gm):
                report.left.append(Left(("attention",) * written, "written out in a "
                                        "training graph, made SDPA's call: its kernel "
                                        "and its backward save no probabilities",
                                        self.rest))
            if causal := causal_masks_to_is_causal(gm):
                report.left.append(Left(("attention",) * causal, "a causal mask built "
                                        "from positions: SDPA's is_causal=True (flash "
                                        "attention, no mask saved)", self.rest))
            if calls := sdpa_calls(gm) - written:
                # a training graph keeps SDPA's device kernel and its own backward
                # (flash, cuDNN): opened, the math left a softmax whose probabilities the
                # backward saved, (B, H, L, S) of them, in a region with no chain to fuse
                report.left.append(Left(("scaled_dot_product_attention",) * calls,
                                        "a training graph keeps SDPA's own kernel and "
                                        "its backward", self.rest))
        # what Inductor is told about each graph (none for rest="eager": no Inductor import)
        graph = GraphArgs(len(example_inputs)) if self.rest != "eager" else None

        found: list[int] = []   # attention made SDPA's kernel by Inductor's joint passes

        def forward(fx, inputs, inference: bool):
            if sum(found):
                report.left.append(Left(("attention",) * sum(found), "Inductor's "
                                        "joint-graph patterns made it SDPA's kernel, with "
                                        "its own backward", self.rest))
            fuse(fx, inputs, report, self.rest, f"nf_jit_g{report.index}",
                 training=not inference)
            if not inference:
                report.left.append(Left(("the backward graph",), "AOTAutograd derives "
                                        "it from the original ops; it is not fused",
                                        self.rest))
            self._log(report)
            return self._rest(fx, inputs, graph and graph.forward(inputs, inference))

        # no donated buffers: with the default partitioner the forward saves two views of
        # one tensor (softmax's probabilities), and Inductor's backward reused the donated
        # one in place -- attention's d_v came out wrong even with nothing fused (a
        # fuzzing find, 2026-12-04); Inductor's own entry partitions otherwise
        with torch._functorch.config.patch(donated_buffer=False):
            return self._aot(aot_autograd, forward, graph, example_inputs, gm, found)

    def _aot(self, aot_autograd, forward, graph, example_inputs, gm, found):
        return aot_autograd(fw_compiler=functools.partial(forward, inference=False),
                            partition_fn=functools.partial(
                                partition, joint_passes=self.rest != "eager", found=found),
                            inference_compiler=functools.partial(forward, inference=True),
                            bw_compiler=lambda fx, inputs: self._rest(
                                fx, inputs, graph and graph.backward(fx)),
                            decompositions=self._decompositions(_inference(example_inputs)),
                            # as Inductor's own entry: the graph's input mutations (a
                            # static cache's new rows) stay in it, so Inductor writes
                            # them in place (docs/jit.md)
                            keep_inference_input_mutations=self.rest != "eager",
                            )(gm, example_inputs)

    def _decompositions(self, inference: bool) -> dict:
        """Ours, over Inductor's own when Inductor gets the rest (it refuses a graph that
        still holds ops it decomposes itself)."""
        if self.rest == "eager":
            return decompositions(inference)
        from torch._inductor.decomposition import select_decomp_table
        return over(decompositions(inference), select_decomp_table())

    def _log(self, report: GraphReport) -> None:
        if settings.log_enabled(self.log):
            print(f"[neptune-fusion jit] {report}", file=sys.stderr)

    def _rest(self, gm, example_inputs, kwargs: dict | None):
        if self.rest == "eager":
            from torch._functorch.aot_autograd import make_boxed_func
            return make_boxed_func(gm.forward)
        return compile_rest(gm, example_inputs, self.patches, kwargs)


def _inference(example_inputs) -> bool:
    """Whether AOTAutograd will trace an inference graph: no gradient wanted of any input
    (parameters are inputs of a Dynamo graph)."""
    return not (torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs))


def neptune_fusion(gm, example_inputs, mode: str | None = None, options: dict | None = None):
    """The registered backend (``torch.compile(fn, backend="neptune_fusion")``);
    torch.compile passes its ``mode`` and ``options`` here (see :func:`inductor_patches`)."""
    return Backend(mode=mode, options=options)(gm, example_inputs)
