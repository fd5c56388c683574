"""Context parallelism's K/V exchanges (ring, all-gather, all-to-all) and expert parallelism's token exchanges,
priced per layer, and one layer's times as a step of a choice prices them (`choice_layer_times`).

Context parallelism cp (ring attention: Liu et al. 2023; Megatron-LM's CP with causal load
balancing, each rank holding two mirrored chunks of s/(2cp) tokens): every GEMM runs on the rank's
b·s/cp tokens; the attention core of its s/cp queries runs against all s keys in cp blocks, while
the K/V block of b·s/cp·2·kv_dim/t elements travels one hop around the CP ring per block (cp − 1
hops forward; backward sends K/V again and the dK/dV partials: twice the bytes).  The exchange of
block i+1 overlaps the attention of block i, so the exposed part per layer is
max(0, ring time − attention time of the cp − 1 remote blocks).  CP ranks hold the same weights:
their gradients are reduced (and ZeRO shards) over dp × cp ranks.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from . import comm
from .choice import Choice
from .compute import (
    KERNEL_S,
    LayerTimes,
    consecutive_spans,
    ep_destination_ranks,
    layer_times,
)
from .hardware import Cluster, Link
from .memory import ACT_BYTES
from .models import ModelSpec
from .parallel_comm import links, local_model, overlapped
from .profile import Profile


@lru_cache(maxsize=4096)
def cp_layer_times(model: ModelSpec, dev: object, dtype: str, b: int, tp: int, cp: int, sp: bool = False,
                   flash: bool = False, fp8_current: bool = False, ring: bool = True,
                   cross_entropy: str = "unfused", fp8_block: str = "", ep: int = 1,
                   heads: bool = False, dispatcher: str = "", etp: int = 1, eager: bool = False) -> LayerTimes:
    """Layer times on one CP rank: projections and MLP on b·s/cp tokens; the attention core of
    s/cp queries against all s keys = cp blocks of the (s/cp)² core.  The ring (`ring`, the table
    model) adds what Transformer Engine's ring attention moves besides its kernels (`cp_ring_bytes`)
    and one launch per extra attention kernel.  `heads` (Ulysses, `Cluster.cp_comm` "a2a"): the core is
    instead one kernel over all s tokens for 1/cp of this TP rank's heads -- the same FLOPs, at the
    kernel's share for s tokens rather than s/cp."""
    lt = layer_times(local_model(model, cp), dev, dtype, b, tp, sp, flash, fp8_current,  # type: ignore[arg-type]
                     cross_entropy, fp8_block, ep, dispatcher, etp, eager)
    if cp == 1:
        return lt
    if heads:
        if flash and dev.kernel_model == "table":  # type: ignore[attr-defined]
            whole = layer_times(model, dev, dtype, b, tp, sp, flash, fp8_current,  # type: ignore[arg-type]
                                cross_entropy, fp8_block, ep, dispatcher, etp, eager)
            core = (whole.core - KERNEL_S) / cp + KERNEL_S
        else:  # the flat kernel model: the core's FLOPs at the one efficiency, as the ring's
            core = lt.core * cp
        return replace(lt, fwd=lt.fwd - lt.core + core, core=core,
                       fwd_flops=lt.fwd_flops + (cp - 1) * lt.core_flops, core_flops=lt.core_flops * cp)
    extra = (cp - 1) * lt.core
    if ring and dev.kernel_model == "table":  # type: ignore[attr-defined]
        q = b * (model.seq_len // cp) * model.q_dim / tp * ACT_BYTES[dtype]
        kv = kv_block_bytes(model, b, tp, cp, dtype)
        # the backward's bytes (cp_ring_bytes) priced in the forward at a third of the total, as the
        # model's backward is twice its forward
        move = sum(cp_ring_bytes(q, kv, cp)) / 3 / (dev.mem_bw * dev.mem_eff)  # type: ignore[attr-defined]
        extra += move + (cp - 1) * KERNEL_S
        lt = replace(lt, elementwise=lt.elementwise + move)
    return replace(lt, fwd=lt.fwd + extra, core=lt.core * cp, fwd_flops=lt.fwd_flops + (cp - 1) * lt.core_flops,
                   core_flops=lt.core_flops * cp)


def ep_exchange(model: ModelSpec, cluster: Cluster, c: Choice, share: float | None = None) -> tuple[float, float]:
    """One mixture-of-experts layer's token all-to-alls over the EP group, (forward, backward), exposed: the
    dispatch of this rank's b·s/(cp·tp) tokens × top_k copies of h elements and the combine of as many back
    (forward), the same two for their gradients (backward) -- Megatron-Core's alltoall and flex (DeepEP,
    HybridEP) dispatchers.  Exposed, unless `cluster.ep_comm_overlap` (Megatron-Core's
    `overlap_moe_expert_parallel_comm`): then, on Megatron's schedules (1F1B, interleaved), each all-to-all runs
    beside the sub-module of another micro-batch's layer that its schedule pairs it with (`a2a_overlap_exposed`,
    in the paired share `share` of the steps, `a2a_paired_share` of the ranks by default); on another schedule
    (DualPipe-V) beside that micro-batch's whole layer, only what outlasts it and the slowdown σ of the shared part
    added (`overlapped`).  In 16 bits, but the forward dispatch in 8 under `cluster.ep_dispatch_fp8` (DeepSeek-V3's,
    DeepEP's FP8 dispatch, with a 4-byte fp32 scale per 128 elements: its per-token-group quantization); the
    backward moves gradients, 16-bit.

    The flex dispatcher (`cluster.dispatcher` "flex": DeepEP, HybridEP; `cluster.ep_dispatch` "dedup" implies it)
    sends a token one row per destination rank, not one per routed copy (`compute.ep_destination_ranks`: DeepEP's
    recv_x and HybridEP's buffers hold a row per (token, rank), the rank's experts' copies made by the permute after
    it; issue 12's fiftieth round), and crosses nodes once per remote node holding any of its experts, forwarded
    inside that node over NVLink: the NICs carry `remote_nodes` copies of each token (`ep_remote_nodes`) rather than
    every copy bound for another node (the "alltoall" dispatcher's, the default).

    Expert tensor parallelism (`c.etp` > 1; Megatron-Core's MoEAlltoAllTokenDispatcher with an expert-TP group):
    the all-to-all runs over the EP group, whose members are etp ranks apart (the expert-TP ranks innermost), then
    the copies received are all-gathered over the etp group before the experts (16-bit) and their outputs
    reduce-scattered over it after them, in fp32 (`hidden_states.to(self.probs.dtype)`); backward the transposes
    (a 16-bit reduce-scatter, an fp32 all-gather).  Zero for a dense model and ep = etp = 1."""
    d_f, c_f, d_b, c_b = ep_exchanges(model, cluster, c)
    fwd, bwd = d_f + c_f, d_b + c_b
    if not cluster.ep_comm_overlap or fwd + bwd == 0.0:
        return fwd, bwd
    lt = choice_layer_times(model, cluster, c)
    sigma = cluster.device.sigma
    if c.schedule not in A2A_OVERLAP_SCHEDULES:  # another framework's pairing (DualPipe's): one layer's compute
        f = lt.fwd
        return overlapped(f, fwd, sigma) - f, overlapped(2 * f, bwd, sigma) - 2 * f
    return a2a_overlap_exposed(lt, (d_f, c_f, d_b, c_b), sigma, a2a_paired_share(c) if share is None else share)


def ep_exchanges(model: ModelSpec, cluster: Cluster, c: Choice) -> tuple[float, float, float, float]:
    """One MoE layer's four token exchanges, each whole (`ep_exchange` prices what of them is exposed): the forward's
    dispatch and combine, the backward's gradient combine (first) and gradient dispatch; zeros for a dense model and
    ep = etp = 1.  Under uneven routing (`ModelSpec.route_load` above 1) each at the busiest rank's load."""
    if not model.moe or (c.ep <= 1 and c.etp <= 1):
        return 0.0, 0.0, 0.0, 0.0
    tokens = c.micro_batch * (model.seq_len // c.cp) / c.tp
    copies = tokens * model.top_k * model.hidden  # elements of every routed copy of this rank's tokens
    flex = cluster.dispatcher == "flex" and c.ep > 1
    # the flex dispatcher sends one row per destination rank, not per copy (issue 12's fiftieth round)
    sent = tokens * ep_destination_ranks(model, c.ep) * model.hidden if flex else copies
    remote = ep_remote_nodes(model, cluster, c) if flex else None

    def a2a(b: float) -> float:
        return comm.all_to_all(sent * b, c.ep, cluster, remote, tokens * model.hidden * b, stride=c.etp).total

    # the four exchanges: forward dispatch and combine, backward the combine's gradient (first) and the dispatch's
    d_f = a2a(1.0 + 4.0 / 128) if cluster.ep_dispatch_fp8 else a2a(2.0)
    c_f = d_b = c_b = a2a(2.0)
    if c.etp > 1:  # the gathered copies: etp times this rank's received ones (balanced: as many as it sent)
        etp_ag16 = comm.collective("all_gather", 2.0 * copies * c.etp, c.etp, 1, cluster).total
        etp_32 = comm.collective("reduce_scatter", 4.0 * copies * c.etp, c.etp, 1, cluster).total
        d_f, c_f, d_b, c_b = d_f + etp_ag16, c_f + etp_32, d_b + etp_ag16, c_b + etp_32
    # uneven routing (models.ModelSpec.route_load): each exchange ends when the busiest rank has moved its copies, load
    # times the balanced share (the senders' sides, balanced, are no slower)
    load = model.at_ep(c.ep).route_load  # (an expert-TP group without EP gathers every copy: balanced)
    return d_f * load, c_f * load, d_b * load, c_b * load


# Megatron's schedules, whose 1F1B A2A overlap pairs sub-modules (`a2a_overlap_exposed`); others pair whole layers
A2A_OVERLAP_SCHEDULES = ("1f1b", "interleaved")


def a2a_overlap_exposed(lt: LayerTimes, comms: tuple[float, float, float, float], sigma: float,
                        share: float) -> tuple[float, float]:
    """One MoE layer's exposed all-to-all time (forward, backward) under Megatron-Core's 1F1B A2A overlap
    (`overlap_moe_expert_parallel_comm`; Megatron-Bridge's `moe_a2a_overlap`, which also delays the weight gradients),
    as its schedule pairs one micro-batch A's forward layer with another's, B's, backward layer
    (models/common/model_chunk_schedule_plan.py, TransformerLayerSchedulePlan.run, at the Megatron-Core pins of
    Megatron-Bridge v0.4-v0.5 and Megatron-LM's MoE recipes; issue 12's fiftieth round): A's dispatch runs beside B's
    experts' data and weight gradients, B's gradient dispatch beside A's experts, A's combine beside B's attention
    node's gradients, the next layer's gradient combine beside A's next attention node -- two meeting points a layer:

        T_Y = max(max(2 Mf, Df) + Mf, max(Mf, Df) + Db),   T_X = max(max(2 Af, Cf) + Af, max(Af, Cf) + Cb)

    Mf the routed experts' forward (`LayerTimes.modules`' "moe"), Af the rest of the layer (attention, norms, shared
    experts, router), each backward half data and half weight gradient; exposed: T_X + T_Y − 3(Af + Mf), and the
    slowdown σ of the communication hidden.  Only the schedule's steady phase pairs layers (`a2a_paired_share`); the
    warm-up's forward-only layers expose Df + Cf, the cool-down's backward-only ones max(0, Db − Mf) + max(0, Cb − Af).
    Spread per micro-batch as the share says, the paired exposure split between forward and backward as their
    communication is."""
    d_f, c_f, d_b, c_b = comms
    m_f = dict(lt.modules).get("moe", 0.0)
    a_f = max(0.0, lt.fwd - m_f)
    t_y = max(max(2 * m_f, d_f) + m_f, max(m_f, d_f) + d_b)
    t_x = max(max(2 * a_f, c_f) + a_f, max(a_f, c_f) + c_b)
    total = d_f + c_f + d_b + c_b
    exposed = max(0.0, t_x + t_y - 3 * (a_f + m_f))
    paired = exposed + sigma * max(0.0, total - exposed)
    fwd_share = (d_f + c_f) / total if total > 0 else 0.5
    fwd_u, bwd_u = d_f + c_f, max(0.0, d_b - m_f) + max(0.0, c_b - a_f)
    return (share * paired * fwd_share + (1 - share) * fwd_u,
            share * paired * (1 - fwd_share) + (1 - share) * bwd_u)


def a2a_paired_share(c: Choice, rank: int | None = None) -> float:
    """The share of a pipeline rank's layer steps the 1F1B A2A overlap pairs (a forward beside a backward): all but
    the first micro-batch's forward and the last's backward without a pipeline (combined_1f1b.py's
    combined_1f1b_schedule_for_no_pipelining); with one, all but the warm-up's W chunk steps of m·v, W = 2(pp − r − 1)
    + (v − 1)·pp + 1 (schedules.py's interleaved warm-up, its "+ 1" added under the overlap; Megatron-Core requires
    virtual stages with it, plain 1F1B's pp − r − 1 + 1 taken otherwise).  `rank` None: the mean over the ranks."""
    m, v, pp = max(1, c.microbatches), max(1, c.virtual_stages), c.pp
    if pp <= 1:
        return (m - 1) / m
    ranks = range(pp) if rank is None else (rank,)
    out = 0.0
    for r in ranks:
        warm = 2 * (pp - r - 1) + (v - 1) * pp + 1 if v > 1 else pp - r
        out += 1.0 - min(m * v, warm) / (m * v)
    return out / len(ranks)


def moe_host_floor(model: ModelSpec, cluster: Cluster, c: Choice, gpu_f: float, gpu_b: float) -> tuple[float, float]:
    """What one MoE layer's forward and backward wait for their host beyond their GPU work (`gpu_f`, `gpu_b`: the
    layer's compute and exposed collectives): Megatron-Core's dropless layer syncs the host once a layer for the
    tokens per expert, so each layer takes the longer of its GPU work and the host's issue time of its kernels,
    `Cluster.moe_host_s` = (fixed, per routed expert on the rank) seconds forward + backward (hardware.MOE_HOST_S),
    a third forward and two thirds backward (a data and a weight gradient per GEMM).  Zero for a dense model and where
    whole iterations are CUDA graphs (moe_host_s (0, 0))."""
    a, per_expert = cluster.moe_host_s
    if not model.moe or (a <= 0 and per_expert <= 0):
        return 0.0, 0.0
    host = a + per_expert * model.experts / c.expert_shards
    return max(0.0, host / 3 - gpu_f), max(0.0, 2 * host / 3 - gpu_b)


def ep_remote_nodes(model: ModelSpec, cluster: Cluster, c: Choice) -> float:
    """The remote nodes one token's top_k copies reach under balanced routing, when the EP group spans N nodes: of
    the m nodes a token may use, the expected number holding at least one of its k experts is m·(1 - (1 - 1/m)^k)
    (experts drawn uniformly), of which (N - 1)/N are remote.  m = N, or -- group-limited routing
    (models.ModelSpec.route_groups / route_group_topk: DeepSeek-V3's 8 groups, 4 per token, one group per node when
    EP 64 spans 8 nodes) -- the nodes of the token's groups, route_group_topk × max(1, N / route_groups)."""
    g = max(1, min(c.ep, cluster.gpus_per_node // c.etp))  # EP members etp ranks apart (expert-TP innermost)
    nodes = -(-c.ep // g)
    if nodes <= 1:
        return 0.0
    if model.route_consecutive:  # the nodes a token's run of k consecutive experts spans, E/nodes a node
        distinct = consecutive_spans(model.experts, model.top_k, model.experts / nodes)
        return distinct * (nodes - 1) / nodes
    m = float(nodes)
    if model.route_groups and model.route_group_topk:
        m = min(m, model.route_group_topk * max(1.0, nodes / model.route_groups))
    distinct = m * (1 - (1 - 1 / m) ** model.top_k)
    return distinct * (nodes - 1) / nodes


def kv_block_bytes(model: ModelSpec, b: int, tp: int, cp: int, dtype: str) -> float:
    """Bytes of one CP rank's K and V for one micro-batch (b·s/cp tokens at this TP rank's K/V width):
    what a ring hop moves, and (cp = 1) all s tokens' K/V that Llama 3's all-gather assembles."""
    return b * (model.seq_len // cp) * 2 * model.kv_dim_per_rank(tp) * ACT_BYTES[dtype]


def cp_ring_bytes(q: float, kv: float, cp: int) -> tuple[float, float]:
    """HBM bytes (forward, backward) that Transformer Engine's ring attention (AttnFuncWithCP, the
    causal load-balanced "p2p" method Megatron-Core runs; read in TE 1.9 and 2.18) moves outside its
    attention kernels, per layer and micro-batch on one CP rank; q = this rank's Q (= O, = dO) bytes,
    kv = its K and V.  Forward: K and V concatenated into the send buffer (2kv); at each of the cp − 1
    remote steps either half of K/V or half of Q copied contiguous (half the ranks each: (kv + q)/2);
    the output zeroed (q) and each step's partial output merged into it by its softmax statistics
    (read, read, write: 3q, the remote steps at 3/4 of that on average, half of them on half the
    queries).  Backward: K/V copied into the ring buffer (2kv); at each remote step half of K/V or
    half of Q, O and dO copied ((kv + 3q)/2); dQ copied then added per step (2q + 2.5q(cp − 1));
    dK/dV concatenated and accumulated per step (4.5kv, the remote steps at 3/4)."""
    r = cp - 1
    fwd = 2 * kv + r * (kv + q) / 2 + q + 3 * q * (1 + 0.75 * r)
    bwd = 2 * kv + r * (kv + 3 * q) / 2 + 2 * q + 2.5 * q * r + 4.5 * kv * (1 + 0.75 * r)
    return fwd, bwd


def blockwise_attention(cluster: Cluster, c: Choice) -> bool:
    """FlashAttention kernels priced: where the cluster has them on, and always for ring attention
    (cp > 1 runs blockwise by construction) on GPUs the kernel table has them for."""
    return cluster.flash or (c.cp > 1 and cluster.device.flash and cluster.device.kernel_model == "table")


def cp_exchange(model: ModelSpec, c: Choice, link: object, core: float, dtype: str) -> tuple[float, float]:
    """Exposed ring-attention time per layer (forward, backward): cp − 1 hops of this rank's K/V
    block, overlapped with the attention of the remote blocks (core · (cp − 1)/cp); backward moves
    K/V and dK/dV (twice the bytes) against twice the attention work."""
    if c.cp <= 1:
        return 0.0, 0.0
    kv = kv_block_bytes(model, c.micro_batch, c.tp, c.cp, dtype)
    hop = comm.p2p(kv, link).total if not isinstance(link, comm.Cost) else link.total  # type: ignore[arg-type]
    ring = (c.cp - 1) * hop
    window = core * (c.cp - 1) / c.cp
    fwd = max(0.0, ring - window)
    bwd = max(0.0, 2 * ring - 2 * window)
    return fwd, bwd


def cp_all_gather(model: ModelSpec, cluster: Cluster, c: Choice) -> tuple[float, float]:
    """Llama 3's context parallelism per layer (forward, backward): all-gather every CP rank's K/V
    (the s tokens' K and V at this rank's K/V width), then attention of the local queries; backward
    reduce-scatters the dK/dV partials of all s keys back to their owners.  Both sit on the critical
    path (the paper: exposed, and small because GQA makes K/V much smaller than Q).  The CP group's
    neighbours are tp ranks apart (mesh.py), so across nodes it runs on the NICs."""
    if c.cp <= 1:
        return 0.0, 0.0
    full = kv_block_bytes(model, c.micro_batch, c.tp, 1, cluster.dtype)  # all s tokens' K/V
    if cluster.hier:
        ag = comm.collective("all_gather", full, c.cp, c.tp, cluster).total
        rs = comm.collective("reduce_scatter", full, c.cp, c.tp, cluster).total
    else:
        link = links(cluster, c).cp
        ag = comm.all_gather(full, c.cp, link).total  # type: ignore[arg-type]
        rs = comm.reduce_scatter(full, c.cp, link).total  # type: ignore[arg-type]
    return ag, rs


def ulysses_kv_heads(model: ModelSpec, tp: int, cp: int) -> float:
    """K/V heads of one TP rank that Ulysses' all-to-all moves: its own when the cp ranks can split them, else
    each replicated up to cp (one per CP rank; DeepSpeed-Ulysses repeats GQA's K/V heads so)."""
    kvt = model.kv_heads_per_rank(tp)
    return kvt if kvt % cp == 0 else float(cp)


def ulysses_error(model: ModelSpec, tp: int, cp: int) -> str | None:
    """Why DeepSpeed-Ulysses (`--cp-comm a2a`) cannot split this model's heads over tp × cp ranks, or None: each TP
    rank's query heads must divide by cp, and its K/V heads must divide by cp or divide cp (then replicated)."""
    if cp <= 1:
        return None
    if model.heads % tp or (model.heads // tp) % cp:
        return (f"{model.heads} attention heads do not split over tp {tp} × cp {cp} (each CP rank attends with "
                f"heads/(tp·cp) whole heads)")
    kvt = model.kv_heads_per_rank(tp)
    if kvt % cp and cp % kvt:
        return (f"{kvt:g} K/V heads per TP rank neither divide by cp {cp} nor divide it (GQA heads are replicated "
                f"only up to cp)")
    return None


def cp_all_to_all(model: ModelSpec, cluster: Cluster, c: Choice) -> tuple[float, float]:
    """DeepSpeed-Ulysses context parallelism per layer (forward, backward), exposed (Jacobs et al. 2023; Megatron-
    Core's cp_comm_type "a2a"): before the attention an all-to-all turns this rank's b·s/cp tokens × its TP heads of
    Q, K and V into all s tokens × 1/cp of those heads, after it another turns the output back; the backward runs the
    two for the gradients (dO in, dQ/dK/dV out).  Each rank sends its whole tensor, (cp - 1)/cp of it to the others,
    over the CP group, whose members are tp ranks apart (mesh.py)."""
    if c.cp <= 1:
        return 0.0, 0.0
    d = ACT_BYTES[cluster.dtype]
    tok = c.micro_batch * (model.seq_len // c.cp)
    kv_w = ulysses_kv_heads(model, c.tp, c.cp) * model.kv_dim / model.kv
    qkv = tok * (model.q_dim / c.tp + 2 * kv_w) * d
    out = tok * model.o_dim / c.tp * d
    if cluster.hier:
        def a2a(n: float) -> float:
            return comm.all_to_all(n, c.cp, cluster, stride=c.tp).total
    else:
        link = links(cluster, c).cp

        def a2a(n: float) -> float:
            return comm.Cost(link.alpha, (c.cp - 1) / c.cp * n / link.beta).total  # type: ignore[attr-defined]
    return a2a(qkv) + a2a(out), a2a(out) + a2a(qkv)


def cp_exchange_eager(model: ModelSpec, c: Choice, prof: Profile, link: Link, dtype: str) -> tuple[float, float]:
    """Ring-attention exchanges per layer (forward, backward) on a calibrated host running the eager
    runtime (context_parallel.py): each is the measured exchange (`Profile.cp_link`, else the CP
    group's link) plus, for files before `collective_sync`, the older in-step sync (`Profile.sync`;
    otherwise each exchange is a sync point priced by `with_point_sync`),
    and none hides behind the attention — the forward waits for each block before computing it,
    and the host's cores are busy with the ranks' own arithmetic while the backward's transfers
    fly.  Forward: cp − 1 K/V blocks; backward: cp − 1 K/V blocks and cp dK/dV accumulators (the
    last one home)."""
    kv = kv_block_bytes(model, c.micro_batch, c.tp, c.cp, dtype)
    lk = prof.cp_link if prof.cp_link is not None else link
    hop = comm.p2p(kv, lk).total + (prof.sync if prof.cp_link is not None else 0.0)  # `link` is in-step already
    return (c.cp - 1) * hop, (2 * c.cp - 1) * hop


def choice_layer_times(model: ModelSpec, cluster: Cluster, c: Choice) -> LayerTimes:
    """One layer's times as a step of choice `c` on `cluster` prices them: `cp_layer_times` with the
    cluster's kernel and software facts (attention, fp8 scaling, CP exchange, the loss's implementation)."""
    return cp_layer_times(model, cluster.device, cluster.dtype, c.micro_batch, c.tp, c.cp, c.sequence_parallel,
                          blockwise_attention(cluster, c), cluster.fp8_current, cluster.cp_comm == "ring",
                          cluster.cross_entropy, cluster.fp8_block, c.ep, cluster.cp_comm == "a2a",
                          cluster.dispatcher if c.ep > 1 else "", c.etp, cluster.elementwise == "eager")
