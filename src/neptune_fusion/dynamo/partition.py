"""Finding the regions of an ATen graph worth translating.

1. A node is *fusible* when the rule table has its op (and the rule's check passes) and
   its value is a tensor (of static or dynamic shape).
2. Fusible nodes that feed each other form connected regions, except across the output
   of ``mm``/``addmm``: a 2-d matmul's result always leaves its region (a Linear layer's
   output is the input of the next chain, never recomputed inside it; ``bmm`` -- batched
   attention scores -- stays inside, so attention fuses whole).
3. Each region's *outputs* are its nodes read outside it, except nodes computed only from
   constants and views (masks built with ``arange``/``tril``, a transposed weight): those
   stay in the graph as they are.

Whether a region holds a dependent chain is decided on its translation
(:func:`has_chain`), with the compiler's own reduction graph.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field

import torch

from ..analysis.chains import reduction_graph, same_extents
from ..ir.nodes import Reduce
from ..ir.traverse import walk
from .refused import Refused
from .rules import RULES
from .symbolic import is_float_scalar, is_scalar_value
from .translate import meta_of

aten = torch.ops.aten
LINEAR_PRODUCTS = (aten.mm.default, aten.addmm.default)   # a Linear layer's product
_COPIES = (aten.clone.default, aten.alias.default)   # a layout copy: trimmed like a view
_CASTS = (aten._to_copy.default, torch.ops.prims.convert_element_type.default)
_FUSED = "neptune_fusion.fused.default"   # the op of a region fused already (by name:
# it is defined when the first region is replaced)


@dataclass
class Region:
    """A connected set of fusible nodes (graph order), its inputs and its outputs."""

    nodes: list
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    # members computed again inline (maps, views and sources of outside values, see
    # regions()): the graph keeps them for every other reader, so they order no call
    copies: frozenset = frozenset()

    @property
    def ops(self) -> list[str]:
        return [_op_name(n) for n in self.nodes]

    def kinds(self) -> set[str]:
        return {RULES[n.target].kind for n in self.nodes}


def _op_name(node) -> str:
    return getattr(node.target, "__name__", str(node.target)).split(".")[0]


def why_not_fusible(node) -> str | None:
    """None if ``node`` can be part of a region, else the reason."""
    if node.op != "call_function":
        return "not an op"
    rule = RULES.get(node.target)
    if rule is None:
        return f"{_op_name(node)} has no translation rule"
    if _float_scalar(node):
        return "a float64 scalar (a Python float of a dynamic graph): computed with the " \
               "rest, the kernel reads its float32 cast at each call"
    if rule.check is not None:
        try:
            why = rule.check(node)
        except Exception as err:   # noqa: BLE001 -- a check's bug leaves the op out, named
            why = f"{_op_name(node)}: its rule's check raised {type(err).__name__}: {err}"
        if why:
            return why
    try:
        meta_of(node)
    except Refused as err:
        return str(err)
    return None


def _float_scalar(node) -> bool:
    """A 0-d float64 value (:func:`~.symbolic.is_float_scalar`), or a cast of one (to the
    kernel's float32): arithmetic on a dynamic graph's Python floats stays outside, exact
    in float64 as in eager PyTorch, and the region's input is the cast value."""
    if is_float_scalar(node.meta.get("val")):
        return True
    return node.target in _CASTS and bool(node.args) and hasattr(node.args[0], "meta") \
        and is_float_scalar(node.args[0].meta.get("val"))


def regions(graph) -> list[Region]:
    """The regions of ``graph`` in graph order (see the module docstring)."""
    nodes = [n for n in graph.nodes if why_not_fusible(n) is None]
    fusible = set(nodes)
    groups = _components(nodes, lambda a, n: a.target not in LINEAR_PRODUCTS)
    order = {n: k for k, n in enumerate(graph.nodes)}
    memo: dict = {}

    def copyable(n) -> bool:
        """Maps, views and sources of values from outside every region (inputs,
        constants, ops without a rule), no reduction or product: a part that reads such
        a node computes it again inline (a mask built from positions keeps its
        structure instead of arriving as data), and the graph keeps it for every other
        reader."""
        if n not in memo:
            memo[n] = n in fusible and RULES[n.target].kind not in ("reduction",
                                                                    "contraction") \
                and all(copyable(a) or a not in fusible for a in n.all_input_nodes)
        return memo[n]
    out = []
    for members in groups.values():
        for part in _acyclic(members, copyable):
            inside = set(part)
            # a copy only another part reads is that part's to compute
            part = [n for n in part if not copyable(n)
                    or any(not copyable(u) for u in _readers(n, inside))]
            part = sorted(part + _copies_read(part, copyable), key=order.get)
            out.append(_region(part, frozenset(n for n in part if copyable(n))))
    return out


def _components(nodes, joins) -> dict:
    """``nodes`` grouped into the components that ``joins(a, n)`` edges (``a`` an input
    of ``n``) connect, each group in the order of ``nodes``: a union-find."""
    parent = {n: n for n in nodes}

    def find(n):
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in nodes:
        for a in n.all_input_nodes:
            if a in parent and joins(a, n):
                parent[find(a)] = find(n)
    groups: dict = {}
    for n in nodes:
        groups.setdefault(find(n), []).append(n)
    return groups


def _readers(node, inside) -> list:
    """The nodes of ``inside`` that read ``node``, directly or through others of them."""
    seen, stack, out = set(), list(node.users), []
    while stack:
        u = stack.pop()
        if u in inside and u not in seen:
            seen.add(u)
            out.append(u)
            stack.extend(u.users)
    return out


def _copies_read(members, copyable) -> list:
    """The copyable nodes outside ``members`` that they read, with their own copyable
    inputs: translated inline again (rematerialised)."""
    inside, extra = set(members), []
    stack = [a for n in members for a in n.all_input_nodes if a not in inside]
    while stack:
        a = stack.pop()
        if a not in inside and a not in extra and copyable(a):
            extra.append(a)
            stack.extend(a.all_input_nodes)
    return extra


def _region(members, copies: frozenset = frozenset()) -> Region:
    inside = set(members)
    region = Region(members, copies=copies)
    for n in members:
        for a in n.all_input_nodes:
            if a not in inside and a not in region.inputs:
                region.inputs.append(a)
    cheap = _cheap(members, inside) | copies
    region.outputs = [n for n in members if n not in cheap
                      and any(u not in inside or n.target in LINEAR_PRODUCTS
                              for u in n.users)]
    return region


def pieces(region: Region) -> list[Region]:
    """``region`` split where only copies join it (see :func:`regions`: a mask's positions
    and an embedding's sum read by attention and by the layer norm after its output
    projection, which each part computes again anyway): the parts connected through
    nodes of their own, each with the copies it reads, in graph order; ``[]`` when the
    region is one such part. The backend tries them when the whole region is refused (one
    kernel cannot hold attention and the norm after a matmul of its result) -- not before,
    since chains that share their inputs read them once in one kernel."""
    copies = region.copies
    groups = _components([n for n in region.nodes if n not in copies],
                         lambda a, n: a.target not in LINEAR_PRODUCTS)
    if len(groups) < 2:
        return []
    order = {n: k for k, n in enumerate(region.nodes)}
    out = []
    for members in groups.values():
        read = _copies_read(members, lambda a: a in copies)
        out.append(_region(sorted(members + read, key=order.get), frozenset(read)))
    return out


def without_trailing_matmuls(region: Region) -> Region | None:
    """``region`` without the 2-d matmuls whose results leave it (a Linear layer after
    the chain: attention's output projection) and what only feeds them from outside the
    chain (a transposed weight) or only reshapes the chain's result for them; None if it
    has no such matmul or nothing else would remain. The backend tries this region when
    the whole one is refused: the chain is fused, the product runs with the rest (one
    rolling kernel cannot hold a chain and a product over all of its heads).

    A layout copy of the chain's result for the product (``nn.MultiheadAttention``'s
    heads merged back: ``view``, ``permute``, ``clone``) stays, with the views before
    it: the kernel writes the copy's layout, ``(S, B, H, D)``, its row still the query
    axis (``codegen.lower._roles``). Left out, the copy was a kernel of its own, 16 us
    of a 0.73 ms causal MHA call on the H200 (2026-12-04). Not where a ``permute`` or
    ``transpose`` before the copy moves the last axis (:func:`_moves_last_dim`): the
    kernel would store each row across the output's rows."""
    inside = set(region.nodes)
    drop = {n for n in region.nodes
            if n.target in LINEAR_PRODUCTS and all(u not in inside for u in n.users)}
    if not drop:
        return None
    grown = True
    while grown:
        grown = False
        for n in reversed(region.nodes):
            if n in drop or not n.users or not all(u in drop for u in n.users):
                continue
            reads_chain = any(a in inside and a not in drop for a in n.all_input_nodes)
            if not reads_chain or RULES[n.target].kind == "view" or n.target in _COPIES:
                drop.add(n)
                grown = True
    # a layout copy of the chain's result (``permute`` then ``clone``) and the views
    # before it stay: the kernel writes the copy's layout (the views after it are free)
    keep = {n for n in drop if n.target in _COPIES and _reads_inside(n, inside)}
    grown = True
    while grown:
        grown = False
        for n in region.nodes:
            if n in drop and n not in keep and RULES[n.target].kind == "view" and \
                    any(u in keep for u in n.users) and _reads_inside(n, inside):
                keep.add(n)
                grown = True
    if any(_moves_last_dim(n) for n in keep):
        keep = set()   # rows written across the output's rows: a copy kernel does better
    drop -= keep
    kept = [n for n in region.nodes if n not in drop]
    return _region(kept, region.copies & frozenset(kept)) if kept else None


def without_written_operands(region: Region) -> Region | None:
    """``region`` without its trailing matmuls (:func:`without_trailing_matmuls`) when a
    computed operand of one of them leaves the region anyway, itself or a view of it (a
    training forward saves the normalised rows for the weight's gradient); else None.

    Fused as the product's prologue, such an operand is written all the same: fusion
    would save one read of it by the library's product, for a Triton GEMM in place of
    cuBLAS's and a far longer compile. The operand's views are taken outside, on the kernel's result
    (inside, the kernel wrote the transposed view as a second, strided copy). The fused
    form also has several outputs, so the tuner could not offer the library form (one
    output) and compiled a fused GEMM per candidate: an RMSNorm -> matmul training step
    spent over 150 s in its first call on an H100 (2026-12-05)."""
    inside = set(region.nodes)
    outputs = set(region.outputs)

    def same_value(n) -> bool:
        return n in inside and (RULES[n.target].kind == "view" or n.target in _COPIES)

    for n in region.nodes:
        if n.target not in LINEAR_PRODUCTS or any(u in inside for u in n.users):
            continue
        for a in n.all_input_nodes:
            base = a
            while same_value(base) and base.all_input_nodes:
                base = base.all_input_nodes[0]
            if base not in inside or RULES[base.target].kind == "view":
                continue   # an input (a weight), or a view of one
            # the operand's value and its views: does one of them leave?
            family, stack = set(), [base]
            while stack:
                m = stack.pop()
                if m not in family:
                    family.add(m)
                    stack += [u for u in m.users if same_value(u)]
            if family & outputs:
                trimmed = without_trailing_matmuls(region)
                # the operand's views (its transpose for the weight's gradient) are
                # views of the kernel's result outside it, not a second copy written
                return trimmed and (without_views(trimmed) or trimmed)
    return None


def _moves_last_dim(node) -> bool:
    """Whether a ``permute``/``transpose``/``t`` node moves its input's last dimension
    (a kernel writing its result would store each row across the output's rows)."""
    if node.target not in (aten.permute.default, aten.transpose.int, aten.t.default):
        return False
    val = node.args[0].meta.get("val") if hasattr(node.args[0], "meta") else None
    nd = val.dim() if isinstance(val, torch.Tensor) else None
    if nd is None or node.target is aten.t.default:
        return nd is None or nd > 1
    if node.target is aten.permute.default:
        return node.args[1][-1] % nd != nd - 1
    return nd - 1 in (node.args[1] % nd, node.args[2] % nd)


_EXTREMA = (aten.amax.default, aten.amin.default)


def recomputed_extremum(region: Region):
    """The first max or min of ``region`` that leaves it (through views and casts) while
    the values it reduces are computed inside it (not views or casts of its inputs); else
    None. A training forward saves such a maximum, and the backward finds where it was
    attained by comparing the values, recomputed by the rest, with it: the kernel's
    values may round otherwise (its sigmoid, its exp2), no element then equals the
    maximum, and the gradient divided by that count of 0 was NaN (``silu`` before
    ``amin``, a fuzzing find of 2026-12-05). Such a region stays with the rest in a
    training graph."""
    inside = set(region.nodes)

    def passes(n) -> bool:   # a node that only moves, casts or detaches its input
        return n.target in _CASTS or n.target in _COPIES or \
            n.target is aten.detach.default or (
                n.target in RULES and RULES[n.target].kind == "view")
    for n in region.nodes:
        if n.target not in _EXTREMA:
            continue
        seen, stack, leaves = set(), [n], False
        while stack:
            m = stack.pop()
            for u in m.users:
                if u not in inside:
                    leaves = True
                elif passes(u) and u not in seen:
                    seen.add(u)
                    stack.append(u)
        src = n.args[0]
        while src in inside and passes(src):
            src = src.args[0]
        if leaves and src in inside:
            return n
    return None


def _reads_inside(n, inside) -> bool:
    """Whether ``n`` reads a node of the region (``inside``: all of its nodes)."""
    return any(a in inside for a in n.all_input_nodes)


def without_prologue(region: Region) -> Region | None:
    """``region`` without the maps, views and copies it computes from its inputs before
    any reduction or product reads them (and without its trailing matmuls, as
    :func:`without_trailing_matmuls`), or None if it has none: the kernel reads their
    results, materialised with the rest. The last form the backend tries: in
    ``nn.MultiheadAttention`` the in-projection's bias and head split (a clone, three
    selects, transposes) come before the attention, and their indices into the packed
    projection mix tile axes that the code generator refuses."""
    region = without_trailing_matmuls(region) or region
    inside = set(region.nodes)
    late: set = set()   # downstream of a reduction or product inside the region
    for n in region.nodes:
        if RULES[n.target].kind in ("reduction", "contraction") or any(
                a in late for a in n.all_input_nodes if a in inside):
            late.add(n)
    # values of positions alone (``tril(ones(n, n))``, a causal mask) stay: read no
    # tensor, they are index comparisons in the kernel (whose loop skips masked tiles),
    # where outside it they would be a mask tensor to load
    positional: set = set()
    for n in region.nodes:
        if all(a in positional for a in n.all_input_nodes):
            positional.add(n)
    kept = [n for n in region.nodes if n in late or n in positional]
    if len(kept) == len(region.nodes) or not kept:
        return None
    return _region(kept, region.copies & frozenset(kept))


def prologue_with_unit_rows(region: Region) -> Region | None:
    """:func:`without_prologue`, then the views between it and the values it was cut at
    pulled back in while those values lack unit-stride rows (their last stride is not 1):
    the kernel then reads the tensor they view in place, where outside a strided value
    is copied for the kernel (``inductor.unit_rows``). In ``nn.MultiheadAttention`` the
    keys reach the product as ``view(expand(k.transpose(-2, -1)))``: cut there, the
    kernel read a transposed copy, whose ``(inner, loop)`` tile the Gluon dialect has no
    box for (Triton ran it at 0.75x cuDNN on the H200, 2026-12-04); pulled back to
    ``k``'s ``(B, H, S, D)`` view, it reads ``(loop, inner)`` tiles in place. None when
    nothing is pulled back."""
    cut = without_prologue(region)
    if cut is None:
        return None
    inside, grown = set(cut.nodes), True
    while grown:
        grown = False
        for a in list(_region(list(inside)).inputs):
            if a.op == "call_function" and a.target in RULES and \
                    RULES[a.target].kind == "view" and not _unit_rows(a) and \
                    all(u in inside for u in a.users):
                inside.add(a)
                grown = True
    if len(inside) == len(cut.nodes):
        return None
    order = {n: k for k, n in enumerate(next(iter(inside)).graph.nodes)}
    return _region(sorted(inside, key=order.__getitem__), cut.copies)


def _unit_rows(node) -> bool:
    """Whether ``node``'s value has unit stride in its last dimension (or is no tensor,
    or that dimension has one element)."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() == 0:
        return True
    try:
        return val.stride()[-1] == 1 or val.shape[-1] == 1
    except (RuntimeError, TypeError):   # a symbolic stride that cannot be decided
        return True


def without_views(region: Region, leading: bool = False,
                  broadcasts: bool = False) -> Region | None:
    """``region`` without the views (and layout copies) between its values and its
    outputs -- with ``leading``, also those between its inputs and its values -- or None
    if it has none: the kernel then computes (and reads) those values in their own
    shapes, and the views run with the rest. The backend tries this when the whole
    region is refused: a group norm written ``x.reshape(N, G, -1)`` and reshaped back
    reads ``x`` at ``g * c + r`` and writes at ``j // c``, tile indices the code generator
    refuses, where the ``(N, G, c)`` view in and result out are plain.

    With ``broadcasts`` a leading ``expand`` (and any copy) stays in the kernel, with
    what follows it: outside, the broadcast is a copy (the group norm's weight spread over
    its group's elements, ``(G, C/G, 1) -> (G, C/G * HxW)``: a kernel of 4.6 us per call
    on the H200, 2026-12-04); inside, an index (``w[g, k // HxW, 0]``)."""
    inside = set(region.nodes)

    def view(n):
        return RULES[n.target].kind == "view" or n.target in _COPIES
    drop = {n for n in region.nodes if view(n) and n.users
            and all(u not in inside for u in n.users)}
    grown = True
    while grown:
        grown = False
        for n in reversed(region.nodes):
            if n not in drop and view(n) and n.users and \
                    all(u in drop or u not in inside for u in n.users):
                drop.add(n)
                grown = True
    kept_broadcast = False
    if leading:   # views of inputs, and views of those: the kernel takes them as inputs
        for n in region.nodes:
            if view(n) and n.all_input_nodes and all(
                    a not in inside or a in drop for a in n.all_input_nodes):
                if broadcasts and (n.target is aten.expand.default or n.target in _COPIES):
                    kept_broadcast = True
                    continue
                drop.add(n)
    kept = [n for n in region.nodes if n not in drop]
    if not drop or not kept or (broadcasts and not kept_broadcast):
        return None     # (with broadcasts: none kept, the form without them is the same)
    return _region(kept, region.copies & frozenset(kept))


def _acyclic(members, copyable=lambda n: False) -> list[list]:
    """``members`` cut where an outside op reads the region and feeds it again (a gelu
    between a norm and the matmul after it): the nodes downstream of such an input go to
    a later part, so each part runs as one call. What a part may copy (``copyable``:
    see :func:`regions`) orders nothing: the graph keeps it for outside readers."""
    inside = set(members)
    real = {n for n in members if not copyable(n)}
    bad = [a for n in members for a in n.all_input_nodes
           if a not in inside and _reaches(a, real)]
    if not bad:
        return [members]
    tainted, stack = set(), [u for a in bad for u in a.users if u in inside]
    while stack:
        n = stack.pop()
        if n not in tainted:
            tainted.add(n)
            stack.extend(u for u in n.users if u in inside)
    before = [n for n in members if n not in tainted]
    after = [n for n in members if n in tainted]
    return ([before] if before else []) + _acyclic(after, copyable)


def _reaches(node, inside) -> bool:
    """Whether ``node`` is computed from a node of ``inside``."""
    seen, stack = set(), list(node.all_input_nodes)
    while stack:
        n = stack.pop()
        if n in inside:
            return True
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return False


def _cheap(members, inside) -> set:
    """Nodes computed from constants and views of inputs only (kept in the graph). A
    source reads its inputs for their shapes alone (``zeros_like(y)``): cheap whatever
    they are (as an output of the kernel it was a constant, which no kernel writes)."""
    cheap: set = set()
    for n in members:
        kind = RULES[n.target].kind
        ins = n.all_input_nodes
        if kind == "source" or kind == "view" and all(a in cheap or a not in inside
                                                      for a in ins):
            cheap.add(n)
        elif kind == "elementwise" and ins and all(a in cheap for a in ins):
            cheap.add(n)
    return cheap


def boundaries(region: Region) -> list:
    """The ops next to ``region`` (producers of its inputs, users of its nodes) that no
    rule takes, with the reason: where a chain was cut."""
    inside, out = set(region.nodes), []
    near = [a for n in region.nodes for a in n.all_input_nodes if a not in inside]
    near += [u for n in region.nodes for u in n.users if u not in inside]
    for n in near:
        # arithmetic on a dynamic graph's symbolic ints (``s69 - 1``) is read as a value,
        # its Python floats (and their casts) as inputs; a region fused already (its op
        # and the getitems of its results) cuts nothing
        if n.op == "call_function" and n not in out and not _float_scalar(n) \
                and not is_scalar_value(n.meta.get("val")) and not _fused_result(n):
            why = why_not_fusible(n)
            if why is not None:
                out.append(n)
    return [(n, why_not_fusible(n)) for n in out]


def _fused_result(node) -> bool:
    if node.target is operator.getitem:
        node = node.args[0]
    return str(getattr(node, "target", "")) == _FUSED


def depends_on_itself(region: Region) -> bool:
    """Whether an input of ``region`` is computed from one of its nodes (through ops
    outside it): the region cannot run as one call then. Its copies (members it computes
    again inline) do not count: the graph keeps them for outside readers."""
    inside, seen = set(region.nodes) - region.copies, set()
    stack = list(region.inputs)
    while stack:
        n = stack.pop()
        if n in inside:
            return True
        if n in seen:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return False


def has_chain(outputs) -> bool:
    """Whether some reduction of the program reads the final value of another over axes
    of the same extents (softmax's sum reads its max): a dependent chain, the compiler's
    case. A lone reduction, or reductions side by side, are Inductor's. Chains nested
    in a reduction count too, with its axes as the outer ones: a cross-entropy's mean
    over rows of each row's log-sum-exp (the compiler gives such a reduction its own
    pass, docs/codegen.md)."""
    for o in outputs:
        outer = frozenset(o.axes)
        # the top level first; nested scopes are walked only if it has no chain
        scopes = itertools.chain([(o.body, outer)],
                                 ((r.body, outer | frozenset(r.axes))
                                  for r in walk(o.body) if isinstance(r, Reduce)))
        for body, axes in scopes:
            g = reduction_graph([body], axes)
            if any(same_extents(p, c) for c in g.order for p in g.deps[c]):
                return True
    return False
