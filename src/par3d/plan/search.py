"""Search every feasible (tp, pp, dp, micro-batch, schedule, v, recompute, ZeRO, SP) and rank them.

How it stays fast (`par3d plan` for 1024 GPUs answers in well under 2 s on two cores):
1. Cheap rejections first: tp must divide heads, ffn and the GPU count (and stay inside a node
   unless allowed); dp must divide the global batch; every pipeline chunk needs a layer;
   interleaved needs m % pp == 0; zb-v and dualpipe-v (v = 2 on the V placement) pp >= 2 and,
   for dualpipe-v, m >= 2·pp -- the runtime's rules (config.py).
2. Dominance: time grows and memory shrinks with the ZeRO stage, so for each other choice only
   the smallest ZeRO stage that fits is kept.  Sequence parallelism costs no time in this model
   (AG + RS = AR) and saves memory, so with tp > 1 it is on unless `--no-sequence-parallel`.
3. Memory uses the checker's peak in-flight counts (cached per schedule, p, m, v).
4. For every survivor a closed-form lower bound of the makespan (`cost.makespan_lower_bound`, exact
   for GPipe/1F1B with equal stages) plus the DP tail and optimizer gives a lower bound of its step
   time; candidates are simulated in increasing bound order, and the search stops when the next
   bound exceeds the K-th best simulated step time.  So every reported number comes from
   `pipeline/simulate.py`, yet only a handful of configurations are simulated.
5. Simulations are cached on (schedule, p, m, v, normalised durations).
"""

from __future__ import annotations

import gc
import heapq
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from .choice import recomputed_layers
from .compute import RECOMPUTE_MODULES, modules_recompute, recompute_modules
from .cost import (
    DEFAULT_OPTIONS,
    Choice,
    Options,
    Plan,
    evaluate,
    makespan_lower_bound,
    rank_busy,
    round_split,
    stage_times,
    straggler_factor,
)
from .cp_ep_comm import choice_layer_times, ep_exchange, ulysses_error
from .dp_tail import dp_tail, optimizer_time
from .hardware import Cluster
from .models import ModelSpec
from .plan_memory import memory
from .stage_layout import SPLIT_BACKWARD, StageTimes, layout, mtp_forward, rank_stage_lists, validate_schedule

SCHEDULE_ORDER = ("1f1b", "interleaved", "zb-h1", "gpipe", "zb-v", "dualpipe-v")
V_ORDER = ("zb-v", "dualpipe-v")  # two chunks per rank on the V (pipeline/schedules.py)
# why a V schedule is refused at a layout ("<schedule> needs <why>") and the fix `suggest_fixes` offers for it, in one
# place so that every refusal has its fix ({half}: the largest pp whose 2·pp chunks each hold a layer or an end)
V_NEEDS = {"pp > 1": "--pp 2 or more",
           "2·pp <= layers + 2": "--pp <= {half}",
           "m >= 2·pp": "a larger --global-batch or a smaller --micro-batch, or --schedule zb-v"}
RECOMPUTE_ORDER = ("none", "selective", "full")


class PlanError(ValueError):
    """A request the planner cannot satisfy; the message names the flag, the rule and a fix."""

    def __init__(self, message: str, flag: str | None = None):
        super().__init__(message)
        self.flag = flag


@dataclass
class Fixed:
    """Choices fixed by flags; None means searched."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    micro_batch: int | None = None
    schedule: str | None = None
    virtual_stages: int | None = None
    recompute: str | None = None
    zero_stage: int | None = None
    sequence_parallel: bool | None = None
    cp: int | None = None
    dp_replicate: int | None = None  # HSDP replicas (choice.Choice.dp_replicate); None: searched
    recompute_layers: int | None = None  # block-method full recomputation (choice.Choice.recompute_layers)
    ep: int | None = None  # expert parallelism (a mixture of experts: choice.Choice.ep)
    etp: int | None = None  # expert tensor parallelism (choice.Choice.etp); None: searched over 1 and tp (etp_choices)


# The search tries context parallelism only while each CP rank keeps at least this many tokens of a
# sequence: below it a ring step's attention block is too small to hide the K/V exchange (Megatron-LM
# recommends CP for long sequences; Llama 3 used CP 16 at 131,072 tokens = 8,192 per rank).  `--cp N`
# fixes any valid degree.
CP_MIN_LOCAL_TOKENS = 4096


@dataclass
class Limits:
    max_bubble: float | None = None  # on the simulator's bubble_wall
    allow_inter_node_tp: bool = False
    max_zero_stage: int = 3  # 1 when the plan must run on par3d's runtime (--emit-config)
    max_virtual_stages: int = 8
    max_cp: int | None = None  # 1 when the runtime has no context parallelism (--emit-config)
    # also search Megatron's block recomputation (the fewest layers per chunk that fit, where none does not);
    # False when the plan must run on par3d's runtime (--emit-config), which recomputes every layer or none
    block_recompute: bool = True
    # the pipeline schedules the search may pick (None: all of SCHEDULE_ORDER): those the framework that will run
    # the plan has -- Megatron-LM's 1f1b and interleaved, DeepSpeed's 1f1b (`--schedules`)
    schedules: tuple[str, ...] | None = None


@dataclass
class Result:
    plans: list[Plan]  # fitting, fastest first
    considered: int = 0
    simulated: int = 0
    rejected: Counter = field(default_factory=Counter)
    fastest_unfit: Plan | None = None  # the fastest candidate ruled out by memory alone, if faster
    nearest_unfit: Plan | None = None  # with nothing fitting: the candidate needing the least memory
    per_layout: dict = field(default_factory=dict)  # (tp, cp, pp, dp) -> its fitting candidates (queue items)
    limits: Limits | None = None  # the limits searched under
    # a deferred queue item (stage times None: its bound the arithmetic alone) -> the item with its full
    # bound and the same tie-breaker (`_Memo.expand`); None when every item was bounded when pushed
    expand: Callable[[tuple], tuple] | None = field(default=None, repr=False, compare=False)


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _fmt(xs: list[int]) -> str:
    xs = xs[:16]
    return ", ".join(map(str, xs)) if xs else "none"


def tp_choices(model: ModelSpec, cluster: Cluster, fixed: Fixed, limits: Limits) -> list[int]:
    # GQA: tp splits the K/V heads (tp | kv) or replicates them (kv | tp), as Megatron-LM does
    mlp = model.shared_ffn if model.moe else model.ffn  # what TP splits of the MLP (a mixture of experts' shared expert)
    dense = model.ffn if model.moe and model.dense_count else 0  # and the dense MLP of its leading dense layers
    ok = [t for t in divisors(cluster.gpus)
          if model.heads % t == 0 and mlp % t == 0 and dense % t == 0 and (model.kv % t == 0 or t % model.kv == 0)
          and (limits.allow_inter_node_tp or (t <= cluster.gpus_per_node and cluster.gpus_per_node % t == 0))]
    if fixed.tp is not None:
        if fixed.tp not in ok:
            raise PlanError(f"--tp {fixed.tp}: tp must divide heads={model.heads}, "
                            f"{'the shared expert' if model.moe else 'ffn'}={mlp} and "
                            f"--gpus {cluster.gpus}, and divide or be a multiple of kv_heads={model.kv}"
                            + ("" if limits.allow_inter_node_tp else
                               f", and fit in a node of {cluster.gpus_per_node}")
                            + f"; use one of {_fmt(ok)}"
                            + ("" if limits.allow_inter_node_tp else " (or add --allow-inter-node-tp)"), "--tp")
        return [fixed.tp]
    return ok


def etp_choices(model: ModelSpec, tp: int, fixed: Fixed) -> list[int]:
    """Expert-tensor-parallel sizes for a layout: 1 for a dense model or a fixed --etp; otherwise 1 (experts whole on
    a rank: Megatron-Bridge's recipes) and, with tp > 1, tp itself (Megatron-Core's default when
    --expert-tensor-parallel-size is left unset) where it divides the expert width.  Other sizes are legal in
    Megatron-Core but no recipe we know uses them; --etp N prices any."""
    if not model.moe:
        return [1]
    if fixed.etp is not None:
        return [fixed.etp]
    return [1] + ([tp] if tp > 1 and model.expert_ffn % tp == 0 else [])


def ep_choices(model: ModelSpec, tp: int, cp: int, dp: int, fixed: Fixed, rejected: Counter,
               etp: int = 1) -> list[int]:
    """Expert-parallel degrees for a layout and expert-tensor-parallel size `etp`: 1 for a dense model; for a
    mixture of experts each ep dividing the expert count (E/ep whole experts per rank) with ep x etp dividing the
    stage's tp × cp × dp ranks it folds over."""
    if not model.moe:
        return [1]
    ranks = tp * cp * dp
    if fixed.ep is not None:
        if ranks % (fixed.ep * etp):
            rejected["--ep x --etp does not divide tp·cp·dp" if etp > 1 else "--ep does not divide tp·cp·dp"] += 1
            return []
        return [fixed.ep]
    ok = [e for e in divisors(model.experts) if ranks % (e * etp) == 0]
    if not ok:
        rejected["--etp does not divide tp·cp·dp"] += 1
    return ok


def layer_units(cluster: Cluster) -> bool:
    """Whether the cluster prices a layer's own units (a GPU description, ZeRO-3 by layer): what a mixture of experts'
    ZeRO-3 and Megatron-Core's recompute modules are priced with."""
    return cluster.hier and cluster.zero3_unit != "submodule"


def check_moe(model: ModelSpec, cluster: Cluster, fixed: Fixed) -> None:
    """The expert-parallel flags against the model, before any candidate is priced: `--ep` needs a mixture of
    experts and must divide its expert count; what the planner does not model for one is refused by name."""
    if not model.moe:
        if fixed.ep not in (None, 1):
            raise PlanError(f"--ep {fixed.ep}: expert parallelism splits a mixture of experts' routed experts, and "
                            f"{model.name} is dense; drop --ep, or describe the experts (--experts/--top-k)", "--ep")
        if fixed.etp not in (None, 1):
            raise PlanError(f"--etp {fixed.etp}: expert tensor parallelism splits a mixture of experts' routed "
                            f"experts, and {model.name} is dense; drop --etp", "--etp")
        return
    if fixed.etp is not None and (fixed.etp < 1 or model.expert_ffn % fixed.etp):
        raise PlanError(f"--etp {fixed.etp}: each expert's width is split over etp ranks, so etp must divide "
                        f"the expert width {model.expert_ffn}; use one of {_fmt(divisors(model.expert_ffn)[:8])}",
                        "--etp")
    if fixed.ep is not None and (fixed.ep < 1 or model.experts % fixed.ep):
        raise PlanError(f"--ep {fixed.ep}: each rank holds experts/ep whole experts, so ep must divide "
                        f"experts={model.experts}; use one of {_fmt(divisors(model.experts))}", "--ep")
    if fixed.zero_stage is not None and fixed.zero_stage >= 3 and not layer_units(cluster):
        raise PlanError("--zero-stage 3 with a mixture of experts: priced with layer units on a GPU description "
                        "(FSDP2 / Megatron-FSDP style: each layer's dense part gathered over dp x cp, its routed "
                        "experts over the ranks holding them); DeepSpeed's sub-module units and the flat model are "
                        "not; use --zero3-unit layer, or --zero-stage 1 or 2", "--zero-stage")
    if fixed.sequence_parallel is False and fixed.tp not in (None, 1):
        raise PlanError(f"--no-sequence-parallel with --tp {fixed.tp} on a mixture of experts: Megatron-Core requires "
                        "sequence parallelism when MoE runs with tensor parallelism (its token dispatchers take each "
                        "TP rank's sequence shard); drop --no-sequence-parallel", "--sequence-parallel")
    if fixed.dp_replicate not in (None, 1):
        raise PlanError(f"--dp-replicate {fixed.dp_replicate} with a mixture of experts: sharding the expert states "
                        "inside each replica and all-reducing expert gradients across replicas is not modelled; "
                        "use --dp-replicate 1", "--dp-replicate")
    if cluster.profile is not None:
        raise PlanError("a mixture of experts on a calibrated host profile: par3d's runtime has no experts, so its "
                        "profile cannot price them; plan on a catalogue GPU (--gpu)", "--model")


def cp_valid(model: ModelSpec, cp: int) -> bool:
    """Causal load balancing cuts each sequence into 2·cp chunks (Megatron-LM's CP); local attention (chunks, a window)
    past its span is priced without CP only (`_check_local_attention`)."""
    return cp == 1 or (model.seq_len % (2 * cp) == 0 and not model.local_attention)


def _check_local_attention(model: ModelSpec, fixed: Fixed) -> None:
    """Local attention past its span (Llama 4's chunks, a sliding window) with context parallelism: how CP's ring would
    run over layers whose keys mostly sit on the rank itself is not priced."""
    if fixed.cp is not None and fixed.cp > 1 and model.local_attention:
        span = (f"in chunks of {model.attn_chunk} tokens" if model.attn_chunk
                else f"through a sliding window of {model.window} tokens")
        short = model.attn_chunk or model.window
        raise PlanError(f"--cp {fixed.cp}: {model.name} attends {span} and its --seq-len {model.seq_len} is longer; "
                        f"context parallelism over local attention is not priced: use --cp 1, or --seq-len {short} "
                        "or less", "--cp")


def cp_choices(model: ModelSpec, rest: int, fixed: Fixed, limits: Limits) -> list[int]:
    """CP degrees for `rest` = gpus / tp ranks."""
    if fixed.cp is not None:
        return [fixed.cp] if rest % fixed.cp == 0 and cp_valid(model, fixed.cp) else []
    hi = limits.max_cp if limits.max_cp is not None else rest
    return [c for c in divisors(rest) if c == 1 or (c <= hi and cp_valid(model, c)
                                                    and model.seq_len // c >= CP_MIN_LOCAL_TOKENS)]


def enumerate_choices(model: ModelSpec, cluster: Cluster, global_batch: int, fixed: Fixed, limits: Limits,
                      rejected: Counter, progress: Callable[[int, int], None] | None = None):
    """Yield (tp, cp, pp, dp, mb, m, schedule, v) tuples that pass the cheap structural rules.  `progress`, if
    given, is told (layouts begun, layouts in all) as each (tp, cp, pp) layout begins and once at the end."""
    n = cluster.gpus
    layouts = [(t, c, p) for t in tp_choices(model, cluster, fixed, limits)
               for c in cp_choices(model, n // t, fixed, limits) for p in divisors(n // (t * c))]
    for i, (tp, cp, pp) in enumerate(layouts):
        if progress is not None:
            progress(i, len(layouts))
        if fixed.pp is not None and pp != fixed.pp:
            continue
        if pp > model.layers:
            rejected["pp > layers"] += 1
            continue
        dp = n // (tp * cp * pp)
        if fixed.dp is not None and dp != fixed.dp:
            continue
        if cp > 1 and cluster.cp_comm == "a2a" and ulysses_error(model, tp, cp):
            rejected["--cp-comm a2a: the heads do not split over tp·cp"] += 1
            continue
        if global_batch % dp:
            rejected["global batch not divisible by dp"] += 1
            continue
        per_rank = global_batch // dp
        for mb in divisors(per_rank):
            if fixed.micro_batch is not None and mb != fixed.micro_batch:
                continue
            m = per_rank // mb
            for sched in SCHEDULE_ORDER:
                if fixed.schedule is not None and sched != fixed.schedule:
                    continue
                if pp == 1 and sched != "1f1b" and fixed.schedule is None:
                    continue  # all schedules coincide without a pipeline
                if pp > 1 and limits.schedules is not None and sched not in limits.schedules:
                    rejected["schedule not in --schedules"] += 1
                    continue
                if sched == "interleaved":
                    if pp == 1 or m % pp:
                        rejected["interleaved needs pp > 1 and m % pp == 0"] += 1
                        continue
                    # up to layers + 2 chunks: the embedding and the head may fill one each (partition.py)
                    hi = min((model.layers + 2) // pp, limits.max_virtual_stages)
                    vs = [fixed.virtual_stages] if fixed.virtual_stages else list(range(2, hi + 1))
                    vs = [v for v in vs if v >= 2 and pp * v <= model.layers + 2]
                    if not vs:
                        rejected["interleaved needs pp·v <= layers + 2"] += 1
                elif sched in V_ORDER:
                    # the runtime's rules (config.py): two chunks per rank, a layer per chunk (or the
                    # embedding or the head alone: 2·pp <= layers + 2), m >= 2p for dualpipe-v.  Tied
                    # embeddings are two copies on rank 0, summed there (data_parallel.tied_pair)
                    if fixed.virtual_stages not in (None, 2):
                        continue
                    why = ("pp > 1" if pp == 1 else "2·pp <= layers + 2" if 2 * pp > model.layers + 2
                           else "m >= 2·pp" if sched == "dualpipe-v" and m < 2 * pp else None)
                    if why is not None:
                        rejected[f"{sched} needs {why}"] += 1
                        continue
                    vs = [2]
                else:
                    if fixed.virtual_stages not in (None, 1):
                        continue
                    vs = [1]
                for v in vs:
                    if model.pipeline_split and pp * v != len(model.pipeline_split):
                        rejected[f"--pipeline-layout has {len(model.pipeline_split)} chunks, not pp × virtual "
                                 f"stages"] += 1
                        continue
                    yield tp, cp, pp, dp, mb, m, sched, v
    if progress is not None:
        progress(len(layouts), len(layouts))


def search(model: ModelSpec, cluster: Cluster, global_batch: int, fixed: Fixed | None = None,
           limits: Limits | None = None, top: int = 5, train_tokens: float = 300e9,
           report_unfit: bool = False, opts: Options | None = None,
           progress: Callable[[int, int], None] | None = None) -> Result:
    """Rank the feasible configurations; `report_unfit` also finds the fastest one that does not fit
    (for `--explain`; it costs a bound per rejected configuration).  `progress` is told (layouts begun, layouts in
    all) as the enumeration moves from one (tp, cp, pp) layout to the next (`enumerate_choices`): a mixture of
    experts' search takes seconds.

    Python's automatic garbage collection is paused for the search and resumes after it (as
    `pipeline.runtime` pauses it for a step): a search allocates ~10⁶ objects, most of which live to its
    end (candidates, cached programs and schedules), and the collector's passes over them were ~7% of a
    large search's time for nothing to free -- its few cycles are collected once it resumes."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _search(model, cluster, global_batch, fixed, limits, top, train_tokens, report_unfit, opts, progress)
    finally:
        if collecting:
            gc.enable()


def _search(model: ModelSpec, cluster: Cluster, global_batch: int, fixed: Fixed | None, limits: Limits | None,
            top: int, train_tokens: float, report_unfit: bool, opts: Options | None,
            progress: Callable[[int, int], None] | None) -> Result:
    fixed = fixed or Fixed()
    limits = limits or Limits()
    opts = opts or DEFAULT_OPTIONS
    res = Result([], limits=limits)
    _check_replicate(cluster, fixed, limits)
    _check_recompute_layers(model, cluster, fixed)
    _check_recompute_op(cluster, fixed)
    _check_recompute_modules(model, cluster, fixed)
    check_moe(model, cluster, fixed)
    _check_ulysses(model, cluster, fixed)
    _check_local_attention(model, fixed)
    cap = math.inf if opts.ignore_memory else opts.capacity(cluster)
    zeros = [fixed.zero_stage] if fixed.zero_stage is not None else list(range(limits.max_zero_stage + 1))
    if model.moe and not layer_units(cluster):  # (check_moe: ZeRO-3 of experts is priced with layer units only)
        zeros = [z for z in zeros if z < 3]
    if cluster.fsdp:  # PyTorch FSDP's strategies: NO_SHARD (DDP) = 0, SHARD_GRAD_OP = 2, FULL_SHARD / HSDP = 3
        zeros = [z for z in zeros if z != 1] or zeros
    recs = [fixed.recompute] if fixed.recompute else list(RECOMPUTE_ORDER)
    if not fixed.recompute and model.moe and layer_units(cluster):
        # a mixture of experts' cheap Megatron-Core modules (compute.RECOMPUTE_MODULES) as its recipes use them: the
        # routed experts' activation, and with latent attention its up projections too
        recs[1:1] = [modules_recompute(["moe_act"])] + (
            [modules_recompute(["mla_up_proj", "moe_act"])] if model.mla else [])
    rec_layers = fixed.recompute_layers or 0
    if rec_layers:
        recs = ["full"]
    if cluster.offload_layers > 0:  # Megatron-Core offloads activations only without recomputation
        recs = [r for r in recs if r == "none"]
    # searched block recomputation: where recomputation is searched and the pricing has the block method
    block = (limits.block_recompute and fixed.recompute is None and not rec_layers and cluster.profile is None
             and cluster.zero3_unit != "submodule")
    # (lower bound of step time, tie-breaker, choice, stage times, memory)
    queue: list[tuple[float, int, Choice, object, object]] = []
    unfit: list[tuple[float, int, Choice, object, object]] = []
    nearest: tuple[float, Choice, object] | None = None  # least memory among the candidates that do not fit
    memo = _Memo(model, cluster)
    # bound every candidate by its arithmetic first and price the rest of its bound (stage times, the
    # makespan's bound, the DP tail) only when the simulation order reaches it: the same candidates are
    # simulated in the same order (`_simulate_best`), most are never priced.  --max-bubble rejects by
    # the full bound when a candidate is pushed, and a runtime profile has no cheap bound: both as before.
    lazy = memo.on and limits.max_bubble is None
    if lazy:
        res.expand = memo.expand
    unfit_raw: list[tuple[Choice, object]] = []
    for tp, cp, pp, dp, mb, m, sched, v in enumerate_choices(model, cluster, global_batch, fixed, limits,
                                                             res.rejected, progress):
        if cluster.offload_layers > 0 and (pp > 1 or cluster.offload_layers >= model.layers):
            res.rejected["activation offloading needs pp = 1 and fewer offloaded layers than layers"] += 1
            continue
        local = model.seq_len // cp  # SP splits this rank's tokens over tp
        if fixed.sequence_parallel is not None:
            sps = [fixed.sequence_parallel] if (tp > 1 or not fixed.sequence_parallel) else []
            if fixed.sequence_parallel and local % tp:
                sps = []
        else:
            sps = [tp > 1 and local % tp == 0]
        if model.moe and tp > 1 and sps != [True]:  # MoE with TP runs sequence parallelism (Megatron-Core's rule)
            res.rejected["a mixture of experts with tp > 1 needs sequence parallelism (seq/cp divisible by tp)"] += 1
            continue
        expert_grids = [(sp, e, et) for sp in sps for et in etp_choices(model, tp, fixed)
                        for e in ep_choices(model, tp, cp, dp, fixed, res.rejected, et)]
        # the (ZeRO stage, replicas) pairs: the layout's, whatever the recomputation or expert grid
        layout_pairs = [(z0, r0) for z0 in zeros for r0 in replicas(cluster, tp, cp, pp, dp, z0, fixed)]
        for sp, ep, etp in expert_grids:
            bare_missed: list[Choice] = []  # the candidates without recomputation that do not fit
            bare_total: dict[tuple[int, int], float] = {}  # (zero, replicas) -> memory without recomputation
            full_fit: dict[tuple[int, int], float] = {}  # (zero, replicas) -> memory recomputing every layer, if it fits
            for rec in recs:
                first = None  # the least-ZeRO candidate, when none fits
                st = None  # stage times do not depend on ZeRO stages 0-2 (0-1 under FSDP)
                fitted = False
                missed: list[Choice] = []  # what did not fit (without recomputation: the block method's start)
                pairs = layout_pairs
                modules = rec.startswith("selective:") and not fixed.recompute  # searched Megatron-Core modules
                if not pairs:  # a fixed --dp-replicate that does not divide this layout's dp
                    res.rejected[f"--dp-replicate {fixed.dp_replicate} does not divide dp"] += 1
                    continue
                for z, r in pairs:
                    if z > 0 and dp * cp == 1 and fixed.zero_stage is None:
                        continue  # ZeRO over one rank changes nothing
                    if modules and bare_total.get((z, r), math.inf) <= cap:
                        continue  # searched modules only where nothing is recomputed does not fit: else they only add
                    c = Choice(tp, pp, dp, mb, m, sched, v, rec, z, sp, cp, r, rec_layers, ep, etp)
                    res.considered += 1
                    mem = memory(model, cluster, c, opts)
                    total = mem[0].total
                    if rec == "none":
                        bare_total[(z, r)] = total
                    if total <= cap:
                        if rec == "full":
                            full_fit[(z, r)] = total
                        # every fitting stage is a candidate: a higher stage needs less memory but is not
                        # always slower (ZeRO-1 shards the optimizer step and reduce-scatters half of an
                        # all-reduce), so keeping only the smallest would change what the search returns
                        fitted = True
                        if lazy:
                            _push_deferred(queue, c, mem, res, memo)
                            continue
                        shared = z < (2 if cluster.fsdp else 3)  # (choice.fsdp_unit_priced: FSDP prices ZeRO-2 too)
                        if not shared or st is None:
                            st_z = memo.stage_times(c)
                            if shared:
                                st = st_z
                        else:
                            st_z = st
                        _push(queue, model, cluster, c, mem, limits, res, top, st_z, memo)
                        continue
                    missed.append(c)
                    if first is None:
                        first = (c, mem)
                    if nearest is None or total < nearest[0]:
                        nearest = (total, c, mem)
                if not fitted:
                    res.rejected["does not fit in memory"] += 1
                    if first is not None and report_unfit:  # the fastest-looking configurations that do not fit
                        unfit_raw.append(first)
                if rec == "none":
                    bare_missed = missed
                if rec == "full" and block and bare_missed:
                    # what does not fit without recomputation but fits recomputing every layer may fit recomputing
                    # the first few layers of each chunk (Megatron's block method, --recompute-num-layers)
                    most = max(layout(model, pp * v).layers)
                    for c0 in bare_missed if most >= 2 else ():
                        key = (c0.zero_stage, c0.dp_replicate)
                        if key not in full_fit:
                            continue  # not even every layer recomputed fits
                        found = _fewest_block_layers(model, cluster, c0, cap, opts, most,
                                                     bare_total[key], full_fit[key])
                        if found is None:
                            continue
                        c, mem = found
                        res.considered += 1
                        if lazy:
                            _push_deferred(queue, c, mem, res, memo)
                        else:
                            _push(queue, model, cluster, c, mem, limits, res, top, memo.stage_times(c), memo)
    unfit = _least_bound_unfit(model, cluster, unfit_raw, memo)
    res.plans = _simulate_best(queue, model, cluster, limits, res, top, train_tokens, opts)
    if not res.plans and nearest is not None:
        res.nearest_unfit = evaluate(model, cluster, nearest[1], train_tokens, mem=nearest[2], opts=opts)  # type: ignore
        res.simulated += 1
    if unfit:
        unfit.sort(key=lambda t: t[0])
        best_unfit = evaluate(model, cluster, unfit[0][2], train_tokens, unfit[0][3], unfit[0][4],  # type: ignore
                              opts)
        res.simulated += 1
        if not res.plans or best_unfit.step_time < res.plans[0].step_time:
            res.fastest_unfit = best_unfit
    return res


def _fewest_block_layers(model: ModelSpec, cluster: Cluster, c: Choice, cap: float, opts: Options,
                         most: int, bare: float, full: float) -> tuple[Choice, object] | None:
    """The block recomputation (c with full recomputation of recompute_layers N, 1 <= N < `most`, the layers of
    the longest chunk) of fewest layers whose memory fits `cap`, with that memory; None if only every layer does.
    `bare` and `full` are the memory without recomputation and with every layer recomputed: memory falls
    with N about linearly between them, so the guess they give is checked and walked to the fewest."""
    def fits(n: int) -> tuple[Choice, object] | None:
        cn = replace(c, recompute="full", recompute_layers=n)
        mem = memory(model, cluster, cn, opts)
        return (cn, mem) if mem[0].total <= cap else None

    n = min(most - 1, max(1, math.ceil(most * (bare - cap) / max(bare - full, 1e-9))))
    best = fits(n)
    while best is None and n < most - 1:  # the guess was short: more layers
        n += 1
        best = fits(n)
    while best is not None and n > 1:  # the fewest: fewer while they fit
        lower = fits(n - 1)
        if lower is None:
            break
        n, best = n - 1, lower
    return best


def _check_ulysses(model: ModelSpec, cluster: Cluster, fixed: Fixed) -> None:
    """--cp-comm a2a's rules (DeepSpeed-Ulysses splits the heads over tp × cp), before anything is priced."""
    if cluster.cp_comm != "a2a" or fixed.cp is None or fixed.cp <= 1:
        return
    tps = [fixed.tp] if fixed.tp is not None else [t for t in divisors(model.heads) if t <= cluster.gpus_per_node]
    why = [ulysses_error(model, t, fixed.cp) for t in tps]
    if all(why):
        what = f"--tp {fixed.tp} --cp {fixed.cp}" if fixed.tp is not None else f"--cp {fixed.cp} at any tp"
        raise PlanError(f"--cp-comm a2a with {what}: {why[0]}; pick a cp that divides the heads per TP rank "
                        f"({model.heads} heads), or use --cp-comm ring", "--cp")


def _check_recompute_op(cluster: Cluster, fixed: Fixed) -> None:
    """--recompute op's rules (torchtitan's selective op checkpointing), before anything is priced."""
    if fixed.recompute != "op":
        return
    if cluster.zero3_unit == "submodule":
        raise PlanError("--recompute op with --zero3-unit submodule: DeepSpeed's sub-module ZeRO-3 is priced with "
                        "every layer recomputed, the attention core, or none; drop one of the two", "--recompute")
    if cluster.profile is not None:
        raise PlanError("--recompute op: a calibrated host prices par3d's runtime, which has no selective op "
                        "checkpointing; use --recompute none, selective or full, or plan on a GPU", "--recompute")


def _check_recompute_modules(model: ModelSpec, cluster: Cluster, fixed: Fixed) -> None:
    """Megatron-Core's named recomputation modules (--recompute-modules): each a module it knows and this model has,
    on a GPU description (par3d's runtime recomputes every layer, the attention core or nothing), before anything is
    priced."""
    rec = fixed.recompute or ""
    if not rec.startswith("selective:"):
        return
    flag = "--recompute-modules"
    mods = recompute_modules(rec)
    unknown = sorted(mods - set(RECOMPUTE_MODULES))
    if unknown or not mods:
        raise PlanError(f"{flag} {rec[len('selective:'):]!r}: {', '.join(unknown) or 'no module'} is not one of "
                        f"Megatron-Core's recompute modules ({', '.join(RECOMPUTE_MODULES)}); name one or more of "
                        "those, comma-separated", flag)
    has = {"core_attn", "layernorm"}
    has |= {"mla_up_proj"} if model.mla else set()
    has |= {"mlp"} if (not model.moe or model.dense_count) else set()
    has |= {"moe", "moe_act"} if model.moe else set()
    has |= {"shared_experts"} if model.moe and model.shared_ffn else set()
    missing = sorted(mods - has)
    if missing:
        what = {"mla_up_proj": "multi-head latent attention", "mlp": "a dense MLP", "moe": "mixture-of-experts layers",
                "moe_act": "mixture-of-experts layers", "shared_experts": "a shared expert"}
        raise PlanError(f"{flag}: {', '.join(missing)} recomputes what {model.name} does not have "
                        f"({'; '.join(f'{m}: {what[m]}' for m in missing)}); its modules are {', '.join(sorted(has))}",
                        flag)
    if cluster.zero3_unit == "submodule" or cluster.profile is not None:
        raise PlanError(f"{flag} with {'--zero3-unit submodule' if cluster.profile is None else 'a calibrated host'}: "
                        "priced only with a layer's own units on a GPU description; use --recompute selective, full "
                        "or none", flag)


def _check_recompute_layers(model: ModelSpec, cluster: Cluster, fixed: Fixed) -> None:
    """--recompute-layers' rules, before anything is priced."""
    n = fixed.recompute_layers
    if n is None:
        return
    flag = "--recompute-layers"
    if n < 1:
        raise PlanError(f"{flag} {n}: the layers of each chunk to recompute must be >= 1; omit it to recompute "
                        "every layer", flag)
    if n > model.layers:
        raise PlanError(f"{flag} {n}: more than the {model.layers} layers of {model.name}, so more than any chunk "
                        f"holds; give at most {model.layers}, or omit it to recompute every layer", flag)
    if fixed.recompute not in (None, "full"):
        raise PlanError(f"{flag} {n} with --recompute {fixed.recompute}: the block method recomputes whole "
                        "layers; use --recompute full or drop --recompute-layers", flag)
    if cluster.zero3_unit == "submodule":
        raise PlanError(f"{flag} {n} with --zero3-unit submodule: DeepSpeed's sub-module ZeRO-3 is priced with "
                        "every layer recomputed or none; drop one of the two", flag)
    if cluster.profile is not None:
        raise PlanError(f"{flag} {n}: a calibrated host prices par3d's runtime, which recomputes every layer or "
                        "none; drop --recompute-layers or the profile", flag)


def _check_replicate(cluster: Cluster, fixed: Fixed, limits: Limits) -> None:
    """--dp-replicate's rules, before anything is priced."""
    r = fixed.dp_replicate
    if r is None or r == 1:
        return
    if r < 1:
        raise PlanError(f"--dp-replicate {r}: the number of HSDP replicas must be >= 1; use 1 for ZeRO over "
                        "the whole DP group", "--dp-replicate")
    if fixed.zero_stage == 0 or limits.max_zero_stage == 0:
        raise PlanError(f"--dp-replicate {r} with ZeRO stage 0: replicas only differ from plain DP when ZeRO "
                        "shards inside each; add --zero-stage 1, 2 or 3 or drop --dp-replicate", "--dp-replicate")
    if fixed.dp is not None and fixed.dp % r:
        raise PlanError(f"--dp-replicate {r}: it must divide --dp {fixed.dp} (each replica holds dp / "
                        f"dp_replicate ranks); use one of {_fmt(divisors(fixed.dp))}", "--dp-replicate")
    if cluster.profile is not None:
        raise PlanError(f"--dp-replicate {r}: HSDP is priced on GPU descriptions and the flat model, not on a "
                        "calibrated host (par3d's runtime has no HSDP); drop --dp-replicate or the profile",
                        "--dp-replicate")


def replicas(cluster: Cluster, tp: int, cp: int, pp: int, dp: int, zero: int, fixed: Fixed) -> list[int]:
    """HSDP replica counts to try for one layout and ZeRO stage.  Fixed: that count (with ZeRO >= 1,
    where it divides dp).  Searched: 1 (ZeRO over the whole DP group) and, when the DP group spans
    nodes with several of its ranks in each, the node-local sharding torchtitan and FSDP's
    HYBRID_SHARD use: one replica per node's DP ranks, so ZeRO's per-layer gathers stay on NVLink and
    only the shards' gradient all-reduce crosses nodes (ZeRO-3 only: for ZeRO-1/2 the whole group's
    reduce-scatter + all-gather moves no more bytes across nodes than the replicas' all-reduce)."""
    if fixed.dp_replicate is not None:
        r = fixed.dp_replicate
        if r == 1:
            return [1]
        return [r] if zero >= 1 and dp % r == 0 else []
    if zero < 3 or cluster.profile is not None:
        return [1]
    local = cluster.gpus_per_node // (tp * cp * pp) if tp * cp * pp < cluster.gpus_per_node else 1
    if local < 2 or dp <= local or dp % local:
        return [1]
    return [1, dp // local]


_counter = [0]


def _placement(c: Choice) -> str:
    """Which stage -> rank map the schedule uses: the V schedules' own, else round-robin."""
    return c.schedule if c.schedule in V_ORDER else "loop"


class _Memo:
    """What one search computes once and many candidates share (exact: the same numbers).

    Without a runtime profile the stage durations of ZeRO stages 0-2 depend on (tp, pp, cp,
    micro-batch, v, recompute, SP, ep) only — not on the schedule, the micro-batch count or dp, which
    the layout fixes — so 1F1B, ZB-H1 and GPipe candidates share them, and so do their lower bounds'
    parts: the makespan bound per (stage times, schedule, m), the DP tail per (stage times, ZeRO
    stage)."""

    def __init__(self, model: ModelSpec, cluster: Cluster):
        self.model, self.cluster = model, cluster
        self.on = cluster.profile is None
        self.st: dict[tuple, object] = {}
        self.lb: dict[tuple, float] = {}
        self.tail: dict[tuple, float] = {}
        self.work: dict[tuple, float] = {}
        self.layer_work: dict[tuple, tuple[float, float, float, float, float, float]] = {}
        self.stage_work: dict[tuple, tuple[float, ...]] = {}
        self.stage_rows: dict[tuple[int, int], tuple[tuple[int, int, int, int, bool], ...]] = {}
        self.spreads: dict[int, float] = {}

    def compute_bound(self, c: Choice) -> float:
        """m × `_busiest_work` stretched by the straggler factor (which multiplies the makespan in the full
        bound), a hair below it so that rounding never lifts it above that bound; the busiest rank's
        work per micro-batch is shared by every m and ZeRO stage of a layout."""
        key = (c.tp, c.pp, c.cp, c.micro_batch, c.virtual_stages, c.recompute, c.recompute_layers, c.sequence_parallel,
               c.schedule, c.ep, c.etp)
        work = self.work.get(key)
        if work is None:
            # the layer's figures, which no schedule, pipeline or block recomputation changes: shared by those keys
            key1 = (c.tp, c.cp, c.micro_batch, c.sequence_parallel, c.recompute, c.ep, c.etp)
            parts = self.layer_work.get(key1)
            if parts is None:
                parts = self.layer_work[key1] = _layer_work(self.model, self.cluster, c)
            key2 = key1 + (c.pp * c.virtual_stages, c.recompute_layers)  # each stage's work: not the schedule's
            stage_work = self.stage_work.get(key2)
            if stage_work is None:
                key3 = key2[-2:]  # the stages' layer counts: the pipeline's chunks and block recomputation alone
                rows = self.stage_rows.get(key3)
                if rows is None:
                    rows = self.stage_rows[key3] = _stage_rows(self.model, c)
                stage_work = self.stage_work[key2] = _stage_work(self.model, c, parts, rows)
            work = self.work[key] = _busiest_work(c, stage_work)
        return self.spread(c.gpus) * (c.microbatches * work) * (1 - 1e-9)

    def spread(self, gpus: int) -> float:
        """The straggler factor of `gpus` GPUs (one per search: every candidate uses the whole cluster)."""
        k = self.spreads.get(gpus)
        if k is None:
            k = self.spreads[gpus] = straggler_factor(self.cluster.step_spread, gpus)
        return k

    def expand(self, item: tuple) -> tuple:
        """A deferred queue item with its full bound (`bound`), keeping its tie-breaker."""
        _, n, c, _, mem = item
        st = self.stage_times(c)
        return (self.bound(c, st), n, c, st, mem)

    def stage_times(self, c: Choice) -> object:
        if not self.on:
            return stage_times(self.model, self.cluster, c)
        key = (c.tp, c.pp, c.cp, c.micro_batch, c.virtual_stages, c.recompute, c.recompute_layers, c.sequence_parallel,
               _placement(c), c.ep, c.etp) + ((c.dp, c.zero_stage, c.dp_replicate) if c.zero_stage >= 3 else ()) + (
                   (c.zero_stage >= 2,) if self.cluster.fsdp else ())  # choice.fsdp_unit_priced: ZeRO-2 and 3
        hit = self.st.get(key)
        if hit is None:
            hit = self.st[key] = stage_times(self.model, self.cluster, c)
        return hit

    def bound(self, c: Choice, st: object) -> float:
        if not self.on:
            return _plain_bound(self.model, self.cluster, c, st)
        # the straggler factor stretches the makespan and the optimizer, not the DP tail (cost.evaluate)
        k = self.spread(c.gpus)
        k1 = (id(st), c.schedule, c.pp, c.microbatches)  # st lives in self.st for the whole search
        lb = self.lb.get(k1)
        if lb is None:
            lb = self.lb[k1] = makespan_lower_bound(st, c)  # type: ignore[arg-type]
        # the tail reads the ranks' stages, and its bound whether the schedule splits its backwards
        k2 = (id(st), _placement(c), c.dp, c.zero_stage, c.dp_replicate, c.schedule in SPLIT_BACKWARD, c.ep, c.etp)
        tail = self.tail.get(k2)
        if tail is None:
            tail = self.tail[k2] = (dp_tail(self.model, self.cluster, c, st)  # type: ignore[arg-type]
                                    + k * optimizer_time(self.model, self.cluster, c))
        return k * lb + tail


def _plain_bound(model: ModelSpec, cluster: Cluster, c: Choice, st: object) -> float:
    """The step-time lower bound without the memo: the makespan's bound and the optimizer stretched by
    the straggler factor, plus the DP tail (cost.evaluate's sum)."""
    k = straggler_factor(cluster.step_spread, c.gpus)
    return (k * (makespan_lower_bound(st, c) + optimizer_time(model, cluster, c))  # type: ignore[arg-type]
            + dp_tail(model, cluster, c, st))  # type: ignore[arg-type]


def _layer_work(model: ModelSpec, cluster: Cluster, c: Choice) -> tuple[float, float, float, float, float, float]:
    """What `_busiest_work` reads of one layer, (forward, the dense layer's forward, recompute, the dense layer's
    recompute, the head's forward, a MoE layer's exposed exchanges): from c's tp, cp, micro-batch, SP, recompute, ep
    and etp alone (not its schedule, pipeline, dp or block recomputation)."""
    lt = choice_layer_times(model, cluster, c)
    # (with the overlap, stage_times prices a paired share that may be smaller: nothing is counted here)
    ep = 0.0 if not model.moe or cluster.ep_comm_overlap else sum(ep_exchange(model, cluster, c))
    rec = lt.recomputed(c.recompute)
    # a mixture of experts' leading dense layers (cost.stage_times prices them as the dense variant's)
    ltd = choice_layer_times(model.dense_variant(), cluster, c) if model.dense_count else lt
    recd = ltd.recomputed(c.recompute)
    # the head's forward (and multi-token prediction's) is the same on every stage: once, out of the loop
    head = lt.head_fwd + mtp_forward(model, cluster.device, cluster.gemm_dtype, c.micro_batch, c.tp, lt, c.cp)
    return lt.fwd, ltd.fwd, rec, recd, head, ep


def _stage_rows(model: ModelSpec, c: Choice) -> tuple[tuple[int, int, int, int, bool], ...]:
    """Each of c's pp × v stages' (layers, dense layers, recomputed layers, recomputed dense layers, head) for
    `_stage_work`: from the chunks and block recomputation alone, which many micro-batch sizes, recomputations and
    expert grids share (the layout's walk was most of `_stage_work`'s time)."""
    lay = layout(model, c.pp * c.virtual_stages)
    rows = []
    for s, (n, h) in enumerate(zip(lay.layers, lay.head)):
        nd, nr = lay.dense_of(s), recomputed_layers(c, n)
        rows.append((n, nd, nr, min(nd, nr), h))
    return tuple(rows)


def _stage_work(model: ModelSpec, c: Choice, parts: tuple[float, float, float, float, float, float],
                rows: tuple[tuple[int, int, int, int, bool], ...]) -> tuple[float, ...]:
    """Each pipeline stage's work for `_busiest_work` (from `_layer_work`'s `parts` and `_stage_rows`' `rows`): c's
    pp × v stages and block recomputation, not its schedule."""
    fwd, fwd_d, rec, recd, head, ep = parts
    work = []
    for n, nd, nr, rd, h in rows:
        mtp_rec = model.mtp_layers * rec if h and c.recompute_layers == 0 else 0.0  # (cost.stage_times)
        work.append(3 * ((n - nd) * fwd + nd * fwd_d + (head if h else 0.0)) + (nr - rd) * rec + rd * recd
                    + mtp_rec + (n - nd) * ep)
    return tuple(work)


def _busiest_work(c: Choice, stage_work: tuple[float, ...]) -> float:
    """The busiest rank's forward, backward (2× forward) and recompute time for one micro-batch
    (stage_times' fc, bc, br) and, without the all-to-all overlap, each MoE layer's exposed token exchanges (its
    f_ep and b_ep hold at least these), from each stage's (`_stage_work`) on c's schedule's ranks: m times it is a
    lower bound of `_bound`, which its makespan bound exceeds (other communication, tails and the optimizer only
    add).  The exchanges tighten it where they weigh: a mixture of experts' search priced 10x fewer full bounds
    with them (issue 12's sixtieth round)."""
    return max(sum(stage_work[s] for s in stages) for stages in rank_stage_lists(c.schedule, c.pp, c.virtual_stages))


def _least_bound_unfit(model: ModelSpec, cluster: Cluster, raw: list[tuple[Choice, object]],
                       memo: _Memo) -> list[tuple[float, int, Choice, object, object]]:
    """The configuration of least bound among those that do not fit (as one-element list; empty if
    none), bounding only those whose arithmetic bound (`_Memo.compute_bound`) is below the best bound
    found (exact: that bound never exceeds the full one).  With a runtime profile every one is bounded."""
    if not raw:
        return []
    if not memo.on:
        return sorted(_bound(model, cluster, c, mem, memo.stage_times(c), memo) for c, mem in raw)[:1]
    order = sorted(((memo.compute_bound(c), i) for i, (c, _) in enumerate(raw)))
    best: tuple[float, int, tuple] | None = None  # (bound, position in `raw`: the first of equal bounds wins)
    for cheap, i in order:
        if best is not None and cheap > best[0] * (1 + 1e-9):  # (1e-9: rounding of the two sums)
            break
        c, mem = raw[i]
        item = _bound(model, cluster, c, mem, memo.stage_times(c), memo)
        if best is None or (item[0], i) < (best[0], best[1]):
            best = (item[0], i, item)
    return [best[2]] if best is not None else []


def _bound(model: ModelSpec, cluster: Cluster, c: Choice, mem: object,
           st: object = None, memo: _Memo | None = None) -> tuple[float, int, Choice, object, object]:
    st = st or stage_times(model, cluster, c)
    if memo is not None:
        lb = memo.bound(c, st)
    else:
        lb = _plain_bound(model, cluster, c, st)
    _counter[0] += 1
    return (lb, _counter[0], c, st, mem)


def _bubble_floors(st: StageTimes, c: Choice) -> tuple[float, float]:
    """Two lower bounds on the simulated bubble (`bubble_wall`, 1 - Σ busy / (p · makespan)) from the stage times
    alone: (the busiest rank's, the mean rank's).

    The makespan is at least `makespan_lower_bound`.  The busiest rank works at least m · Σ (F + B) over its stages
    (BI + BW >= B), so the share of the makespan it idles, a floor under the mean share, is at least 1 - that /
    bound.  Every rank works at most m · Σ (F + B) with B the larger of a full backward and its two halves, so the
    mean share is at least 1 - Σ that / (p · bound): a stage-imbalanced pipeline's bubble (a vocabulary head or
    an MoE stage much heavier than the rest), which the busiest rank's share misses.  The second holds only where
    the candidate is priced at these stage times (`_priced_here`)."""
    m, split = c.microbatches, c.schedule in SPLIT_BACKWARD
    busy = rank_busy(st, c)  # once: the makespan bound reads it too
    total = sum(st.f[s] + (max(st.b[s], st.bi[s] + st.bw[s]) if split else st.b[s])
                for stages in rank_stage_lists(c.schedule, c.pp, c.virtual_stages) for s in stages)
    lb_ms = makespan_lower_bound(st, c, busy)
    if lb_ms <= 0:
        return 0.0, 0.0
    # the mean's floor less 1e-9: the rounding of the same sums taken in another order by the simulator
    return 1 - max(busy) / lb_ms, 1 - m * total / (c.pp * lb_ms) - 1e-9


def _priced_here(model: ModelSpec, cluster: Cluster, c: Choice) -> bool:
    """Whether `cost.evaluate` prices the candidate at the stage times the search holds for it: a host profile
    re-times the stages while pricing, and with several chunks a rank a second cut may be priced (`round_split`)."""
    return cluster.profile is None and round_split(model, c) is None


def bubble_floor(model: ModelSpec, cluster: Cluster, st: StageTimes, c: Choice) -> float:
    """A lower bound on the candidate's simulated bubble (`_bubble_floors`: the mean rank's where it holds)."""
    busiest, mean = _bubble_floors(st, c)
    return mean if mean > busiest and _priced_here(model, cluster, c) else busiest


def over_max_bubble(model: ModelSpec, cluster: Cluster, st: StageTimes, c: Choice, limit: float) -> bool:
    """`bubble_floor(...) > limit`, asking `_priced_here` only where the answer turns on it."""
    busiest, mean = _bubble_floors(st, c)
    return busiest > limit or (mean > limit and _priced_here(model, cluster, c))


def _push_deferred(queue: list, c: Choice, mem: object, res: Result, memo: _Memo) -> None:
    """Queue a candidate under its arithmetic bound (`_Memo.compute_bound`); `_Memo.expand` prices it."""
    _counter[0] += 1
    item = (memo.compute_bound(c), _counter[0], c, None, mem)
    heapq.heappush(queue, item)
    res.per_layout.setdefault((c.tp, c.cp, c.pp, c.dp), []).append(item)


def _push(queue: list, model: ModelSpec, cluster: Cluster, c: Choice, mem: object, limits: Limits,
          res: Result, top: int, st: object = None, memo: _Memo | None = None) -> None:
    item = _bound(model, cluster, c, mem, st, memo)
    if limits.max_bubble is not None and over_max_bubble(model, cluster, item[3], c, limits.max_bubble):  # type: ignore[arg-type]
        res.rejected["bubble above --max-bubble"] += 1
        return
    heapq.heappush(queue, item)
    res.per_layout.setdefault((c.tp, c.cp, c.pp, c.dp), []).append(item)


def _simulate_best(queue: list, model: ModelSpec, cluster: Cluster, limits: Limits, res: Result, top: int,
                   train_tokens: float, opts: Options | None = None, check: bool = True) -> list[Plan]:
    best: list[Plan] = []
    while queue:
        item = heapq.heappop(queue)
        lb, _, c, st, mem = item
        if len(best) >= top and lb > best[-1].step_time:  # ties may still rank above: simulate them
            break
        if st is None:  # deferred: back in the queue under its full bound (never below this one)
            heapq.heappush(queue, res.expand(item))  # type: ignore[misc]
            continue
        plan = evaluate(model, cluster, c, train_tokens, st, mem, opts, validate=False)
        res.simulated += 1
        if limits.max_bubble is not None and plan.bubble_fraction > limits.max_bubble:
            res.rejected["bubble above --max-bubble"] += 1
            continue
        best.append(plan)
        best.sort(key=lambda p: (p.step_time, p.choice.zero_stage, p.memory.total))
        del best[top:]
    for plan in best if check else ():  # the full check of what is recommended
        c = plan.choice
        if c.pp > 1:
            validate_schedule(c.schedule, c.pp, c.microbatches, c.virtual_stages)
    return best


def best_per_layout(model: ModelSpec, cluster: Cluster, res: Result, limit: int = 5,
                    train_tokens: float = 300e9, opts: Options | None = None) -> list[Plan]:
    """For `--explain`: the fastest plan of each (tp, cp, pp, dp) layout (the `limit` layouts of least
    bound), found by the same bound-ordered simulation as the search, so the winner's layout shows
    the winner itself (same v, micro-batch, recompute, ...).  These comparison lines are not
    recommended plans, so their schedules skip the full checker (`validate_schedule`, which the
    search runs on every plan it ranks); their peaks are the counted ones the search uses, which
    tests/test_plan_model.py compares with the checker."""
    layouts = _least_bound_layouts(res, limit)
    win = res.plans[0].choice if res.plans else None
    plans = []
    for key, items in layouts:
        if win is not None and key == (win.tp, win.cp, win.pp, win.dp):
            plans.append(res.plans[0])
            continue
        queue = list(items)
        heapq.heapify(queue)
        scratch = Result([], expand=res.expand)
        best = _simulate_best(queue, model, cluster, res.limits or Limits(), scratch, 1, train_tokens, opts,
                              check=False)
        plans.extend(best)
    return sorted(plans, key=lambda p: p.step_time)


def _least_bound_layouts(res: Result, limit: int) -> list[tuple[tuple, list]]:
    """The `limit` layouts of least full bound, each with its queue items, in that order (ties: the order the
    search met them).  With deferred items (`Result.expand`) a layout's least bound is found by pricing its
    items in the order of their arithmetic bounds until a priced one leads, and layouts are priced in the
    order of their least arithmetic bound until `limit` priced ones lead: every bound priced is one the
    full ranking would look at, and the ranking is the same."""
    items_of = list(res.per_layout.items())
    expand = res.expand
    if expand is None:
        order = sorted(range(len(items_of)), key=lambda i: min(t[0] for t in items_of[i][1]))
        return [items_of[i] for i in order[:limit]]

    def least(items: list) -> float:
        heap = list(items)
        heapq.heapify(heap)
        while heap[0][3] is None:  # deferred: back under its full bound, never below its arithmetic one
            heapq.heappush(heap, expand(heapq.heappop(heap)))
        return heap[0][0]

    layouts = [(min(t[0] for t in items), i, False) for i, (_, items) in enumerate(items_of)]
    heapq.heapify(layouts)
    out = []
    while layouts and len(out) < limit:
        lb, i, exact = heapq.heappop(layouts)
        if exact:
            out.append(items_of[i])
        else:
            heapq.heappush(layouts, (least(items_of[i][1]), i, True))
    return out


def min_microbatches(p: int, max_bubble: float, schedule: str = "1f1b", v: int = 1, m_max: int = 4096) -> int:
    """Smallest m whose simulated bubble (idle share of wall time, equal stages, tb = 2 tf) is
    strictly below `max_bubble` — seed Q1 (c)/(d): p=4 → 28, p=8 → 64 for 10%.  Bisection on m (the bubble falls
    as m grows); interleaved m must be a multiple of p."""
    from par3d.pipeline.schedules import build as _build
    from par3d.pipeline.simulate import simulate as _simulate

    step = p if schedule == "interleaved" else 1

    def bubble(m: int) -> float:
        return _simulate(_build(schedule, p, m, v), p, m, v).bubble_wall

    lo, hi = 1, m_max // step
    if bubble(hi * step) >= max_bubble - 1e-12:
        raise PlanError(f"--max-bubble {max_bubble}: even m={hi * step} micro-batches leave a larger bubble "
                        f"at pp={p}; raise --max-bubble or lower --pp", "--max-bubble")
    while lo < hi:
        mid = (lo + hi) // 2
        if bubble(mid * step) < max_bubble - 1e-12:
            hi = mid
        else:
            lo = mid + 1
    return lo * step


# ---- when nothing fits: a fix from what the search actually rejected --------------------------

def feasible_dps(model: ModelSpec, cluster: Cluster, fixed: Fixed, limits: Limits) -> list[int]:
    """The DP degrees of every (tp, cp, pp) layout that passes the structural rules other than the
    batch's divisibility."""
    n, out = cluster.gpus, set()
    try:
        tps = tp_choices(model, cluster, fixed, limits)
    except PlanError:
        return []
    for tp in tps:
        for cp in cp_choices(model, n // tp, fixed, limits):
            for pp in divisors(n // (tp * cp)):
                dp = n // (tp * cp * pp)
                if pp <= model.layers and (fixed.pp in (None, pp)) and (fixed.dp in (None, dp)):
                    out.add(dp)
    return sorted(out)


def suggest_fixes(model: ModelSpec, cluster: Cluster, global_batch: int, fixed: Fixed, limits: Limits,
                  res: Result, opts: Options | None = None) -> list[str]:
    """Fixes for an empty result, most frequent rejection first, each derived from that rejection:
    a batch no layout divides gets batch sizes that some layout does (not more GPUs); plans that do
    not fit get what would hold the nearest one (its memory over the usable capacity)."""
    from .hardware import DEVICES, GiB

    opts = opts or DEFAULT_OPTIONS
    fixes: list[str] = []
    for reason, _count in res.rejected.most_common():
        if reason == "global batch not divisible by dp":
            dps = feasible_dps(model, cluster, fixed, limits)
            if dps:
                below = max((global_batch // d * d for d in dps if global_batch >= d), default=None)
                above = min(-(-global_batch // d) * d for d in dps)
                opts_txt = " or ".join(str(b) for b in sorted({b for b in (below, above) if b}))
                fixes.append(f"--global-batch {opts_txt}: every layout's dp ({', '.join(map(str, dps[:8]))}"
                             f"{', ...' if len(dps) > 8 else ''}) must divide the global batch, and none divides "
                             f"{global_batch}")
        elif reason == "does not fit in memory" and res.nearest_unfit is not None:
            u = res.nearest_unfit
            need, usable = u.memory.total, opts.capacity(cluster)
            over = need / usable
            fixed_mem = [f for f, v, full in (("--zero-stage", fixed.zero_stage, 3), ("--recompute", fixed.recompute,
                                                                                      "full"),
                                              ("--micro-batch", fixed.micro_batch, 1))
                         if v is not None and v != full]
            if fixed_mem:  # offered only when the search without them finds a plan
                free = replace(fixed, **{f[2:].replace("-", "_"): None for f in fixed_mem})
                r2 = search(model, cluster, global_batch, free, limits, top=1, opts=opts)
                if r2.plans:
                    fixes.append(f"drop {' '.join(fixed_mem)}: then {r2.plans[0].choice.label()} fits "
                                 f"({r2.plans[0].memory.total / GiB:.1f} GiB)")
            if need <= cluster.device.mem_bytes:
                room = math.floor(100 * (1 - need / cluster.device.mem_bytes)) / 100  # down: it must still fit
                fixes.append(f"--memory-headroom {room:.2f}: the nearest "
                             f"plan fits the GPU's {cluster.device.mem_bytes / GiB:.0f} GiB but not the "
                             f"{opts.memory_headroom:.0%} headroom")
            from .hardware import HOST_MEM

            if (cluster.offload_optimizer < 1 and cluster.optimizer == "adam" and cluster.device.name in HOST_MEM
                    and not opts.ignore_memory):  # the optimizer states to host memory (tried: offloading also
                # slows the step, so the search may settle elsewhere)
                r3 = search(model, replace(cluster, offload_optimizer=1.0), global_batch, fixed, limits, top=1,
                            opts=opts)
                if r3.plans:
                    fixes.append(f"--offload-optimizer 1: with the optimizer states in host memory "
                                 f"{r3.plans[0].choice.label()} fits ({r3.plans[0].memory.total / GiB:.1f} GiB; "
                                 f"its step {r3.plans[0].step_time:.3g} s, the host's part a lower bound)")
            bigger = sorted((d for d in DEVICES.values() if d.mem_bytes * (1 - opts.memory_headroom) >= need),
                            key=lambda d: d.mem_bytes)
            if bigger:
                fixes.append(f"--gpu {bigger[0].name} ({bigger[0].mem_bytes / GiB:.0f} GiB holds the nearest plan's "
                             f"{need / GiB:.1f} GiB)")
            # long sequences: activations over the excess shrink with context parallelism (tried too)
            act, excess = u.memory.activations, need - usable
            if (act > excess or not cluster.flash) and u.choice.cp == 1 and fixed.cp in (None, 1):
                # activations fall as 1/cp; without FlashAttention CP also drops the s² scores (its
                # blockwise kernels store none), so any degree may do: try the smallest
                want = act / max(act - excess, 1.0) if cluster.flash else 2
                rest = cluster.gpus // u.choice.tp
                for cp in [c for c in divisors(rest) if c >= want and cp_valid(model, c)][:3]:
                    # a --dp the user gave is kept where it can be (the fix is then the one flag); where it
                    # cannot, the fix says to drop it, since the plan offered has another dp
                    r2 = (search(model, cluster, global_batch, replace(fixed, cp=cp), limits, top=1, opts=opts)
                          if fixed.dp is not None else None)
                    drop = ""
                    if r2 is None or not r2.plans:
                        r2 = search(model, cluster, global_batch, replace(fixed, cp=cp, dp=None), limits, top=1,
                                    opts=opts)
                        drop = f" and drop --dp {fixed.dp}" if fixed.dp is not None else ""
                    if r2.plans:
                        p2 = r2.plans[0]
                        fixes.append(f"--cp {cp}{drop}: activations are {act / GiB:.1f} GiB of the nearest plan's "
                                     f"{need / GiB:.1f} GiB; with context parallelism {p2.choice.label()} fits "
                                     f"({p2.memory.total / GiB:.1f} GiB)")
                        break
            # more GPUs: tried, not guessed (a count no layout can use, e.g. for the batch, is no fix)
            f0 = 1 << max(1, math.ceil(math.log2(over)))
            tried = [cluster.gpus * f for f in (f0, 2 * f0, 4 * f0)]
            for n2 in tried:
                r2 = search(model, replace(cluster, gpus=n2), global_batch, fixed, limits, top=1, opts=opts)
                if r2.plans:
                    p2 = r2.plans[0]
                    fixes.append(f"--gpus {n2}: the nearest plan needs {over:.2f}x the usable memory; on {n2} GPUs "
                                 f"{p2.choice.label()} fits ({p2.memory.total / GiB:.1f} GiB)")
                    break
            else:
                fixes.append(f"more GPUs alone do not help: --gpus {', '.join(map(str, tried))} give no plan either")
        elif reason == "bubble above --max-bubble" and limits.max_bubble is not None:
            fixes.append(f"--max-bubble above {limits.max_bubble:g}, or a larger --global-batch (more "
                         f"micro-batches per pipeline)")
        elif reason.startswith("interleaved") and fixed.schedule == "interleaved":
            fixes.append("--schedule 1f1b (interleaving needs m % pp == 0 and pp·v <= layers + 2)")
        elif fixed.schedule in V_ORDER and reason.startswith(f"{fixed.schedule} needs "):
            why = reason[len(fixed.schedule) + len(" needs "):]
            hint = V_NEEDS[why].format(half=(model.layers + 2) // 2)
            fixes.append(f"{hint} ({fixed.schedule} needs {why}), or --schedule zb-h1")
        elif reason == "schedule not in --schedules" and limits.schedules is not None:
            r2 = search(model, cluster, global_batch, fixed, replace(limits, schedules=None), top=1, opts=opts)
            if r2.plans:  # offered only when a schedule outside the list gives a plan
                fixes.append(f"add {r2.plans[0].choice.schedule} to --schedules (now "
                             f"{','.join(limits.schedules)}): then {r2.plans[0].choice.label()} fits, if the "
                             f"framework that will run it has that schedule")
        elif reason == "pp > layers" and fixed.pp is not None:
            fixes.append(f"--pp <= {model.layers}")
        elif reason.startswith("--dp-replicate") and fixed.dp_replicate is not None:
            fixes.append(f"a --dp-replicate that divides dp (dp = GPUs / (tp·cp·pp); e.g. the GPUs' nodes: "
                         f"--dp-replicate {max(1, cluster.gpus // cluster.gpus_per_node)}), or drop --dp-replicate")
    if not fixes:
        fixes.append("drop some fixed choices (--tp --cp --pp --dp --micro-batch --schedule --zero-stage "
                     "--recompute): together they exclude every layout")
    seen: list[str] = []
    for f in fixes:
        if f not in seen:
            seen.append(f)
    return seen
