"""Will the run fit?  An estimate of every rank's memory before any process starts.

The estimate is the planner's memory model (`plan/memory.py`: weights, gradients and Adam state
per parameter, activations per layer per micro-batch × the schedule's peak in-flight count, the
last stage's logits), applied to this run's layout, with the memory the ranks share as capacity:
on CPU ranks that is this host's RAM — every local rank draws on it — and on GPUs each device's
own memory.  A run whose estimate exceeds the capacity is refused (it would swap or be killed by
the kernel's OOM killer after a long start, or "train" at a crawl with no step finishing);
over 80 % of it prints a warning.

What differs on CPU ranks from the planner's GPU accounting: the fixed allowance is a process's
own memory instead of a CUDA context (`CPU_RANK_BYTES`, measured), and PyTorch's CPU allocator has
no cache to fragment, so the 10 % fragmentation term is kept only as a margin.  The activation
formulas assume the attention scores are stored (5·a·s²·b per layer, Korthikanti et al. 2022);
a fused attention kernel may store less, so the estimate errs on the safe side.

Pure (no torch): the CLI calls it in milliseconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from par3d.config import RunConfig
from par3d.plan import stage_layout
from par3d.plan.hardware import GiB
from par3d.plan.memory import FRAGMENTATION, rank_memory

# One CPU rank's own memory before it holds a tensor: Python, torch and par3d imported, a gloo
# process group.  Measured on the development VM (torch 2.13, Linux): 221 MiB resident after the
# imports; rounded up for gloo's buffers and the allocator.
CPU_RANK_BYTES = 300 * 2**20
WARN_FRACTION = 0.8


@dataclass(frozen=True)
class Estimate:
    per_rank: list[float]  # bytes, per pipeline rank (every DP/TP replica of it holds as much)
    heaviest: int  # the pipeline rank with the largest estimate
    breakdown: dict[str, float]  # of the heaviest rank, GiB
    ranks_sharing: int  # ranks that draw on one capacity (a host's RAM, or 1 per GPU)
    total: float  # bytes those ranks need together
    capacity: float  # bytes they have
    where: str  # "this host's RAM" or "one GPU's memory"

    @property
    def fraction(self) -> float:
        return self.total / self.capacity if self.capacity > 0 else float("inf")


def estimate(cfg: RunConfig, capacity: float, ranks_sharing: int, device: str = "cpu") -> Estimate:
    """Every pipeline rank's memory for `cfg` (validated), and how much of `capacity` the
    `ranks_sharing` ranks that draw on it need together (the heaviest rank's share each)."""
    from par3d.pipeline.schedules import V_SCHEDULES
    from par3d.predict import (
        choice,
        model_spec,
        peak_inflight,
        runtime_memory_flags,
        schedule_name,
        walked_v,
    )

    cfg = RunConfig.from_dict(cfg.to_dict()).resolve()  # never mutate the caller's config
    model, c = model_spec(cfg), choice(cfg)
    dtype = "fp32" if cfg.train.dtype == "fp32" else "bf16"
    shapes = stage_layout.rank_shapes(model, c.tp, c.pp, c.virtual_stages, c.schedule)
    peaks = peak_inflight(cfg)  # a --schedule-csv file's own
    # ZB-H1's ranks: chunks past BI hold their weight GEMMs' inputs, not the forward's (stage_layout.split_states);
    # a --schedule-csv file no builder makes is counted by its own peaks, whole chunks
    try:
        name: str | None = schedule_name(cfg)
    except ValueError:
        name = None
    split = stage_layout.split_states(name, c.pp, c.microbatches, c.virtual_stages) if name else None
    flags = runtime_memory_flags(cfg)
    # a V schedule's ranks walked in bytes through the actions the run will take (predict.walked_v)
    walked = walked_v(cfg, model, c.micro_batch, c.sequence_parallel, flags) if c.schedule in V_SCHEDULES else None
    per_rank, parts = [], []
    for r, shape in enumerate(shapes):
        mb = rank_memory(model, shape, peaks[r], tp=c.tp, dp=c.dp, b=c.micro_batch, sp=c.sequence_parallel,
                         recompute=c.recompute, zero=c.zero_stage, dtype=dtype, v=c.virtual_stages,
                         split=split[r] if split is not None else None,
                         walked=walked[r] if walked is not None else None, **flags)
        if device == "cpu":  # a process, not a CUDA context (module doc)
            other = CPU_RANK_BYTES + FRAGMENTATION * mb.activations
            parts.append({**mb.gib(), "other": round(other / GiB, 3),
                          "total": round((mb.states + mb.activations + other) / GiB, 3)})
            per_rank.append(mb.states + mb.activations + other)
        else:
            parts.append(mb.gib())
            per_rank.append(mb.total)
    heaviest = max(range(len(per_rank)), key=per_rank.__getitem__)
    where = "this host's RAM" if device == "cpu" else "one GPU's memory"
    return Estimate(per_rank, heaviest, parts[heaviest], ranks_sharing, per_rank[heaviest] * ranks_sharing,
                    float(capacity), where)


def host_memory() -> tuple[float, float]:
    """(MemTotal, MemAvailable) of this host in bytes, from /proc/meminfo; (0, 0) elsewhere."""
    info: dict[str, float] = {}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                info[key] = float(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0
    return info.get("MemTotal", 0.0), info.get("MemAvailable", info.get("MemFree", 0.0))


def judge(est: Estimate, cfg: RunConfig) -> tuple[str | None, str | None]:
    """(refusal, warning): a problem line when the run cannot fit, a note over 80 %."""
    gib = 2**30
    b = est.breakdown
    what = (f"the planner's memory model estimates {est.per_rank[est.heaviest] / gib:.2f} GiB for "
            f"pipeline rank {est.heaviest} (weights {b['weights']:.2f} + grads {b['grads']:.2f} + optimizer "
            f"{b['optimizer']:.2f} + activations {b['activations']:.2f} + other {b['other']:.2f} GiB)")
    share = (f"{est.ranks_sharing} ranks x that = {est.total / gib:.2f} GiB of {est.where}"
             if est.ranks_sharing > 1 else f"{est.total / gib:.2f} GiB of {est.where}")
    fix = ("use a smaller --seq-len, --micro-batch or model, --recompute selective/full, more "
           "--microbatches with --schedule 1f1b, or spread the layout over more hosts")
    m = cfg.model
    if est.total > est.capacity:
        return (f"model.seq_len={m.seq_len}, hidden={m.hidden}, layers={m.layers}, micro_batch="
                f"{cfg.train.micro_batch}: {what}; {share}, which has {est.capacity / gib:.2f} GiB "
                f"available: the run cannot fit; {fix}"), None
    if est.fraction > WARN_FRACTION:
        return None, (f"memory: {what}; {share} is {100 * est.fraction:.0f} % of the "
                      f"{est.capacity / gib:.2f} GiB available; the run may swap or be killed; {fix}")
    return None, None


def ranks_on_this_host(cfg: RunConfig) -> int:
    """Ranks that share this host's RAM: torchrun's local world, else every rank (a local spawn)."""
    local = os.environ.get("LOCAL_WORLD_SIZE") if "RANK" in os.environ else None
    return int(local) if local else cfg.parallel.world_size
