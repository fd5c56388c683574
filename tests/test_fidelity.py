"""`par3d bench fidelity`: the statistics on known inputs, the grid, the plot and table.
No timing goals are asserted (the machine may be shared)."""

from __future__ import annotations

import json
import math

import pytest

from par3d.bench.fidelity import GRID, format_table, layout_config, plot, spearman, summarize
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
        assert cfg.parallel.world_size == dp * pp * tp <= 4
        sizes.add(dp * pp * tp)
    assert {2, 4} <= sizes
    kinds = {v[3] for v in GRID.values()} | {v[6] for v in GRID.values()}
    assert {"1f1b", "gpipe", "interleaved", "zb-h1", "full", "selective"} <= kinds


def test_every_layout_predicts(tmp_path):
    from test_calibrate import _hardware_dict

    path = tmp_path / "hw.json"
    path.write_text(json.dumps(_hardware_dict()))
    prof = load_hardware_file(str(path))
    for name in GRID:
        assert predict(RunConfig.from_dict(layout_config(name, 3)), prof).step_time_s > 0


def test_plot_and_table(tmp_path):
    rows = [{"name": n, "dp": GRID[n][0], "pp": GRID[n][1], "tp": GRID[n][2],
             "predicted_s": 0.1 * (i + 1), "measured_s": 0.11 * (i + 1)} for i, n in enumerate(list(GRID)[:4])]
    res = summarize(rows)
    png = tmp_path / "f.png"
    plot(res, str(png))
    assert png.stat().st_size > 1000
    assert "median |error|" in format_table(res)


def test_fidelity_runs_two_layouts(tmp_path):
    """End to end on a 1-rank and a 2-rank layout, 2 steps each: the JSON has the promised keys."""
    from test_calibrate import _hardware_dict

    from par3d.cli import main

    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps(_hardware_dict()))
    out = tmp_path / "fid.json"
    assert main(["bench", "fidelity", "--hardware", str(hw), "--layouts", "single,dp2", "--steps", "2",
                 "--out", str(out), "--json"]) == 0
    d = json.loads(out.read_text())
    assert {"layouts", "median_abs_error", "spearman", "pick_is_fastest"} <= set(d)
    assert all({"predicted_s", "measured_s"} <= set(r) for r in d["layouts"])
    assert (tmp_path / "fid.png").exists()
