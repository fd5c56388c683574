"""DeepSpeed's BF16_Optimizer as the planner prices it (issue 12's fiftieth round; `Cluster.bf16_optimizer`,
`--deepspeed-bf16-optimizer`): its full fp32 gradient buffer in memory, each micro-batch's gradients added into it,
the bf16 all-reduce (not a reduce-scatter) after the backward with its casts, the optimizer's passes over the full
gradients -- each term checked against its byte count, and the CLI's refusals."""

from __future__ import annotations

from dataclasses import replace

import pytest

from par3d.cli import main
from par3d.plan import dp_tail, parallel_comm, plan_memory, stage_layout
from par3d.plan.cost import Choice, Options, evaluate, stage_times
from par3d.plan.hardware import make_cluster
from par3d.plan.memory import state_bytes_per_param
from par3d.plan.models import resolve_model

BLOOM = dict(layers=70, hidden=14336, heads=112, seq_len=2048, vocab=250880, position="rotary")


@pytest.fixture(scope="module")
def setting():
    model = resolve_model(None, **BLOOM)
    plain = replace(make_cluster("a100-80gb", 384, dtype="bf16"), overlap_grad_reduce=False,
                    overlap_param_gather=False)
    c = Choice(tp=4, pp=12, dp=8, micro_batch=2, microbatches=128, schedule="1f1b", recompute="full",
               zero_stage=1)
    return model, plain, replace(plain, bf16_optimizer=True), c


def test_memory_holds_the_full_fp32_buffer_beside_the_bf16_grads():
    assert state_bytes_per_param("bf16", 1, 8, "bf16_optimizer") == (2.0, 6.0, 12.0 / 8)
    assert state_bytes_per_param("bf16", 1, 8, "seed") == (2.0, 2.0, 12.0 / 8)
    assert plan_memory.memory_accounting(Options(), replace(make_cluster("a100-80gb", 8), bf16_optimizer=True)) == \
        "bf16_optimizer"


def test_each_micro_batch_adds_its_gradients_into_the_fp32_buffer(setting):
    model, plain, bf16, c = setting
    a, b = stage_times(model, plain, c), stage_times(model, bf16, c)
    assert a.f == b.f
    shapes = stage_layout.rank_shapes(model, c.tp, c.pp, c.virtual_stages, c.schedule, c.expert_shards)
    dev = bf16.device
    for s in range(c.pp):
        want = 18.0 * shapes[s].params / (dev.mem_bw * dev.mem_eff)
        assert b.b[s] - a.b[s] == pytest.approx(want, rel=1e-9)
    assert dp_tail.bf16_optimizer_accumulation(plain, 1e9) == 0.0


def test_all_reduce_with_casts_and_the_optimizer_passes(setting):
    model, plain, bf16, c = setting
    shapes = stage_layout.rank_shapes(model, c.tp, c.pp, c.virtual_stages, c.schedule, c.expert_shards)
    dev = bf16.device
    bw = dev.mem_bw * dev.mem_eff
    full = max(s.params for s in shapes)
    shard = max(s.params / c.zero_shards for s in shapes)
    assert dp_tail.optimizer_time(model, bf16, c) == pytest.approx((8.0 * full + 34.0 * shard) / bw)
    assert dp_tail.optimizer_time(model, plain, c) == pytest.approx(dp_tail.OPTIMIZER_STEP_BYTES * shard / bw)
    # the reduction: an all-reduce of the bf16 gradients where ZeRO-1 reduce-scatters them, plus the casts around it;
    # nothing overlapped (the tail without marks is the rank's whole reduction and gather)
    st = stage_times(model, bf16, c)
    tail = dp_tail._dp_tail_bucketed(model, bf16, c, st)
    per_rank = [parallel_comm.grad_collective(bf16, c, "all_reduce", 2.0 * s.params) + 16.0 * s.params / bw
                + parallel_comm.grad_collective(bf16, c, "all_gather", 2.0 * s.params, group="shard") for s in shapes]
    assert tail == pytest.approx(max(per_rank), rel=1e-6)
    zero1 = [parallel_comm.sharded_grad_reduce(plain, c, 2.0 * s.params)
             + parallel_comm.grad_collective(plain, c, "all_gather", 2.0 * s.params, group="shard") for s in shapes]
    assert dp_tail._dp_tail_bucketed(model, plain, c, stage_times(model, plain, c)) == pytest.approx(max(zero1), rel=1e-6)
    # and so the step is slower, with the same layout
    assert evaluate(model, bf16, c).step_time > evaluate(model, plain, c).step_time


def test_cli_flag_and_refusals(capsys):
    base = ["plan", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "384", "--global-batch", "2048",
            "--deepspeed-bf16-optimizer"]
    assert main(base) == 2
    assert "without --zero-stage 1" in capsys.readouterr().err
    assert main([*base, "--zero-stage", "1", "--dtype", "fp16"]) == 2
    assert "use --dtype bf16" in capsys.readouterr().err
    assert main([*base, "--zero-stage", "1", "--tp", "4", "--pp", "12", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["hardware"]["bf16_optimizer"] is True
