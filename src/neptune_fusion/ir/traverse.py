"""Generic traversals of expressions: walks, bottom-up rewrites, substitution, inlining.

All are pure: they return new (interned) nodes and never mutate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from .nodes import Binary, Compute, Expr, IndexVar, Load, Reduce, fresh_uid


def walk(root: Expr) -> Iterator[Expr]:
    """Every distinct node under ``root`` (``root`` included), children before parents."""
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            yield node
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(node.children()))


def rewrite(root: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild ``root`` bottom-up; ``fn(node)`` may return a replacement (or ``None``).

    ``fn`` sees each node after its children were rewritten.
    """
    memo: dict[int, Expr] = {}
    for node in walk(root):
        new = node.with_children(tuple(memo[id(c)] for c in node.children()))
        got = fn(new)
        memo[id(node)] = new if got is None else got
    return memo[id(root)]


def _prime(name: str, taken: set[str]) -> str:
    """``name`` with primes added until it differs from every name in ``taken``."""
    # A renamed binder keeps its name readable but must not print like the variable it
    # avoided capturing: sum(x[j, j'], j'), not sum(x[j, j], j).
    while name in taken:
        name += "'"
    return name


def substitute(root: Expr, mapping: dict[Expr, Expr]) -> Expr:
    """Replace nodes (by identity), respecting binders.

    Inside a reduction that binds a replaced variable, that variable is left alone
    (shadowing); a binder that would capture a free variable of a replacement is renamed.
    """
    if not mapping:
        return root
    incoming: frozenset = frozenset()
    for v in mapping.values():
        incoming |= v.free_vars
    taken = {v.name for v in incoming}
    memo: dict[tuple[int, int], Expr] = {}
    # The memo is keyed by ids, and a freed object's id can be reused: every renamed body
    # and shadowed sub-mapping is kept alive until the substitution is done.
    inners: dict[tuple[int, frozenset], dict[Expr, Expr]] = {}
    renamed: list[Expr] = []

    def go(e: Expr, m: dict[Expr, Expr], var_keys: frozenset, only_vars: bool) -> Expr:
        key = (id(e), id(m))
        got = memo.get(key)
        if got is not None:
            return got
        if e in m:
            out = m[e]
        elif not e.children() or (only_vars and not (e.free_vars & var_keys)):
            out = e
        elif isinstance(e, Reduce):
            axes = frozenset(e.axes)
            body, new_axes = e.body, e.axes
            if axes & incoming:
                fresh = {a: IndexVar(_prime(a.name, taken), a.extent, "reduce", fresh_uid())
                         for a in e.axes}
                body = substitute(body, fresh)
                renamed.append(body)
                new_axes = tuple(fresh[a] for a in e.axes)
            inner = m
            if axes & var_keys:
                inner = inners.get((id(m), axes))
                if inner is None:
                    inner = {k: v for k, v in m.items() if k not in axes}
                    inners[(id(m), axes)] = inner
            out = Reduce(e.op, go(body, inner, var_keys - axes, only_vars), new_axes)
        else:
            out = e.with_children(tuple(go(c, m, var_keys, only_vars) for c in e.children()))
        memo[key] = out
        return out

    var_keys = frozenset(k for k in mapping if isinstance(k, IndexVar))
    return go(root, mapping, var_keys, len(var_keys) == len(mapping))


def inline(root: Expr, memo: dict[Compute, Expr] | None = None) -> Expr:
    """Replace every load of a :class:`Compute` by its definition, recursively."""
    memo = {} if memo is None else memo

    def fn(e: Expr) -> Expr | None:
        if isinstance(e, Load) and isinstance(e.tensor, Compute):
            c = e.tensor
            if c not in memo:
                memo[c] = inline(c.body, memo)
            return substitute(memo[c], dict(zip(c.axes, e.indices)))
        return None
    return rewrite(root, fn)


def factors(e: Expr) -> list[Expr]:
    """The factors of a product tree ``(a * b) * c``, left to right."""
    if isinstance(e, Binary) and e.op == "mul":
        return factors(e.a) + factors(e.b)
    return [e]


def product(fs: list[Expr]) -> Expr:
    """``fs[0] * fs[1] * ...`` as a left-leaning product tree (``fs`` non-empty)."""
    out = fs[0]
    for f in fs[1:]:
        out = Binary("mul", out, f)
    return out
