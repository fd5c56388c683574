"""The DP tail and the optimizer step: the part of the gradient reduction (and ZeRO's gathers of the updated
weights) that the backward cannot hide, bucket by bucket, and the optimizer's own time.

Overlap on hierarchical clusters (σ, `overlapped`: parallel_comm.py):
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
"""

from __future__ import annotations

from . import comm
from .choice import Choice
from .compute import newton_schulz_layer_flops
from .hardware import NVLINK4_EFF, Cluster
from .models import ModelSpec
from .parallel_comm import (
    expert_grad_collective,
    flat_sharded_reduce,
    grad_bytes,
    grad_collective,
    grads_all_reduced,
    links,
    sharded_grad_reduce,
    weight_bytes,
    zero12_eager,
)
from .replay import Marks
from .stage_layout import (
    SPLIT_BACKWARD,
    Layout,
    StageTimes,
    layout,
    mtp_params_per_rank,
    rank_shapes,
    rank_stage_lists,
)

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
