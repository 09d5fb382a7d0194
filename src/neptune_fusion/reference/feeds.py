"""Binding user inputs (NumPy arrays or torch tensors) to placeholders and sizes."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import FeedError, SizeBindingError
from ..ir.graph import placeholders
from ..ir.nodes import Placeholder, Size, Tensor


def to_numpy(value, what: str) -> np.ndarray:
    """A float64/int64/bool NumPy copy of an array-like or torch tensor."""
    if type(value).__module__.startswith("torch"):
        import torch
        t = value.detach().to("cpu")
        if t.is_floating_point():
            t = t.to(torch.float64)
        elif t.dtype != torch.bool:
            t = t.to(torch.int64)
        return t.numpy()
    try:
        arr = np.asarray(value)
    except Exception as err:  # noqa: BLE001 - report any conversion failure the same way
        raise FeedError(f"{what} is not an array: {err}") from None
    if arr.dtype.kind == "f":
        return arr.astype(np.float64)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    if arr.dtype.kind == "b":
        return arr
    raise FeedError(f"{what} has unsupported element type {arr.dtype}")


_KIND = {"f": "floating", "i": "integer", "b": "boolean"}


def bind_sizes(ph: Placeholder, shape: tuple[int, ...], sizes: dict[Size, int],
               origin: dict[Size, str]) -> None:
    """Check ``shape`` against ``ph``'s declared shape, binding its symbolic sizes."""
    if len(shape) != ph.ndim:
        raise FeedError(
            f"input {ph.name!r} must have {ph.ndim} dimension(s) "
            f"[{', '.join(map(str, ph.shape))}], got shape {tuple(shape)}")
    for d, (want, got) in enumerate(zip(ph.shape, shape)):
        if isinstance(want, Size):
            have = sizes.get(want)
            if have is None:
                sizes[want] = int(got)
                origin[want] = f"dimension {d} of {ph.name!r}"
            elif have != got:
                raise SizeBindingError(
                    f"size {want.name} is bound to {have} by {origin[want]} but to {got} by "
                    f"dimension {d} of {ph.name!r}")
        elif want != got:
            raise FeedError(
                f"input {ph.name!r} must have shape [{', '.join(map(str, ph.shape))}]; "
                f"dimension {d} is {got}, expected {want}")


def bind_feeds(outputs: list[Tensor], feeds: Mapping
               ) -> tuple[dict[Tensor, np.ndarray], dict[Size, int]]:
    """Match ``feeds`` (keyed by placeholder or name) to the outputs' inputs."""
    if not isinstance(feeds, Mapping):
        raise FeedError("feeds must be a dict from placeholders (or their names) to arrays")
    phs = placeholders(outputs)
    by_name: dict[str, list[Placeholder]] = {}
    for p in phs:
        by_name.setdefault(p.name, []).append(p)
    given: dict[Placeholder, object] = {}
    for key, value in feeds.items():
        if isinstance(key, Placeholder):
            if key not in phs:
                raise FeedError(f"feed for {key.name!r}: the outputs do not read this input")
            target = key
        elif isinstance(key, str):
            cands = by_name.get(key)
            if not cands:
                known = ", ".join(sorted(by_name)) or "none"
                raise FeedError(f"feed {key!r} names no input of the outputs (inputs: {known})")
            if len(cands) > 1:
                raise FeedError(
                    f"feed {key!r} is ambiguous: {len(cands)} inputs share that name; "
                    "key the feed by the placeholder object")
            target = cands[0]
        else:
            raise FeedError(f"feed key {key!r} must be a placeholder or its name")
        if target in given:
            raise FeedError(f"input {target.name!r} is fed twice")
        given[target] = value
    arrays: dict[Tensor, np.ndarray] = {}
    sizes: dict[Size, int] = {}
    origin: dict[Size, str] = {}
    for p in phs:
        if p not in given:
            raise FeedError(f"missing feed for input {p.name!r} [{', '.join(map(str, p.shape))}]")
        arr = to_numpy(given[p], f"feed for {p.name!r}")
        want = "f" if p.dtype.is_float else ("i" if p.dtype.is_int else "b")
        if arr.dtype.kind != want:
            raise FeedError(
                f"input {p.name!r} is {p.dtype} but its feed holds {_KIND[arr.dtype.kind]} "
                f"values ({arr.dtype}); give {_KIND[want]} data")
        bind_sizes(p, arr.shape, sizes, origin)
        arrays[p] = arr
    return arrays, sizes
