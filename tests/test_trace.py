"""Trace export and Gantt charts."""

import json

from par3d.pipeline.schedules import build
from par3d.pipeline.simulate import Event, simulate
from par3d.trace import chrome_trace, gantt_png, gantt_text, write_chrome_trace


def _timelines():
    sim = simulate(build("1f1b", 2, 3), 2, 3).events
    # A "measured" run: same order, wall-clock seconds with an offset, slightly slower.
    measured = [Event(e.rank, e.kind, e.stage, e.microbatch, 100 + 1.1 * e.start, 100 + 1.1 * e.end) for e in sim]
    return {"measured": measured, "simulated": sim}


def test_chrome_trace_structure(tmp_path):
    tls = _timelines()
    trace = chrome_trace(tls)
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == 2 * 12
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names.values()) == ["measured", "simulated"]
    sim_pid = next(pid for pid, n in names.items() if n == "simulated")
    first = next(e for e in spans if e["pid"] == sim_pid and e["name"] == "F s1 mb0")
    assert first["tid"] == 1 and first["cat"] == "F"
    assert first["ts"] == 1e6 and first["dur"] == 1e6  # seconds -> microseconds
    assert first["args"] == {"source": "simulated", "kind": "F", "stage": 1, "microbatch": 0}
    assert {e["tid"] for e in spans} == {0, 1}
    path = tmp_path / "trace.json"
    write_chrome_trace(tls, str(path))
    assert json.loads(path.read_text()) == json.loads(json.dumps(trace))


def test_gantt_png_written(tmp_path):
    path = tmp_path / "gantt.png"
    gantt_png(_timelines(), str(path), title="1F1B p=2 m=3")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 1024


def test_gantt_png_single_interleaved_panel(tmp_path):
    path = tmp_path / "one.png"
    gantt_png({"simulated": simulate(build("interleaved", 2, 4, 2), 2, 4, 2).events}, str(path))
    assert path.stat().st_size > 1024


def test_gantt_text():
    tl = simulate(build("1f1b", 4, 8), 4, 8)
    text = gantt_text(tl, width=80)
    lines = text.splitlines()
    rows = [ln for ln in lines if ln.startswith("rank")]
    assert len(rows) == 4
    assert len({len(r) for r in rows}) == 1 and len(rows[0]) <= 80
    assert rows[0].startswith("rank 0 |F0")
    assert rows[3][8:].startswith(".")  # the last rank waits for the first forward
    assert "B7" in text and lines[-1].rstrip().endswith("33")
