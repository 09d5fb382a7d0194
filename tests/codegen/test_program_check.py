"""``TileProgram.check()``: the structural invariants of a tile program, and one negative
test per kind of broken program (each error names the invariant)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from neptune_fusion import ops
from neptune_fusion.algebra.synth import running
from neptune_fusion.codegen.exp2 import apply_exp2
from neptune_fusion.codegen.lower import lower
from neptune_fusion.codegen.split import split_programs
from neptune_fusion.codegen.variants import partition_loop
from neptune_fusion.errors import VerificationError
from neptune_fusion.fusion.plan import plan
from neptune_fusion.schedule.schedule import Schedule

DEFAULT = Schedule()


def program(name="PF-Causal", schedule=DEFAULT):
    """The finished rolling program: lowered, exp2 rule, loop partition."""
    [o], ins = ops.definition(name, "float16", 64, 4, 2)
    return partition_loop(apply_exp2(lower(plan(o), ins, schedule)))


@pytest.mark.parametrize("name", ["PF-Global", "PF-Window", "PF-GQA", "DC-ALiBi"])
@pytest.mark.parametrize("schedule", [DEFAULT, Schedule(block_m=16, exp2=False,
                                                         partition=False)])
def test_every_stage_checks(name, schedule):
    [o], ins = ops.definition(name, "float16", 64, 4, 2)
    p = lower(plan(o), ins, schedule)
    assert p.check() is p
    p = apply_exp2(p).check()
    p = partition_loop(p).check()
    for q in split_programs(p, 3):
        assert q.check() is q


def test_an_output_without_the_row_axis():
    p = program()
    (o,) = p.outputs
    o = replace(o, axes=tuple(v for v in o.axes if v is not p.row.var))
    with pytest.raises(VerificationError, match="'fused_kernel': outputs: output o does not "
                       "have the row axis i"):
        replace(p, outputs=(o,)).check()


def test_a_loop_that_updates_other_state():
    p = program()
    seg = p.segments[0]
    broken = replace(seg, body=seg.body[:-1])
    with pytest.raises(VerificationError, match="segments: segment .* updates m, l, not "
                       "the accumulators' state \\(m, l, o_sum\\)"):
        replace(p, segments=(broken,) + p.segments[1:]).check()


def test_a_value_the_kernel_does_not_define():
    p = program()
    (o,) = p.outputs
    o = replace(o, body=o.body * running(0))   # a repair's placeholder, never bound
    with pytest.raises(VerificationError,
                       match="defined values: output o reads r0, not defined there"):
        replace(p, outputs=(o,)).check()


def test_axes_in_the_wrong_role():
    p = program()
    with pytest.raises(VerificationError, match="axis roles: i has role 'col' where 'row'"):
        replace(p, row=replace(p.row, role="col")).check()
    with pytest.raises(VerificationError, match="tile sizes: the loop axis is tiled by "
                       "BLOCK_N = 32, not BLOCK_N = 64"):
        replace(p, loop=replace(p.loop, block_size=32)).check()


def test_a_split_whose_workspace_is_not_the_state():
    part, comb = split_programs(program("DC-GQA", Schedule(block_m=16)), 4)
    short = replace(part.split, workspace=part.split.workspace[:-1])
    with pytest.raises(VerificationError, match="split-k: the workspace does not hold "
                       "exactly the accumulators' state"):
        replace(part, split=short).check()
    with pytest.raises(VerificationError, match="split-k: the combine kernel must read "
                       "the workspace first"):
        replace(comb, inputs=comb.inputs[:-1]).check()
    with pytest.raises(VerificationError, match="split-k: a combine kernel reads only "
                       "the inputs its outputs load"):
        replace(comb, inputs=comb.inputs + part.inputs[:1]).check()
