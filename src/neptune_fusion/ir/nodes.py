"""The one IR: immutable, hash-consed scalar expressions and the tensors they index.

Every :class:`Expr` is interned: building a node structurally equal to a live one returns
the live one, so structural equality *is* identity and hashing is O(1). That frees ``==``
to build comparisons as users expect (``nf.where(j <= i, s, -inf)``); ``bool(a == b)``
answers structural identity, which is what dict and set lookups need.

Tensors (:class:`Placeholder`, :class:`Compute`) have identity semantics: two placeholders
with the same name are still two tensors.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from dataclasses import dataclass, fields
from typing import Union

from .dtypes import DType, bool_, int64

# A process-wide counter only makes fresh names unique; it never changes meaning.
_UIDS = itertools.count(1)


def fresh_uid() -> int:
    return next(_UIDS)


class memo:
    """A cached property without a lock: computed on first access and kept in the
    instance's ``__dict__`` (which then answers every later access directly).

    ``functools.cached_property`` in Python 3.11 takes one lock per *class attribute*,
    shared by every instance; two threads computing, say, ``free_vars`` of different
    nodes through different classes take those locks in opposite orders and deadlock.
    A memoised value here is a pure function of an immutable node, so two threads that
    race compute the same value twice and one write wins, harmlessly.
    """

    def __init__(self, fn) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        value = self.fn(obj)
        obj.__dict__[self.name] = value  # frozen dataclasses: past __setattr__, as intended
        return value


def _key_part(v: object) -> object:
    # Children are keyed by identity (they are interned, and the live node keeps them
    # alive), so a lookup never calls the overloaded ``==``. Floats are keyed by repr so
    # that -0.0 and 0.0 (and nan) stay distinct nodes.
    if isinstance(v, Expr):
        return ("e", id(v))
    if isinstance(v, tuple):
        return tuple(_key_part(x) for x in v)
    if isinstance(v, float):
        return ("f", repr(v))
    return v


class _Interned(type):
    """Metaclass that hash-conses instances (a cache; it changes no behaviour)."""

    def __init__(cls, name, bases, ns):
        super().__init__(name, bases, ns)
        cls._table = weakref.WeakValueDictionary()

    def __call__(cls, *args, **kwargs):
        obj = super().__call__(*args, **kwargs)
        key = tuple(_key_part(getattr(obj, f.name)) for f in fields(obj))
        # look-up and insertion as one step: two threads building the same node must get
        # one node (identity is equality). Nothing in here builds nodes; re-entrant only
        # for a garbage-collector finalizer that might.
        with _INTERN_LOCK:
            got = cls._table.get(key)
            if got is not None:
                return got
            cls._table[key] = obj
        return obj


_INTERN_LOCK = threading.RLock()


class Expr(metaclass=_Interned):
    """A scalar expression. Arithmetic and comparisons build new expressions."""

    @property
    def dtype(self) -> DType:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def children(self) -> tuple[Expr, ...]:
        return ()

    def with_children(self, new: tuple[Expr, ...]) -> Expr:
        """Rebuild with new children; returns ``self`` when nothing changed."""
        return self

    @memo
    def free_vars(self) -> frozenset:
        """The index variables this expression depends on and does not bind."""
        out: frozenset = frozenset()
        for c in self.children():
            out |= c.free_vars
        return out

    # structural identity for dicts/sets: interned nodes are equal iff identical
    __hash__ = object.__hash__

    def __str__(self) -> str:
        from .printer import expr_str
        return expr_str(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self}>"

    def __bool__(self) -> bool:
        raise TypeError(
            f"the expression {self} has no truth value while building the IR; "
            "use nf.where(cond, a, b) for a data-dependent choice")

    # arithmetic ------------------------------------------------------------------
    def __add__(self, o): return _b.binary("add", self, o)
    def __radd__(self, o): return _b.binary("add", o, self)
    def __sub__(self, o): return _b.binary("sub", self, o)
    def __rsub__(self, o): return _b.binary("sub", o, self)
    def __mul__(self, o): return _b.binary("mul", self, o)
    def __rmul__(self, o): return _b.binary("mul", o, self)
    def __truediv__(self, o): return _b.binary("div", self, o)
    def __rtruediv__(self, o): return _b.binary("div", o, self)
    def __floordiv__(self, o): return _b.binary("floordiv", self, o)
    def __rfloordiv__(self, o): return _b.binary("floordiv", o, self)
    def __mod__(self, o): return _b.binary("mod", self, o)
    def __rmod__(self, o): return _b.binary("mod", o, self)
    def __pow__(self, o): return _b.power(self, o)
    def __neg__(self): return _b.unary("neg", self)
    def __pos__(self): return self
    def __abs__(self): return _b.unary("abs", self)
    # comparisons and logic ---------------------------------------------------------
    def __lt__(self, o): return _b.binary("lt", self, o)
    def __le__(self, o): return _b.binary("le", self, o)
    def __gt__(self, o): return _b.binary("gt", self, o)
    def __ge__(self, o): return _b.binary("ge", self, o)
    def __eq__(self, o): return _b.binary("eq", self, o)  # type: ignore[override]
    def __ne__(self, o): return _b.binary("ne", self, o)  # type: ignore[override]
    def __and__(self, o): return _b.binary("and", self, o)
    def __rand__(self, o): return _b.binary("and", o, self)
    def __or__(self, o): return _b.binary("or", self, o)
    def __ror__(self, o): return _b.binary("or", o, self)
    def __invert__(self): return _b.unary("not", self)


Extent = Union[int, "Size"]


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: float | int | bool
    dtype_: DType

    @property
    def dtype(self) -> DType:
        return self.dtype_


@dataclass(frozen=True, eq=False)
class Size(Expr):
    """A symbolic size such as ``N``, bound from the shapes of the inputs."""

    name: str

    @property
    def dtype(self) -> DType:
        return int64


@dataclass(frozen=True, eq=False)
class IndexVar(Expr):
    """An index variable ranging over ``[0, extent)``: spatial (from ``compute``) or reduce."""

    name: str
    extent: Extent
    kind: str  # "spatial" | "reduce"
    uid: int

    @property
    def dtype(self) -> DType:
        return int64

    @memo
    def free_vars(self) -> frozenset:
        return frozenset((self,))


@dataclass(frozen=True, eq=False)
class Param(Expr):
    """An opaque named scalar bound by an environment (used by transforms, not users)."""

    name: str
    dtype_: DType

    @property
    def dtype(self) -> DType:
        return self.dtype_


@dataclass(frozen=True, eq=False)
class Load(Expr):
    tensor: Tensor
    indices: tuple[Expr, ...]

    @property
    def dtype(self) -> DType:
        return self.tensor.dtype

    def children(self):
        return self.indices

    def with_children(self, new):
        same = all(x is y for x, y in zip(new, self.indices))
        return self if same else Load(self.tensor, tuple(new))


UNARY_OPS = ("neg", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "sigmoid",
             "erf", "abs", "not")
ARITH_OPS = ("add", "sub", "mul", "div", "floordiv", "mod", "pow", "maximum", "minimum")
CMP_OPS = ("lt", "le", "gt", "ge", "eq", "ne")
LOGIC_OPS = ("and", "or")
REDUCE_OPS = ("sum", "max", "min", "prod")


@dataclass(frozen=True, eq=False)
class Unary(Expr):
    op: str
    x: Expr

    @memo
    def dtype(self) -> DType:
        return self.x.dtype

    def children(self):
        return (self.x,)

    def with_children(self, new):
        return self if new[0] is self.x else Unary(self.op, new[0])


@dataclass(frozen=True, eq=False)
class Binary(Expr):
    op: str
    a: Expr
    b: Expr

    @memo
    def dtype(self) -> DType:
        from .dtypes import float32, promote
        if self.op in CMP_OPS or self.op in LOGIC_OPS:
            return bool_
        d = promote(self.a.dtype, self.b.dtype)
        if self.op == "div" and not d.is_float:
            return float32
        return d

    def children(self):
        return (self.a, self.b)

    def with_children(self, new):
        a, b = new
        return self if (a is self.a and b is self.b) else Binary(self.op, a, b)

    def __bool__(self) -> bool:
        # ``a == b`` asks for structural identity in plain Python contexts (dict keys,
        # ``in``); interning makes that an identity test.
        if self.op == "eq":
            return self.a is self.b
        if self.op == "ne":
            return self.a is not self.b
        return Expr.__bool__(self)


@dataclass(frozen=True, eq=False)
class Where(Expr):
    cond: Expr
    a: Expr
    b: Expr

    @memo
    def dtype(self) -> DType:
        from .dtypes import promote
        return promote(self.a.dtype, self.b.dtype)

    def children(self):
        return (self.cond, self.a, self.b)

    def with_children(self, new):
        c, a, b = new
        if c is self.cond and a is self.a and b is self.b:
            return self
        return Where(c, a, b)


@dataclass(frozen=True, eq=False)
class Cast(Expr):
    x: Expr
    dtype_: DType

    @property
    def dtype(self) -> DType:
        return self.dtype_

    def children(self):
        return (self.x,)

    def with_children(self, new):
        return self if new[0] is self.x else Cast(new[0], self.dtype_)


@dataclass(frozen=True, eq=False)
class Reduce(Expr):
    """``op`` over ``axes`` of ``body``; the axes are bound inside ``body``."""

    op: str
    body: Expr
    axes: tuple[IndexVar, ...]

    @property
    def dtype(self) -> DType:
        return self.body.dtype

    @memo
    def free_vars(self) -> frozenset:
        return self.body.free_vars - frozenset(self.axes)

    def children(self):
        return (self.body,)

    def with_children(self, new):
        return self if new[0] is self.body else Reduce(self.op, new[0], self.axes)


# --------------------------------------------------------------------------- tensors


class Tensor:
    """A named tensor: a :class:`Placeholder` (an input) or a :class:`Compute`."""

    name: str
    shape: tuple[Extent, ...]
    dtype: DType

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, idx) -> Expr:
        return _b.load(self, idx)

    def __iter__(self):
        # Without this, Python would iterate by calling t[0], t[1], ... forever.
        raise TypeError(
            f"tensor {self.name!r} is not iterable: index it with variables, e.g. "
            f"{self.name}[i, ...], or pass a list of tensors")

    def __str__(self) -> str:
        from .printer import program_str
        return program_str([self])

    def __repr__(self) -> str:
        dims = ", ".join(str(s) for s in self.shape)
        return f"<{type(self).__name__} {self.name}[{dims}] {self.dtype}>"


@dataclass(frozen=True, eq=False, repr=False)
class Placeholder(Tensor):
    name: str
    shape: tuple[Extent, ...]
    dtype: DType
    uid: int

    __str__ = Tensor.__str__
    __hash__ = object.__hash__


@dataclass(frozen=True, eq=False, repr=False)
class Compute(Tensor):
    name: str
    shape: tuple[Extent, ...]
    axes: tuple[IndexVar, ...]
    body: Expr
    uid: int

    __str__ = Tensor.__str__
    __hash__ = object.__hash__

    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self.body.dtype


from . import build as _b  # noqa: E402  (operators above resolve it at call time)
