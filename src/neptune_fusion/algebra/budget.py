"""A time budget for one derivation.

SymPy has no time limit of its own (``solve`` and ``simplify`` can run for minutes on an
expression a few symbols long), so :func:`within` runs a derivation in the calling thread
and, if it is still running when its budget is spent, raises :class:`_OutOfTime` in that
thread from a timer (``PyThreadState_SetAsyncExc``: the interpreter raises it between two
bytecodes, as it does ``KeyboardInterrupt``). It derives from ``BaseException``, which
neither SymPy (no bare ``except:``) nor the algebra catches, so it unwinds the derivation
to :func:`within`, which returns :class:`TimedOut` instead of a result.

The budget is data: each call says how many seconds it has; nothing is global.
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import sympy as sp

T = TypeVar("T")

BUDGET_SETTING = "NEPTUNE_FUSION_SYNTH_BUDGET"


@dataclass(frozen=True)
class TimedOut:
    """A derivation stopped when its budget of ``seconds`` was spent: no repair, and no
    proof that none exists (a larger budget may find one)."""

    seconds: float

    def __str__(self) -> str:
        return (f"no repair derived within the synthesis budget of {self.seconds:g} s "
                f"(the derivation was stopped; {BUDGET_SETTING} sets the budget)")


class _OutOfTime(BaseException):
    """Raised inside a derivation whose budget is spent; never escapes :func:`within`."""


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    """Make ``thread_id`` raise ``exc`` at its next bytecode; ``None`` withdraws a
    pending one."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), None if exc is None else ctypes.py_object(exc))


def within(seconds: float, attempt: Callable[[], T]) -> T | TimedOut:
    """``attempt()``, or :class:`TimedOut` if it has not returned after ``seconds``
    (infinity: no limit; zero or less: not started)."""
    if math.isinf(seconds) and seconds > 0:
        return attempt()
    if seconds <= 0:
        return TimedOut(seconds)
    me = threading.get_ident()
    lock = threading.Lock()
    state = {"done": False, "fired": False}

    def expire() -> None:
        with lock:   # never after the attempt ended: the exception would escape it
            if not state["done"]:
                state["fired"] = True
                _raise_in(me, _OutOfTime)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    parameters = _sympy_parameters()
    try:
        timer.start()
        try:
            return attempt()
        finally:
            timer.cancel()
            with lock:
                state["done"] = True
                if state["fired"]:   # fired but not raised yet: withdraw it
                    _raise_in(me, None)
    except _OutOfTime:
        # the exception may have cut a SymPy ``finally`` short: its global switches
        # (``evaluate(False)`` and the like) are put back as they were
        _restore_sympy_parameters(parameters)
        return TimedOut(seconds)


_PARAMETERS = ("evaluate", "distribute", "exp_is_pow")


def _sympy_parameters() -> dict:
    from sympy.core.parameters import global_parameters
    return {k: getattr(global_parameters, k) for k in _PARAMETERS
            if hasattr(global_parameters, k)}


def _restore_sympy_parameters(saved: dict) -> None:
    from sympy.core.parameters import global_parameters
    for k, v in saved.items():
        setattr(global_parameters, k, v)
    sp.core.cache.clear_cache()   # nothing half-computed is reused
