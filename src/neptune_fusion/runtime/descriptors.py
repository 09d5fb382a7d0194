"""Host-side TMA descriptors for the Gluon kernels (codegen/gluon.descriptor_args).

A descriptor covers a whole input -- its shape and strides as given, a box of 1 in every
dimension but the tile's last two -- and is made per call from the tensor (Triton's
launcher encodes it as a kernel parameter). Made once on the host, no program writes and
fences its own before the first load; on the H200 that was 1-6 % of a prefill at 4096
keys (docs/hopper.md).
"""

from __future__ import annotations

import threading
from functools import cache

_THREAD = threading.local()   # the CUDA devices whose context this thread has bound


@cache
def _layout(swizzle: int, bits: int, rank: int):
    from triton.experimental.gluon import language as gl
    return gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=bits, rank=rank)


def bind_context(device) -> None:
    """Make ``device``'s primary CUDA context current on this thread, once per thread.

    Triton encodes a host descriptor (``cuTensorMapEncodeTiled``) before the launch, and
    that driver call needs a current context; a thread that has not yet launched or
    allocated anything on the device has none (Triton binds one only when it loads a
    module). The tuner's first launches run in fresh threads, and a kernel loaded by an
    earlier tuning is not loaded again: on the H200 (2026-12-03) 5 of the 17 Gluon
    candidates of the second shape classes failed there with "invalid device context",
    and a slower kernel could win.
    A synchronisation is a runtime call, which binds the primary context; a thread that
    is capturing a CUDA graph has one already (beginning the capture bound it), and may
    not synchronise."""
    bound = getattr(_THREAD, "devices", None)
    if bound is None:
        bound = _THREAD.devices = set()
    if device.index not in bound:
        import torch
        with torch.cuda.device(device):
            if not torch.cuda.is_current_stream_capturing():
                torch.cuda.synchronize(device)
        bound.add(device.index)


def box_strides(shape, strides) -> list[int]:
    """``strides`` with each dimension of extent 1 given the stride a contiguous one
    would have (it is never stepped, and the copy engine refuses a stride of 0 or one
    off its 16-byte grid there)."""
    out = list(strides)
    for d in range(len(out) - 2, -1, -1):
        if shape[d] == 1:
            out[d] = out[d + 1] * max(shape[d + 1], 1)
    return out


def maker(block, swizzle: int, bits: int):
    """``make(tensor) -> descriptor`` for the box ``block`` in the NVMMA layout of
    ``swizzle`` bytes and ``bits``-bit elements. A zero extent (no keys: the kernel then
    loads nothing) is encoded as 1, since the copy engine takes no empty dimension."""
    block, made = list(block), []   # made: Triton's descriptor class and the layout,
    #                                 resolved at the first call (Triton is imported late)

    def make(t):
        if not made:
            from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
            made.extend((TensorDescriptor, _layout(swizzle, bits, len(block))))
        cls, layout = made
        shape = t.shape
        return cls(t, [max(n, 1) for n in shape], box_strides(shape, t.stride()), block,
                   layout)
    return make


class _View:
    """What a descriptor reads of its tensor (address, dtype, shape, strides), for a
    prepared call that holds addresses."""

    __slots__ = ("ptr", "dtype", "shape", "strides")

    def __init__(self, ptr: int, dtype, shape, strides) -> None:
        self.ptr, self.dtype, self.shape, self.strides = ptr, dtype, shape, strides

    def data_ptr(self) -> int:
        return self.ptr

    def stride(self):
        return self.strides


# descriptors a prepared call keeps per input, by address (then it starts again)
KEPT_DESCRIPTORS = 8


def address_maker(make, t):
    """``(address) -> descriptor`` over memory laid out as ``t`` (a prepared call's
    signature fixes its shape, strides and dtype, so a descriptor is a function of the
    address alone). The last :data:`KEPT_DESCRIPTORS` addresses' descriptors are kept:
    making one (ours, then Triton's checks of it) was about a third of a bound prefill
    call's 48 us of host time on an H100 (2026-12-05), and a loop's inputs come back at
    the same addresses (the caching allocator, a static cache). A descriptor holds the
    address, never the tensor; Triton encodes it at each launch."""
    shape, strides, dtype = tuple(t.shape), t.stride(), t.dtype
    made: dict = {}

    def at(ptr: int):
        got = made.get(ptr)
        if got is None:
            if len(made) >= KEPT_DESCRIPTORS:
                made.clear()    # atomic: another thread may be reading or adding
            got = made[ptr] = make(_View(ptr, dtype, shape, strides))
        return got
    return at


_SHORT = {"float16": "fp16", "bfloat16": "bf16"}


def signature_type(desc) -> str:
    """The Triton signature type of a host descriptor parameter (a
    ``codegen.gluon.HostDescriptor``): what ``triton.compile`` takes for it when a kernel
    is compiled without a launch (the sm_90 compile checks)."""
    box = ",".join(str(n) for n in desc.block)
    layout = _layout(desc.swizzle, desc.bits, len(desc.block))
    return f"tensordesc<{_SHORT[desc.arg.tensor.dtype.name]}[{box}],{layout!r}>"
