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
- ``cores``: CPU cores.  Ranks beyond the cores share them, so every rank computes
  world/cores times slower when all are busy (pessimistic for pipeline bubbles, where some wait);
- ``corun_slowdown``: how much slower the reference runs when as many independent copies as
  cores run at once (shared caches and memory bandwidth), applied whenever world > 1.

The file's `device.efficiency` is the residual efficiency of a real block relative to the
asymptotic single-thread GEMM rate (`peak_tflops`), once the fixed overheads are taken out; it
folds in layer norm, GeLU, softmax and the small-GEMM penalty at the reference shape.
"""

from __future__ import annotations

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


def load_profile(path: str) -> Profile:
    hw = load_hardware_file(path)
    links = hw.extra.get("links", {}) or {}
    p2p = links.get("p2p")
    return Profile(hw, Overheads.from_dict(hw.extra.get("overheads")),
                   Link("p2p", p2p["alpha_us"] * US, p2p["bw_gbps"] * GB) if p2p else None,
                   hw.extra.get("cores"), float(hw.extra.get("corun_slowdown", 1.0) or 1.0))


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
    return Cluster(prof.hw.device, world, gpn, prof.hw.intra, prof.hw.inter, cfg.train.dtype)


@dataclass
class Prediction:
    step_time_s: float
    makespan_s: float
    bubble_fraction: float
    breakdown: dict[str, float]


def contention(prof: Profile, world: int) -> float:
    """How much slower each rank computes when `world` ranks share the machine's cores: ranks
    beyond the cores time-share them (world/cores), and ranks running side by side slow each other
    (shared caches and memory bandwidth: the calibrated co-run slowdown)."""
    if not prof.cores:
        return 1.0
    return max(1.0, world / prof.cores) * (prof.corun if world > 1 else 1.0)


def predict(cfg: RunConfig, prof: Profile) -> Prediction:
    cfg = RunConfig.from_dict(cfg.to_dict()).resolve()  # never mutate the caller's config
    model, c = model_spec(cfg), choice(cfg)
    cl = cluster_of(prof, cfg)
    ov = prof.overheads
    st = cost.stage_times(model, cl, c)  # the planner's per-stage F/B (compute + TP collectives)
    slow = contention(prof, c.tp * c.pp * c.dp)
    lay = cost.layout(model, c.pp * c.virtual_stages)
    # per stage: the planner's F/B (slowed when ranks share cores) + the fixed overheads
    rec_f = {"none": 0.0, "selective": 0.0, "full": 1.0}[c.recompute]  # full recompute reruns F
    for s, n in enumerate(lay.layers):
        f_fix = ov.action_f_s + n * ov.layer_f_s
        b_fix = ov.action_b_s + n * (ov.layer_b_s + rec_f * ov.layer_f_s)
        st.f[s] = slow * (st.f[s] + f_fix)
        st.b[s] = slow * (st.b[s] + b_fix)
        # eager zero-bubble: BI and BW each walk the graph (runtime.py), so each pays B's fixed cost
        st.bi[s] = slow * (st.bi[s] + b_fix)
        st.bw[s] = slow * (st.bw[s] + b_fix)
    if c.pp > 1 and prof.p2p is not None:
        act = c.micro_batch * model.seq_len * model.hidden * (4 if cl.dtype == "fp32" else 2)
        st.transfer = plan_comm.p2p(act / (c.tp if c.sequence_parallel else 1), prof.p2p).total
    makespan, bubble, _busy = cost.simulate_stages(st, c)
    tail = cost.dp_tail(model, cl, c, st)
    opt = slow * cost.optimizer_time(model, cl, c)
    # per step: loss and gradient-norm reductions over tp, pp (and dp): small all-reduces, α-bound
    small = sum(plan_comm.all_reduce(8.0, e, cl.intra).total for e in (c.tp, c.pp, c.dp))
    fixed = slow * ov.step_s + small
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


__all__ = ["Overheads", "Prediction", "Profile", "choice", "load_profile", "model_spec", "predict",
           "predict_step_time", "with_efficiency"]
