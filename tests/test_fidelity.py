"""`par3d bench fidelity`: the statistics on known inputs, the grid, the plot and table.
No timing goals are asserted (the machine may be shared)."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from par3d.bench.fidelity import (
    CP_OF,
    GRID,
    SHAPES,
    figure,
    format_table,
    layout_config,
    parse_model,
    plot,
    pooled,
    role,
    spearman,
    summarize,
    valid_layouts,
)
from par3d.config import RunConfig
from par3d.plan.hardware import load_hardware_file
from par3d.predict import predict


def test_spearman_known_values():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    # classic example: ranks (1,2,3,4,5) vs (2,1,4,3,5): 1 - 6·4/(5·24) = 0.8
    assert spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)
    # ties take their mean rank
    assert spearman([1, 1, 2], [1, 1, 2]) == pytest.approx(1.0)
    assert math.isnan(spearman([1.0], [2.0]))


def test_summarize_errors_median_and_pick():
    rows = [{"name": "a", "predicted_s": 1.1, "measured_s": 1.0},
            {"name": "b", "predicted_s": 1.8, "measured_s": 2.0},
            {"name": "c", "predicted_s": 3.0, "measured_s": 3.0}]
    s = summarize(rows)
    assert [r["error"] for r in s["layouts"]] == pytest.approx([0.1, -0.1, 0.0])
    assert s["median_abs_error"] == pytest.approx(0.1)
    assert s["spearman"] == pytest.approx(1.0)
    assert s["pick_is_fastest"] and s["pick"] == "a" and s["pick_regret"] == 0.0
    s2 = summarize([{"name": "a", "predicted_s": 2.0, "measured_s": 1.0},
                    {"name": "b", "predicted_s": 1.0, "measured_s": 1.5}])
    assert not s2["pick_is_fastest"] and s2["pick_regret"] == pytest.approx(0.5)


def test_grid_is_valid_and_big_enough():
    assert len(GRID) >= 12
    sizes = set()
    for name, (dp, pp, tp, *_rest) in GRID.items():
        cfg = RunConfig.from_dict(layout_config(name, 3)).validate()
        cp = CP_OF.get(name, 1)
        assert cfg.parallel.world_size == dp * pp * tp * cp <= 4
        sizes.add(dp * pp * tp * cp)
    assert {2, 4} <= sizes
    kinds = {v[3] for v in GRID.values()} | {v[6] for v in GRID.values()}
    assert {"1f1b", "gpipe", "interleaved", "zb-h1", "full", "selective"} <= kinds


def test_every_layout_predicts(tmp_path):
    from test_calibrate import _hardware_dict

    path = tmp_path / "hw.json"
    path.write_text(json.dumps(_hardware_dict()))
    prof = load_hardware_file(str(path))
    for shape in SHAPES.values():
        names = valid_layouts(shape, list(GRID))
        assert len(names) >= 12
        for name in names:
            assert predict(RunConfig.from_dict(layout_config(name, 3, shape=shape)), prof).step_time_s > 0


def test_default_shapes_are_held_out_from_the_calibration():
    """The default run scores the calibration's own shape and at least three that differ from every
    model the calibration ran in width, depth and sequence length."""
    from par3d.calibrate.probes import REFERENCE, TINY, TINY_LAYERS

    refs = [{"layers": REFERENCE["layers"], "hidden": REFERENCE["hidden"], "seq_len": REFERENCE["seq"]}]
    refs += [{"layers": n, "hidden": TINY["hidden"], "seq_len": TINY["seq"]} for n in TINY_LAYERS]
    refs += [{"layers": 2, "hidden": 8, "seq_len": 8}]  # the synthetic pipeline of the hop probe
    roles = [role(s, refs) for s in SHAPES.values()]
    assert roles.count("in-sample") == 1 and roles.count("held-out") >= 3
    held = [s for s in SHAPES.values() if role(s, refs) == "held-out"]
    for key in ("hidden", "layers", "seq_len"):  # they also differ among themselves
        assert len({s[key] for s in held}) == len(held)
    assert role({"layers": 4, "hidden": 64, "seq_len": 32}, refs) == "partly"


def test_parse_model():
    assert parse_model("wide") == ("wide", SHAPES["wide"])
    name, shape = parse_model("mine:layers=3,hidden=48,heads=4,seq_len=96,vocab=512")
    assert name == "mine" and shape == {"layers": 3, "hidden": 48, "heads": 4, "seq_len": 96, "vocab": 512,
                                        "global_batch": 8}
    assert parse_model("l=2,h=32,a=2,s=16")[0] == "L2-h32-s16"
    for bad in ("layers=2,hidden=30,heads=4,seq_len=8", "layers=2,hidden=32", "depth=3", "layers=x,hidden=8"):
        with pytest.raises(ValueError, match="--model"):
            parse_model(bad)


def test_pooled_held_out_summary():
    a = summarize([{"name": "x", "predicted_s": 1.1, "measured_s": 1.0},
                   {"name": "y", "predicted_s": 2.0, "measured_s": 2.0}])
    b = summarize([{"name": "x", "predicted_s": 3.0, "measured_s": 2.0},
                   {"name": "y", "predicted_s": 2.0, "measured_s": 2.2}])
    a["name"], b["name"] = "a", "b"
    p = pooled([a, b])
    assert p["median_abs_error"] == pytest.approx(statistics.median([0.1, 0.0, 0.5, 0.2 / 2.2]))
    assert p["spearman"] == pytest.approx(0.0) and p["spearman_min"] == pytest.approx(-1.0)  # +1 and -1
    assert not p["pick_is_fastest"] and p["pick_regret"] == pytest.approx(0.1)  # b's pick is 10 % slower
    assert not p["pick_within_5pct"] and pooled([a])["pick_within_5pct"]
    assert pooled([]) == {}


def test_plot_and_table(tmp_path):
    rows = [{"name": n, "dp": GRID[n][0], "pp": GRID[n][1], "tp": GRID[n][2],
             "predicted_s": 0.1 * (i + 1), "measured_s": 0.11 * (i + 1)} for i, n in enumerate(list(GRID)[:4])]
    res = summarize(rows)
    png = tmp_path / "f.png"
    plot(res, str(png))
    assert png.stat().st_size > 1000
    assert "median |error|" in format_table(res)
    # every marker visible: the ±15 % band and the diagonal lie beneath every point
    from matplotlib.collections import PathCollection, PolyCollection

    ax = figure(res).axes[0]
    band = max(c.get_zorder() for c in ax.collections if isinstance(c, PolyCollection))
    points = [c for c in ax.collections if isinstance(c, PathCollection) and len(c.get_offsets())]
    assert len(points) == len(rows) and all(c.get_zorder() > band for c in points)
    assert all(line.get_zorder() < min(c.get_zorder() for c in points) for line in ax.get_lines())


def _results_snapshot() -> dict[str, str]:
    import hashlib
    import os

    root = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "results")
    return {f: hashlib.sha256(open(os.path.join(root, f), "rb").read()).hexdigest() for f in sorted(os.listdir(root))}


def test_fidelity_and_synthetic_without_out_leave_the_committed_results(tmp_path, monkeypatch, capsys):
    """End to end, run from the repository root without --out: `bench fidelity` (two shapes, a 1-rank
    and a 2-rank layout, 2 steps) and `bench synthetic` write under runs/bench/, say so, and no file
    under benchmarks/results/ changes.  The fidelity JSON has in-sample and held-out keys apart."""
    import os

    from test_calibrate import _hardware_dict

    from par3d.cli import main

    monkeypatch.chdir(os.path.join(os.path.dirname(__file__), ".."))
    before = _results_snapshot()
    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps(_hardware_dict()))
    assert main(["bench", "fidelity", "--hardware", str(hw), "--layouts", "single,dp2", "--steps", "2",
                 "--model", "reference", "--model", "narrow-deep"]) == 0
    out = capsys.readouterr().out
    assert "wrote runs/bench/fidelity.json" in out
    d = json.loads(open("runs/bench/fidelity.json").read())
    assert {"layouts", "median_abs_error", "spearman", "pick_is_fastest", "in_sample", "heldout"} <= set(d)
    assert {"median_abs_error", "spearman", "pick_is_fastest"} <= set(d["heldout"])
    assert d["heldout"]["shapes"] == ["narrow-deep"] and d["in_sample"]["shapes"] == ["reference"]
    assert all({"predicted_s", "measured_s"} <= set(r) for r in d["layouts"])
    assert os.path.exists("runs/bench/fidelity.png")
    assert main(["bench", "synthetic", "--stages", "2", "--microbatches", "2", "--steps", "2", "--tf", "0.2",
                 "--tb", "0.2"]) == 0
    assert "wrote runs/bench/synthetic.json" in capsys.readouterr().out
    assert _results_snapshot() == before


def test_speed_factor_follows_each_worlds_checks(monkeypatch, tmp_path):
    """Each launched world runs the speed check first and last; a layout's speed-checked prediction
    is the planner's times the mean of its world's two checks over the file's check at that world
    size, averaged over the rounds, scored beside the planner's own; every other round runs a
    world's layouts in reverse order."""
    from test_calibrate import _hardware_dict

    import par3d.distributed as distributed
    from par3d.bench import fidelity

    checks = iter([[1.0, 1.2], [2.4, 2.8], [1.4, 1.0], [2.0, 3.2]])  # w1 r1, w2 r1, w1 r2, w2 r2
    calls: list[tuple[int, list[int], bool]] = []

    def fake_launch(fn, world, args, **kw):  # each layout's step times: 10 ms × its micro-batches
        cfgs, check = args
        calls.append((world, [c["parallel"]["microbatches"] for c in cfgs], check))
        return [{"times": [[0.01 * c["parallel"]["microbatches"]] * 2 for c in cfgs],
                 "checks": next(checks) if check else []}]

    monkeypatch.setattr(distributed, "launch", fake_launch)
    path = tmp_path / "hw.json"
    path.write_text(json.dumps({**_hardware_dict(), "speed_check": {"step_s": {"1": 1.0, "2": 2.0}}}))
    res = fidelity.run_fidelity(str(path), ["single", "single-m4", "dp2"], 3, progress=False, rounds=2,
                                shapes={"reference": SHAPES["reference"]})
    # round 2 runs the 1-rank world's layouts reversed; every world runs the check
    assert calls == [(1, [1, 4], True), (2, [1], True), (1, [4, 1], True), (2, [1], True)]
    rows = {r["name"]: r for r in res["shapes"][0]["layouts"]}
    assert rows["single"]["speed_factor"] == pytest.approx((1.1 + 1.2) / 2)
    assert rows["dp2"]["speed_factor"] == pytest.approx((1.3 + 1.3) / 2)
    for r in rows.values():
        assert r["predicted_checked_s"] == pytest.approx(r["predicted_s"] * r["speed_factor"])
        assert r["error_checked"] == pytest.approx(r["predicted_checked_s"] / r["measured_s"] - 1)
        assert r["error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1)
    assert [c["factor"] for c in res["speed_check"]["worlds"]] == pytest.approx([1.1, 1.3, 1.2, 1.3])
    assert res["in_sample_checked"]["layouts"] == 3 and "1 rank 1.10, 2 ranks 1.30" in format_table(res)
    calls.clear()
    off = fidelity.run_fidelity(str(path), ["single", "dp2"], 3, progress=False, speed_check=False,
                                shapes={"reference": SHAPES["reference"]})
    assert all(r["speed_factor"] == 1.0 for r in off["layouts"]) and off["speed_check"]["worlds"] == []
    assert [c[2] for c in calls] == [False, False]
