"""`par3d plan` in-process: JSON shape, speed, --explain, --emit-config, bad input, no torch."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from par3d.cli import main
from par3d.config import RunConfig

PLAN_KEYS = {"tp", "pp", "dp", "micro_batch", "microbatches", "schedule", "virtual_stages", "recompute",
             "zero_stage", "sequence_parallel", "fits", "memory_gib", "step_time_s", "breakdown_s",
             "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "bubble_fraction"}


def run(capsys, *argv):
    rc = main(["plan", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_no_torch_on_import():
    code = ("import sys, par3d.plan.search, par3d.plan.cost, par3d.commands.plan; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_json_1024_gpus_fast(capsys):
    t0 = time.perf_counter()
    rc, out, _ = run(capsys, "--model", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "1024",
                     "--global-batch", "1536", "--json")
    elapsed = time.perf_counter() - t0
    assert rc == 0
    assert elapsed < 2.0, f"took {elapsed:.2f} s"
    d = json.loads(out)
    assert set(d) >= {"model", "hardware", "plans"}
    assert d["plans"], "no plan"
    times = [p["step_time_s"] for p in d["plans"]]
    assert times == sorted(times)
    for p in d["plans"]:
        assert PLAN_KEYS <= set(p)
        assert set(p["memory_gib"]) == {"weights", "grads", "optimizer", "activations", "other", "total"}
        assert set(p["breakdown_s"]) == {"compute", "recompute", "tp_comm", "pp_comm", "dp_comm", "bubble",
                                         "optimizer"}
        assert sum(p["breakdown_s"].values()) == pytest.approx(p["step_time_s"], rel=1e-6)
        assert p["tp"] * p["pp"] * p["dp"] == 1024
        assert p["micro_batch"] * p["microbatches"] * p["dp"] == 1536
        assert p["fits"] and p["memory_gib"]["total"] <= 80
        assert 0 < p["mfu"] < 1 and p["hardware_tflops_per_gpu"] >= p["model_tflops_per_gpu"]


def test_fixed_choices_and_explain(capsys):
    rc, out, _ = run(capsys, "--model", "gpt3-175b", "--gpus", "512", "--global-batch", "384", "--tp", "8",
                     "--pp", "8", "--micro-batch", "1", "--schedule", "1f1b", "--zero-stage", "0",
                     "--max-bubble", "0.15", "--explain")
    assert rc == 0
    assert "tp=8 pp=8 dp=8 mb=1 m=48 1f1b" in out
    assert "why this plan wins" in out and "step time breakdown" in out
    assert "per-layer accounting" in out and "roofline" in out


def test_emit_config(tmp_path, capsys):
    path = tmp_path / "plan.toml"
    rc, out, err = run(capsys, "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "64",
                       "--emit-config", str(path))
    assert rc == 0 and path.exists()
    cfg = RunConfig.load_toml(str(path)).validate()
    assert cfg.parallel.world_size == 16
    assert cfg.parallel.zero_stage in (0, 1)
    assert cfg.train.global_batch == 64 and cfg.model.layers == 24


def test_hardware_file(tmp_path, capsys):
    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps({"device": {"base": "a100-80gb", "efficiency": 0.6}, "gpus_per_node": 8,
                              "intra": {"alpha_us": 3, "bw_gbps": 300}, "inter": {"alpha_us": 2, "bw_gbps": 25}}))
    rc, out, _ = run(capsys, "--model", "gpt3-1.3b", "--gpus", "8", "--hardware", str(hw), "--json")
    assert rc == 0
    assert json.loads(out)["hardware"]["device"]["efficiency"] == 0.6


@pytest.mark.parametrize("argv,flag", [
    (["--model", "nope"], "--model"),
    (["--model", "gpt3-175b", "--gpus", "1024", "--tp", "3"], "--tp"),
    (["--model", "gpt3-175b", "--gpus", "1024", "--tp", "8", "--pp", "8", "--dp", "8"], "--tp"),
    (["--model", "gpt3-1.3b", "--gpus", "12"], "--gpus"),
    (["--model", "gpt3-1.3b", "--gpus", "8", "--dp", "8", "--global-batch", "12"], "--global-batch"),
    (["--model", "gpt3-1.3b", "--gpu", "tpu"], "--gpu"),
    (["--model", "gpt3-1.3b", "--hardware", "/nonexistent.json"], "--hardware"),
    (["--model", "gpt3-1.3b", "--schedule", "gpipe", "--virtual-stages", "2"], "--virtual-stages"),
])
def test_bad_input(capsys, argv, flag):
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    assert flag in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_argparse_type_errors(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--tp", "0"])
    assert e.value.code == 2
    assert "--tp" in capsys.readouterr().err


def test_nothing_fits(capsys):
    rc, out, err = run(capsys, "--model", "gpt3-175b", "--gpus", "8", "--gpu", "a100-40gb")
    assert rc == 1
    assert "no configuration" in err and "fix:" in err
