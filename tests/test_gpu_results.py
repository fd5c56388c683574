"""The one-H200 results (docs/measured.md §6) are computed from the committed files, not typed in: the plan's
predictions were committed before the measurement (their file carries no measured number), the score the docs
quote is `gpu_fidelity.score` of the two files, and the probe table's figures are the probe file's."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "benchmarks" / "results"
DOC = (ROOT / "docs" / "measured.md").read_text()


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_predictions_are_the_plans_and_hold_no_measurement():
    pred = json.loads((RES / "gpu-fidelity-h200.json").read_text())
    fid = _module("gpu_fidelity")
    assert [r["name"] for r in pred["runs"]] == [r[0] for r in fid.RUNS]
    for r, run in zip(pred["runs"], fid.RUNS):
        assert r["plan_flags"] == fid.plan_flags(run) and set(r) == {"name", "plan_flags", "train_flags",
                                                                       "predicted_step_s", "predicted_mfu"}


def test_the_docs_quote_the_score_of_the_committed_files():
    fid = _module("gpu_fidelity")
    s = fid.score(RES / "gpu-fidelity-h200.json", RES / "gpu-fidelity-h200-measured.json")
    assert s["n"] == 12
    assert f"**{s['within_10']} of {s['n']} within ±10 %, median |error| {s['median_abs_error'] * 100:.1f} %" in DOC
    for r in s["rows"]:
        err = f"{'−' if r['error'] < 0 else '+'}{abs(r['error']) * 100:.1f} %"
        assert f"| {r['predicted_ms']:.1f} ms | {r['measured_ms']:.1f} ms | {err} |" in DOC, r["name"]


def test_score_counts_within_and_median():
    fid = _module("gpu_fidelity")
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p, m = Path(d) / "p.json", Path(d) / "m.json"
        p.write_text(json.dumps({"runs": [{"name": "a", "predicted_step_s": 1.0}, {"name": "b", "predicted_step_s": 1.0},
                                          {"name": "c", "predicted_step_s": 1.0}]}))
        m.write_text(json.dumps({"runs": {"a": {"median_step_s": 1.05}, "b": {"median_step_s": 2.0},
                                          "c": {"error": "x"}}}))
        s = fid.score(p, m)
    assert s["n"] == 2 and s["within_10"] == 1 and s["median_abs_error"] == pytest.approx((0.05 / 1.05 + 0.5) / 2)


def test_probe_figures_in_the_docs_are_the_probe_files():
    probe = json.loads((RES / "gpu-probe-h200.json").read_text())
    held = probe["peak"]["held"]
    assert f"{held['median_last_half']:.0f} TFLOP/s at" in DOC
    attn = {(r["backend"], r["seq"]): r["tflops"] / 989 for r in probe["attention"] if "tflops" in r}
    assert f"{attn[('flash', 8192)]:.2f}" in DOC and f"{attn[('cudnn', 8192)]:.3f}"[:5] in DOC
    host = json.loads((RES / "gpu-host-h200.json").read_text())
    for r in host["rows"]:
        assert f"| {r['wall_s'] * 1e3:.1f} ms | {r['issue_s'] * 1e3:.1f} ms | {r['gpu_busy_s'] * 1e3:.1f} ms |" in DOC


def test_the_second_set_is_new_and_prices_from_a_gpu_file():
    """The second lease's held-out runs share no shape with the first set, and `predict --hardware` prices them from
    a GPU file `par3d calibrate` wrote (the lease-2 file here, written before calibrate measured attention and the
    eager kernels' rate: its host costs overlap the GPU's work)."""
    fid = _module("gpu_fidelity")
    shapes = {r[1:] for r in fid.RUNS}
    assert len(fid.HELD_OUT) == 8 and not any(r[1:] in shapes for r in fid.HELD_OUT)
    flags = fid.plan_flags(fid.HELD_OUT[0], str(RES / "hardware-h200-lease2.json"))
    assert "--hardware" in flags and "--gpu" not in flags and "--attention-kernel" not in flags
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "par3d", "plan", *flags], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["plans"][0]["step_time_s"] > 0
