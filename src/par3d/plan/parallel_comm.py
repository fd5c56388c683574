"""TP, DP and ZeRO communication priced: TP collectives and their overlap with the GEMMs, DP / ZeRO
gradient collectives, ZeRO-3's prefetched gathers (cost.py adds them into each stage's F and B; context and expert
parallelism's exchanges: cp_ep_comm.py).

On a calibrated host running par3d's eager runtime (a flat cluster with a profile, plan/profile.py)
neither hides: every ZeRO-3 unit's gather and reduce-scatter is one call at its measured α-β
(`zero3_eager`), every ring step's exchange the measured exchange plus the in-step sync
(`cp_exchange_eager`), and ring attention's arithmetic comes from its measured pieces
(plan/kernels.py) — the host's cores are all running ranks, so there is no idle engine to
overlap with.

Link choice follows the rank layout of mesh.py (TP fastest, then CP, then PP, then DP).  On a
hierarchical cluster (catalogue GPUs: `Cluster.hier`) every TP/DP collective is `comm.collective`:
NVLink inside a node, the group's share of the node's NICs across nodes, the slower of the two
being the group's bottleneck; PP and CP hops are `comm.send_recv`.  Flat clusters (the seed's,
calibrated hardware files) keep the seed's rule: a group whose ranks span ≤ gpus_per_node
consecutive ranks uses the intra-node link, otherwise the inter-node one (TP spans tp ranks, CP
tp·cp, PP tp·cp·pp, DP all of them).

Overlap costs something on hierarchical clusters (`Device.sigma`: by default σ = 0.189, the slowdown
Lee et al. 2025 measured, hardware.OVERLAP_SLOWDOWN; calibratable as `overlap_slowdown`): compute of c
seconds running while a collective of k seconds proceeds takes  max(c, k) + σ·min(c, k)  (`overlapped`).
- ZeRO-3 prefetches one layer ahead: each pass over a chunk exposes its first all-gather, each
  later layer costs overlapped(its compute, the next gather), the backward's last reduce-scatter
  is exposed; the backward re-gathers the weights once, full recompute or not (the rerun forward
  uses them: par3d's zero.py and PyTorch FSDP alike).  FSDP-style units (one layer,
  `zero3_unit = "layer"`) run their rings over the node's NICs like any DP collective (llm-foundry's
  FSDP runs: MPT 13B at micro-batch 2 is as fast on 16-64 H100 as on 8, which one NIC per GPU could
  not carry); DeepSpeed's sub-module units keep one GPU's NIC share, as DeepSpeed's ZeRO-3 measured
  (Narayanan et al. 2021, Table 2: its step time did not fall when 768 GPUs became 1,536);
  docs/planner.md §5.
- PyTorch FSDP (`Cluster.fsdp`; its SHARD_GRAD_OP = ZeRO-2, FULL_SHARD / HSDP = ZeRO-3) adds a fitted
  `fsdp_unit_s` (hardware.FSDP_UNIT_S) per wrapped unit (one layer) per micro-batch to the stage that
  holds it, a third to the forward and two thirds to the backward, counted with the ZeRO-3 exposure
  (`dp_comm`): what its runs lose beyond the collectives' time (hardware.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from . import comm
from .choice import Choice
from .compute import (
    DTYPE_BYTES,
    LayerTimes,
    gemm_time,
    layer_gemms,
    recomputes_core,
)
from .hardware import Cluster, Link
from .memory import (
    ACT_BYTES,
    RankShape,
)
from .models import ModelSpec
from .profile import Profile


@dataclass
class Links:
    tp: object
    pp: object
    dp: object
    cp: object = None
    grad: object = None  # the dp × cp gradient-reduction group


def links(cluster: Cluster, c: Choice) -> Links:
    tpcp = c.tp * c.cp
    whole = cluster.link_for_span(tpcp * c.pp * c.dp)
    lk = Links(cluster.link_for_span(c.tp), cluster.link_for_span(tpcp * c.pp),
               whole if c.dp > 1 else cluster.intra, cluster.link_for_span(tpcp),
               whole if c.dp > 1 else cluster.link_for_span(tpcp))
    if cluster.profile is not None and cluster.profile.sync:
        lk = Links(*(_in_step(k, cluster.profile) for k in (lk.tp, lk.pp, lk.dp, lk.cp, lk.grad)))  # type: ignore[arg-type]
    return lk


def _in_step(link: Link, prof: Profile) -> Link:
    """A link as a collective inside a training step sees it: each message step also waits for
    the slowest rank (the profile's calibrated sync joins α)."""
    return replace(link, alpha=link.alpha + prof.sync)


def strides(c: Choice) -> tuple[int, int, int, int]:
    """Global-rank distance between neighbours of a TP, CP, PP and DP group (mesh.py's order)."""
    return 1, c.tp, c.tp * c.cp, c.tp * c.cp * c.pp


def overlapped(compute: float, comm_s: float, sigma: float) -> float:
    """Wall time of `compute` seconds of kernels running while `comm_s` seconds of a collective
    proceed: the longer of the two, plus the slowdown σ of the overlapped part."""
    return max(compute, comm_s) + sigma * min(compute, comm_s)


# bytes an element of a sequence-parallel GEMM input moves in its all-gather under each precision: Transformer Engine
# quantizes the input (the fused norm-and-cast output, forward; its re-gather for the weight gradient and the
# row-parallel layers' output gradients, backward) before gathering it -- `gather_along_first_dim(..., quantizer=)` in
# transformer_engine/pytorch/module/layernorm_linear.py and base.py's grad_output_preprocess (TE 2.x) -- so FP8 gathers
# 1 B, MXFP8 1 B and an E8M0 scale per 32 elements, NVFP4 0.5 B and an E4M3 scale per 16 ("automatically enabled for
# column-parallel and row-parallel linear layers": its NVFP4 docs).  The reduce-scatters stay in the activations' dtype.
GATHERED_INPUT_BYTES = {"fp8": 1.0, "mxfp8": 1.0 + 1 / 32, "nvfp4": DTYPE_BYTES["nvfp4"]}


def tp_collective(cluster: Cluster, c: Choice, nbytes: float, link: object, gemm_input: bool = False) -> float:
    """One TP all-reduce of `nbytes` (with SP an all-gather + reduce-scatter: the same ring bytes).  `gemm_input`: the
    all-gather feeds a GEMM, so under FP8 it moves the quantized copy (`GATHERED_INPUT_BYTES`) instead of bf16's 2 B
    an element."""
    if c.tp <= 1:
        return 0.0
    if not cluster.hier:
        return comm.all_reduce(nbytes, c.tp, link).total  # type: ignore[arg-type]
    if c.sequence_parallel:
        q = GATHERED_INPUT_BYTES.get(cluster.fp8_block or cluster.dtype) if gemm_input else None
        gathered = nbytes * q / ACT_BYTES[cluster.dtype] if q else nbytes
        return (comm.collective("all_gather", gathered, c.tp, 1, cluster)
                + comm.collective("reduce_scatter", nbytes, c.tp, 1, cluster)).total
    return comm.collective("all_reduce", nbytes, c.tp, 1, cluster).total


def tp_all_gather(cluster: Cluster, c: Choice, nbytes: float, link: object) -> float:
    """One all-gather over the TP group, `nbytes` gathered: the output layer's vocabulary shards (Aleph Alpha's
    scaling's ColumnParallelLinear without `parallel_output`: `all_concat`; its backward a local split), a pipeline
    boundary's partitioned tensor (DeepSpeed's pipeline engine: `Cluster.p2p_partitioned`)."""
    if c.tp <= 1:
        return 0.0
    if not cluster.hier:
        return comm.all_gather(nbytes, c.tp, link).total  # type: ignore[arg-type]
    return comm.collective("all_gather", nbytes, c.tp, 1, cluster).total


def tp_collective_small(cluster: Cluster, c: Choice) -> float:
    """One all-reduce of a 4-byte scalar (an FP8 amax) over the TP group: its latency."""
    if c.tp <= 1:
        return 0.0
    if not cluster.hier:
        return comm.all_reduce(4.0, c.tp, links(cluster, c).tp).total  # type: ignore[arg-type]
    return comm.collective("all_reduce", 4.0, c.tp, 1, cluster).total


# The GEMM each TP collective of a layer pairs with under tp_comm_overlap (sequence parallelism): the
# all-gathers before the QKV and MLP-in GEMMs, the reduce-scatters after the output projection and MLP-out
# (forward; the backward's dgrad GEMMs have the same shapes and swap the two kinds)
TP_OVERLAP_GEMMS = ("qkv", "attn_out", "mlp_in", "mlp_out")


# the column-parallel GEMMs whose backward collectives userbuffers overlaps in bulk (tp_overlap_exposed)
TP_BULK_BACKWARD = ("qkv", "mlp_in")


def tp_overlap_exposed(model: ModelSpec, cluster: Cluster, c: Choice, coll: float, forward: bool = True,
                       gather: float | None = None) -> float:
    """One layer's TP time (one micro-batch) under Megatron-Core's tp_comm_overlap, as Transformer
    Engine's userbuffers run it.  Ring exchange (the method Megatron-Bridge's FP8 H100 configs pick for
    every forward collective, src/megatron/bridge/training/comm_overlap.py): the GEMM is split into tp
    chunks of M/tp rows; tp − 1 of them each run beside one of the ring's tp − 1 steps (each step
    `coll`/(tp − 1) seconds: one all-gather or reduce-scatter is `coll`), one chunk runs alone (the
    rank's own slice: first for an all-gather, last for a reduce-scatter).  So a collective costs
    chunk + (tp − 1)·overlapped(chunk, step) − gemm: what the steps outlast their chunks, the slowdown σ
    of the shared part, and the chunks' own loss of efficiency (smaller GEMMs, one launch each).

    A forward reduce-scatter the cluster lists in `tp_overlap_pipeline` (name, num_sm, num_splits) runs
    by TE's "pipeline" method instead (`split_overlap_rs`): the GEMM in num_splits chunks of M/num_splits
    rows on SMs − num_sm (`set_sm_margin`: the GEMM is launched on the SMs the communication kernel
    leaves), each chunk's reduce-scatter (`coll`/num_splits, on num_sm SMs) beside the next chunk, the
    last one exposed: chunk + (num_splits − 1)·max(chunk, rs) + rs − gemm.

    The backward (`forward=False`) as every userbuffers config runs it (Transformer Engine's defaults in
    `initialize_ub`, NeMo's and Megatron-Bridge's H100 configs): each row-parallel GEMM's dgrad all-gathers
    its output gradient by ring exchange (proj_dgrad, fc2_dgrad: the chunked pricing above), while each
    column-parallel GEMM (QKV, MLP-in) has two "bulk" overlaps -- the all-gather of its sequence-parallel
    input, which the weight gradient needs again, beside the whole dgrad GEMM (qkv_dgrad, fc1_dgrad), and
    the reduce-scatter of that dgrad's output beside the whole wgrad GEMM (qkv_wgrad, fc1_wgrad).  A bulk
    overlap splits nothing: overlapped(gemm, coll) − gemm each.  (dgrad and wgrad are priced at the
    forward GEMM's time, as the backward's compute is: backward = 2 × forward.)

    `coll` is one reduce-scatter; `gather` one all-gather where it moves fewer bytes (FP8's quantized GEMM inputs and
    output gradients, `GATHERED_INPUT_BYTES`; None: `coll`)."""
    dev, dtype = cluster.device, cluster.gemm_dtype
    gs = {g.name: g for g in layer_gemms(local_model(model, c.cp), c.micro_batch, c.tp, c.ep)}
    pipeline = {name: (sm, k) for name, sm, k in cluster.tp_overlap_pipeline} if forward else {}
    n = c.tp
    ag = coll if gather is None else gather
    out = 0.0
    for name in TP_OVERLAP_GEMMS:
        if name not in gs:  # a mixture of experts without a shared expert: no TP-split MLP, no MLP collectives
            continue
        g = gs[name]
        whole = gemm_time(g, dev, dtype)
        if not forward and name in TP_BULK_BACKWARD:
            out += overlapped(whole, ag, dev.sigma) + overlapped(whole, coll, dev.sigma) - 2 * whole
            continue
        # forward: the column-parallel GEMMs (QKV, MLP-in) follow an all-gather, the row-parallel ones precede a
        # reduce-scatter; backward: the row-parallel dgrads all-gather their output gradients
        step = (ag if (name in TP_BULK_BACKWARD) == forward else coll) / (n - 1)
        if name in pipeline:
            sm, k = pipeline[name]
            chunk = gemm_time(replace(g, m=max(1, g.m // k)), dev, dtype) * dev.sms / max(1, dev.sms - sm)
            rs = coll / k
            out += chunk + (k - 1) * max(chunk, rs) + rs - whole
            continue
        chunk = gemm_time(replace(g, m=max(1, g.m // n)), dev, dtype)
        out += chunk + (n - 1) * overlapped(chunk, step, dev.sigma) - whole
    return out


def grad_collective(cluster: Cluster, c: Choice, kind: str, nbytes: float, per_gpu_nic: bool = False,
                    group: str = "all") -> float:
    """A collective over the dp × cp ranks that hold the same weights (hierarchical clusters);
    `per_gpu_nic` prices it at one GPU's NIC share (ZeRO-3's parameter collectives).  Under HSDP
    (`c.dp_replicate` > 1) `group` "shard" is one replica's dp / dp_replicate × cp ranks (ZeRO's
    gathers and reduce-scatters) and "replicate" the dp_replicate ranks holding the same shard, each
    one replica's span apart (the shards' gradient all-reduce)."""
    dps = c.dp // c.dp_replicate
    if group == "replicate":
        if c.dp_replicate <= 1:
            return 0.0
        return comm.collective(kind, nbytes, c.dp_replicate, strides(c)[3] * dps, cluster).total
    ng = dps * c.cp if group == "shard" else c.dp * c.cp
    if ng <= 1:
        return 0.0
    one_dp = dps == 1 if group == "shard" else c.dp == 1
    stride = strides(c)[1] if one_dp else strides(c)[3]  # dp × cp: the wider stride bounds members per node
    if per_gpu_nic and ng * stride > cluster.gpus_per_node:  # a group inside one node uses no NIC
        stride = max(stride, cluster.gpus_per_node)
    return comm.collective(kind, nbytes, ng, stride, cluster).total


def grad_bytes(cluster: Cluster) -> float:
    """Bytes per gradient element in the DP/CP (and K/V replica) reductions: the training dtype's 2 B
    (the seed's count), or 4 B where the framework reduces in fp32 (`Cluster.grad_reduce_fp32`:
    Megatron-Core's `grad_reduce_in_fp32`, FSDP's `reduce_dtype=float32`; `Cluster.grad_reduce_cast`: bf16
    gradients cast to fp32 for the collective) or trains in fp32."""
    return 4.0 if cluster.dtype == "fp32" or cluster.grad_reduce_fp32 or cluster.grad_reduce_cast else 2.0


def grads_all_reduced(cluster: Cluster, c: Choice) -> bool:
    """Whether the DP gradient reduction is a full all-reduce: ZeRO-0 (DDP), DeepSpeed's BF16_Optimizer, and ZeRO-1
    as `Cluster.zero1_all_reduce` runs it; ZeRO-1/2 otherwise reduce-scatter (ZeRO-3 reduces inside the stages)."""
    return c.zero_stage == 0 or cluster.bf16_optimizer or (cluster.zero1_all_reduce and c.zero_stage == 1)


def sharded_grad_reduce(cluster: Cluster, c: Choice, nbytes: float, per_gpu_nic: bool = False) -> float:
    """ZeRO's gradient reduction of `nbytes` of gradients: a reduce-scatter over the shard group and,
    under HSDP, the all-reduce of each shard (nbytes / shards) across the replicas after it."""
    rs = grad_collective(cluster, c, "reduce_scatter", nbytes, per_gpu_nic, group="shard")
    return rs + grad_collective(cluster, c, "all_reduce", nbytes / c.zero_shards, group="replicate")


def flat_sharded_reduce(c: Choice, nbytes: float, link: object) -> float:
    """`sharded_grad_reduce` in the seed's flat model: a ring reduce-scatter over the shard group and the
    shards' ring all-reduce across the replicas, both on one link."""
    gs = c.zero_shards
    return (comm.reduce_scatter(nbytes, gs, link).total  # type: ignore[arg-type]
            + comm.all_reduce(nbytes / gs, c.dp_replicate, link).total)  # type: ignore[arg-type]


def weight_bytes(cluster: Cluster) -> float:
    """Bytes per weight element ZeRO-1/2's gather of updated weights moves: the training dtype's (fp8 keeps
    bf16 weights), or 1 B where fp8 copies are gathered (`Cluster.fp8_param_gather`), 0.5625 B where NVFP4 copies
    are (Megatron-Core's fp4_param_gather: E2M1 and an E4M3 scale per 16)."""
    if cluster.dtype == "fp8" and cluster.fp8_param_gather:
        return DTYPE_BYTES["nvfp4"] if cluster.fp8_block == "nvfp4" else 1.0
    return 4.0 if cluster.dtype == "fp32" else 2.0


def _zero3_exposed(n: int, f: float, b: float, ag: float, rs: float, sigma: float) -> tuple[float, float]:
    """Extra forward and backward time of one chunk of n layers under ZeRO-3 with one-layer
    prefetch: f, b = one layer's forward and backward (+ recompute) time; ag, rs = one layer's
    all-gather and reduce-scatter."""
    n = max(n, 1)
    fwd = ag + (n - 1) * overlapped(f, ag, sigma) + f
    # the backward gathers each unit once, full recompute or not: the rerun forward uses the weights that
    # gather brought (par3d's zero.py: the unit's hooks are on its module, the rerun calls its inner
    # forward; PyTorch FSDP skips its post-forward reshard in the recomputed forward)
    bwd = ag + (n - 1) * overlapped(b, ag + rs, sigma) + b + rs
    return fwd - n * f, bwd - n * b


# DeepSpeed ZeRO-3 (the `submodule` unit): each parametrised sub-module's forward/backward hook
# fetches its own weights and prefetches ahead of use at most `stage3_prefetch_bucket_size` = 5e7
# elements (DeepSpeed's default, deepspeed/runtime/zero/config.py) -- at least the next weight in
# its recorded trace.  From h >= 7072 (h^2 >= 5e7: Table 2's models, h = 12288 and 20480) every weight
# matrix fills that, so the gather of sub-module j + 1 overlaps the compute of sub-module j alone: a
# layer costs sum_j overlapped(c_j, g_(j+1)), not overlapped(sum c, sum g).  (Narrower models prefetch
# two or more matrices ahead; priced one ahead, the exposure is an upper bound.)  Weights and
# compute are not proportional across sub-modules (the output projection holds h^2 weights but the
# attention core and the QKV GEMM run before it; the MLP's 4h^2 gathers follow the h^2 projection),
# so comm surfaces even when a layer's totals balance.  Norms and biases (< 1e5 elements,
# `stage3_param_persistence_threshold`) stay resident.
def zero3_submodules(model: ModelSpec, dev: object, dtype: str, b: int, tp: int, cp: int,
                     lt: LayerTimes) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(forward compute time, weights per rank) of one layer's four parametrised sub-modules in
    execution order: QKV (with the attention core and the elementwise work before the projection),
    output projection, MLP in, MLP out."""
    gs = {g.name: g for g in layer_gemms(local_model(model, cp), b, tp)}
    t = {k: gemm_time(gs[k], dev, dtype) for k in ("attn_out", "mlp_in", "mlp_out")}  # type: ignore[arg-type]
    comp = (max(lt.fwd - sum(t.values()), 0.0), t["attn_out"], t["mlp_in"], t["mlp_out"])
    w = tuple(float(gs[k].k * gs[k].n) for k in ("qkv", "attn_out", "mlp_in", "mlp_out"))
    return comp, w


def prefetch_timeline(units: list[tuple[float, float, float]], sigma: float, repeat: int = 1) -> float:
    """Wall time of sub-modules run in order (the list `repeat` times), each (compute c, gather g,
    reduce-scatter r): the gather of unit j + 1 is issued when unit j starts (one unit of prefetch),
    unit j waits for its own gather, its gradients' reduce-scatter is issued when it ends; gathers
    and reduce-scatters queue on the one network path; compute that runs while the network is busy
    slows by σ (`overlapped`).  The first gather and the last reduce-scatter are exposed.

    The state between repetitions is the network's and the next gather's lead over the compute
    clock; once a repetition leaves it as the one before did, every later one adds the same time,
    so long chunks cost a few repetitions' work (the search prices thousands of them)."""
    if not units or repeat < 1:
        return 0.0
    k = len(units)
    net = units[0][1]  # the first gather, issued on arrival
    ready, t = net, 0.0

    def one(t: float, net: float, ready: float, last: bool) -> tuple[float, float, float]:
        for j, (cj, _, rj) in enumerate(units):
            start = max(t, ready)
            more = j + 1 < k or not last
            if more:  # prefetch the next unit's weights
                net = max(start, net) + units[(j + 1) % k][1]
                nxt = net
            end = start + cj + sigma * min(cj, max(0.0, net - start))
            if rj > 0.0:
                net = max(end, net) + rj
            t = end
            if more:
                ready = nxt
        return t, net, ready

    done, prev = 0, None
    while done < repeat - 1:
        t0 = t
        t, net, ready = one(t, net, ready, False)
        done += 1
        state = (round(net - t, 12), round(ready - t, 12), round(t - t0, 12))
        if state == prev:  # periodic from here: jump over the remaining full repetitions
            jump = repeat - 1 - done
            t, net, ready = t + jump * (t - t0), net + jump * (t - t0), ready + jump * (t - t0)
            done += jump
        prev = state
    t, net, ready = one(t, net, ready, True)
    return max(t, net)


@lru_cache(maxsize=8192)
def _zero3_submodule_exposed(n: int, comp: tuple[float, ...], gathers: tuple[float, ...],
                             scatters: tuple[float, ...], ar: float, rec_comm: float, recompute: str, core: float,
                             sigma: float) -> tuple[float, float]:
    """Extra forward and backward time of a chunk of n layers under DeepSpeed-style ZeRO-3
    (`prefetch_timeline` over every sub-module).  TP all-reduces run after the output projection
    and the MLP out (forward) and after the QKV and MLP-in input gradients (backward).  With full
    recomputation the backward of a layer first reruns its forward (gathering again), then walks
    the sub-modules in reverse, each gathered again except the MLP out, whose weights the rerun
    has just used (DeepSpeed keeps weights reused within `stage3_max_reuse_distance`)."""
    n = max(n, 1)
    fwd_tp = (0.0, ar, 0.0, ar)
    fwd_units = [(comp[i] + fwd_tp[i], gathers[i], 0.0) for i in range(4)]
    fwd = prefetch_timeline(fwd_units, sigma, n)
    bwd_tp = (ar, 0.0, ar, 0.0)
    layer: list[tuple[float, float, float]] = []
    full = recompute == "full"
    if full:
        rec_tp = rec_comm / 2.0
        layer += [(comp[i] + (rec_tp if i in (1, 3) else 0.0), gathers[i], 0.0) for i in range(4)]
    for i in (3, 2, 1, 0):
        extra = core if (i == 0 and recomputes_core(recompute)) else 0.0
        g = 0.0 if (full and i == 3) else gathers[i]
        layer.append((2.0 * comp[i] + bwd_tp[i] + extra, g, scatters[i]))
    bwd = prefetch_timeline(layer, sigma, n)
    f_base = n * (sum(comp) + 2 * ar)
    b_base = n * (2 * sum(comp) + 2 * ar + (sum(comp) + rec_comm if full else 0.0)
                  + (core if recomputes_core(recompute) else 0.0))
    return fwd - f_base, bwd - b_base


def local_model(model: ModelSpec, cp: int) -> ModelSpec:
    """The model as one CP rank's GEMMs see it: s/cp tokens per sequence."""
    return model if cp == 1 else replace(model, seq_len=model.seq_len // cp)


def zero3_layer_weights(model: ModelSpec, c: Choice, nm: int, nd: int) -> float:
    """Parameters ZeRO-3 gathers for one layer on one rank (its TP shard; a mixture of experts' dense part and its
    E/ep routed experts), averaged over a stage of `nm` layers of the model's kind and `nd` dense ones."""
    def one(m: ModelSpec) -> float:
        if not m.moe:
            return float(m.layer_params_per_rank(c.tp))
        return m.dense_layer_params_per_rank(c.tp) + m.expert_layer_params() / c.expert_shards

    if not model.moe or nd == 0:
        return one(model)
    return (nm * one(model) + nd * one(model.dense_variant())) / max(nm + nd, 1)


def fsdp2_copy_out(model: ModelSpec, cluster: Cluster, c: Choice, nm: int, nd: int) -> float:
    """Seconds of PyTorch FSDP2's copy-out after one layer's all-gather (`--fsdp-version 2`, ZeRO-3 by layer): fully_shard
    gathers into one flat buffer and then copies each parameter out of it (torch/distributed/fsdp/_fully_shard/
    _fsdp_collectives.py, foreach_all_gather_copy_out: split_with_sizes_copy, issued on the compute stream from
    FSDPParamGroup.wait_for_unshard after it waits for the gather), so the gathered 16-bit weights are read and
    written once more at HBM rate, not hidden behind the gather.  FSDP1's FlatParameter (and FairScale's) gathers
    into the flat tensor its parameters are views of: no copy (0 s)."""
    if not (cluster.fsdp and cluster.fsdp_version == 2 and cluster.hier and c.zero_stage >= 3 and c.dp * c.cp > 1):
        return 0.0
    dev = cluster.device
    return 2 * 2.0 * zero3_layer_weights(model, c, nm, nd) / (dev.mem_bw * dev.mem_eff)


def zero3_layer_collectives(model: ModelSpec, cluster: Cluster, c: Choice, nm: int, nd: int,
                            memo: dict[bool, tuple[float, float]] | None = None) -> tuple[float, float]:
    """ZeRO-3's all-gather of one layer's 16-bit weights and reduce-scatter of its gradients (hierarchical clusters),
    averaged over a stage of `nm` layers of the model's kind and `nd` dense ones (a mixture of experts'): the dense
    part over the dp x cp shard group (under HSDP the replicas' all-reduce too), a mixture of experts' E/ep routed
    experts over the expert-data-parallel group (`expert_grad_collective`: no collective where ep spans every rank
    holding them).  `memo` (one per choice: stage_times prices each stage's) keeps the layer of each kind's pair,
    which no stage changes."""
    def one(m: ModelSpec) -> tuple[float, float]:
        dense = m.dense_layer_params_per_rank(c.tp) if m.moe else m.layer_params_per_rank(c.tp)
        ag = grad_collective(cluster, c, "all_gather", 2.0 * dense, group="shard")
        rs = sharded_grad_reduce(cluster, c, grad_bytes(cluster) * dense)
        if m.moe:
            experts = m.expert_layer_params() / c.expert_shards
            ag += expert_grad_collective(cluster, c, "all_gather", 2.0 * experts)
            rs += expert_grad_collective(cluster, c, "reduce_scatter", grad_bytes(cluster) * experts)
        return ag, rs

    def of(dense: bool) -> tuple[float, float]:  # the layer of the model's kind, or its dense variant's
        hit = memo.get(dense) if memo is not None else None
        if hit is None:
            hit = one(model.dense_variant() if dense else model)
            if memo is not None:
                memo[dense] = hit
        return hit

    n = nm + nd
    if not model.moe or nd == 0:
        return of(False)
    (agm, rsm), (agd, rsd) = of(False), of(True)
    return (nm * agm + nd * agd) / max(n, 1), (nm * rsm + nd * rsd) / max(n, 1)


def expert_grad_collective(cluster: Cluster, c: Choice, kind: str, nbytes: float) -> float:
    """A collective over the expert-data-parallel group (the `c.expert_dp` ranks holding the same routed experts),
    placed as Megatron-Core's rank order places it: members ep x etp ranks apart (comm.all_to_all)."""
    if c.expert_dp <= 1:
        return 0.0
    if not cluster.hier:  # the seed's flat ring over the link of the group's span
        ring = comm.all_reduce if kind == "all_reduce" else comm.reduce_scatter
        return ring(nbytes, c.expert_dp, cluster.link_for_span(c.expert_dp * c.expert_shards)).total
    return comm.collective(kind, nbytes, c.expert_dp, c.expert_shards, cluster).total


def zero3_units(model: ModelSpec, c: Choice, n: int, embed: bool, head: bool) -> list[float]:
    """Parameters of each unit ZeRO-3 gathers on one stage (zero.py): its n blocks, the embedding
    (learned positions; the token embedding too unless it is tied, whose bucket stays resident)
    and the head (the final norm; its weight unless tied)."""
    units = [model.layer_params_per_rank(c.tp)] * n
    tied = model.tied
    if embed:
        units.append(model.seq_len * model.hidden + (0.0 if tied else model.vocab * model.hidden / c.tp))
    if head:
        units.append(model.norm_params + (0.0 if tied else model.vocab * model.hidden / c.tp))
    return units


def zero3_eager(model: ModelSpec, c: Choice, prof: Profile, link: Link, dtype: str, n: int, embed: bool,
                head: bool) -> tuple[float, float]:
    """ZeRO-3's collectives per micro-batch on a stage (forward, backward) on a calibrated host
    running the eager runtime (zero.py): every unit is all-gathered before its forward and again
    before its backward (once, full recompute or not), and its gradients reduce-scattered after it
    (a tied embedding's bucket once more); each a separate call at its measured cost
    (`Profile.collectives`, isolated calls over the calibration's ranks).  None hides: the prefetch posts the next unit's gather
    asynchronously, but on a host whose cores all run ranks the backend's thread takes its time
    from them; the prefetch does absorb the ranks' drift, so no in-step sync is added."""
    g = c.dp * c.cp
    nb = 4.0 if dtype == "fp32" else 2.0  # the gathered weights and the reduced gradients (fp32)
    ag_l = prof.collective("all_gather") or link
    rs_l = prof.collective("reduce_scatter") or link
    units = zero3_units(model, c, n, embed, head)
    ag = sum(comm.all_gather(nb * u, g, ag_l).total for u in units)
    rs = sum(comm.reduce_scatter(4.0 * u, g, rs_l).total for u in units)
    if embed and model.tied and c.pp == 1:  # the tied embedding's bucket: reduced every micro-batch
        rs += comm.reduce_scatter(4.0 * model.vocab * model.hidden / c.tp, g, rs_l).total
    return ag, ag + rs  # the backward gathers once, full recompute or not (see _zero3_exposed)


ZERO1_BUCKET_PARAMS = 1 << 20  # zero.py's bucket_numel: ZeRO-1's buckets are filled by size


def zero12_eager(model: ModelSpec, c: Choice, prof: Profile, link: Link, shape: RankShape,
                 first: bool, dtype: str) -> tuple[float, float]:
    """ZeRO-1/2's gradient reduce-scatters and weight all-gathers per step (reduction, gather) on a
    calibrated host running the eager runtime (zero.py), each call at its kind's measured α-β
    (`Profile.collectives`), none hidden (the backend's thread takes its time from the ranks'
    cores): ZeRO-1 reduces its size-filled buckets once, after the last micro-batch; ZeRO-2 one
    bucket per unit (embedding, block, head) every micro-batch; both gather the updated weights
    bucket by bucket after the optimizer."""
    g = c.dp * c.cp
    nb = 4.0 if dtype == "fp32" else 2.0  # the gathered weights (the reduced gradients: fp32)
    rs_l = prof.collective("reduce_scatter") or link
    ag_l = prof.collective("all_gather") or link
    if c.zero_stage == 1:
        calls = max(1, -(-int(shape.params) // ZERO1_BUCKET_PARAMS))
        per = shape.params / calls
        red = calls * comm.reduce_scatter(4.0 * per, g, rs_l).total
        return red, calls * comm.all_gather(nb * per, g, ag_l).total
    units = zero3_units(model, c, sum(shape.layers), first, shape.head)
    red = c.microbatches * sum(comm.reduce_scatter(4.0 * u, g, rs_l).total for u in units)
    return red, sum(comm.all_gather(nb * u, g, ag_l).total for u in units)
