"""Every time the runtime measures goes through par3d.timing (issue 14, item 10), whose GPU side
synchronises or records CUDA events — so on a GPU step times, the pipeline timeline and the
communication counters time the kernels, not their launches.

On this CPU the clocks are replaced by a fake one that ticks only when asked: the step time, the
action timeline and a collective's seconds must be the fake clock's, which they are only if they
were read through the helper.  tests/test_gpu.py checks the real thing on a GPU."""

from __future__ import annotations

import itertools

import pytest
import torch


class FakeMarks:
    ticks = itertools.count(1000)
    devices: list = []

    def __init__(self, device):
        FakeMarks.devices.append(device)

    def start(self):
        pass

    def mark(self):
        return float(next(FakeMarks.ticks))

    def times(self, marks):
        return [m + 0.5 for m in marks]  # resolved after the step, as CUDA events are


@pytest.fixture
def fake_clocks(monkeypatch):
    from par3d import timing

    now = itertools.count(0.0, 0.25)
    monkeypatch.setattr(timing, "Marks", FakeMarks)
    monkeypatch.setattr(timing, "now", lambda device=None: next(now))
    stamps = itertools.count(0.0, 2.0)
    monkeypatch.setattr(timing, "stamp", lambda device=None: next(stamps))
    FakeMarks.devices.clear()


def test_step_times_and_the_timeline_come_from_the_timing_helper(fake_clocks):
    from par3d.config import RunConfig
    from par3d.train import worker

    cfg = RunConfig()
    cfg.model.layers, cfg.model.hidden, cfg.model.seq_len = 2, 32, 16
    cfg.train.global_batch, cfg.train.steps = 4, 2
    cfg.progress = False
    res = worker(cfg.validate().to_dict(), {"quiet": True})
    assert [h["step_time_s"] for h in res["history"]] == [0.25, 0.25]
    assert FakeMarks.devices and all(d == torch.device("cpu") for d in FakeMarks.devices)
    ev = res["events"]
    assert ev and all(e["start"] % 1 == 0.5 and e["end"] == e["start"] + 1 for e in ev), ev[:2]


def test_collectives_are_timed_by_stamps(fake_clocks):
    from par3d import comm
    from par3d.mesh import Group

    comm.COUNTER.reset()
    g = Group("tp", [0, 1], 0, None)
    comm._timed(g, "all_reduce", torch.ones(4), lambda: None)
    assert comm.COUNTER.snapshot()["tp"]["all_reduce"]["seconds"] == 2.0
    comm.COUNTER.reset()


def test_cpu_clocks_are_host_clocks():
    import time

    from par3d import timing

    cpu = torch.device("cpu")
    t0, w0 = timing.now(cpu), timing.wall(cpu)
    assert abs(w0 - time.time()) < 1.0 and t0 <= time.perf_counter()
    m = timing.Marks(cpu)
    m.start()
    a, b = m.mark(), m.mark()
    assert m.times([a, b]) == [a, b] and a <= b
    assert timing.seconds(timing.stamp(cpu), timing.stamp(cpu)) >= 0
