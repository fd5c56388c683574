"""The pipeline's layout: layers per chunk (`layout`, `megatron_split`), each rank's stages and their shapes
(`stage_placement`, `rank_shapes`), the peak in-flight activations the schedule checker counts (`peak_inflight`,
`peak_layers`, `validate_schedule`), and the per-stage durations cost.py fills in (`StageTimes`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from par3d.pipeline.partition import gpt_partition
from par3d.pipeline.schedules import V_SCHEDULES, build, check, schedule_placement

try:  # the checker's counting step alone (cheap); check() also proves the order deadlock-free
    from par3d.pipeline.schedules import peak_inflight as _count_peaks
except ImportError:  # pragma: no cover
    _count_peaks = None

from .compute import (
    Gemm,
    LayerTimes,
    gemm_time,
)
from .memory import RankShape
from .models import ModelSpec

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


def mtp_weight_gemms(model: ModelSpec, dev: object, dtype: str, b: int, tp: int, lt: LayerTimes, cp: int = 1) -> float:
    """The weight-gradient GEMMs of `mtp_forward`'s modules (each the size of its forward GEMM): per module its layer's
    (`LayerTimes.weight_gemms`), the projection's and the output head's -- what a split backward's BW runs for them."""
    if not model.mtp_layers:
        return 0.0
    proj = _mtp_proj_time(b * (model.seq_len // cp), model.hidden, tp, dev, dtype)
    return model.mtp_layers * (lt.weight_gemms + lt.head_gemm + proj)


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
      `zbv_times`, keep it too: tests/test_plan_v_schedules.py; where those carry the share of a chunk its BI keeps
      for BW, the cap counts a chunk past its BI at that share, so more than 2p chunks may be past their F and
      before their BW while what they hold, in whole chunks' worth, stays within 2p: the bytes this count prices);
    - DualPipe-V (m >= 2p): 2p + 1 chunks on every rank (the planner's memory counts its ranks' states instead:
      `v_split_states`).
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


def split_states(schedule: str, p: int, m: int, v: int) -> tuple[tuple[tuple[int, int], ...], ...] | None:
    """Where a schedule defers its weight gradients past a fixed order's BI (ZB-H1), per rank the states at which its
    activations can peak, as (chunks past F and before BI, chunks past BI and before BW): a chunk before its BI
    holds what its forward saved, one past it only what its weight GEMMs need (`memory.weight_grad_bytes`, and on
    the head the output layer's `memory.head_grad_bytes`), more or less than the forward's, so the peak is the
    largest of these states' sums, not `peak_inflight`'s whole chunks.  None for every other schedule (each chunk
    counted whole until its backward; ZB-V's cap counts what its BI keeps: `counted_peaks`; DualPipe-V's two
    chunks: `v_split_states`)."""
    if schedule != "zb-h1" or p < 1:
        return None
    return _zbh1_states(p, m)


@lru_cache(maxsize=4096)
def _zbh1_states(p: int, m: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """`split_states` of ZB-H1 from its builder's rules (pipeline/schedules.zero_bubble_h1), not its walk (building
    and walking the lists was most of a cold search's time).  Rank r, w = min(p - r - 1, m) warm-up forwards:
    - m <= w: m forwards, then BI and BW in turn: (m, 0) and (m - 1, 1);
    - else, k = min(m - w - 1, r): the last F of the steady phase (w + 1, k), its BI (w, k + 1), and the first BI of
      the cool-down (w - 1, min(m - w, r) + 1), each BW of the steady phase and the cool-down coming one BI late.
    A test compares them with a walk of the built lists for every (p, m) up to p = 8."""
    out = []
    for r in range(p):
        w = min(p - r - 1, m)
        if m <= w:
            cands = [(m, 0), (m - 1, 1)]
        else:
            k = min(m - w - 1, r)
            cands = [(w + 1, k), (w, k + 1)] + ([(w - 1, min(m - w, r) + 1)] if w >= 1 else [])
        out.append(maximal_states(cands))
    return tuple(out)


def v_split_states(schedule: str, p: int, m: int) -> tuple[tuple[tuple[int, int, int, int], ...], ...] | None:
    """DualPipe-V's states at which each rank's activations can peak, as (chunk 0 past F and before BI or B, chunk 0
    past BI, chunk 1 before, chunk 1 past BI): its order is fixed (no times), so they are read off a walk of the built
    lists, and each chunk's bytes -- its own layers, the head's logits and output pair on rank 0's chunk 1 -- weigh
    them exactly where the whole-chunk count (`counted_peaks`: 2p + 1 mean chunks) misses what a chunk past its BI
    keeps (each linear layer's x and dy, many times a fully recomputed layer's input) or over-counts a small chunk.
    None for every other schedule and for m < 2p (the builder refuses it).  The walk at m = 2p is the walk at any m:
    the steady phase's F + B pairs (m - 2p + r + 1 of them, at least one on every rank) return each rank to the same
    counts (a test compares them up to m = 4p + 2)."""
    if schedule != "dualpipe-v" or p < 1 or m < 2 * p:
        return None
    return _dualpipe_v_states(p)


def v_layer_states(schedule: str, p: int, m: int,
                   shapes: tuple[RankShape, ...]) -> tuple[tuple[tuple[int, int, int, int], ...], ...] | None:
    """`v_split_states` in the units `memory.rank_activations` weighs: per rank (layers before BI or B, layers past
    BI, head chunks before, head chunks past BI) -- each chunk's own layers (`shapes`, the rank's stages r and
    2p - 1 - r), the head on rank 0's second chunk -- and only the states no other matches in all four (a few a
    rank where the chunk counts are dozens at p = 64, so the search prices few)."""
    if v_split_states(schedule, p, m) is None:
        return None
    return _v_layer_states(p, tuple((shape.layers, shape.head) for shape in shapes))


@lru_cache(maxsize=1024)
def _v_layer_states(p: int, shapes: tuple[tuple[tuple[int, ...], bool], ...]
                    ) -> tuple[tuple[tuple[int, int, int, int], ...], ...]:
    """`v_layer_states` of each rank's (chunk layers, holds the head), whatever m >= 2p."""
    out = []
    for sts, ((n0, n1), head) in zip(_dualpipe_v_states(p), shapes):
        h = 1 if head else 0
        out.append(maximal_states({(a * n0 + c * n1, b * n0 + d * n1, c * h, d * h) for a, b, c, d in sts}))
    return tuple(out)  # type: ignore[arg-type]


@lru_cache(maxsize=256)
def _dualpipe_v_states(p: int) -> tuple[tuple[tuple[int, int, int, int], ...], ...]:
    """`v_split_states` of DualPipe-V at m = 2p, walked rank by rank."""
    out = []
    for r, acts in enumerate(build("dualpipe-v", p, 2 * p, 2)):
        n = [0, 0, 0, 0]
        seen: set[tuple[int, ...]] = set()
        for a in acts:
            if a.kind != "F":  # the state before anything but a forward (a forward only adds: the next one holds more)
                seen.add(tuple(n))
            c = 0 if a.stage == r else 2
            if a.kind == "F":
                n[c] += 1
            elif a.kind == "BI":
                n[c] -= 1
                n[c + 1] += 1
            elif a.kind == "BW":
                n[c + 1] -= 1
            else:  # a full B
                n[c] -= 1
        seen.add(tuple(n))
        out.append(maximal_states(seen))
    return tuple(out)  # type: ignore[arg-type]


def maximal_states(states: list[tuple[int, ...]] | set[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """The states (counts of chunks before BI and past BI: ZB-H1's two, DualPipe-V's two a chunk) no other matches
    or exceeds in every count, sorted: the only ones at which a rank's activations, a sum of the counts with
    non-negative bytes, can peak."""
    out: list[tuple[int, ...]] = []
    # by decreasing sum: a state's dominators have larger sums, and the kept ones dominate every other, so only the
    # few kept so far are compared (a walk of DualPipe-V's lists at p = 64 sees ~10⁴ states)
    for st in sorted(set(states), key=lambda t: (-sum(t), t)):
        if len(st) == 4:  # (spelled out: the search walks DualPipe-V's states at every pipeline depth)
            a, b, c, d = st
            dominated = any(w >= a and x >= b and y >= c and z >= d for w, x, y, z in out)
        else:
            dominated = any(all(x >= y for x, y in zip(o, st)) for o in out)
        if not dominated:
            out.append(st)
    return tuple(sorted(out))


def walked_bytes(actions: list, fwd: list[float], kept: list[float]) -> float:
    """The peak of one rank's activations walking its actions in order: an F adds its stage's forward bytes
    (`fwd[stage]`), a BI swaps them for what the stage keeps for its BW (`kept[stage]`), a BW frees that and a B the
    forward's.  Exact for any order (a CSV's, the V's built for given times), where the counts above give a bound
    or a mean."""
    live = peak = 0.0
    for a in actions:
        s = a.stage
        if a.kind == "F":
            live += fwd[s]
        elif a.kind == "BI":
            live += kept[s] - fwd[s]
        elif a.kind == "BW":
            live -= kept[s]
        else:
            live -= fwd[s]
        peak = max(peak, live)
    return peak


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


def validate_schedule(schedule: str, p: int, m: int, v: int) -> tuple[int, ...]:
    """Full check (dependencies, deadlock freedom) of a reported plan's schedule, at min(m, 2p), and
    the check that the search's peak counts are the checker's."""
    return _checked_peaks(schedule, p, min(m, 2 * p) if p > 1 else m, v)


@lru_cache(maxsize=1024)
def _checked_peaks(schedule: str, p: int, mm: int, v: int) -> tuple[int, ...]:
    """`validate_schedule` at its checked m, once per schedule: the check is a pure function of these four (a
    schedule that fails raises each time, as nothing is cached for it)."""
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
    # zb-v: the share of a chunk's activations its BI keeps for its BW (`memory.weight_grad_share`), which the V's
    # memory cap counts (`schedules.zero_bubble_v`); 1 for every other schedule
    held: float = 1.0
    # zb-v: what the head's chunk keeps from its BI to its BW, in a mean chunk's forwards (`memory.v_head_share`: its
    # layers' share and the output layer's input and logits' gradient), which the V's cap counts; 1 elsewhere
    head_held: float = 1.0
