"""A region compiled once per structure within a graph: its key, and its compiled result
moved onto another region of the same structure.

A model repeats its layers: a Llama graph holds one attention region and two RMSNorm ->
projection regions per layer, each the same ops on the same shapes over other graph
nodes. Translated under node names (which enter the program's fingerprint and the disk
cache's key), each was a new program to the compiler and was tuned anew: 16 layers took
minutes. The key here names nodes by their place in the region (``("node", k)``, an
input ``("in", k)``) and keeps everything else a translation reads -- each op, its
constant arguments, every value's shape, dtype and strides -- so two regions with one
key translate to one program up to names and the kernel of the first serves the second
(its inputs in the same order). The memo lives for one graph (one :func:`~.backend.fuse`
call): a graph's dynamic sizes are its own symbols.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .rewrite import output_orders


def region_key(region, inputs) -> tuple:
    """What the translation of ``region`` over ``inputs`` depends on, names aside."""
    place = {n: ("in", k) for k, n in enumerate(inputs)}
    place.update({n: ("node", k) for k, n in enumerate(region.nodes)})

    def arg(a):
        if isinstance(a, torch.fx.Node):
            return place.get(a, ("outside", a.name))   # a region reads only its inputs
        if isinstance(a, (list, tuple)):
            return tuple(arg(x) for x in a)
        if isinstance(a, dict):
            return tuple((k, arg(v)) for k, v in sorted(a.items()))
        return (type(a).__name__, repr(a))

    nodes = tuple((str(n.target), arg(n.args), arg(dict(n.kwargs)), _meta(n))
                  for n in region.nodes)
    return (nodes, tuple(_meta(n) for n in inputs),
            tuple(place[n] for n in region.outputs),
            tuple(sorted(place[n] for n in region.copies)),
            output_orders(region))   # a graph output's layout is written by the kernel


def _meta(node) -> tuple:
    return _value(node.meta.get("val"))


def _value(v) -> tuple:
    """A node's example value as the key sees it: a tensor's shape, dtype and strides
    (of each tensor of a tuple-valued op), anything else by its type and text."""
    if isinstance(v, torch.Tensor):
        return (str(tuple(v.shape)), str(v.dtype), str(v.stride()))
    if isinstance(v, (tuple, list)):
        return tuple(_value(x) for x in v)
    return (type(v).__name__, str(v))


@dataclass(frozen=True)
class Compiled:
    """A region's compiled result with its nodes as places among the region's inputs:
    ``(args, casts, kernel, packed, plan)`` as ``backend._compile_region`` returns them,
    for any region of the same key."""

    name: str          # the region it was compiled for (the report names it)
    args: tuple[int, ...]
    casts: tuple[tuple[int, str], ...]
    kernel: object
    packed: object     # a gqa.Packing with query places, or None
    plan: str

    @classmethod
    def of(cls, name: str, inputs: list, got) -> Compiled:
        args, casts, kernel, packed, plan = got
        at = {n: k for k, n in enumerate(inputs)}
        if packed is not None:
            packed = replace(packed, queries=frozenset(at[n] for n in packed.queries))
        return cls(name, tuple(at[n] for n in args),
                   tuple((at[n], dt) for n, dt in casts.items()), kernel, packed, plan)

    def on(self, inputs: list):
        """``(args, casts, kernel, packed, plan)`` for a region over ``inputs``."""
        packed = self.packed
        if packed is not None:
            packed = replace(packed, queries=frozenset(inputs[k] for k in packed.queries))
        return ([inputs[k] for k in self.args], {inputs[k]: dt for k, dt in self.casts},
                self.kernel, packed, self.plan)
