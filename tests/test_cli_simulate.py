"""`par3d simulate`, run in-process through the real dispatcher."""

import argparse
import json

import pytest

from par3d.cli import build_parser, main


def _run(capsys, *argv):
    rc = main(["simulate", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json_q1_numbers(capsys):
    rc, out, err = _run(capsys, "--schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert abs(res["bubble_wall"] - 3 / 11) < 1e-12
    assert abs(res["bubble_ideal"] - 3 / 8) < 1e-12
    assert abs(res["utilisation"] - 8 / 11) < 1e-12
    assert res["ideal_formula"] == {"wall": 3 / 11, "lecture": 3 / 8}
    assert res["makespan"] == 33.0 and res["busy"] == [24.0] * 4
    assert res["peak_inflight"] == [4, 3, 2, 1]
    assert (res["schedule"], res["p"], res["m"], res["v"]) == ("1f1b", 4, 8, 1)
    assert len(res["events"]) == 2 * 4 * 8
    assert set(res["events"][0]) == {"rank", "kind", "stage", "microbatch", "start", "end"}


def test_report_and_files(capsys, tmp_path):
    png, trace = tmp_path / "g.png", tmp_path / "t.json"
    rc, out, err = _run(capsys, "--schedule", "interleaved", "--virtual-stages", "2",
                        "--out", str(png), "--trace-out", str(trace))
    assert rc == 0, err
    assert "15.79%" in out and "18.75%" in out  # (p-1)/(v*m+p-1) and (p-1)/(v*m) for p=4, m=8, v=2
    assert "rank 3 |" in out
    assert png.stat().st_size > 1024
    assert any(e["ph"] == "X" for e in json.loads(trace.read_text())["traceEvents"])


def test_zero_bubble_with_weight_time(capsys):
    rc, out, err = _run(capsys, "--schedule", "zb-h1", "--tw", "1.0", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["makespan"] == 27.0  # 3m + p - 1
    assert {e["kind"] for e in res["events"]} == {"F", "BI", "BW"}


@pytest.mark.parametrize("argv,flag", [
    (["--stages", "0"], "--stages"),
    (["--microbatches", "0"], "--microbatches"),
    (["--schedule", "interleaved", "--microbatches", "6"], "--microbatches"),
    (["--virtual-stages", "2"], "--virtual-stages"),
    (["--schedule", "interleaved", "--virtual-stages", "1"], "--virtual-stages"),
    (["--tf", "0"], "--tf"),
    (["--tb", "nan"], "--tb"),
    (["--transfer", "-1"], "--transfer"),
    (["--tw", "1"], "--tw"),
    (["--schedule", "zb-h1", "--tw", "3"], "--tw"),
])
def test_invalid_requests_name_the_flag(capsys, argv, flag):
    rc, out, err = _run(capsys, *argv)
    assert rc == 2
    assert flag in err and "Traceback" not in err
    assert out == ""


def test_every_flag_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sim = sub.choices["simulate"]
    flags = [a for a in sim._actions if a.option_strings and a.dest != "help"]
    assert {f.option_strings[0] for f in flags} >= {"--schedule", "--stages", "--microbatches", "--virtual-stages",
                                                    "--tf", "--tb", "--tw", "--transfer", "--out", "--trace-out",
                                                    "--json"}
    assert all(a.help for a in flags)
