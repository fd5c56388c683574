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
(Hierarchical clusters time each bucket by the simulated schedule instead: see the overlap notes below.)
ZeRO-3 gathers the weights of each chunk before its F and B and reduce-scatters the gradients after
B, every micro-batch; the part longer than that compute is exposed.

Context parallelism cp (ring attention: Liu et al. 2023; Megatron-LM's CP with causal load
balancing, each rank holding two mirrored chunks of s/(2cp) tokens): every GEMM runs on the rank's
b·s/cp tokens; the attention core of its s/cp queries runs against all s keys in cp blocks, while
the K/V block of b·s/cp·2·kv_dim/t elements travels one hop around the CP ring per block (cp − 1
hops forward; backward sends K/V again and the dK/dV partials: twice the bytes).  The exchange of
block i+1 overlaps the attention of block i, so the exposed part per layer is
max(0, ring time − attention time of the cp − 1 remote blocks).  CP ranks hold the same weights:
their gradients are reduced (and ZeRO shards) over dp × cp ranks.

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
- DP gradient reduction runs bucket by bucket (`stage_buckets`: the head's parameters ready first, the layers
  last to first, the embedding's ready last and needed first, issue 12's nineteenth round; filling buckets of
  Megatron-Core's size, max(4·10⁷, 10⁶ · DP·CP) parameters, a rank's later model chunks one bucket each,
  `dp_bucket`, its twenty-fifth): a bucket is
  ready when its last layer's last backward of the step ends — read off the simulated schedule, so an
  interleaved rank's chunks, finished one after another through the cool-down, start early — the
  buckets queue on the network, what outlasts the makespan is exposed, and compute slows by σ while
  buckets fly.  With `Cluster.overlap_param_gather` (Megatron-Core's `--overlap-param-gather`,
  Apex's `overlap_param_sync`) the updated weights' all-gather runs one bucket ahead of the next
  step's forward, each bucket needed at its layer's first forward in the schedule; without it the
  whole gather is exposed after the optimizer.
- PyTorch FSDP (`Cluster.fsdp`; its SHARD_GRAD_OP = ZeRO-2, FULL_SHARD / HSDP = ZeRO-3) adds a fitted
  `fsdp_unit_s` (hardware.FSDP_UNIT_S) per wrapped unit (one layer) per micro-batch to the stage that
  holds it, a third to the forward and two thirds to the backward, counted with the ZeRO-3 exposure
  (`dp_comm`): what its runs lose beyond the collectives' time (hardware.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from statistics import NormalDist

from par3d.pipeline.partition import gpt_partition, gpt_round_split
from par3d.pipeline.schedules import V_SCHEDULES, build, check, schedule_placement, sends_to

try:  # the checker's counting step alone (cheap); check() also proves the order deadlock-free
    from par3d.pipeline.schedules import peak_inflight as _count_peaks
except ImportError:  # pragma: no cover
    _count_peaks = None

from . import comm
from .compute import (
    DTYPE_BYTES,
    KERNEL_S,
    MODULE_ABBREV,
    Gemm,
    LayerTimes,
    consecutive_spans,
    ep_destination_ranks,
    gemm_time,
    layer_gemms,
    layer_times,
    model_flops_per_sequence,
    newton_schulz_layer_flops,
    recompute_flops_per_sequence,
    recompute_modules,
    recomputes_core,
)
from .hardware import NVLINK4_EFF, TFLOPS, Cluster, Link, mesh_share
from .memory import (
    ACT_BYTES,
    FRAGMENTATION,
    MemoryBreakdown,
    RankShape,
    activation_terms,
    layer_activation_bytes,
    logits_bytes,
    rank_activations,
    rank_states,
    state_bytes_per_param,
    state_terms,
)
from .models import ModelSpec
from .profile import Profile, contention
from .replay import Marks, program, replay_marks

ADAM_BYTES_PER_PARAM = 28.0  # read fp32 master, m, v + bf16 grad (14 B); write master, m, v + bf16 weight (14 B)
# The table kernel model's optimizer step, as Megatron-LM's mixed-precision optimizer runs it, in HBM
# bytes per parameter: unscale the fp32 main gradient (read 4, write 4), check it for inf/NaN (read
# 4), its norm for clipping (read 4), fused Adam (read master, grad, m, v: 16; write master, m, v: 12),
# copy the master to the 16-bit weight (read 4, write 2), zero the gradient buffer (write 4).
OPTIMIZER_STEP_BYTES = 4 + 4 + 4 + 4 + 16 + 12 + 4 + 2 + 4
# DeepSpeed's BF16_Optimizer (Cluster.bf16_optimizer; DeepSpeed's olruwase/bf16-updates branch, 77b649d1 ... 93e9307d,
# which BLOOM-176B ran: runtime/bf16_optimizer.py, runtime/pipe/engine.py, runtime/engine.py), HBM bytes per parameter:
# each micro-batch's backward ends by adding the bf16 gradients into the full fp32 buffer (update_hp_grads:
# `.to(torch.float32)` reads 2 B and writes 4, `add_` reads 4 + 4 and writes 4); the step's reduction casts the fp32
# buffer to bf16 (read 4, write 2), scales it by 1/dp (read 2, write 2) and copies it back (read 2, write 4) around a
# bf16 all-reduce; the optimizer reads the full fp32 gradients for the norm (4) and zeroes them (4), and runs fused Adam
# (28) and the copy to the bf16 weights (read 4, write 2) on the rank's 1/dp shard.  Not priced: the tied embedding's
# fp32 all-reduce between the first and last stage, a host sync per parameter tensor for the norm, and the clipping
# pass when the norm exceeds the clip (issue 12's fiftieth round)
BF16_OPTIMIZER_ACCUM_BYTES = 2 + 4 + 4 + 4 + 4
BF16_OPTIMIZER_CAST_BYTES = 4 + 2 + 2 + 2 + 2 + 4
BF16_OPTIMIZER_FULL_BYTES = 4 + 4
BF16_OPTIMIZER_SHARD_BYTES = 28 + 4 + 2
# A bf16 gradient's round trip through an fp32 bucket for its reduction (Cluster.grad_reduce_cast; Aleph Alpha's scaling
# 737f855, src/scaling/core/optimizer/allreduce.py, issue 12's fifty-first round), HBM bytes per parameter: the bucket
# flattened (read 2, write 2), scaled by 1/dp in place (2 + 2), cast to fp32 (2 + 4), after the all-reduce copied back
# into the bf16 flat tensor (4 + 2) and from it into each gradient (2 + 2)
GRAD_CAST_BYTES = 4 + 4 + 6 + 6 + 4


@dataclass(frozen=True)
class Choice:
    tp: int
    pp: int
    dp: int
    micro_batch: int
    microbatches: int
    schedule: str = "1f1b"
    virtual_stages: int = 1
    recompute: str = "none"
    zero_stage: int = 0
    sequence_parallel: bool = False
    cp: int = 1  # context-parallel degree (ring attention); mesh order tp, cp, pp, dp
    # HSDP: the DP group splits into dp_replicate replicas of dp / dp_replicate ranks each (the inner,
    # nearer ranks); ZeRO shards its states over one replica (× cp) and all-reduces the shards' gradients
    # across replicas.  torchtitan's data_parallel_replicate_degree, FSDP's HYBRID_SHARD, Megatron-Core's
    # num_distributed_optimizer_instances, DeepSpeed's MiCS.  1: ZeRO shards over the whole group.
    dp_replicate: int = 1
    # full recomputation of only the first `recompute_layers` layers of every chunk (Megatron-LM's
    # --recompute-method block --recompute-num-layers N); 0: every layer (recompute == "full" only)
    recompute_layers: int = 0
    # expert parallelism (a mixture of experts: models.ModelSpec.moe): the routed experts split over ep ranks of the
    # tp × cp × dp ranks of a stage (Megatron-Core's parallel folding, expert-tensor-parallel size 1), E/ep whole
    # experts each; the ranks holding the same experts (expert_dp of them) reduce their gradients together
    ep: int = 1
    # expert tensor parallelism (Megatron-Core's --expert-tensor-parallel-size): each routed expert's fc1 column-split
    # and fc2 row-split over etp ranks, innermost in the expert grid (etp x ep x expert_dp = tp x cp x dp); the
    # received copies all-gathered over them before the experts and reduce-scattered after (ep_exchange)
    etp: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def expert_shards(self) -> int:
        """Ranks one layer's routed experts are spread over: ep x etp (each rank holds 1/(ep·etp) of them)."""
        return self.ep * self.etp

    @property
    def expert_dp(self) -> int:
        """Ranks holding the same routed-expert shard: a stage's tp × cp × dp ranks over ep × etp."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)

    @property
    def dp_split(self) -> str:
        """HSDP's DP group as replicas x shard ranks ("4x8")."""
        return f"{self.dp_replicate}x{self.dp // self.dp_replicate}"

    @property
    def recompute_label(self) -> str:
        """The recomputation, with the block method's layers per chunk ("full(5)"); Megatron-Core's named modules
        shortened for a table column ("sel:up,act" for selective:mla_up_proj,moe_act; the JSON keeps the names)."""
        if self.recompute.startswith("selective:"):
            return "sel:" + ",".join(MODULE_ABBREV.get(m, m) for m in self.recompute[len("selective:"):].split(","))
        return f"{self.recompute}({self.recompute_layers})" if self.recompute_layers else self.recompute

    @property
    def zero_shards(self) -> int:
        """Ranks one ZeRO state is sharded over: the DP replica's dp / dp_replicate ranks × cp."""
        return (self.dp // self.dp_replicate) * self.cp

    def label(self) -> str:
        v = f" v={self.virtual_stages}" if self.virtual_stages > 1 else ""
        cp = f" cp={self.cp}" if self.cp > 1 else ""
        rep = f"({self.dp_split})" if self.dp_replicate > 1 else ""
        ep = (f" ep={self.ep}" if self.ep > 1 else "") + (f" etp={self.etp}" if self.etp > 1 else "")
        return (f"tp={self.tp}{cp} pp={self.pp} dp={self.dp}{rep}{ep} mb={self.micro_batch} m={self.microbatches} "
                f"{self.schedule}{v} recompute={self.recompute_label} zero={self.zero_stage} "
                f"sp={'on' if self.sequence_parallel else 'off'}")


def fsdp_unit_priced(cluster: Cluster, c: Choice) -> bool:
    """Whether `stage_times` charges PyTorch FSDP's per-unit cost (hardware.FSDP_UNIT_S): `--fsdp` on a GPU
    cluster, its sharding strategies (ZeRO-2 SHARD_GRAD_OP, ZeRO-3 FULL_SHARD / HSDP), more than one rank
    holding the same weights."""
    return cluster.fsdp and cluster.hier and c.zero_stage >= 2 and c.dp * c.cp > 1


def recomputed_layers(c: Choice, n: int) -> int:
    """Layers of an n-layer chunk that pay a layer's recompute (the forward under full recomputation, the
    attention core under selective, nothing under none): every layer, or the first `c.recompute_layers`
    under Megatron-LM's block method (full recomputation only)."""
    return min(n, c.recompute_layers) if c.recompute_layers > 0 else n


@dataclass(frozen=True)
class Options:
    """Modelling choices that are not part of the layout (flags of `par3d plan`)."""

    memory_accounting: str = "seed"  # "seed" (16 B/param) or "megatron" (fp32 main grads): memory.py
    memory_headroom: float = 0.05  # share of capacity a fitting plan leaves free (allocator, spikes)
    optimizer_dtype: str = "fp32"  # Adam's state dtype: "bf16" = NeMo's distributed_fused_adam dtype bf16 (memory.py)
    flash_attention: bool = False  # blockwise attention: no s² scores stored (always so with cp > 1)
    # rank plans whatever memory.py says of them (each still reports `fits` against `capacity`): to price a
    # published layout the memory model rejects (`par3d plan --ignore-memory`), as the validation set prices
    # its `evaluate_unfit` rows
    ignore_memory: bool = False

    def capacity(self, cluster: Cluster) -> float:
        """Bytes a fitting plan may use."""
        return cluster.device.mem_bytes * (1.0 - self.memory_headroom)


DEFAULT_OPTIONS = Options()


# ---- pipeline layout -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """Per global virtual stage: layers, whether it has the embedding / the head."""

    layers: tuple[int, ...]
    embed: tuple[bool, ...]
    head: tuple[bool, ...]
    # of each stage's layers, how many are a mixture of experts' dense layers (models.ModelSpec.dense_layers, moe_step;
    # the leading ones first in the stage, as in the model; interleaved ones are priced as if first too: only the block
    # method's recomputed layers read the order); all zero otherwise
    dense: tuple[int, ...] = ()

    def dense_of(self, s: int) -> int:
        return self.dense[s] if self.dense else 0


def megatron_split(layers: int, chunks: int) -> tuple[int, ...] | None:
    """The layers per chunk Megatron-Core builds without a pipeline_model_parallel_layout or first/last-stage layer
    counts (TransformerConfig.__post_init__, transformer_block.get_num_layers_to_build): the layers evenly over the
    pp x vp chunks when they divide, else -- with account_for_embedding_in_pipeline_split and
    account_for_loss_in_pipeline_split, which a recipe must then set -- the embedding and the loss counted as a layer
    each, in the first and the last chunk, when layers + 2 divide.  None where neither does: a run of such a shape
    gave its stages' layer counts, which a row states as its pipeline_layout."""
    if chunks <= 1:
        return None
    if layers % chunks == 0:
        return (layers // chunks,) * chunks
    if (layers + 2) % chunks == 0:
        k = (layers + 2) // chunks
        return (k - 1,) + (k,) * (chunks - 2) + (k - 1,)
    return None


@lru_cache(maxsize=1024)
def layout(model: ModelSpec, chunks: int) -> Layout:
    # (the multi-token-prediction modules weigh on the head's stage, which the partition then gives fewer layers, as
    # Megatron-Bridge's DeepSeek-V3 layouts do: "...|tmL", one layer beside the MTP module and the loss)
    if model.pipeline_split and len(model.pipeline_split) != chunks:
        raise ValueError(f"pipeline layout {','.join(map(str, model.pipeline_split))} has "
                         f"{len(model.pipeline_split)} chunks, the schedule {chunks} (pp × virtual stages)")
    # the layout given (Megatron-Core's pipeline_model_parallel_layout), else Megatron-Core's default split for a
    # model that says it ran on Megatron (ModelSpec.partition), else the balanced partition
    split = model.pipeline_split or (megatron_split(model.layers, chunks) if model.partition == "megatron" else None)
    bounds = gpt_partition(model.layers, chunks, model.hidden, model.seq_len, model.vocab, model.ffn_hidden,
                           model.mtp_layers, split=split).bounds
    last = model.layers + 1
    layers, embed, head, dense = [], [], [], []
    for a, b in bounds:
        layers.append(sum(1 for u in range(a, b) if 1 <= u <= model.layers))
        dense.append(sum(1 for u in range(a, b) if 1 <= u <= model.layers and not model.is_moe_layer(u)))
        embed.append(a == 0)
        head.append(b > last)
    return Layout(tuple(layers), tuple(embed), tuple(head), tuple(dense) if model.dense_count else ())


SPLIT_BACKWARD = ("zb-h1",) + V_SCHEDULES
"""Schedules that split backwards into BI and BW (dualpipe-v runs full Bs too)."""


def mtp_params_per_rank(model: ModelSpec, tp: int, ep: int) -> float:
    """A rank's share of the multi-token-prediction modules (models.ModelSpec.mtp_layers; on the stage with the head,
    as Megatron-Core places them with the loss): each a layer of the model's kind and its 2h x h projection and norms."""
    if not model.mtp_layers:
        return 0.0
    h = model.hidden
    return model.mtp_layers * (model.layer_params_per_rank(tp, ep) + (2 * h * h + 2 * model.norm_params) / tp)


def mtp_forward(model: ModelSpec, dev: object, dtype: str, b: int, tp: int, lt: LayerTimes, cp: int = 1) -> float:
    """One micro-batch's forward through the multi-token-prediction modules: per module a layer (`lt`), the 2h -> h
    projection over this rank's b·s/cp tokens and a second pass of the output head and loss (`lt.head_fwd`)."""
    if not model.mtp_layers:
        return 0.0
    proj = _mtp_proj_time(b * (model.seq_len // cp), model.hidden, tp, dev, dtype)
    return model.mtp_layers * (lt.fwd + lt.head_fwd + proj)


@lru_cache(maxsize=4096)  # a search asks ~10⁵ times for a few shapes: the Gemm is built and hashed once per shape
def _mtp_proj_time(tokens: int, hidden: int, tp: int, dev: object, dtype: str) -> float:
    return gemm_time(Gemm("mtp_proj", tokens, hidden // tp, 2 * hidden), dev, dtype)  # type: ignore[arg-type]


def default_schedule(v: int) -> str:
    """The round-robin schedule of v chunks per rank: what a caller that names no schedule means."""
    return "1f1b" if v == 1 else "interleaved"


@lru_cache(maxsize=1024)
def stage_placement(schedule: str, p: int, v: int) -> tuple[int, ...]:
    """The rank of each global stage, as the schedule module declares it for this builder
    (`schedules.schedule_placement`, which a test checks against `placement` of every built
    schedule): round-robin for most, the V (rank r holds r and 2p-1-r) for zb-v and dualpipe-v."""
    return tuple(schedule_placement(schedule, p, v))


@lru_cache(maxsize=1024)
def rank_stage_lists(schedule: str, p: int, v: int) -> tuple[tuple[int, ...], ...]:
    """Per rank, the global stages it holds, in increasing order (its chunks 0, 1, ...)."""
    lists: list[list[int]] = [[] for _ in range(p)]
    for s, r in enumerate(stage_placement(schedule, p, v)):  # one pass: p·v stages, not p² · v tests
        lists[r].append(s)
    return tuple(tuple(x) for x in lists)


@lru_cache(maxsize=1024)
def rank_shapes(model: ModelSpec, tp: int, pp: int, v: int, schedule: str | None = None,
                ep: int = 1) -> tuple[RankShape, ...]:
    """Parameters held by each pipeline rank, on the schedule's placement (`stage_placement`;
    no schedule: the round-robin one, stage s on rank s % pp).  On the V, rank 0 holds both the
    embedding (stage 0) and the head (stage 2p-1).  A mixture of experts' E/ep routed experts per layer
    are counted apart too (`RankShape.expert_params`)."""
    lay = layout(model, pp * v)
    out = []
    per_layer = model.layer_params_per_rank(tp, ep)
    per_expert_layer = model.expert_layer_params() / ep
    per_dense = model.dense_variant().layer_params_per_rank(tp) if model.dense_count else 0.0
    for stages in rank_stage_lists(schedule or default_schedule(v), pp, v):
        params = vocab = 0.0
        for s in stages:
            params += (lay.layers[s] - lay.dense_of(s)) * per_layer + lay.dense_of(s) * per_dense
            if lay.embed[s]:
                params += model.embedding_params() / tp
                vocab += model.embedding_params() / tp
            if lay.head[s]:  # a separate copy when tied but on another stage (Megatron)
                head = (model.head_params() if (not model.tied or pp > 1) else model.norm_params) / tp
                params += head + mtp_params_per_rank(model, tp, ep)  # multi-token prediction rides with the loss
                vocab += head
        mtp_experts = model.mtp_layers * per_expert_layer if any(lay.head[s] for s in stages) else 0.0
        out.append(RankShape(params, tuple(lay.layers[s] for s in stages), any(lay.head[s] for s in stages),
                             sum(lay.layers[s] - lay.dense_of(s) for s in stages) * per_expert_layer + mtp_experts,
                             vocab, sum(lay.dense_of(s) for s in stages)))
    return tuple(out)


# ---- peak in-flight activations, from the schedule checker --------------------------------------

def peak_inflight(schedule: str, p: int, m: int, v: int) -> tuple[int, ...]:
    """The checker's per-rank peak of live (stage, micro-batch) activations.

    The peaks of 1F1B, interleaved and ZB-H1 stop growing once m >= 2p (their warm-up is at most
    2(p-1) + (v-1)p units); GPipe's peak is m.  So the schedule is checked with m' = min(m, 2p)
    (a multiple of p for interleaved whenever m is) and GPipe's peak is m; a test compares this
    with the check at the full m.
    """
    if p == 1 and schedule not in V_SCHEDULES:
        return (1 if schedule != "gpipe" else m,)
    mm = min(m, 2 * p)
    peaks = counted_peaks(schedule, p, mm, v)
    if schedule == "gpipe" and mm < m:
        return (m,) * p
    return peaks


@lru_cache(maxsize=4096)
def counted_peaks(schedule: str, p: int, m: int, v: int) -> tuple[int, ...]:
    """The checker's peak counts, counted from the builders' warm-up rules (pipeline/schedules.py)
    instead of building the lists: building them was most of the search's time.  Rank r:
    - GPipe: m;  1F1B: w = min(p-r-1, m) warm-up forwards, then F/B pairs: min(p - r, m);
    - interleaved: w = min(2(p-r-1) + (v-1)p, m·v) warm-up units, then F/B pairs: min(w + 1, m·v);
    - ZB-H1: w = min(p-r-1, m), then F/BI pairs with up to r BWs deferred: w + 1 + min(r, m-w-1);
    - ZB-V: min(2m, 2p) chunks on every rank (its F rule's cap; the orders built for the planner's chunk times,
      `zbv_times`, keep it too: tests/test_plan_v_schedules.py);
    - DualPipe-V (m >= 2p): 2p + 1 chunks on every rank.
    A test compares them with the checker on every (p, m, v) up to p = 12; `validate_schedule`
    compares them again on every plan it reports."""
    out = []
    for r in range(p):
        if schedule == "gpipe":
            out.append(m)
        elif schedule == "1f1b":
            out.append(min(p - r, m))
        elif schedule == "interleaved":
            out.append(min(min(2 * (p - r - 1) + (v - 1) * p, m * v) + 1, m * v))
        elif schedule == "zb-h1":
            w = min(p - r - 1, m)
            out.append(w if m - w < 1 else w + 1 + min(r, m - w - 1))
        elif schedule == "zb-v":  # its F rule caps live chunks at 2p; each micro-batch brings two
            out.append(min(2 * m, 2 * p))
        elif schedule == "dualpipe-v":  # m >= 2p: 2p warm-up chunks, one more before the first B
            out.append(2 * p + 1)
        else:
            return _checked_peaks(schedule, p, m, v)
    return tuple(out)


@lru_cache(maxsize=8192)
def interleaved_peak_layers(p: int, m: int, v: int, r: int, layers: tuple[int, ...]) -> int:
    """Rank r's peak of live layer activations under the interleaved schedule (pipeline/schedules.
    interleaved: forward unit k runs chunk (k mod pv) // p, backward unit k chunk v-1-(k mod pv) // p;
    `warm` forwards, then F(warm + j) before B(j)), each live (micro-batch, chunk) holding that chunk's
    `layers`.  The count `counted_peaks` gives times the mean layers per chunk is exact only when the
    rank's chunks are equal; the embedding-only and head-only chunks (Llama 3's balance) and the
    partition's uneven splits make them differ, and the warm-up runs more units of the early chunks.
    Live layers after F(warm + j) = S_F(warm + j + 1) - S_B(j), with S the running sums of each order;
    both grow by p·Σ layers every p·v units, so one period of j holds every value."""
    pv, total = p * v, m * v
    warm = min(2 * (p - r - 1) + (v - 1) * p, total)
    f_pre, b_pre = [0], [0]
    for k in range(pv):
        f_pre.append(f_pre[-1] + layers[k // p])
        b_pre.append(b_pre[-1] + layers[v - 1 - k // p])
    per = f_pre[-1]
    peak = (warm // pv) * per + f_pre[warm % pv]  # S_F(warm): the warm-up's forwards
    steady = min(total - warm, pv)  # j < pv, so S_B(j) = b_pre[j]
    if steady > 0:
        peak = max(peak, max(((warm + j + 1) // pv) * per + f_pre[(warm + j + 1) % pv] - b_pre[j]
                             for j in range(steady)))
    return peak


def peak_layers(schedule: str, p: int, m: int, v: int, shapes: tuple[RankShape, ...],
                peaks: tuple[int, ...] | None = None) -> tuple[float, ...]:
    """Per rank, the peak of live layer activations: the interleaved schedule's counted chunk by chunk
    (`interleaved_peak_layers`); every other schedule's as its peak count (`peak_inflight`) times the
    rank's mean layers per chunk — exact with one chunk per rank; on the V schedules (two chunks) a mean."""
    peaks = peaks if peaks is not None else peak_inflight(schedule, p, m, v)
    if schedule == "interleaved" and p > 1:
        mm = min(m, 3 * p)  # a multiple of p whenever m is; covers the warm-up and one full period
        return tuple(float(interleaved_peak_layers(p, mm, v, r, shape.layers)) for r, shape in enumerate(shapes))
    return tuple(n * sum(shape.layers) / max(len(shape.layers), 1) for n, shape in zip(peaks, shapes))


@lru_cache(maxsize=256)
def _checked_peaks(schedule: str, p: int, m: int, v: int) -> tuple[int, ...]:
    """The checker's peak counts from the built schedule."""
    sched = build(schedule, p, m, v)
    if _count_peaks is not None:
        return tuple(_count_peaks(sched))
    return tuple(check(sched, p, m, v).peak_inflight)


@lru_cache(maxsize=256)
def validate_schedule(schedule: str, p: int, m: int, v: int) -> tuple[int, ...]:
    """Full check (dependencies, deadlock freedom) of a reported plan's schedule, at min(m, 2p), and
    the check that the search's peak counts are the checker's."""
    mm = min(m, 2 * p) if p > 1 else m
    peaks = tuple(check(build(schedule, p, mm, v), p, mm, v).peak_inflight)
    if (p > 1 or schedule in V_SCHEDULES) and peaks != counted_peaks(schedule, p, mm, v):
        raise AssertionError(f"{schedule} p={p} m={mm} v={v}: counted peaks {counted_peaks(schedule, p, mm, v)} "
                             f"differ from the checker's {peaks}")
    return peaks


# ---- per-stage durations -------------------------------------------------------------------------

@dataclass
class StageTimes:
    """Per global virtual stage, one micro-batch; every list has p·v entries (seconds)."""

    f: list[float]
    b: list[float]
    bi: list[float]
    bw: list[float]
    f_compute: list[float]  # parts, for the breakdown
    b_compute: list[float]
    b_recompute: list[float]
    tp_comm: list[float]  # F + B
    zero3: list[float]  # exposed ZeRO-3 gathers/scatters, F + B
    transfer: float
    cp_comm: list[float] = field(default_factory=list)  # exposed ring-attention K/V exchange, F + B
    # with a runtime profile (plan/profile.py): the fixed costs added per stage to F and to each
    # backward pass (B, and BI and BW alike: each is one autograd pass), and the waits inside each
    # action (TP / ZeRO-3 collectives), which need no core
    fixed_f: list[float] = field(default_factory=list)
    fixed_b: list[float] = field(default_factory=list)
    waits: dict[str, list[float]] = field(default_factory=dict)
    offload: list[float] = field(default_factory=list)  # exposed activation offload copies, F + B (offload_exposed)
    ep_comm: list[float] = field(default_factory=list)  # a mixture of experts' token all-to-alls, F + B (ep_exchange)
    host: list[float] = field(default_factory=list)  # a mixture of experts' host floor beyond its GPU work, F + B
    # the framework's point-to-point calls hold the sending rank until delivered (`p2p_blocks`): the simulator's
    # `blocking`
    blocking: bool = False


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
    ep = etp = 1."""
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
    return d_f, c_f, d_b, c_b


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


def choice_layer_times(model: ModelSpec, cluster: Cluster, c: Choice) -> LayerTimes:
    """One layer's times as a step of choice `c` on `cluster` prices them: `cp_layer_times` with the
    cluster's kernel and software facts (attention, fp8 scaling, CP exchange, the loss's implementation)."""
    return cp_layer_times(model, cluster.device, cluster.dtype, c.micro_batch, c.tp, c.cp, c.sequence_parallel,
                          blockwise_attention(cluster, c), cluster.fp8_current, cluster.cp_comm == "ring",
                          cluster.cross_entropy, cluster.fp8_block, c.ep, cluster.cp_comm == "a2a",
                          cluster.dispatcher if c.ep > 1 else "", c.etp, cluster.elementwise == "eager")


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
        bc = 2 * fc + bf16_optimizer_accumulation(cluster, home.params / len(home.layers))
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
        # (f, b, bi, bw, f_compute, b_compute, b_recompute, tp_comm, cp_comm, zero3, offload, ep_comm, host): split
        # backwards (zb-h1, zb-v, dualpipe-v): BI = input-gradient GEMMs + recompute + TP/CP/EP collectives; BW =
        # weight-gradient GEMMs
        row = seen[key] = (f, b, fc + br + b_tp + b_cp + z3b + off_b + b_ep + hb, fc, fc, bc, br, f_tp + b_tp,
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
                "bi": [bi - fc - br for bi, fc, br in zip(st.bi, st.f_compute, st.b_recompute)],
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
            bi_fix = max(0.0, b_fix - st.bw[s] - st.b_recompute[s])
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


def makespan_lower_bound(st: StageTimes, c: Choice) -> float:
    """A valid lower bound on the simulated makespan (used to prune before simulating).

    Rank r cannot start before micro-batch 0 has gone forward through the stages below its
    lowest one, s_r (r on both placements), must then do its own work, and (except for the split
    backwards, whose last actions may be weight gradients) its last backward must still flow back
    through stages s_r-1..0.  Transfers count where consecutive stages sit on two ranks.  Tight for
    GPipe/1F1B with equal stages.
    """
    busy = rank_busy(st, c)
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

def zbv_times(st: StageTimes, c: Choice) -> tuple[float, float, float] | None:
    """The (F, BI, BW) of one chunk a ZB-V schedule is built with (`schedules.zero_bubble_v`), or None for every
    other schedule.  ZB-V orders its actions by simulating them, so its order depends on those times; the Zero
    Bubble authors' runtime (sail-sg/zero-bubble-pipeline-parallelism, megatron/training.py, the V scheduler)
    profiles each stage's F, B and W, averages each over the stage's chunks and builds the schedule with the middle
    value across stages (the upper median).  The plan prices what that runtime runs: each rank's chunk times
    averaged, the upper median over ranks, as ratios to F rounded to two significant digits (near-equal
    candidates share one built order).  `par3d train` builds it with equal times unless given others
    (docs/pipeline.md); with times far from equal the equal-time order idles every rank (issue 12's forty-second
    round)."""
    if c.schedule != "zb-v":
        return None
    lists = rank_stage_lists(c.schedule, c.pp, c.virtual_stages)

    def mid(xs: list[float]) -> float:
        per = sorted(sum(xs[s] for s in stages) / len(stages) for stages in lists)
        return per[len(per) // 2]

    f, bi, bw = mid(st.f), mid(st.bi), mid(st.bw)
    if f <= 0 or bi <= 0 or bw <= 0:
        return None
    return (1.0, float(f"{bi / f:.2g}"), float(f"{bw / f:.2g}"))


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


# ---- memory --------------------------------------------------------------------------------------

def memory_accounting(opts: Options, cluster: Cluster) -> str:
    """The state accounting memory.py counts: fp32 gradient reduction keeps fp32 (main) gradients,
    4 B per parameter, as Megatron's accounting does."""
    if cluster.bf16_optimizer:  # DeepSpeed's BF16_Optimizer: its full fp32 gradient buffer beside the bf16 grads
        return "bf16_optimizer"
    return "megatron" if cluster.grad_reduce_fp32 else opts.memory_accounting


def partial_activation_bytes(model: ModelSpec, b: int, tp: int, sp: bool, dtype: str, cp: int, flash: bool,
                             chunks: int, rec_layers: int, etp: int = 1) -> float:
    """One layer's stored activations, averaged over a chunk of which the first `rec_layers` keep only their
    input (full recomputation) and the rest keep everything (Megatron-LM's block method); the chunk is the
    model's mean, layers / chunks (an embedding or head chunk is not told apart)."""
    n = model.layers / chunks
    full = layer_activation_bytes(model, b, tp, sp, "full", dtype, cp, flash, etp)
    if rec_layers >= n:  # every layer: plain full recomputation
        return full
    none = layer_activation_bytes(model, b, tp, sp, "none", dtype, cp, flash, etp)
    return (rec_layers * full + (n - rec_layers) * none) / n


@lru_cache(maxsize=8192)
def _memory_scan(model: ModelSpec, dtype: str, flash: bool, tp: int, pp: int, v: int, schedule: str, m: int,
                 b: int, sp: bool, recompute: str, cp: int, rec_layers: int = 0,
                 cross_entropy: str = "unfused", ep: int = 1, etp: int = 1) -> tuple:
    """What `memory` reads that no ZeRO stage changes (the search asks for every stage of one layout); `ep` the
    ranks one layer's routed experts spread over (ep x etp), `etp` expert tensor parallelism."""
    shapes, peaks, live, heavy = _schedule_scan(model, tp, pp, v, schedule, m, ep)

    def of_layer(k: ModelSpec) -> float:
        if recompute == "full" and rec_layers > 0:
            return partial_activation_bytes(k, b, tp, sp, dtype, cp, flash, pp * v, rec_layers, etp)
        return layer_activation_bytes(k, b, tp, sp, recompute, dtype, cp, flash, etp)

    per_layer = of_layer(model)
    per_rank: tuple[float, ...] = ()
    if model.dense_count:  # a mixture of experts' dense layers: each rank's layers at their own kinds' mean (its dense
        # and MoE layers counted over its chunks, `Layout.dense`); the larger of the two for the one-number estimate
        dense = of_layer(model.dense_variant())
        for shape in shapes:
            n, nd = sum(shape.layers), shape.dense_layers
            per_rank += (((n - nd) * per_layer + nd * dense) / n if n else max(per_layer, dense),)
        per_layer = max(per_layer, dense)
    return shapes, peaks, per_layer, logits_bytes(model, b, tp, cp, cross_entropy), live, heavy, per_rank


@lru_cache(maxsize=4096)
def _schedule_scan(model: ModelSpec, tp: int, pp: int, v: int, schedule: str, m: int, ep: int = 1) -> tuple:
    """The part of `_memory_scan` that neither the micro-batch's size nor recomputation changes: each rank's
    shape, the schedule's peak in-flight micro-batches, the live layers at the peak and the heaviest ranks."""
    shapes = rank_shapes(model, tp, pp, v, schedule, ep)
    peaks = peak_inflight(schedule, pp, m, v)
    live = _peak_layers(schedule, pp, m, v, shapes, peaks)
    return shapes, peaks, live, _heavy_ranks(model, tp, pp, v, live, schedule, ep)


def memory(model: ModelSpec, cluster: Cluster, c: Choice,
           opts: Options | None = None) -> tuple[MemoryBreakdown, int]:
    """The heaviest rank's memory and that rank."""
    # fast scan: states ∝ params, activations ∝ in-flight × layers per chunk (memory.rank_memory)
    opts = opts or DEFAULT_OPTIONS
    acc, flash = memory_accounting(opts, cluster), opts.flash_attention or cluster.flash
    # PyTorch's pipeline stages keep an FSDP2 stage's weights gathered and its gradients unreduced through the step
    # (stage_times: no reshard, no gradient sync between micro-batches): its memory is ZeRO-1's, the optimizer's state
    # alone sharded
    zero = 1 if cluster.fsdp and c.pp > 1 and c.zero_stage >= 3 else c.zero_stage
    off = cluster.offload_optimizer
    if model.moe or model.mtp_layers:
        # a mixture of experts' expert states shard over expert_dp, not dp x cp, and multi-token prediction adds
        # to the head's rank: the one-coefficient estimate below would mis-rank them, so the few candidate ranks
        # are priced in full (their activations kept for every ZeRO stage: `_heavy_activations`); the first of equal
        # totals (MemoryBreakdown.total's sum, in its order)
        ranks = _heavy_activations(
            model, cluster.precision, flash, c.tp, c.pp, c.virtual_stages, c.schedule, c.microbatches, c.micro_batch,
            c.sequence_parallel, c.recompute, c.cp, c.recompute_layers, cluster.cross_entropy, c.expert_shards, c.etp,
            cluster.offload_layers)
        states = _state_terms(model, cluster, c, opts, zero, acc)
        best, arg, most = None, 0, 0.0
        for r, shape, act, other in ranks:
            w, g, o, a, oth = rank_states(states, shape, act, other)
            if off:  # an offloaded share of the optimizer states lives in host memory (Cluster.offload_optimizer)
                o = o * (1.0 - off)
            total = w + g + o + a + oth
            if best is None or total > most:
                best, arg, most = (w, g, o, a, oth), r, total
        return MemoryBreakdown(*best), arg  # type: ignore[misc]
    shapes, peaks, per_layer, logits, live, heavy, per_rank = _memory_scan(
        model, cluster.precision, flash, c.tp, c.pp, c.virtual_stages, c.schedule, c.microbatches, c.micro_batch,
        c.sequence_parallel, c.recompute, c.cp, c.recompute_layers, cluster.cross_entropy, c.expert_shards, c.etp)
    w, g, o = state_bytes_per_param(cluster.dtype, zero, c.zero_shards, acc, opts.optimizer_dtype, cluster.optimizer)
    o *= 1.0 - off
    # total = states + (1 + fragmentation) · activations + a part equal on every rank (memory.py), so
    # this picks the rank rank_memory would find heaviest
    act_scale = 1.0 + FRAGMENTATION
    arg, top = 0, -1.0
    for r, params, units, head, _ in heavy:
        est = (w + g + o) * params + act_scale * (units * per_layer + (logits if head else 0.0))
        if est > top:
            arg, top = r, est
    states = _state_terms(model, cluster, c, opts, zero, acc)
    acts = activation_terms(model, tp=c.tp, b=c.micro_batch, sp=c.sequence_parallel, recompute=c.recompute,
                            dtype=cluster.precision, cp=c.cp, flash=flash, cross_entropy=cluster.cross_entropy, etp=c.etp)
    act, other = rank_activations(acts, model.mtp_layers, shapes[arg], peaks[arg],
                                  offloaded_live(live[arg], cluster.offload_layers, c),
                                  per_rank[arg] if per_rank else per_layer if c.recompute_layers else None)
    w, g, o, a, oth = rank_states(states, shapes[arg], act, other)
    if off:  # (as above)
        o = o * (1.0 - off)
    return MemoryBreakdown(w, g, o, a, oth), arg


def _state_terms(model: ModelSpec, cluster: Cluster, c: Choice, opts: Options, zero: int, acc: str) -> tuple:
    """memory.state_terms of choice `c` (its heaviest rank's states, as memory.rank_memory counts them)."""
    return _states(model, cluster.precision, cluster.optimizer, cluster.zero3_unit, opts.optimizer_dtype, acc, zero,
                   c.zero_stage, c.tp, c.dp // c.dp_replicate, c.cp, c.expert_dp, c.expert_shards)


@lru_cache(maxsize=4096)  # a search asks ~10⁵ times for a few hundred (ZeRO stage, tp, dp, cp, ep) groups
def _states(model: ModelSpec, dtype: str, optimizer: str, unit: str, optimizer_dtype: str, acc: str, zero: int,
            zero_stage: int, tp: int, dp: int, cp: int, expert_dp: int, expert_shards: int) -> tuple:
    """`_state_terms` from the fields it reads (the cluster's own -- its dtype, optimizer and ZeRO-3 unit -- so that
    a cluster whose profile does not hash is keyed as well)."""
    zero3_live = _zero3_live(model, unit, zero_stage, tp, expert_shards) if zero >= 3 else None
    return state_terms(model, tp=tp, dp=dp, zero=zero, dtype=dtype, cp=cp, accounting=acc, zero3_live=zero3_live,
                       optimizer_dtype=optimizer_dtype, expert_dp=expert_dp, optimizer=optimizer)


@lru_cache(maxsize=8192)
def _heavy_activations(model: ModelSpec, dtype: str, flash: bool, tp: int, pp: int, v: int, schedule: str, m: int,
                       b: int, sp: bool, recompute: str, cp: int, rec_layers: int, cross_entropy: str, ep: int,
                       etp: int, offload_layers: int) -> tuple[tuple[int, RankShape, float, float], ...]:
    """(rank, shape, activations, other before ZeRO-3's gathered weights) of each rank that can be the heaviest
    (`_heavy_ranks`): memory.rank_activations of `_memory_scan`'s figures, which no ZeRO stage changes -- the search
    asks for every stage of one layout."""
    shapes, peaks, per_layer, _, live, heavy, per_rank = _memory_scan(
        model, dtype, flash, tp, pp, v, schedule, m, b, sp, recompute, cp, rec_layers, cross_entropy, ep, etp)
    acts = activation_terms(model, tp=tp, b=b, sp=sp, recompute=recompute, dtype=dtype, cp=cp, flash=flash,
                            cross_entropy=cross_entropy, etp=etp)
    shared = per_layer if rec_layers else None
    return tuple((r, shapes[r], *rank_activations(acts, model.mtp_layers, shapes[r], peaks[r],
                                                  _offloaded_live(live[r], offload_layers, pp),
                                                  per_rank[r] if per_rank else shared))
                 for r, *_ in heavy)


def offloaded_live(live: float, n: int, c: Choice) -> float:
    """Layers whose activations a rank holds at its peak when `n` layers are offloaded to host memory
    (Megatron-Core's cpu_offloading_num_layers; one micro-batch in flight, no pipeline): the others, and two of
    the offloaded -- the double buffer its offload handler copies through (the layer being copied out or in and
    the next).  Unchanged without offloading or with a pipeline (which Megatron-Core's offloading does not run)."""
    return _offloaded_live(live, n, c.pp)


def _offloaded_live(live: float, n: int, pp: int) -> float:
    if n <= 0 or pp > 1:
        return live
    return max(0.0, live - n) + min(n, 2)


def offload_exposed(model: ModelSpec, cluster: Cluster, c: Choice, f_layer: float, b_layer: float) -> tuple[float, float]:
    """Forward and backward time a micro-batch waits on activation offloading: each of the `offload_layers`
    copies its stored activations (memory.layer_activation_bytes) to host memory while the next layer computes,
    and back while the layer after it back-propagates; with two buffers a layer cannot start before the copy two
    layers back is done, so each offloaded layer runs at the slower of its compute (`f_layer`, `b_layer`) and its
    copy.  The copy runs on a copy engine over `Cluster.host` at NVLink rings' measured share of line rate
    (hardware.NVLINK4_EFF, borrowed: no host-copy figure is cited) and takes no SM time."""
    n = cluster.offload_layers
    if n <= 0 or c.pp > 1:
        return 0.0, 0.0
    flash = cluster.flash
    nbytes = layer_activation_bytes(model, c.micro_batch, c.tp, c.sequence_parallel, c.recompute, cluster.precision,
                                    c.cp, flash, c.etp)
    host = cluster.host
    copy = host.alpha + nbytes / (host.beta * NVLINK4_EFF)
    return n * max(0.0, copy - f_layer), n * max(0.0, copy - b_layer)


def zero3_live_params(model: ModelSpec, cluster: Cluster, c: Choice) -> float | None:
    """Gathered parameters a rank holds at once under DeepSpeed-style ZeRO-3 (`submodule` units):
    the sub-module computing and the one prefetched (the largest consecutive pair: the MLP's two
    matrices) plus the full gradient of one sub-module before its reduce-scatter.  None: two layers
    (memory.py's default for `layer` units; a mixture of experts' two layers hold E/ep experts each)."""
    return _zero3_live(model, cluster.zero3_unit, c.zero_stage, c.tp, c.expert_shards)


def _zero3_live(model: ModelSpec, unit: str, zero_stage: int, tp: int, expert_shards: int) -> float | None:
    """`zero3_live_params` from what it reads of the cluster (`unit`, its ZeRO-3 unit) and of the choice."""
    if zero_stage < 3:
        return None
    if unit != "submodule":  # two whole layers: a mixture of experts' with its E/ep routed experts
        if not model.moe:
            return None
        dense = model.dense_variant().layer_params_per_rank(tp) if model.dense_count else 0.0
        return 2 * max(model.layer_params_per_rank(tp, expert_shards), dense)
    gs = {g.name: g for g in layer_gemms(model, 1, tp)}
    w = [float(gs[k].k * gs[k].n) for k in ("qkv", "attn_out", "mlp_in", "mlp_out")]
    pair = max(w[i] + w[(i + 1) % 4] for i in range(4))
    return pair + max(w)


@lru_cache(maxsize=8192)
def _peak_layers(schedule: str, p: int, m: int, v: int, shapes: tuple[RankShape, ...],
                 peaks: tuple[int, ...]) -> tuple[float, ...]:
    return peak_layers(schedule, p, min(m, 3 * p) if schedule == "interleaved" else m, v, shapes, peaks)


@lru_cache(maxsize=8192)
def _heavy_ranks(model: ModelSpec, tp: int, pp: int, v: int, live: tuple[float, ...],
                 schedule: str | None = None, ep: int = 1) -> tuple[tuple[int, float, float, bool, float], ...]:
    """(rank, parameters, in-flight layer units, holds the head, expert parameters) of the ranks that can be the heaviest
    (`live`: each rank's peak of live layers, `peak_layers`).

    A rank's memory rises with its dense parameters, its expert parameters, its in-flight layer units and
    holding the head (the coefficients are >= 0, and rounding is monotone), and the scan keeps the first of equal
    estimates, so a rank that an earlier rank matches or exceeds in all four never wins: dropping it changes no
    answer.  Under 1F1B that leaves the first two ranks and the last."""
    kept: list[tuple[int, float, float, bool, float]] = []
    for r, shape in enumerate(rank_shapes(model, tp, pp, v, schedule, ep)):
        row = (r, shape.params, live[r], shape.head, shape.expert_params)
        # a mixture of experts: the dense and the expert parameters compared apart (their states shard over
        # different groups, so neither total orders the ranks)
        if not any(k[1] - k[4] >= row[1] - row[4] and k[4] >= row[4] and k[2] >= row[2] and (k[3] or not row[3])
                   for k in kept):
            kept.append(row)
    return tuple(kept)


# ---- DP tail and optimizer -----------------------------------------------------------------------

def bucketed_tail(n: int, b: float, r: float, sigma: float) -> float:
    """Exposed time after a backward of n layers (b s each) whose gradients are reduced one layer's
    bucket at a time (r s each): bucket i starts when layer i's backward ends and the network takes
    the buckets in turn; the backward slows by σ while a bucket is in flight."""
    n = max(n, 1)
    if r <= b:  # every bucket but the last hides behind the next layer's backward
        return r + sigma * (n - 1) * r
    return n * r - (n - 1) * b + sigma * (n - 1) * b


def kv_replica_reduce(model: ModelSpec, cluster: Cluster, c: Choice, layers: int) -> float:
    """One all-reduce of the replicated K/V heads' gradients of a rank holding `layers` layers.

    With tp > kv_heads each K/V head is held by the r = tp / kv_heads consecutive TP ranks whose
    query heads read it (models.ModelSpec.layer_params_per_rank counts that copy in the weights,
    gradients and optimizer state); each computes a partial gradient from its own query heads, so
    the r copies are summed once per step, after the last micro-batch's backward, before the
    optimizer (Megatron-LM's rule for weights replicated across TP ranks).  Ranks 1 apart: NVLink
    when the TP group is inside a node."""
    r = c.tp // model.kv if c.tp > model.kv else 1
    if r <= 1 or layers <= 0:
        return 0.0
    nbytes = grad_bytes(cluster) * layers * 2 * model.head_dim * (model.hidden + (1 if model.bias else 0))
    if cluster.hier:
        return comm.collective("all_reduce", nbytes, r, 1, cluster).total
    return comm.all_reduce(nbytes, r, cluster.link_for_span(c.tp)).total


def _kv_tails(model: ModelSpec, cluster: Cluster, c: Choice, st: StageTimes) -> list[float]:
    """Per pipeline rank, the exposed part of its K/V replica reduction (0 when tp <= kv_heads).
    It runs on the TP links, beside the DP buckets on the NICs, bucket by bucket behind the last
    micro-batch's backward when gradients are reduced during backward."""
    if c.tp <= model.kv:
        return [0.0] * c.pp
    out = []
    lists = rank_stage_lists(c.schedule, c.pp, c.virtual_stages)
    for r, shape in enumerate(rank_shapes(model, c.tp, c.pp, c.virtual_stages, c.schedule, c.expert_shards)):
        n_layers = sum(shape.layers)
        red = kv_replica_reduce(model, cluster, c, n_layers)
        if cluster.overlap_grad_reduce and n_layers > 0:
            window = sum(st.b[s] for s in lists[r])
            red = bucketed_tail(n_layers, window / n_layers, red / n_layers, cluster.device.sigma)
        out.append(red)
    return out


def reduce_exposed(ready: list[float], r: float | list[float], end: float, sigma: float) -> float:
    """Exposed time after `end` of buckets reduced in the order they become ready (`ready`, sorted), r s
    each (or r[i] s for bucket i), one at a time on the network; compute slows by σ while a bucket is in
    flight before `end`."""
    t = busy = 0.0
    for i, at in enumerate(ready):
        start = at if i == 0 or at > t else t
        t = start + (r[i] if isinstance(r, list) else r)
        if start < end:
            busy += min(t, end) - start
    return max(0.0, t - end) + sigma * busy


def gather_exposed(need: list[float], g: float | list[float], sigma: float) -> float:
    """Delay of a forward whose weight buckets (g s to all-gather each) are needed at the times `need`
    (sorted, from the step's start) when each bucket's gather is issued as the previous bucket's
    compute starts, the first at the start; σ slows the compute the gathers overlap.  One bucket ahead
    is Megatron-Core's `overlap_param_gather` without PP (each bucket's pre-hook dispatches the next);
    with one-layer chunks it is also the chunk-wise dispatch of its pipeline schedules and of Apex's
    `overlap_param_sync` (the next chunk's gathers issued when the previous chunk's first forward
    starts), and with longer chunks nearly so (the network, not the issue time, bounds them)."""
    gs = g if isinstance(g, list) else [g] * len(need)  # each bucket's gather (sized buckets: its own)
    delay = 0.0
    done = gs[0] if gs else 0.0  # the first bucket's gather, issued at the start
    for i, at in enumerate(need):
        start = max(at + delay, done)  # this bucket's compute waits for its weights
        delay = start - at
        if i + 1 < len(need):
            done = start + gs[i + 1]  # the next bucket's gather, issued now, the network free (its own is done)
    return delay + sigma * max(0.0, sum(gs) - delay)


def stage_buckets(model: ModelSpec, c: Choice, lay: Layout, s: int, b_start: float, b_dur: float,
                  f_start: float, f_dur: float, bucket: float = 0.0,
                  whole: bool = False) -> list[tuple[float, float, float]]:
    """A stage's gradient buckets as Megatron-Core's DDP forms them: (ready, needed, parameters).  Each
    layer's gradients are ready as its backward ends in the stage's last backward [b_start, b_start + b_dur]
    and its weights needed as its forward starts in the stage's first forward; the head's parameters (the
    output layer unless tied, the final norm) are ready first, at the backward's start, and needed last; the
    embedding's (token embedding, learned positions) ready last, at the backward's end -- its gradient is
    complete only when the backward reaches the input -- and needed first (issue 12's nineteenth round).

    `bucket` > 0 (issue 12's twenty-fifth round): they fill buckets in that order, a bucket closing once it
    holds `bucket` parameters (DistributedDataParallelConfig.bucket_size; `dp_bucket`), ready when its last
    member is and needed when its first is; what is left at the end is the last bucket.  `bucket` = 0: one
    bucket per layer (and the head's, the embedding's apart).  `whole`: the stage is one bucket -- Megatron-LM's,
    NeMo's and Megatron-Bridge's model chunks after a rank's first, built with `disable_bucketing` ("overlapped
    with compute anyway")."""
    n = lay.layers[s]
    per_layer = model.layer_params_per_rank(c.tp, c.expert_shards)
    # a mixture of experts' leading dense layers (the stage's first ones) hold their own parameter count
    per_dense = model.dense_variant().layer_params_per_rank(c.tp) if lay.dense_of(s) else per_layer
    out = [(b_start + (k + 1) * b_dur / n, f_start + k * f_dur / n, per_dense if k < lay.dense_of(s) else per_layer)
           for k in range(n)]
    if lay.head[s]:
        head = (model.head_params() if (not model.tied or c.pp > 1) else model.norm_params) / c.tp
        out.append((b_start, f_start + f_dur, head + mtp_params_per_rank(model, c.tp, c.expert_shards)))
    if lay.embed[s]:
        out.append((b_start + b_dur, f_start, model.embedding_params() / c.tp))
    if not out:
        out.append((b_start + b_dur, f_start, 0.0))
    if whole:
        return [(max(t for t, _, _ in out), min(t for _, t, _ in out), sum(n for *_, n in out))]
    if bucket <= 0:
        return out
    merged: list[tuple[float, float, float]] = []
    ready, need, n_acc = 0.0, float("inf"), 0.0
    for t, u, n in sorted(out):
        ready, need, n_acc = max(ready, t), min(need, u), n_acc + n
        if n_acc >= bucket:
            merged.append((ready, need, n_acc))
            ready, need, n_acc = 0.0, float("inf"), 0.0
    if n_acc > 0 or not merged:
        merged.append((ready if n_acc > 0 else b_start + b_dur, need if n_acc > 0 else f_start, n_acc))
    return merged


# `_smallest_bucket`'s answers: the search bounds ~10⁴ candidates whose ranks hold the same stages and buckets
_SMALLEST: dict[tuple, float] = {}


def chunk_whole(chunked: bool, stages: tuple[int, ...], s: int) -> bool:
    """Whether stage `s` of a rank holding `stages` is one DP gradient bucket (`dp_bucket`'s second value given as
    `chunked`): every chunk after the rank's first, and every chunk of a rank that does not hold the pipeline's
    first stage -- Megatron-Core's DDP, `if disable_bucketing or pp_rank > 0: self.bucket_size = None`."""
    return chunked and (0 not in stages or s != stages[0])


def _smallest_bucket(model: ModelSpec, c: Choice, lay: Layout, stages: tuple[int, ...], bucket: float,
                     chunked: bool) -> float:
    """The fewest parameters of any gradient bucket of a rank holding `stages` (`stage_buckets`' counts, which read
    only the model, the layout and c's tp, expert shards and pp -- not the times): kept per those, as the same min."""
    key = (model, c.tp, c.expert_shards, c.pp, lay.layers, stages, bucket, chunked)
    hit = _SMALLEST.get(key)
    if hit is None:
        if len(_SMALLEST) >= 65536:  # bounded, as the module's lru_caches are
            _SMALLEST.clear()
        hit = _SMALLEST[key] = min(n for s in stages
                                   for *_, n in stage_buckets(model, c, lay, s, 0.0, 0.0, 0.0, 0.0, bucket,
                                                              chunk_whole(chunked, stages, s)))
    return hit


def dp_bucket(cluster: Cluster, c: Choice) -> tuple[float, bool]:
    """(parameters per gradient bucket, whether a rank's later model chunks are one bucket each) for
    `stage_buckets`.  By default Megatron-Core's DDP: buckets of max(4·10⁷, 10⁶ · the DP×CP group's size)
    parameters (DistributedDataParallelConfig.bucket_size when unset: larger groups get larger buckets so that
    their collectives stay bandwidth-bound) and, as Megatron-LM's, NeMo's and Megatron-Bridge's `get_model`
    build them, bucketing off for every model chunk after the first.  PyTorch FSDP (`cluster.fsdp`): one
    bucket per wrapped unit, a layer.  `cluster.dp_bucket_params` given (`--dp-bucket-params`): buckets of that
    many parameters (0: one per layer) in a rank's first chunk, the later chunks still one bucket each (issue 12's
    forty-eighth round: the frameworks that interleave -- Megatron-LM's `get_model`, NeMo 2's
    megatron_parallel.py, Megatron-Bridge -- disable bucketing past the first chunk whatever the size; those that
    give a size and do not interleave, DeepSpeed's pipeline and PyTorch's, have one chunk a rank).  Where the second
    is True, a rank that does not hold the pipeline's first stage has every chunk one bucket, its first included:
    Megatron-Core's DDP turns bucketing off on every pipeline rank after the first, "since data-parallel
    communication on these stages is not on the critical path" (distributed_data_parallel.py, `if
    disable_bucketing or pp_rank > 0: self.bucket_size = None`, at every core release since the DDP's rewrite,
    5d745a79 of 2023-09-25; issue 12's forty-ninth round, found by two blind audits)."""
    if cluster.dp_bucket_params is not None:
        return float(cluster.dp_bucket_params), True
    if cluster.fsdp:
        return 0.0, False
    return max(4e7, 1e6 * c.dp * c.cp), True


def _dp_tail_bucketed(model: ModelSpec, cluster: Cluster, c: Choice, st: StageTimes,
                      marks: tuple[float, Marks] | None = None) -> float:
    """The hierarchical clusters' DP tail: per rank, its gradients' reduction behind the schedule (one
    bucket per layer, ready when that layer's last backward ends) and the updated weights' gather (one
    bucket ahead of the next forward with `overlap_param_gather`, else whole after the optimizer).

    `marks` (the simulated makespan and stage marks) given: the step's tail.  Not given (the search's
    bound, before simulating): a lower bound of it.  Each queue costs X + σ·(total − X), X being what it
    exposes (`reduce_exposed`, `gather_exposed`: every bucket overlaps compute unless exposed), which is
    at least σ·total + (1 − σ)·X₀ for any X₀ <= X; X₀ is known for stage 0's buckets alone — its last
    backward ends at the makespan in every unsplit schedule (the backward flows back to stage 0), its
    first forward starts the step, and a rank's other buckets only delay the queue.  In a split
    schedule the last action is some rank's B or BW, so that rank exposes at least one bucket: the
    least σ·total + (1 − σ)·bucket over the ranks bounds it."""
    if c.zero_stage >= 3:
        return 0.0  # reduced per micro-batch inside the stage durations
    gbytes, wbytes = grad_bytes(cluster), weight_bytes(cluster)  # seed: 2 B bf16 gradients per parameter
    shapes = rank_shapes(model, c.tp, c.pp, c.virtual_stages, c.schedule, c.expert_shards)
    lists = rank_stage_lists(c.schedule, c.pp, c.virtual_stages)
    sigma = cluster.device.sigma
    split = c.schedule in SPLIT_BACKWARD
    overlap_red, overlap_gather = cluster.overlap_grad_reduce, cluster.overlap_param_gather
    if cluster.bf16_optimizer:  # DeepSpeed's BF16_Optimizer reduces after the backward and gathers after its step
        overlap_red = overlap_gather = False
    lay = layout(model, c.pp * c.virtual_stages)
    bucket, chunked = dp_bucket(cluster, c)
    worst = 0.0
    last_rank = float("inf")  # split schedules' bound: the least a rank ending the step exposes
    costs: dict[tuple[float, float], tuple[float, float]] = {}  # ranks of equal shape reduce alike (the search's speed)
    bounded: set[tuple[float, tuple[int, ...], bool]] = set()  # the bound: ranks alike in these expose alike
    whole = grads_all_reduced(cluster, c)  # an all-reduce, or ZeRO's reduce-scatter
    for r, shape in enumerate(shapes):
        g = gbytes * shape.params
        has0 = 0 in lists[r]
        if marks is None:
            if (g, shape.layers, has0) in bounded:
                continue
            bounded.add((g, shape.layers, has0))
        dense, experts = shape.params - shape.expert_params, shape.expert_params
        hit = costs.get((dense, experts))
        if hit is None:
            red = (grad_collective(cluster, c, "all_reduce", gbytes * dense)
                   if whole else sharded_grad_reduce(cluster, c, gbytes * dense))
            red += reduction_passes(cluster, shape.params)
            gather = (grad_collective(cluster, c, "all_gather", wbytes * dense, group="shard")  # updated weights
                      if c.zero_stage >= 1 else 0.0)
            if experts:  # a mixture of experts' routed experts: over the ranks holding the same experts
                red += expert_grad_collective(cluster, c, "all_reduce" if whole else "reduce_scatter", gbytes * experts)
                if c.zero_stage >= 1:
                    gather += expert_grad_collective(cluster, c, "all_gather", wbytes * experts)
            hit = costs[(dense, experts)] = (red, gather)
        red, gather = hit
        per = 1.0 / max(shape.params, 1e-30)  # a bucket's share of the rank's reduction and gather: its parameters'
        if marks is not None:
            end, mk = marks
            items = []
            for s in lists[r]:
                d, e, f0 = mk.grad_dur[s], mk.grad_end[s], mk.first_f[s]
                items += stage_buckets(model, c, lay, s, e - d, d, f0, st.f[s], bucket,
                                        chunk_whole(chunked, lists[r], s))
            ready = sorted((t, red * n * per) for t, _, n in items)
            need = sorted((t, gather * n * per) for _, t, n in items)
            exposed = reduce_exposed([t for t, _ in ready], [x for _, x in ready], end, sigma) if overlap_red else red
            if c.zero_stage >= 1:
                exposed += (gather_exposed([t for t, _ in need], [x for _, x in need], sigma) if overlap_gather
                            else gather)
        else:  # the bound: σ·total + (1 − σ)·X₀ per queue, X₀ from stage 0's buckets where this rank has them
            x_red = x_gather = 0.0
            if has0:
                items = stage_buckets(model, c, lay, 0, 0.0, st.b[0], 0.0, st.f[0], bucket)
                if not split:  # stage 0's last backward [T − b, T], here [0, b]
                    ready = sorted((t, red * n * per) for t, _, n in items)
                    x_red = reduce_exposed([t for t, _ in ready], [x for _, x in ready], st.b[0], 0.0)
                need = sorted((t, gather * n * per) for _, t, n in items)  # its first forward
                x_gather = gather_exposed([t for t, _ in need], [x for _, x in need], 0.0)
            if overlap_red:
                exposed = sigma * red + (1 - sigma) * x_red
                smallest = _smallest_bucket(model, c, lay, lists[r], bucket, chunked)
                last_rank = min(last_rank, sigma * red + (1 - sigma) * red * smallest * per)
            else:
                exposed = red
            if c.zero_stage >= 1:
                exposed += sigma * gather + (1 - sigma) * x_gather if overlap_gather else gather
        worst = max(worst, exposed)
    if marks is None:
        if split and overlap_red:
            worst = max(worst, last_rank)
        return worst * (1 - 1e-9)  # the bound may equal the tail: keep it below the sums' rounding
    return worst


def dp_tail(model: ModelSpec, cluster: Cluster, c: Choice, st: StageTimes,
            marks: tuple[float, Marks] | None = None) -> float:
    """Exposed gradient reduction after the backward: over the dp × cp ranks holding the same
    weights, and (beside it, on the TP links) over the TP ranks holding the same K/V head.  `marks`
    (`schedule_marks`) times a hierarchical cluster's buckets by the simulated schedule; without
    them that part is a lower bound (the search's, before simulating)."""
    kv = max(_kv_tails(model, cluster, c, st))
    return max(_dp_tail(model, cluster, c, st, marks), kv)


def _dp_tail(model: ModelSpec, cluster: Cluster, c: Choice, st: StageTimes,
             marks: tuple[float, Marks] | None = None) -> float:
    ng = c.dp * c.cp  # DP and CP ranks reduce their gradients together
    if ng <= 1 and c.expert_dp <= 1:
        return 0.0
    if cluster.hier:
        return _dp_tail_bucketed(model, cluster, c, st, marks)
    lk = links(cluster, c)
    gbytes, wbytes = grad_bytes(cluster), weight_bytes(cluster)  # seed: 2 B bf16 gradients per parameter
    shapes = rank_shapes(model, c.tp, c.pp, c.virtual_stages, c.schedule, c.expert_shards)
    lists = rank_stage_lists(c.schedule, c.pp, c.virtual_stages)
    if c.zero_stage >= 3:
        return 0.0  # reduced per micro-batch inside the stage durations
    # the eager runtime's ZeRO-1/2 calls, at their measured fits and none hidden (zero12_eager)
    eager = c.zero_stage > 0 and cluster.profile is not None and bool(cluster.profile.collectives)
    worst = 0.0
    costs: dict[tuple[float, bool, bool], tuple[float, float]] = {}  # ranks alike reduce alike
    whole = grads_all_reduced(cluster, c)  # an all-reduce, or ZeRO's reduce-scatter
    for r, shape in enumerate(shapes):
        g = gbytes * shape.params
        key = (g, eager and r == 0, eager and shape.head)  # ZeRO-2's units depend on embedding / head
        hit = costs.get(key)
        if hit is not None:
            red, gather = hit
        elif eager:
            red, gather = zero12_eager(model, c, cluster.profile, lk.grad, shape, r == 0,  # type: ignore[arg-type]
                                       cluster.dtype)
        else:  # (a mixture of experts' routed experts: over the ranks holding the same experts, expert_grad_collective)
            dense, experts = shape.params - shape.expert_params, shape.expert_params
            if c.zero_stage == 0:
                red, gather = comm.all_reduce(gbytes * dense, ng, lk.grad).total, 0.0  # type: ignore[arg-type]
            else:
                red = (comm.all_reduce(gbytes * dense, ng, lk.grad).total  # type: ignore[arg-type]
                       if whole else flat_sharded_reduce(c, gbytes * dense, lk.grad))
                red += reduction_passes(cluster, shape.params)
                gather = comm.all_gather(wbytes * dense, c.zero_shards, lk.grad).total  # type: ignore[arg-type]  # updated weights
            if experts:
                red += expert_grad_collective(cluster, c, "all_reduce" if whole else "reduce_scatter", gbytes * experts)
                if c.zero_stage >= 1:
                    gather += expert_grad_collective(cluster, c, "all_gather", wbytes * experts)
        costs[key] = (red, gather)
        if eager:
            exposed = red + gather
        else:
            window = sum(st.b[s] for s in lists[r])  # last micro-batch's backward on r
            exposed = max(red / max(sum(shape.layers), 1), red - window) + gather
        worst = max(worst, exposed)
    return worst


def bf16_optimizer_accumulation(cluster: Cluster, params: float) -> float:
    """Seconds DeepSpeed's BF16_Optimizer adds to each micro-batch's backward of a stage of `params` parameters on
    this rank: its bf16 gradients added into the full fp32 buffer (BF16_OPTIMIZER_ACCUM_BYTES); 0 for any other
    optimizer."""
    return _bf16_optimizer_pass(cluster, BF16_OPTIMIZER_ACCUM_BYTES, params)


def bf16_optimizer_casts(cluster: Cluster, params: float) -> float:
    """Seconds of DeepSpeed's BF16_Optimizer's casts around its DP all-reduce (the fp32 buffer to bf16, the 1/dp
    scale, back to fp32: BF16_OPTIMIZER_CAST_BYTES over the rank's `params`), serial with it; 0 otherwise."""
    return _bf16_optimizer_pass(cluster, BF16_OPTIMIZER_CAST_BYTES, params)


def reduction_passes(cluster: Cluster, params: float) -> float:
    """Seconds of the HBM passes serial with a rank's DP gradient reduction over its `params` parameters: DeepSpeed's
    BF16_Optimizer's casts (`bf16_optimizer_casts`) and, under `Cluster.grad_reduce_cast`, the bf16 gradients'
    round trip through an fp32 bucket (GRAD_CAST_BYTES)."""
    cast = _hbm_pass(cluster, GRAD_CAST_BYTES, params) if cluster.grad_reduce_cast else 0.0
    return bf16_optimizer_casts(cluster, params) + cast


def _bf16_optimizer_pass(cluster: Cluster, per_param: float, params: float) -> float:
    """Seconds of a BF16_Optimizer pass moving `per_param` HBM bytes over `params` parameters; 0 without it."""
    return _hbm_pass(cluster, per_param, params) if cluster.bf16_optimizer else 0.0


def _hbm_pass(cluster: Cluster, per_param: float, params: float) -> float:
    """Seconds of an elementwise pass moving `per_param` HBM bytes over `params` parameters."""
    dev = cluster.device
    return per_param * params / (dev.mem_bw * dev.mem_eff)


def optimizer_time(model: ModelSpec, cluster: Cluster, c: Choice) -> float:
    """The optimizer step on the busiest rank: its HBM traffic over the parameters it updates (ZeRO shards them:
    Megatron-Core's distributed optimizer, and Muon's layer-wise one) and, under Muon, the Newton-Schulz work
    (`newton_schulz_seconds`).  Muon's elementwise traffic is taken as Adam's: per parameter it reads the gradient
    and a momentum and writes the momentum where Adam reads and writes two moments, and the update's read of the
    orthogonalized matrix takes the place of Adam's second moment."""
    shapes = rank_shapes(model, c.tp, c.pp, c.virtual_stages, c.schedule, c.expert_shards)
    zs, ze = (c.zero_shards, c.expert_dp) if c.zero_stage >= 1 else (1, 1)
    params = max((s.params - s.expert_params) / zs + s.expert_params / ze for s in shapes)
    dev = cluster.device
    ns = newton_schulz_seconds(model, cluster, c) if cluster.optimizer == "muon" else 0.0
    f = cluster.offload_optimizer
    host = offloaded_step_seconds(cluster, f * params) if f else 0.0
    if cluster.bf16_optimizer:  # DeepSpeed's BF16_Optimizer: two passes over the full fp32 gradients, Adam over the shard
        full = max(s.params for s in shapes)
        return (BF16_OPTIMIZER_FULL_BYTES * full + BF16_OPTIMIZER_SHARD_BYTES * params) / (dev.mem_bw * dev.mem_eff)
    if dev.kernel_model == "table":
        return OPTIMIZER_STEP_BYTES * (1.0 - f) * params / (dev.mem_bw * dev.mem_eff) + ns + host
    return ADAM_BYTES_PER_PARAM * (1.0 - f) * params / dev.mem_bw + ns + host


# An offloaded optimizer step per parameter (Megatron-Core's HybridDeviceOptimizer): its fp32 gradient copied to the
# host (4 B), Adam over fp32 master, m and v there (read 16 B, write 12 B: ADAM_BYTES_PER_PARAM's fp32 part), the fp32
# weight copied back (4 B)
OFFLOAD_COPY_BYTES = 4.0
HOST_ADAM_BYTES = 28.0


def offloaded_step_seconds(cluster: Cluster, params: float) -> float:
    """The optimizer step of `params` offloaded parameters (`Cluster.offload_optimizer`): the gradients down and the
    weights up over the GPU's host link (full duplex: the two directions at once), at NVLink rings' measured share
    of line rate as activation offloading prices it (NVLINK4_EFF, borrowed), and Adam on the host's DRAM at its line
    rate shared by the GPUs behind it (hardware.HOST_MEM; every rank steps at once), the three pipelined as
    Megatron-Core's --overlap-cpu-optimizer-d2h-h2d runs them (its README recommends it): the slowest sets the time.
    The DRAM at line rate makes the host's part a lower bound."""
    from .hardware import HOST_MEM

    bw, sharing = HOST_MEM[cluster.device.name]
    link = cluster.host
    copy = link.alpha + OFFLOAD_COPY_BYTES * params / (link.beta * NVLINK4_EFF)
    return max(copy, HOST_ADAM_BYTES * params / (bw * 1e9 / sharing))


def newton_schulz_seconds(model: ModelSpec, cluster: Cluster, c: Choice) -> float:
    """Muon's orthogonalization on the busiest pipeline rank (Megatron-Core's Muon, `Cluster.optimizer` "muon"):
    `MUON_NS_STEPS` Newton-Schulz steps over every weight matrix of the rank's layers (compute.muon_matrices; the
    embedding and output layer are Adam's), at the bf16 GEMM rate (its `muon_fp32_matmul_prec` "medium" lets the
    fp32 products run in bf16).  With ZeRO >= 1 the layer-wise distributed optimizer hands each matrix to one rank
    of the data-parallel group (balanced by its Newton-Schulz cost), so a rank does 1/(dp·cp) of the rest and
    1/expert_dp of the routed experts; with ZeRO 0 every rank does all of its own.  `Cluster.muon_tp_mode`
    "blockwise" orthogonalizes each TP shard where it lies; "duplicated" gathers each whole matrix over TP (fp32)
    and every TP rank orthogonalizes all of it."""
    from .hardware import MUON_NS_STEPS

    dup = cluster.muon_tp_mode == "duplicated"
    t, et = (1, 1) if dup else (c.tp, c.etp)
    zs, ze = (c.zero_shards, c.expert_dp) if c.zero_stage >= 1 else (1, 1)
    kind = newton_schulz_layer_flops(model, t, c.ep, et, MUON_NS_STEPS)
    dense_kind = (newton_schulz_layer_flops(model.dense_variant(), t, 1, 1, MUON_NS_STEPS)
                  if model.dense_count else kind)
    worst, worst_layers = 0.0, 0
    for shape in rank_shapes(model, c.tp, c.pp, c.virtual_stages, c.schedule, c.expert_shards):
        n, nd = sum(shape.layers) + (model.mtp_layers if shape.head else 0), shape.dense_layers
        flops = (n - nd) * (kind[0] / zs + kind[1] / ze) + nd * dense_kind[0] / zs
        if flops > worst:
            worst, worst_layers = flops, n
    dev = cluster.device
    gd = "bf16" if "bf16" in dev.peak_flops else cluster.dtype
    rate = dev.peak(gd) * (dev.gemm_fraction(gd) if dev.kernel_model == "table" else dev.efficiency)
    seconds = worst / rate
    if dup and c.tp > 1:  # the fp32 shards of the matrices the rank owns gathered whole over TP (the TP-split part
        # of a layer: its parameters but the routed experts', which TP does not split)
        per_layer = model.dense_layer_params_per_rank(c.tp) if model.moe else model.layer_params_per_rank(c.tp)
        nbytes = 4.0 * per_layer * c.tp * worst_layers / zs
        seconds += comm.collective("all_gather", nbytes, c.tp, 1, cluster).total
    return seconds


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
