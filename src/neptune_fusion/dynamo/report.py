"""What the backend did with each graph: the fused chains and the parts left out."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Fused:
    """A region compiled by neptune-fusion: its ops, inputs, outputs and plan."""

    name: str
    ops: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    plan: str
    kernel: object = field(repr=False, compare=False)
    seconds: float = 0.0   # translation, nf.compile and the trial call
    same_as: str = ""      # the chain of the same ops and shapes whose kernel it runs

    def __str__(self) -> str:
        head = (f"fused chain {self.name}: {', '.join(self.ops)}\n  "
                + (f"the kernel of {self.same_as} (the same ops on the same shapes)"
                   if self.same_as else
                   f"compiled in {self.seconds:.2f} s (with one trial call)")
                + f"\n  inputs {', '.join(self.inputs)} -> outputs {', '.join(self.outputs)}")
        if self.same_as:   # its plan is printed once, under that chain
            return f"{head}\n  plan: {self.same_as}'s"
        plan = "\n".join("    " + line for line in self.plan.splitlines())
        return f"{head}\n  plan:\n{plan}"


@dataclass(frozen=True)
class Left:
    """A region (or a whole graph) left to the rest of the compiler, with the reason."""

    ops: tuple[str, ...]
    reason: str
    rest: str = "inductor"

    def __str__(self) -> str:
        ops = ", ".join(self.ops) if self.ops else "the whole graph"
        return f"left to {self.rest}: {ops}: {self.reason}"


@dataclass
class GraphReport:
    """One graph Dynamo handed the backend."""

    index: int
    fused: list[Fused] = field(default_factory=list)
    left: list[Left] = field(default_factory=list)
    dynamic: dict = field(default_factory=dict)   # Dynamo's size symbol -> example value

    def __str__(self) -> str:
        sizes = ", ".join(f"{s} = {v}" for s, v in self.dynamic.items())
        head = (f"graph {self.index}: {len(self.fused)} fused chain(s), "
                f"{len(self.left)} part(s) left out"
                + (f"; dynamic sizes {sizes} in this call (dyn_<size> in the plans)"
                   if sizes else ""))
        return "\n".join([head, *(str(x) for x in (*self.fused, *self.left))])


@dataclass
class Explanation:
    """Every graph compiled so far, in order (``nf.jit(fn).explain(*args)``)."""

    graphs: list[GraphReport]

    @property
    def fused(self) -> list[Fused]:
        return [f for g in self.graphs for f in g.fused]

    @property
    def left(self) -> list[Left]:
        return [x for g in self.graphs for x in g.left]

    def __str__(self) -> str:
        if not self.graphs:
            return "no graph compiled"
        return "\n\n".join(str(g) for g in self.graphs)
