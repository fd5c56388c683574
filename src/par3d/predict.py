"""Predict the step time of a `par3d train` run with the planner and a calibrated hardware file.

The prediction is the planner's own arithmetic (`plan/cost.py`): per-stage F/B durations from
`stage_times` (roofline GEMMs + ring TP collectives), the makespan of the run's *own* schedule from
the pipeline simulator, the DP tail and the optimizer.  No torch is imported here.

What the planner does not model, because on a GPU it is noise, dominates small runs on a CPU;
`par3d calibrate` measures it and we add it here, through the durations the planner already
exposes (`StageTimes`), never by re-deriving the FLOPs or the collectives:

- ``overheads.layer_f_s`` / ``layer_b_s``: the fixed cost of one transformer block's forward /
  backward (Python, autograd and the dispatch of its ~40 kernels), measured on a block so small
  that its arithmetic is negligible;
- ``overheads.action_f_s`` / ``action_b_s``: the fixed cost of one pipeline action apart from
  its blocks (embedding, head and loss kernels, receive/send bookkeeping);
- ``overheads.step_s``: the fixed cost of one optimizer step (data, gradient norm, AdamW over the
  flat buffers, loss reductions);
- ``links.p2p``: α/β of point-to-point sends, fitted apart from the collectives (the planner's
  `intra` link is the all-reduce fit, which is what TP and DP use);
- ``cores``: CPU cores.  Busy ranks beyond the cores share them, so every rank computes
  busy/cores times slower, where `busy` is the average number of ranks computing at once (all of
  them for DP and TP; fewer in a pipeline, whose ranks wait in the bubble);
- ``collective_sync_us``: what a collective costs inside a training step beyond the α-β fit of
  isolated calls (each is a point where the ranks wait for the slowest), fitted on the reference
  model run with TP over the calibration ranks and added to the links' α;
- ``pipeline_hop_us``: what a pipeline transfer costs inside a step beyond the α-β fit of
  isolated sends (posting the send, waking the receiver), fitted on `bench synthetic`'s waiting
  stages and added to each transfer;
- ``corun_slowdown`` / ``oversubscribed_slowdown``: how much slower the reference runs, beyond
  time-sharing, when as many independent copies as cores (twice as many) run at once: shared
  caches and memory bandwidth (and context switches); interpolated on the busy ranks.

The file's `device.efficiency` is the residual efficiency of a real block relative to the
asymptotic single-thread GEMM rate (`peak_tflops`), once the fixed overheads are taken out; it
folds in layer norm, GeLU, softmax and the small-GEMM penalty at the reference shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from par3d.config import RunConfig
from par3d.plan import comm as plan_comm
from par3d.plan import cost
from par3d.plan.hardware import GB, US, Cluster, HardwareFile, Link, load_hardware_file
from par3d.plan.models import ModelSpec


@dataclass(frozen=True)
class Overheads:
    """Fixed costs per block, per pipeline action and per step (seconds); zero for a GPU file."""

    layer_f_s: float = 0.0
    layer_b_s: float = 0.0
    action_f_s: float = 0.0
    action_b_s: float = 0.0
    step_s: float = 0.0

    @staticmethod
    def from_dict(d: dict[str, Any] | None) -> Overheads:
        d = d or {}
        return Overheads(**{k: float(d.get(k, 0.0)) for k in Overheads.__dataclass_fields__})


@dataclass
class Profile:
    """A hardware file plus the CPU-specific quantities `par3d calibrate` adds."""

    hw: HardwareFile
    overheads: Overheads = field(default_factory=Overheads)
    p2p: Link | None = None
    cores: int | None = None
    corun: float = 1.0  # per-rank slowdown when the cores are all busy at once (calibrated)
    oversub: float = 1.0  # the same with twice as many busy ranks as cores, beyond time-sharing
    sync: float = 0.0  # seconds a collective costs inside a step beyond its α-β fit (calibrated)
    hop: float = 0.0  # seconds a pipeline transfer costs inside a step beyond its α-β fit (calibrated)
    # (tokens per micro-batch, efficiency) measured at several micro-batch sizes, ascending
    efficiency_by_tokens: tuple[tuple[float, float], ...] = ()


def load_profile(path: str) -> Profile:
    return profile_of(load_hardware_file(path))


def profile_of(hw: HardwareFile) -> Profile:
    """A hardware file (`load_hardware_file` / `hardware_from_dict`) as predict.py uses it."""
    extra = hw.extra
    p2p = (extra.get("links") or {}).get("p2p")
    corun = float(extra.get("corun_slowdown", 1.0) or 1.0)
    return Profile(hw, Overheads.from_dict(extra.get("overheads")),
                   p2p=Link("p2p", p2p["alpha_us"] * US, p2p["bw_gbps"] * GB) if p2p else None,
                   cores=extra.get("cores"), corun=corun,
                   oversub=float(extra.get("oversubscribed_slowdown", corun) or corun),
                   sync=float(extra.get("collective_sync_us", 0.0) or 0.0) * US,
                   hop=float(extra.get("pipeline_hop_us", 0.0) or 0.0) * US,
                   efficiency_by_tokens=tuple(sorted((float(t), float(e))
                                                     for t, e in extra.get("efficiency_by_tokens") or ())))


def _log_interp(pts: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise linear in log(x) through `pts` (ascending x), flat beyond the ends."""
    if x <= pts[0][0]:
        return pts[0][1]
    if x >= pts[-1][0]:
        return pts[-1][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return y0 + (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0)) * (y1 - y0)
    return pts[-1][1]


def efficiency_at(prof: Profile, tokens: float) -> float:
    """The block efficiency for micro-batches of `tokens` tokens: interpolated in log(tokens)
    between the calibrated sizes (flat beyond them); the file's single value without them.

    Why: a GEMM of few rows runs far from the asymptotic rate (cache blocking, the kernel's own
    fixed work), so the same model split into micro-batches of 2 sequences computes each token
    markedly slower than in micro-batches of 16 — on the development VM the calibrated efficiency
    is 38–50 % at 128 tokens against 52–58 % at 1,024 (runs of one day), and ignoring it was the
    largest systematic error of the fidelity grid."""
    if not prof.efficiency_by_tokens:
        return prof.hw.device.efficiency
    return _log_interp(prof.efficiency_by_tokens, tokens)


def model_spec(cfg: RunConfig) -> ModelSpec:
    """The par3d GPT as the planner sees it (GeLU MLP, learned positions, biases)."""
    mc = cfg.model
    vocab = -(-mc.vocab // cfg.parallel.tp) * cfg.parallel.tp  # vocab padded to a multiple of tp
    return ModelSpec("par3d-gpt", mc.layers, mc.hidden, mc.heads, mc.seq_len, vocab, mc.ffn,
                     tied=mc.tied_embeddings)


def choice(cfg: RunConfig) -> cost.Choice:
    pc, tc = cfg.parallel, cfg.train
    return cost.Choice(tp=pc.tp, pp=pc.pp, dp=pc.dp, micro_batch=int(tc.micro_batch or 1),
                       microbatches=int(pc.microbatches or 1), schedule=pc.schedule,
                       virtual_stages=pc.virtual_stages, recompute=pc.recompute, zero_stage=pc.zero_stage,
                       sequence_parallel=pc.sequence_parallel)


def cluster_of(prof: Profile, cfg: RunConfig) -> Cluster:
    world = cfg.parallel.world_size
    gpn = max(prof.hw.gpus_per_node or world, world)  # all ranks of this machine are one node
    # a collective inside a step also waits for its slowest rank: the calibrated sync joins its α
    intra, inter = (replace(k, alpha=k.alpha + prof.sync) for k in (prof.hw.intra, prof.hw.inter))
    return Cluster(prof.hw.device, world, gpn, intra, inter, cfg.train.dtype)


@dataclass
class Prediction:
    step_time_s: float
    makespan_s: float
    bubble_fraction: float
    breakdown: dict[str, float]


def contention(prof: Profile, world: int, busy: float | None = None) -> float:
    """How much slower each rank computes when `world` ranks share the machine's cores, `busy` of
    them computing at any moment on average (default: all): busy ranks beyond the cores time-share
    them (busy/cores), and ranks running side by side slow each other (shared caches and memory
    bandwidth: the calibrated co-run slowdown, in proportion to how many other cores are busy)."""
    if not prof.cores or world == 1:
        return 1.0
    busy = world if busy is None else busy
    # beyond time-sharing, the calibrated slowdown: 1 alone, `corun` with every core busy,
    # `oversub` with twice as many busy ranks as cores; linear in between, flat beyond
    k = prof.cores
    if busy <= k:
        extra = 1.0 + (prof.corun - 1.0) * max(0.0, busy - 1.0) / max(1, k - 1)
    else:
        extra = prof.corun + (prof.oversub - prof.corun) * min(1.0, (busy - k) / k)
    return max(1.0, busy / k) * extra


def predict(cfg: RunConfig, prof: Profile) -> Prediction:
    cfg = RunConfig.from_dict(cfg.to_dict()).resolve()  # never mutate the caller's config
    model, c = model_spec(cfg), choice(cfg)
    if prof.efficiency_by_tokens:
        prof = with_efficiency(prof, efficiency_at(prof, c.micro_batch * model.seq_len))
    cl = cluster_of(prof, cfg)
    ov = prof.overheads
    st = cost.stage_times(model, cl, c)  # the planner's per-stage F/B (compute + TP collectives)
    world = c.tp * c.pp * c.dp
    # the waits inside each action (TP / ZeRO-3 collectives): a rank waiting needs no core, so the
    # cores' contention below slows only the rest
    waits = {"f": [f - fc for f, fc in zip(st.f, st.f_compute)],
             "b": [b - bc - br for b, bc, br in zip(st.b, st.b_compute, st.b_recompute)],
             "bi": [bi - fc - br for bi, fc, br in zip(st.bi, st.f_compute, st.b_recompute)]}
    waits["bw"] = waits["b"]  # eager BW costs a whole B (below)
    lay = cost.layout(model, c.pp * c.virtual_stages)
    # per stage: the planner's F/B + the fixed overheads, on a core of its own
    rec_f = {"none": 0.0, "selective": 0.0, "full": 1.0}[c.recompute]  # full recompute reruns F
    for s, n in enumerate(lay.layers):
        f_fix = ov.action_f_s + n * ov.layer_f_s
        b_fix = ov.action_b_s + n * (ov.layer_b_s + rec_f * ov.layer_f_s)
        st.f[s] += f_fix
        st.b[s] += b_fix
        # eager zero-bubble (runtime.py): BI walks the graph to the stage input; BW walks it again
        # to the parameters, and the weight gradients need the activation gradients of every
        # layer, which BI did not keep — so BW redoes BI's chain (and its TP collectives) and
        # costs a whole B; each pays B's fixed cost
        st.bi[s] += b_fix
        st.bw[s] = st.b[s]
    if c.pp > 1 and prof.p2p is not None:
        act = c.micro_batch * model.seq_len * model.hidden * (4 if cl.dtype == "fp32" else 2)
        st.transfer = plan_comm.p2p(act / (c.tp if c.sequence_parallel else 1), prof.p2p).total + prof.hop
    # Ranks share the cores only while they compute: a rank waiting in the pipeline bubble, or for
    # its partners inside a TP collective, leaves its core to the others.  So the slowdown follows
    # the average number of computing ranks, read off the schedule's own simulation (busy time
    # less the collective waits, over the makespan, times the ranks of each stage).
    makespan, bubble, busy = cost.simulate_stages(st, c)
    kinds = ("f", "bi", "bw") if c.schedule == "zb-h1" else ("f", "b")
    waiting = c.microbatches * sum(sum(waits[k]) for k in kinds)  # every stage runs each kind m times
    busy_ranks = c.dp * c.tp * max(0.0, sum(busy) - waiting) / makespan if makespan > 0 else world
    slow = contention(prof, world, busy_ranks)
    if slow != 1.0:
        for kind, lst in (("f", st.f), ("b", st.b), ("bi", st.bi), ("bw", st.bw)):
            lst[:] = [slow * (t - w) + w for t, w in zip(lst, waits[kind])]
        makespan, bubble, _busy = cost.simulate_stages(st, c)
    tail = cost.dp_tail(model, cl, c, st)
    full = contention(prof, world)  # the optimizer step runs on every rank at once
    opt = full * cost.optimizer_time(model, cl, c)
    # per step: loss and gradient-norm reductions over tp, pp (and dp): small all-reduces, α-bound
    small = sum(plan_comm.all_reduce(8.0, e, cl.intra).total for e in (c.tp, c.pp, c.dp))
    fixed = full * ov.step_s + small
    step = makespan + tail + opt + fixed
    return Prediction(step, makespan, bubble, {"pipeline": makespan, "dp_tail": tail, "optimizer": opt,
                                                "fixed": fixed})


def predict_step_time(cfg: RunConfig, hardware_path: str) -> float:
    """Seconds per optimizer step of `cfg` on the machine described by `hardware_path`."""
    return predict(cfg, load_profile(hardware_path)).step_time_s


def with_efficiency(prof: Profile, efficiency: float) -> Profile:
    """The same profile with another achievable fraction of the GEMM rate (calibrate uses it)."""
    hw = replace(prof.hw, device=replace(prof.hw.device, efficiency=efficiency))
    return replace(prof, hw=hw)


__all__ = ["Overheads", "Prediction", "Profile", "choice", "efficiency_at", "load_profile", "model_spec", "predict",
           "profile_of",
           "predict_step_time", "with_efficiency"]
