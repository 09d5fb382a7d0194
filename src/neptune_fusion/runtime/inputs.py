"""What a call derives from its input tensors, before any launch.

* :func:`check_inputs`: the tensors against a kernel's placeholders (count, type, dtype,
  rank, device, unit stride in the last dimension, sizes bound consistently); every
  failure is a :class:`~neptune_fusion.errors.FeedError` naming the argument;
* :func:`signature`: what a launch depends on besides the data (shapes, strides, dtypes,
  devices), the key of the per-signature tables of :class:`~.kernel.Kernel`,
  :class:`~.auto.AutoKernel` and :class:`~neptune_fusion.frontend.attention.AttentionCache`;
* :func:`remember` keeps those tables bounded, and :class:`CacheInfo` is what their
  owners' ``cache_info()`` report (as ``functools.lru_cache``'s does).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from ..errors import FeedError
from ..ir.nodes import Size
from ..reference.feeds import bind_sizes


class CacheInfo(NamedTuple):
    """Statistics of one cache table, in the spirit of ``functools.lru_cache``."""

    hits: int                # lookups answered from the table
    misses: int              # lookups that had to build (and then kept) an entry
    maxsize: int | None      # entries kept at most, oldest dropped first (None: no bound)
    currsize: int            # entries now


@functools.cache
def plain_types() -> tuple:
    """The tensor types taken as plain data (a signature, a call key, a prepared call's
    binding): plain tensors, and a module's weights, which are parameters (a subclass
    with no behaviour of its own; refused, an instance norm's weight and bias, read by
    its region itself, kept its kernel off the bound launch: 147 against Inductor's 48
    us of host time per eager call on the H200, 2026-12-04)."""
    import torch
    return (torch.Tensor, torch.nn.Parameter)


def wants_grad(tensors) -> bool:
    """Whether grad mode is on and an input requires grad: a call that a bound launch
    (which records no autograd graph) must leave to the general path."""
    import torch
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def check_no_grad(tensors, names=None) -> None:
    """Refuse inputs that require grad while grad mode is on where the call has no
    backward: an output without ``grad_fn`` would silently cut the autograd graph."""
    import torch
    if not torch.is_grad_enabled():
        return
    for k, t in enumerate(tensors):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            what = f"argument {k}" + (f" ({names[k]!r})" if names else "")
            raise FeedError(
                f"{what} requires grad, but this call has no backward (the output would "
                "have no grad_fn): compile a chain with nf.compile(..., "
                "differentiable=True) for one; else run forward-only under "
                "torch.no_grad() or torch.inference_mode(), or pass tensor.detach()")


def signature(tensors) -> tuple | None:
    """What a launch derives from its inputs besides their data: shapes, strides, dtypes
    and devices; None for anything but plain tensors (a subclass's attributes may not be
    plain data). Inputs that require grad are refused (:func:`check_no_grad`)."""
    check_no_grad(tensors)
    if all(type(t) in plain_types() for t in tensors):
        return tuple((t.shape, t.stride(), t.dtype, t.device) for t in tensors)
    return None


def remember(table: dict, key, value, limit: int) -> None:
    """``table[key] = value``, dropping the oldest entry when ``table`` holds ``limit``."""
    if len(table) >= limit:
        table.pop(next(iter(table)))
    table[key] = value


def check_inputs(name: str, inputs, tensors) -> tuple[dict, object]:
    """Check ``tensors`` against the placeholders ``inputs`` of kernel ``name``; return
    the bound sizes and the device. Every failure is a :class:`FeedError` naming the
    argument."""
    import torch
    if len(tensors) != len(inputs):
        names = ", ".join(p.name for p in inputs)
        raise FeedError(f"kernel {name} takes {len(inputs)} tensor(s) "
                        f"({names}), got {len(tensors)}")
    check_no_grad(tensors, [p.name for p in inputs])
    sizes: dict[Size, int] = {}
    origin: dict[Size, str] = {}
    device = None
    for k, (p, t) in enumerate(zip(inputs, tensors)):
        what = f"argument {k} ({p.name!r})"
        if not isinstance(t, torch.Tensor):
            raise FeedError(f"{what} must be a torch tensor, got {type(t).__name__}")
        got = str(t.dtype).removeprefix("torch.")
        if got != p.dtype.name:
            raise FeedError(f"{what} must be {p.dtype}, got {got}")
        if device is None:
            device, first = t.device, p.name
        elif t.device != device:
            raise FeedError(f"{what} is on {t.device} but {first!r} is on {device}; "
                            "all inputs must be on one device")
        bind_sizes(p, tuple(t.shape), sizes, origin)
        if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1 and t.numel():
            raise FeedError(f"{what} must have unit stride in its last dimension, got "
                            f"strides {tuple(t.stride())}; call .contiguous()")
    if device is not None and device.type not in ("cuda", "cpu"):
        raise FeedError(f"inputs are on {device}; the kernel runs on CUDA or CPU tensors")
    return sizes, device


def gathered_dims(outputs, inputs) -> tuple[tuple[int, int], ...]:
    """``(input position, dimension)`` of every input dimension that the definition of
    ``outputs`` indexes by values read from another tensor (``x[idx[i], j]``, a page
    pool's ``k[table[b, j // page], ...]``): the generated kernels clamp such an index
    into the dimension, which needs an element to land on (:func:`check_gathered`)."""
    from ..codegen.patterns import gathered_dims as dims_of
    from ..codegen.patterns import gathered_loads
    from ..ir.graph import tensors_in_order
    from ..ir.nodes import Compute
    where = {p: k for k, p in enumerate(inputs)}
    bodies = (t.body for t in tensors_in_order(list(outputs)) if isinstance(t, Compute))
    return tuple(sorted({(where[x.tensor], d) for x in gathered_loads(bodies)
                         if x.tensor in where for d in dims_of(x)}))


def check_gathered(name: str, inputs, tensors, dims) -> None:
    """A :class:`FeedError` when a dimension of ``dims`` (:func:`gathered_dims`) is
    empty: every read through it would fall outside the tensor (the clamp of a gathered
    index needs an element; on the CPU such a read crashed the interpreter)."""
    for k, d in dims:
        if tensors[k].shape[d] == 0:
            raise FeedError(f"kernel {name}: argument {k} ({inputs[k].name!r}) has no "
                            f"elements along dimension {d}, which the kernel indexes by "
                            f"values read from another tensor; every such read would fall "
                            f"outside it (shape {tuple(tensors[k].shape)})")
