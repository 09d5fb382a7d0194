"""One generated Triton kernel on one grid, launched without Triton's per-call dispatch.

``fn[grid](*args)`` binds and specialises every argument, hashes the specialisation and
looks the compiled kernel up on every call. For a decode call (two launches of kernels
that run for a few tens of microseconds) that dispatch was the largest host cost
(benchmarks/results/2026-11-30-h200-eager). A :class:`Launcher` belongs to one launch
plan, whose integer arguments are fixed by the input signature, so once it knows the
compiled kernel it launches it directly -- on the current device and stream, with
Triton's launch hooks, as ``fn[grid]`` does. The one specialisation the signature does
not fix is the tensors' 16-byte alignment (Triton compiles an aligned and an unaligned
variant); callers say whether every tensor is aligned, and only aligned calls take the
direct path (the kernel kept is the aligned variant). ``NEPTUNE_FUSION_DIRECT_LAUNCH=0``
(read when the launcher is made) keeps every launch on Triton's dispatcher.

The call setups of one kernel share their compiled kernels by a ``key``: the values of
every non-tensor argument, except that a symbolic size counts only by whether it fits
32 bits -- and, for a size Triton specialises on, whether it is 1 and a multiple of 16.
Generated kernels specialise on no size but the output column's extent
(``do_not_specialize``, codegen/source.unspecialized_sizes), so two plans with one key are
given the same compiled kernel by Triton; a decode loop whose key length grows by one per
step therefore dispatches once, not once per step.

On the direct path a split-k workspace (the partial states one kernel writes and the next
reads) is one allocation: the launcher reads a pointer argument through ``data_ptr()``,
so an :class:`Address` inside one buffer stands in for each workspace tensor.
"""

from __future__ import annotations

from ..settings import direct_launch

_ALIGN = 16  # Triton specialises pointer arguments on divisibility by 16 bytes
_SCRATCH_ALIGN = 256  # each workspace tensor's offset inside the shared buffer


def aligned(tensors) -> bool:
    """Whether every tensor's address is a multiple of 16 bytes."""
    return all(t.data_ptr() % _ALIGN == 0 for t in tensors)


class Launcher:
    """Launch ``fn`` on ``grid`` with ``opts`` (``num_warps``, ``num_stages``)."""

    __slots__ = ("fn", "grid", "opts", "direct", "shared", "key", "allow_direct")

    def __init__(self, fn, grid: tuple[int, ...], opts: dict, shared: dict | None = None,
                 key=None) -> None:
        self.fn = fn
        self.grid = grid
        self.opts = opts
        self.direct = None  # the compiled kernel's launcher for this grid, once known
        self.shared = {} if shared is None else shared  # key -> compiled kernel
        self.key = key
        self.allow_direct = direct_launch()

    def __call__(self, args: list, is_aligned: bool) -> None:
        is_aligned = is_aligned and self.allow_direct
        if is_aligned:
            if self.direct is None and self.key in self.shared:
                self.direct = direct_runner(self.shared[self.key], self.grid)
            if self.direct is not None:
                self.direct(*args)
                return
        compiled = self.fn[self.grid](*args, **self.opts)
        if is_aligned and self.direct is None:
            self.direct = direct_runner(compiled, self.grid)
            if self.direct is not None:
                self.shared[self.key] = compiled


def reuse_key(kinds, values) -> tuple:
    """The key under which call setups share a compiled kernel: the non-tensor argument
    ``values`` with each symbolic size reduced to what Triton distinguishes: for an
    unspecialised one (kind ``"size"``) whether it fits 32 bits, for a specialised one
    (kind ``"specialized"``) also whether it is 1 and whether a multiple of 16."""
    def key(kind, v):
        fits = -2 ** 31 <= v < 2 ** 31 if kind in ("size", "specialized") else None
        if kind == "size":
            return ("size", fits)
        if kind == "specialized":
            return ("size", fits, v == 1, v % 16 == 0)
        return (kind, v)
    return tuple(key(kind, v) for kind, v in zip(kinds, values))


def direct_runner(compiled, grid: tuple[int, ...]):
    """The launcher of Triton's compiled kernel for ``grid`` (``compiled[grid]``, which
    launches on the current stream), or None when this Triton's kernel object has none."""
    if compiled is None or not hasattr(type(compiled), "__getitem__") \
            or not hasattr(compiled, "function"):
        return None
    return compiled[tuple(grid) + (1,) * (3 - len(grid))]


class Address:
    """A device address where a compiled kernel's launcher takes a tensor."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


def scratch_layout(outputs) -> tuple[tuple[int, ...], int]:
    """Byte offsets of ``outputs`` ((shape, torch dtype) pairs) packed into one buffer,
    each at a multiple of 256 bytes, and the buffer's size."""
    offsets, total = [], 0
    for shape, dtype in outputs:
        offsets.append(total)
        n = dtype.itemsize
        for x in shape:
            n *= x
        total += -(-n // _SCRATCH_ALIGN) * _SCRATCH_ALIGN
    return tuple(offsets), total
