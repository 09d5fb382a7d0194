"""The one emitter: indentation, fresh names, and common-subexpression elimination.

A :class:`Block` is a straight-line list of statements at one indentation with its own
CSE table, keyed on IR nodes (interned, so structurally equal values share a key) plus a
layout tag. Child blocks (a loop body, one branch of a constexpr ``if``) see their
parents' names; a value is bound in the block where it is first needed, or hoisted to an
outer block when it does not depend on anything the inner block defines.
"""

from __future__ import annotations

import keyword
import re
from contextlib import contextmanager

INDENT = "    "


class Names:
    """Fresh Python identifiers, unique across the whole kernel."""

    def __init__(self, reserved: set[str] | None = None) -> None:
        self.taken: set[str] = set(reserved or ())

    def fresh(self, hint: str) -> str:
        base = re.sub(r"\W", "_", hint) or "t"
        if base[0].isdigit() or keyword.iskeyword(base):
            base = "_" + base
        name, k = base, 1
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name


class Block:
    """Statements at one indentation, with the CSE table of what they define."""

    def __init__(self, names: Names, level: int, parent: Block | None = None) -> None:
        self.names = names
        self.level = level
        self.parent = parent
        self.lines: list[str] = []
        self.memo: dict[object, object] = {}

    def lookup(self, key: object):
        b: Block | None = self
        while b is not None:
            got = b.memo.get(key)
            if got is not None:
                return got
            b = b.parent
        return None

    def remember(self, key: object, value: object) -> None:
        self.memo[key] = value

    def emit(self, text: str) -> None:
        self.lines.append(INDENT * self.level + text)

    def comment(self, text: str) -> None:
        self.emit(f"# {text}")

    def bind(self, hint: str, code: str) -> str:
        """``name = code`` with a fresh name; returns the name."""
        name = self.names.fresh(hint)
        self.emit(f"{name} = {code}")
        return name

    def child(self) -> Block:
        """A nested block one level deeper, whose lines the caller places."""
        return Block(self.names, self.level + 1, self)

    def extend(self, other: Block) -> None:
        self.lines.extend(other.lines)

    @contextmanager
    def nested(self, header: str):
        """``header:`` then an indented child block, appended here when the body is done."""
        self.emit(header)
        inner = self.child()
        yield inner
        if not inner.lines:
            inner.emit("pass")
        self.extend(inner)

    def text(self) -> str:
        return "\n".join(self.lines)
