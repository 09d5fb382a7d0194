"""Scalar data types and the promotion rules of the language."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import DTypeError


@dataclass(frozen=True)
class DType:
    """A scalar type: ``kind`` is ``"f"`` (float), ``"i"`` (signed int) or ``"b"`` (bool)."""

    name: str
    kind: str
    bits: int

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind == "i"

    @property
    def is_bool(self) -> bool:
        return self.kind == "b"

    def __str__(self) -> str:
        return self.name


float16 = DType("float16", "f", 16)
bfloat16 = DType("bfloat16", "f", 16)
float32 = DType("float32", "f", 32)
float64 = DType("float64", "f", 64)
int32 = DType("int32", "i", 32)
int64 = DType("int64", "i", 64)
bool_ = DType("bool", "b", 8)

DTYPES: dict[str, DType] = {
    d.name: d for d in (float16, bfloat16, float32, float64, int32, int64, bool_)
}
_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "bf16": "bfloat16",
            "fp16": "float16", "fp32": "float32", "fp64": "float64", "int": "int64",
            "long": "int64", "bool_": "bool"}


def as_dtype(value: object, what: str = "dtype") -> DType:
    """Turn a dtype name, a :class:`DType`, or a NumPy/torch dtype into a :class:`DType`."""
    if isinstance(value, DType):
        return value
    name = value if isinstance(value, str) else str(value)
    # numpy prints "float32"; torch prints "torch.float32"
    name = name.removeprefix("torch.")
    name = _ALIASES.get(name, name)
    if name not in DTYPES:
        raise DTypeError(
            f"unknown {what} {value!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[name]


# Rank in the promotion lattice; float16 and bfloat16 share a rank and meet at float32.
_RANK = {"bool": 0, "int32": 1, "int64": 2, "float16": 3, "bfloat16": 3,
         "float32": 4, "float64": 5}


def promote(a: DType, b: DType) -> DType:
    """The dtype of a binary arithmetic operation on ``a`` and ``b``."""
    if a == b:
        return a
    ra, rb = _RANK[a.name], _RANK[b.name]
    if ra == rb:  # float16 with bfloat16
        return float32
    return a if ra > rb else b
