"""`par3d plan --framework NAME`: a named framework's software facts (plan/frameworks.py) fill the flags a user left
unset, a flag given still wins, and the validation set's "framework named" figure is what naming them buys
(issue 12's fifty-third round)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields

import pytest

from par3d.cli import main
from par3d.plan import evidence, validation
from par3d.plan.frameworks import FRAMEWORKS, get_framework
from par3d.plan.hardware import Cluster
from par3d.plan.stage_layout import megatron_split

ROWS = {str(r["name"]): r for r in validation.rows()}


def plan_json(capsys, *argv) -> dict:
    rc = main(["plan", *argv, "--top", "1", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


BASE = ["--model", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "512", "--global-batch", "1536", "--tp", "8",
        "--pp", "8", "--cp", "1"]


def test_every_fact_is_a_cluster_field_the_rows_can_state():
    """A framework sets only what a validation row states (validation.SOFTWARE_FIELDS, priced by cluster_of), by the
    Cluster field's own name (CUDA graphs' reach is priced as the Cluster's MoE host floor, `moe_host_s`, and the
    attention kernel as its device's attention share)."""
    cluster_fields = {f.name for f in fields(Cluster)} | {"cuda_graphs", "attention_kernel"}
    for fw in FRAMEWORKS.values():
        for facts in (fw.facts, fw.bf16_facts, fw.fp8_facts):
            assert set(facts) <= set(validation.SOFTWARE_FIELDS), fw.name
            assert set(facts) <= cluster_fields, fw.name
        assert fw.summary and fw.source, fw.name
    assert FRAMEWORKS["par3d"].resolve("bf16") == {}  # the defaults are par3d's own


def test_resolve_by_dtype():
    mlm = get_framework("megatron-lm")
    assert mlm.resolve("bf16")["grad_reduce_fp32"] is True  # Megatron-LM forces fp32 reduction under bf16
    assert "grad_reduce_fp32" not in mlm.resolve("fp16")
    nemo = get_framework("nemo")
    assert nemo.resolve("fp8")["fp8_param_gather"] is True and nemo.resolve("nvfp4")["fp8_param_gather"] is True
    assert "fp8_param_gather" not in nemo.resolve("bf16")
    with pytest.raises(ValueError, match="choose one of par3d, megatron-lm"):
        get_framework("megatron")


def test_frameworks_module_is_torch_free():
    code = "import sys, par3d.plan.frameworks; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_deepspeed_sets_its_facts_and_schedules(capsys):
    """--framework deepspeed: blocking, TP-partitioned sends, no FlashAttention, no overlapped DP reduction, 1F1B only
    (its pipeline engine has no interleaved schedule), slower than par3d's defaults on the same layout."""
    ds = plan_json(capsys, *BASE, "--framework", "deepspeed")
    hw = ds["hardware"]
    assert ds["framework"] == "deepspeed"
    assert hw["p2p_blocking"] == "all" and hw["p2p_partitioned"] and not hw["flash_attention"]
    assert not hw["overlap_grad_reduce"] and not hw["overlap_param_gather"] and hw["cross_entropy"] == "unfused"
    assert ds["plans"][0]["schedule"] == "1f1b" and not ds["plans"][0]["sequence_parallel"]
    plain = plan_json(capsys, *BASE)
    assert plain["framework"] == "par3d" and plain["hardware"]["p2p_blocking"] == "none"
    assert plain["hardware"]["flash_attention"] and not plain["hardware"]["p2p_partitioned"]
    assert plain["plans"][0]["step_time_s"] < ds["plans"][0]["step_time_s"]


def test_a_flag_given_wins_over_the_framework(capsys):
    hw = plan_json(capsys, *BASE, "--framework", "deepspeed", "--flash-attention", "--p2p-blocking", "none",
                   "--overlap-grad-reduce", "--no-p2p-partitioned")["hardware"]
    assert hw["flash_attention"] and hw["p2p_blocking"] == "none" and hw["overlap_grad_reduce"]
    assert not hw["p2p_partitioned"] and not hw["overlap_param_gather"]  # the rest still the framework's
    # a fixed schedule is the user's: the framework's list does not refuse it
    d = plan_json(capsys, *BASE, "--framework", "deepspeed", "--schedule", "interleaved", "--virtual-stages", "2")
    assert d["plans"][0]["schedule"] == "interleaved"


def test_framework_facts_that_give_way(capsys):
    """Facts that cannot hold beside a choice the user fixed are left out, not refused: DeepSpeed's partitioned
    boundaries beside --sequence-parallel, its sub-module ZeRO-3 gathers beside --fsdp."""
    hw = plan_json(capsys, *BASE, "--framework", "deepspeed", "--sequence-parallel")["hardware"]
    assert not hw["p2p_partitioned"] and hw["p2p_blocking"] == "all"
    rc = main(["plan", *BASE[:6], "--framework", "deepspeed", "--fsdp", "--zero-stage", "3", "--tp", "1", "--pp",
               "1", "--top", "1", "--json"])
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()


def test_fsdp_version_and_attention_kernel_of_torchtitan(capsys):
    args = ["--model", "llama2-7b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "256", "--zero-stage",
            "3", "--tp", "1", "--pp", "1"]
    tt = plan_json(capsys, *args, "--fsdp", "--framework", "torchtitan")
    assert tt["hardware"]["grad_reduce_fp32"] and tt["hardware"]["fsdp_version"] == 2
    fa3 = plan_json(capsys, *args, "--fsdp")  # par3d's default kernel on H100 is FlashAttention-3
    assert tt["plans"][0]["step_time_s"] > fa3["plans"][0]["step_time_s"]
    foundry = plan_json(capsys, *args, "--fsdp", "--framework", "llm-foundry")
    assert foundry["hardware"]["fsdp_version"] == 1 and foundry["hardware"]["cross_entropy"] == "kernel"


def test_megatron_frameworks_split_the_pipeline_as_megatron_core(capsys):
    """Megatron-LM and NeMo cut the layers evenly over the chunks (stage_layout.megatron_split), where par3d's balanced cut
    gives the stage holding the LM head fewer."""
    args = ["--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "512", "--tp", "2",
            "--pp", "4", "--cp", "1", "--schedule", "1f1b", "--dtype", "fp8"]
    mlm = plan_json(capsys, *args, "--framework", "megatron-lm")
    assert tuple(mlm["plans"][0]["chunk_layers"]) == megatron_split(32, 4)
    assert mlm["hardware"]["p2p_blocking"] == "1f1b" and mlm["hardware"]["grad_reduce_fp32"] is False  # fp8 run
    nemo = plan_json(capsys, *args, "--framework", "nemo")
    assert nemo["hardware"]["fp8_param_gather"] and nemo["hardware"]["tp_comm_overlap"]
    assert nemo["hardware"]["cross_entropy"] == "kernel"
    plain = plan_json(capsys, *args)
    assert tuple(plain["plans"][0]["chunk_layers"]) != megatron_split(32, 4)


def test_software_line_names_the_framework(capsys):
    rc = main(["plan", *BASE, "--framework", "megatron-lm-2021", "--top", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    line = next(x for x in out.splitlines() if x.startswith("software:"))
    assert line.startswith("software: --framework megatron-lm-2021: pipeline sends blocking, gradients reduced in "
                           "fp32 after the backward")
    f = evidence.software_evidence()["software/framework"]
    assert f"with only their framework named: {f['within_10pct']} ({f['median_abs_error_pct']:.1f} %)" in out
    rc = main(["plan", *BASE, "--top", "1"])
    out = capsys.readouterr().out
    assert "--framework names the software that will run the plan: megatron-lm, megatron-lm-2021, nemo" in out


def test_unknown_framework_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["plan", *BASE, "--framework", "megatron"])
    assert exc.value.code == 2
    assert "invalid choice: 'megatron'" in capsys.readouterr().err


def test_which_framework_ran_each_row():
    """The validation set's rows by source (validation.framework_of): Table 2's ZeRO-3 baseline is DeepSpeed's, its
    PTD-P rows and Table 1 Megatron-LM 2021's; NeMo 22.08 ran NeMo 1 on Apex (Megatron-LM 2021's facts), later
    NeMo releases the NeMo preset; software no preset describes stays at par3d's defaults."""
    of = validation.framework_of
    assert of(ROWS["narayanan2021-t2-zero3-175B-768"]) == "deepspeed"
    assert of(ROWS["narayanan2021-t2-ptd-175B-768"]) == "megatron-lm-2021"
    assert of(ROWS["narayanan2021-t1-1.7B"]) == "megatron-lm-2021"
    assert of(ROWS["nemo-22.08-gpt3-175B-a100-64"]) == "megatron-lm-2021"
    assert of(ROWS["nemo-22.08-gpt3-175B-a100-64"]) != of(next(r for n, r in ROWS.items() if n.startswith("nemo-25")))
    assert of(ROWS["bloom-176B"]) == "deepspeed" and of(ROWS["mtnlg-530B-2240"]) == "deepspeed"
    assert of(ROWS["mlperf-5.1-llama3.1-8B-amd-mi355x-8"]) is None
    assert of(next(r for n, r in ROWS.items() if n.startswith("hagemann23"))) is None
    assert all(of(r) in FRAMEWORKS or of(r) is None for r in ROWS.values())
    assert sum(of(r) is not None for r in ROWS.values()) > 1000  # most of the set ran a named framework


def test_named_row_is_undescribed_plus_its_framework():
    row = ROWS["mtnlg-530B-2240"]
    named = validation.named(row)
    plain = validation.undescribed(row)
    facts = get_framework("deepspeed").resolve("bf16")
    assert row["fixed"]["schedule"] == "1f1b"  # fixed: the framework's schedules are not added
    assert named == {**plain, **facts, validation.FRAMEWORK: "deepspeed"}
    cl = validation.cluster_of(named)
    assert cl.p2p_partitioned and cl.p2p_blocking == "all" and cl.zero3_unit == "submodule"
    assert not validation.megatron_row(named)
    # a Megatron-family row keeps Megatron-Core's split when its framework is named, loses it undescribed
    mrow = ROWS["narayanan2021-t1-145.6B"]
    assert validation.megatron_row(validation.named(mrow)) and not validation.megatron_row(validation.undescribed(mrow))
    # a row of no preset's framework is priced as undescribed
    h = next(r for n, r in ROWS.items() if n.startswith("hagemann23"))
    assert validation.named(h) == validation.undescribed(h)
    # sequence parallelism leaves DeepSpeed's partitioned boundaries out
    sp = {**row, "fixed": {**row["fixed"], "sequence_parallel": True}}
    assert "p2p_partitioned" not in validation.named(sp)
