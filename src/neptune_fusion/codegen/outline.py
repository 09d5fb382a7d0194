"""A short, readable outline of a tile program (for the CLI and reports).

It is printed from the program's data, the same data the emitter prints the kernel from,
never from the kernel's text.
"""

from __future__ import annotations

from ..ir.nodes import Param
from ..ir.printer import expr_str
from ..ir.traverse import substitute
from .program import TileProgram


def _shape(prog: TileProgram, roles: tuple[str, ...]) -> str:
    blocks = {a.role: a.block for a in prog.axes}
    return ", ".join(blocks[r] for r in roles)


def outline(prog: TileProgram, bodies: bool = False) -> list[str]:
    """One line per part of the kernel: grid, tiles, state, loops, epilogue, rules;
    with ``bodies`` (the pipeline's dumps) also each loop's new value of every state
    variable."""
    s = prog.schedule
    grid = " * ".join(str(a.extent) for a in prog.grid) or "1"
    lines = [f"kernel {prog.name}: grid (cdiv({prog.row.extent}, BLOCK_M), {grid}); "
             f"BLOCK_M={s.block_m} BLOCK_N={s.block_n} num_warps={s.num_warps} "
             f"num_stages={s.num_stages}"]
    axes = [f"{a.name}: {a.role}" + (f" ({a.block})" if a.block else "") for a in prog.axes]
    lines.append("axes: " + ", ".join(axes))
    state = [f"{v.name}[{_shape(prog, v.roles)}] = {v.init:g}" for v in prog.state]
    lines.append("state: " + ", ".join(state))
    if prog.phases > 1:
        lines.append(f"phases: {prog.phases} loops over {prog.loop.name}, one after the "
                     "other; " + "; ".join(
                         f"{k}: {', '.join(v.name for v in prog.phase_state(k))}"
                         for k in range(prog.phases)))
    named: dict = {}
    for name, e in prog.bounds:  # later bounds print earlier ones by name
        label = f"{prog.loop.name}_{name}"
        lines.append(f"{label} = {expr_str(substitute(e, named))}")
        named[e] = Param(label, e.dtype)
    updated = ", ".join(v.name for v in prog.state)
    finals = {v.param: Param(v.name, v.param.dtype) for v in prog.state}
    loop = prog.loop
    if prog.one_tile == "static":
        lines.append(f"one tile covers {loop.name} < {loop.extent} <= BLOCK_N: each phase's "
                     "update once, no loop; the tile is loaded once")
    elif prog.one_tile == "runtime":
        lines.append(f"if {loop.extent} <= BLOCK_N (ONE_TILE, set at launch; unmasked when "
                     "equal): one tile, each phase's update once, no loop, the tile loaded "
                     "once; else:")
    for seg in prog.segments if prog.one_tile != "static" else ():
        kind = "boundary tiles, masked" if seg.masked else "interior tiles, no masks"
        if prog.phases > 1:
            kind = f"phase {seg.phase}, {kind}"
            updated = ", ".join(v.name for v in prog.phase_state(seg.phase))
        lines.append(f"for {prog.loop.name}0 in range({prog.loop.name}_{seg.lo}, "
                     f"{prog.loop.name}_{seg.hi}, BLOCK_N):  # {kind}")
        if not bodies:
            lines.append(f"    update {updated}")
        for v, e in seg.body if bodies else ():
            lines.append(f"    {v.name} = {expr_str(substitute(e, finals))}")
    for o in prog.outputs:
        idx = ", ".join(a.name for a in o.axes)
        lines.append(f"store {o.arg.name}[{idx}] = {expr_str(substitute(o.body, finals))}")
    lines.extend(f"rule: {r}" for r in prog.rules)
    return lines
