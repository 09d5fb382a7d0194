"""A compiled definition with 0-d outputs: kernels that write ``(1,)`` tensors, viewed as 0-d.

The kernels need a row axis (``fusion/scalars.py`` gives a 0-d compute one of extent 1);
:class:`ScalarOutputs` calls the kernel compiled from that definition and returns those
outputs as the 0-d tensors the definition declared (views: no copy). ``out=`` tensors of
a 0-d output are viewed as ``(1,)`` for the kernel.
"""

from __future__ import annotations


class ScalarOutputs:
    """The kernel of a definition whose 0-d outputs were given a unit row; called like
    any compiled kernel. Everything else (``plan``, ``kernels``, ``last_choice``, ...)
    is the inner kernel's, and speaks of the unit rows."""

    def __init__(self, kernel, outputs, single: bool) -> None:
        self.kernel = kernel
        self.outputs = tuple(outputs)   # the definition's own: 0-d ones included
        self.inputs = kernel.inputs
        self._single = single
        self._flat = tuple(not o.shape for o in self.outputs)

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def __repr__(self) -> str:
        return f"<0-d outputs of {self.kernel!r}>"

    def __call__(self, *tensors, out=None):
        if out is not None:
            out = [o.view(1) if flat and o is not None else o
                   for o, flat in zip(out, self._flat)]
        got = self.kernel(*tensors, out=out)
        got = list(got) if isinstance(got, (list, tuple)) else [got]
        got = [g.view(()) if flat else g for g, flat in zip(got, self._flat)]
        return got[0] if self._single else got
