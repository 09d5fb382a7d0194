"""``torch.compile(fn, backend="neptune_fusion")`` and ``nf.jit(fn)``: plain PyTorch in,
its reduction chains fused (docs/jit.md). The package is named for what it plugs into
(Dynamo, torch.compile's graph capture); ``nf.jit`` is its :func:`jit`.

The backend finds the connected parts of the ATen graph built of reductions, matmuls and
elementwise ops that hold a *dependent* chain (a reduction reading another's final
value: softmax, log-sum-exp, variance, a norm before a matmul, attention), translates
each into the IR, compiles it with ``nf.compile`` and calls it as the
``neptune_fusion::kernel`` op; the rest of the graph goes to Inductor (or runs eagerly
with ``rest="eager"``). ``nf.jit(fn).explain(*args)`` says what was fused and why the
rest was not.

Importing this module registers the backend name with torch (the package's entry point
``torch_dynamo_backends`` does it for an installed package without any import).
"""

from __future__ import annotations

import functools

from .backend import RESTS, Backend, neptune_fusion
from .report import Explanation, Fused, GraphReport, Left

__all__ = ["Backend", "Explanation", "Fused", "GraphReport", "Jit", "Left", "RESTS",
           "jit", "neptune_fusion", "register"]


def register() -> None:
    """Register ``"neptune_fusion"`` with torch's backend registry (once)."""
    from importlib.metadata import entry_points

    from torch._dynamo.backends import registry
    ours = f"{__name__}:neptune_fusion"
    if any(ep.name == "neptune_fusion" and ep.value == ours
           for ep in entry_points(group="torch_dynamo_backends")):
        return   # torch loads it from the entry point, and refuses a name registered twice
    # no entry point, or a stale one from an older install (another module path): the
    # registry, which torch consults before entry points
    try:
        registry.register_backend(neptune_fusion, name="neptune_fusion")
    except AssertionError:   # "duplicate name": registered already (entry point, reload)
        pass


class Jit:
    """``fn`` compiled by the backend (see :func:`jit`)."""

    def __init__(self, fn, rest: str = "inductor", dynamic: bool | None = None,
                 log: bool | None = None, mode: str | None = None,
                 options: dict | None = None) -> None:
        import torch
        self.fn = fn
        self.backend = Backend(rest, log, mode, options)
        self.compiled = torch.compile(fn, backend=self.backend, dynamic=dynamic)
        functools.update_wrapper(self, fn, updated=())   # name and doc, not __dict__

    def __call__(self, *args, **kwargs):
        return self.compiled(*args, **kwargs)

    def explain(self, *args, **kwargs) -> Explanation:
        """Call ``fn`` on ``args`` (compiling it for them if not yet) and return what
        the backend made of every graph so far: each fused chain with its plan, and each
        part left out with the reason (``print`` it)."""
        self(*args, **kwargs)
        return Explanation(list(self.backend.reports))


def jit(fn=None, *, rest: str = "inductor", dynamic: bool | None = None,
        log: bool | None = None, mode: str | None = None, options: dict | None = None):
    """``torch.compile(fn, backend="neptune_fusion", dynamic=dynamic)``, returning a
    callable with ``.explain(*args)``. ``rest``: ``"inductor"`` (default) or ``"eager"``
    for what is not fused. ``dynamic`` as torch.compile's: ``None`` (default) compiles
    the first shapes static and makes the sizes that change dynamic (one more graph,
    fused too, for all later sizes); ``False`` compiles every shape static (Dynamo's
    recompile limit then ends compiling); ``True`` makes every size dynamic. ``mode`` and
    ``options``: torch.compile's, for the Inductor that compiles the rest
    (``"reduce-overhead"``: its CUDA graphs, fused kernels included;
    :func:`~.inductor.inductor_patches`). Usable as ``@nf.jit`` or
    ``@nf.jit(rest="eager")``."""
    if fn is None:
        return functools.partial(jit, rest=rest, dynamic=dynamic, log=log, mode=mode,
                                 options=options)
    return Jit(fn, rest=rest, dynamic=dynamic, log=log, mode=mode, options=options)


register()
