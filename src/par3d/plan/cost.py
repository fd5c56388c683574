"""One configuration → memory per GPU, step time and its breakdown.

Step time (seed §4.5's decomposition, made exact by the simulator):
    step = makespan( schedule; per-stage F/B = compute + recompute + exposed TP communication,
                     transfer = PP point-to-point time )                  ← pipeline/simulate.py
         + DP tail (the part of the gradient reduction that backward cannot hide; ZeRO's gathers)
         + optimizer step (Adam is memory-bound: 28 B of HBM traffic per updated parameter).

Per stage and micro-batch (n layers, T = b·s tokens, t = TP degree):
    F = n·(t_layer + 2 TP all-reduces of T·h·2 B) [+ head GEMM on the last stage, + the embedding's
        all-reduce on the first]           (TP collectives are on the critical path: seed §4.2/§4.5)
    B = n·(2·t_layer + recompute + 2 all-reduces [+2 more when the forward is recomputed])
    with sequence parallelism the all-reduce becomes all-gather + reduce-scatter: same α-β cost.
    zb-h1 splits B into BI (input gradients, the TP collectives and the recompute) and BW (weights).
PP transfer = α + b·s·h·2 B/β per boundary (/t with SP: the activation is already sharded).
DP: a ring all-reduce of this rank's gradients (ZeRO-1/2: reduce-scatter, then an all-gather of the
updated bf16 weights after the optimizer).  The reduction overlaps the last micro-batch's backward
on the rank (gradients are final only then); at least one bucket (one layer's share) stays exposed.
(Hierarchical clusters time each bucket by the simulated schedule instead: see the overlap notes of parallel_comm.py and dp_tail.py.)
ZeRO-3 gathers the weights of each chunk before its F and B and reduce-scatters the gradients after
B, every micro-batch; the part longer than that compute is exposed.

The pieces: choice.py (the configuration), stage_layout.py (the pipeline layout and its in-flight activations),
parallel_comm.py (TP, DP and ZeRO communication), cp_ep_comm.py (context and expert parallelism's exchanges),
plan_memory.py (memory per GPU), dp_tail.py (the DP tail and the optimizer step).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from statistics import NormalDist

from par3d.pipeline.partition import gpt_round_split
from par3d.pipeline.schedules import sends_to

from . import comm
from .choice import DEFAULT_OPTIONS, Choice, Options, fsdp_unit_priced, recomputed_layers
from .compute import (
    DTYPE_BYTES,
    LayerTimes,
    layer_times,
    model_flops_per_sequence,
    recompute_flops_per_sequence,
    recompute_modules,
    recomputes_core,
)
from .cp_ep_comm import (
    A2A_OVERLAP_SCHEDULES,
    a2a_overlap_exposed,
    a2a_paired_share,
    blockwise_attention,
    choice_layer_times,
    cp_all_gather,
    cp_all_to_all,
    cp_exchange,
    cp_exchange_eager,
    ep_exchange,
    ep_exchanges,
    kv_block_bytes,
    moe_host_floor,
)
from .dp_tail import bf16_optimizer_accumulation, dp_tail, optimizer_time
from .hardware import TFLOPS, Cluster, mesh_share
from .memory import (
    ACT_BYTES,
    MemoryBreakdown,
    round_up_2g,
    v_head_share,
    weight_grad_share,
)
from .models import ModelSpec
from .parallel_comm import (
    _in_step,
    _zero3_exposed,
    _zero3_submodule_exposed,
    flat_sharded_reduce,
    fsdp2_copy_out,
    grad_bytes,
    grad_collective,
    links,
    sharded_grad_reduce,
    strides,
    tp_all_gather,
    tp_collective,
    tp_collective_small,
    tp_overlap_exposed,
    zero3_eager,
    zero3_layer_collectives,
    zero3_submodules,
)
from .plan_memory import memory, offload_exposed, stored_layer_bytes
from .profile import Profile, contention
from .replay import Marks, program, replay_marks
from .stage_layout import (
    SPLIT_BACKWARD,
    Layout,
    StageTimes,
    layout,
    mtp_forward,
    mtp_weight_gemms,
    rank_shapes,
    rank_stage_lists,
    stage_placement,
    validate_schedule,
)

# ---- per-stage durations -------------------------------------------------------------------------

def stage_times(model: ModelSpec, cluster: Cluster, c: Choice) -> StageTimes:
    dev, dtype = cluster.device, cluster.dtype
    lk = links(cluster, c)
    hier = cluster.hier
    lt = choice_layer_times(model, cluster, c)
    db = ACT_BYTES[dtype]
    s_local = model.seq_len // c.cp
    act = c.micro_batch * s_local * model.hidden * db  # one T×h activation of this rank, bytes
    # two all-reduces per layer (after attention, after the MLP): seed §4.2; SP: AG + RS, same cost.  A mixture of
    # experts' routed MLP has none (its experts are whole on each rank; its tokens move by the EP all-to-all):
    # one pair, the attention's, unless a shared expert (TP-split as a dense MLP) adds the second
    ar = tp_collective(cluster, c, act, lk.tp, gemm_input=True)
    # the pair's two halves under SP (userbuffers overlaps each on its own GEMM): the reduce-scatter in the activations'
    # dtype, the all-gather of a (possibly quantized) GEMM input
    rs_t = tp_collective(cluster, c, act, lk.tp) / 2
    ag_t = ar - rs_t

    def kind(m: ModelSpec) -> tuple[LayerTimes, float, float, float, float, float, float, float]:
        """One layer of model `m`'s kind: (layer times, TP forward, TP backward, recompute, the recompute's TP
        collectives, its EP all-to-alls, EP forward, EP backward)."""
        lt_m = choice_layer_times(m, cluster, c)
        pairs = 1 if m.moe and not m.shared_ffn else 2
        attn = ar  # the attention's pair
        if m.mla and c.sequence_parallel and c.tp > 1:
            # MLA under SP all-gathers the latents (Q's, or the hidden state without one, K/V's and the shared rotary
            # channels) for its up projections instead of the hidden state; the output's reduce-scatter is as before
            gathered = (m.q_lora or m.hidden) + m.kv_lora + m.rope_dim
            attn = tp_collective(cluster, c, act * (m.hidden + gathered) / (2 * m.hidden), lk.tp, gemm_input=True)
        tpf = tpb = attn + (pairs - 1) * ar  # one layer's TP time, forward (the backward's dgrad side moves the same)
        if cluster.tp_comm_overlap and c.sequence_parallel and c.tp > 1 and hier:
            tpf = tp_overlap_exposed(m, cluster, c, rs_t, gather=ag_t)
            tpb = tp_overlap_exposed(m, cluster, c, rs_t, forward=False, gather=ag_t)
        if (cluster.fp8_current or cluster.fp8_block == "nvfp4") and c.sequence_parallel and c.tp > 1:
            # current scaling (and NVFP4's per-tensor scale) of a sequence-parallel tensor needs the amax of the whole
            # tensor before its cast:
            # Transformer Engine all-reduces it over the TP group (the column-parallel inputs' quantizers,
            # `with_amax_reduction`, `amax_reduction_group = tp_group`; the row-parallel grad outputs likewise),
            # on the critical path: QKV and MLP-in inputs forward, the two row-parallel grad outputs backward
            amax = pairs * tp_collective_small(cluster, c)
            tpf, tpb = tpf + amax, tpb + amax
        epf_m, epb_m = ep_exchange(m, cluster, c)
        # (selective op saves the collectives' outputs; recomputing the forward dispatches its tokens again)
        full = c.recompute == "full"
        mods = recompute_modules(c.recompute)
        # Megatron-Core's named modules: a recomputed MLP (dense, or a mixture of experts' shared expert) repeats its
        # TP pair of collectives; a recomputed MoE block its dispatch and combine
        mlp_pair = ("mlp" in mods and not m.moe) or (m.moe and m.shared_ffn > 0 and mods & {"moe", "shared_experts"})
        rec_tp = tpf if full else (ar if mlp_pair else 0.0)
        rec_ep = epf_m if full or (m.moe and "moe" in mods) else 0.0
        return (lt_m, tpf, tpb, lt_m.recomputed(c.recompute), rec_tp, rec_ep, epf_m, epb_m)

    # a mixture of experts' layers, and its leading dense layers where it has them (models.ModelSpec.dense_layers)
    moe_kind = kind(model)
    lt, tp_layer, tp_layer_b, rec, rec_comm, rec_ep, epf, epb = moe_kind
    ltd, tpd, tpd_b, recd, recd_comm, _, _, _ = kind(model.dense_variant()) if model.dense_count else moe_kind
    # the head's loss: a vocab-parallel cross entropy's three small all-reduces (max, sum, target logit) or, with the
    # logits gathered to every TP rank (compute.loss_vocab), the all-gather of the bf16 vocabulary shards
    ce = (tp_all_gather(cluster, c, ACT_BYTES[dtype] * c.micro_batch * s_local * model.vocab, lk.tp)
          if cluster.cross_entropy == "gathered" else 3 * tp_collective(cluster, c, 4.0 * c.micro_batch * s_local, lk.tp))
    partitioned = cluster.p2p_partitioned and c.tp > 1 and c.pp > 1 and not c.sequence_parallel
    part_gather = tp_all_gather(cluster, c, act, lk.tp) if partitioned else 0.0
    prof = cluster.profile
    eager = prof is not None and not hier  # a calibrated host running par3d's eager runtime
    if c.cp > 1 and cluster.cp_comm == "all-gather":  # Llama 3: gather K/V, scatter dK/dV, exposed
        cpf, cpb = cp_all_gather(model, cluster, c)
    elif c.cp > 1 and cluster.cp_comm == "a2a":  # Ulysses: heads for sequence and back, exposed
        cpf, cpb = cp_all_to_all(model, cluster, c)
    elif eager and c.cp > 1:
        cpf, cpb = cp_exchange_eager(model, c, prof, lk.cp, dtype)  # type: ignore[arg-type]
    elif hier and c.cp > 1:  # the K/V hop between CP neighbours tp ranks apart
        kv = kv_block_bytes(model, c.micro_batch, c.tp, c.cp, dtype)
        cpf, cpb = cp_exchange(model, c, comm.send_recv(kv, c.tp, cluster, c.tp * c.cp), lt.core, dtype)
    else:
        cpf, cpb = cp_exchange(model, c, lk.cp, lt.core, dtype)
    # recomputing the forward (full) or the attention core (selective) repeats its K/V exchange (Ulysses' all-to-alls
    # sit outside the core: only the full recomputation repeats them)
    cpr = cpf if c.recompute == "full" or (recomputes_core(c.recompute) and cluster.cp_comm != "a2a") else 0.0
    lay = layout(model, c.pp * c.virtual_stages)
    shapes = rank_shapes(model, c.tp, c.pp, c.virtual_stages, c.schedule, c.expert_shards)
    rank_of = stage_placement(c.schedule, c.pp, c.virtual_stages)
    out = StageTimes([], [], [], [], [], [], [], [], [], 0.0)
    g = c.dp * c.cp  # ranks holding the same weights
    seen: dict[tuple, tuple[float, ...]] = {}  # stages alike (layers, embedding, head, chunk) cost alike
    rows: list[tuple[float, ...]] = []  # each stage's, in order
    z3_units: tuple[tuple[float, ...], ...] | None = None
    z3_pairs: dict[bool, tuple[float, float]] = {}  # ZeRO-3's per-layer gather and reduce, the same in every stage
    # the 1F1B A2A overlap pairs only the steady phase's layers, fewer on the early pipeline ranks: the four exchanges
    # once, their exposure at each rank's paired share
    ep_paired = (ep_exchanges(model, cluster, c) if cluster.ep_comm_overlap and model.moe
                 and c.schedule in A2A_OVERLAP_SCHEDULES else None)
    # the head's forward with multi-token prediction's: the same for every stage, priced once
    head_f = lt.head_fwd + mtp_forward(model, dev, cluster.gemm_dtype, c.micro_batch, c.tp, lt, c.cp)
    # and its weight-gradient GEMMs: a split backward's BW on the head's stage
    head_w = lt.head_gemm + mtp_weight_gemms(model, dev, cluster.gemm_dtype, c.micro_batch, c.tp, lt, c.cp)
    for s, n in enumerate(lay.layers):
        home = shapes[rank_of[s]]
        chunk_params = home.params / len(home.layers) if c.zero_stage >= 3 else 0.0
        nd = lay.dense_of(s)  # the stage's leading dense layers (a mixture of experts'), then n - nd MoE layers
        ov_share = a2a_paired_share(c, rank_of[s]) if ep_paired is not None else None
        key = (n, nd, lay.embed[s], lay.head[s], chunk_params, ov_share)
        row = seen.get(key)
        if row is not None:
            rows.append(row)
            continue
        nm = n - nd
        mtp = lay.head[s] and model.mtp_layers > 0  # multi-token prediction beside the loss (mtp_forward)
        fc = nm * lt.fwd + nd * ltd.fwd + (head_f if lay.head[s] else 0.0)
        acc = bf16_optimizer_accumulation(cluster, home.params / len(home.layers))  # into fp32 buffers, with dW
        bc = 2 * fc + acc
        nr = recomputed_layers(c, n)  # block method: the first nr layers (the dense ones first)
        rd = min(nd, nr)
        br = (nr - rd) * rec + rd * recd
        f_tp = nm * tp_layer + nd * tpd + (ar / 2 if lay.embed[s] else 0.0) + (ce if lay.head[s] else 0.0)
        b_tp = nm * tp_layer_b + nd * tpd_b + (nr - rd) * rec_comm + rd * recd_comm
        if partitioned:  # the input gathered in the forward; the output and its gradient gathered in the backward
            f_tp += part_gather if not lay.embed[s] else 0.0  # every stage but the first receives
            b_tp += 2 * part_gather if not lay.head[s] else 0.0  # every stage but the last sends
        f_cp, b_cp = n * cpf, n * cpb + nr * cpr
        epf_s, epb_s = (epf, epb) if ep_paired is None else a2a_overlap_exposed(lt, ep_paired, dev.sigma, ov_share)
        f_ep, b_ep = nm * epf_s, nm * epb_s + (nr - rd) * rec_ep
        if mtp:  # each module's layer: its TP collectives and its all-to-alls
            f_tp, b_tp = f_tp + model.mtp_layers * tp_layer, b_tp + model.mtp_layers * tp_layer_b
            f_ep, b_ep = f_ep + model.mtp_layers * epf, b_ep + model.mtp_layers * epb
            if c.recompute_layers == 0:  # recomputed as every layer is (memory.rank_memory stores its layer so)
                br += model.mtp_layers * rec
                b_tp, b_ep = b_tp + model.mtp_layers * rec_comm, b_ep + model.mtp_layers * rec_ep
        z3f = z3b = 0.0
        if c.zero_stage >= 3 and g > 1 and hier and cluster.zero3_unit == "submodule":
            if z3_units is None:  # the same sub-modules in every stage
                comp, w = zero3_submodules(model, dev, cluster.gemm_dtype, c.micro_batch, c.tp, c.cp, lt)
                z3_units = (comp, tuple(grad_collective(cluster, c, "all_gather", 2.0 * e, per_gpu_nic=True,
                                                        group="shard") for e in w),
                            tuple(sharded_grad_reduce(cluster, c, grad_bytes(cluster) * e, per_gpu_nic=True)
                                  for e in w))
            z3f, z3b = _zero3_submodule_exposed(n, *z3_units, ar, rec_comm, c.recompute, lt.core, dev.sigma)
        elif c.zero_stage >= 3 and g > 1 and hier:
            # FSDP-style units ride the node's NICs like any collective (llm-foundry's FSDP runs, docs §5); a mixture
            # of experts' layer gathers its dense part over the dp x cp ranks and its E/ep routed experts over the
            # ranks holding the same experts (none where ep spans them all), per layer of each kind
            ag, rs = zero3_layer_collectives(model, cluster, c, nm, nd, z3_pairs)
            if cluster.fsdp and c.pp > 1:
                # PyTorch's pipeline stages run FSDP2 without resharding or reducing between micro-batches
                # (torch.distributed.pipelining's backward_maybe_with_nosync: set_reshard_after_backward(False),
                # set_requires_gradient_sync(False), the post-backward run by hand after the last), so a stage gathers
                # its weights and reduce-scatters its gradients once a step: spread here over the m micro-batches
                ag, rs = ag / c.microbatches, rs / c.microbatches
            if nr == n:
                b_layer = 2 * lt.fwd + rec + 2 * ar + rec_comm
            else:  # a layer's recompute averaged over the chunk (block method: its first nr layers)
                b_layer = 2 * lt.fwd + nr / n * (rec + rec_comm) + 2 * ar
            z3f, z3b = _zero3_exposed(n, lt.fwd + 2 * ar, b_layer, ag, rs, dev.sigma)
            # FSDP2 copies each gathered layer out of its flat buffer on the compute stream: after the forward's gather
            # and the backward's re-gather, or (pipeline stages, weights kept gathered) once a step
            copy = n * fsdp2_copy_out(model, cluster, c, nm, nd)
            if cluster.fsdp and c.pp > 1:
                z3f += copy / c.microbatches
            else:
                z3f, z3b = z3f + copy, z3b + copy
        elif c.zero_stage >= 3 and g > 1 and eager:
            z3f, z3b = zero3_eager(model, c, prof, lk.grad, dtype, n, lay.embed[s], lay.head[s])  # type: ignore[arg-type]
        elif c.zero_stage >= 3 and g > 1:  # the seed's model: gathers hide behind the chunk's compute
            ag = comm.all_gather(2.0 * chunk_params, c.zero_shards, lk.grad).total  # type: ignore[arg-type]
            rs = flat_sharded_reduce(c, grad_bytes(cluster) * chunk_params, lk.grad)
            z3f = max(0.0, ag - fc)
            z3b = max(0.0, ag + rs - bc - br)
        if fsdp_unit_priced(cluster, c):  # FSDP's unit cost: a forward hook, two backward
            unit = n * cluster.fsdp_unit_s
            z3f, z3b = z3f + unit / 3, z3b + 2 * unit / 3
        # activation offloading (no pipeline: the one stage holds every layer)
        off_f, off_b = offload_exposed(model, cluster, c, lt.fwd + tp_layer, 2 * lt.fwd + tp_layer_b)
        # a MoE layer waits for its host where the host issues its kernels slower than the GPU runs them
        hf, hb = moe_host_floor(model, cluster, c, lt.fwd + tp_layer + cpf + epf_s,
                                2 * lt.fwd + (nr - rd) / max(1, nm) * (rec + rec_comm + rec_ep) + tp_layer_b + cpb + epb_s)
        hf, hb = nm * hf, nm * hb
        f = fc + f_tp + f_cp + z3f + off_f + f_ep + hf
        b = bc + br + b_tp + b_cp + z3b + off_b + b_ep + hb
        # (f, b, bi, bw, f_compute, b_compute, b_recompute, tp_comm, cp_comm, zero3, offload, ep_comm, host).  A split
        # backward (zb-h1, zb-v, dualpipe-v): BW = the weight-gradient GEMMs alone, one per forward GEMM of the chunk's
        # layers, head and multi-token-prediction modules, each the size of its forward GEMM, with DeepSpeed's BF16
        # accumulation into fp32 buffers that follows them; BI = the rest of B (input-gradient GEMMs, the attention
        # core's, norms', activations' and residuals' backward, the loss, recompute, TP/CP/EP collectives), which the
        # previous stage waits for (issue 12's sixty-third round)
        wg = nm * lt.weight_gemms + nd * ltd.weight_gemms + (head_w if lay.head[s] else 0.0) + acc
        row = seen[key] = (f, b, bc - wg + br + b_tp + b_cp + z3b + off_b + b_ep + hb, wg, fc, bc, br, f_tp + b_tp,
                           f_cp + b_cp, z3f + z3b, off_f + off_b, f_ep + b_ep, hf + hb)
        rows.append(row)
    # the rows into StageTimes' per-stage lists, column by column
    for lst, col in zip((out.f, out.b, out.bi, out.bw, out.f_compute, out.b_compute, out.b_recompute, out.tp_comm,
                         out.cp_comm, out.zero3, out.offload, out.ep_comm, out.host), zip(*rows)):
        lst.extend(col)
    # a sequence-parallel boundary is the rank's 1/tp slice; so is DeepSpeed's pipeline engine's at TP > 1, rebuilt
    # with an all-gather over TP (`Cluster.p2p_partitioned`; the gathers are in the stages' TP time above)
    boundary = act / (c.tp if c.sequence_parallel or partitioned else 1)
    if c.pp <= 1:
        out.transfer = 0.0
    elif hier:
        out.transfer = comm.send_recv(boundary, strides(c)[2], cluster, c.tp * c.cp * c.pp).total
    else:
        out.transfer = comm.p2p(boundary, lk.pp).total  # type: ignore[arg-type]
    out.blocking = c.pp > 1 and p2p_blocks(cluster.p2p_blocking, c)
    if c.schedule == "zb-v":
        flash = blockwise_attention(cluster, c)
        # the shares in one layer's stored bytes as the memory count holds them (block recomputation: the chunk's mean)
        layer = stored_layer_bytes(model.at_ep(c.ep), c.micro_batch, c.tp, c.sequence_parallel, c.recompute,
                                   cluster.precision, c.cp, flash, c.pp * c.virtual_stages, c.recompute_layers, c.etp)
        out.held = weight_grad_share(model, c.micro_batch, c.tp, c.sequence_parallel, c.recompute, cluster.precision, c.cp,
                                     flash, c.etp, c.ep, layer)
        # the head's chunk keeps the output layer's (x, dy) too, in the forwards of a mean chunk (the cap's unit)
        out.head_held = v_head_share(model, c.micro_batch, c.tp, c.sequence_parallel, c.recompute, cluster.precision,
                                     c.cp, flash, c.etp, c.ep, lay.layers[-1], sum(lay.layers) / len(lay.layers), layer)
    if cluster.profile is not None:
        _add_runtime_costs(out, model, cluster.dtype, c, lay, boundary, cluster.profile)
    return out


def p2p_blocks(mode: str, c: Choice) -> bool:
    """Whether the pipeline's sends hold their rank under the framework's `Cluster.p2p_blocking` mode: "none"
    (par3d's runtime posts its sends and waits at the step's end), "all" (every schedule: DeepSpeed's pipeline
    engine's plain send/recv; Megatron-LM before `overlap_p2p_comm`, 2021-22, whose p2p waits and synchronises
    after each batched call), "1f1b" (Megatron-Core: its non-interleaved 1F1B waits on every call at every
    version, its interleaved schedule posts them beside the next chunk with `overlap_p2p_comm`, Megatron-LM's
    default since core_v0.4.0 and what NeMo's and Megatron-Bridge's recipes set; every other par3d schedule is
    not Megatron's and posts).  The facts and their sources: docs/planner.md §5."""
    if mode == "all":
        return True
    return mode == "1f1b" and c.schedule == "1f1b"


def _add_runtime_costs(st: StageTimes, model: ModelSpec, dtype: str, c: Choice, lay: Layout, boundary: float,
                       prof: Profile) -> None:
    """The profile's per-action terms (plan/profile.py): the arithmetic from measured primitives
    (plan/kernels.py) in place of the roofline, fixed costs per block and per action, the eager
    runtime's zero-bubble weight pass, the pipeline transport."""
    st.waits = {"f": [f - fc for f, fc in zip(st.f, st.f_compute)],
                "b": [b - bc - br for b, bc, br in zip(st.b, st.b_compute, st.b_recompute)],
                # BI's own compute is the backward's less its weight GEMMs (BW)
                "bi": [bi - (bc - bw) - br for bi, bc, bw, br in zip(st.bi, st.b_compute, st.bw, st.b_recompute)],
                "bw": [0.0] * len(st.f)}
    kern = prof.kernels
    if kern is not None and kern.dtype == dtype:
        sp, s_loc = c.sequence_parallel, model.seq_len // c.cp  # a CP rank's tokens: s/cp per sequence
        blk = kern.block(model.hidden, model.ffn, model.heads, s_loc, c.micro_batch, c.tp, sp, c.cp)
        emb = kern.embedding(model.hidden, s_loc, c.micro_batch, c.tp, sp)
        head = kern.head(model.hidden, model.vocab, s_loc, c.micro_batch, c.tp, sp)
        rec = blk.fwd if c.recompute == "full" else (blk.core_fwd if recomputes_core(c.recompute) else 0.0)
        k = prof.solo  # the primitives inside a model's step, not timed one by one (plan/profile.py)
        for s, n in enumerate(lay.layers):
            fc = k * (n * blk.fwd + (emb[0] if lay.embed[s] else 0.0) + (head[0] if lay.head[s] else 0.0))
            bc = k * (n * blk.bwd + (emb[1] if lay.embed[s] else 0.0) + (head[1] if lay.head[s] else 0.0))
            br = k * n * rec
            st.f[s] = fc + st.waits["f"][s]
            st.b[s] = bc + br + st.waits["b"][s]
            # the measured backward is not split into input and weight gradients: half each, as the
            # roofline's GEMMs are
            st.bi[s] = bc / 2 + br + st.waits["bi"][s]
            st.bw[s] = bc / 2
            st.f_compute[s], st.b_compute[s], st.b_recompute[s] = fc, bc, br
    ov = prof.overheads
    rec_f = 1.0 if c.recompute == "full" else 0.0  # full recompute reruns the blocks' forward
    for s, n in enumerate(lay.layers):
        f_fix = ov.action_f_s + n * ov.layer_f_s
        b_fix = ov.action_b_s + n * (ov.layer_b_s + rec_f * ov.layer_f_s)
        bi_fix = bw_fix = b_fix  # BI and BW are each one autograd pass: each pays B's fixed cost
        if prof.asynchronous:
            # a GPU runs the kernels while the host issues the next ones (CUDA streams): a pass takes the
            # longer of the two, not their sum, so the host's cost shows only where it exceeds the GPU's work
            f_fix = max(0.0, f_fix - st.f_compute[s])
            bi_fix = max(0.0, b_fix - (st.b_compute[s] - st.bw[s]) - st.b_recompute[s])  # BI's GPU work: B's less BW
            bw_fix = max(0.0, b_fix - st.bw[s])
            b_fix = max(0.0, b_fix - st.b_compute[s] - st.b_recompute[s])
        st.f[s] += f_fix
        st.b[s] += b_fix
        st.fixed_f.append(f_fix)
        st.fixed_b.append(b_fix)
        st.bi[s] += bi_fix
        if prof.bw_full_backward:
            # eager zero-bubble: the weight gradients need every layer's activation gradient, which
            # BI did not keep, so BW redoes BI's chain (and its TP collectives): a whole B
            st.bw[s] = st.b[s]
            st.waits["bw"][s] = st.waits["b"][s]
        else:
            st.bw[s] += bw_fix
    if c.pp > 1:
        if prof.p2p is not None:  # the measured transport between pipeline ranks
            st.transfer = comm.p2p(boundary, prof.p2p).total
        st.transfer += prof.hop


def sync_points(c: Choice, n: int, embed: bool, head: bool) -> tuple[int, int, int, int]:
    """Points per micro-batch where a stage of n blocks meets its TP partners (forward, backward)
    and its CP ring neighbours (forward, backward), as the eager runtime calls them: 2 TP
    all-reduces per block each way (2 more backward with full recompute), the embedding's, the
    vocab-parallel loss's 3; cp − 1 K/V exchanges forward per block, 2cp − 1 backward, cp − 1 more
    when the recompute repeats the attention."""
    tf = tb = cf = cb = 0
    if c.tp > 1:
        tf = 2 * n + (1 if embed else 0) + (3 if head else 0)
        tb = 2 * n + (2 * n if c.recompute == "full" else 0)
    if c.cp > 1:
        cf = n * (c.cp - 1)
        cb = n * (2 * c.cp - 1 + (c.cp - 1 if c.recompute == "full" or recomputes_core(c.recompute) else 0))
    return tf, tb, cf, cb


def computing_ranks(st: StageTimes, c: Choice, makespan: float, busy: list[float]) -> float:
    """How many ranks compute at any moment on average: each pipeline rank's busy time in the
    schedule's own simulation less its collective waits, over the makespan, times the ranks of
    each stage (a rank in the pipeline bubble or waiting for its partners leaves its core)."""
    kinds = ("f", "bi", "bw") if c.schedule in SPLIT_BACKWARD else ("f", "b")
    waiting = c.microbatches * sum(sum(st.waits[k]) for k in kinds)  # every stage runs each kind m times
    if makespan <= 0:
        return float(c.gpus)
    return c.dp * c.cp * c.tp * max(0.0, sum(busy) - waiting) / makespan


def with_point_sync(st: StageTimes, model: ModelSpec, c: Choice, prof: Profile, ranks_per_core: float) -> StageTimes:
    """The stage durations with the in-step cost of the TP / CP synchronisation points
    (`Profile.point_sync`, measured by `par3d calibrate` at one and two ranks per core; a copy):
    per point a fixed latency, and a skew in proportion to the CPU work between points — summed
    over a pass, skew × the pass's CPU work, whatever the number of points.  Read at
    `ranks_per_core` (`point_sync_load`).  Unlike a collective's α-β (a rank blocked in the
    backend leaves its core: `StageTimes.waits`), a rank waiting at a point keeps its core —
    the backend polls for the partner — so with more ranks than cores the wait is time-shared
    like compute (`_contended`); that is what makes TP beside DP or CP on an oversubscribed host
    slow, and why the calibration measures the points there too."""
    lat, skew = prof.point_sync.at(ranks_per_core)  # type: ignore[union-attr]
    lay = layout(model, c.pp * c.virtual_stages)
    st = replace(st, f=list(st.f), b=list(st.b), bi=list(st.bi), tp_comm=list(st.tp_comm), cp_comm=list(st.cp_comm))
    for s, n in enumerate(lay.layers):
        tf, tb, cf, cb = sync_points(c, n, lay.embed[s], lay.head[s])
        wf = (tf + cf) * lat + skew * (st.f[s] - st.waits["f"][s])
        wb = (tb + cb) * lat + skew * (st.b[s] - st.waits["b"][s])
        # BI holds the backward's collectives (BW, the weight GEMMs, meets no partner)
        wbi = (tb + cb) * lat + skew * (st.bi[s] - st.waits["bi"][s])
        st.f[s] += wf
        st.b[s] += wb
        st.bi[s] += wbi
        tp_share = (tf + tb) / max(1, tf + tb + cf + cb)  # the breakdown: TP's points and CP's
        st.tp_comm[s] += tp_share * (wf + wb)
        st.cp_comm[s] += (1 - tp_share) * (wf + wb)
    return st


def point_sync_load(st: StageTimes, c: Choice, prof: Profile, makespan: float, busy: list[float]) -> float:
    """Ranks per core at which a layout's sync points are priced: the ranks inside an action
    (computing or meeting their partners; not in the pipeline bubble) on average, over the host's
    cores — 1 for TP over as many ranks as cores, 2 beside a second such group."""
    if not prof.cores or makespan <= 0:
        return 1.0
    return c.dp * c.cp * c.tp * sum(busy) / makespan / prof.cores


def durations_of(st: StageTimes, schedule: str) -> dict[tuple[int, str], float]:
    d: dict[tuple[int, str], float] = {}
    for s in range(len(st.f)):
        d[(s, "F")] = st.f[s]
        d[(s, "B")] = st.b[s]
        if schedule in SPLIT_BACKWARD:
            d[(s, "BI")] = st.bi[s]
            d[(s, "BW")] = st.bw[s]
    return d


def rank_busy(st: StageTimes, c: Choice) -> list[float]:
    """Per rank, m x (F + B) of its stages (BI + BW >= B: a lower bound for split backwards)."""
    m = c.microbatches
    return [m * sum(st.f[s] + st.b[s] for s in stages)
            for stages in rank_stage_lists(c.schedule, c.pp, c.virtual_stages)]


def makespan_lower_bound(st: StageTimes, c: Choice, busy: list[float] | None = None) -> float:
    """A valid lower bound on the simulated makespan (used to prune before simulating).

    Rank r cannot start before micro-batch 0 has gone forward through the stages below its
    lowest one, s_r (r on both placements), must then do its own work, and (except for the split
    backwards, whose last actions may be weight gradients) its last backward must still flow back
    through stages s_r-1..0.  Transfers count where consecutive stages sit on two ranks.  Tight for
    GPipe/1F1B with equal stages.  `busy`: `rank_busy(st, c)` where the caller has it already.
    """
    busy = rank_busy(st, c) if busy is None else busy
    lists = rank_stage_lists(c.schedule, c.pp, c.virtual_stages)
    rank_of = stage_placement(c.schedule, c.pp, c.virtual_stages)
    tail = c.schedule not in SPLIT_BACKWARD
    lows = [stages[0] for stages in lists]
    before: list[tuple[float, float]] = []  # before stage s: forwards, backwards through stages < s
    pre_f = pre_b = 0.0
    for s in range(max(lows) + 1):
        before.append((pre_f, pre_b))
        hop = st.transfer if rank_of[s] != rank_of[s + 1 if s + 1 < len(rank_of) else s] else 0.0
        pre_f += st.f[s] + hop
        pre_b += st.b[s] + hop
    best = 0.0
    for r, s_r in enumerate(lows):
        f, b = before[s_r]
        best = max(best, f + busy[r] + (b if tail else 0.0))
    return best


# ---- the simulation, cached ----------------------------------------------------------------------

def zbv_times(st: StageTimes, c: Choice) -> tuple[float, ...] | None:
    """The (F, BI, BW) of one chunk a ZB-V schedule is built with (`schedules.zero_bubble_v`), or None for every
    other schedule.  ZB-V orders its actions by simulating them, so its order depends on those times; the Zero
    Bubble authors' runtime (sail-sg/zero-bubble-pipeline-parallelism, megatron/training.py, the V scheduler)
    profiles each stage's F, B and W, averages each over the stage's chunks and builds the schedule with the middle
    value across stages (the upper median).  The plan prices what that runtime runs: each rank's chunk times
    averaged, the upper median over ranks, as ratios to F rounded to two significant digits (near-equal
    candidates share one built order).  `par3d train` builds it with equal times unless given others
    (docs/pipeline.md); with times far from equal the equal-time order idles every rank (issue 12's forty-second
    round).  A fourth number, where below 1, is the share of a chunk's activations its BI keeps for its BW
    (`StageTimes.held`), rounded up to two significant digits: the V's memory cap counts it (issue 12's sixty-fifth
    round).  A fifth, where it differs from the fourth, is the head chunk's (`StageTimes.head_held`, rounded up
    alike): its BI keeps the output layer's input and the logits' gradient as well (issue 12's sixty-sixth round)."""
    if c.schedule != "zb-v":
        return None
    lists = rank_stage_lists(c.schedule, c.pp, c.virtual_stages)

    def mid(xs: list[float]) -> float:
        per = sorted(sum(xs[s] for s in stages) / len(stages) for stages in lists)
        return per[len(per) // 2]

    f, bi, bw = mid(st.f), mid(st.bi), mid(st.bw)
    if f <= 0 or bi <= 0 or bw <= 0:
        return None
    times = (1.0, float(f"{bi / f:.2g}"), float(f"{bw / f:.2g}"))
    # rounded up, not to nearest: the cap then counts at least the share the memory model keeps, so its 2p chunks'
    # worth stays a bound on the bytes (0.4324 -> 0.44, not 0.43)
    held = min(1.0, round_up_2g(st.held))
    head = round_up_2g(st.head_held)
    if head != held:
        return times + (held, head)
    return times + (held,) if held < 1.0 else times


_SIM_CACHE: dict[tuple, tuple[float, float, tuple[float, ...], Marks]] = {}


def _simulated(st: StageTimes, c: Choice) -> tuple[float, tuple[float, float, tuple[float, ...], Marks]]:
    """The cached replay (normalised) and its scale.

    Cached on (schedule, p, m, v, durations normalised by their maximum and rounded to 6 significant
    digits): a makespan, and every start and end, scale linearly when all durations and the transfer
    time do.
    """
    dur = durations_of(st, c.schedule)
    scale = max(dur.values()) or 1.0
    times = zbv_times(st, c)
    key = (c.schedule, c.pp, c.microbatches, c.virtual_stages,
           tuple(sorted((k, float(f"{val / scale:.6g}")) for k, val in dur.items())),
           float(f"{st.transfer / scale:.6g}"), times, st.blocking)
    hit = _SIM_CACHE.get(key)
    if hit is None:
        # the simulator's numbers, bit for bit, without building its events (plan/replay.py)
        ms, bubble_wall, busy, marks = replay_marks(program(c.schedule, c.pp, c.microbatches, c.virtual_stages,
                                                            times), dur, st.transfer, st.blocking)
        hit = (ms / scale, bubble_wall, tuple(b / scale for b in busy), marks.scaled(1.0 / scale))
        _SIM_CACHE[key] = hit
    return scale, hit


def simulate_stages(st: StageTimes, c: Choice) -> tuple[float, float, list[float]]:
    """(makespan, bubble_wall, busy per rank) of pipeline/simulate.py's recurrence (cached)."""
    return simulate_with_marks(st, c)[:3]


def simulate_with_marks(st: StageTimes, c: Choice) -> tuple[float, float, list[float], Marks]:
    """`simulate_stages`' three numbers and, from the same cached replay, the per-stage `Marks`: when each
    stage's weights are first needed and its gradients final."""
    scale, hit = _simulated(st, c)
    return hit[0] * scale, hit[1], [b * scale for b in hit[2]], hit[3].scaled(scale)


def schedule_marks(st: StageTimes, c: Choice) -> tuple[float, Marks]:
    """(makespan, per-stage `Marks`): what `dp_tail` reads."""
    makespan, _, _, marks = simulate_with_marks(st, c)
    return makespan, marks


# ---- the full evaluation -------------------------------------------------------------------------

@dataclass
class Plan:
    choice: Choice
    memory: MemoryBreakdown
    memory_rank: int
    fits: bool
    step_time: float
    breakdown: dict[str, float]
    bubble_fraction: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    days_to_train: float
    simulated: bool = True
    extra: dict[str, float] = field(default_factory=dict)
    # the layers of each pipeline chunk where the plan is priced at the round-wise cut rather than the model's own
    # (`round_split`; what --pipeline-layout takes); () where it is priced at the model's own cut (`layout`)
    pipeline_layout: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, object]:
        c = self.choice
        return {
            "tp": c.tp, "cp": c.cp, "pp": c.pp, "dp": c.dp, "micro_batch": c.micro_batch, "microbatches": c.microbatches,
            "schedule": c.schedule, "virtual_stages": c.virtual_stages,
            "stage_ranks": list(stage_placement(c.schedule, c.pp, c.virtual_stages)), "recompute": c.recompute,
            "recompute_layers": c.recompute_layers,
            "zero_stage": c.zero_stage, "dp_replicate": c.dp_replicate, "sequence_parallel": c.sequence_parallel,
            "ep": c.ep, "etp": c.etp, "fits": self.fits,
            "memory_gib": self.memory.gib(), "memory_rank": self.memory_rank,
            "step_time_s": self.step_time,
            "breakdown_s": {k: self.breakdown[k] for k in
                            ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "bubble",
                             "optimizer", "stragglers", "overhead", "offload", "host") if k in self.breakdown},
            "tokens_per_s": self.tokens_per_s, "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu, "mfu": self.mfu,
            "bubble_fraction": self.bubble_fraction, "days_to_train": self.days_to_train,
            # zb-v: the chunk times F : BI : BW its order was built with (zbv_times; par3d simulate --tf --tb --tw)
            **({"zbv_times": list(self.extra["zbv_times"])} if "zbv_times" in self.extra else {}),
        }


def _contended(st: StageTimes, c: Choice, prof: Profile, makespan: float,
               busy: list[float]) -> tuple[StageTimes, float, float]:
    """The stage durations slowed by the host's cores (a copy; `st` may be cached by the search).

    Ranks share the cores only while they compute: a rank waiting in the pipeline bubble, or for
    its partners inside a TP collective, leaves its core to the others.  So the slowdown follows the
    average number of computing ranks, read off the schedule's own simulation (busy time less the
    collective waits, over the makespan, times the ranks of each stage).  The fixed costs inside each
    action slow by their own factor (`contention(..., fixed=True)`); returns both factors."""
    world = c.gpus
    n = computing_ranks(st, c, makespan, busy)
    slow, slow_fx = contention(prof, world, n), contention(prof, world, n, fixed=True)
    if slow == 1.0 and slow_fx == 1.0:
        return st, slow, slow_fx

    def scaled(kind: str, lst: list[float]) -> list[float]:
        fx = (st.fixed_f if kind == "f" else st.fixed_b) or [0.0] * len(lst)
        return [slow * (t - w - x) + slow_fx * x + w for t, w, x in zip(lst, st.waits[kind], fx, strict=True)]

    return replace(st, f=scaled("f", st.f), b=scaled("b", st.b), bi=scaled("bi", st.bi),
                   bw=scaled("bw", st.bw)), slow, slow_fx


@lru_cache(maxsize=1024)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals], by Blom's (1958) plotting position
    Φ⁻¹((n − 0.375)/(n + 0.25)) (within 0.026 of the exact value, the most at n = 2; 0 for n = 1)."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def straggler_factor(cv: float, gpus: int) -> float:
    """How much longer a synchronous step over `gpus` GPUs takes than one GPU's mean step when the
    GPUs' step times spread with coefficient of variation `cv`: every step waits at its collectives for
    the slowest GPU, whose expected lag is cv · E[max of n standard normals] (docs/planner.md §6)."""
    return 1.0 + cv * expected_max_normal(gpus) if cv > 0 else 1.0


def round_split(model: ModelSpec, c: Choice) -> tuple[int, ...] | None:
    """The round-wise cut (partition.gpt_round_split) of a choice with several chunks a rank (v > 1) of a model cut by
    par3d's own partition, where it differs from that one; None otherwise (v = 1, a layout given, Megatron-Core's
    split, more chunks than layers)."""
    if c.virtual_stages <= 1 or model.pipeline_split or model.partition != "balanced":
        return None
    split = gpt_round_split(model.layers, c.pp * c.virtual_stages, c.pp, model.hidden, model.seq_len, model.vocab,
                            model.ffn_hidden, model.mtp_layers)
    return None if split is None or split == layout(model, c.pp * c.virtual_stages).layers else split


def evaluate(model: ModelSpec, cluster: Cluster, c: Choice, train_tokens: float = 300e9,
             st: StageTimes | None = None, mem: tuple[MemoryBreakdown, int] | None = None,
             opts: Options | None = None, validate: bool = True) -> Plan:
    """Memory and simulated step time of one configuration; it fits when the heaviest rank leaves
    `opts.memory_headroom` of the GPU free.  `validate` runs the schedule checker (the search runs
    it on the plans it reports only).

    With several chunks a rank (v > 1) and par3d's own partition, the choice is priced at both cuts -- the
    chunk-optimal one (`layout`) and the round-wise one (`round_split`) -- and the faster that fits (or the faster,
    where neither fits) is returned, its cut in `Plan.pipeline_layout`: neither is always faster, and the stage model
    is what tells them apart.  `st` and `mem`, where given, are the model's own cut's."""
    plan = _evaluate_at(model, cluster, c, train_tokens, st, mem, opts, validate)
    split = round_split(model, c)
    if split is None:
        return plan
    other = _evaluate_at(replace(model, pipeline_split=split), cluster, c, train_tokens, None, None, opts, False)
    if other.step_time < plan.step_time and (other.fits or not plan.fits):
        return replace(other, pipeline_layout=split)
    return plan


def _evaluate_at(model: ModelSpec, cluster: Cluster, c: Choice, train_tokens: float = 300e9,
                 st: StageTimes | None = None, mem: tuple[MemoryBreakdown, int] | None = None,
                 opts: Options | None = None, validate: bool = True) -> Plan:
    """`evaluate` at the model's own cut (`layout`)."""
    opts = opts or DEFAULT_OPTIONS
    st = st or stage_times(model, cluster, c)
    mem_b, mem_r = mem or memory(model, cluster, c, opts)
    makespan, bubble_wall, busy, marks = simulate_with_marks(st, c)
    if c.pp > 1 and validate:
        validate_schedule(c.schedule, c.pp, c.microbatches, c.virtual_stages)
    prof = cluster.profile
    slow = slow_fx = 1.0
    overhead = 0.0
    if prof is not None:
        if prof.point_sync is not None and (c.tp > 1 or c.cp > 1) and not cluster.hier:
            st = with_point_sync(st, model, c, prof, point_sync_load(st, c, prof, makespan, busy))
            makespan, bubble_wall, busy, marks = simulate_with_marks(st, c)
        st, slow, slow_fx = _contended(st, c, prof, makespan, busy)
        if slow != 1.0 or slow_fx != 1.0:
            makespan, bubble_wall, busy, marks = simulate_with_marks(st, c)
    tail = dp_tail(model, cluster, c, st, (makespan, marks) if cluster.hier else None)
    full = contention(prof, c.gpus)  # the optimizer step runs on every rank at once
    opt = full * optimizer_time(model, cluster, c)
    if prof is not None:
        # per step: the runtime's fixed cost, and the loss and gradient-norm reductions over tp,
        # pp and dp (small all-reduces, α-bound)
        small = _in_step(cluster.intra, prof)
        reductions = sum(comm.all_reduce(8.0, e, small).total for e in (c.tp, c.pp, c.dp))
        overhead = contention(prof, c.gpus, fixed=True) * prof.overheads.step_s + reductions
    # the step runs at its slowest GPU's pace: compute stretches, the DP tail's network time does not
    spread = straggler_factor(cluster.step_spread, c.gpus)
    stragglers = (spread - 1.0) * (makespan + opt)
    step = makespan + tail + opt + overhead + stragglers
    # breakdown on the busiest rank: its work, then the idle time split into PP transfers and bubble
    crit = max(range(c.pp), key=lambda r: busy[r])
    stages = rank_stage_lists(c.schedule, c.pp, c.virtual_stages)[crit]
    rank_of = stage_placement(c.schedule, c.pp, c.virtual_stages)
    m = c.microbatches
    compute = slow * m * sum(st.f_compute[s] + st.b_compute[s] for s in stages)
    recompute = slow * m * sum(st.b_recompute[s] for s in stages)
    actions_fixed = slow_fx * m * sum(st.fixed_f[s] + st.fixed_b[s] for s in stages) if st.fixed_f else 0.0
    tp_comm = m * sum(st.tp_comm[s] for s in stages)
    cp_comm = m * sum(st.cp_comm[s] for s in stages)
    ep_comm = m * sum(st.ep_comm[s] for s in stages) if st.ep_comm else 0.0
    zero3 = m * sum(st.zero3[s] for s in stages)
    idle = max(0.0, makespan - busy[crit])
    # each hop between ranks, there and back (the V's turn is local)
    hops = 2 * sum(1 for s in range(len(rank_of) - 1) if rank_of[s] != rank_of[s + 1])
    if st.blocking:  # and each of the rank's own sends, every micro-batch: an F's to the next rank, a B's back
        hops += m * sum(1 for s in stages for kind in ("F", "B")
                        if (nb := sends_to(kind, s, len(rank_of))) >= 0 and rank_of[nb] != crit)
    pp_comm = min(idle, hops * st.transfer)
    breakdown = {"compute": compute, "recompute": recompute, "tp_comm": tp_comm, "cp_comm": cp_comm,
                 "pp_comm": pp_comm,
                 "dp_comm": tail + zero3, "bubble": idle - pp_comm, "optimizer": opt}
    if stragglers:
        breakdown["stragglers"] = stragglers
    if ep_comm:  # a mixture of experts' token all-to-alls (ep_exchange)
        breakdown["ep_comm"] = ep_comm
    if st.host and any(st.host):  # a mixture of experts' layers waiting for their host (moe_host_floor)
        breakdown["host"] = m * sum(st.host[s] for s in stages)
    if st.offload and any(st.offload):  # waits on activation offloading (offload_exposed)
        breakdown["offload"] = m * sum(st.offload[s] for s in stages)
    if prof is not None:
        breakdown["overhead"] = overhead + actions_fixed
    global_batch = c.micro_batch * m * c.dp
    tokens = global_batch * model.seq_len
    n = c.gpus
    model_fl = global_batch * model_flops_per_sequence(model)
    rec_share = 1.0  # block-method recomputation reruns some layers of each chunk
    if c.recompute_layers:
        rec_share = sum(recomputed_layers(c, k) for k in layout(model, c.pp * c.virtual_stages).layers) / model.layers
    hw_fl = model_fl + global_batch * rec_share * recompute_flops_per_sequence(model, c.recompute)
    peak = cluster.device.peak(cluster.dtype)
    mtf = model_fl / step / n
    return Plan(c, mem_b, mem_r, mem_b.total <= opts.capacity(cluster), step, breakdown, bubble_wall,
                tokens / step, mtf / TFLOPS, hw_fl / step / n / TFLOPS, mtf / peak,
                train_tokens / (tokens / step) / 86400.0,
                extra={"makespan_s": makespan, **({"zbv_times": zt} if (zt := zbv_times(st, c)) else {})})


# ---- the seed's per-layer accounting (§4.2, §4.4, §4.5), for `--explain` and the docs ------------

@dataclass
class LayerAccounting:
    tokens: int  # T = micro-batch × seq_len
    gemm_flops: float  # the layer's projections and MLP, per GPU, forward: 24·T·h²/t for the seed's GPT (§4.2)
    flat_time: float  # gemm_flops / (peak · efficiency): the seed's "2.75 ms"
    model_time: float  # roofline + waves + attention core: what the planner uses
    message_bytes: float  # one all-reduce's tensor, T·h·2 B
    ring_bytes: float  # per GPU, both all-reduces: 2 · 2(E-1)/E · n
    tp_beta: float  # bandwidth term of the two all-reduces
    tp_alpha: float  # latency term, 2 · 2(E-1) steps
    tp_slow: float  # the same two all-reduces over the inter-node link
    layers: int
    seed_flops: float = 0.0  # 24·T·h²/t, the seed's count (MHA, a 4h MLP), to compare where the model differs

    @property
    def tp_time(self) -> float:
        return self.tp_alpha + self.tp_beta

    @property
    def ratio(self) -> float:  # seed: 0.87 / 2.75 = 32%
        return self.tp_time / self.flat_time

    @property
    def slowdown(self) -> float:  # seed: 12.2 / 3.6 = 3.4x
        return (self.flat_time + self.tp_slow) / (self.flat_time + self.tp_time)


def layer_accounting(model: ModelSpec, cluster: Cluster, micro_batch: int, tp: int) -> LayerAccounting:
    """The seed's per-layer accounting (§4.2, §4.5) of `model`'s layer: its GEMM FLOPs as compute.layer_flops counts
    them (24·T·h²/tp for the seed's GPT; GQA, a gated or wider MLP, latent attention or routed experts count their
    own) at the device's flat efficiency, and the two TP all-reduces of its output."""
    from .compute import layer_flops, seed_gemm_flops

    tokens = micro_batch * model.seq_len
    fl = layer_flops(model, micro_batch, tp)[0]
    dev = cluster.device
    n = tokens * model.hidden * DTYPE_BYTES[cluster.dtype]
    link = cluster.link_for_span(tp)
    if link is cluster.intra and mesh_share(link.name, tp) < 1.0:  # a mesh: the tp - 1 links between the members
        link = replace(link, beta=link.beta * mesh_share(link.name, tp))
    ar = comm.all_reduce(n, tp, link) * 2
    slow = comm.all_reduce(n, tp, cluster.inter) * 2
    lt = layer_times(model, dev, cluster.dtype, micro_batch, tp, cross_entropy=cluster.cross_entropy)
    return LayerAccounting(tokens, fl, fl / (dev.peak(cluster.dtype) * dev.efficiency), lt.fwd, n,
                           2 * 2 * (tp - 1) / tp * n if tp > 1 else 0.0, ar.beta, ar.alpha, slow.total,
                           model.layers, seed_gemm_flops(model, tokens, tp))
