"""The planner's mixtures of experts (issue 12's twenty-third round): routed experts and their grouped GEMMs,
expert parallelism, the token all-to-alls, expert-data-parallel sharding, the search over ep, the flags and the
refusals -- each checked against what it must equal (a dense model of the same active width, the formulas of
comm.all_to_all, the parameter counts), not against a stored number."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from par3d.cli import main
from par3d.plan import comm, compute
from par3d.plan.cost import Choice, evaluate, stage_times
from par3d.plan.cp_ep_comm import ep_exchange
from par3d.plan.hardware import NIC_EFF, make_cluster, nvlink_eff
from par3d.plan.models import resolve_model
from par3d.plan.plan_memory import memory
from par3d.plan.search import Fixed, PlanError, search

# Qwen3-30B-A3B as Megatron-Bridge's provider gives it (validation.toml's MoE rows)
QWEN = dict(layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128, gated=True, norm="rms", vocab=151936,
            seq_len=4096, ffn_hidden=6144, experts=128, top_k=8, moe_ffn_hidden=768)
QWEN_FLAGS = ["--layers", "48", "--hidden", "2048", "--heads", "32", "--kv-heads", "4", "--head-dim", "128",
              "--gated-mlp", "--norm", "rms", "--vocab", "151936", "--seq-len", "4096", "--ffn-hidden", "6144",
              "--experts", "128", "--top-k", "8", "--moe-ffn-hidden", "768"]


@pytest.fixture(scope="module")
def qwen():
    return resolve_model(None, **QWEN)


def test_expert_gemms_are_the_active_width_split_by_ep(qwen):
    """Per rank, the routed experts are one grouped GEMM per matrix over E/ep experts, each expert's M the rank's
    tokens x top_k spread over the experts and gathered from the ep ranks; their FLOPs do not depend on ep and equal
    a dense MLP of top_k experts' width (the router's h x E GEMM apart)."""
    b, tok = 2, 2 * qwen.seq_len
    for ep in (1, 8, 32, 128):
        gs = {g.name: g for g in compute.layer_gemms(qwen, b, 1, ep)}
        assert gs["expert_in"].batch == 128 // ep and gs["expert_in"].m == tok * 8 * ep // 128
        assert (gs["expert_in"].n, gs["expert_in"].k) == (2 * 768, 2048) and (gs["expert_out"].n, gs["expert_out"].k) \
            == (2048, 768)
        assert "mlp_in" not in gs  # no shared expert
    dense = replace(qwen, experts=0, top_k=0, moe_ffn_hidden=None, ffn_hidden=8 * 768)
    for ep in (1, 16):
        moe_f = compute.layer_flops(qwen, b, 1, ep)
        dense_f = compute.layer_flops(dense, b, 1)
        assert moe_f[1] == dense_f[1]  # the attention core
        assert moe_f[0] - dense_f[0] == pytest.approx(2.0 * tok * 2048 * 128)  # the router
    # model FLOPs: the active experts (and the router), not all 128
    per_seq = compute.model_flops_per_sequence(qwen) - compute.model_flops_per_sequence(dense)
    assert per_seq == pytest.approx(3 * 48 * 2.0 * qwen.seq_len * 2048 * 128)
    # a shared expert is a dense MLP of its width, TP-split as one
    shared = replace(qwen, shared_ffn=4096)
    gs = {g.name: g for g in compute.layer_gemms(shared, b, 2, 8)}
    assert (gs["mlp_in"].m, gs["mlp_in"].n, gs["mlp_out"].k) == (tok, 2 * 4096 // 2, 4096 // 2)
    assert gs["expert_in"].m == tok // 2 * 8 * 8 // 128  # each TP rank routes its own s/tp tokens


def test_all_to_all_inside_and_across_nodes():
    """comm.all_to_all: each rank sends (e-1)/e of its bytes, its node-mates' share over NVLink and the rest through
    its own NIC, in parallel -- inside a node only the first; across nodes the slower; flat clusters one link."""
    cl = make_cluster("h100-sxm", 64)
    n = 1e9
    nvl = cl.intra.beta * nvlink_eff(cl.intra.name, "p2p")
    inside = comm.all_to_all(n, 8, cl)
    assert inside.beta == pytest.approx(7 / 8 * n / nvl) and inside.alpha == cl.intra.alpha
    across = comm.all_to_all(n, 32, cl)
    assert across.beta == pytest.approx(max(7 / 32 * n / nvl, 24 / 32 * n / (cl.inter.beta * NIC_EFF)))
    assert across.total > inside.total and comm.all_to_all(n, 1, cl).total == 0.0
    nvl72 = make_cluster("gb200", 72)  # one NVLink domain: an EP group of 64 stays on NVLink
    assert comm.all_to_all(n, 64, nvl72).beta == pytest.approx(
        63 / 64 * n / (nvl72.intra.beta * nvlink_eff(nvl72.intra.name, "p2p")))
    flat = make_cluster("h100-sxm", 64, efficiency=0.5)
    assert not flat.hier and comm.all_to_all(n, 16, flat).beta == pytest.approx(15 / 16 * n / flat.inter.beta)


def test_ep_exchange_is_priced_per_layer_and_overlap_hides_it(qwen):
    """Four all-to-alls per MoE layer per micro-batch (dispatch and combine, forward and backward) of this rank's
    tokens x top_k x h in 16 bits; none for ep = 1 or a dense model; --ep-comm-overlap exposes only what outlasts a
    layer's compute (and the slowdown of the shared part), never more than exposed."""
    cl = make_cluster("h100-sxm", 64, dtype="fp8")
    c = Choice(1, 1, 64, 1, 4, ep=32)
    f, b = ep_exchange(qwen, cl, c)
    one = comm.all_to_all(qwen.seq_len * 8 * 2048 * 2.0, 32, cl).total
    assert (f, b) == pytest.approx((2 * one, 2 * one))
    assert ep_exchange(qwen, cl, replace(c, ep=1)) == (0.0, 0.0)
    assert ep_exchange(resolve_model("llama3-8b"), cl, c) == (0.0, 0.0)
    f2, b2 = ep_exchange(qwen, replace(cl, ep_comm_overlap=True), c)
    assert 0.0 <= f2 < f and 0.0 <= b2 < b
    st = stage_times(qwen, cl, c)
    assert st.ep_comm[0] == pytest.approx(48 * (f + b))  # every layer of the one stage
    plan = evaluate(qwen, cl, c)
    assert plan.breakdown["ep_comm"] == pytest.approx(4 * 48 * (f + b))  # m = 4 micro-batches
    assert plan.to_dict()["ep"] == 32 and "ep_comm" in plan.to_dict()["breakdown_s"]


def test_a2a_overlap_pairs_sub_modules_in_the_steady_phase(qwen):
    """Megatron-Core's 1F1B A2A overlap (issue 12's fiftieth round, model_chunk_schedule_plan.py): a forward layer of
    one micro-batch beside a backward layer of another, each all-to-all hidden behind the sub-module its schedule
    pairs it with (A's dispatch behind B's experts' gradients, B's gradient dispatch behind A's experts, A's combine
    behind B's attention gradients, the next gradient combine behind A's next attention), only in the steady phase:
    the warm-up's forward-only layers expose everything, the cool-down's backward-only ones what outlasts the delayed
    weight gradients."""
    from par3d.plan.compute import LayerTimes
    from par3d.plan.cp_ep_comm import a2a_overlap_exposed, a2a_paired_share

    # the paired share: pp 4, v 2, m 16 -- rank 0 warms up 2·3 + 4 + 1 = 11 of its 32 chunk steps, the last 5
    c = Choice(1, 4, 16, 1, 16, "interleaved", 2, ep=8)
    assert a2a_paired_share(c, 0) == pytest.approx(21 / 32) and a2a_paired_share(c, 3) == pytest.approx(27 / 32)
    assert a2a_paired_share(c) == pytest.approx(sum(a2a_paired_share(c, r) for r in range(4)) / 4)
    assert a2a_paired_share(Choice(1, 1, 8, 1, 8, ep=8)) == pytest.approx(7 / 8)
    assert a2a_paired_share(Choice(1, 1, 8, 1, 1, ep=8)) == 0.0
    # a layer of 3 ms: experts 1 ms, the rest 2 ms
    lt = LayerTimes(3e-3, 0.0, 0.0, 0.0, 0.0, 0.0, modules=(("moe", 1e-3),))
    sigma = 0.2
    small = (0.5e-3,) * 4  # every exchange fits its window: only the slowdown of the hidden 2 ms
    f, b = a2a_overlap_exposed(lt, small, sigma, 1.0)
    assert f + b == pytest.approx(sigma * 2e-3) and f == pytest.approx(b)
    # a dispatch of 4 ms outlasts both its windows (B's 2 ms of expert gradients, then A's 1 ms experts)
    big = (4e-3, 0.5e-3, 4e-3, 0.5e-3)
    t_y = max(max(2e-3, 4e-3) + 1e-3, max(1e-3, 4e-3) + 4e-3)  # 8 ms
    t_x = max(max(4e-3, 0.5e-3) + 2e-3, max(2e-3, 0.5e-3) + 0.5e-3)  # 6 ms
    exposed = t_x + t_y - 9e-3
    f, b = a2a_overlap_exposed(lt, big, sigma, 1.0)
    assert f + b == pytest.approx(exposed + sigma * (9e-3 - exposed))
    # unpaired: the forward exposes both exchanges, the backward what outlasts the delayed weight gradients
    f, b = a2a_overlap_exposed(lt, big, sigma, 0.0)
    assert (f, b) == pytest.approx((4.5e-3, 3e-3))
    # in the step: a plan with the overlap is never slower per stage than without, and the early ranks expose more
    cl = replace(make_cluster("h100-sxm", 64, dtype="bf16"), ep_comm_overlap=True)
    c = Choice(1, 4, 16, 1, 16, "interleaved", 2, ep=8)
    st = stage_times(qwen, cl, c)
    plain = stage_times(qwen, replace(cl, ep_comm_overlap=False), c)
    assert all(a <= b + 1e-12 for a, b in zip(st.ep_comm, plain.ep_comm))
    early, late = (sum(ep_exchange(qwen, cl, c, a2a_paired_share(c, r))) for r in (0, 3))
    assert early > late > 0.0


def test_expert_parallel_memory(qwen):
    """Each rank holds E/ep experts; ZeRO shards the experts' states over the ranks holding the same experts
    (tp x cp x dp / ep of them), the rest over dp x cp: with 8 ranks, ep 8 holds an eighth of the experts' weights
    of ep 1, and the experts' optimizer state is an eighth in both (sharded over 8 ranks, or held once by 8)."""
    cl = make_cluster("h100-sxm", 8, dtype="bf16")
    base = Choice(1, 1, 8, 1, 8, zero_stage=1)
    m1, m8 = memory(qwen, cl, base)[0], memory(qwen, cl, replace(base, ep=8))[0]
    experts = 48 * qwen.expert_layer_params()
    assert m1.weights - m8.weights == pytest.approx(2.0 * experts * 7 / 8)
    assert m1.optimizer == pytest.approx(m8.optimizer)
    assert replace(base, ep=8).expert_dp == 1 and base.expert_dp == 8


def test_search_over_ep_and_its_refusals(qwen):
    """The search tries every ep dividing the expert count and the stage's tp x cp x dp ranks (a dense model only
    ep 1); a fixed --ep that does not divide the experts, --ep on a dense model and ZeRO-3 with experts in DeepSpeed's
    sub-module units are refused by the flag (layer units are priced since issue 12's twenty-eighth round)."""
    cl = make_cluster("gb200", 8, dtype="fp8")
    res = search(qwen, cl, 512, Fixed(pp=1, micro_batch=4, recompute="none"), top=40)
    assert {p.choice.ep for p in res.plans} >= {1, 8} and all(128 % p.choice.ep == 0 for p in res.plans)
    assert all(p.choice.ep == 1 for p in search(resolve_model("llama3-8b"), cl, 64, top=10).plans)
    fixed = search(qwen, cl, 512, Fixed(pp=1, micro_batch=4, ep=4), top=3)
    assert fixed.plans and all(p.choice.ep == 4 for p in fixed.plans)
    with pytest.raises(PlanError, match="--ep 3"):
        search(qwen, cl, 512, Fixed(ep=3))
    with pytest.raises(PlanError, match="--zero-stage 3"):
        search(qwen, replace(cl, zero3_unit="submodule"), 512, Fixed(zero_stage=3))
    with pytest.raises(PlanError, match="dense"):
        search(resolve_model("llama3-8b"), cl, 64, Fixed(ep=2))


def test_plan_cli_for_a_mixture_of_experts(capsys, tmp_path):
    """`par3d plan` with the MoE flags: the model line names the experts and the active size, the table an ep
    column, the evidence line the mixture-of-experts rows of the GPU; --json carries ep and the experts;
    --emit-config (par3d train has no experts) is refused."""
    args = [*QWEN_FLAGS, "--gpu", "gb200", "--gpus", "8", "--global-batch", "512", "--dtype", "fp8",
            "--fp8-scaling", "mxfp8", "--ep", "8", "--micro-batch", "4", "--pp", "1"]
    assert main(["plan", *args]) == 0
    out = capsys.readouterr().out
    assert "128 experts of ffn 768, top-8" in out and "3.35B active" in out and " ep " in out.splitlines()[5]
    assert "published runs of gb200 fp8 mixture-of-experts" in out
    assert main(["plan", *args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plans"][0]["ep"] == 8 and data["model"]["experts"] == 128 and data["model"]["top_k"] == 8
    assert data["evidence"]["rows"] > 0
    assert main(["plan", *args, "--emit-config", str(tmp_path / "c.toml")]) == 2
    assert "no routed experts" in capsys.readouterr().err
    assert main(["plan", *QWEN_FLAGS[:-6], "--top-k", "8", "--gpus", "8", "--global-batch", "64"]) == 2
    assert "--experts" in capsys.readouterr().err


def test_mla_and_leading_dense_layers_stage_by_stage(tmp_path):
    """DeepSeek-V3's shape (twenty-third round): MLA's down projections are whole on every TP rank and its up and
    output projections split by heads; the leading dense layers are priced as the dense variant's layers in the stages
    that hold them -- their compute, their parameters, no all-to-all -- and the model FLOPs add both kinds."""
    ds = resolve_model(None, layers=61, hidden=7168, heads=128, head_dim=128, gated=True, norm="rms", vocab=129280,
                       seq_len=4096, ffn_hidden=18432, experts=256, top_k=8, moe_ffn_hidden=2048, shared_ffn=2048,
                       dense_layers=3, kv_lora=512, q_lora=1536, rope_dim=64, v_head=128)
    gs = {g.name: g for g in compute.layer_gemms(ds, 1, 4, 8)}
    assert (gs["qkv_down"].n, gs["qkv_down"].k) == (1536 + 512 + 64, 7168)  # whole on each of the 4 TP ranks
    assert (gs["qkv"].n, gs["qkv"].k) == (128 // 4 * 192, 1536) and (gs["kv_up"].n, gs["kv_up"].k) == (32 * 256, 512)
    assert (gs["attn_scores"].k, gs["attn_values"].n, gs["attn_out"].k) == (192, 128, 32 * 128)
    dense = ds.dense_variant()
    assert not dense.moe and dense.mla and dense.ffn == 18432
    cl = make_cluster("gb200", 64, dtype="fp8")
    c = Choice(1, 4, 16, 1, 16, ep=16, zero_stage=1)
    st = stage_times(ds, cl, c)
    from par3d.plan.cp_ep_comm import choice_layer_times
    from par3d.plan.stage_layout import layout, rank_shapes

    lay = layout(ds, 4)
    assert lay.dense == (3, 0, 0, 0) and sum(lay.layers) == 61
    lt, ltd = choice_layer_times(ds, cl, c), choice_layer_times(dense, cl, c)
    n0 = lay.layers[0]
    assert st.f_compute[0] == pytest.approx((n0 - 3) * lt.fwd + 3 * ltd.fwd)
    f, b = ep_exchange(ds, cl, c)
    assert st.ep_comm[0] == pytest.approx((n0 - 3) * (f + b)) and st.ep_comm[1] == pytest.approx(lay.layers[1] * (f + b))
    shapes = rank_shapes(ds, 1, 4, 1, None, 16)
    assert shapes[0].params - shapes[0].expert_params == pytest.approx(
        (n0 - 3) * ds.dense_layer_params_per_rank(1) + 3 * dense.layer_params_per_rank(1) + ds.embedding_params())
    assert shapes[0].expert_params == pytest.approx((n0 - 3) * ds.expert_layer_params() / 16)
    fl = compute.model_flops_per_sequence(ds)
    assert fl == pytest.approx(compute.model_flops_per_sequence(replace(ds, dense_layers=0)) * 58 / 61
                               + compute.model_flops_per_sequence(dense) * 3 / 61
                               + 3.0 * compute.head_gemm(ds, 1, 1).flops * (1 - 58 / 61 - 3 / 61), rel=1e-9)
    plan = evaluate(ds, cl, c)
    assert plan.tokens_per_s > 0 and plan.breakdown["ep_comm"] > 0


def test_multi_token_prediction_rides_with_the_loss():
    """DeepSeek-V3's multi-token prediction (--mtp-layers): its module's parameters count (a layer, the 2h x h
    projection, two norms), its work joins the head's stage -- which the partition then gives fewer layers -- and its
    FLOPs the model's (a layer, the projection, the head again)."""
    base = dict(layers=61, hidden=7168, heads=128, head_dim=128, gated=True, norm="rms", vocab=129280, seq_len=4096,
                ffn_hidden=18432, experts=256, top_k=8, moe_ffn_hidden=2048, shared_ffn=2048, dense_layers=3,
                kv_lora=512, q_lora=1536, rope_dim=64, v_head=128)
    ds0, ds1 = resolve_model(None, **base), resolve_model(None, **base, mtp_layers=1)
    h = 7168
    assert ds1.params() - ds0.params() == ds0.layer_params() + 2 * h * h + 2 * h
    from par3d.plan.stage_layout import layout

    l0, l1 = layout(ds0, 16), layout(ds1, 16)
    assert sum(l1.layers) == sum(l0.layers) == 61 and l1.layers[-1] < l0.layers[-1]
    cl = make_cluster("gb200", 256, dtype="fp8")
    c = Choice(1, 16, 16, 1, 16, ep=16, zero_stage=1)
    st0, st1 = stage_times(ds0, cl, c), stage_times(ds1, cl, c)
    lt = compute.layer_times(ds1, cl.device, cl.gemm_dtype, 1, 1, False, cl.flash, False, "unfused", False, 16)
    assert st1.ep_comm[-1] > st0.ep_comm[-1] * l1.layers[-1] / l0.layers[-1]  # the module's all-to-alls too
    assert st1.f_compute[-1] > l1.layers[-1] * lt.fwd + lt.head_fwd  # a layer, a projection and the head again
    fl = compute.model_flops_per_sequence(ds1) - compute.model_flops_per_sequence(ds0)
    layer = sum(compute.layer_flops(ds0, 1, 1))
    assert fl == pytest.approx(3 * (layer + compute.head_gemm(ds0, 1, 1).flops + 2.0 * 4096 * 2 * h * h))


def test_node_deduplicated_fp8_dispatch_and_group_limited_routing():
    """--ep-dispatch dedup (DeepEP, HybridEP): across nodes each token crosses the NICs once per remote node holding
    one of its experts -- m·(1 - (1 - 1/m)^k) nodes of the m it may use, (N-1)/N of them remote -- and is forwarded
    over NVLink; group-limited routing bounds m (DeepSeek-V3: 4 of 8 groups, a group per node at EP 64 over 8 nodes);
    --ep-dispatch-fp8 halves the forward dispatch's bytes.  Inside one node only the rows per token change (one per
    destination rank, `compute.ep_destination_ranks`, not one per routed copy)."""
    from par3d.plan.cp_ep_comm import ep_remote_nodes

    ds = resolve_model(None, layers=61, hidden=7168, heads=128, head_dim=128, gated=True, norm="rms", vocab=129280,
                       seq_len=4096, ffn_hidden=18432, experts=256, top_k=8, moe_ffn_hidden=2048, shared_ffn=2048,
                       dense_layers=3, kv_lora=512, q_lora=1536, rope_dim=64, v_head=128, route_groups=8,
                       route_group_topk=4)
    free = replace(ds, route_groups=0, route_group_topk=0)
    cl = make_cluster("h100-sxm", 2048, dtype="fp8")
    c = Choice(1, 16, 128, 1, 120, "dualpipe-v", 2, ep=64, zero_stage=1)
    assert ep_remote_nodes(free, cl, c) == pytest.approx(8 * (1 - (7 / 8) ** 8) * 7 / 8)
    assert ep_remote_nodes(ds, cl, c) == pytest.approx(4 * (1 - (3 / 4) ** 8) * 7 / 8)
    plain = ep_exchange(ds, cl, c)
    dedup = ep_exchange(ds, replace(cl, ep_dispatch="dedup"), c)
    fp8 = ep_exchange(ds, replace(cl, ep_dispatch="dedup", ep_dispatch_fp8=True), c)
    assert fp8[0] < dedup[0] < plain[0] and fp8[1] == pytest.approx(dedup[1]) and dedup[1] < plain[1]
    # the NIC bytes: each token's remote copies, h elements of 2 bytes, once per remote node
    tokens, nic = 4096, cl.inter.beta * NIC_EFF
    rows = compute.ep_destination_ranks(ds, 64)
    one = comm.all_to_all(tokens * rows * 7168 * 2.0, 64, cl, ep_remote_nodes(ds, cl, c), tokens * 7168 * 2.0)
    assert one.beta == pytest.approx(max(63 / 64 * tokens * rows * 7168 * 2.0 / (cl.intra.beta * nvlink_eff(
        cl.intra.name, "p2p")), ep_remote_nodes(ds, cl, c) * tokens * 7168 * 2.0 / nic))
    assert dedup[1] == pytest.approx(2 * one.total)  # the backward: the two gradients' exchanges, 16-bit
    # --moe-dispatcher flex is the same dispatch: its node-level scheme too (DeepEP internode, HybridEP multi-node)
    assert ep_exchange(ds, replace(cl, moe_dispatcher="flex"), c) == pytest.approx(dedup)
    inside = Choice(1, 16, 128, 1, 120, "dualpipe-v", 2, ep=8, zero_stage=1)
    in8 = compute.ep_destination_ranks(ds, 8)
    assert ep_exchange(ds, cl, inside)[1] == pytest.approx(2 * comm.all_to_all(tokens * 8 * 7168 * 2.0, 8, cl).total)
    assert ep_exchange(ds, replace(cl, ep_dispatch="dedup"), inside)[1] == pytest.approx(
        2 * comm.all_to_all(tokens * in8 * 7168 * 2.0, 8, cl).total)
    with pytest.raises(ValueError, match="--router-groups 8 --router-group-topk 8"):
        resolve_model("llama3-8b", experts=64, top_k=4, route_groups=8, route_group_topk=8)


def test_ep_destination_ranks_counts_distinct_ranks():
    """The rows the flex dispatcher sends per token (issue 12's fiftieth round): the distinct EP ranks holding one of
    its k experts, experts drawn without replacement -- ep·(1 - C(E - E/ep, k) / C(E, k)); one expert per rank gives
    exactly k; never more than k or ep; group-limited routing draws only from the token's groups' ranks."""
    from math import comb

    mixtral = resolve_model("mixtral-8x7b")
    assert compute.ep_destination_ranks(mixtral, 8) == pytest.approx(2.0)
    assert compute.ep_destination_ranks(mixtral, 1) == 1.0
    qwen3 = resolve_model("qwen3-30b-a3b")
    for ep in (2, 8, 32, 128):
        e, k = 128, 8
        want = ep * (1 - comb(e - e // ep, k) / comb(e, k))
        assert compute.ep_destination_ranks(qwen3, ep) == pytest.approx(want)
        assert compute.ep_destination_ranks(qwen3, ep) <= min(k, ep)
    ds = resolve_model("deepseek-v3")
    # EP 8: a group a rank, the token's 4 groups on 4 ranks, its 8 experts among their 128: at most 4 ranks
    assert compute.ep_destination_ranks(ds, 8) == pytest.approx(4 * (1 - comb(96, 8) / comb(128, 8)))
    # EP 64: a group spans 8 ranks; 32 ranks hold the token's groups, 4 experts each
    assert compute.ep_destination_ranks(ds, 64) == pytest.approx(32 * (1 - comb(124, 8) / comb(128, 8)))
    free = replace(ds, route_groups=0, route_group_topk=0)
    assert compute.ep_destination_ranks(ds, 64) < compute.ep_destination_ranks(free, 64)
    # NeMo AutoModel's FakeBalancedGate (--router-consecutive): token i's experts are i·k ... i·k + k - 1, so 8 of 128
    # experts at 16 a rank sit on one rank; of 256 at 4 a rank on two; of 384 at 12 a rank on one or two (4/3)
    run = replace(free, route_consecutive=True)
    assert compute.ep_destination_ranks(replace(qwen3, route_consecutive=True), 8) == 1.0
    assert compute.ep_destination_ranks(run, 64) == 2.0
    assert compute.ep_destination_ranks(replace(resolve_model("kimi-k2"), route_consecutive=True), 32) == \
        pytest.approx(4 / 3)
    # across nodes: EP 64 over eight 8-GPU nodes, a node's 32 experts hold the run, remote 7/8 of the time
    from par3d.plan.cp_ep_comm import ep_remote_nodes

    cl = make_cluster("h100-sxm", 256, dtype="bf16")
    assert ep_remote_nodes(run, cl, Choice(1, 4, 64, 1, 8, "1f1b", 1, ep=64, zero_stage=1)) == pytest.approx(7 / 8)
    from par3d.plan.models import ModelError

    with pytest.raises(ModelError, match="--router-consecutive with --router-groups 8"):
        resolve_model("deepseek-v3", route_consecutive=True)
    with pytest.raises(ModelError, match="--router-consecutive/--moe-load describe a mixture of experts"):
        resolve_model("llama3-8b", route_consecutive=True)


def memory_layer_bytes(model, rec: str) -> float:
    from par3d.plan.hardware import make_cluster as mk
    from par3d.plan.memory import layer_activation_bytes

    cl = mk("h100-sxm", 1024, dtype="fp8")
    return layer_activation_bytes(model, 1, 1, False, rec, cl.precision, 1, cl.flash)


def test_review_fixes_heaviest_rank_sequence_parallel_and_refusals(qwen):
    """Issue 12's twenty-fourth round's review: (1) the memory report's rank is the heaviest of all pipeline ranks
    priced in full (expert states shard over expert_dp, not dp x cp, so no one coefficient orders the ranks);
    (2) MoE with tp > 1 runs sequence parallelism, as Megatron-Core requires, and --no-sequence-parallel with it is
    refused; (3) HSDP replicas with experts are refused; (4) the leading dense layers' ffn must split over tp;
    (5) router groups on a dense model are refused; (6) the MTP projection runs on this rank's s/cp tokens."""
    from par3d.plan.memory import rank_memory
    from par3d.plan.models import ModelError
    from par3d.plan.plan_memory import _memory_scan, offloaded_live
    from par3d.plan.stage_layout import layout, mtp_forward, rank_stage_lists

    ds = resolve_model(None, layers=61, hidden=7168, heads=128, head_dim=128, gated=True, norm="rms", vocab=129280,
                       seq_len=4096, ffn_hidden=18432, experts=256, top_k=8, moe_ffn_hidden=2048, shared_ffn=2048,
                       dense_layers=3, kv_lora=512, q_lora=1536, rope_dim=64, v_head=128, mtp_layers=1)
    cl = make_cluster("h100-sxm", 1024, dtype="fp8")
    for pp, ep, rec in ((16, 32, "full"), (8, 32, "none"), (16, 64, "none")):
        c = Choice(1, pp, 1024 // pp, 1, 4 * pp, zero_stage=1, ep=ep, recompute=rec)
        mb, arg = memory(ds, cl, c)
        shapes, peaks, per_layer, _, live, _, per_rank, _ = _memory_scan(ds, cl.dtype, cl.flash, 1, pp, 1, "1f1b",
                                                                       4 * pp, 1, False, rec, 1, 0, cl.cross_entropy,
                                                                       ep)
        every = [rank_memory(ds, shapes[r], peaks[r], tp=1, dp=c.dp, b=1, inflight_layers=offloaded_live(live[r], 0, c),
                             sp=False, recompute=rec, zero=1, dtype=cl.dtype, flash=cl.flash, per_layer=per_rank[r],
                             cross_entropy=cl.cross_entropy, expert_dp=c.expert_dp).total for r in range(pp)]
        assert mb.total == pytest.approx(max(every)) and every[arg] == pytest.approx(max(every))
        # each rank's layers at their own kinds (issue 12's twenty-ninth round): a rank of MoE layers only at the MoE
        # layer's bytes, a rank holding some of the three leading dense layers between the two kinds' (the dense
        # ones store less here); the one-number estimate keeps the larger of the two
        moe_b, dense_b = memory_layer_bytes(ds, rec), memory_layer_bytes(ds.dense_variant(), rec)
        if rec == "full":  # every layer keeps its input only: the two kinds store alike
            assert dense_b == moe_b and set(per_rank) == {moe_b}
            continue
        assert dense_b < moe_b and per_layer == moe_b
        lay = layout(ds, pp)
        kinds = [(sum(lay.layers[st] for st in stages), sum(lay.dense_of(st) for st in stages))
                 for stages in rank_stage_lists("1f1b", pp, 1)]
        assert sum(nd for _, nd in kinds) == 3 and kinds[-1][1] == 0
        for r, (n, nd) in enumerate(kinds):
            assert per_rank[r] == pytest.approx(((n - nd) * moe_b + nd * dense_b) / n, rel=1e-12)
            assert dense_b <= per_rank[r] <= moe_b and (per_rank[r] == moe_b) == (nd == 0)
    gb = make_cluster("gb200", 16, dtype="fp8")
    res = search(qwen, gb, 512, Fixed(pp=1, micro_batch=4, recompute="none"), top=60)
    assert any(p.choice.tp > 1 for p in res.plans)
    assert all(p.choice.sequence_parallel for p in res.plans if p.choice.tp > 1)
    for f, words in ((Fixed(tp=2, sequence_parallel=False), "sequence parallelism"),
                     (Fixed(dp_replicate=2, zero_stage=1), "--dp-replicate 2")):
        with pytest.raises(PlanError, match=words):
            search(qwen, gb, 512, f)
    from par3d.plan.search import Limits, tp_choices

    odd = replace(qwen, dense_layers=1, ffn_hidden=5460)
    assert 8 not in tp_choices(odd, make_cluster("gb200", 64, dtype="fp8"), Fixed(), Limits())
    with pytest.raises(ModelError, match="--router-groups"):
        resolve_model("llama3-8b", route_groups=8, route_group_topk=4)
    long = replace(ds, seq_len=16384)
    c1, c4 = Choice(1, 16, 16, 1, 16, zero_stage=1, ep=16), Choice(1, 16, 4, 1, 16, zero_stage=1, ep=16, cp=4)
    lt = compute.layer_times(long, cl.device, cl.gemm_dtype, 1, 1, False, cl.flash, False, "unfused", False, 16)
    proj = {cp: mtp_forward(long, cl.device, cl.gemm_dtype, 1, 1, lt, cp) - lt.fwd - lt.head_fwd for cp in (1, 4)}
    assert proj[4] == pytest.approx(compute.gemm_time(compute.Gemm("mtp_proj", 4096, 7168, 2 * 7168), cl.device,
                                                      cl.gemm_dtype))
    assert proj[4] < proj[1] / 3 and c1.gpus == c4.gpus


def test_mla_down_projections_and_latent_gathers_under_sequence_parallelism():
    """Megatron-Core's MLA under sequence parallelism (twenty-fourth round): each TP rank runs the whole down
    projections on its s/tp tokens, keeps its shard of the latents, and the up projections all-gather the latents
    (q_lora + kv_lora + rope channels) instead of the hidden state: the down projections' FLOPs, the stored latents
    and the attention's TP time all shrink against the same layout without SP."""
    from par3d.plan.memory import layer_activation_bytes
    from par3d.plan.parallel_comm import links, tp_collective

    ds = resolve_model(None, layers=61, hidden=7168, heads=128, head_dim=128, gated=True, norm="rms", vocab=129280,
                       seq_len=4096, ffn_hidden=18432, experts=256, top_k=8, moe_ffn_hidden=2048, shared_ffn=2048,
                       dense_layers=3, kv_lora=512, q_lora=1536, rope_dim=64, v_head=128)
    tok = 4096
    off = {g.name: g for g in compute.layer_gemms(ds, 1, 4, 8)}
    on = {g.name: g for g in compute.layer_gemms(ds, 1, 4, 8, sp=True)}
    assert off["qkv_down"].m == tok and on["qkv_down"].m == tok // 4 and on["qkv"] == off["qkv"]
    assert compute.layer_flops(ds, 1, 4, 8)[0] - compute.layer_flops(ds, 1, 4, 8, sp=True)[0] == pytest.approx(
        2.0 * (tok - tok // 4) * (1536 + 512 + 64) * 7168)
    lat = 2.0 * tok * (1536 + 512 + 64)  # bf16 bytes: 2 units of s·b per latent channel
    assert layer_activation_bytes(ds, 1, 4, False, "none") - layer_activation_bytes(ds, 1, 4, True, "none") \
        > lat * 3 / 4
    cl = make_cluster("gb200", 64, dtype="bf16")
    c = Choice(4, 4, 4, 1, 16, ep=8, zero_stage=1, sequence_parallel=True)
    st = stage_times(ds, cl, c)
    act = 4096 * 7168 * 2
    ar = tp_collective(cl, c, act, links(cl, c).tp)
    attn = tp_collective(cl, c, act * (7168 + 1536 + 512 + 64) / (2 * 7168), links(cl, c).tp)
    from par3d.plan.stage_layout import layout

    n1 = layout(ds, 4).layers[1]  # MoE layers only: the attention's pair and the shared expert's, forward and backward
    assert attn < ar and st.tp_comm[1] == pytest.approx(n1 * 2 * (attn + ar))


def test_multi_token_prediction_is_recomputed_as_every_layer():
    """Under full recomputation of every layer the MTP module's layer is recomputed too (memory.rank_memory stores
    it as a recomputed layer), its forward and its all-to-alls once more in the last stage's backward."""
    from par3d.plan.cp_ep_comm import choice_layer_times
    from par3d.plan.stage_layout import layout

    base = dict(layers=61, hidden=7168, heads=128, head_dim=128, gated=True, norm="rms", vocab=129280, seq_len=4096,
                ffn_hidden=18432, experts=256, top_k=8, moe_ffn_hidden=2048, shared_ffn=2048, dense_layers=3,
                kv_lora=512, q_lora=1536, rope_dim=64, v_head=128)
    ds = resolve_model(None, **base, mtp_layers=1)
    cl = make_cluster("gb200", 256, dtype="fp8")
    none, full = Choice(1, 16, 16, 1, 16, ep=16, zero_stage=1), Choice(1, 16, 16, 1, 16, ep=16, zero_stage=1,
                                                                         recompute="full")
    st0, st1 = stage_times(ds, cl, none), stage_times(ds, cl, full)
    n_last = layout(ds, 16).layers[-1]
    per_layer = choice_layer_times(ds, cl, full).fwd + ep_exchange(ds, cl, full)[0]
    assert st1.b[-1] - st0.b[-1] == pytest.approx((n_last + 1) * per_layer)


DS_BASE = dict(layers=61, hidden=7168, heads=128, head_dim=128, gated=True, norm="rms", vocab=129280, seq_len=4096,
               ffn_hidden=18432, experts=256, top_k=8, moe_ffn_hidden=2048, shared_ffn=2048, dense_layers=3,
               kv_lora=512, q_lora=1536, rope_dim=64, v_head=128)


def test_megatron_recompute_modules():
    """Megatron-Core's selective recomputation of named modules (issue 12's twenty-eighth round, --recompute-modules):
    "selective" is its default list (core_attn); each module re-runs its own forward in the backward -- MLA's up
    projections their two GEMMs, the routed experts' activation its HBM traffic, a MoE block its GEMMs, routing and
    all-to-alls -- and stops storing what it holds inside (Q/K/V; the activation's output; the whole block)."""
    from par3d.plan.cp_ep_comm import choice_layer_times
    from par3d.plan.memory import SAVED_CAST_BYTES, layer_activation_bytes

    assert compute.recompute_modules("selective") == {"core_attn"} and compute.recompute_modules("none") == set()
    assert compute.modules_recompute(["moe_act", "mla_up_proj"]) == "selective:mla_up_proj,moe_act"
    assert compute.modules_recompute(["core_attn"]) == "selective"
    ds = resolve_model(None, **DS_BASE)
    cl = make_cluster("gb200", 256, dtype="fp8")
    c = Choice(1, 16, 16, 1, 16, ep=16, zero_stage=1)
    lt = choice_layer_times(ds, cl, c)
    gs = {g.name: g for g in compute.layer_gemms(ds, 1, 1, 16)}
    dev, gdt = cl.device, cl.gemm_dtype
    assert lt.recomputed("selective:core_attn") == lt.recomputed("selective") == lt.core
    up = compute.gemm_time(gs["qkv"], dev, gdt) + compute.gemm_time(gs["kv_up"], dev, gdt)
    assert lt.recomputed("selective:mla_up_proj") == pytest.approx(up)
    assert lt.recomputed("selective:core_attn,mla_up_proj") == pytest.approx(up + lt.core)
    act = compute.module_elementwise_bytes(ds, 1, 1, False, "fp8")["act"]
    assert act == 3 * 4096 * 8 * 2048 * 2  # SwiGLU over the routed copies: read 2, write 1, bf16
    assert lt.recomputed("selective:moe_act") == pytest.approx(act / (dev.mem_bw * dev.mem_eff))
    assert lt.recomputed("selective:moe") > lt.recomputed("selective:shared_experts") > 0
    # memory: what each module stops storing, in the bytes the formulas count (fp8: saved GEMM inputs as casts)
    s, q = 4096, SAVED_CAST_BYTES["fp8"]
    none = layer_activation_bytes(ds, 1, 1, False, "none", "fp8", 1, True)
    drop = {m: none - layer_activation_bytes(ds, 1, 1, False, f"selective:{m}", "fp8", 1, True)
            for m in compute.RECOMPUTE_MODULES if m not in ("core_attn", "mlp")}
    assert drop["mla_up_proj"] == pytest.approx(2.0 * s * ds.q_dim + 4.0 * s * ds.kv_dim_per_rank(1))
    assert drop["moe_act"] == pytest.approx(q * s * 8 * 2048)
    assert drop["layernorm"] == 0.0  # under fp8 the GEMMs keep their own quantized inputs
    assert drop["moe"] > drop["shared_experts"] > 0 and drop["moe"] > drop["moe_act"]
    bf16 = layer_activation_bytes(ds, 1, 1, False, "none", "bf16", 1, True)
    assert bf16 - layer_activation_bytes(ds, 1, 1, False, "selective:layernorm", "bf16", 1, True) == 4.0 * s * 7168
    dense = ds.dense_variant()
    assert layer_activation_bytes(dense, 1, 1, False, "selective:mlp", "bf16", 1, True) == pytest.approx(
        layer_activation_bytes(dense, 1, 1, False, "none", "bf16", 1, True) - 6.0 * s * 18432)
    # a recomputed MoE block dispatches and combines its tokens again in the backward; a recomputed up projection not
    st0 = stage_times(ds, cl, c)
    st_moe = stage_times(ds, cl, replace(c, recompute="selective:moe"))
    st_up = stage_times(ds, cl, replace(c, recompute="selective:mla_up_proj"))
    f, _ = ep_exchange(ds, cl, c)
    from par3d.plan.stage_layout import layout

    n = layout(ds, 16).layers[1]  # the second stage holds MoE layers only
    assert st_moe.ep_comm[1] - st0.ep_comm[1] == pytest.approx(n * f)
    assert st_up.ep_comm[1] == st0.ep_comm[1] and st_up.b[1] - st0.b[1] == pytest.approx(n * up)
    # hardware FLOPs count the recomputed GEMMs
    extra = compute.recompute_flops_per_sequence(ds, "selective:mla_up_proj")
    one = {g.name: g.flops for g in compute.layer_gemms(ds, 1, 1)}
    assert extra == pytest.approx(58 * (one["qkv"] + one["kv_up"]) + 3 * (one["qkv"] + one["kv_up"]))


def test_recompute_modules_flag_and_refusals(capsys, tmp_path):
    """--recompute-modules on the command line: the plan's JSON names the method, memory falls, time rises; a module
    Megatron-Core does not know, one the model lacks, an empty list, beside --recompute full or --emit-config: each a
    clear error before anything is priced."""
    cfg = {"model_type": "deepseek_v3", "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
           "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
           "v_head_dim": 128, "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
           "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1, "num_attention_heads": 128,
           "num_key_value_heads": 128, "num_hidden_layers": 61, "tie_word_embeddings": False, "vocab_size": 129280,
           "max_position_embeddings": 4096}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    base = ["plan", "--model", str(p), "--gpu", "b200", "--dtype", "fp8", "--gpus", "256", "--global-batch", "4096",
            "--tp", "1", "--pp", "16", "--ep", "16", "--micro-batch", "1", "--zero-stage", "1", "--schedule", "1f1b",
            "--ignore-memory", "--top", "1", "--json"]
    out = {}
    for mods in (None, "mla_up_proj", "moe_act,mla_up_proj"):
        assert main(base + (["--recompute-modules", mods] if mods else [])) == 0
        out[mods] = json.loads(capsys.readouterr().out)["plans"][0]
    assert out["mla_up_proj"]["recompute"] == "selective:mla_up_proj"
    assert out["moe_act,mla_up_proj"]["recompute"] == "selective:mla_up_proj,moe_act"
    assert out[None]["memory_gib"]["activations"] > out["mla_up_proj"]["memory_gib"]["activations"] \
        > out["moe_act,mla_up_proj"]["memory_gib"]["activations"]
    assert out[None]["step_time_s"] < out["mla_up_proj"]["step_time_s"] < out["moe_act,mla_up_proj"]["step_time_s"]
    bad = {("--recompute-modules", "foo"): "not one of Megatron-Core's recompute modules",
           ("--recompute-modules", " , "): "names no module",
           ("--recompute-modules", "mla_up_proj", "--recompute", "full"): "--recompute full",
           ("--recompute-modules", "mla_up_proj", "--emit-config", str(tmp_path / "x.toml")): "--emit-config"}
    for extra, why in bad.items():
        assert main(base + list(extra)) == 2
        assert why in capsys.readouterr().err
    qwen = ["plan", *QWEN_FLAGS, "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64", "--tp", "1", "--ep", "8",
            "--recompute-modules", "mla_up_proj,shared_experts", "--top", "1"]
    assert main(qwen) == 2
    err = capsys.readouterr().err
    assert "mla_up_proj, shared_experts recomputes what" in err and "multi-head latent attention" in err


def test_interleaved_moe_layers_llama4(tmp_path):
    """Llama 4 (issue 12's twenty-eighth round): read from its config.json's text_config -- experts and the shared
    expert at `intermediate_size`, the dense layers at `intermediate_size_mlp`, Maverick's interleave_moe_layer_step 2
    (one layer in two MoE: layer u, from 1, when u % 2 == 0) -- at its model cards' sizes (Scout 109B with 17B active,
    Maverick 400B / 17B); a pipeline stage prices its own count of each kind; the 8K attention chunk is the default
    sequence; Qwen2-MoE's decoder_sparse_step is the same rule; --moe-step on the command line."""
    from par3d.plan.cp_ep_comm import choice_layer_times
    from par3d.plan.models import ModelError
    from par3d.plan.stage_layout import layout

    text = {"model_type": "llama4_text", "attention_chunk_size": 8192, "head_dim": 128, "hidden_act": "silu",
            "hidden_size": 5120, "interleave_moe_layer_step": 2, "intermediate_size": 8192,
            "intermediate_size_mlp": 16384, "max_position_embeddings": 1048576, "num_attention_heads": 40,
            "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8, "num_local_experts": 128,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "vocab_size": 202048}
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "llama4", "text_config": text}))
    mav = resolve_model(str(p))
    assert (mav.experts, mav.top_k, mav.expert_ffn, mav.shared_ffn, mav.ffn, mav.moe_step) == (128, 1, 8192, 8192,
                                                                                               16384, 2)
    assert mav.seq_len == 8192 and mav.attn_chunk == 8192  # the chunk, not the 1M positions
    assert (mav.moe_layers, mav.dense_count) == (24, 24)
    assert [mav.is_moe_layer(u) for u in (1, 2, 3, 4)] == [False, True, False, True]
    assert mav.params() / 1e9 == pytest.approx(400, rel=0.01) and mav.active_params() / 1e9 == pytest.approx(17,
                                                                                                              rel=0.02)
    p.write_text(json.dumps({"model_type": "llama4", "text_config": {**text, "interleave_moe_layer_step": 1,
                                                                        "num_local_experts": 16}}))
    scout = resolve_model(str(p))
    assert scout.moe_layers == 48 and scout.dense_count == 0
    assert scout.params() / 1e9 == pytest.approx(109, rel=0.02) and scout.active_params() / 1e9 == pytest.approx(
        17, rel=0.02)
    assert resolve_model("llama4-maverick").params() == mav.params()
    assert scout.global_every == 4  # transformers' default: every 4th layer global (nope_layer_interval)
    assert resolve_model(str(p), seq_len=16384).seq_len == 16384  # past the chunk: priced with its chunks
    # each stage prices its own count of dense and MoE layers
    mav = replace(mav, pipeline_split=(12, 12, 12, 12))
    lay = layout(mav, 4)
    assert lay.layers == (12, 12, 12, 12) and lay.dense == (6, 6, 6, 6)
    odd = layout(replace(mav, pipeline_split=(11, 13, 12, 12)), 4)
    assert odd.dense == (6, 6, 6, 6) and layout(replace(mav, pipeline_split=(1, 13, 22, 12)), 4).dense == (1, 6, 11, 6)
    cl = make_cluster("gb200", 64, dtype="fp8")
    c = Choice(1, 4, 16, 1, 16, ep=16, zero_stage=1)
    st = stage_times(mav, cl, c)
    lt, ltd = choice_layer_times(mav, cl, c), choice_layer_times(mav.dense_variant(), cl, c)
    assert st.f_compute[1] == pytest.approx(6 * lt.fwd + 6 * ltd.fwd)
    # model FLOPs: 24 MoE layers and 24 dense ones
    both = compute.model_flops_per_sequence(mav)
    moe_only = compute.model_flops_per_sequence(replace(mav, moe_step=1))
    dense_only = compute.model_flops_per_sequence(mav.dense_variant())
    assert both == pytest.approx((moe_only + dense_only) / 2, rel=1e-9)
    # Qwen2-MoE's decoder_sparse_step: the same rule
    q = {"model_type": "qwen2_moe", "num_hidden_layers": 24, "hidden_size": 2048, "num_attention_heads": 16,
         "num_key_value_heads": 16, "intermediate_size": 5632, "moe_intermediate_size": 1408, "num_experts": 60,
         "num_experts_per_tok": 4, "decoder_sparse_step": 2, "vocab_size": 151936, "hidden_act": "silu",
         "rms_norm_eps": 1e-6, "max_position_embeddings": 8192}
    p.write_text(json.dumps(q))
    qm = resolve_model(str(p))
    assert qm.moe_step == 2 and qm.moe_layers == 12
    with pytest.raises(ModelError, match="--moe-step 49"):
        resolve_model(None, **QWEN, moe_step=49)
    with pytest.raises(ModelError, match="--moe-step"):
        resolve_model(None, layers=8, hidden=512, heads=8, moe_step=2)
    assert main(["plan", *QWEN_FLAGS, "--moe-step", "2", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "64",
                 "--top", "1", "--json"]) == 0


def test_zero3_with_experts(qwen):
    """ZeRO-3 / FSDP with a mixture of experts (issue 12's twenty-eighth round; refused before): each layer gathers its
    dense part over the dp x cp ranks and its E/ep routed experts over the ranks holding the same experts -- none where
    ep spans them all (FSDP 8 x EP 8 on 8 GPUs: every rank owns its 16 experts whole) -- and reduce-scatters its
    gradients over the same groups; a rank's states shard so, and the two gathered layers it holds are its own E/ep
    experts' size, not all E experts'."""
    from par3d.plan.parallel_comm import (
        expert_grad_collective,
        grad_bytes,
        grad_collective,
        sharded_grad_reduce,
        zero3_layer_collectives,
    )

    cl = make_cluster("h100-sxm", 16, dtype="bf16")
    for dp, ep in ((8, 8), (16, 8)):
        c = Choice(1, 1, dp, 1, 8, ep=ep, zero_stage=3)
        ag, rs = zero3_layer_collectives(qwen, cl, c, 1, 0)
        dense = qwen.dense_layer_params_per_rank(1)
        experts = qwen.expert_layer_params() / ep
        assert ag == pytest.approx(grad_collective(cl, c, "all_gather", 2.0 * dense, group="shard")
                                   + expert_grad_collective(cl, c, "all_gather", 2.0 * experts))
        assert rs == pytest.approx(sharded_grad_reduce(cl, c, grad_bytes(cl) * dense)
                                   + expert_grad_collective(cl, c, "reduce_scatter", grad_bytes(cl) * experts))
        if dp == ep:  # expert_dp 1: only the dense part moves
            assert c.expert_dp == 1 and ag == pytest.approx(grad_collective(cl, c, "all_gather", 2.0 * dense,
                                                                            group="shard"))
        else:
            assert c.expert_dp == 2 and ag > 2 * grad_collective(cl, c, "all_gather", 2.0 * dense, group="shard")
    c1, c3 = Choice(1, 1, 16, 1, 8, ep=8, zero_stage=1), Choice(1, 1, 16, 1, 8, ep=8, zero_stage=3)
    m1, m3 = memory(qwen, cl, c1)[0], memory(qwen, cl, c3)[0]
    from par3d.plan.stage_layout import rank_shapes

    shape = rank_shapes(qwen, 1, 1, 1, "1f1b", 8)[0]  # the one stage: its dense part and its E/ep experts
    assert m1.weights == pytest.approx(2.0 * shape.params)
    # the experts sharded over their expert_dp of 2, the dense part (attention, router, embeddings) over all 16
    assert m3.weights == pytest.approx(2.0 * ((shape.params - shape.expert_params) / 16 + shape.expert_params / 2))
    gathered = 2 * 2.0 * qwen.layer_params_per_rank(1, 8)  # two layers of bf16 weights, E/ep experts each
    assert m3.other - m1.other == pytest.approx(gathered, rel=1e-6)
    res = search(qwen, cl, 512, Fixed(tp=1, pp=1, ep=8, zero_stage=3, micro_batch=4), top=1)
    assert res.plans and res.plans[0].choice.zero_stage == 3 and res.plans[0].breakdown["dp_comm"] > 0


def test_search_tries_cheap_recompute_modules_where_nothing_else_fits():
    """For a mixture of experts the search also tries Megatron-Core's cheap modules (the routed experts' activation;
    with latent attention its up projections too), and only for a layout and ZeRO stage that do not fit without
    recomputation -- where they would only add time (issue 12's twenty-eighth round)."""
    from par3d.plan.cost import DEFAULT_OPTIONS
    from par3d.plan.models import CATALOGUE

    ds = CATALOGUE["deepseek-v3"]
    cl = make_cluster("gb200", 256, dtype="fp8")
    res = search(ds, cl, 4096, Fixed(tp=1, pp=2, ep=64), top=30)
    mods = [p for p in res.plans if p.choice.recompute.startswith("selective:")]
    assert mods and {p.choice.recompute for p in mods} <= {"selective:moe_act", "selective:mla_up_proj,moe_act"}
    cap = DEFAULT_OPTIONS.capacity(cl)
    for p in mods:
        assert memory(ds, cl, replace(p.choice, recompute="none"))[0].total > cap
    dense = search(resolve_model("llama3-8b"), cl, 64, top=20)
    assert not any(p.choice.recompute.startswith("selective:") for p in dense.plans)


def test_chunked_attention_prices_the_chunks_work(tmp_path):
    """Llama 4's chunked attention (issue 12's twenty-ninth round): three layers in four attend within 8K-token chunks,
    the fourth over the whole sequence.  Up to the chunk nothing changes; past it the chunked layers' score work is
    q·c(c+1)/2 + r(r+1)/2 of the s(s+1)/2 causal pairs, the FLOPs counted are that work, the fused kernel runs at its
    share for the chunk's length, and a step costs less than the same model priced as full attention but more than the
    same tokens in chunk-long sequences; CP over chunks is refused by name; config.json's global layers are read."""
    from par3d.plan.compute import layer_flops, layer_times
    from par3d.plan.hardware import get_device
    from par3d.plan.models import ModelError, from_hf_config
    from par3d.plan.search import PlanError, search

    scout = resolve_model("llama4-scout")
    assert scout.attention_spans() == ((1.0, 1.0, 8192),) and scout.attn_keys == 8192
    long = replace(scout, seq_len=32768)
    (glob, w_g, span_g), (loc, w_l, span_l) = long.attention_spans()
    assert (glob, w_g, span_g) == (0.25, 1.0, 32768) and (loc, span_l) == (0.75, 8192)
    assert w_l == pytest.approx(4 * 8192 * 8193 / (32768 * 32769))  # four whole chunks
    odd = replace(scout, seq_len=20000)  # two chunks and a 3,616-token rest
    assert odd.attention_spans()[1][1] == pytest.approx((2 * 8192 * 8193 + 3616 * 3617) / (20000 * 20001))
    full = replace(long, attn_chunk=0, global_every=0)
    core_long, core_full = layer_flops(long, 1, 1)[1], layer_flops(full, 1, 1)[1]
    assert core_long / core_full == pytest.approx(0.25 + 0.75 * w_l, rel=1e-3)
    dev = get_device("h100-sxm")
    t_long, t_full = layer_times(long, dev, "bf16", 1, 1, flash=True), layer_times(full, dev, "bf16", 1, 1, flash=True)
    t_chunk = layer_times(scout, dev, "bf16", 4, 1, flash=True)  # the same 32K tokens as four 8K sequences
    assert t_chunk.core < t_long.core < t_full.core
    # without FlashAttention the eager softmax computes the whole masked matrix: priced as full attention
    assert layer_times(long, dev, "bf16", 1, 1).core == pytest.approx(layer_times(full, dev, "bf16", 1, 1).core)
    # every layer chunked: the core is four chunk-long sequences' (the same kernel share, the same pairs)
    all_local = replace(long, global_every=0)
    assert layer_times(all_local, dev, "bf16", 1, 1, flash=True).core == pytest.approx(t_chunk.core, rel=1e-3)
    cl = make_cluster("h100-sxm", 64)
    res = search(long, cl, 64)
    assert res.plans and all(p.choice.cp == 1 for p in res.plans)
    assert search(full, cl, 64).plans[0].step_time > res.plans[0].step_time
    with pytest.raises(PlanError, match="chunks of 8192"):
        search(long, cl, 64, Fixed(cp=2))
    # config.json: the global layers from layer_types (or no_rope_layers, or the interval); an irregular pattern is
    # refused by name
    base = {"model_type": "llama4_text", "attention_chunk_size": 8192, "hidden_size": 5120, "num_hidden_layers": 8,
            "num_attention_heads": 40, "num_key_value_heads": 8, "vocab_size": 202048, "intermediate_size": 8192,
            "intermediate_size_mlp": 16384, "num_local_experts": 16, "num_experts_per_tok": 1, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 1048576}
    path = tmp_path / "config.json"
    kinds = ["chunked_attention", "chunked_attention", "full_attention"] * 2 + ["chunked_attention"] * 2
    for extra, every in (({"layer_types": kinds}, 3), ({"no_rope_layers": [1, 0] * 4}, 2),
                         ({"nope_layer_interval": 8}, 8), ({}, 4)):
        path.write_text(json.dumps({**base, **extra}))
        assert from_hf_config(str(path)).global_every == every
    path.write_text(json.dumps({**base, "no_rope_layers": [1, 0, 0, 1, 1, 1, 1, 0]}))
    with pytest.raises(ModelError, match="not every k-th layer"):
        from_hf_config(str(path))


def test_alltoall_dispatcher_resorts_the_received_tokens(qwen, capsys):
    """Megatron-Core's alltoall dispatcher sorts the k·T copies a rank receives by local expert after the dispatch
    and back before the combine (token_dispatcher.py's "Permutation 2", only with more than one local expert): a read
    and a write of them each, 4·k·T·h bytes more in the forward's routing.  The flex dispatcher (DeepEP, HybridEP;
    what --ep-dispatch dedup implies) has no such pass, nor does one expert per rank or ep 1; instead it permutes the
    D·T rows a rank receives (one per destination rank, `compute.ep_destination_ranks`) where the alltoall dispatcher
    permutes its T own tokens: 2·(D - 1)·T·h bytes more than that (issue 12's fiftieth round)."""
    b, tok, h, k = 1, qwen.seq_len, qwen.hidden, qwen.top_k
    mb = compute.module_elementwise_bytes
    base = mb(qwen, b, 1, False, "bf16", 8)["route"]
    resort = mb(qwen, b, 1, False, "bf16", 8, "alltoall")["route"]
    assert resort - base == pytest.approx(4 * k * tok * h * 2)
    one_each = mb(qwen, b, 1, False, "bf16", 128, "alltoall")["route"]
    assert one_each == pytest.approx(mb(qwen, b, 1, False, "bf16", 128)["route"])
    d_rows = compute.ep_destination_ranks(qwen, 8)
    assert 1 < d_rows < k
    assert mb(qwen, b, 1, False, "bf16", 8, "flex")["route"] - base == pytest.approx(2 * (d_rows - 1) * tok * h * 2)
    assert mb(qwen, b, 1, False, "bf16", 1, "flex")["route"] == pytest.approx(mb(qwen, b, 1, False, "bf16", 1)["route"])
    cl = make_cluster("h100-sxm", 16, dtype="bf16")
    assert cl.dispatcher == "alltoall" and replace(cl, ep_dispatch="dedup").dispatcher == "flex"
    assert replace(cl, ep_dispatch="dedup", moe_dispatcher="alltoall").dispatcher == "alltoall"
    c = Choice(1, 1, 16, 1, 4, "1f1b", 1, "none", 1, False, 1, 1, 0, 8)
    a2a = stage_times(qwen, cl, c)
    flex = stage_times(qwen, replace(cl, moe_dispatcher="flex"), c)
    layer_gap = (4 * k * tok * h * 2 - 2 * (d_rows - 1) * tok * h * 2) / (cl.device.mem_bw * cl.device.mem_eff)
    assert a2a.f_compute[0] - flex.f_compute[0] == pytest.approx(qwen.layers * layer_gap, rel=1e-6)
    no_ep = replace(c, ep=1)
    assert stage_times(qwen, cl, no_ep).f == stage_times(qwen, replace(cl, moe_dispatcher="flex"), no_ep).f
    # the flag, in the JSON's cluster
    args = ["plan", *QWEN_FLAGS, "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "64", "--ep", "8", "--json"]
    for extra, want in (([], "alltoall"), (["--ep-dispatch", "dedup"], "flex"), (["--moe-dispatcher", "flex"], "flex")):
        assert main([*args, *extra]) == 0
        assert json.loads(capsys.readouterr().out)["hardware"]["moe_dispatcher"] == want


def test_expert_tensor_parallelism(qwen, capsys):
    """--etp (issue 12's thirty-second round; Megatron-Core's expert-tensor-parallel size, its alltoall dispatcher):
    each expert's fc1 column-split and fc2 row-split over etp ranks that compute every copy their experts receive --
    per rank the FLOPs and expert weights of EP = ep·etp, M etp times, the width 1/etp; the expert-data-parallel group
    tp·cp·dp/(ep·etp); per MoE layer an all-gather of the received copies (16-bit) and a reduce-scatter of the
    outputs (fp32) over the etp group each way, on top of the all-to-alls over ep ranks etp apart; the copies' fc1
    inputs etp times in memory.  ETP 1 is the model as before."""
    b, tok = 2, 2 * qwen.seq_len
    g1 = {g.name: g for g in compute.layer_gemms(qwen, b, 1, 8)}
    g4 = {g.name: g for g in compute.layer_gemms(qwen, b, 1, 8, etp=4)}
    assert g4["expert_in"].batch == 128 // 8 and g4["expert_in"].m == tok * 8 * 32 // 128
    assert (g4["expert_in"].n, g4["expert_out"].k) == (2 * 768 // 4, 768 // 4)
    assert compute.layer_flops(qwen, b, 1, 8, etp=4) == pytest.approx(compute.layer_flops(qwen, b, 1, 32))
    assert g4["expert_in"].flops == pytest.approx(g1["expert_in"].flops)
    cl = make_cluster("h100-sxm", 64, dtype="bf16")
    c = Choice(1, 1, 64, 1, 4, ep=8, etp=4, zero_stage=1)
    assert c.expert_shards == 32 and c.expert_dp == 2 and "etp=4" in c.label()
    f4, b4 = ep_exchange(qwen, cl, c)
    copies = qwen.seq_len * 8 * 2048
    a2a = comm.all_to_all(copies * 2.0, 8, cl, None, qwen.seq_len * 2048 * 2.0, stride=4).total
    etp = (comm.collective("all_gather", 2.0 * copies * 4, 4, 1, cl).total
           + comm.collective("reduce_scatter", 4.0 * copies * 4, 4, 1, cl).total)
    assert (f4, b4) == pytest.approx((2 * a2a + etp, 2 * a2a + etp)) and etp > 0
    assert ep_exchange(qwen, cl, replace(c, ep=1))[0] == pytest.approx(etp)  # ETP alone: no all-to-all
    m32, m4 = memory(qwen, cl, replace(c, ep=32, etp=1))[0], memory(qwen, cl, c)[0]
    assert m4.weights == pytest.approx(m32.weights) and m4.optimizer == pytest.approx(m32.optimizer)
    from par3d.plan.memory import layer_activation_bytes
    a1 = layer_activation_bytes(qwen, 1, 1, False, "none", "bf16")
    a4 = layer_activation_bytes(qwen, 1, 1, False, "none", "bf16", etp=4)
    assert a4 - a1 == pytest.approx(qwen.seq_len * 8 * 2.0 * 2048 * 3)  # the copies' fc1 inputs, 3 more sets
    res = search(qwen, cl, 256, Fixed(pp=1, tp=1, ep=8, etp=4, micro_batch=1), top=2)
    assert res.plans and all(p.choice.etp == 4 and p.choice.ep == 8 for p in res.plans)
    with pytest.raises(PlanError, match="--etp 5"):
        search(qwen, cl, 256, Fixed(etp=5))
    with pytest.raises(PlanError, match="--etp 2.*dense"):
        search(resolve_model("llama3-8b"), cl, 64, Fixed(etp=2))
    rc = main(["plan", *QWEN_FLAGS, "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "256", "--pp", "1",
               "--tp", "1", "--ep", "8", "--etp", "4", "--micro-batch", "1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["plans"][0]["etp"] == 4 and out["plans"][0]["ep"] == 8



def test_expert_tensor_parallelism_is_searched(capsys):
    """Without --etp the search tries etp 1 (Megatron-Bridge's recipes) and the layout's tp (Megatron-Core's default,
    search.etp_choices), each priced as the fixed flag prices it; --etp N keeps N alone.  Mixtral 8x22B at TP 8 with
    no expert parallelism (PP 4) fits only with its experts split over the TP ranks: 8 whole experts of 16,384 (~34 B
    parameters on a stage) on every rank do not."""
    from par3d.plan.search import etp_choices
    mixtral = resolve_model("mixtral-8x22b")
    assert etp_choices(mixtral, 8, Fixed()) == [1, 8] and etp_choices(mixtral, 1, Fixed()) == [1]
    assert etp_choices(mixtral, 8, Fixed(etp=2)) == [2] and etp_choices(resolve_model("llama3-8b"), 8, Fixed()) == [1]
    cl = make_cluster("h100-sxm", 64, dtype="bf16")
    fixed = Fixed(tp=8, pp=4, ep=1, cp=1, micro_batch=1, recompute="full", zero_stage=1)
    res = search(mixtral, cl, 64, fixed, top=3)
    assert res.plans and all(p.choice.etp == 8 and p.fits for p in res.plans)
    best = res.plans[0]
    assert evaluate(mixtral, cl, best.choice).step_time == pytest.approx(best.step_time)
    assert not search(mixtral, cl, 64, replace(fixed, etp=1), top=3).plans  # whole experts: nothing fits
    # unconstrained at TP 4: both sizes among the candidates, the table and --json name the winner's
    both = search(mixtral, cl, 64, Fixed(tp=4, pp=1, cp=1, micro_batch=1, recompute="full"), top=40)
    assert {p.choice.etp for p in both.plans} == {1, 4}
    assert main(["plan", "--model", "mixtral-8x22b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "64",
                 "--tp", "8", "--pp", "4", "--ep", "1", "--cp", "1", "--micro-batch", "1", "--recompute", "full",
                 "--zero-stage", "1"]) == 0
    text = capsys.readouterr().out
    assert "  ep etp" in text and "etp=8" in text

def test_moe_host_floor_is_the_longer_of_gpu_work_and_host_issue():
    """cp_ep_comm.moe_host_floor: a MoE layer waits for its host only where the host's issue time (hardware.MOE_HOST_S:
    fixed + per routed expert on the rank, a third forward, two thirds backward) exceeds its GPU work."""
    from dataclasses import replace

    from par3d.plan.cost import Choice
    from par3d.plan.cp_ep_comm import moe_host_floor
    from par3d.plan.hardware import MOE_HOST_S, make_cluster
    from par3d.plan.models import CATALOGUE

    q = CATALOGUE["qwen3-30b-a3b"]
    cl = replace(make_cluster("gb200", 8), moe_host_s=(4e-3, 0.5e-3))
    c = Choice(1, 1, 8, 1, 8, ep=8)  # 16 routed experts a rank: host 4 + 8 = 12 ms, 4 forward, 8 backward
    assert moe_host_floor(q, cl, c, 1e-3, 2e-3) == pytest.approx((3e-3, 6e-3))
    assert moe_host_floor(q, cl, c, 5e-3, 9e-3) == (0.0, 0.0)  # the GPU is the slower: nothing waits
    assert moe_host_floor(q, cl, replace(c, ep=4, dp=8), 1e-3, 2e-3)[0] == pytest.approx((4e-3 + 16e-3) / 3 - 1e-3)
    assert moe_host_floor(q, replace(cl, moe_host_s=(0.0, 0.0)), c, 1e-3, 2e-3) == (0.0, 0.0)  # whole-iteration graphs
    assert moe_host_floor(CATALOGUE["llama3-8b"], cl, Choice(1, 1, 8, 1, 8), 1e-3, 2e-3) == (0.0, 0.0)  # dense
    assert MOE_HOST_S[0] > 0 and MOE_HOST_S[1] > 0


def test_moe_host_floor_shows_in_the_step_and_its_breakdown():
    from dataclasses import replace

    from par3d.plan.cost import Choice, evaluate
    from par3d.plan.hardware import MOE_HOST_S, make_cluster
    from par3d.plan.models import CATALOGUE

    q = CATALOGUE["qwen3-30b-a3b"]
    c = Choice(1, 1, 8, 4, 16, ep=8, zero_stage=1)
    base = make_cluster("gb200", 8, dtype="fp8")
    free, floored = evaluate(q, base, c), evaluate(q, replace(base, moe_host_s=MOE_HOST_S), c)
    assert "host" not in free.breakdown and floored.breakdown["host"] > 0
    assert floored.step_time > free.step_time
    assert floored.step_time - free.step_time == pytest.approx(floored.breakdown["host"], rel=0.05)
    # a dense model never waits for it
    d = CATALOGUE["llama3-8b"]
    cd = Choice(1, 1, 8, 1, 16, zero_stage=1)
    assert evaluate(d, replace(base, moe_host_s=MOE_HOST_S), cd).step_time == evaluate(d, base, cd).step_time


def test_plan_report_shows_the_host_floor(capsys):
    """`par3d plan --cuda-graphs partial --explain` lists the floor in the breakdown that sums to the step."""
    from test_plan_cli import run

    argv = ["--model", "qwen3-30b-a3b", "--gpu", "gb200", "--gpus", "8", "--global-batch", "512", "--tp", "1",
            "--pp", "1", "--ep", "8", "--micro-batch", "4", "--zero-stage", "1", "--dtype", "fp8", "--recompute", "full"]
    rc, text, _ = run(capsys, *argv, "--cuda-graphs", "partial", "--explain")
    assert rc == 0
    rows = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines()
            if ln.startswith("  ") and len(ln.split()) == 4 and ln.split()[2] == "s" and ln.split()[3].endswith("%")}
    step = float(next(ln for ln in text.splitlines() if ln.startswith("best:")).split(": ")[2].split(" s/step")[0])
    assert rows["host"] > 0 and sum(rows.values()) == pytest.approx(step, rel=2e-3)
    assert "no MoE host floor" not in text
    rc, out, _ = run(capsys, *argv)
    assert rc == 0 and "no MoE host floor" in out and "--cuda-graphs partial|none" in out
    rc, out, _ = run(capsys, *argv, "--json")
    assert rc == 0 and "host" not in json.loads(out)["plans"][0]["breakdown_s"]  # default: whole iterations


def test_uneven_routing_scales_what_waits_on_the_busiest_rank(qwen):
    """`--moe-load F` (ModelSpec.route_load, issue 12's sixtieth round): the busiest EP rank's routed copies are F x
    the balanced share -- its grouped GEMMs' M, the four token exchanges, the routed copies' stored activations --
    while the router's GEMM, the attention and the model FLOPs (MFU's numerator) stay the balanced model's."""
    uneven = replace(qwen, route_load=1.5)
    assert uneven.routed_copies == 12.0 and uneven.balanced() == qwen and qwen.balanced() is qwen
    b, tp, ep = 1, 1, 8
    g0 = {g.name: g for g in compute.layer_gemms(qwen, b, tp, ep)}
    g1 = {g.name: g for g in compute.layer_gemms(uneven, b, tp, ep)}
    for name in ("expert_in", "expert_out"):
        assert g1[name].m == round(1.5 * g0[name].m)
    for name in ("qkv", "router", "attn_out"):
        assert g1[name] == g0[name]
    assert compute.model_flops_per_sequence(uneven) == compute.model_flops_per_sequence(qwen)
    cl = make_cluster("h100-sxm", 64)
    c = Choice(1, 1, 64, 1, 4, "1f1b", 1, "none", 1, False, 1, 1, 0, ep)
    e0, e1 = ep_exchange(qwen, cl, c), ep_exchange(uneven, cl, c)
    assert e1 == pytest.approx((1.5 * e0[0], 1.5 * e0[1]))
    m0, m1 = memory(qwen, cl, c)[0], memory(uneven, cl, c)[0]
    assert m1.activations > m0.activations and m1.weights == m0.weights
    p0, p1 = evaluate(qwen, cl, c), evaluate(uneven, cl, c)
    assert p1.step_time > p0.step_time
    # the same model FLOPs over a longer step
    assert p1.model_tflops_per_gpu == pytest.approx(p0.model_tflops_per_gpu * p0.step_time / p1.step_time)
    # without expert parallelism every rank computes every copy, whatever the routing: nothing waits (ep 1, also with
    # expert tensor parallelism), so the search does not hold uneven routing against ep = 1
    for c1 in (replace(c, ep=1), replace(c, tp=2, dp=32, ep=1, etp=2, sequence_parallel=True)):
        assert evaluate(uneven, cl, c1).step_time == evaluate(qwen, cl, c1).step_time
        assert memory(uneven, cl, c1)[0] == memory(qwen, cl, c1)[0]
        assert ep_exchange(uneven, cl, c1) == ep_exchange(qwen, cl, c1)


def test_moe_load_flag_and_its_refusals(capsys):
    """The flag reaches the plan and its JSON; a dense model, or a load below balanced, is refused by name with the
    rule and a fix, before anything is priced."""
    args = [*QWEN_FLAGS, "--gpu", "h100-sxm", "--gpus", "8", "--global-batch", "64", "--tp", "1", "--pp", "1"]
    assert main(["plan", *args, "--moe-load", "1.3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"]["moe_load"] == 1.3
    assert main(["plan", *args, "--moe-load", "0.8"]) == 2
    err = capsys.readouterr().err
    assert "--moe-load 0.8" in err and "between 1" in err
    assert main(["plan", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "64", "--moe-load", "1.2"]) == 2
    assert "--experts N" in capsys.readouterr().err


# The Megatron MoE model zoo's long-context table (yanring/Megatron-MoE-ModelZoo best_practice/qwen3/readme.md at
# e8650517, lines 35-38): Qwen3-235B-A22B on 32 H100 nodes, TP 4, PP 8, VPP 4, EP 8, DeepEP, BF16, selective
# recomputation of layernorm and moe; model TFLOP/s per GPU with the router forced to balance / dropless (a trained
# router on real data).  The forced-balance runs are validation rows (mcoremoe-qwen3-235b-a22b-h100-256-seq*).
ZOO_PAIRS = (("seq16k-tp4cp1pp8vpp4ep8", 295, 237), ("seq32k-tp4cp2pp8vpp4ep8", 335, 277),
             ("seq64k-tp4cp4pp8vpp4ep8", 368, 320), ("seq128k-tp4cp8pp8vpp4ep8", 389, 357))
ZOO_LOAD = 1.58  # the load at which each pair's slowdown is met, averaged over the four (in sample: docs §2)


def test_one_load_reproduces_the_model_zoos_dropless_slowdowns(monkeypatch):
    """In sample: with the busiest rank at 1.58 x the balanced load (fitted to these four pairs; docs/planner.md §2
    quotes each pair priced with the other three's load, held out, within 2.1 %), each pair's dropless/forced ratio --
    0.80 at 16K tokens, where the experts weigh most, to 0.92 at 128K, where attention does -- is met within 3 %: one
    load, not one per row, across a 2.4x spread of the slowdown."""
    from par3d.plan import validation as V

    rows = {r["name"]: r for r in V.rows()}
    orig = V.model_of
    for suffix, forced, dropless in ZOO_PAIRS:
        row = rows["mcoremoe-qwen3-235b-a22b-h100-256-" + suffix]
        balanced = V.predict(row).value
        monkeypatch.setattr(V, "model_of", lambda r: replace(orig(r), route_load=ZOO_LOAD))
        uneven = V.predict(row).value
        monkeypatch.setattr(V, "model_of", orig)
        assert uneven / balanced == pytest.approx(dropless / forced, rel=0.03), suffix
