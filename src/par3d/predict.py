"""Predict the step time of a `par3d train` run: the planner's own model on the run's layout.

There is one step-time model, `plan/cost.py`'s `evaluate`; this module only translates a
`RunConfig` into what it takes (the model shape, the layout as a `Choice`, and the cluster a
hardware file describes, with its runtime profile: `plan/profile.py`).  So the end-of-run report
of `par3d train --hardware FILE` and `par3d plan --hardware FILE` with the same layout fixed print
the same number (tests/test_calibrate.py checks it).  No torch is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from par3d.config import RunConfig
from par3d.plan import cost
from par3d.plan.hardware import Cluster, HardwareFile, load_hardware_file
from par3d.plan.models import ModelSpec
from par3d.plan.profile import cluster_from_file


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
    plan = cost.evaluate(model_spec(cfg), cluster_of(hw, cfg), choice(cfg))
    return Prediction(plan.step_time, plan.extra["makespan_s"], plan.bubble_fraction, dict(plan.breakdown))


def predict_memory(cfg: RunConfig, pp_rank: int) -> dict[str, float]:
    """plan/memory.py's bytes for pipeline rank `pp_rank` of this layout (every DP, CP and TP rank of
    it holds the same): weights, grads, optimizer (ZeRO over dp x cp), activations (the schedule's
    peak in-flight micro-batches), other (the documented allowance)."""
    from par3d.plan.memory import rank_memory

    cfg = RunConfig.from_dict(cfg.to_dict()).resolve()
    pc, model = cfg.parallel, model_spec(cfg)
    shape = cost.rank_shapes(model, pc.tp, pc.pp, pc.virtual_stages, pc.schedule)[pp_rank]
    inflight = cost.peak_inflight(pc.schedule, pc.pp, int(pc.microbatches or 1), pc.virtual_stages)[pp_rank]
    mb = rank_memory(model, shape, inflight, tp=pc.tp, dp=pc.dp, b=int(cfg.train.micro_batch or 1),
                     sp=pc.sequence_parallel and pc.tp > 1, recompute=pc.recompute, zero=pc.zero_stage,
                     dtype=cfg.train.dtype, v=pc.virtual_stages, cp=pc.cp)
    return {"weights": mb.weights, "grads": mb.grads, "optimizer": mb.optimizer, "activations": mb.activations,
            "other": mb.other}


def load_hardware(path: str) -> HardwareFile:
    return load_hardware_file(path)


def predict_step_time(cfg: RunConfig, hardware_path: str) -> float:
    """Seconds per optimizer step of `cfg` on the machine described by `hardware_path`."""
    return predict(cfg, load_hardware_file(hardware_path)).step_time_s


def with_efficiency(hw: HardwareFile, efficiency: float) -> HardwareFile:
    """The same file with another achievable fraction of the GEMM rate."""
    return replace(hw, device=replace(hw.device, efficiency=efficiency))


__all__ = ["Prediction", "choice", "cluster_of", "load_hardware", "model_spec", "predict", "predict_memory",
           "predict_step_time",
           "with_efficiency"]
