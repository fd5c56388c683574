"""DeepSpeed's pipeline engine at TP > 1 as the planner prices it (issue 12's fifty-second round; `Cluster.p2p_partitioned`,
`--p2p-partitioned`): each boundary tensor crosses as the sender's 1/tp slice and is rebuilt by an all-gather over TP
-- the receiving stage's input in its forward, the sending stage's output and received gradient in its backward --
checked term by term against the unpartitioned hop, and the rows and refusals that go with it."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

import par3d.plan.validation as validation
from par3d.cli import main
from par3d.plan import cost, parallel_comm
from par3d.plan.cost import Choice, evaluate, stage_times
from par3d.plan.hardware import make_cluster
from par3d.plan.models import resolve_model

BLOOM = dict(layers=70, hidden=14336, heads=112, seq_len=2048, vocab=250880, position="rotary")


@pytest.fixture(scope="module")
def setting():
    model = resolve_model(None, **BLOOM)
    plain = replace(make_cluster("a100-80gb", 384, dtype="bf16"), p2p_blocking="all")
    c = Choice(tp=4, pp=12, dp=8, micro_batch=2, microbatches=128, schedule="1f1b", recompute="full",
               zero_stage=1, sequence_parallel=False)
    return model, plain, replace(plain, p2p_partitioned=True), c


def test_the_hop_carries_a_slice_and_three_gathers_rebuild_it(setting):
    model, plain, part, c = setting
    a, b = stage_times(model, plain, c), stage_times(model, part, c)
    act = c.micro_batch * model.seq_len * model.hidden * 2.0
    assert b.transfer == pytest.approx(cost.comm.send_recv(act / c.tp, parallel_comm.strides(c)[2], part,
                                                           c.tp * c.cp * c.pp).total, rel=1e-12)
    assert b.transfer < a.transfer / 2
    gather = parallel_comm.tp_all_gather(part, c, act, parallel_comm.links(part, c).tp)
    assert gather > 0
    last = c.pp - 1
    # the TP time of each stage: +1 gather forward where the stage receives, +2 backward where it sends
    fwd = [b.f[s] - a.f[s] for s in range(c.pp)]
    bwd = [b.b[s] - a.b[s] for s in range(c.pp)]
    assert fwd[0] == pytest.approx(0.0, abs=1e-12) and bwd[last] == pytest.approx(0.0, abs=1e-12)
    for s in range(1, c.pp):
        assert fwd[s] == pytest.approx(gather, rel=1e-9)
    for s in range(last):
        assert bwd[s] == pytest.approx(2 * gather, rel=1e-9)
    # nothing to partition at TP 1, no boundary without a pipeline, and a sequence-parallel tensor is left as it was
    for other in (replace(c, tp=1, dp=32), replace(c, pp=1, dp=96), replace(c, sequence_parallel=True)):
        assert evaluate(model, part, other).step_time == evaluate(model, plain, other).step_time


def test_cli_flag_and_refusal(capsys):
    base = ["plan", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "384", "--global-batch", "2048",
            "--tp", "4", "--pp", "12", "--p2p-partitioned"]
    assert main([*base, "--sequence-parallel"]) == 2
    assert "use --no-sequence-parallel" in capsys.readouterr().err
    assert main([*base, "--no-sequence-parallel", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hardware"]["p2p_partitioned"] is True


def test_deepspeed_engine_rows_state_it_and_no_others():
    """The rows whose pipeline runs on DeepSpeed's engine (the header's p2p_blocking "all" on BLOOM, MT-NLG, GLM-130B,
    GPT-NeoX-20B) state the partitioning; no other row does; a sequence-parallel row may not."""
    rows = tomllib.loads(Path(validation.__file__).with_name("validation.toml").read_text())["row"]
    engine = ("bloom", "mtnlg-", "glm-130B", "gpt-neox-")
    stated = {r["name"] for r in rows if r.get("p2p_partitioned")}
    assert stated == {r["name"] for r in rows if r["name"].startswith(engine) and r.get("p2p_blocking") == "all"}
    assert len(stated) == 94
    with pytest.raises(ValueError, match="p2p_partitioned with sequence_parallel"):
        validation.cluster_of({"name": "x", "gpu": "a100-80gb", "gpus": 8, "p2p_partitioned": True,
                               "fixed": {"tp": 2, "pp": 2, "sequence_parallel": True}})
