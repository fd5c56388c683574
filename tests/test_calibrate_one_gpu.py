"""`par3d calibrate` on a machine with one GPU (issue 12; found on the one H200 this project was lent, where
`--nproc 1` was refused and the GPU branch wrote 1 SM and the host's RAM): `--nproc 1` is taken on a GPU and
refused on a CPU; more ranks than GPUs are refused before anything starts; a file without measured links (what
`--nproc 1` writes) keeps its catalogue GPU's links and prints a summary.  The calibration itself on a GPU has
not run since these lines were written (no GPU is left to this task)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from par3d.commands import calibrate as cmd
from par3d.plan.hardware import LINKS, hardware_from_dict

ROOT = Path(__file__).resolve().parents[1]


def _args(nproc: int) -> argparse.Namespace:
    return argparse.Namespace(nproc=nproc, sustained_s=0.0, quick=True, json=False, out="unused.json", plot=None)


@pytest.mark.parametrize("gpus, nproc, says", [
    (0, 1, "collectives need at least 2 ranks; use --nproc 2 (--nproc 1 is for a machine with one GPU)"),
    (1, 2, "--nproc 2: each rank needs its own GPU and 1 is visible; use --nproc 1"),
    (4, 8, "--nproc 8: each rank needs its own GPU and 4 are visible; use --nproc 4"),
    (2, 0, "--nproc 0: collectives need at least 2 ranks")])
def test_nproc_is_checked_against_the_gpus_before_anything_runs(monkeypatch, capsys, gpus, nproc, says):
    monkeypatch.setattr(cmd, "_gpus", lambda: gpus)
    assert cmd.run(_args(nproc)) == 2
    assert says in capsys.readouterr().err


def test_one_gpu_passes_the_check(monkeypatch):
    """With one GPU, --nproc 1 reaches the calibration (stubbed here: no GPU to run it on)."""
    import par3d.calibrate as cal

    monkeypatch.setattr(cmd, "_gpus", lambda: 1)
    seen = {}

    def fake(**kw):
        seen.update(kw)
        raise SystemExit(0)
    monkeypatch.setattr(cal, "calibrate", fake)
    with pytest.raises(SystemExit):
        cmd.run(_args(1))
    assert seen["nproc"] == 1


def test_a_one_gpu_file_keeps_the_catalogue_links_and_summarises():
    from par3d.calibrate.report import summary

    hw = json.loads((ROOT / "benchmarks" / "results" / "hardware-cpu.json").read_text())
    for k in ("intra", "inter", "links", "gpus_per_node"):
        hw.pop(k, None)
    hw["collective_fits"] = {}
    hw["device"] = dict(hw["device"], name="NVIDIA H200", base="h200", peak_tflops={"bf16": 989.0},
                        gemm={"bf16": 0.68}, mem_gib=139.8, sms=132)
    f = hardware_from_dict(hw, "one-gpu.json")
    assert (f.intra, f.inter) == (LINKS["nvlink4"], LINKS["ib-ndr"]) and f.device.sms == 132
    assert "links       not measured (one GPU)" in summary(hw)


def test_plot_of_a_file_without_collectives(tmp_path):
    """`--plot` with `--nproc 1` (found on the second H200 lease: the plot took the largest measured group of an
    empty list and failed after the file was written): the collectives' panels say they were not measured."""
    from par3d.calibrate.report import plot

    hw = json.loads((ROOT / "benchmarks/results/hardware-cpu.json").read_text())
    hw["measurements"]["collectives"], hw["collective_fits"] = [], {}
    out = tmp_path / "calibrate.png"
    plot(hw, str(out))
    assert out.stat().st_size > 10_000


def test_the_gpu_probes_of_par3d_runtime_run_and_count_the_planners_bytes():
    """The two probes `par3d calibrate` adds on a GPU (the runtime's attention call by length, and its eager
    non-GEMM kernels' rate), run small on this CPU: each part's bytes are plan/eager.py's count, so the rate the
    file gets is measured on the planner's own accounting."""
    from par3d.calibrate import probes
    from par3d.plan.eager import parts

    tr = probes.measure_eager_traffic(True, tokens=64, h=256)
    assert set(tr["parts"]) == set(parts())
    for name, p in tr["parts"].items():
        assert p["bytes"] == sum(parts()[name]) * 64 * 256 and p["seconds"] > 0
    assert tr["gbps"] == pytest.approx(sum(p["bytes"] for p in tr["parts"].values())
                                       / sum(p["seconds"] for p in tr["parts"].values()) / 1e9)
    curve = probes.measure_attention_curve(True, lengths=(32, 64), tokens=64)
    assert [c["tokens"] for c in curve] == [32, 64] and all(c["tflops"] > 0 for c in curve)
    assert all(c["share"] is None for c in curve)  # no catalogue GPU on a CPU: no share of its peak
