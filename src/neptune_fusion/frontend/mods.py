"""What a ``score_mod`` / ``mask_mod`` computes: its trace, the key kernels are cached on.

A mod is a Python function; what it computes may depend on values it captures (a closure
cell, a global, an attribute of a mutable object), which can change between calls. So the
attention cache never keys on the mod *object*: each call traces the mod on fixed probe
values -- a score parameter, the variables ``b, h, i, j`` and one probe placeholder per
buffer -- and keys on the traced expression. Expressions are interned (structurally equal
means identical), so the key is hashed and compared in O(1), and a re-created identical
lambda finds the same kernel while ``cap = 0.5`` and ``cap = 50.0`` get different ones.
The definition is then built by substituting the real score, indices and buffers into the
trace (:func:`apply`), so the kernel computes exactly what was keyed.

Before and after (``softcap = lambda s, b, h, i, j: cap * nf.tanh(s / cap)``, cap 30)::

    trace:  30.0 * tanh(score / 30.0)
    apply:  30.0 * tanh((sum(q[b, h, i, c] * k[b, h, j, c], c) * 0.125) / 30.0)
"""

from __future__ import annotations

from collections.abc import Mapping
from types import CodeType, FunctionType, ModuleType
from typing import NamedTuple

from ..errors import ExprError, NeptuneError
from ..ir import build
from ..ir.dtypes import as_dtype, int64
from ..ir.nodes import Expr, IndexVar, Load, Param, Placeholder, Reduce, Size, fresh_uid
from ..ir.traverse import rewrite, substitute, walk

# the probe variables: negative uids never collide with fresh ones (those start at 1)
_B, _H, _I, _J = -1, -2, -3, -4
_REDUCE_UIDS = -100   # canonical uids for reduce axes a mod makes itself: -100, -101, ...


class ModTrace:
    """A mod's traced expression over the probes; equal iff the expressions are (O(1))."""

    __slots__ = ("expr", "kind", "_hash")

    def __init__(self, expr: Expr, kind: str) -> None:
        self.expr, self.kind = expr, kind
        self._hash = hash((id(expr), kind))

    def __eq__(self, other) -> bool:
        # interned: structural equality is identity (never Expr.__eq__, which builds IR)
        return (isinstance(other, ModTrace) and other.expr is self.expr
                and other.kind == self.kind)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"<{self.kind}_mod {self.expr}>"


class Probes(NamedTuple):
    """What a mod is traced on: the score, the variables ``b, h, i, j``, the buffers."""

    score: Param
    b: IndexVar
    h: IndexVar
    i: IndexVar
    j: IndexVar
    bufs: dict[str, Placeholder]


def probes(dtype: str, q_heads: int, buffers) -> Probes:
    """The probes for ``dtype`` scores, ``q_heads`` heads and ``buffers`` ((name, shape,
    dtype) each). The score and variables are interned; the buffers' placeholders are new
    objects, so keep one :class:`Probes` per signature for equal mods to trace to the
    identical expression (:class:`~.attention.AttentionCache` does)."""
    return Probes(Param("score", as_dtype(dtype)), IndexVar("b", Size("B"), "spatial", _B),
                  IndexVar("h", q_heads, "spatial", _H), IndexVar("i", Size("N"), "spatial", _I),
                  IndexVar("j", Size("M"), "spatial", _J),
                  {n: Placeholder(n, tuple(shape), as_dtype(dt, f"dtype of buffer {n!r}"), _B)
                   for n, shape, dt in buffers})


def trace(mod, kind: str, p: Probes) -> ModTrace | None:
    """Trace ``mod`` (``kind`` "score" or "mask") on the probes ``p``; None for no mod, a
    trace as is."""
    if mod is None or isinstance(mod, ModTrace):
        return mod
    what = f"{kind}_mod"
    if not callable(mod):
        raise ExprError(f"attention: {what} must be a function, got {type(mod).__name__}")
    bufs = p.bufs
    first = fresh_uid()
    try:
        if kind == "score":
            out = mod(p.score, p.b, p.h, p.i, p.j, **bufs)
        else:
            out = mod(p.b, p.h, p.i, p.j, **bufs)
        expr = build.as_expr(out, p.score.dtype if kind == "score" else None)
    except NeptuneError:
        raise
    except Exception as err:  # noqa: BLE001 - the user's function: say which one failed
        args = "score, b, h, i, j" if kind == "score" else "b, h, i, j"
        extra = f" and the buffers {', '.join(bufs)} as keywords" if bufs else ""
        raise ExprError(f"attention: {what} failed when called as {what}({args}) with nf "
                        f"expressions{extra}: {type(err).__name__}: {err}") from err
    if kind == "mask" and not expr.dtype.is_bool:
        raise ExprError(f"attention: mask_mod must return a boolean (a comparison such as "
                        f"j <= i), got {expr} of dtype {expr.dtype}")
    if kind == "score" and expr.dtype.is_bool:
        raise ExprError(f"attention: score_mod must return a number, got the boolean {expr}"
                        "; use mask_mod for masks")
    if fresh_uid() != first + 1:  # the mod made reduce axes (or other fresh names)
        expr = _canonical_axes(expr)
    return ModTrace(expr, kind)


# ------------------------------------------------------------------------- the guard
#
# Tracing costs what building the mod's nodes costs (tens of microseconds on a CPU host),
# so each call first computes a *guard*: a hashable snapshot of everything the trace can
# depend on, when that is cheap to know exactly -- the function, its code, the current
# values of its closure cells, defaults and the globals it names, when each of those is an
# immutable scalar (or a tuple of them), the nf or math module, a function guarded the same
# way, or one of neptune_fusion.ops' mods (frozen plain data). The same guard means the
# same trace; anything else (a mutable object, a module of yours, a callable instance) has
# no guard and is traced on every call. Soundness assumes nobody rebinds nf's or math's
# functions.

_SAFE_MODULES = ("math", "neptune_fusion")
_SCALARS = (type(None), bool, int, str)


def guard(mod):
    """A hashable key that determines ``mod``'s trace, or None (trace it every call)."""
    out: list = []
    return tuple(out) if _snap(mod, out, 0) else None


def _snap(x, out: list, depth: int) -> bool:
    """Append to ``out`` what ``x``'s part in a trace depends on; False if not knowable."""
    t = type(x)
    if t in _SCALARS:
        out.append(t)
        out.append(x)
    elif t is float:  # by repr: -0.0 and 0.0 differ (and 1 and 1.0, by the type)
        out.append(repr(x))
    elif depth > 4:
        return False
    elif t is tuple:
        out.append(len(x))
        for e in x:
            if not _snap(e, out, depth + 1):
                return False
    elif t is FunctionType:
        return _snap_function(x, out, depth)
    elif t is ModuleType:
        out.append(x)
        return x.__name__.partition(".")[0] in _SAFE_MODULES
    else:
        params = getattr(t, "__dataclass_params__", None)
        if params is None or not params.frozen or t.__module__ != "neptune_fusion.ops":
            return False
        out.append(t)
        for n in t.__dataclass_fields__:
            if not _snap(getattr(x, n), out, depth + 1):
                return False
    return True


def _snap_function(f: FunctionType, out: list, depth: int) -> bool:
    code = f.__code__
    for c in code.co_consts:
        if type(c) is CodeType:  # a nested function or comprehension: not looked into
            return False
    out.append(code)   # not the function itself: a closure made again per call (a
    # forward that builds its mods) has the same code and captures, so the same trace
    for cell in f.__closure__ or ():
        try:
            val = cell.cell_contents
        except ValueError:  # an empty cell (a name bound later in the enclosing scope)
            return False
        if not _snap(val, out, depth + 1):
            return False
    if not _snap(f.__defaults__, out, depth + 1):
        return False
    if f.__kwdefaults__ and not _snap(tuple(sorted(f.__kwdefaults__.items())), out, depth):
        return False
    glb = f.__globals__
    # every name the code looks up (attribute names too): an absent one is recorded, so
    # that a global bound later changes the guard
    for n in code.co_names:
        if n in glb:
            if not _snap(glb[n], out, depth + 1):
                return False
        else:
            out.append(n)
    return True


def _canonical_axes(expr: Expr) -> Expr:
    """``expr`` with the reduce axes a mod made itself renumbered from fixed uids, so that
    tracing it again gives the identical expression (rare: only mods that reduce)."""
    axes: dict[IndexVar, None] = {}   # ordered, keyed by identity (interned)
    for node in walk(expr):
        if isinstance(node, Reduce):
            axes.update((a, None) for a in node.axes if a.uid > _REDUCE_UIDS)
    if not axes:
        return expr
    return substitute(expr, {a: IndexVar(a.name, a.extent, "reduce", _REDUCE_UIDS - n)
                             for n, a in enumerate(axes)})


def apply(t: ModTrace, score: Expr | None, b: Expr, h: Expr, i: Expr, j: Expr,
          bufs: Mapping[str, Placeholder]) -> Expr:
    """The traced mod with the real ``score``, indices and buffer placeholders put in."""
    # an index may be a plain int (packed decode puts the one query at ``offset``)
    leaves = {_B: b, _H: h, _I: i, _J: j}
    leaves = {u: build.as_expr(x, int64) for u, x in leaves.items()}

    def put(e: Expr) -> Expr | None:
        if isinstance(e, Param) and e.name == "score":
            return score
        if isinstance(e, Load) and isinstance(e.tensor, Placeholder) and e.tensor.uid == _B:
            return Load(bufs[e.tensor.name], e.indices)
        if isinstance(e, IndexVar) and e.kind == "spatial":
            return leaves.get(e.uid)
        return None
    return rewrite(t.expr, put)
