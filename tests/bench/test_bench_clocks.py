"""The GPU clock watch of the bench (bench/clocks.py): parsing nvidia-smi, the windows a
timer keeps, the records' clock fields and what the reports say about them."""

from __future__ import annotations

import sys
import time
from datetime import datetime, timezone

import pytest
import torch

from neptune_fusion.bench.chain_report import (
    build_chain_document,
    chain_markdown,
    compare_chains,
)
from neptune_fusion.bench.chain_runner import run_chains
from neptune_fusion.bench.chains import CHAINS
from neptune_fusion.bench.clocks import (
    ClockSampler,
    ClockWindow,
    Sample,
    WatchedTimer,
    clock_lines,
    mhz_text,
    nvidia_smi_id,
    parse_line,
    start_sampler,
    summarize,
    watched,
    window_fields,
)
from neptune_fusion.bench.providers.base import RunContext
from neptune_fusion.bench.providers.chains import EAGER
from neptune_fusion.bench.record import Record
from neptune_fusion.bench.report import records_table
from neptune_fusion.bench.results import environment
from neptune_fusion.bench.serving_session import markdown as serving_markdown
from neptune_fusion.bench.timing import Ceilings, wall_timer


def test_parse_line_reads_nvidia_smi_csv_and_skips_the_rest():
    s = parse_line("1980, 123.45, 0x0000000000000004\n", 7.0)
    assert s == Sample(7.0, 1980, 123.45, 4)
    assert parse_line("1755, [N/A], 0x0000000000000000", 1.0).watts is None
    for junk in ("clocks.current.sm [MHz], power.draw [W], clocks_event_reasons.active",
                 "[N/A], 100.0, 0x0", "1980, 100.0", "", "Failed to initialize NVML"):
        assert parse_line(junk, 0.0) is None


def test_summarize_takes_the_range_and_any_slowdown():
    idle = Sample(0.0, 1980, 120.0, 0x1)   # GPU idle: not a slowdown
    capped = Sample(0.1, 1245, 700.0, 0x4)  # software power cap
    assert summarize([]) is None
    assert summarize([idle]) == ClockWindow(1980, 1980, False, 1)
    assert summarize([idle, capped]) == ClockWindow(1245, 1980, True, 2)
    thermal = Sample(0.2, 1500, 400.0, 0x20)
    assert summarize([thermal]).capped


def test_window_fields_merge_the_rounds():
    a, b = ClockWindow(1500, 1980, False, 3), ClockWindow(1170, 1900, True, 2)
    assert window_fields([a, None, b]) == {"sm_mhz_min": 1170, "sm_mhz_max": 1980,
                                           "power_capped": True}
    assert window_fields([None, None]) == {} and window_fields([]) == {}


def test_mhz_text_and_clock_lines():
    assert mhz_text(None, None, None) == "—"
    assert mhz_text(1980, 1980, False) == "1980"
    assert mhz_text(1170, 1980, True) == "1170-1980 cap"

    def rec(lo, hi, cap):
        return Record(op="PF-Global", phase="prefill", seq=4096, provider="x", group="baseline",
                      status="ok", ms=1.0, sm_mhz_min=lo, sm_mhz_max=hi, power_capped=cap)
    assert clock_lines([Record(op="o", phase="prefill", seq=1, provider="x",
                               group="baseline", status="ok", ms=1.0)]) == []
    steady = clock_lines([rec(1980, 1980, False)])[0]
    assert "1980-1980 MHz" in steady and "no power cap" in steady
    hot = clock_lines([rec(1980, 1980, False), rec(1170, 1980, True)])[0]
    assert "power-capped" in hot and "1 of 2" in hot and "down to 1170" in hot
    row = records_table([rec(1170, 1980, True)], smoke=False)
    assert "SM MHz" in row[0] and "| 1170-1980 cap |" in row[2]


@pytest.mark.parametrize("visible, index, want", [
    (None, 1, "1"), ("", 0, "0"), ("3,1", 0, "3"), ("3,1", 1, "1"),
    ("GPU-abc, GPU-def", 1, "GPU-def"), ("2", 5, "5")])
def test_nvidia_smi_id_follows_cuda_visible_devices(visible, index, want):
    assert nvidia_smi_id(index, visible) == want


def _fake_smi(lines, delay=0.05):
    """A command printing ``lines`` like ``nvidia-smi -lms``, then idling until killed."""
    script = ("import sys, time\n"
              f"for line in {lines!r}:\n"
              "    print(line, flush=True)\n"
              f"    time.sleep({delay})\n"
              "time.sleep(60)\n")
    return [sys.executable, "-c", script]


def test_sampler_and_watched_timer_keep_the_window_of_each_call():
    lines = ["1980, 150.0, 0x0000000000000000", "1500, 699.0, 0x0000000000000004",
             "1260, 701.0, 0x0000000000000004", "1980, 300.0, 0x0000000000000000"]
    with ClockSampler(command=_fake_smi(lines)) as sampler:
        timer = WatchedTimer(lambda fn: (fn(), time.sleep(0.6), 2.5)[2], sampler)
        assert timer(lambda: None) == 2.5
        w = timer.last
        assert w is not None and w.samples == 4
        assert (w.mhz_min, w.mhz_max, w.capped) == (1260, 1980, True)
        assert sampler.window(time.monotonic() + 1, time.monotonic() + 2) is None
    assert sampler._proc.poll() is not None     # closed: the process is gone


def test_no_sampler_on_the_cpu_and_in_the_smoke_run():
    assert start_sampler(torch.device("cpu")) is None
    plain = wall_timer()
    with watched(plain, torch.device("cpu")) as t:
        assert t is plain
    with watched(plain, torch.device("cuda", 0), smoke=True) as t:
        assert t is plain


def test_records_carry_the_clock_of_their_rounds():
    """A watched timer's windows reach each record (merged over its rounds); the chain
    report says the GPU ran power-capped."""
    windows = iter([ClockWindow(1980, 1980, False, 2), ClockWindow(1400, 1900, True, 2),
                    ClockWindow(1700, 1980, False, 2)])

    class Sampler:   # the window each timing call sees, in turn
        def window(self, t0, t1):
            return next(windows)
    timer = WatchedTimer(lambda fn: (fn(), 1.0)[1], Sampler())
    ctx = RunContext(torch.device("cpu"), torch.float32, timer, smoke=True)
    [rec] = run_chains([CHAINS["logsumexp"]], [torch.float32], [EAGER], ctx,
                       Ceilings(None, None), rounds=3)
    assert (rec.sm_mhz_min, rec.sm_mhz_max, rec.power_capped) == (1400, 1980, True)
    assert rec.to_json()["power_capped"] is True
    doc = build_chain_document(date=datetime(2026, 12, 6, tzinfo=timezone.utc), mode="gpu",
                               env=environment(torch.device("cpu")),
                               config={"dtypes": ["float32"], "rounds": 3},
                               providers=[EAGER], ceilings=Ceilings(None, None),
                               records=[rec], comparisons=compare_chains([rec]))
    assert "**The GPU ran power-capped**" in chain_markdown(doc, [rec], compare_chains([rec]))


def test_the_serving_report_says_when_the_clock_was_capped():
    """The serving suite's records are dicts: the same paragraph, from their keys."""
    def rec(provider, ms, capped):
        return {"point": "B1-32/32-paged16", "dtype": "float16", "provider": provider,
                "status": "ok", "ms": ms, "throughput": 3.0, "fraction_of_ceiling": 0.9,
                "sm_mhz_min": 1400 if capped else 1980, "sm_mhz_max": 1980,
                "power_capped": capped}
    doc = {"mode": "gpu", "date": "2026-12-06T06:00:00", "config": {"lengths": [1, 2]},
           "records": [rec("neptune", 0.17, False), rec("flex", 0.30, True)]}
    text = serving_markdown(doc)
    assert "**The GPU ran power-capped** (or slowed down) in 1 of 2" in text
    assert "down to 1400" in text
    doc["records"] = [dict(r, sm_mhz_min=None) for r in doc["records"]]
    assert "power-capped" not in serving_markdown(doc)
    assert "SM clock" not in serving_markdown(doc)
