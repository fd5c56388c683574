"""`par3d plan` on random command lines: whatever a user combines, the planner answers with plans, with "nothing
fits" and a fix, or with a clear refusal that names a flag -- never a traceback.

The command lines are drawn from a fixed seed (so a failure names its line and reproduces): catalogue models and
models described by flags (GQA, gated MLPs, mixtures of experts, windows, head widths), GPUs from the A100 to the
GB300 and MI300X, GPU counts that suit and do not, fixed and searched layouts, every schedule, the frameworks'
presets and the software flags.  `PAR3D_RANDOM_PLANS=N` draws N lines instead of the suite's 24 (the session that
wrote this ran 1,000 without a failure)."""

from __future__ import annotations

import json
import os
import random

import pytest

from par3d.cli import main

N = int(os.environ.get("PAR3D_RANDOM_PLANS", "24"))

MODELS = ["gpt3-175b", "llama3-8b", "llama3-70b", "llama2-70b", "gpt3-1.3b", "llama3-405b", "deepseek-v3",
          "mixtral-8x7b", "qwen3-30b-a3b", None]
GPUS = ["a100-80gb", "a100-40gb", "h100", "h200", "b200", "gb200", "gb300", "b300", "mi300x", "gh200"]
CHOICES = [("--tp", [1, 2, 4, 8, 16], .3), ("--pp", [1, 2, 4, 8, 16], .3), ("--cp", [1, 2, 4], .15),
           ("--dp", [1, 2, 8, 16], .1), ("--micro-batch", [1, 2, 4], .15),
           ("--schedule", ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe-v"], .2),
           ("--virtual-stages", [1, 2, 3, 4], .1), ("--recompute", ["none", "selective", "full", "op"], .2),
           ("--zero-stage", [0, 1, 2, 3], .2), ("--ep", [1, 2, 8], .1),
           ("--framework", ["par3d", "megatron-lm", "megatron-lm-2021", "nemo", "deepspeed", "torchtitan",
                            "llm-foundry", "maxtext"], .25),
           ("--recompute-layers", [1, 2], .05), ("--dp-replicate", [1, 2], .05), ("--offload-layers", [1, 2], .04),
           ("--offload-optimizer", [0.5, 1.0], .04), ("--memory-accounting", ["seed", "megatron"], .1),
           ("--optimizer-dtype", ["fp32", "bf16", "remainders"], .05), ("--optimizer", ["adam", "muon"], .05),
           ("--cp-comm", ["ring", "all-gather", "a2a"], .05), ("--attention-kernel", ["fa1", "fa2", "fa3"], .05),
           ("--fp8-scaling", ["delayed", "current", "mxfp8"], .05), ("--cuda-graphs", ["full_iteration", "none"], .05),
           ("--moe-dispatcher", ["alltoall", "flex"], .05), ("--gpus-per-node", [4, 8, 72], .05),
           ("--nics-per-node", [1, 8], .05), ("--max-bubble", [0.05, 0.2], .05), ("--memory-headroom", [0, 0.1], .05),
           ("--cross-entropy", ["unfused", "fused", "kernel"], .05), ("--pipeline-layout", ["2,2", "1,1,1,1"], .03)]
SWITCHES = ["--sequence-parallel", "--no-sequence-parallel", "--no-flash-attention", "--fsdp", "--ignore-memory",
            "--allow-inter-node-tp", "--tp-comm-overlap", "--no-overlap-grad-reduce", "--zero1-all-reduce",
            "--ep-comm-overlap"]


def command_line(r: random.Random) -> list[str]:
    a: list[str] = []
    name = r.choice(MODELS)
    if name:
        a += ["--model", name]
    else:
        h = r.choice([512, 1024, 2048, 4096, 5120, 8192])
        a += ["--layers", str(r.choice([2, 4, 24, 32, 61, 80])), "--hidden", str(h),
              "--heads", str(r.choice([8, 16, 32, 40, 64])), "--seq-len", str(r.choice([1024, 4096, 32768])),
              "--vocab", str(r.choice([32000, 50257, 151936]))]
        for flag, values, p in [("--kv-heads", [1, 4, 8, 16], .4), ("--ffn-hidden", [2 * h, 4 * h, 14336], .4),
                                ("--norm", ["layer", "rms"], .3), ("--head-dim", [64, 128], .2),
                                ("--sliding-window", [1024, 4096], .1)]:
            if r.random() < p:
                a += [flag, str(r.choice(values))]
        if r.random() < .3:
            a.append(r.choice(["--gated-mlp", "--no-gated-mlp"]))
        if r.random() < .2:
            a += ["--experts", str(r.choice([8, 16, 64])), "--top-k", str(r.choice([1, 2, 8]))]
            if r.random() < .3:
                a += ["--moe-load", str(r.choice([1.0, 1.5]))]
    a += ["--gpu", r.choice(GPUS), "--gpus", str(r.choice([1, 8, 16, 24, 64, 96, 256, 1000])),
          "--global-batch", str(r.choice([1, 8, 64, 96, 256, 1536]))]
    if r.random() < .3:
        a += ["--dtype", r.choice(["bf16", "fp16", "fp8", "nvfp4", "fp32"])]
    for flag, values, p in CHOICES:
        if r.random() < p:
            a += [flag, str(r.choice(values))]
    a += [s for s in SWITCHES if r.random() < .04]
    if r.random() < .05:
        a += ["--gpus-sweep", "8,16,32"]
    if r.random() < .5:
        a.append("--json")
    return [*a, "--top", "3", "--no-progress"]


@pytest.mark.parametrize("seed", range(N))
def test_any_command_line_gets_plans_a_fix_or_a_refusal_naming_a_flag(capsys, seed):
    argv = command_line(random.Random(seed))
    line = "par3d plan " + " ".join(argv)
    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    assert rc in (0, 1, 2), line
    if rc == 2:  # refused before any search: the flag, the rule and a fix (config validation's standard)
        assert err.startswith("par3d plan: error: ") and "--" in err, (line, err)
    elif "--gpus-sweep" in argv:  # a row per count: its best plan, or why it has none
        if "--json" in argv:
            rows = json.loads(out)["sweep"]
            assert any(r["plan"] for r in rows) == (rc == 0) and all(r["plan"] or r["why"] for r in rows), line
        else:
            assert "| GPUs |" in out, line
    elif "--json" in argv:
        d = json.loads(out)
        assert bool(d["plans"]) == (rc == 0), line
        if rc == 1:
            assert d["fixes"], line
    elif rc == 1:
        assert "no configuration" in err and "fix:" in err, (line, err)
    else:
        assert "best: " in out, line
