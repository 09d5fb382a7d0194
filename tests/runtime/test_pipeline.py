"""The pipeline (runtime/pipeline.py): its stages run in order, each dumped on request."""

from __future__ import annotations

import re

from neptune_fusion import ops
from neptune_fusion.fusion.plan import plan
from neptune_fusion.runtime.pipeline import build_programs, kernel_specs
from neptune_fusion.schedule.schedule import Schedule

STAGES = ("lower", "exp2", "partition", "split", "source")


def test_every_stage_is_dumped_in_order(monkeypatch, capsys):
    [o], ins = ops.definition("DC-GQA", "float16", 64, 4, 2)
    p = plan(o)
    sched = Schedule(block_m=16, block_n=32, num_warps=4, strategy="split", splits=2)
    monkeypatch.setenv("NEPTUNE_FUSION_DUMP", ",".join(STAGES))
    programs = build_programs(p, ins, sched, "dump_me")
    specs = kernel_specs(programs, ins)
    err = capsys.readouterr().err
    assert re.findall(r"--- neptune-fusion: after (\w+) ---", err) == list(STAGES)
    lower, exp2, partition, split, source = re.split(r"--- neptune-fusion: after \w+ ---",
                                                     err)[1:]
    assert "kernel dump_me" in lower and "exp2 domain" not in lower
    assert "rule: m kept in the exp2 domain" in exp2
    assert "rule: loop partition" in partition and "rule: loop partition" not in exp2
    assert split.count("kernel dump_me") == 2
    assert all(sp.source in source for sp in specs)


def test_dumps_cost_nothing_when_off(monkeypatch, capsys):
    [o], ins = ops.definition("PF-Causal", "float16", 64, 4, 2)
    monkeypatch.delenv("NEPTUNE_FUSION_DUMP", raising=False)
    programs = build_programs(plan(o), ins, Schedule(), "quiet")
    kernel_specs(programs, ins)
    assert capsys.readouterr().err == ""
