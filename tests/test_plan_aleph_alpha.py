"""Aleph Alpha's scaling code as the planner prices it (issue 12's fifty-first round): ZeRO-1's gradients all-reduced
rather than reduce-scattered (`Cluster.zero1_all_reduce`, `--zero1-all-reduce`), bf16 gradients cast to fp32 for the
reduction and back (`Cluster.grad_reduce_cast`, `--grad-reduce-cast`), and the LM head's logits gathered to every TP
rank before a whole-vocabulary loss (`--cross-entropy gathered`) -- each term checked against its byte count, the
memory each leaves alone or adds, and the refusals of the CLI and the validation schema."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from par3d.cli import main
from par3d.plan import dp_tail, parallel_comm, plan_memory, stage_layout
from par3d.plan.compute import LOSS_BYTES, loss_time, loss_vocab
from par3d.plan.cost import Choice, Options, evaluate, stage_times
from par3d.plan.hardware import make_cluster
from par3d.plan.memory import logits_bytes
from par3d.plan.models import resolve_model
from par3d.plan.validation import cluster_of

LLAMA13 = dict(layers=40, hidden=5120, heads=40, ffn_hidden=13824, gated=True, norm="rms", seq_len=2048,
               vocab=128000, tied=False)


@pytest.fixture(scope="module")
def setting():
    model = resolve_model(None, **LLAMA13)
    plain = replace(make_cluster("a100-80gb", 64, dtype="bf16"), overlap_grad_reduce=False,
                    overlap_param_gather=False)
    c = Choice(tp=2, pp=2, dp=16, micro_batch=1, microbatches=128, schedule="1f1b", recompute="none",
               zero_stage=1)
    return model, plain, c


def test_which_reductions_are_all_reduces(setting):
    _, plain, c = setting
    aa = replace(plain, zero1_all_reduce=True)
    assert not parallel_comm.grads_all_reduced(plain, c)
    assert parallel_comm.grads_all_reduced(aa, c)
    assert parallel_comm.grads_all_reduced(plain, replace(c, zero_stage=0))
    # the flag says how ZeRO-1 reduces: ZeRO-2 still reduce-scatters
    assert not parallel_comm.grads_all_reduced(aa, replace(c, zero_stage=2))


def test_cast_doubles_the_wire_bytes_but_not_the_held_gradients(setting):
    _, plain, _ = setting
    cast = replace(plain, grad_reduce_cast=True)
    assert parallel_comm.grad_bytes(plain) == 2.0 and parallel_comm.grad_bytes(cast) == 4.0
    # Megatron's fp32 main gradients are held at 4 B; a cast for the collective holds the training dtype's 2 B
    assert plan_memory.memory_accounting(Options(), replace(plain, grad_reduce_fp32=True)) == "megatron"
    assert plan_memory.memory_accounting(Options(), cast) == Options().memory_accounting
    dev = plain.device
    assert dp_tail.reduction_passes(cast, 1e9) == pytest.approx(24.0 * 1e9 / (dev.mem_bw * dev.mem_eff))
    assert dp_tail.reduction_passes(plain, 1e9) == 0.0


def test_the_tail_is_an_fp32_all_reduce_with_its_casts_and_the_bf16_gather(setting):
    model, plain, c = setting
    aa = replace(plain, zero1_all_reduce=True, grad_reduce_cast=True)
    shapes = stage_layout.rank_shapes(model, c.tp, c.pp, c.virtual_stages, c.schedule, c.expert_shards)
    bw = aa.device.mem_bw * aa.device.mem_eff
    # nothing overlapped (the rows' software reduces after the backward): the tail is the busiest rank's whole
    # reduction and gather
    want = max(parallel_comm.grad_collective(aa, c, "all_reduce", 4.0 * s.params) + 24.0 * s.params / bw
               + parallel_comm.grad_collective(aa, c, "all_gather", 2.0 * s.params, group="shard") for s in shapes)
    assert dp_tail._dp_tail_bucketed(model, aa, c, stage_times(model, aa, c)) == pytest.approx(want, rel=1e-6)
    zero1 = max(parallel_comm.sharded_grad_reduce(plain, c, 2.0 * s.params)
                + parallel_comm.grad_collective(plain, c, "all_gather", 2.0 * s.params, group="shard") for s in shapes)
    assert dp_tail._dp_tail_bucketed(model, plain, c, stage_times(model, plain, c)) == pytest.approx(zero1, rel=1e-6)
    assert want > 2 * zero1  # twice the bytes of a reduce-scatter, in 4 B elements
    assert evaluate(model, aa, c).step_time > evaluate(model, plain, c).step_time
    # the same memory: the gradients are held in bf16 either way
    assert evaluate(model, aa, c).memory == evaluate(model, plain, c).memory


def test_gathered_logits_run_the_whole_vocabulary_on_every_tp_rank(setting):
    model, plain, c = setting
    dev = plain.device
    assert LOSS_BYTES["gathered"] == LOSS_BYTES["unfused"]
    assert loss_vocab(128000, 2, "unfused") == 64000 and loss_vocab(128000, 2, "gathered") == 128000
    assert loss_time(model, dev, 1, 2, "gathered") == pytest.approx(2 * loss_time(model, dev, 1, 2, "unfused"))
    assert loss_time(model, dev, 1, 1, "gathered") == loss_time(model, dev, 1, 1, "unfused")
    assert logits_bytes(model, 1, 2, cross_entropy="gathered") == 2 * logits_bytes(model, 1, 2)
    gathered = replace(plain, cross_entropy="gathered")
    a, b = stage_times(model, plain, c), stage_times(model, gathered, c)
    # the head's stage alone changes: the loss over all V, and the logits' all-gather in place of the vocab-parallel
    # loss's three small all-reduces
    assert a.f[0] == b.f[0] and a.tp_comm[0] == b.tp_comm[0]
    small = 3 * parallel_comm.tp_collective(plain, c, 4.0 * c.micro_batch * model.seq_len, parallel_comm.links(plain, c).tp)
    gather = parallel_comm.tp_all_gather(plain, c, 2.0 * c.micro_batch * model.seq_len * model.vocab, parallel_comm.links(plain, c).tp)
    assert gather > 10 * small > 0
    assert b.tp_comm[1] - a.tp_comm[1] == pytest.approx(gather - small, rel=1e-9)
    extra_loss = (loss_time(model, dev, 1, 2, "gathered") - loss_time(model, dev, 1, 2, "unfused")) / 3
    assert b.f_compute[1] - a.f_compute[1] == pytest.approx(extra_loss, rel=1e-6)
    # at TP 1 there is nothing to gather: the same as the unfused loss
    c1 = replace(c, tp=1, dp=32)
    assert stage_times(model, gathered, c1).f == stage_times(model, plain, c1).f


def test_cli_flags_and_refusals(capsys):
    base = ["plan", "--model", "llama2-13b", "--gpu", "a100-80gb", "--gpus", "64", "--global-batch", "2048"]
    assert main([*base, "--zero1-all-reduce"]) == 2
    assert "without --zero-stage 1" in capsys.readouterr().err
    assert main([*base, "--zero-stage", "2", "--zero1-all-reduce"]) == 2
    assert "with --zero-stage 2" in capsys.readouterr().err
    assert main([*base, "--grad-reduce-cast", "--grad-reduce-in-fp32"]) == 2
    assert "keep one" in capsys.readouterr().err
    assert main([*base, "--zero-stage", "1", "--zero1-all-reduce", "--grad-reduce-cast", "--cross-entropy",
                 "gathered", "--tp", "2", "--pp", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hardware"]["zero1_all_reduce"] is True and out["hardware"]["grad_reduce_cast"] is True
    # the software line says so, as the flags set it
    assert main([*base, "--zero-stage", "1", "--zero1-all-reduce", "--grad-reduce-cast", "--no-overlap-grad-reduce",
                 "--cross-entropy", "gathered", "--tp", "2", "--pp", "2"]) == 0
    text = capsys.readouterr().out
    said = next(line for line in text.splitlines() if line.startswith("software: "))
    assert ("gradients all-reduced (ZeRO-1 too) in fp32, cast from bf16 after the backward" in said
            and "cross-entropy gathered" in said and "--zero1-all-reduce" in said)
    # --explain counts the whole vocabulary's logits on the TP rank, twice the vocab-parallel loss's at TP 2
    import re

    counts = {}
    for ce in ("gathered", "unfused"):
        assert main([*base, "--zero-stage", "1", "--tp", "2", "--pp", "2", "--cross-entropy", ce, "--explain"]) == 0
        m = re.search(rf"--cross-entropy {ce}\): 52 B per logit x T·V(/tp)? = (\d+)M logits", capsys.readouterr().out)
        assert m is not None and (m.group(1) is None) == (ce == "gathered")
        counts[ce] = int(m.group(2))
    assert abs(counts["gathered"] - 2 * counts["unfused"]) <= 1


def test_validation_schema_refuses_contradictions():
    row = {"name": "x", "gpu": "a100-80gb", "gpus": 8, "fixed": {"tp": 1, "pp": 1, "zero_stage": 2},
           "zero1_all_reduce": True}
    with pytest.raises(ValueError, match="zero1_all_reduce needs fixed zero_stage 1"):
        cluster_of(row)
    row = {"name": "x", "gpu": "a100-80gb", "gpus": 8, "fixed": {"tp": 1, "pp": 1, "zero_stage": 1},
           "grad_reduce_cast": True, "grad_reduce_fp32": True}
    with pytest.raises(ValueError, match="keep one"):
        cluster_of(row)
    ok = cluster_of({"name": "x", "gpu": "a100-80gb", "gpus": 8, "fixed": {"tp": 1, "pp": 1, "zero_stage": 1},
                     "zero1_all_reduce": True, "grad_reduce_cast": True, "cross_entropy": "gathered"})
    assert ok.zero1_all_reduce and ok.grad_reduce_cast and ok.cross_entropy == "gathered"


def test_hagemann_rows_state_the_scaling_facts_and_its_uniform_cut():
    """Hagemann et al.'s rows take every communication fact Aleph Alpha's scaling determines (fifty-first round), and
    each pipelined row's cut is scaling's pipe_partition_uniform over [embedding, L layers, final norm, head]:
    L + 3 items, ⌊(L + 3)/pp⌋ a stage, the remainder one each to the first stages."""
    import tomllib
    from pathlib import Path

    import par3d.plan.validation as validation

    rows = [r for r in tomllib.loads(Path(validation.__file__).with_name("validation.toml").read_text())["row"]
            if r["name"].startswith("hagemann23-")]
    assert len(rows) == 93
    for r in rows:
        assert r["zero1_all_reduce"] and r["grad_reduce_cast"] and r["cross_entropy"] == "gathered", r["name"]
        layers, pp = r["model"]["layers"], r["fixed"]["pp"]
        if pp == 1:
            assert "pipeline_layout" not in r
            continue
        base, extra = divmod(layers + 3, pp)
        sizes = [base + (1 if k < extra else 0) for k in range(pp)]
        starts = [sum(sizes[:k]) for k in range(pp)]
        want = [sum(1 for i in range(a, a + n) if 1 <= i <= layers) for a, n in zip(starts, sizes)]
        assert r["pipeline_layout"] == want, r["name"]
    assert {tuple(r["pipeline_layout"]) for r in rows if r["fixed"]["pp"] == 4 and r["model"]["layers"] == 60} == \
        {(15, 16, 16, 13)}
