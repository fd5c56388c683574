"""Predict the step time of a `par3d train` run: the planner's own model on the run's layout.

There is one step-time model, `plan/cost.py`'s `evaluate`; this module only translates a
`RunConfig` into what it takes (the model shape, the layout as a `Choice`, and the cluster a
hardware file describes, with its runtime profile: `plan/profile.py`).  So the end-of-run report
of `par3d train --hardware FILE` and `par3d plan --hardware FILE` with the same layout fixed print
the same number (tests/test_calibrate.py checks it).  No torch is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from par3d.config import RunConfig
from par3d.pipeline.schedules import V_SCHEDULES
from par3d.plan import cost, stage_layout
from par3d.plan.hardware import Cluster, HardwareFile, load_hardware_file
from par3d.plan.models import ModelSpec
from par3d.plan.profile import cluster_from_file


def model_spec(cfg: RunConfig) -> ModelSpec:
    """The run's model as the planner sees it: its shapes and its architecture's switches (a switch the config
    leaves unset takes its `arch`'s default, as `ModelConfig.fill_arch` does) -- GPT's LayerNorm, GeLU, learned
    positions and biases, or Llama's RMSNorm, gated MLP, rotary positions and grouped-query attention."""
    mc = replace(cfg.model).fill_arch()  # a copy: the config itself is left as given
    vocab = -(-mc.vocab // cfg.parallel.tp) * cfg.parallel.tp  # vocab padded to a multiple of tp
    return ModelSpec(f"par3d-{mc.arch}", mc.layers, mc.hidden, mc.heads, mc.seq_len, vocab, mc.ffn,
                     kv_heads=mc.kv_heads, gated=bool(mc.gated_mlp), tied=mc.tied_embeddings,
                     learned_pos=mc.position == "learned", bias=bool(mc.bias),
                     norm="rms" if mc.norm == "rmsnorm" else "layer",
                     pipeline_split=tuple(cfg.parallel.pipeline_layout or ()))


def _csv_schedule(cfg: RunConfig) -> list | None:
    """The actions of `parallel.schedule_csv` (validated with the config), or None without one."""
    from par3d.pipeline.schedules import from_csv

    if not cfg.parallel.schedule_csv:
        return None
    with open(cfg.parallel.schedule_csv, newline="") as fh:
        return from_csv(fh.read()).schedule


def schedule_name(cfg: RunConfig, strict: bool = True) -> str:
    """The schedule the planner prices: `parallel.schedule`, or the builder that makes the CSV's
    actions.  The planner prices named schedules only: another CSV raises ValueError (`strict`) or
    gives a schedule with the file's placement (what the rank shapes and memory depend on)."""
    from par3d.pipeline.schedules import SCHEDULES, builder_of, default_v, placement, schedule_placement

    pc = cfg.parallel
    actions = _csv_schedule(cfg)
    if actions is None:
        return pc.schedule
    name = builder_of(actions, pc.pp, int(pc.microbatches or 1), pc.virtual_stages)
    if name is not None:
        return name
    if strict:
        raise ValueError(f"parallel.schedule_csv={pc.schedule_csv!r} is no builder's schedule at p={pc.pp}, "
                         f"m={pc.microbatches}, v={pc.virtual_stages}; the planner prices named schedules only")
    where = placement(actions)
    ranks = [where[s] for s in range(len(where))]
    v = pc.virtual_stages
    for n in (pc.schedule, *SCHEDULES):
        takes_v = v == 1 if default_v(n) == 1 else (v >= 2 if n == "interleaved" else v == 2)
        if takes_v and schedule_placement(n, pc.pp, v) == ranks:
            return n
    return pc.schedule


def peak_inflight(cfg: RunConfig) -> tuple[int, ...]:
    """Every pipeline rank's peak of live micro-batch activations: the CSV's own (the checker's),
    or the named schedule's (`plan/stage_layout.py`)."""
    pc = cfg.parallel
    actions = _csv_schedule(cfg)
    if actions is not None:
        from par3d.pipeline.schedules import check

        return tuple(check(actions, pc.pp, int(pc.microbatches or 1), pc.virtual_stages).peak_inflight)
    return stage_layout.peak_inflight(pc.schedule, pc.pp, int(pc.microbatches or 1), pc.virtual_stages)


def choice(cfg: RunConfig, strict: bool = False) -> cost.Choice:
    """The run's layout as the planner's Choice (`strict`: refuse a CSV schedule no builder makes)."""
    pc, tc = cfg.parallel, cfg.train
    return cost.Choice(tp=pc.tp, pp=pc.pp, dp=pc.dp, micro_batch=int(tc.micro_batch or 1),
                       microbatches=int(pc.microbatches or 1), schedule=schedule_name(cfg, strict),
                       virtual_stages=pc.virtual_stages, recompute=pc.recompute, zero_stage=pc.zero_stage,
                       sequence_parallel=pc.sequence_parallel, cp=pc.cp)


def cluster_of(hw: HardwareFile, cfg: RunConfig) -> Cluster:
    return cluster_from_file(hw, cfg.parallel.world_size, cfg.train.dtype)


@dataclass
class Prediction:
    step_time_s: float
    makespan_s: float
    bubble_fraction: float
    breakdown: dict[str, float]


def predict(cfg: RunConfig, hw: HardwareFile) -> Prediction:
    cfg = RunConfig.from_dict(cfg.to_dict()).resolve()  # never mutate the caller's config
    plan = cost.evaluate(model_spec(cfg), cluster_of(hw, cfg), choice(cfg, strict=True))
    return Prediction(plan.step_time, plan.extra["makespan_s"], plan.bubble_fraction, dict(plan.breakdown))


def runtime_memory_flags(cfg: RunConfig) -> dict[str, Any]:
    """How `par3d train` itself holds memory, as rank_memory's switches: gradients in fp32 main-grad buffers
    whatever the training dtype (data_parallel.py / zero.py `memory()`: 4 B per parameter, Megatron's count), and
    attention through `F.scaled_dot_product_attention`, whose fused kernels (FlashAttention on a GPU, the
    blockwise CPU kernel) keep a log-sum-exp, not the s² scores -- except with dropout, where PyTorch falls back
    to the math path that stores them; and its loss's one fp32 copy of the logits (memory.RUNTIME_LOGIT_MEMORY:
    4 B a logit, not the 6 B of Megatron's unfused loss).  Measured on one H200 (docs/measured.md, "One H200"): with the s² scores
    and 2-byte gradients the report predicted 48.4 GB of activations and 2.8 GB of gradients where the 1.4B run
    held 14.6 GB and 5.7 GB."""
    return {"flash": not cfg.model.dropout, "accounting": "megatron", "cross_entropy": "runtime"}


def predict_memory(cfg: RunConfig, pp_rank: int) -> dict[str, float]:
    """plan/memory.py's bytes for pipeline rank `pp_rank` of this layout (every DP, CP and TP rank of
    it holds the same): weights, grads, optimizer (ZeRO over dp x cp), activations (the schedule's
    peak in-flight micro-batches), other (the documented allowance)."""
    from par3d.plan.memory import rank_memory

    cfg = RunConfig.from_dict(cfg.to_dict()).resolve()
    pc, model = cfg.parallel, model_spec(cfg)
    try:  # a builder's schedule, named or as a CSV of its very actions
        name, builders = schedule_name(cfg), True
    except ValueError:  # a CSV no builder makes: a schedule of its placement, its own peaks
        name, builders = schedule_name(cfg, strict=False), False
    shapes = stage_layout.rank_shapes(model, pc.tp, pc.pp, pc.virtual_stages, name)
    peaks = peak_inflight(cfg)
    # ZB-H1's split backward: each rank's candidate peaks, chunks before BI and past it (stage_layout.split_states)
    split = stage_layout.split_states(name, pc.pp, int(pc.microbatches or 1), pc.virtual_stages) if builders else None
    live = None  # the interleaved builder's live layers, chunk by chunk (stage_layout.peak_layers)
    if builders and name == "interleaved" and pc.pp > 1:
        live = stage_layout.peak_layers(name, pc.pp, int(pc.microbatches or 1), pc.virtual_stages, shapes, peaks)[pp_rank]
    b, sp, flags = int(cfg.train.micro_batch or 1), pc.sequence_parallel and pc.tp > 1, runtime_memory_flags(cfg)
    walked = None
    if name in V_SCHEDULES:  # the V's order (zb-v's built for parallel.zbv_times): its rank walked in bytes
        walked = walked_v(cfg, model, b, sp, flags)[pp_rank]
    mb = rank_memory(model, shapes[pp_rank], peaks[pp_rank], tp=pc.tp, dp=pc.dp, b=b, sp=sp, recompute=pc.recompute,
                     zero=pc.zero_stage, dtype=cfg.train.dtype, v=pc.virtual_stages, cp=pc.cp, inflight_layers=live,
                     split=split[pp_rank] if split is not None else None, walked=walked, **flags)
    return {"weights": mb.weights, "grads": mb.grads, "optimizer": mb.optimizer, "activations": mb.activations,
            "other": mb.other}


def walked_v(cfg: RunConfig, model: ModelSpec, b: int, sp: bool, flags: dict[str, Any]) -> list[float]:
    """A V schedule's ranks walked in bytes through the actions `par3d train` runs (`train.pipeline_schedule`: the
    CSV's, or the builder's for `parallel.zbv_times`), one peak a rank: a stage's forward its layers' stored bytes (the head's with the loss's
    logits), what its BI keeps its layers' weight-GEMM pairs (the head's with the output layer's:
    memory.weight_grad_bytes, head_grad_bytes).  Exact where the V's counts are a cap (zb-v's 2p chunks, with the
    head chunk's pending logits' gradients above it) or a mean (the rank's two chunks' layers)."""
    from par3d.plan.memory import head_grad_bytes, layer_activation_bytes, logits_bytes, weight_grad_bytes
    from par3d.train import pipeline_schedule

    pc = cfg.parallel
    dtype, cp = cfg.train.dtype, pc.cp
    layer = layer_activation_bytes(model, b, pc.tp, sp, pc.recompute, dtype, cp, flags["flash"])
    pair = weight_grad_bytes(model, b, pc.tp, sp, dtype, cp)
    lay = stage_layout.layout(model, pc.pp * pc.virtual_stages)
    fwd = [n * layer for n in lay.layers]
    kept = [n * pair for n in lay.layers]
    for s, head in enumerate(lay.head):
        if head:
            fwd[s] += logits_bytes(model, b, pc.tp, cp, flags["cross_entropy"])
            kept[s] += head_grad_bytes(model, b, pc.tp, dtype, cp)
    return [stage_layout.walked_bytes(actions, fwd, kept) for actions in pipeline_schedule(cfg)]


def load_hardware(path: str) -> HardwareFile:
    return load_hardware_file(path)


def predict_step_time(cfg: RunConfig, hardware_path: str) -> float:
    """Seconds per optimizer step of `cfg` on the machine described by `hardware_path`."""
    return predict(cfg, load_hardware_file(hardware_path)).step_time_s


def with_efficiency(hw: HardwareFile, efficiency: float) -> HardwareFile:
    """The same file with another achievable fraction of the GEMM rate."""
    return replace(hw, device=replace(hw.device, efficiency=efficiency))


__all__ = ["Prediction", "choice", "cluster_of", "load_hardware", "model_spec", "predict", "predict_memory", "runtime_memory_flags",
           "predict_step_time",
           "with_efficiency"]
