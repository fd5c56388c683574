"""Memory per GPU of one configuration (`memory`): the weights' and optimizer states' share and the activations
in flight on each rank under its schedule, from memory.py's primitives; activation offload's exposed copies."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

from .choice import DEFAULT_OPTIONS, Choice, Options
from .compute import layer_gemms
from .hardware import NVLINK4_EFF, Cluster
from .memory import (
    FRAGMENTATION,
    MemoryBreakdown,
    RankShape,
    activation_terms,
    head_grad_bytes,
    layer_activation_bytes,
    logits_bytes,
    rank_activations,
    rank_states,
    round_up_2g,
    state_bytes_per_param,
    state_terms,
    v_head_share,
    v_rank_units,
    weight_grad_bytes,
    weight_grad_share,
)
from .models import ModelSpec
from .stage_layout import layout, peak_inflight, peak_layers, rank_shapes, split_states, v_layer_states

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


def stored_layer_bytes(k: ModelSpec, b: int, tp: int, sp: bool, recompute: str, dtype: str, cp: int, flash: bool,
                       chunks: int, rec_layers: int, etp: int) -> float:
    """One layer's stored activations: `partial_activation_bytes` under block recomputation of `rec_layers` layers a
    chunk, else `layer_activation_bytes`."""
    if recompute == "full" and rec_layers > 0:
        return partial_activation_bytes(k, b, tp, sp, dtype, cp, flash, chunks, rec_layers, etp)
    return layer_activation_bytes(k, b, tp, sp, recompute, dtype, cp, flash, etp)


def _rank_layer_mean(shape: RankShape, per_layer: float, dense: float) -> float:
    """A mixture of experts' rank's layers at their own kinds' mean (its dense and MoE layers counted over its chunks,
    `Layout.dense`)."""
    n, nd = sum(shape.layers), shape.dense_layers
    return ((n - nd) * per_layer + nd * dense) / n if n else max(per_layer, dense)


@lru_cache(maxsize=8192)
def _memory_scan(model: ModelSpec, dtype: str, flash: bool, tp: int, pp: int, v: int, schedule: str, m: int,
                 b: int, sp: bool, recompute: str, cp: int, rec_layers: int = 0,
                 cross_entropy: str = "unfused", ep: int = 1, etp: int = 1) -> tuple:
    """What `memory` reads that no ZeRO stage changes (the search asks for every stage of one layout); `ep` the
    ranks one layer's routed experts spread over (ep x etp), `etp` expert tensor parallelism."""
    shapes, peaks, live, heavy, split = _schedule_scan(model, tp, pp, v, schedule, _m_key(schedule, pp, m), ep)
    per_layer = stored_layer_bytes(model, b, tp, sp, recompute, dtype, cp, flash, pp * v, rec_layers, etp)
    per_rank: tuple[float, ...] = ()
    if model.dense_count:  # a mixture of experts' dense layers: each rank's layers at their own kinds' mean; the
        # larger of the two for the one-number estimate
        dense = stored_layer_bytes(model.dense_variant(), b, tp, sp, recompute, dtype, cp, flash, pp * v, rec_layers,
                                   etp)
        per_rank = tuple(_rank_layer_mean(shape, per_layer, dense) for shape in shapes)
        per_layer = max(per_layer, dense)
    return shapes, peaks, per_layer, logits_bytes(model, b, tp, cp, cross_entropy), live, heavy, per_rank, split



@lru_cache(maxsize=4096)
def _zbv_head_extra(model: ModelSpec, dtype: str, flash: bool, b: int, tp: int, sp: bool, recompute: str, cp: int,
                    etp: int, ep: int, pp: int, m: int, rec_layers: int = 0) -> float:
    """ZB-V's head rank's live layers beyond its whole-chunk count: the larger of (a) where the head chunk keeps more
    past its BI than a chunk's forward (the output layer's input and logits' gradient; `memory.v_head_share`, rounded
    up as the order's cap counts it, cost.zbv_times), the count's excess over min(2m, 2p) (`memory.v_rank_units`), in
    chunks of the model's mean layers (the share's unit), and (b) what the head chunks that can be past their BI at
    once keep above their own layers, in layers (the whole-chunk count holds them at their own layers, often fewer
    than the mean: (a) alone was 0.62-1.99x rank 0's walk through the order built for the plan's times over 2,340
    catalogue layouts, this 1.005-2.4x; tests/test_split_memory.py)."""
    lay = layout(model, 2 * pp)
    unit = sum(lay.layers) / len(lay.layers)
    # one layer's stored bytes as the count holds them (block recomputation: the chunk's mean), the shares' unit, as
    # cost.stage_times builds the order with
    layer = stored_layer_bytes(model.at_ep(ep), b, tp, sp, recompute, dtype, cp, flash, 2 * pp, rec_layers, etp)
    held = min(1.0, round_up_2g(weight_grad_share(model, b, tp, sp, recompute, dtype, cp, flash, etp, ep, layer)))
    share = round_up_2g(v_head_share(model, b, tp, sp, recompute, dtype, cp, flash, etp, ep, lay.layers[-1], unit,
                                     layer))
    units = v_rank_units(pp, m, held, share)
    over = (units - min(2 * m, 2 * pp)) * unit
    # the whole-chunk count (`_peak_layers`) holds the head chunk at its own layers, which the balanced partition
    # often makes fewer than the mean (none on the Zero Bubble paper's rows): each head chunk past its BI keeps the
    # output layer's pair above them, less what its layers free (`head_grad_bytes` - n·(1 - held) layers), whatever
    # its share in mean chunks.  While micro-batch i's head chunk is past its BI its first chunk (stage 0, BI after
    # the whole V's) is alive too, at least `held`, so at most units / (share + held) of them are, and at most m
    past = (head_grad_bytes(model, b, tp, dtype, cp) / layer - lay.layers[-1] * (1.0 - held)) if layer > 0 else 0.0
    heads = min(m, math.floor(units / (share + held) + 1e-9))
    return max(over, heads * past)


def _split_terms(model: ModelSpec, dtype: str, flash: bool, schedule: str, split: bool, b: int, tp: int, sp: bool,
                 recompute: str, cp: int, etp: int, ep: int, pp: int, m: int,
                 rec_layers: int) -> tuple[tuple[float, float], float, float]:
    """What a split backward adds to `rank_activations`' count: the kept pairs (`_split_kept`, where its `split`
    states are counted: ZB-H1, DualPipe-V), ZB-V's head rank's extra live layers (`_zbv_head_extra`) and the factor
    ZB-V's live layers take for what its chunks past BI keep above their forward's bytes (`_zbv_kept_factor`)."""
    kept = _split_kept(model, dtype, b, tp, sp, cp, etp, ep) if split else (0.0, 0.0)
    if schedule != "zb-v":
        return kept, 0.0, 1.0
    return (kept, _zbv_head_extra(model, dtype, flash, b, tp, sp, recompute, cp, etp, ep, pp, m, rec_layers),
            _zbv_kept_factor(model, dtype, flash, b, tp, sp, recompute, cp, etp, ep, pp, rec_layers))


def zbv_kept_factor(model: ModelSpec, cluster: Cluster, c: Choice, opts: Options | None = None) -> float:
    """`_zbv_kept_factor` of choice `c` as `memory` prices it (1 where a chunk past BI keeps no more than its forward
    saved): what the plan report's `order:` line quotes."""
    opts = opts or DEFAULT_OPTIONS
    return _zbv_kept_factor(model.at_ep(c.ep), cluster.precision, opts.flash_attention or cluster.flash, c.micro_batch,
                            c.tp, c.sequence_parallel, c.recompute, c.cp, c.etp, c.ep, c.pp, c.recompute_layers)


@lru_cache(maxsize=4096)
def _zbv_kept_factor(model: ModelSpec, dtype: str, flash: bool, b: int, tp: int, sp: bool, recompute: str, cp: int,
                     etp: int, ep: int, pp: int, rec_layers: int = 0) -> float:
    """What one of ZB-V's chunks past its BI holds against its forward's stored bytes, where that is more than 1 (full
    or op recomputation, whose forward saved a layer's input where BI's recomputed forward leaves each linear layer's
    x and dy; sequence parallelism at TP 8, whose deferred GEMMs keep the gathered x where the forward saved shards):
    the larger of a routed and a dense layer's, else 1.  The V's order counts such a chunk as 1 (`cost.zbv_times`
    caps the share it is built with at 1), so its cap holds up to min(2m, 2p) chunks whichever side of BI they are,
    and the built orders do leave nearly all of them past BI at once (walked in bytes, 0.88-1.0 of this bound on
    Llama 3 8B at 2-8 stages under full recomputation): the live layers are counted at this factor, a bound.  Before
    issue 12's sixty-seventh round they were counted at the forward's bytes, up to 45x short."""
    most = 1.0
    for kind in ((model, model.dense_variant()) if model.dense_count else (model,)):
        saved = stored_layer_bytes(kind.at_ep(ep), b, tp, sp, recompute, dtype, cp, flash, 2 * pp, rec_layers, etp)
        if saved > 0:
            most = max(most, weight_grad_bytes(kind, b, tp, sp, dtype, cp, etp, ep) / saved)
    return most


@lru_cache(maxsize=4096)
def _split_kept(model: ModelSpec, dtype: str, b: int, tp: int, sp: bool, cp: int, etp: int,
                ep: int = 1) -> tuple[float, float]:
    """What a chunk past its BI keeps until its BW, a layer's and the head's (memory.weight_grad_bytes,
    memory.head_grad_bytes), for `rank_activations`' `split`; `ep` the expert-parallel ranks, so that a layer's routed
    copies are the busiest EP rank's (ModelSpec.route_load), as its forward's bytes are priced (`model.at_ep(ep)`)."""
    return weight_grad_bytes(model, b, tp, sp, dtype, cp, etp, ep), head_grad_bytes(model, b, tp, dtype, cp)


def _m_key(schedule: str, pp: int, m: int) -> int:
    """The micro-batch count the memory count depends on: DualPipe-V's is the same at every m >= 2p (its whole-chunk
    count 2p + 1 and its ranks' states, `stage_layout.v_layer_states`), so the caches hold one entry for all of them."""
    return 2 * pp if schedule == "dualpipe-v" and m >= 2 * pp else m


@lru_cache(maxsize=4096)
def _schedule_scan(model: ModelSpec, tp: int, pp: int, v: int, schedule: str, m: int, ep: int = 1) -> tuple:
    """The part of `_memory_scan` that neither the micro-batch's size nor recomputation changes: each rank's
    shape, the schedule's peak in-flight micro-batches, the live layers at the peak, the heaviest ranks and, where the
    backward is split in a fixed order (ZB-H1, DualPipe-V), each rank's candidate peaks (stage_layout.split_states,
    v_layer_states)."""
    shapes = rank_shapes(model, tp, pp, v, schedule, ep)
    peaks = peak_inflight(schedule, pp, m, v)
    live = _peak_layers(schedule, pp, m, v, shapes, peaks)
    # (DualPipe-V's states are of its two chunks a rank: a choice of other virtual stages, which the search and the
    # CLI refuse, keeps the whole-chunk count rather than failing in `rank_activations`)
    split = split_states(schedule, pp, m, v) or (v_layer_states(schedule, pp, m, shapes) if v == 2 else None)
    return shapes, peaks, live, _heavy_ranks(model, tp, pp, v, live, schedule, ep, split), split


def memory(model: ModelSpec, cluster: Cluster, c: Choice,
           opts: Options | None = None) -> tuple[MemoryBreakdown, int]:
    """The heaviest rank's memory and that rank."""
    # fast scan: states ∝ params, activations ∝ in-flight × layers per chunk (memory.rank_memory)
    model = model.at_ep(c.ep)  # (uneven routing loads the busiest of several EP ranks: models.ModelSpec.route_load)
    opts = opts or DEFAULT_OPTIONS
    # PyTorch's pipeline stages keep an FSDP2 stage's weights gathered and its gradients unreduced through the step
    # (stage_times: no reshard, no gradient sync between micro-batches): its memory is ZeRO-1's, the optimizer's state
    # alone sharded
    zero = 1 if cluster.fsdp and c.pp > 1 and c.zero_stage >= 3 else c.zero_stage
    off = cluster.offload_optimizer
    if model.moe or model.mtp_layers:
        # a mixture of experts' expert states shard over expert_dp, not dp x cp, and multi-token prediction adds
        # to the head's rank: the one-coefficient estimate below would mis-rank them, so the few candidate ranks
        # are priced in full (their activations kept for every ZeRO stage: `_RankMemo`); the first of equal
        # totals (MemoryBreakdown.total's sum, in its order).  `_RankMemo` holds the same figures for the search's
        # ~10⁵-10⁶ calls under shorter keys.
        memo = _rank_memo(model, cluster, opts)
        ranks = memo.ranks(c)
        states = memo.states(c, zero)
        best, arg, most = None, 0, 0.0
        for r, shape, act, other in ranks:
            w, g, o, a, oth = rank_states(states, shape, act, other)
            if off:  # an offloaded share of the optimizer states lives in host memory (Cluster.offload_optimizer)
                o = o * (1.0 - off)
            total = w + g + o + a + oth
            if best is None or total > most:
                best, arg, most = (w, g, o, a, oth), r, total
        return MemoryBreakdown(*best), arg  # type: ignore[misc]
    # a dense model: the rank the one-coefficient estimate finds heaviest, priced in full (`_RankMemo.dense` holds what
    # no ZeRO stage changes: the search asks for each layout's every stage in a row)
    memo = _rank_memo(model, cluster, opts)
    w, g, o = state_bytes_per_param(cluster.dtype, zero, c.zero_shards, memo.acc, opts.optimizer_dtype, cluster.optimizer)
    o *= 1.0 - off
    # total = states + (1 + fragmentation) · activations + a part equal on every rank (memory.py), so
    # this picks the rank rank_memory would find heaviest
    rows = memo.dense(c)
    top, row = -1.0, rows[0]  # (rank 0 is always a candidate: `_heavy_ranks` keeps the first)
    for heavy in rows:
        est = (w + g + o) * heavy[1] + heavy[2]
        if est > top:
            top, row = est, heavy
    arg, _, _, shape, act, other = row
    w, g, o, a, oth = rank_states(memo.states(c, zero), shape, act, other)
    if off:  # (as above)
        o = o * (1.0 - off)
    return MemoryBreakdown(w, g, o, a, oth), arg


class _RankMemo:
    """The heavy ranks' activations and `_state_terms` of one (model, cluster, options) -- what `memory`'s ranked path reads
    -- keyed on the choice's fields alone (the model's, cluster's and options' fixed by the memo), the same
    numbers from the same functions; the activations' micro-batch parts (`_act_parts`) apart from the schedule's
    (`_schedule_scan`), since many micro-batch counts share one micro-batch size."""

    MAX = 8192  # entries kept before a cache is emptied (a search asks for each group's in a row)

    def __init__(self, model: ModelSpec, cluster: Cluster, opts: Options):
        self.model, self.cluster, self.opts = model, cluster, opts
        self.dtype, self.flash = cluster.precision, opts.flash_attention or cluster.flash
        self.acc = memory_accounting(opts, cluster)
        self.ce, self.offload = cluster.cross_entropy, cluster.offload_layers
        self._ranks: dict[tuple, tuple] = {}
        self._parts: dict[tuple, tuple] = {}
        self._scans: dict[tuple, tuple] = {}
        self._states: dict[tuple, tuple] = {}
        self._dense: dict[tuple, tuple] = {}

    def _fill(self, cache: dict[tuple, tuple], key: tuple, build: Callable[..., tuple], *args: object) -> tuple:
        """A cache miss: `build(*args)` (default: the key's fields) stored under `key`, a full cache emptied first (a
        search asks for each group's in a row, so the older entries are not asked again).  The callers look the key
        up themselves: they are asked ~10⁶ times a search, and a call on every hit would cost ~10 % of it."""
        if len(cache) >= self.MAX:
            cache.clear()
        got = cache[key] = build(*(args or key))
        return got

    def ranks(self, c: Choice) -> tuple[tuple[int, RankShape, float, float], ...]:
        """(rank, shape, activations, other before ZeRO-3's gathered weights) of each rank of choice `c` that can
        be the heaviest (`_heavy_ranks`): `memory.rank_activations` of `_memory_scan`'s figures."""
        key = (c.tp, c.pp, c.virtual_stages, c.schedule, _m_key(c.schedule, c.pp, c.microbatches), c.micro_batch,
               c.sequence_parallel, c.recompute, c.cp, c.recompute_layers, c.ep * c.etp, c.etp)  # (as `dense`'s)
        got = self._ranks.get(key)
        return got if got is not None else self._fill(self._ranks, key, self._heavy)

    def _heavy(self, tp: int, pp: int, v: int, schedule: str, m: int, b: int, sp: bool, recompute: str, cp: int,
               rec_layers: int, ep: int, etp: int) -> tuple[tuple[int, RankShape, float, float], ...]:
        """`_memory_scan`'s figures for the heavy ranks only (the others' are not read), in the same arithmetic."""
        model = self.model
        skey = (tp, pp, v, schedule, m, ep)
        shapes, peaks, live, heavy, split = (self._scans.get(skey)
                                             or self._fill(self._scans, skey, _schedule_scan, model, *skey))
        pkey = (tp, pp * v if recompute == "full" and rec_layers > 0 else 0, b, sp, recompute, cp, rec_layers, etp)
        per_layer, dense, acts = (self._parts.get(pkey)
                                  or self._fill(self._parts, pkey, self._act_parts, tp, pp, v, b, sp, recompute, cp,
                                                rec_layers, etp))
        kept, extra, scale = _split_terms(model, self.dtype, self.flash, schedule, split is not None, b, tp, sp,
                                          recompute, cp, etp, ep // etp, pp, m, rec_layers)
        mtp = model.mtp_layers
        out = []
        for r, *_ in heavy:
            shape = shapes[r]
            own = (_rank_layer_mean(shape, per_layer, dense) if dense is not None  # (_memory_scan's per_rank)
                   else per_layer if rec_layers else None)
            units = live[r] * scale + (extra if shape.head else 0.0)
            out.append((r, shape, *rank_activations(acts, mtp, shape, peaks[r],
                                                    _offloaded_live(units, self.offload, pp), own,
                                                    split[r] if split is not None else None, *kept)))
        return tuple(out)

    def dense(self, c: Choice) -> tuple[tuple[int, float, float, RankShape, float, float], ...]:
        """A dense model's ranks that can be the heaviest (`_heavy_ranks`), each as (rank, parameters, its
        activations' part of `memory`'s estimate, shape, activations, other): `_memory_scan`'s figures,
        `activation_terms` and `rank_activations` as `memory` reads them, in the same arithmetic."""
        key = (c.tp, c.pp, c.virtual_stages, c.schedule, _m_key(c.schedule, c.pp, c.microbatches), c.micro_batch,
               c.sequence_parallel, c.recompute, c.cp, c.recompute_layers, c.expert_shards, c.etp)
        got = self._dense.get(key)
        return got if got is not None else self._fill(self._dense, key, self._dense_rows)

    def _dense_rows(self, tp: int, pp: int, v: int, schedule: str, m: int, b: int, sp: bool, recompute: str, cp: int,
                    rec_layers: int, ep: int, etp: int) -> tuple[tuple[int, float, float, RankShape, float, float], ...]:
        model, dtype, flash, ce = self.model, self.dtype, self.flash, self.ce
        shapes, peaks, per_layer, logits, live, heavy, per_rank, split = _memory_scan(
            model, dtype, flash, tp, pp, v, schedule, m, b, sp, recompute, cp, rec_layers, ce, ep, etp)
        acts = activation_terms(model, tp=tp, b=b, sp=sp, recompute=recompute, dtype=dtype, cp=cp, flash=flash,
                                cross_entropy=ce, etp=etp)
        kept, extra, scale = _split_terms(model, dtype, flash, schedule, split is not None, b, tp, sp, recompute, cp,
                                          etp, ep // etp, pp, m, rec_layers)
        act_scale = 1.0 + FRAGMENTATION
        rows = []
        for r, params, units, head, _ in heavy:
            units = units * scale + (extra if head else 0.0)
            act, other = rank_activations(acts, model.mtp_layers, shapes[r], peaks[r],
                                          _offloaded_live(units, self.offload, pp),
                                          per_rank[r] if per_rank else per_layer if rec_layers else None,
                                          split[r] if split is not None else None, *kept)
            # (the estimate that picks the heaviest rank: its activations less what every rank adds alike; a split
            # backward's from its candidate peaks)
            est = (act - (acts[1] or 0.0)) if split is not None else units * per_layer + (logits if head else 0.0)
            rows.append((r, params, act_scale * est, shapes[r], act, other))
        return tuple(rows)

    def _act_parts(self, tp: int, pp: int, v: int, b: int, sp: bool, recompute: str, cp: int, rec_layers: int,
                   etp: int) -> tuple[float, float | None, tuple]:
        """(`_memory_scan`'s per_layer before the dense layers' max, the dense variant's or None without dense
        layers, `activation_terms`): what no schedule changes."""
        model, dtype, flash = self.model, self.dtype, self.flash
        per_layer = stored_layer_bytes(model, b, tp, sp, recompute, dtype, cp, flash, pp * v, rec_layers, etp)
        dense = (stored_layer_bytes(model.dense_variant(), b, tp, sp, recompute, dtype, cp, flash, pp * v,
                                    rec_layers, etp) if model.dense_count else None)
        acts = activation_terms(model, tp=tp, b=b, sp=sp, recompute=recompute, dtype=dtype, cp=cp, flash=flash,
                                cross_entropy=self.ce, etp=etp)
        return per_layer, dense, acts

    def states(self, c: Choice, zero: int) -> tuple:
        """`_state_terms(model, cluster, c, opts, zero, acc)`."""
        key = (zero, c.zero_stage, c.tp, c.dp // c.dp_replicate, c.cp, c.expert_dp, c.ep * c.etp)
        got = self._states.get(key)
        if got is None:
            cl, o = self.cluster, self.opts
            got = self._fill(self._states, key, _states, self.model, self.dtype, cl.optimizer, cl.zero3_unit,
                             o.optimizer_dtype, self.acc, *key)
        return got


_MEMOS: dict[tuple[int, int, int], _RankMemo] = {}
_LAST: list[_RankMemo] = []  # the memo asked for last (a search asks for one ~10⁶ times in a row)


def _rank_memo(model: ModelSpec, cluster: Cluster, opts: Options) -> _RankMemo:
    """The `_RankMemo` of these very objects (frozen; the memo holds them, so their ids are not reused while kept)."""
    if _LAST:
        got = _LAST[0]
        if got.model is model and got.cluster is cluster and got.opts is opts:
            return got
    key = (id(model), id(cluster), id(opts))
    got = _MEMOS.get(key)
    if got is None or got.model is not model or got.cluster is not cluster or got.opts is not opts:
        if len(_MEMOS) >= 4:
            _MEMOS.clear()
        got = _MEMOS[key] = _RankMemo(model, cluster, opts)
    _LAST[:] = [got]
    return got


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
    model = model.at_ep(c.ep)
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
                 schedule: str | None = None, ep: int = 1,
                 split: tuple[tuple[tuple[int, ...], ...], ...] | None = None
                 ) -> tuple[tuple[int, float, float, bool, float], ...]:
    """(rank, parameters, in-flight layer units, holds the head, expert parameters) of the ranks that can be the heaviest
    (`live`: each rank's peak of live layers, `peak_layers`).

    A rank's memory rises with its dense parameters, its expert parameters, its in-flight layer units and
    holding the head (the coefficients are >= 0, and rounding is monotone), and the scan keeps the first of equal
    estimates, so a rank that an earlier rank matches or exceeds in all four never wins: dropping it changes no
    answer.  Under 1F1B that leaves the first two ranks and the last.

    With a split backward's candidate peaks (`split`, stage_layout.split_states; DualPipe-V's, v_layer_states) the
    in-flight units are counts whose bytes differ from plan to plan, so a rank is dropped where another of its layers
    matches or exceeds its every state in every count, or where it sits between two ranks of its very shape whose
    states it averages (ZB-H1's middle ranks, p - r before BI and r past it): its activations, each state's a linear
    sum, are then at most the larger of theirs."""
    shapes = rank_shapes(model, tp, pp, v, schedule, ep)
    kept: list[tuple[int, float, float, bool, float]] = []
    for r, shape in enumerate(shapes):
        if split is not None:
            if 0 < r < pp - 1 and _between(shapes[r - 1:r + 2], split[r - 1:r + 2]):
                continue
            if any(k[1] - k[4] >= shape.params - shape.expert_params and k[4] >= shape.expert_params
                   and (k[3] or not shape.head) and shapes[k[0]].layers == shape.layers
                   and _covers(split[k[0]], split[r])
                   for k in kept):
                continue
            kept.append((r, shape.params, live[r], shape.head, shape.expert_params))
            continue
        row = (r, shape.params, live[r], shape.head, shape.expert_params)
        # a mixture of experts: the dense and the expert parameters compared apart (their states shard over
        # different groups, so neither total orders the ranks)
        if not any(k[1] - k[4] >= row[1] - row[4] and k[4] >= row[4] and k[2] >= row[2] and (k[3] or not row[3])
                   for k in kept):
            kept.append(row)
    return tuple(kept)


def _covers(states: tuple[tuple[int, ...], ...], others: tuple[tuple[int, ...], ...]) -> bool:
    """Whether every one of `others` is matched or exceeded in every count by one of `states`."""
    if states and len(states[0]) == 2:  # (spelled out: ZB-H1's, asked for every layout of a search)
        return all(any(x >= a and y >= b for x, y in states) for a, b in others)
    if states and len(states[0]) == 4:  # DualPipe-V's (stage_layout.v_layer_states)
        return all(any(w >= a and x >= b and y >= c and z >= d for w, x, y, z in states) for a, b, c, d in others)
    return all(any(all(x >= y for x, y in zip(o, st)) for o in states) for st in others)


def _between(shapes: tuple[RankShape, ...] | list[RankShape],
             states: tuple[tuple[tuple[int, ...], ...], ...]) -> bool:
    """Whether the middle of three ranks has its neighbours' shape and, state by state, the mean of theirs."""
    a, b, c = shapes
    if not (a == b == c) or not (len(states[0]) == len(states[1]) == len(states[2])):
        return False
    return all(all(2 * x == y + z for x, y, z in zip(m, lo, hi)) for lo, m, hi in zip(states[0], states[1], states[2]))
