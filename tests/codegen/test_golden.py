"""Golden tests of the generated Triton source (rewrite with ``pytest --update-golden``)."""

from __future__ import annotations

from neptune_fusion import ops
from neptune_fusion.codegen.source import generate
from neptune_fusion.frontend.examples import plain_attention
from neptune_fusion.fusion.plan import plan
from neptune_fusion.runtime.pipeline import build_programs
from neptune_fusion.schedule.schedule import Schedule


def test_plain_attention_source(golden):
    [o], ins = plain_attention("N", "M", 64, "float16")
    golden("plain_attention.py", generate(*build_programs(plan(o), ins, Schedule(), "attention")))


def test_window_softcap_gqa_source(golden):
    [o], ins = ops.definition("PF-Window", "float16", 128)
    golden("pf_window.py", generate(*build_programs(plan(o), ins, Schedule(), "pf_window")))


def test_decode_split_source(golden):
    [o], ins = ops.definition("DC-GQA", "float16", 128)
    sched = Schedule(block_m=16, num_warps=4, strategy="split", splits=4)
    progs = build_programs(plan(o), ins, sched, "dc_gqa")
    assert [p.split.stage for p in progs] == ["partial", "combine"]
    golden("dc_gqa_split.py", "\n\n".join(generate(p) for p in progs))
