"""Smoke test of `par3d bench peers --quick`: it runs, its JSON has the promised schema, and every
row that has a peer number computed the same loss as the peer.  No timing assertions: speed is
what the benchmark reports, not what a test can decide on a shared machine."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from par3d.cli import main

ROW_KEYS = {"case", "ours_s", "theirs_s", "ratio", "same_loss"}
# CPU ranks: ours over shared memory and over the backend, each against the same torch pipeline
CASES_2 = {"tp_block_2", "dp_2"} | {f"pp_{s}_2_{t}" for s in ("gpipe", "1f1b", "interleaved")
                                    for t in ("shm", "backend")}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    # one in-process run (two gloo ranks, ~20 s) shared by the tests below
    out = tmp_path_factory.mktemp("peers")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["bench", "peers", "--quick", "--ranks", "2", "--json", "--out", str(out)])
    assert rc == 0
    return json.loads(buf.getvalue()), out


def test_schema(quick_run: tuple[dict, Path]) -> None:
    result, _ = quick_run
    rows = result["rows"]
    assert {r["case"] for r in rows} == CASES_2
    for r in rows:
        assert ROW_KEYS <= set(r), r
        assert isinstance(r["ours_s"], float) and r["ours_s"] > 0
        if r["theirs_s"] is None:
            # a peer that failed says why, and no ratio is made up
            assert r["ratio"] is None and r.get("note"), r
        else:
            assert r["theirs_s"] > 0
            assert r["ratio"] == pytest.approx(r["ours_s"] / r["theirs_s"], rel=1e-2)


def test_same_loss_wherever_a_peer_ran(quick_run: tuple[dict, Path]) -> None:
    result, _ = quick_run
    for r in result["rows"]:
        if r["theirs_s"] is not None:
            assert r["same_loss"] is True, r


def test_results_files_written(quick_run: tuple[dict, Path]) -> None:
    result, out = quick_run
    assert json.loads((out / "peers.json").read_text())["rows"] == result["rows"]
    md = (out / "peers.md").read_text()
    assert all(case in md for case in CASES_2)


def test_default_output_is_not_the_committed_results() -> None:
    from par3d.cli import build_parser

    args = build_parser().parse_args(["bench", "peers"])
    assert not Path(args.out).resolve().is_relative_to(Path("benchmarks/results").resolve()), args.out


def test_repeated_runs_keep_the_median_run_of_each_row() -> None:
    from par3d.bench.peers import _median_runs

    def row(case: str, ours: float, theirs: float) -> dict:
        return {"case": case, "ours_s": ours, "theirs_s": theirs, "ratio": round(ours / theirs, 3)}

    runs = [[row("a", 1.0, 2.0), row("b", 3.0, 2.0)], [row("a", 1.8, 2.0), row("b", 1.0, 2.0)],
            [row("a", 1.2, 2.0), row("b", 2.0, 2.0)]]
    a, b = _median_runs(runs)
    assert (a["ours_s"], a["ratio"], a["ratio_runs"], a["ratio_range"]) == (1.2, 0.6, [0.5, 0.9, 0.6], [0.5, 0.9])
    assert (b["ours_s"], b["ratio"], b["median_of_run"]) == (2.0, 1.0, 3)
    assert _median_runs(runs[:1]) == runs[0]
