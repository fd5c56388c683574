"""HSDP in the planner (`Choice.dp_replicate`, `par3d plan --dp-replicate`): ZeRO shards inside each replica
and all-reduces the shards' gradients across replicas; memory, collectives, search and CLI."""

from __future__ import annotations

import json

import pytest
from test_plan_cli import run  # `par3d plan` in-process: (rc, stdout, stderr)

from par3d.plan import comm
from par3d.plan.cost import Choice, evaluate, stage_times
from par3d.plan.dp_tail import dp_tail, optimizer_time
from par3d.plan.hardware import make_cluster
from par3d.plan.models import CATALOGUE
from par3d.plan.parallel_comm import grad_collective, sharded_grad_reduce
from par3d.plan.plan_memory import memory
from par3d.plan.search import Fixed, Limits, PlanError, search

MODEL = CATALOGUE["llama2-7b"]


def choice(dp: int, r: int, zero: int = 3, tp: int = 1, pp: int = 1) -> Choice:
    return Choice(tp, pp, dp, 1, 256 // dp if dp <= 256 else 1, "1f1b", 1, "none", zero, False, 1, r)


def test_states_shard_over_one_replica():
    """States ∝ 1 / (dp / dp_replicate): 2 replicas hold twice the full-shard states; dp replicas of one
    rank each hold what ZeRO-0 holds (an all-reduce of whole gradients)."""
    cl = make_cluster("a100-80gb", 16)
    full, two, each = (memory(MODEL, cl, choice(16, r))[0] for r in (1, 2, 16))
    assert two.states == pytest.approx(2 * full.states, rel=1e-9)
    plain = memory(MODEL, cl, choice(16, 1, zero=0))[0]
    assert each.states == pytest.approx(plain.states, rel=1e-9)
    assert two.activations == full.activations  # only the states move
    # the optimizer steps over the replica's shard: 2 replicas, twice the parameters per rank
    assert optimizer_time(MODEL, cl, choice(16, 2)) == pytest.approx(2 * optimizer_time(MODEL, cl, choice(16, 1)))


def test_shard_and_replicate_groups_on_a_hierarchical_cluster():
    """dp 16 over two 8-GPU nodes, 2 replicas: the shard group is one node (NVLink), the replicate group
    two ranks a node apart (the NICs), and ZeRO's reduction is the shard's reduce-scatter plus the
    all-reduce of its 1/8 across the replicas."""
    cl = make_cluster("h100-sxm", 16)
    c = choice(16, 2)
    n = 1e9
    shard_ag = grad_collective(cl, c, "all_gather", n, group="shard")
    assert shard_ag == pytest.approx(comm.collective("all_gather", n, 8, 1, cl).total)
    assert shard_ag < grad_collective(cl, choice(16, 1), "all_gather", n)  # the whole group crosses nodes
    rep = grad_collective(cl, c, "all_reduce", n / 8, group="replicate")
    assert rep == pytest.approx(comm.collective("all_reduce", n / 8, 2, 8, cl).total)
    assert sharded_grad_reduce(cl, c, n) == pytest.approx(
        comm.collective("reduce_scatter", n, 8, 1, cl).total + rep)
    assert sharded_grad_reduce(cl, choice(16, 1), n) == pytest.approx(
        grad_collective(cl, choice(16, 1), "reduce_scatter", n))  # one replica: no all-reduce


def test_flat_model_tail_adds_the_replicas_all_reduce():
    """The seed's flat model: ZeRO-2's tail under HSDP = the shard's reduce-scatter and the replicas'
    all-reduce (beyond the last backward) plus the shard's all-gather of updated weights; more replicas,
    smaller shards, so the tail differs from the full-shard one."""
    cl = make_cluster("a100-80gb", 16, efficiency=0.5)
    one = choice(16, 1, zero=2)
    st = stage_times(MODEL, cl, one)
    tails = [dp_tail(MODEL, cl, choice(16, r, zero=2), st) for r in (1, 2, 4)]
    assert all(t > 0 for t in tails) and len(set(tails)) == 3
    # ZeRO-3's per-layer collectives in the flat model: a shard group of one rank gathers nothing, and its
    # reduction is the all-reduce of whole gradients across the 16 replicas (what plain DP moves)
    one = stage_times(MODEL, cl, choice(16, 16))
    assert one.zero3 != stage_times(MODEL, cl, choice(16, 1)).zero3
    assert dp_tail(MODEL, cl, choice(16, 16), one) == 0.0  # ZeRO-3 reduces inside the stage durations


def test_search_tries_node_local_sharding_and_picks_it_where_the_nics_are_slow():
    """Under ZeRO-3 over 4 nodes the search tries full sharding and one replica per node; with one slow
    NIC per node the per-layer gathers cannot hide across nodes, so the node-local sharding wins."""
    fixed = Fixed(tp=1, pp=1, zero_stage=3, recompute="none", micro_batch=1)
    slow = make_cluster("a100-80gb", 32, nics_per_node=1, nic_bw_gbps=5.0)
    res = search(MODEL, slow, 64, fixed, Limits(), top=4)
    assert {p.choice.dp_replicate for p in res.plans} == {1, 4}
    assert res.plans[0].choice.dp_replicate == 4
    assert res.plans[0].memory.states > min(p.memory.states for p in res.plans)  # HSDP pays in memory
    fast = make_cluster("a100-80gb", 32)
    full = evaluate(MODEL, fast, Choice(1, 1, 32, 1, 2, "1f1b", 1, "none", 3, False, 1, 1))
    hsdp = evaluate(MODEL, slow, Choice(1, 1, 32, 1, 2, "1f1b", 1, "none", 3, False, 1, 4))
    slow_full = evaluate(MODEL, slow, Choice(1, 1, 32, 1, 2, "1f1b", 1, "none", 3, False, 1, 1))
    assert hsdp.step_time < slow_full.step_time
    assert full.breakdown["compute"] == hsdp.breakdown["compute"]


def test_fixed_replicas_and_their_errors():
    cl = make_cluster("a100-80gb", 16)
    res = search(MODEL, cl, 32, Fixed(dp_replicate=2), Limits(), top=3)
    assert res.plans and all(p.choice.dp_replicate == 2 and p.choice.zero_stage >= 1 for p in res.plans)
    for fixed, word in ((Fixed(dp_replicate=2, zero_stage=0), "ZeRO stage 0"),
                        (Fixed(dp_replicate=3, dp=16), "must divide --dp 16")):
        with pytest.raises(PlanError, match=word) as e:
            search(MODEL, cl, 32, fixed, Limits())
        assert e.value.flag == "--dp-replicate"


def test_cli_flag_json_table_and_bad_input(capsys, tmp_path):
    base = ["--model", "llama2-7b", "--gpus", "16", "--global-batch", "32", "--zero-stage", "3", "--tp", "1",
            "--pp", "1"]
    rc, out, _ = run(capsys, *base, "--dp-replicate", "2", "--json")
    assert rc == 0
    plans = json.loads(out)["plans"]
    assert plans and all(p["dp_replicate"] == 2 for p in plans)
    rc, out, _ = run(capsys, *base, "--dp-replicate", "2")
    assert rc == 0 and " 2x8 " in out and "dp=16(2x8)" in out
    rc, _, err = run(capsys, *base, "--dp-replicate", "3")  # divides no layout's dp: said, with a fix
    assert rc == 1 and "--dp-replicate 3 does not divide dp" in err and "--dp-replicate 2)" in err
    for argv, word in ((["--zero-stage", "0", "--dp-replicate", "2"], "ZeRO stage 0"),
                       (["--dp", "16", "--dp-replicate", "3"], "must divide --dp 16"),
                       (["--dp-replicate", "2", "--emit-config", str(tmp_path / "x.toml")], "no HSDP")):
        rc, _, err = run(capsys, "--model", "llama2-7b", "--gpus", "16", "--global-batch", "32", *argv)
        assert rc == 2 and "--dp-replicate" in err and word in err and "Traceback" not in err
