"""`par3d plan` in-process: JSON shape, speed, --explain, --emit-config, bad input, no torch."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from par3d.cli import main
from par3d.config import RunConfig

PLAN_KEYS = {"tp", "cp", "pp", "dp", "micro_batch", "microbatches", "schedule", "virtual_stages", "recompute",
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
        assert set(p["breakdown_s"]) == {"compute", "recompute", "tp_comm", "cp_comm", "pp_comm", "dp_comm",
                                         "bubble", "optimizer", "stragglers"}
        assert sum(p["breakdown_s"].values()) == pytest.approx(p["step_time_s"], rel=1e-6)
        assert p["tp"] * p["cp"] * p["pp"] * p["dp"] == 1024
        assert p["micro_batch"] * p["microbatches"] * p["dp"] == 1536
        assert p["fits"] and p["memory_gib"]["total"] <= 80
        assert 0 < p["mfu"] < 1 and p["hardware_tflops_per_gpu"] >= p["model_tflops_per_gpu"]


def test_straggler_cv_flag(capsys):
    """--straggler-cv: 0 prices no stragglers (the step shrinks by exactly their share), the default names them
    in --explain, and a value outside [0, 0.5] is refused before anything runs."""
    args = ("--model", "gpt3-13b", "--gpu", "h100", "--gpus", "64", "--global-batch", "256", "--tp", "8",
            "--pp", "2", "--json")
    rc, out, _ = run(capsys, *args)
    assert rc == 0
    d = json.loads(out)
    assert d["hardware"]["straggler_cv"] == 0.015
    rc, out0, _ = run(capsys, *args, "--straggler-cv", "0")
    assert rc == 0
    d0 = json.loads(out0)
    assert d0["hardware"]["straggler_cv"] == 0.0
    best, best0 = d["plans"][0], d0["plans"][0]
    assert "stragglers" not in best0["breakdown_s"]
    if (best["tp"], best["pp"], best["micro_batch"], best["schedule"]) == (best0["tp"], best0["pp"],
                                                                            best0["micro_batch"], best0["schedule"]):
        assert best["step_time_s"] - best0["step_time_s"] == pytest.approx(best["breakdown_s"]["stragglers"], rel=1e-6)
    assert best["step_time_s"] > best0["step_time_s"]
    rc, out, _ = run(capsys, *args[:-1], "--explain")
    assert rc == 0 and "stragglers" in out and "slowest of 64 GPUs" in out
    with pytest.raises(SystemExit):
        run(capsys, *args, "--straggler-cv", "0.7")
    assert "must be a fraction in [0, 0.5]" in capsys.readouterr().err


def test_fixed_choices_and_explain(capsys):
    rc, out, _ = run(capsys, "--model", "gpt3-175b", "--gpus", "512", "--global-batch", "384", "--tp", "8",
                     "--pp", "8", "--micro-batch", "1", "--schedule", "1f1b", "--zero-stage", "0",
                     "--max-bubble", "0.15", "--explain")
    assert rc == 0
    assert "tp=8 pp=8 dp=8 mb=1 m=48 1f1b" in out
    assert "why this plan wins" in out and "step time breakdown" in out
    assert "per-layer accounting" in out and "roofline" in out


def test_explain_states_the_attention_share_a_step_keeps(capsys):
    """--explain's attention line (issue 12's sixteenth round): the kernel's benchmarked share, the in-step
    discount and their product, which is what the step prices; FlashAttention off: no such line."""
    import re

    from par3d.plan.hardware import DEVICES

    rc, out, _ = run(capsys, "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--global-batch", "64",
                     "--top", "1", "--explain")
    assert rc == 0
    m = re.search(r"attention core \(FlashAttention.*?: ([0-9.]+) ms per layer at ([0-9.]+)% of bf16 peak in a step = "
                  r"([0-9.]+)% benchmarked × ([0-9.]+) kept", out)
    assert m, out
    share, bench, kept = float(m[2]), float(m[3]), float(m[4])
    h100 = DEVICES["h100-sxm"]
    assert bench == pytest.approx(100 * h100.attn_benchmarked(8192), abs=0.05)
    assert kept == pytest.approx(h100.attn_sustain, abs=5e-4) and share == pytest.approx(bench * kept, abs=0.1)
    rc, out, _ = run(capsys, "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--global-batch", "64",
                     "--top", "1", "--explain", "--no-flash-attention")
    assert rc == 0 and "attention core (FlashAttention" not in out


def test_emit_config(tmp_path, capsys):
    path = tmp_path / "plan.toml"
    rc, out, err = run(capsys, "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "64",
                       "--emit-config", str(path))
    assert rc == 0 and path.exists()
    cfg = RunConfig.load_toml(str(path)).validate()
    assert cfg.parallel.world_size == 16
    assert cfg.parallel.zero_stage in (0, 1, 2, 3)  # every stage runs (issue 16): no clamp
    assert cfg.train.global_batch == 64 and cfg.model.layers == 24


def test_hardware_file(tmp_path, capsys):
    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps({"device": {"base": "a100-80gb", "efficiency": 0.6}, "gpus_per_node": 8,
                              "intra": {"alpha_us": 3, "bw_gbps": 300}, "inter": {"alpha_us": 2, "bw_gbps": 25}}))
    rc, out, _ = run(capsys, "--model", "gpt3-1.3b", "--gpus", "8", "--hardware", str(hw), "--json")
    assert rc == 0
    assert json.loads(out)["hardware"]["device"]["efficiency"] == 0.6


def test_hardware_file_straggler_cv(tmp_path, capsys):
    """A GPU hardware file's top-level straggler_cv is the cluster's spread; --straggler-cv overrides it; a
    value outside [0, 0.5] is refused, naming the field."""
    hw = tmp_path / "hw.json"
    body = {"device": {"base": "h100-sxm", "gemm": {"bf16": 0.6}}, "gpus_per_node": 8,
            "intra": {"alpha_us": 3, "bw_gbps": 370}, "inter": {"alpha_us": 2, "bw_gbps": 45}}
    argv = ("--model", "gpt3-1.3b", "--gpus", "16", "--hardware", str(hw), "--json")
    for cv, flag, want in ((None, (), 0.015), (0.03, (), 0.03), (0.03, ("--straggler-cv", "0"), 0.0)):
        hw.write_text(json.dumps({**body, **({} if cv is None else {"straggler_cv": cv})}))
        rc, out, _ = run(capsys, *argv, *flag)
        assert rc == 0
        assert json.loads(out)["hardware"]["straggler_cv"] == want
    hw.write_text(json.dumps({**body, "straggler_cv": 2}))
    rc, _, err = run(capsys, *argv)
    assert rc == 2 and "straggler_cv=2" in err and "Traceback" not in err


@pytest.mark.parametrize("edit, says", [
    (lambda d: d.__setitem__("overheads", 3), "is malformed"),
    (lambda d: d.__setitem__("collective_fits", 1.5), "is malformed"),
    (lambda d: d["collective_sync"].pop("ranks_per_core"), "is malformed (missing 'ranks_per_core')"),
    (lambda d: d.__setitem__("host", "somewhere"), "is malformed"),  # not a table of the host it was calibrated on
    (lambda d: d["device"].__setitem__("attn_sustain", "x"), "device.attn_sustain='x' must be a number"),
    (lambda d: d["device"].__setitem__("base", 7), "GPU 7 is not a name"),
])
def test_a_malformed_calibrated_hardware_file_is_refused_by_name(tmp_path, capsys, edit, says):
    """A hardware file `par3d calibrate` wrote, then damaged (a field of the wrong shape, one missing): refused
    naming what is wrong and how to mend it, never a traceback (random damage found tracebacks before)."""
    src = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "hardware-cpu.json"
    d = json.loads(src.read_text())
    edit(d)
    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps(d))
    rc, out, err = run(capsys, "--layers", "4", "--hidden", "256", "--heads", "4", "--seq-len", "128", "--vocab",
                       "1000", "--gpus", "2", "--global-batch", "8", "--hardware", str(hw))
    # (a file calibrated on another CPU is first warned about: the one in benchmarks/results on any other host)
    errors = [line for line in err.splitlines() if line.startswith("par3d plan: error:")]
    assert rc == 2 and len(errors) == 1 and errors[0].startswith(f"par3d plan: error: --hardware {hw}"), err
    assert says in errors[0] and "Traceback" not in err, err


def test_train_refuses_a_damaged_host_profile_before_it_starts(tmp_path, capsys):
    """`par3d train --hardware` reads the file's host profile only for its end-of-run prediction: a damaged one is
    refused before any rank starts (exit 2, here under --dry-run), not after the run."""
    d = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "hardware-cpu.json").read_text())
    d["collective_fits"] = 1.5
    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps(d))
    rc = main(["train", "--hardware", str(hw), "--dry-run", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and f"par3d train: --hardware {hw}: its host profile" in err and "is malformed" in err


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
    assert "no configuration" in err and "fix:" in err and "nearest to fitting" in err
    # the GPU count offered was searched and has a plan
    fix = next(line for line in err.splitlines() if "--gpus" in line)
    n = int(fix.split("--gpus ")[1].split(":")[0])
    rc, out, _ = run(capsys, "--model", "gpt3-175b", "--gpus", str(n), "--gpu", "a100-40gb", "--json")
    assert rc == 0 and json.loads(out)["plans"]
    rc, out, err = run(capsys, "--model", "gpt3-175b", "--gpus", "8", "--gpu", "a100-40gb", "--json")
    d = json.loads(out)
    assert rc == 1 and d["plans"] == [] and d["nearest_unfit"]["cp"] == 1 and d["fixes"]


def test_nearest_unfit_is_the_least_memory():
    from collections import Counter

    from par3d.plan.cost import Choice
    from par3d.plan.hardware import make_cluster
    from par3d.plan.models import CATALOGUE
    from par3d.plan.plan_memory import memory
    from par3d.plan.search import Fixed, Limits, enumerate_choices, search

    model, cl = CATALOGUE["gpt3-175b"], make_cluster("a100-40gb", 16)
    res = search(model, cl, 32)
    assert not res.plans and res.nearest_unfit is not None
    least = min(memory(model, cl, Choice(tp, pp, dp, mb, m, s, v, rec, z, tp > 1, cp))[0].total
                for tp, cp, pp, dp, mb, m, s, v in enumerate_choices(model, cl, 32, Fixed(), Limits(), Counter())
                for rec in ("none", "selective", "full") for z in range(4) if z == 0 or dp > 1)
    assert res.nearest_unfit.memory.total == least


def test_fix_follows_the_rejections(capsys):
    # 1000 GPUs: every layout's dp has a factor 5 (or pp > layers), so the batch of 512 is the problem,
    # not the GPU count
    rc, out, err = run(capsys, "--model", "gpt3-1.3b", "--gpus", "1000", "--global-batch", "512")
    assert rc == 1
    fix = err.split("fix:")[1]
    assert "--global-batch" in fix and "--gpus" not in fix
    batch = int(fix.split("--global-batch ")[1].split()[0])
    rc, out, err = run(capsys, "--model", "gpt3-1.3b", "--gpus", "1000", "--global-batch", str(batch), "--json")
    assert rc == 0 and json.loads(out)["plans"]
    # a 131K-token run without CP (and without FlashAttention, so its s² scores are stored): the fix
    # offers a context-parallel degree that was searched and fits
    rc, out, err = run(capsys, "--model", "llama3-405b", "--gpu", "h100", "--gpus", "16384", "--seq-len", "131072",
                       "--cp", "1", "--tp", "8", "--pp", "16", "--global-batch", "128", "--no-flash-attention")
    assert rc == 1 and "--cp " in err.split("fix:")[1]
    nearest = float(err.split("nearest to fitting:")[1].split(" needs ")[1].split(" GiB")[0])
    # the least-memory candidate (full recomputation: one layer's s² scores while it is recomputed,
    # 1.4 TB), not the fastest (which needs 181,689 GiB)
    assert nearest < 2000
    # a --dp the user gave: the context-parallel fix keeps it where a layout can (here pp moves instead), and
    # where none can (tp, pp and dp all fixed) it says to drop it; the plan it offers has the dp it says
    big = ("--model", "llama3-405b", "--gpu", "h100", "--gpus", "16384", "--seq-len", "131072", "--cp", "1",
           "--tp", "8", "--dp", "128", "--global-batch", "128", "--no-flash-attention")
    rc, out, err = run(capsys, *big)
    fix = err.split("fix:")[1]
    assert rc == 1 and "--cp 2:" in fix and " dp=128 " in fix.split("--cp 2:")[1].split("\n")[0]
    rc, out, err = run(capsys, *big, "--pp", "16")
    fix = err.split("fix:")[1]
    assert rc == 1 and "--cp 2 and drop --dp 128:" in fix and " dp=64 " in fix.split("--cp 2 and")[1].split("\n")[0]
    # fixed choices that keep memory up are named only when the search without them has a plan
    rc, out, err = run(capsys, "--model", "gpt3-13b", "--gpus", "8", "--global-batch", "64", "--zero-stage", "0",
                       "--recompute", "none", "--micro-batch", "8", "--tp", "1", "--pp", "1")
    assert rc == 1 and "drop --zero-stage --recompute --micro-batch: then" in err
    rc, out, err = run(capsys, "--model", "gpt3-13b", "--gpus", "1", "--global-batch", "8", "--zero-stage", "0")
    assert rc == 1 and "drop --zero-stage" not in err  # ZeRO over one GPU changes nothing


def test_explain_layout_line_is_the_winner(capsys):
    rc, out, _ = run(capsys, "--model", "gpt3-175b", "--gpus", "512", "--global-batch", "384", "--explain")
    assert rc == 0
    best = next(line for line in out.splitlines() if line.startswith("best: ")).split(": ")[1]
    mine = [line for line in out.splitlines() if "<- winner's layout" in line]
    assert len(mine) == 1 and mine[0].strip().startswith(best + ":")


@pytest.mark.parametrize("extra", [["--cp", "1", "--global-batch", "2048"],
                                   ["--cp", "16", "--seq-len", "131072", "--global-batch", "128"]])
def test_llama3_405b_16k_h100(capsys, extra):
    # Llama 3 paper, Table 4: TP 8, PP 16 on 16,384 H100; the long-context stage adds CP 16 at 131K tokens
    rc, out, err = run(capsys, "--model", "llama3-405b", "--gpu", "h100", "--gpus", "16384", "--tp", "8",
                       "--pp", "16", *extra, "--json")
    assert rc == 0, err
    d = json.loads(out)
    cp = int(extra[1])
    for p in d["plans"]:
        assert (p["tp"], p["cp"], p["pp"], p["dp"]) == (8, cp, 16, 16384 // (128 * cp))
        assert p["fits"] and p["memory_gib"]["total"] <= 0.95 * 80
    assert d["memory"]["headroom"] == 0.05
    if cp > 1:  # tp 8 fills a node, so the CP ring crosses nodes; --explain prices it
        rc, out, _ = run(capsys, "--model", "llama3-405b", "--gpu", "h100", "--gpus", "16384", "--tp", "8",
                         "--pp", "16", *extra, "--explain", "--top", "1")
        assert rc == 0 and f"CP ring (cp = {cp}, across nodes" in out and "tp=8 cp=16 pp=16" in out
        # as Llama 3 ran it: K/V all-gathered (exposed), FlashAttention-2: slower than the default
        rc, out2, _ = run(capsys, "--model", "llama3-405b", "--gpu", "h100", "--gpus", "16384", "--tp", "8",
                          "--pp", "16", *extra, "--cp-comm", "all-gather", "--attention-kernel", "fa2",
                          "--explain", "--top", "1")
        assert rc == 0 and f"CP all-gather (cp = {cp}, across nodes" in out2
        rc, js, _ = run(capsys, "--model", "llama3-405b", "--gpu", "h100", "--gpus", "16384", "--tp", "8",
                        "--pp", "16", *extra, "--cp-comm", "all-gather", "--attention-kernel", "fa2", "--json")
        assert json.loads(js)["plans"][0]["step_time_s"] > d["plans"][0]["step_time_s"]
        # DeepSpeed-Ulysses: 128 heads over tp 8 x cp 16 = one query head per rank, the one K/V head replicated
        rc, out3, _ = run(capsys, "--model", "llama3-405b", "--gpu", "h100", "--gpus", "16384", "--tp", "8",
                          "--pp", "16", *extra, "--cp-comm", "a2a", "--explain", "--top", "1")
        assert rc == 0 and (f"CP all-to-all (Ulysses, cp = {cp}, across nodes): each rank attends over all "
                            "131072 tokens with 1 query head and 1 K/V head") in out3
        rc, _, err = run(capsys, "--model", "llama3-405b", "--gpu", "h100", "--gpus", "16384", "--tp", "8",
                         "--pp", "16", "--cp", "32", "--seq-len", "131072", "--cp-comm", "a2a")
        assert rc == 2 and "--cp-comm a2a with --tp 8 --cp 32: 128 attention heads do not split" in err


def test_dtypes_and_model_flags(capsys):
    base = ["--layers", "32", "--hidden", "4096", "--heads", "32", "--kv-heads", "8", "--ffn-hidden", "14336",
            "--gated-mlp", "--norm", "rms", "--vocab", "128256", "--seq-len", "8192", "--gpus", "64", "--json"]
    rc, out, err = run(capsys, *base, "--dtype", "fp16")
    assert rc == 0, err
    d = json.loads(out)
    assert d["hardware"]["dtype"] == "fp16" and d["plans"]
    assert d["model"]["params"] == pytest.approx(8.03e9, rel=0.01)  # = llama3-8b
    assert (d["model"]["kv_heads"], d["model"]["norm"], d["model"]["gated"]) == (8, "rms", True)
    rc, out, err = run(capsys, *base, "--gpu", "h100", "--dtype", "fp8")
    assert rc == 0, err
    rc, out, err = run(capsys, *base, "--gpu", "a100", "--dtype", "fp8")
    assert rc == 2 and "--dtype fp8" in err


def test_memory_headroom_and_accounting(capsys):
    args = ["--model", "gpt3-13b", "--gpus", "8", "--global-batch", "16", "--json", "--top", "20"]
    rc, out, _ = run(capsys, *args)
    plans = json.loads(out)["plans"]
    assert rc == 0 and all(p["memory_gib"]["total"] <= 0.95 * 80 for p in plans)
    rc, out, _ = run(capsys, *args, "--memory-headroom", "0.3")
    assert rc == 0 and all(p["memory_gib"]["total"] <= 0.7 * 80 for p in json.loads(out)["plans"])
    rc, out, _ = run(capsys, *args, "--memory-accounting", "megatron", "--zero-stage", "0", "--tp", "8")
    assert rc == 0
    p = json.loads(out)["plans"][0]
    assert p["memory_gib"]["grads"] == pytest.approx(2 * p["memory_gib"]["weights"], rel=1e-3)  # fp32 main grads


def test_ignore_memory_prices_a_layout_memory_rejects(capsys):
    """--ignore-memory: Llama 3 405B as Meta ran it on 8,192 H100 (no recomputation) is over memory.py's 76 GiB
    usable; without the flag nothing plans, with it the layout is priced, marked '!' and `fits` false in the JSON,
    at exactly what cost.evaluate gives that configuration, and a plan that fits is ranked as before."""
    from par3d.plan.cost import Choice, Options, evaluate
    from par3d.plan.hardware import make_cluster
    from par3d.plan.models import resolve_model

    layout = ["--model", "llama3-405b", "--gpu", "h100", "--gpus", "8192", "--global-batch", "2048", "--tp", "8",
              "--pp", "16", "--cp", "1", "--micro-batch", "1", "--schedule", "interleaved", "--virtual-stages", "8",
              "--recompute", "none", "--zero-stage", "2", "--sequence-parallel"]
    rc, _, err = run(capsys, *layout)
    assert rc == 1 and "does not fit in memory" in err
    rc, out, _ = run(capsys, *layout, "--ignore-memory")
    assert rc == 0 and "!" in out.split("best:")[0] and "--ignore-memory ranks them anyway" in out
    rc, out, _ = run(capsys, *layout, "--ignore-memory", "--json")
    p = json.loads(out)["plans"][0]
    assert rc == 0 and p["fits"] is False and p["memory_gib"]["total"] > 0.95 * 80
    want = evaluate(resolve_model("llama3-405b"), make_cluster("h100-sxm", 8192),
                    Choice(8, 16, 64, 1, 32, "interleaved", 8, "none", 2, True), opts=Options(ignore_memory=True))
    assert p["step_time_s"] == pytest.approx(want.step_time, rel=1e-9)
    rc, _, err = run(capsys, *layout, "--ignore-memory", "--emit-config", "/dev/null")
    assert rc == 2 and "--ignore-memory with --emit-config" in err  # a run is written only for a plan that fits
    small = ["--model", "gpt3-13b", "--gpus", "8", "--global-batch", "16", "--json"]
    rc, a, _ = run(capsys, *small)
    rc2, b, _ = run(capsys, *small, "--ignore-memory")
    fit, anyway = json.loads(a)["plans"][0], json.loads(b)["plans"][0]
    assert rc == rc2 == 0 and fit["fits"]
    if anyway["fits"]:  # the fastest plan fits anyway: the same plan as without the flag
        assert anyway["step_time_s"] == pytest.approx(fit["step_time_s"], rel=1e-9)
    else:  # a faster one does not: ranked first, and marked
        assert anyway["step_time_s"] < fit["step_time_s"]


def test_offload_layers_flag(capsys):
    """--offload-layers N prices Megatron-Core's activation offloading (its own breakdown term, `offload_layers` in
    the JSON's hardware); with --pp > 1, --recompute or N >= layers it is refused before searching."""
    common = ["--model", "llama3-70b", "--gpu", "gb200", "--gpus", "64", "--global-batch", "256", "--dtype", "fp8",
              "--tp", "1", "--cp", "1", "--micro-batch", "2", "--zero-stage", "3", "--ignore-memory"]
    args = [*common, "--pp", "1"]
    rc, out, _ = run(capsys, *args, "--offload-layers", "40", "--json")
    d = json.loads(out)
    assert rc == 0 and d["hardware"]["offload_layers"] == 40 and d["plans"][0]["breakdown_s"]["offload"] > 0
    rc, out, _ = run(capsys, *args, "--json")
    assert rc == 0 and "offload" not in json.loads(out)["plans"][0]["breakdown_s"]
    for argv, what in (([*common, "--pp", "2", "--offload-layers", "40"], "without pipeline"),
                       ([*args, "--recompute", "full", "--offload-layers", "40"], "without recomputation"),
                       ([*args, "--offload-layers", "80"], "<= 79")):
        rc, _, err = run(capsys, *argv)
        assert rc == 2 and what in err, err


def test_emit_config_carries_what_the_runtime_runs(tmp_path, capsys):
    from par3d.commands.plan import runtime_support

    max_zero, has_cp = runtime_support()
    path = tmp_path / "plan.toml"
    rc, out, err = run(capsys, "--model", "gpt3-13b", "--gpus", "8", "--global-batch", "16", "--zero-stage",
                       str(max_zero), "--emit-config", str(path))
    assert rc == 0, err
    cfg = RunConfig.load_toml(str(path)).validate()
    assert cfg.parallel.zero_stage == max_zero
    assert hasattr(cfg.parallel, "cp") == has_cp
    rc, out, err = run(capsys, "--model", "gpt3-13b", "--gpus", "8", "--zero-stage", str(max_zero + 1),
                       "--emit-config", str(path)) if max_zero < 3 else (2, "", "--zero-stage")
    assert rc == 2 and "--zero-stage" in err
    rc, out, err = run(capsys, "--model", "gpt3-1.3b", "--seq-len", "8192", "--gpus", "16", "--cp", "2",
                       "--global-batch", "16", "--emit-config", str(path))
    if has_cp:
        assert rc == 0, err
        cfg = RunConfig.load_toml(str(path)).validate()
        assert cfg.parallel.cp == 2 and cfg.parallel.world_size == 16
    else:
        assert rc == 2 and "--cp" in err


def test_tp_comm_overlap_flag(capsys):
    """--tp-comm-overlap (Megatron-Core's tp_comm_overlap, off by default as there): the JSON's hardware
    says so, TP time falls but stays above zero (the ring's unpaired chunks, the overlap slowdown),
    compute is untouched, and without sequence parallelism (userbuffers need it) nothing changes."""
    base = ["--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "256", "--tp", "4",
            "--pp", "8", "--cp", "1", "--micro-batch", "1", "--schedule", "interleaved", "--virtual-stages", "5",
            "--zero-stage", "1", "--top", "1", "--json"]

    def one(*extra, rec="none"):
        rc, out, _ = run(capsys, *base, "--recompute", rec, *extra)
        assert rc == 0
        d = json.loads(out)
        return d["hardware"], d["plans"][0]

    hw_off, off = one()
    hw_on, on = one("--tp-comm-overlap")
    assert hw_off["tp_comm_overlap"] is False and hw_on["tp_comm_overlap"] is True
    assert on["breakdown_s"]["compute"] == off["breakdown_s"]["compute"]
    assert 0 < on["breakdown_s"]["tp_comm"] < 0.5 * off["breakdown_s"]["tp_comm"]
    assert on["step_time_s"] < off["step_time_s"]
    _, nosp_off = one("--no-sequence-parallel", rec="full")
    _, nosp_on = one("--no-sequence-parallel", "--tp-comm-overlap", rec="full")
    assert nosp_on["step_time_s"] == nosp_off["step_time_s"]


def test_p2p_blocking_flag(capsys):
    """--p2p-blocking (how the framework waits on the pipeline's sends): the JSON's hardware says so; "all" holds
    each sending GPU its hop, so a 1F1B pipeline across nodes is slower and its PP share larger, compute untouched,
    and the plan's makespan is the simulator's with `blocking`; "1f1b" (Megatron-Core with
    overlap_p2p_comm) blocks the 1F1B schedule as "all" does and leaves the interleaved one as "none"."""
    from par3d.pipeline.schedules import build
    from par3d.pipeline.simulate import simulate
    from par3d.plan.cost import Choice, durations_of, simulate_stages, stage_times, zbv_times
    from par3d.plan.hardware import make_cluster
    from par3d.plan.models import CATALOGUE

    base = ["--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "256", "--tp", "4",
            "--pp", "8", "--cp", "1", "--micro-batch", "1", "--zero-stage", "1", "--recompute", "none",
            "--top", "1", "--json"]

    def one(sched, *extra):
        v = ["--virtual-stages", "5"] if sched == "interleaved" else []
        rc, out, _ = run(capsys, *base, "--schedule", sched, *v, *extra)
        assert rc == 0
        d = json.loads(out)
        return d["hardware"], d["plans"][0]

    hw, none_1f1b = one("1f1b")
    assert hw["p2p_blocking"] == "none"
    hw, all_1f1b = one("1f1b", "--p2p-blocking", "all")
    assert hw["p2p_blocking"] == "all"
    assert all_1f1b["step_time_s"] > none_1f1b["step_time_s"]
    assert all_1f1b["breakdown_s"]["pp_comm"] > none_1f1b["breakdown_s"]["pp_comm"]
    assert all_1f1b["breakdown_s"]["compute"] == none_1f1b["breakdown_s"]["compute"]
    assert one("1f1b", "--p2p-blocking", "1f1b")[1]["step_time_s"] == all_1f1b["step_time_s"]
    _, none_il = one("interleaved")
    _, all_il = one("interleaved", "--p2p-blocking", "all")
    assert all_il["step_time_s"] > none_il["step_time_s"]
    assert one("interleaved", "--p2p-blocking", "1f1b")[1]["step_time_s"] == none_il["step_time_s"]
    # the plan's makespan is the simulator's, blocking
    cl = replace(make_cluster("h100-sxm", 64), p2p_blocking="all")
    c = Choice(4, 8, 2, 1, 128, "1f1b", 1, "none", 1, True)
    st = stage_times(CATALOGUE["llama3-70b"], cl, c)
    assert st.blocking and st.transfer > 0
    tl = simulate(build("1f1b", 8, 128, 1, zbv_times(st, c)), 8, 128, 1, durations=durations_of(st, "1f1b"),
                  transfer=st.transfer, blocking=True)
    assert simulate_stages(st, c)[0] == pytest.approx(tl.makespan, rel=1e-12)
    # the text report names it (and says nothing when the sends are posted)
    text = [a for a in base if a != "--json"]
    assert "p2p:" not in run(capsys, *text, "--schedule", "1f1b")[1]
    assert "holds its GPU until delivered (the 1F1B schedule" in run(capsys, *text, "--p2p-blocking", "1f1b")[1]
    # the software line says what the plan assumes, as the flags set it, and what stating it bought the set
    from par3d.plan.evidence import software_evidence

    plain = run(capsys, *text)[1]
    said = next(line for line in plain.splitlines() if line.startswith("software: "))
    assert "pipeline sends posted, gradients reduced in bf16 behind the backward" in said
    told = run(capsys, *text, "--p2p-blocking", "all", "--grad-reduce-in-fp32", "--no-overlap-grad-reduce",
               "--cross-entropy", "fused", "--tp-comm-overlap")[1]
    assert ("pipeline sends blocking, gradients reduced in fp32 after the backward, ZeRO's parameter gathers behind "
            "compute, cross-entropy fused, TP communication overlapped") in told
    u = software_evidence()["software/defaults"]
    assert f"{u['within_10pct']} of {u['rows']} within ±10 %" in plain
    assert json.loads(run(capsys, *base)[1])["software_evidence"] == software_evidence()
    with pytest.raises(SystemExit) as bad:
        run(capsys, *base, "--p2p-blocking", "sometimes")
    assert bad.value.code == 2 and "--p2p-blocking" in capsys.readouterr().err


# pure DP with ZeRO-1 on 64 H100: a plan whose DP tail is a visible part of the step
ZERO1_DP64 = ["--model", "llama2-7b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "128", "--tp", "1",
              "--pp", "1", "--cp", "1", "--micro-batch", "1", "--zero-stage", "1", "--recompute", "none",
              "--top", "1", "--json"]


def plans_with_and_without(capsys, flags: tuple[str, ...], extra: str) -> list[tuple[dict, dict, dict]]:
    """(JSON hardware, best plan, memory) of ZERO1_DP64 + flags, without and with `extra`."""
    runs = []
    for more in ((), (extra,)):
        rc, out, _ = run(capsys, *ZERO1_DP64, *flags, *more)
        assert rc == 0
        d = json.loads(out)
        runs.append((d["hardware"], d["plans"][0], d["memory"]))
    return runs


def test_grad_reduce_in_fp32_flag(capsys):
    """--grad-reduce-in-fp32: the JSON's hardware says so, the DP reduction costs more and the gradients
    held are fp32 (twice the seed's 2 B); compute is untouched."""
    runs = plans_with_and_without(capsys, ("--no-overlap-grad-reduce",), "--grad-reduce-in-fp32")
    assert [m["accounting"] for _, _, m in runs] == ["seed", "megatron"]  # fp32 gradients counted
    (hw16, p16, _), (hw32, p32, _) = runs
    assert hw16["grad_reduce_fp32"] is False and hw32["grad_reduce_fp32"] is True
    assert p32["breakdown_s"]["compute"] == p16["breakdown_s"]["compute"]
    assert p32["breakdown_s"]["dp_comm"] > 1.2 * p16["breakdown_s"]["dp_comm"] > 0
    assert p32["memory_gib"]["grads"] == pytest.approx(2 * p16["memory_gib"]["grads"], rel=1e-3)


def test_overlap_param_gather_flag(capsys):
    """--no-overlap-param-gather: the updated weights' all-gather (ZeRO-1) waits after the optimizer, so
    the DP part of the step grows; the JSON's hardware says which; compute is untouched."""
    (hw_on, on, _), (hw_off, off, _) = plans_with_and_without(capsys, (), "--no-overlap-param-gather")
    assert hw_on["overlap_param_gather"] is True and hw_off["overlap_param_gather"] is False
    assert on["breakdown_s"]["compute"] == off["breakdown_s"]["compute"]
    assert off["breakdown_s"]["dp_comm"] > 2 * on["breakdown_s"]["dp_comm"] > 0


def test_fp8_param_gather_flag(capsys):
    """--fp8-param-gather: with --dtype fp8 the distributed optimizer's weight gather moves 1 B per weight, so
    the unoverlapped gather (and the DP part of the step) shrinks; the JSON's hardware says which; compute is
    untouched; without fp8 the flag is refused, naming it."""
    flags = ("--dtype", "fp8", "--no-overlap-param-gather")
    (hw_off, off, _), (hw_on, on, _) = plans_with_and_without(capsys, flags, "--fp8-param-gather")
    assert hw_off["fp8_param_gather"] is False and hw_on["fp8_param_gather"] is True
    assert on["breakdown_s"]["compute"] == off["breakdown_s"]["compute"]
    assert 0 < on["breakdown_s"]["dp_comm"] < off["breakdown_s"]["dp_comm"]
    rc, _, err = run(capsys, *ZERO1_DP64, "--fp8-param-gather")
    assert rc == 2 and "--fp8-param-gather" in err and "--dtype fp8" in err and "Traceback" not in err


def test_tp_overlap_exposed_bounds():
    """Each collective costs at least what its ring's unpaired chunk and the chunks' lost efficiency add,
    never more than the collective itself plus that loss; no collective, no TP time beyond that loss."""
    from dataclasses import replace

    from par3d.plan.compute import gemm_time, layer_gemms
    from par3d.plan.cost import Choice
    from par3d.plan.hardware import make_cluster
    from par3d.plan.models import CATALOGUE
    from par3d.plan.parallel_comm import TP_OVERLAP_GEMMS, tp_overlap_exposed

    model, cl = CATALOGUE["llama3-70b"], make_cluster("h100-sxm", 64, 8, dtype="fp8")
    c = Choice(4, 8, 2, 1, 128, "interleaved", 5, "none", 1, True, 1)
    gs = {g.name: g for g in layer_gemms(model, 1, 4)}
    loss = sum(4 * gemm_time(replace(gs[n], m=gs[n].m // 4), cl.device, "fp8") - gemm_time(gs[n], cl.device, "fp8")
               for n in TP_OVERLAP_GEMMS)
    assert loss >= 0
    assert tp_overlap_exposed(model, cl, c, 0.0) == pytest.approx(loss)
    for coll in (1e-4, 1e-3, 1e-2):
        exp = tp_overlap_exposed(model, cl, c, coll)
        assert loss <= exp <= 4 * coll + loss + 1e-12
    # a collective far longer than its GEMM is exposed almost whole (the GEMM hides behind it)
    assert tp_overlap_exposed(model, cl, c, 1.0) > 0.9 * 4 * 1.0


def test_tp_overlap_backward_bulk():
    """The backward: QKV and MLP-in each overlap two collectives in bulk beside a whole GEMM (no chunking
    loss), the two row-parallel dgrads keep the ring exchange; so with no collective only those two
    chunk losses remain, and a collective far longer than every GEMM is exposed about six times."""
    from dataclasses import replace

    from par3d.plan.compute import gemm_time, layer_gemms
    from par3d.plan.cost import Choice
    from par3d.plan.hardware import make_cluster
    from par3d.plan.models import CATALOGUE
    from par3d.plan.parallel_comm import overlapped, tp_overlap_exposed

    model, cl = CATALOGUE["llama3-70b"], make_cluster("h100-sxm", 64, 8, dtype="bf16")
    c = Choice(4, 8, 2, 1, 128, "interleaved", 5, "none", 1, True, 1)
    gs = {g.name: g for g in layer_gemms(model, 1, 4)}
    t = {n: gemm_time(g, cl.device, "bf16") for n, g in gs.items()}
    ring_loss = sum(4 * gemm_time(replace(gs[n], m=gs[n].m // 4), cl.device, "bf16") - t[n]
                    for n in ("attn_out", "mlp_out"))
    assert tp_overlap_exposed(model, cl, c, 0.0, forward=False) == pytest.approx(ring_loss)
    coll = 1e-4
    bulk = sum(2 * (overlapped(t[n], coll, cl.device.sigma) - t[n]) for n in ("qkv", "mlp_in"))
    back = tp_overlap_exposed(model, cl, c, coll, forward=False)
    assert bulk > 0 and ring_loss + bulk <= back <= ring_loss + bulk + 2 * coll + 1e-12
    assert back < tp_overlap_exposed(model, cl, c, coll)  # no chunking of the column-parallel GEMMs
    assert 5.4 < tp_overlap_exposed(model, cl, c, 1.0, forward=False) < 6.6


OPTIMIZER_BASE = ["--model", "gpt3-1.3b", "--gpus", "8", "--tp", "1", "--pp", "1", "--zero-stage", "1", "--json"]


def plan_json(capsys, *flags: str) -> tuple[dict, float]:
    """`par3d plan` of OPTIMIZER_BASE with `flags`: its JSON and the best plan's optimizer-state GiB."""
    rc, out, _ = run(capsys, *OPTIMIZER_BASE, *flags)
    assert rc == 0
    d = json.loads(out)
    return d, d["plans"][0]["memory_gib"]["optimizer"]


def test_optimizer_dtype_flag(capsys):
    (a, oa), (b, ob) = plan_json(capsys), plan_json(capsys, "--optimizer-dtype", "bf16")
    assert a["memory"]["optimizer_dtype"] == "fp32" and b["memory"]["optimizer_dtype"] == "bf16"
    assert ob == pytest.approx(oa / 2, rel=1e-2)
    c, oc = plan_json(capsys, "--optimizer-dtype", "bf16-moments")  # Megatron's precision-aware optimizer
    assert c["memory"]["optimizer_dtype"] == "bf16-moments" and oc == pytest.approx(oa * 8 / 12, rel=1e-2)


def test_optimizer_muon_flag(capsys):
    """--optimizer muon: the JSON's hardware says so, the optimizer state drops from Adam's 12 B to 8 B per matrix
    parameter and the optimizer step grows by its Newton-Schulz work; a state dtype of Adam's and --emit-config
    (par3d train steps Adam) are refused by name."""
    (a, oa), (b, ob) = plan_json(capsys), plan_json(capsys, "--optimizer", "muon")
    assert a["hardware"]["optimizer"] == "adam" and b["hardware"]["optimizer"] == "muon"
    assert oa * 8 / 12 < ob < oa  # the tied embedding's share stays at 12 B
    assert b["plans"][0]["breakdown_s"]["optimizer"] > a["plans"][0]["breakdown_s"]["optimizer"]
    base = OPTIMIZER_BASE
    rc3, _, err = run(capsys, *base, "--optimizer", "muon", "--optimizer-dtype", "bf16")
    assert rc3 == 2 and "--optimizer-dtype bf16 with --optimizer muon" in err
    rc4, _, err = run(capsys, *base[:-1], "--optimizer", "muon", "--emit-config", "x.toml")
    assert rc4 == 2 and "--emit-config with --optimizer muon" in err


def test_offload_optimizer(capsys):
    """--offload-optimizer F (issue 12's thirty-sixth round; Megatron-Core's --optimizer-cpu-offload with
    --optimizer-offload-fraction, DeepSpeed's offload_optimizer): F of each rank's optimizer states leave GPU memory;
    the step copies F of the fp32 gradients down and the weights up over the host link and runs Adam on the host's
    DRAM (hardware.HOST_MEM, line rate, shared by the GPUs behind it), pipelined: the slowest of the three.  With
    nothing fitting, the fix names it where it makes a plan fit; GPUs without a host figure and Muon are refused."""
    from par3d.plan.cost import Choice, evaluate
    from par3d.plan.dp_tail import HOST_ADAM_BYTES, OFFLOAD_COPY_BYTES, offloaded_step_seconds, optimizer_time
    from par3d.plan.hardware import HOST_MEM, NVLINK4_EFF, make_cluster
    from par3d.plan.models import resolve_model

    model = resolve_model("llama3-70b")
    cl = make_cluster("h100-sxm", 16)
    c = Choice(8, 1, 2, 1, 64, zero_stage=1, sequence_parallel=True, recompute="full")
    base, half, whole = (evaluate(model, replace(cl, offload_optimizer=f), c) for f in (0.0, 0.5, 1.0))
    assert half.memory.optimizer == pytest.approx(base.memory.optimizer / 2) and whole.memory.optimizer == 0
    assert whole.memory.weights == base.memory.weights and whole.memory.activations == base.memory.activations
    p = 70e9  # the busiest rank's updated parameters, about 70.6B / (TP 8 x ZeRO 2)
    bw, sharing = HOST_MEM["h100-sxm"]
    assert (bw, sharing) == (614.4, 8)  # DGX H100: 2 x 8 channels of DDR5-4800
    t = offloaded_step_seconds(cl, p)
    assert t == pytest.approx(max(cl.host.alpha + OFFLOAD_COPY_BYTES * p / (cl.host.beta * NVLINK4_EFF),
                                  HOST_ADAM_BYTES * p / (bw * 1e9 / sharing)))
    assert optimizer_time(model, replace(cl, offload_optimizer=1.0), c) > 10 * optimizer_time(model, cl, c)
    assert whole.step_time > half.step_time > base.step_time
    args = ["--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "64"]
    rc, out, err = run(capsys, *args)
    assert rc == 1 and "fix: --offload-optimizer 1: with the optimizer states in host memory" in out + err
    rc, out, _ = run(capsys, *args, "--offload-optimizer", "1", "--json", "--top", "1")
    plan = json.loads(out)
    assert rc == 0 and plan["hardware"]["offload_optimizer"] == 1.0
    assert plan["plans"][0]["memory_gib"]["optimizer"] == 0
    rc, _, err = run(capsys, *args, "--gpu", "mi300x", "--offload-optimizer", "1")
    assert rc == 2 and "no figure for its host's memory bandwidth" in err
    rc, _, err = run(capsys, *args, "--offload-optimizer", "1", "--optimizer", "muon")
    assert rc == 2 and "steps Adam" in err


def test_explain_accounting_counts_the_models_own_layer(capsys):
    """--explain's per-layer accounting (seed §4.2, §4.4) counts the layer the plan prices: for the seed's GPT its
    24·T·h²/tp, for GQA, a gated MLP or routed experts their own GEMM FLOPs (compute.layer_flops) beside the seed's
    count, and the roofline of the GEMM that runs first in the MLP -- gate and up for SwiGLU, one routed expert's
    for a mixture of experts."""
    from par3d.plan import compute
    from par3d.plan.models import resolve_model

    rc, out, _ = run(capsys, "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "256",
                     "--tp", "8", "--pp", "2", "--cp", "1", "--micro-batch", "1", "--explain")
    flops = compute.layer_flops(resolve_model("llama3-70b"), 1, 8)[0]
    assert rc == 0 and f"GEMM FLOPs of its projections and MLP = {flops / 1e9:.0f} GFLOP/GPU" in out
    assert "the seed's 24·T·h²/tp, for MHA and a 4h MLP" in out
    assert "roofline of the MLP's first GEMM (gate and up) M=8192 K=8192 N=7168" in out
    rc, out, _ = run(capsys, "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64",
                     "--seq-len", "4096", "--tp", "1", "--pp", "2", "--ep", "8", "--micro-batch", "1", "--explain")
    assert rc == 0 and "GEMM FLOPs of its projections and routed experts" in out
    # 4096 tokens x top-2 x ep 8 over 8 experts: 8192 rows for each of this rank's one expert, fc1 2 x 14336 wide
    assert "roofline of one routed expert's first GEMM (1 expert on this rank, one grouped GEMM) M=8192" in out


def test_fp8_current_scaling_flag(capsys):
    """--fp8-scaling current (Transformer Engine's Float8CurrentScaling): the JSON says so; the layers'
    elementwise traffic grows by one read of each cast input except the MLP activation, and with SP each
    layer adds four amax all-reduces over TP; delayed (the default) and bf16 runs are untouched."""
    from par3d.plan.compute import elementwise_bytes
    from par3d.plan.models import CATALOGUE

    base = ["--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "256", "--tp", "4",
            "--pp", "8", "--cp", "1", "--micro-batch", "1", "--schedule", "interleaved", "--virtual-stages", "5",
            "--zero-stage", "1", "--recompute", "none", "--top", "1", "--json"]

    def one(*extra):
        rc, out, _ = run(capsys, *base, *extra)
        assert rc == 0
        d = json.loads(out)
        return d["hardware"], d["plans"][0]

    hw_d, delayed = one("--dtype", "fp8")
    hw_c, current = one("--dtype", "fp8", "--fp8-scaling", "current")
    assert hw_d["fp8_scaling"] == "delayed" and hw_c["fp8_scaling"] == "current"
    assert current["breakdown_s"]["compute"] > delayed["breakdown_s"]["compute"]
    assert current["breakdown_s"]["tp_comm"] > delayed["breakdown_s"]["tp_comm"]
    _, bf = one()
    _, bf_c = one("--fp8-scaling", "current")
    assert bf_c["step_time_s"] == bf["step_time_s"]  # only fp8 has a scaling recipe
    m = CATALOGUE["llama3-70b"]
    tok, h, t = m.seq_len, m.hidden, 4
    extra = elementwise_bytes(m, 1, t, True, "fp8", True) - elementwise_bytes(m, 1, t, True, "fp8")
    assert extra == pytest.approx(2 * tok * (2 * h / t + h / t))


def test_fp8_mxfp8_scaling_flag(capsys):
    """--fp8-scaling mxfp8 (Transformer Engine's MXFP8BlockScaling, issue 12's twenty-second round): Blackwell only
    (a clear error elsewhere, before any search; a validation row says the same); each cast writes a 1 B scale per
    32 elements of its two copies and needs no amax pass nor TP amax all-reduce; its block-scaled GEMMs run 1.75x
    the BF16 ones (Transformer Engine's measured B300 kernels: gemm_table.MXFP8_OVER_BF16), below the tensor-scaled
    FP8 rate, so its step is slower than delayed scaling's."""
    from par3d.plan import gemm_table, validation
    from par3d.plan.compute import Gemm, elementwise_bytes, gemm_time
    from par3d.plan.hardware import DEVICES
    from par3d.plan.models import CATALOGUE

    base = ["--model", "llama3-70b", "--gpu", "gb200", "--gpus", "64", "--global-batch", "256", "--tp", "4",
            "--pp", "4", "--cp", "1", "--micro-batch", "1", "--schedule", "1f1b", "--zero-stage", "1",
            "--recompute", "none", "--dtype", "fp8", "--top", "1", "--json"]
    steps = {}
    for scaling in ("delayed", "mxfp8", "current"):
        rc, out, _ = run(capsys, *base, "--fp8-scaling", scaling)
        assert rc == 0
        d = json.loads(out)
        assert d["hardware"]["fp8_scaling"] == scaling
        steps[scaling] = d["plans"][0]["step_time_s"]
    assert steps["delayed"] < steps["mxfp8"]
    dev = DEVICES["gb200"]
    big = Gemm("mlp_in", 16384, 8192, 28672)
    assert gemm_time(big, dev, "bf16") / gemm_time(big, dev, "mxfp8") == pytest.approx(
        gemm_table.MXFP8_OVER_BF16, rel=0.01) and gemm_time(big, dev, "mxfp8") > gemm_time(big, dev, "fp8")
    assert "mxfp8" not in DEVICES["h100-sxm"].peak_flops
    m = CATALOGUE["llama3-70b"]
    tok, h, t = m.seq_len, m.hidden, 4
    extra = (elementwise_bytes(m, 1, t, True, "fp8", fp8_block="mxfp8")
             - elementwise_bytes(m, 1, t, True, "fp8"))
    assert extra == pytest.approx(tok * (2 * h / t + h / t + m.ffn / t) * 2 / 32)
    rc, _, err = run(capsys, *[a if a != "gb200" else "h100-sxm" for a in base], "--fp8-scaling", "mxfp8")
    assert rc != 0 and "--fp8-scaling mxfp8" in err and "Blackwell" in err and "h100-sxm" in err
    row = next(r for r in validation.rows() if r["gpu"] == "h100-sxm" and r.get("dtype") == "fp8")
    with pytest.raises(ValueError, match="needs Blackwell"):
        validation.cluster_of(dict(row, fp8_scaling="mxfp8"))


def test_nvfp4_precision(capsys):
    """--dtype nvfp4 (Transformer Engine's NVFP4BlockScaling, issue 12's twenty-seventh round): Blackwell only (a clear
    error elsewhere, before any search; a validation row says the same), held as FP8 training with the nvfp4 recipe
    (the JSON says both); the layers' GEMMs run NVFP4_OVER_BF16 (3.42x) the BF16 ones at each GPU's FP4 peak, faster
    than MXFP8's and tensor-scaled FP8's; the casts cost NVFP4_CAST_OVER_MXFP8 times MXFP8's traffic; the saved GEMM
    inputs are 0.5625 B copies (less memory than fp8's 1 B); fp4 weight gathers move 0.5625 B a weight; the plan quotes
    the gpu/nvfp4 evidence; --fp8-scaling other than nvfp4 beside it is refused."""
    from par3d.plan import calibration, gemm_table, parallel_comm, validation
    from par3d.plan.compute import Gemm, elementwise_bytes, gemm_time
    from par3d.plan.hardware import DEVICES, make_cluster
    from par3d.plan.memory import layer_activation_bytes
    from par3d.plan.models import CATALOGUE

    base = ["--model", "llama3-70b", "--gpu", "gb200", "--gpus", "64", "--global-batch", "256", "--tp", "2",
            "--pp", "4", "--cp", "1", "--micro-batch", "1", "--virtual-stages", "5", "--zero-stage", "1",
            "--recompute", "none", "--top", "1", "--json"]
    steps, tp_comm = {}, {}
    for flags in (("--dtype", "fp8", "--fp8-scaling", "mxfp8"), ("--dtype", "nvfp4")):
        rc, out, _ = run(capsys, *base, *flags)
        assert rc == 0
        d = json.loads(out)
        steps[flags[-1]] = d["plans"][0]["step_time_s"]
        tp_comm[flags[-1]] = d["plans"][0]["breakdown_s"]["tp_comm"]
    # sequence parallelism's all-gathers move the NVFP4 copies (0.5625 B) against MXFP8's (1 + 1/32 B), the
    # reduce-scatters bf16 in both
    assert tp_comm["nvfp4"] / tp_comm["mxfp8"] == pytest.approx((2 + 0.5625) / (2 + 1 + 1 / 32), rel=0.05)
    assert d["hardware"]["dtype"] == "fp8" and d["hardware"]["fp8_scaling"] == "nvfp4"
    assert d["hardware"]["precision"] == "nvfp4"
    assert steps["nvfp4"] < steps["mxfp8"]
    for g in ("b200", "gb200", "b300", "gb300"):
        dev = DEVICES[g]
        big = Gemm("mlp_in", 16384, 8192, 28672)
        assert gemm_time(big, dev, "bf16") / gemm_time(big, dev, "nvfp4") == pytest.approx(
            gemm_table.NVFP4_OVER_BF16, rel=0.01)
        assert gemm_time(big, dev, "nvfp4") < gemm_time(big, dev, "fp8")
        assert dev.peak_flops["nvfp4"] == gemm_table.FP4_PEAK[g] * 1e12
    assert "nvfp4" not in DEVICES["h100-sxm"].peak_flops
    m = CATALOGUE["llama3-70b"]
    tok, h, t = m.seq_len, m.hidden, 2
    casts = tok * (2 * h / t + h / t + m.ffn / t)  # the cast elements of one layer's forward, SP on
    mx = elementwise_bytes(m, 1, t, True, "fp8", fp8_block="mxfp8")
    nv = elementwise_bytes(m, 1, t, True, "fp8", fp8_block="nvfp4")
    assert nv - mx == pytest.approx(casts * (4 + 2 / 32) * (gemm_table.NVFP4_CAST_OVER_MXFP8 - 1))
    assert (layer_activation_bytes(m, 1, t, True, "none", "nvfp4")
            < layer_activation_bytes(m, 1, t, True, "none", "fp8"))
    nvc = replace(make_cluster("gb200", 64, dtype="fp8"), fp8_scaling="nvfp4", fp8_param_gather=True)
    assert parallel_comm.weight_bytes(nvc) == pytest.approx(0.5625) and nvc.precision == "nvfp4"
    assert parallel_comm.weight_bytes(replace(nvc, fp8_scaling="current")) == 1.0
    rc, out, _ = run(capsys, *[a for a in base if a != "--json"], "--dtype", "nvfp4")
    assert rc == 0 and "nvfp4 peak" in out and "gb200 nvfp4" in out
    rc, _, err = run(capsys, *[a if a != "gb200" else "h100-sxm" for a in base], "--dtype", "nvfp4")
    assert rc != 0 and "--dtype nvfp4" in err and "Blackwell" in err and "h100-sxm" in err
    # a GPU without fp8 tensor cores at all: the error names the value typed, not the fp8 it is priced as
    rc, _, err = run(capsys, *[a if a != "gb200" else "a100-80gb" for a in base], "--dtype", "nvfp4")
    assert rc != 0 and "--dtype nvfp4: a100-80gb has no nvfp4 tensor cores" in err and "--gpu b200" in err
    rc, _, err = run(capsys, *base, "--dtype", "nvfp4", "--fp8-scaling", "current")
    assert rc != 0 and "--dtype nvfp4 with --fp8-scaling current" in err
    row = next(r for r in validation.rows() if str(r["name"]).startswith(calibration.MBRIDGE_NVFP4_PREFIX))
    assert calibration.in_sample(row) and validation.cluster_of(row).fp8_scaling == "nvfp4"
    with pytest.raises(ValueError, match="needs Blackwell"):
        validation.cluster_of(dict(row, gpu="h100-sxm"))


def test_fp8_quantized_sequence_parallel_gathers():
    """Transformer Engine gathers a sequence-parallel GEMM input (and the row-parallel output gradients) as its quantized
    copy (issue 12's twenty-eighth round, parallel_comm.GATHERED_INPUT_BYTES): under FP8 a TP pair's all-gather moves 1 B an
    element, MXFP8's 1 + 1/32, while the reduce-scatter stays bf16; bf16 training and collectives that feed no GEMM
    are unchanged; under userbuffers overlap the smaller gathers expose no more than bf16-sized ones."""
    from dataclasses import replace

    from par3d.plan.cost import Choice
    from par3d.plan.hardware import make_cluster
    from par3d.plan.models import CATALOGUE
    from par3d.plan.parallel_comm import GATHERED_INPUT_BYTES, links, tp_collective, tp_overlap_exposed

    c = Choice(tp=8, pp=1, dp=1, micro_batch=1, microbatches=1, schedule="1f1b", virtual_stages=1,
               recompute="none", zero_stage=1, sequence_parallel=True)
    nbytes = 2**30  # large enough that the collectives' latency is a rounding error
    bf16 = make_cluster("h100-sxm", 8, dtype="bf16")
    fp8 = make_cluster("h100-sxm", 8, dtype="fp8")
    mx = replace(make_cluster("b200", 8, dtype="fp8"), fp8_scaling="mxfp8")
    mx_bf16 = make_cluster("b200", 8, dtype="bf16")
    assert GATHERED_INPUT_BYTES == {"fp8": 1.0, "mxfp8": 1.0 + 1 / 32, "nvfp4": 0.5 + 1 / 16}
    pair = tp_collective(bf16, c, nbytes, links(bf16, c).tp)
    assert tp_collective(bf16, c, nbytes, links(bf16, c).tp, gemm_input=True) == pair
    assert tp_collective(fp8, c, nbytes, links(fp8, c).tp) == pytest.approx(pair)  # not a GEMM input: bf16 bytes
    assert tp_collective(fp8, c, nbytes, links(fp8, c).tp, gemm_input=True) == pytest.approx(0.75 * pair, rel=0.01)
    mx_pair = tp_collective(mx_bf16, c, nbytes, links(mx_bf16, c).tp)
    assert (tp_collective(mx, c, nbytes, links(mx, c).tp, gemm_input=True)
            == pytest.approx((2 + 1 + 1 / 32) / 4 * mx_pair, rel=0.01))
    model = CATALOGUE["llama3-70b"]
    coll = tp_collective(fp8, c, 8 * 8192 * 8192 * 2, links(fp8, c).tp) / 2
    for forward in (True, False):
        same = tp_overlap_exposed(model, fp8, c, coll, forward=forward)
        assert tp_overlap_exposed(model, fp8, c, coll, forward=forward, gather=coll) == same
        assert tp_overlap_exposed(model, fp8, c, coll, forward=forward, gather=coll / 2) < same


def test_fp8_attention_flag(capsys):
    """--fp8-attention (Transformer Engine's fp8_dot_product_attention, issue 12's twenty-seventh round): the attention
    kernel at cuDNN's measured FP8/BF16 speed-up of its generation (the sdpa benchmark's files, both precisions in one
    file), at each length; only in FP8 training and on Blackwell's cuDNN kernels, refused otherwise before any search;
    the JSON says it."""
    from par3d.plan.hardware import FP8_ATTN_SPEEDUP, make_cluster

    base = ["--model", "llama3-8b", "--gpu", "b200", "--gpus", "8", "--global-batch", "16", "--tp", "1", "--pp", "1",
            "--cp", "1", "--micro-batch", "2", "--zero-stage", "1", "--recompute", "none", "--dtype", "nvfp4", "--top",
            "1", "--json"]
    steps = {}
    for flag in ("--no-fp8-attention", "--fp8-attention"):
        rc, out, _ = run(capsys, *base, flag)
        assert rc == 0
        d = json.loads(out)
        steps[flag] = d["plans"][0]["step_time_s"]
        assert d["hardware"]["fp8_attention"] is (flag == "--fp8-attention")
    assert steps["--fp8-attention"] < steps["--no-fp8-attention"]
    for gpu, kernel in (("b200", "cudnn9.13"), ("gb300", "cudnn9.13"), ("gb200", "cudnn9.17")):
        plain = make_cluster(gpu, 8, dtype="fp8", attention_kernel=kernel).device
        fast = make_cluster(gpu, 8, dtype="fp8", attention_kernel=kernel, fp8_attention=True).device
        for seq in (2048, 8192, 32768):
            speedup = dict(FP8_ATTN_SPEEDUP[kernel][gpu])[seq]
            assert fast.attn_share(seq) == pytest.approx(plain.attn_share(seq) * speedup, rel=1e-3)
    # the generations differ: 9.13's B200 file 1.22x at 8K, 9.17's GB200 file 1.08x
    assert dict(FP8_ATTN_SPEEDUP["cudnn9.13"]["b200"])[8192] > 1.2 > dict(FP8_ATTN_SPEEDUP["cudnn9.17"]["b200"])[8192]
    for bad, words in (([a if a != "nvfp4" else "bf16" for a in base], "only in FP8 training"),
                       ([{"b200": "h100", "nvfp4": "fp8"}.get(a, a) for a in base],
                        "cuDNN's fused attention"),
                       (base + ["--attention-kernel", "fa2"], "cuDNN's fused attention")):
        rc, _, err = run(capsys, *bad, "--fp8-attention")
        assert rc != 0 and words in err, err


def test_cross_entropy_flag_prices_the_loss_kernels(capsys):
    """--cross-entropy: the loss's HBM traffic per logit by the implementation that runs it (compute.LOSS_BYTES:
    Megatron-Core's unfused VocabParallelCrossEntropy, its native fusion, one fused kernel pair).  The JSON says
    which; only the last pipeline stage's head changes, by the bytes' difference over the HBM rate; a model with
    a large vocabulary on a small hidden size (the 1.7B GPT of Megatron-LM's README) feels it most."""
    from par3d.plan.compute import CROSS_ENTROPY, LOSS_BYTES, layer_times
    from par3d.plan.hardware import make_cluster
    from par3d.plan.memory import LOGIT_MEMORY
    from par3d.plan.models import ModelSpec

    base = ["--layers", "24", "--hidden", "2048", "--heads", "16", "--vocab", "131072", "--seq-len", "4096",
            "--no-tied-embeddings", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "32", "--tp", "1",
            "--pp", "1", "--cp", "1", "--micro-batch", "4", "--zero-stage", "1", "--recompute", "none", "--top", "1",
            "--json"]
    assert set(LOGIT_MEMORY) == set(CROSS_ENTROPY) == {"unfused", "fused", "kernel", "gathered"}  # one set of names
    steps, acts = {}, {}
    for ce in ("unfused", "fused", "kernel"):
        rc, out, _ = run(capsys, *base, *(("--cross-entropy", ce) if ce != "unfused" else ()))
        assert rc == 0
        d = json.loads(out)
        assert d["hardware"]["cross_entropy"] == ce
        steps[ce] = d["plans"][0]["breakdown_s"]["compute"]
        acts[ce] = d["plans"][0]["memory_gib"]["activations"]
    assert steps["unfused"] > steps["fused"] > steps["kernel"]
    # memory: the unfused and native-fused losses hold an fp32 copy of the logits (2 + 4 B each), one fused
    # kernel only the bf16 logits it writes the gradient into (2 B; memory.LOGIT_MEMORY)
    assert acts["unfused"] == acts["fused"]
    assert acts["unfused"] - acts["kernel"] == pytest.approx(4 * 4 * 4096 * 131072 / 2**30, rel=1e-3)
    dev = make_cluster("h100-sxm", 8).device
    m = ModelSpec("gpt-1.7b", layers=24, hidden=2048, heads=16, vocab=131072, seq_len=4096, tied=False)
    heads = {ce: layer_times(m, dev, "bf16", 4, 1, False, True, False, ce).head_fwd for ce in LOSS_BYTES}
    logits = 4 * 4096 * 131072
    for ce in ("fused", "kernel"):  # the head's forward carries a third of the loss's bytes (backward = 2x)
        assert heads["unfused"] - heads[ce] == pytest.approx(
            (LOSS_BYTES["unfused"] - LOSS_BYTES[ce]) / 3 * logits / (dev.mem_bw * dev.mem_eff), rel=1e-9)
    # --explain names the implementation and prints the loss's time from its bytes
    import re

    rc, out, _ = run(capsys, *[a for a in base if a != "--json"], "--cross-entropy", "fused", "--explain")
    m = re.search(r"loss \(last stage; --cross-entropy fused\): 28 B per logit x T·V/tp = (\d+)M logits -> "
                  r"([0-9.]+) ms per micro-batch", out)
    assert rc == 0 and m, out
    assert int(m[1]) == round(logits / 1e6)
    assert float(m[2]) == pytest.approx(28 * logits / (dev.mem_bw * dev.mem_eff) * 1e3, abs=0.01)
    with pytest.raises(SystemExit):
        run(capsys, *base, "--cross-entropy", "liger")
    assert "argument --cross-entropy: invalid choice: 'liger'" in capsys.readouterr().err


def test_tp_overlap_pipeline_method():
    """TE's pipeline overlap of a forward reduce-scatter (num_sm SMs for the communication, the GEMM in
    num_splits chunks on the rest, the last chunk's reduce-scatter exposed): the forward's TP time is the
    ring's for the other GEMMs plus chunk + (k-1)·max(chunk, rs) + rs − gemm for the listed one; the
    backward does not depend on the list (test_tp_overlap_backward_bulk)."""
    from dataclasses import replace

    from par3d.plan.compute import gemm_time, layer_gemms
    from par3d.plan.cost import Choice
    from par3d.plan.hardware import make_cluster
    from par3d.plan.models import CATALOGUE
    from par3d.plan.parallel_comm import tp_overlap_exposed

    model = CATALOGUE["llama3-70b"]
    ring = replace(make_cluster("h100-sxm", 64, 8, dtype="fp8"), tp_comm_overlap=True)
    pipe = replace(ring, tp_overlap_pipeline=(("attn_out", 24, 4),))
    c = Choice(4, 8, 2, 1, 128, "interleaved", 5, "none", 1, True)
    coll = 1e-3
    g = {x.name: x for x in layer_gemms(model, 1, 4)}["attn_out"]
    dev = ring.device
    whole = gemm_time(g, dev, "fp8")
    ring_one = gemm_time(replace(g, m=g.m // 4), dev, "fp8")
    ring_one = ring_one + 3 * (max(ring_one, coll / 3) + dev.sigma * min(ring_one, coll / 3)) - whole
    chunk = gemm_time(replace(g, m=g.m // 4), dev, "fp8") * dev.sms / (dev.sms - 24)
    pipe_one = chunk + 3 * max(chunk, coll / 4) + coll / 4 - whole
    f_ring, f_pipe = tp_overlap_exposed(model, ring, c, coll), tp_overlap_exposed(model, pipe, c, coll)
    assert f_pipe - f_ring == pytest.approx(pipe_one - ring_one)
    assert pipe_one > 0 and ring_one > 0
    assert tp_overlap_exposed(model, pipe, c, coll, forward=False) == pytest.approx(
        tp_overlap_exposed(model, ring, c, coll, forward=False))


def test_gb200_plans_part_of_an_nvl72_domain(capsys):
    """--gpu gb200: 72 GPUs share NVLink (the NVL72 rack); 256 GPUs are 3 racks and part of a fourth, which
    the whole-node rule for 8-GPU nodes does not refuse; an explicit --gpus-per-node keeps the rule."""
    rc, out, _ = run(capsys, "--model", "llama3-70b", "--gpu", "gb200", "--gpus", "256", "--global-batch", "256",
                     "--dtype", "fp8", "--top", "1", "--json")
    assert rc == 0
    d = json.loads(out)
    assert d["plans"] and d["plans"][0]["fits"]
    rc, _, err = run(capsys, "--model", "llama3-70b", "--gpu", "gb200", "--gpus", "100", "--gpus-per-node", "8",
                     "--global-batch", "256")
    assert rc != 0 and "--gpus-per-node 8" in err


def test_head_dim_flag(capsys, tmp_path):
    """--head-dim describes heads wider than hidden / heads (Qwen3-32B) from flags alone; the JSON says the
    width; par3d train cannot run such heads, so --emit-config refuses them before anything is written."""
    qwen3 = ["--layers", "64", "--hidden", "5120", "--heads", "64", "--kv-heads", "8", "--head-dim", "128",
             "--ffn-hidden", "25600", "--gated-mlp", "--norm", "rms", "--vocab", "151936", "--seq-len", "4096",
             "--gpu", "h100", "--gpus", "64", "--global-batch", "128"]
    rc, out, err = run(capsys, *qwen3, "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["model"]["head_dim"] == 128 and d["model"]["params"] == pytest.approx(32.8e9, rel=0.005)
    rc, out, err = run(capsys, *qwen3[:8], *qwen3[10:], "--json")  # without it: 80-channel heads, fewer FLOPs
    assert rc == 0, err
    narrow = json.loads(out)
    assert narrow["model"]["head_dim"] == 80 and narrow["plans"][0]["step_time_s"] < d["plans"][0]["step_time_s"]
    cfg = tmp_path / "run.toml"
    rc, out, err = run(capsys, *qwen3, "--emit-config", str(cfg))
    assert rc == 2 and "--emit-config with head_dim 128" in err and not cfg.exists()


def test_config_json_sequence_length_is_named(capsys, tmp_path):
    """Planned from a config.json without --seq-len, the report says where the sequence length came from."""
    cfg = {"model_type": "llama", "num_hidden_layers": 16, "hidden_size": 2048, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
           "max_position_embeddings": 8192, "hidden_act": "silu"}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    rc, out, err = run(capsys, "--model", str(p), "--gpus", "8", "--global-batch", "16")
    assert rc == 0, err
    assert "x 8192 tokens per step (config.json's max_position_embeddings" in out
    rc, out, err = run(capsys, "--model", str(p), "--seq-len", "2048", "--gpus", "8", "--global-batch", "16")
    assert rc == 0 and "x 2048 tokens per step\n" in out


def test_schedules_keeps_the_search_to_a_frameworks_schedules(capsys):
    """`--schedules` restricts the search to the pipeline schedules the target framework has: with the paper's
    2021 software the unrestricted top ten hold DualPipe-V, which Megatron-LM then lacked (it and ZB-H1 led it
    until issue 12's sixty-third round priced a split backward's weight half as its weight-gradient GEMMs alone;
    ZB-H1 left the ten in the sixty-sixth, when its deferred BWs came to keep the GEMMs' inputs that full
    recomputation recomputes); restricted to 1f1b and interleaved none does, the rejections say why, and the best
    plan is interleaved."""
    base = ["--model", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "1024", "--global-batch", "1536",
            "--no-flash-attention", "--recompute", "full", "--no-sequence-parallel", "--no-overlap-grad-reduce",
            "--zero-stage", "0", "--top", "10", "--json"]
    rc, out, _ = run(capsys, *base)
    free = json.loads(out)["plans"]
    assert rc == 0 and "dualpipe-v" in {p["schedule"] for p in free}
    rc, out, _ = run(capsys, *base, "--schedules", "1f1b,interleaved")
    kept = json.loads(out)["plans"]
    assert rc == 0 and kept and all(p["schedule"] in ("1f1b", "interleaved") for p in kept)
    assert kept[0]["schedule"] == "interleaved" and kept[0] in free
    assert free[0]["step_time_s"] <= kept[0]["step_time_s"]
    rc, out, _ = run(capsys, *base[:-1], "--schedules", "1f1b", "--top", "3")  # DeepSpeed's pipeline: 1F1B only
    assert rc == 0 and "schedule not in --schedules" in out
    with pytest.raises(SystemExit):
        main(["plan", *base, "--schedules", "1f1b,chimera"])
    assert "schedules are gpipe, 1f1b, interleaved" in capsys.readouterr().err
    rc, _, err = run(capsys, *base, "--schedule", "zb-h1", "--schedules", "1f1b,interleaved")
    assert rc != 0 and "--schedule zb-h1: not among --schedules 1f1b,interleaved" in err
    # nothing fits for want of a schedule: the fix names one outside the list that gives a plan
    rc, _, err = run(capsys, "--model", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "64", "--global-batch", "6",
                     "--pp", "8", "--schedules", "interleaved")
    assert rc == 1 and "to --schedules (now interleaved): then tp=8 pp=8" in err


def test_amd_gpu_plans_and_explains_its_mesh(capsys):
    """`--gpu mi300x`: a plan, its evidence line (no published MI300X run is in the set), and --explain's TP
    accounting on the Infinity Fabric mesh (TP 2 uses one of each GPU's seven links)."""
    rc, out, err = run(capsys, "--model", "llama3-70b", "--gpu", "mi300x", "--gpus", "64", "--global-batch", "128",
                       "--tp", "2", "--explain", "--top", "1")
    assert rc == 0, err
    assert "on the Infinity Fabric mesh tp 2 uses 1 of each GPU's 7 links, 64 of 448 GB/s" in out
    assert "no published run of mi300x bf16 is in the validation set" in out
    rc, out, err = run(capsys, "--model", "llama3-8b", "--gpu", "mi355x", "--gpus", "8", "--global-batch", "32",
                       "--dtype", "fp8", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["hardware"]["intra"]["name"] == "xgmi4" and d["plans"] and d["evidence"]["rows"] >= 1


def test_progress_goes_to_stderr_and_leaves_stdout_json(capsys):
    # --progress draws its bar on stderr and wipes it; the JSON on stdout is untouched (and no bar when not asked
    # for: capsys's stderr is not a terminal)
    code, out, err = run(capsys, "--model", "gpt3-1.3b", "--gpu", "a100-80gb", "--gpus", "16",
                         "--global-batch", "64", "--json", "--progress")
    assert code == 0 and json.loads(out)["plans"]
    assert "layouts" in err and "pricing the finalists" in err and err.endswith("\r\x1b[K")
    code, out, err = run(capsys, "--model", "gpt3-1.3b", "--gpu", "a100-80gb", "--gpus", "16",
                         "--global-batch", "64", "--json")
    assert code == 0 and "layouts" not in err


def test_qk_norm_flag(capsys):
    """--qk-norm / --no-qk-norm (issue 12's thirty-fifth round): a catalogue Qwen3 entry prices its Q/K norms, the flag
    turns them off (a faster step, the layout unchanged) or onto another model; --help says what the flag does."""
    base = ["--model", "qwen3-30b-a3b", "--gpu", "b200", "--gpus", "8", "--global-batch", "64", "--tp", "1",
            "--pp", "1", "--ep", "8", "--micro-batch", "1", "--json"]
    steps = {}
    for flag in ("--qk-norm", "--no-qk-norm"):
        rc, out, err = run(capsys, *base, flag)
        assert rc == 0, err
        plan = json.loads(out)["plans"][0]
        steps[flag] = plan["step_time_s"]
    rc, out, _ = run(capsys, *base)
    assert rc == 0 and json.loads(out)["plans"][0]["step_time_s"] == steps["--qk-norm"]  # the catalogue's default
    assert json.loads(out)["model"]["qk_norm"] is True
    rc, out, _ = run(capsys, *[a for a in base if a != "--json"])
    assert rc == 0 and "Q/K norms" in out.splitlines()[0]
    assert steps["--qk-norm"] > steps["--no-qk-norm"]
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert "--qk-norm" in capsys.readouterr().out


def test_emit_config_refuses_what_the_runtime_cannot_build(capsys, tmp_path):
    """--emit-config for a model par3d train cannot build (a Q/K norm, local attention, ALiBi) is a usage error naming
    what is missing, before any search and with no file written -- not a traceback from the config writer."""
    out = tmp_path / "run.toml"
    dense = ["--layers", "4", "--hidden", "512", "--heads", "8", "--norm", "rms", "--gated-mlp", "--gpu", "h100",
             "--gpus", "8", "--global-batch", "16", "--emit-config", str(out)]
    for extra, what in ((["--qk-norm"], "norm on Q and K"), (["--sliding-window", "128"], "local attention")):
        rc, _, err = run(capsys, *dense, *extra)
        assert rc == 2 and f"--emit-config: model 'custom': par3d train has no {what}" in err and not out.exists()
    rc, _, err = run(capsys, "--model", "bloom-176b", "--gpu", "a100", "--gpus", "384", "--emit-config", str(out))
    assert rc == 2 and "ALiBi" in err and "drop --emit-config" in err and not out.exists()
    rc, _, _ = run(capsys, *dense)
    assert rc == 0 and out.exists()  # a model the runtime builds: written as before


def test_recompute_layers_beyond_the_model(capsys):
    """--recompute-layers N beyond the model's layers (more than any chunk holds) is refused before the search, naming
    the model's layer count; N up to it is priced as before."""
    base = ["--model", "llama3-8b", "--gpu", "h100", "--gpus", "16", "--global-batch", "64", "--recompute", "full",
            "--top", "1", "--json"]
    rc, _, err = run(capsys, *base, "--recompute-layers", "100")
    assert rc == 2 and "--recompute-layers 100: more than the 32 layers of llama3-8b" in err
    rc, out, _ = run(capsys, *base, "--recompute-layers", "32")
    assert rc == 0 and json.loads(out)["plans"]


def test_gpus_sweep_plans_each_count_as_gpus_does(capsys):
    """--gpus-sweep (issue 12's fifty-seventh round): one line per GPU count whose plan is the plan `--gpus N --top 1`
    gives at that count, its per-GPU throughput against the smallest count's, and the scale-pair evidence of the
    validation set (evidence.json's `scaling/pairs`); --scale-batch grows the global batch with the count."""
    from par3d.plan.evidence import scaling_evidence

    base = ["--model", "llama3-8b", "--gpu", "h100", "--global-batch", "64"]
    rc, out, _ = run(capsys, *base, "--gpus-sweep", "32,8,16", "--json")  # counts sorted
    assert rc == 0
    d = json.loads(out)
    assert [r["gpus"] for r in d["sweep"]] == [8, 16, 32] and [r["global_batch"] for r in d["sweep"]] == [64] * 3
    ev = scaling_evidence()
    assert ev is not None and d["scaling_evidence"] == ev and ev["within_5pct"] > ev["flat_within_5pct"]
    first = d["sweep"][0]["tokens_per_s_per_gpu"]
    for r in d["sweep"]:
        rc, one, _ = run(capsys, *base, "--gpus", str(r["gpus"]), "--top", "1", "--json")
        alone = {k: v for k, v in json.loads(one)["plans"][0].items() if k not in ("chunk_layers", "regimes")}
        assert rc == 0 and r["plan"] == alone
        assert r["tokens_per_s_per_gpu"] == pytest.approx(r["plan"]["tokens_per_s"] / r["gpus"])
        assert r["per_gpu_vs_first"] == pytest.approx(r["tokens_per_s_per_gpu"] / first)
    rc, out, _ = run(capsys, *base, "--gpus-sweep", "8,16", "--scale-batch", "--json")
    assert rc == 0 and [r["global_batch"] for r in json.loads(out)["sweep"]] == [64, 128]
    rc, out, _ = run(capsys, *base, "--gpus-sweep", "8,16")
    assert rc == 0 and "| 8 | 64 | tp=" in out and "| 100.0% |" in out and "| GPU-hours per 1B tokens |" in out
    d8 = d["sweep"][0]  # GPU-hours a billion tokens cost: GPUs / (tokens/s) per 1e9 tokens, in hours
    assert f"| {1e9 / d8['tokens_per_s_per_gpu'] / 3600:,.0f} |" in out.splitlines()[4]
    assert (f"scaling: on {ev['pairs']} published pairs (one run at two GPU counts, its layout alike) this model's "
            f"per-GPU scaling was within ±5 % of the measured in {ev['within_5pct']}") in out
    assert f"with the global batch fixed, as here: {ev['strong_within_5pct']} of {ev['strong']}" in out
    rc, out, _ = run(capsys, *base, "--gpus-sweep", "8,16", "--scale-batch")
    assert rc == 0 and f"with the global batch grown with the GPUs, as here: {ev['weak_within_5pct']} of" in out
    rc, out, _ = run(capsys, "--model", "llama3-405b", "--gpu", "h100", "--global-batch", "64", "--gpus-sweep", "1,2")
    assert rc == 1 and out.count("| no plan fits (does not fit in memory") == 2  # nothing fits: each count says why
    rc, out, _ = run(capsys, *base, "--gpus-sweep", "8,16", "--efficiency", "0.5")
    assert rc == 0 and "scaling: no evidence for this description" in out


@pytest.mark.parametrize("argv, says", [
    (["--gpus-sweep", "8"], "two or more distinct GPU counts"),
    (["--gpus-sweep", "8,x"], "whole numbers"),
    (["--scale-batch"], "--scale-batch: only with --gpus-sweep"),
    (["--gpus-sweep", "8,16", "--dp", "8"], "--dp with --gpus-sweep"),
    (["--gpus-sweep", "8,16", "--emit-config", "x.toml"], "--emit-config with --gpus-sweep"),
    (["--gpus-sweep", "8,16", "--explain"], "--explain with --gpus-sweep"),
    (["--gpus-sweep", "8,16", "--tp", "16"], "--gpus-sweep at 8 GPUs: --tp 16"),
    (["--gpus-sweep", "8,12"], "--gpus-sweep at 12 GPUs: --gpus 12: must be a multiple of --gpus-per-node 8"),
    (["--global-batch", "65", "--gpus-sweep", "16,24", "--scale-batch"],
     "--scale-batch: --global-batch 65 x 24 / 16 GPUs is not a whole number"),
    # flags the search refuses at every count alike: refused once, as without a sweep (not a table of refusals)
    (["--gpus-sweep", "8,16", "--recompute", "op", "--recompute-layers", "1"],
     "error: --recompute-layers 1 with --recompute op"),
])
def test_gpus_sweep_refuses_what_a_sweep_cannot_mean(capsys, argv, says):
    """Bad sweeps are refused before any search (exit 2), naming the flag, the count and a fix."""
    try:
        rc = main(["plan", "--model", "llama3-8b", "--gpu", "h100", "--global-batch", "64", *argv])
    except SystemExit as e:  # argparse's own refusal of a malformed list
        rc = e.code
    assert rc == 2 and says in capsys.readouterr().err


def test_a_plan_below_bf16_quotes_its_precision_pairs(capsys):
    """Under an FP8 plan, `par3d plan` says how well the model read FP8's speed-up on runs published in BF16 and FP8
    (of its GPU, and of a mixture of experts apart); a BF16 plan has no such line; --json carries the figures."""
    from par3d.plan.evidence import precision_evidence

    ev = precision_evidence()
    assert ev is not None
    base = ["--gpus", "64", "--global-batch", "256"]
    rc, out, _ = run(capsys, "--model", "llama3-70b", "--gpu", "h100", *base, "--dtype", "fp8")
    h100 = ev["by_kind"]["h100-sxm bf16→fp8"]
    assert rc == 0 and (f"precision: on {h100['pairs']} published runs of h100-sxm measured in bf16 and fp8, this "
                        f"model's fp8 speed-up was within ±5 % of the measured in {h100['within_5pct']}") in out
    rc, out, _ = run(capsys, "--model", "mixtral-8x7b", "--gpu", "gb200", *base, "--dtype", "fp8")
    moe = ev["by_kind"]["gb200 bf16→fp8 moe"]
    assert rc == 0 and f"on {moe['pairs']} published runs of gb200 measured in bf16 and fp8 (mixtures of experts)" in out
    rc, out, _ = run(capsys, "--model", "llama3-8b", "--gpu", "b200", "--gpus", "8", "--global-batch", "64",
                     "--dtype", "fp8")
    assert rc == 0 and "precision: no published run of b200 in bf16 and fp8" in out
    rc, out, _ = run(capsys, "--model", "llama3-70b", "--gpu", "h100", *base)
    assert rc == 0 and "precision:" not in out
    rc, out, _ = run(capsys, "--model", "llama3-70b", "--gpu", "h100", *base, "--dtype", "fp8", "--json")
    assert rc == 0 and json.loads(out)["precision_evidence"] == ev


@pytest.mark.parametrize("argv, says", [
    (["bench", "planner", "--repeat", "0"], "argument --repeat: 0 must be an integer >= 1"),
    (["bench", "synthetic", "--steps", "1"], "argument --steps: 1 must be an integer >= 2"),
    (["bench", "split", "--train-steps", "2"], "argument --train-steps: 2 must be an integer >= 3"),
    (["bench", "peers", "--warmup", "-1"], "argument --warmup: -1 must be an integer >= 0"),
    (["bench", "fidelity", "--rounds", "x"], "argument --rounds: 'x' is not an integer"),
])
def test_bench_counts_are_refused_before_anything_runs(capsys, argv, says):
    """A benchmark's counts (runs, steps, rounds) out of range are refused by the command line (exit 2), not met as
    a traceback (`bench planner --repeat 0` failed taking the median of no runs)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_a_schedule_some_frameworks_lack_is_said_so(capsys):
    """A searched plan on a zero-bubble schedule (here DualPipe-V: GPT-3's tied embeddings are searched on the V since
    issue 12's sixty-second round; a batch of 384, four micro-batches a pipeline, where the bubble decides: at 1,536
    interleaving leads since the sixty-third round priced BW as the weight-gradient GEMMs alone) says which
    frameworks lack it and how to keep to theirs; naming the schedules (or a framework) says nothing."""
    base = ["--model", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "768", "--global-batch", "384", "--top", "1"]
    rc, out, _ = run(capsys, *base)
    best = next(line for line in out.splitlines() if line.startswith("best: "))
    schedule = best.split(" v=")[0].split()[-1]
    assert rc == 0 and schedule in ("zb-h1", "zb-v", "dualpipe-v"), best
    note = next(line for line in out.splitlines() if line.startswith(f"note:     {schedule} is a schedule"))
    assert "megatron-lm (1f1b, interleaved)" in note and "deepspeed (1f1b)" in note and "--schedules" in note
    rc, out, _ = run(capsys, *base, "--schedules", "1f1b,interleaved")
    assert rc == 0 and "is a schedule par3d train runs" not in out
