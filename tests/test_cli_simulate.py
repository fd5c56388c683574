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


def test_blocking_sends(capsys):
    """--blocking-sends: each send holds its rank (simulate's `blocking`); the interleaved schedule, which hides its
    transfers in its slack when they are posted, pays them on its ranks' timelines, and the report says so."""
    base = ["--schedule", "interleaved", "--virtual-stages", "2", "--stages", "4", "--microbatches", "8",
            "--transfer", "0.1"]
    posted = json.loads(_run(capsys, *base, "--json")[1])
    rc, out, err = _run(capsys, *base, "--blocking-sends", "--json")
    assert rc == 0, err
    held = json.loads(out)
    assert (posted["blocking_sends"], held["blocking_sends"]) == (False, True)
    assert held["makespan"] > posted["makespan"]
    # the comparison table runs every builder the same way
    assert held["comparison"]["1f1b"]["makespan"] > posted["comparison"]["1f1b"]["makespan"]
    assert "blocking sends" in _run(capsys, *base, "--blocking-sends")[1]


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
    # the paper's T_F = T_B = T_W = 1: --tb is the input-gradient half once --tw is given
    rc, out, err = _run(capsys, "--schedule", "zb-h1", "--tf", "1", "--tb", "1", "--tw", "1", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["makespan"] == 27.0  # 3m + p - 1
    assert (res["tb"], res["tw"]) == (2.0, 1.0)  # full backward, weight part
    assert {e["kind"] for e in res["events"]} == {"F", "BI", "BW"}


def test_every_schedule_side_by_side(capsys):
    """The issue's acceptance command: ZB-V < ZB-H1 < 1F1B (3/11) in bubble, and ZB-V's and
    ZB-H1's peak activations no higher than 1F1B's."""
    rc, out, err = _run(capsys, "--stages", "4", "--microbatches", "8", "--tf", "1", "--tb", "1", "--tw", "1",
                        "--json")
    assert rc == 0, err
    res = json.loads(out)
    cmp = res["comparison"]
    assert abs(res["bubble_wall"] - 3 / 11) < 1e-12 and abs(cmp["1f1b"]["bubble_wall"] - 3 / 11) < 1e-12
    assert cmp["zb-v"]["bubble_wall"] < cmp["zb-h1"]["bubble_wall"] < cmp["1f1b"]["bubble_wall"]
    assert abs(cmp["zb-h1"]["bubble_wall"] - 3 / 27) < 1e-12
    assert abs(cmp["zb-v"]["bubble_wall"] - 3 / 51) < 1e-12  # (p-1)/(6m+p-1)
    for name in ("zb-v", "zb-h1"):
        assert cmp[name]["peak_activations"] <= cmp["1f1b"]["peak_activations"] == 4
    assert cmp["dualpipe-v"]["v"] == 2 and set(cmp) == {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v",
                                                        "dualpipe-v"}
    rc, out, err = _run(capsys, "--stages", "4", "--microbatches", "6")
    assert rc == 0 and "dualpipe-v   -- dualpipe-v needs at least 2p micro-batches" in out


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe-v"])
def test_to_csv_then_schedule_csv_simulates_identically(capsys, tmp_path, name):
    path = tmp_path / f"{name}.csv"
    rc, out, err = _run(capsys, "--schedule", name, "--stages", "4", "--microbatches", "8", "--tf", "1",
                        "--tb", "1", "--tw", "1", "--transfer", "0.1", "--to-csv", str(path), "--json")
    assert rc == 0, err
    built = json.loads(out)
    assert path.read_text().startswith("0F0,")
    rc, out, err = _run(capsys, "--schedule-csv", str(path), "--tf", "1", "--tb", "1", "--tw", "1",
                        "--transfer", "0.1", "--json")
    assert rc == 0, err
    loaded = json.loads(out)
    assert (loaded["schedule"], loaded["p"], loaded["m"], loaded["v"]) == ("csv", 4, 8, built["v"])
    assert loaded["events"] == built["events"] and loaded["makespan"] == built["makespan"]


def test_schedule_csv_with_a_swapped_dependency_is_refused(capsys, tmp_path):
    path = tmp_path / "bad.csv"
    _run(capsys, "--schedule", "zb-h1", "--stages", "2", "--microbatches", "2", "--to-csv", str(path))
    rows = path.read_text().splitlines()
    cells = rows[0].split(",")
    i, w = cells.index("0I0"), cells.index("0W0")
    cells[i], cells[w] = cells[w], cells[i]
    rows[0] = ",".join(cells)
    path.write_text("\n".join(rows) + "\n")
    rc, out, err = _run(capsys, "--schedule-csv", str(path))
    assert rc == 2 and out == "" and "Traceback" not in err
    assert f"--schedule-csv: {path} is not a valid schedule" in err
    assert f"rank 0 (row 1), position {i}: 0W0 needs 0I0" in err


@pytest.mark.parametrize("argv,flag", [
    (["--stages", "0"], "--stages"),
    (["--microbatches", "0"], "--microbatches"),
    (["--schedule", "interleaved", "--microbatches", "6"], "--microbatches"),
    (["--virtual-stages", "2"], "--virtual-stages"),
    (["--schedule", "interleaved", "--virtual-stages", "1"], "--virtual-stages"),
    (["--tf", "0"], "--tf"),
    (["--tb", "nan"], "--tb"),
    (["--transfer", "-1"], "--transfer"),
    (["--tw", "-1"], "--tw"),
    (["--schedule-csv", "/nonexistent/x.csv"], "--schedule-csv"),
    (["--schedule", "zb-v", "--virtual-stages", "3"], "--virtual-stages"),
    (["--schedule", "dualpipe-v", "--microbatches", "4"], "--microbatches"),
    (["--held", "0.5"], "--held"),  # the default schedule, 1f1b: the share orders zb-v alone
    (["--schedule", "dualpipe-v", "--held", "0.5"], "--held"),
    (["--schedule", "zb-v", "--held", "0"], "--held"),
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
                                                    "--json", "--schedule-csv", "--to-csv"}
    assert all(a.help for a in flags)


def test_train_reads_the_csv_and_refuses_a_bad_one_before_starting(capsys, tmp_path):
    good, bad = tmp_path / "zbv.csv", tmp_path / "bad.csv"
    _run(capsys, "--schedule", "zb-v", "--stages", "2", "--microbatches", "4", "--to-csv", str(good))
    rc = main(["train", "--dp", "1", "--tp", "1", "--pp", "2", "--schedule-csv", str(good), "--steps", "1",
               "--out", str(tmp_path / "run"), "--dry-run"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert f"schedule from {good} v=2, m=4" in out.out
    bad.write_text(good.read_text().replace("3F0,3I0", "3I0,3F0", 1))
    rc = main(["train", "--dp", "1", "--tp", "1", "--pp", "2", "--schedule-csv", str(bad), "--steps", "1",
               "--out", str(tmp_path / "run"), "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "rank 0 (row 1), position 3: 3I0 needs 3F0" in err
    rc = main(["train", "--dp", "1", "--tp", "1", "--pp", "4", "--schedule-csv", str(good), "--steps", "1",
               "--out", str(tmp_path / "run"), "--dry-run"])
    assert rc == 2 and "has 2 rows (pipeline ranks) but pp=4; use --pp 2" in capsys.readouterr().err
