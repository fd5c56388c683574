"""The public validation set (validation.toml): published training runs predicted at their layout.

`rows()` reads the file; `predict(row)` runs the planner's search with the row's fixed choices on the
row's cluster (the catalogue GPU, plus the row's NICs where its network is not a DGX's) and returns the
planner's number in the row's metric; `undescribed` / `named` give a row without its software facts or with only
its framework named.  Around this module: calibration.py (which rows set a fitted constant, and the fits),
validation_runs.py (rows grouped into runs: layout pairs and picks, repeats, scale pairs), evidence.py
(evidence.json, what `par3d plan` quotes), validation_report.py (the tables and summaries docs/planner.md quotes) and
validation_cli.py (`python -m par3d.plan.validation`, which prints the table that docs/planner.md quotes; `--json`:
the same figures as JSON; `--rows PREFIX`: one source's rows; `--scaling`: the scale pairs; `--help`: every flag).
"""

from __future__ import annotations

import os
import sys
import tomllib
from dataclasses import dataclass, replace
from typing import Any

from .compute import CROSS_ENTROPY, attention_core_flops_per_sequence, model_flops_per_sequence
from .cost import Choice, Options, Plan, evaluate
from .frameworks import get_framework
from .hardware import (
    EP_DISPATCHES,
    MOE_DISPATCHERS,
    P2P_BLOCKING,
    Cluster,
    fp8_scaling_error,
    make_cluster,
    moe_host_of,
)
from .models import CATALOGUE, ModelSpec, split_error
from .search import Fixed, Limits, search

PATH = os.path.join(os.path.dirname(__file__), "validation.toml")
DEFAULT_BOUND = 0.10


@dataclass
class Prediction:
    row: dict[str, Any]
    plan: Plan
    value: float  # TFLOP/s per GPU in the row's metric
    fits: bool
    in_headroom: bool = True  # fits with the planner's default headroom, not only in the GPU's capacity

    @property
    def error(self) -> float:
        return self.value / float(self.row["published"]) - 1.0

    @property
    def bound(self) -> float:
        return float(self.row.get("bound", DEFAULT_BOUND))


def rows(path: str = PATH) -> list[dict[str, Any]]:
    with open(path, "rb") as fh:
        return list(tomllib.load(fh)["row"])


# Rows run by Megatron-LM, Megatron-Core, NeMo or Megatron-Bridge (by their names' first word: the sources say so --
# MLPerf's GPT-3 and Llama 3.1 reference code is NeMo; MegaScale is built on Megatron-LM and compared with it; Apertus
# and OpenEuroLLM train with Megatron-LM; the Zero Bubble paper's runs are its authors' Megatron-LM fork, whose
# --allow-padding-num-layers gives the first and the last chunk one layer fewer, as Megatron-Core's split does when
# layers + 2 divide).  Without a pipeline_layout their pipeline chunks are Megatron-Core's default split
# (stage_layout.megatron_split), not the planner's balanced one (issue 12's thirty-third round).
MEGATRON_FAMILY = ("narayanan2021", "korthikanti2022", "megatron", "nemo", "dgxc", "mbridge", "mlperf", "nemotron4",
                   "megascale", "apertus", "oellm", "zb", "fp8lm", "moefold", "mcoremoe", "vocabpar25")


def megatron_row(row: dict[str, Any]) -> bool:
    """Whether a row ran on Megatron-LM, Megatron-Core, NeMo or Megatron-Bridge (`MEGATRON_FAMILY`, by its name) and
    is priced so (not a row `undescribed` left without its software); a row priced by its framework's name alone
    (`named`): whether that framework splits its pipeline as Megatron-Core does."""
    if FRAMEWORK in row:
        return get_framework(str(row[FRAMEWORK])).megatron_split
    return str(row["name"]).split("-")[0] in MEGATRON_FAMILY and bool(row.get(DESCRIBED, True))


# ---- the same runs without their software (issue 12's forty-fourth round) -----------------------------------
#
# A row states the facts of its software that the model prices (`cluster_of`): the attention kernel, how gradients
# and parameters are reduced and gathered, whether pipeline sends block, the loss kernel, TP/EP overlap, CUDA graphs.
# A user who gives `par3d plan` only the model, the GPUs, the cluster, the precision, the batch and the layout gets
# par3d's defaults for all of them (its own runtime's: posted sends, gradients reduced behind the backward, ...).
# `undescribed` is a row as that user would give it; the figures of the set priced so are what describing the
# software buys (docs/planner.md section 9; `python -m par3d.plan.validation --software`, field by field).  The precision (dtype,
# the FP8 recipe, FP8 attention), the data-parallel runtime (`fsdp`, as a user names ZeRO's stage), the optimizer and
# its state dtype, offloading and the layout (including the schedules a row searches and its pipeline cut) stay:
# they are what a user plans, not what a framework does for them.
SOFTWARE_FIELDS: tuple[str, ...] = (
    "flash_attention", "attention_kernel", "cross_entropy", "grad_reduce_fp32", "overlap_grad_reduce",
    "overlap_param_gather", "p2p_blocking", "tp_comm_overlap", "tp_overlap_pipeline", "ep_comm_overlap", "cuda_graphs",
    "fp8_param_gather", "dp_bucket_params", "zero3_unit", "cp_comm", "ep_dispatch", "ep_dispatch_fp8",
    "moe_dispatcher", "fsdp_version", "bf16_optimizer", "zero1_all_reduce", "grad_reduce_cast", "p2p_partitioned")
DESCRIBED = "software_described"  # the key `undescribed` sets False: Megatron's split and MoE host floor not applied


def undescribed(row: dict[str, Any]) -> dict[str, Any]:
    """The row without its software facts (`SOFTWARE_FIELDS`): par3d's defaults in their place, the planner's balanced
    pipeline split instead of Megatron-Core's, no MoE host floor -- what `par3d plan` prices from the model, cluster,
    precision, batch and layout alone."""
    return {**{k: v for k, v in row.items() if k not in SOFTWARE_FIELDS}, DESCRIBED: False}


# ---- the same runs with only their framework named (issue 12's fifty-third round) ---------------------------
#
# `par3d plan --framework NAME` sets the software facts of a named framework (frameworks.py) where no flag does.
# `named` is a row as a user who names its framework, and nothing else of its software, would give it: the row
# `undescribed`, then its framework's facts.  Which framework ran a row is read from its source, by the row's name
# (the first word, or the first two where one source ran two): written before the figure was first scored.  Rows of
# software no preset describes (Aleph Alpha's scaling, InternLM, PaddlePaddle, nanotron, ...) stay at par3d's defaults.
FRAMEWORK = "framework"  # the key `named` sets: frameworks.FRAMEWORKS's name
FRAMEWORK_OF_SOURCE: dict[str, str] = {
    **dict.fromkeys(("narayanan2021", "korthikanti2022", "megascale", "nemo-22.08"), "megatron-lm-2021"),
    **dict.fromkeys(("megatron", "zb", "vocabpar25", "flagperf", "moefold", "mcoremoe", "oellm", "apertus", "fp8lm"),
                    "megatron-lm"),
    **dict.fromkeys(("nemo", "dgxc", "mbridge", "mlperf", "nemotron4"), "nemo"),
    **dict.fromkeys(("bloom", "mtnlg", "glm", "gpt", "mds4sci"), "deepspeed"),
    **dict.fromkeys(("torchtitan", "olmo"), "torchtitan"),
    **dict.fromkeys(("llmfoundry", "llmfoundry23"), "llm-foundry"),
    **dict.fromkeys(("maxtext", "jaxtoolbox"), "maxtext"),
}
# MLPerf's two AMD submissions ran AMD's own Megatron-LM fork, not NeMo: no preset describes it; Table 2's PTD-P
# rows are Megatron-LM's, its ZeRO-3 rows DeepSpeed's
_NO_FRAMEWORK_ROWS = ("mlperf-5.1-llama3.1-8B-amd-",)
_FRAMEWORK_OF_ROW = {"narayanan2021-t2-ptd": "megatron-lm-2021", "narayanan2021-t2-zero3": "deepspeed"}


def framework_of(row: dict[str, Any]) -> str | None:
    """The preset (frameworks.FRAMEWORKS) of the software that ran a row, by its source; None for software no preset
    describes."""
    name = str(row["name"])
    if name.startswith(_NO_FRAMEWORK_ROWS):
        return None
    for prefix, fw in _FRAMEWORK_OF_ROW.items():
        if name.startswith(prefix):
            return fw
    words = name.split("-")
    return FRAMEWORK_OF_SOURCE.get("-".join(words[:2])) or FRAMEWORK_OF_SOURCE.get(words[0])


def named(row: dict[str, Any]) -> dict[str, Any]:
    """The row priced from its model, cluster, precision, batch and layout and its framework's name alone: `undescribed`,
    then the framework's facts (frameworks.Framework.resolve) as row fields; a row of no preset's framework as
    `undescribed`.  DeepSpeed's partitioned boundaries are left out where the row runs sequence parallelism, as
    `par3d plan --framework deepspeed --sequence-parallel` leaves them out; a row that leaves its schedule to the
    search searches the framework's schedules, as `par3d plan` does."""
    plain = undescribed(row)
    name = framework_of(row)
    if name is None:
        return plain
    fw = get_framework(name)
    fixed = dict(row.get("fixed", {}))
    facts = fw.resolve(str(row.get("dtype", "bf16")), sequence_parallel=bool(fixed.get("sequence_parallel")),
                       fsdp=bool(row.get("fsdp")))
    if fw.schedules is not None and "schedules" not in row and "schedule" not in fixed:  # the schedules it has
        facts["schedules"] = list(fw.schedules)
    if not fw.sequence_parallel and "sequence_parallel" not in fixed:  # a framework without it
        facts["fixed"] = {**fixed, "sequence_parallel": False}
    return {**plain, **facts, FRAMEWORK: name}


def predict_named(row: dict[str, Any]) -> Prediction | None:
    """`predict` of the `named` row; None where its published layout finds no plan so."""
    return predict_or_none(named(row))


def predict_or_none(row: dict[str, Any]) -> Prediction | None:
    """`predict`, or None where the row's published layout finds no plan (`predict_on`'s ValueError)."""
    try:
        return predict(row)
    except ValueError:
        return None


def predict_undescribed(row: dict[str, Any]) -> Prediction | None:
    """`predict` of the `undescribed` row; None where its published layout finds no plan without the row's software
    (e.g. a loss that needs more memory unfused)."""
    return predict_or_none(undescribed(row))


def model_of(row: dict[str, Any]) -> ModelSpec:
    m = row["model"]
    spec = CATALOGUE[m] if isinstance(m, str) else ModelSpec(row["name"], **m)
    if megatron_row(row):
        spec = replace(spec, partition="megatron")
    if "seq_len" in row:
        spec = replace(spec, seq_len=int(row["seq_len"]))
    if "pipeline_layout" in row:  # the layers of each chunk as the run cut them (models.ModelSpec.pipeline_split)
        split = tuple(int(n) for n in row["pipeline_layout"])
        why = split_error(spec.layers, split)
        if why:
            raise ValueError(f"{row['name']}: pipeline_layout: {why}")
        spec = replace(spec, pipeline_split=split)
    return spec


def cluster_of(row: dict[str, Any]) -> Cluster:
    ce = str(row.get("cross_entropy", "unfused"))
    if ce not in CROSS_ENTROPY:
        raise ValueError(f"{row['name']}: cross_entropy {ce!r}: choose one of {', '.join(CROSS_ENTROPY)}")
    if str(row.get("ep_dispatch", "alltoall")) not in EP_DISPATCHES:
        raise ValueError(f"{row['name']}: ep_dispatch {row['ep_dispatch']!r}: choose one of {', '.join(EP_DISPATCHES)}")
    if str(row.get("moe_dispatcher", "alltoall")) not in MOE_DISPATCHERS:
        raise ValueError(f"{row['name']}: moe_dispatcher {row['moe_dispatcher']!r}: choose one of "
                         f"{', '.join(MOE_DISPATCHERS)}")
    if row.get("zero1_all_reduce") and dict(row.get("fixed", {})).get("zero_stage") != 1:
        raise ValueError(f"{row['name']}: zero1_all_reduce needs fixed zero_stage 1 (it says how ZeRO-1 reduces)")
    if row.get("p2p_partitioned") and dict(row.get("fixed", {})).get("sequence_parallel"):
        raise ValueError(f"{row['name']}: p2p_partitioned with sequence_parallel: DeepSpeed's pipeline engine partitions "
                         "whole boundary tensors; a sequence-parallel one is not modelled so")
    if row.get("grad_reduce_cast") and row.get("grad_reduce_fp32"):
        raise ValueError(f"{row['name']}: grad_reduce_cast with grad_reduce_fp32: the gradients are held either in "
                         "the training dtype (cast) or in fp32; keep one")
    if str(row.get("p2p_blocking", "none")) not in P2P_BLOCKING:
        raise ValueError(f"{row['name']}: p2p_blocking {row['p2p_blocking']!r}: choose one of {', '.join(P2P_BLOCKING)}")
    # a row's dtype "nvfp4" is FP8 training with NVFP4's recipe (`--dtype nvfp4`: hardware.FP8_SCALINGS)
    nvfp4 = row.get("dtype") == "nvfp4"
    if nvfp4 and row.get("fp8_scaling", "nvfp4") != "nvfp4":
        raise ValueError(f"{row['name']}: dtype nvfp4 with fp8_scaling {row['fp8_scaling']!r}: NVFP4 is its own recipe")
    dtype, scaling = ("fp8", "nvfp4") if nvfp4 else (str(row.get("dtype", "bf16")), str(row.get("fp8_scaling", "delayed")))
    bad_fp8 = fp8_scaling_error(str(row["gpu"]), dtype, scaling)
    if bad_fp8:
        raise ValueError(f"{row['name']}: {bad_fp8}")
    try:  # Megatron-Core's dropless MoE layers wait for their host unless whole iterations are graphs
        host = moe_host_of(str(row.get("cuda_graphs", "none")) if host_floored(row) else "full_iteration")
    except ValueError as e:
        raise ValueError(f"{row['name']}: {e}") from None
    cl = make_cluster(row["gpu"], int(row["gpus"]), row.get("gpus_per_node"), row.get("intra_bw_gbps"),
                      dtype=dtype,
                      nics_per_node=row.get("nics_per_node"),
                      nic_bw_gbps=row.get("nic_bw_gbps"), flash_attention=bool(row.get("flash_attention", True)),
                      attention_kernel=row.get("attention_kernel"), cp_comm=str(row.get("cp_comm", "ring")),
                      fp8_attention=bool(row.get("fp8_attention", False)))
    return replace(cl, overlap_grad_reduce=bool(row.get("overlap_grad_reduce", True)),
                   overlap_param_gather=bool(row.get("overlap_param_gather", True)),
                   grad_reduce_fp32=bool(row.get("grad_reduce_fp32", False)),
                   bf16_optimizer=bool(row.get("bf16_optimizer", False)),
                   zero1_all_reduce=bool(row.get("zero1_all_reduce", False)),
                   grad_reduce_cast=bool(row.get("grad_reduce_cast", False)),
                   zero3_unit=str(row.get("zero3_unit", "layer")),
                   fsdp=bool(row.get("fsdp", False)),
                   # a row names FSDP2 where its software ran fully_shard; the older rows ran FlatParameter FSDP
                   fsdp_version=int(row.get("fsdp_version", 1)),
                   tp_comm_overlap=bool(row.get("tp_comm_overlap", False)),
                   p2p_blocking=str(row.get("p2p_blocking", "none")),
                   p2p_partitioned=bool(row.get("p2p_partitioned", False)),
                   ep_comm_overlap=bool(row.get("ep_comm_overlap", False)),
                   moe_host_s=host,
                   ep_dispatch=str(row.get("ep_dispatch", "alltoall")),
                   ep_dispatch_fp8=bool(row.get("ep_dispatch_fp8", False)),
                   moe_dispatcher=str(row.get("moe_dispatcher", "")),
                   tp_overlap_pipeline=tuple((str(g), int(v[0]), int(v[1]))
                                             for g, v in sorted(row.get("tp_overlap_pipeline", {}).items())),
                   fp8_scaling=scaling,
                   fp8_param_gather=bool(row.get("fp8_param_gather", False)),
                   optimizer=str(row.get("optimizer", "adam")),
                   muon_tp_mode=str(row.get("muon_tp_mode", "blockwise")),
                   offload_layers=int(row.get("offload_layers", 0)),
                   dp_bucket_params=(None if row.get("dp_bucket_params") is None
                                     else float(row["dp_bucket_params"])),
                   cross_entropy=ce)


def options_of(row: dict[str, Any]) -> Options:
    """The row's memory facts: `optimizer_dtype` where the source's optimizer keeps Adam's state in
    bf16 (memory.py)."""
    return Options(optimizer_dtype=str(row.get("optimizer_dtype", "fp32")))


def predict(row: dict[str, Any]) -> Prediction:
    return predict_on(row, cluster_of(row))


def predict_on(row: dict[str, Any], cluster: Cluster) -> Prediction:
    model = model_of(row)
    # a row ran HSDP only where it says so, and expert tensor parallelism only where it gives a size (every recipe
    # that states none sets 1: Megatron-Bridge's and NeMo's)
    fixed = Fixed(**{"dp_replicate": 1, "etp": 1, **row["fixed"]})
    opts = options_of(row)
    # a row that leaves the schedule to the search names the ones its framework had (`schedules`); a TP group wider
    # than a node is the source's stated layout, priced across the nodes as `--allow-inter-node-tp` prices it
    limits = Limits(schedules=tuple(row["schedules"]) if "schedules" in row else None,
                    allow_inter_node_tp=(fixed.tp or 1) > cluster.gpus_per_node)
    res = search(model, cluster, int(row["global_batch"]), fixed, limits, top=1, opts=opts)
    in_headroom = bool(res.plans)
    if not res.plans:  # the published run ran: its memory is checked against the GPU's capacity alone
        res = search(model, cluster, int(row["global_batch"]), fixed, limits, top=1,
                     opts=replace(opts, memory_headroom=0.0))
    if res.plans:
        plan, fits = res.plans[0], True
    elif row.get("evaluate_unfit"):  # the published layout, every field given, even if memory.py says no
        f = row["fixed"]
        dp = int(row["gpus"]) // (f["tp"] * f.get("cp", 1) * f["pp"])
        m = int(row["global_batch"]) // (dp * f["micro_batch"])
        c = Choice(f["tp"], f["pp"], dp, f["micro_batch"], m, f.get("schedule", "1f1b"), f.get("virtual_stages", 1),
                   f["recompute"], f["zero_stage"], f["sequence_parallel"], f.get("cp", 1), f.get("dp_replicate", 1),
                   f.get("recompute_layers", 0), f.get("ep", 1), f.get("etp", 1))
        plan, fits = evaluate(model, cluster, c, opts=opts), False
    else:
        raise ValueError(f"{row['name']}: no plan fits ({dict(res.rejected)})")
    value = metric_value(plan, str(row["metric"]), int(row["gpus"]), model, str(row.get("flop_count", "full")))
    return Prediction(row, plan, value, fits, in_headroom and fits)


FLOP_COUNTS = ("full", "causal-half")


def metric_value(plan: Plan, metric: str, gpus: int, model: ModelSpec | None = None, flop_count: str = "full"
                 ) -> float:
    """The plan's number in a row's metric: "hardware" / "model" TFLOP/s per GPU, or "tokens" per
    second per GPU (what NVIDIA's NeMo / Megatron-Bridge tables give beside a model TFLOP/s whose
    FLOP count changed between releases).  A "model" row's `flop_count` says how its source counted: "full"
    (par3d's, Megatron's classic count: the whole s × s attention) or "causal-half" (Megatron-LM's
    num_floating_point_operations since 8873b55, 2025-03-06: the causal attention core halved) -- the plan's
    tokens are then counted that way (`compute.attention_core_flops_per_sequence`)."""
    if flop_count not in FLOP_COUNTS:
        raise ValueError(f"flop_count {flop_count!r}: choose one of {', '.join(FLOP_COUNTS)}")
    if metric == "hardware":
        return plan.hardware_tflops_per_gpu
    if metric == "model":
        if flop_count == "causal-half":
            if model is None:
                raise ValueError("flop_count 'causal-half' needs the row's model")
            full = model_flops_per_sequence(model)
            return plan.model_tflops_per_gpu * (full - 0.5 * attention_core_flops_per_sequence(model)) / full
        return plan.model_tflops_per_gpu
    if metric == "tokens":
        return plan.tokens_per_s / gpus
    raise ValueError(f"metric {metric!r}: choose hardware, model or tokens")


def layout_of(c: Choice) -> str:
    """A priced layout in one line, as the table's "layout" column shows it."""
    cp = f" × cp {c.cp}" if c.cp > 1 else ""
    rep = f" ({c.dp_replicate} replicas)" if c.dp_replicate > 1 else ""
    return f"tp {c.tp}{cp} × pp {c.pp} × dp {c.dp}{rep}, mb {c.micro_batch}, {c.schedule}" + (
        f" v={c.virtual_stages}" if c.virtual_stages > 1 else "") + f", rec {c.recompute}" + (
        f" ({c.recompute_layers} layers per chunk)" if c.recompute_layers else "") + f", zero {c.zero_stage}"


def host_floored(row: dict[str, Any]) -> bool:
    """Whether a row's MoE layers wait for their host (cp_ep_comm.moe_host_floor): Megatron-Core's dropless layers (a
    Megatron-family row) without whole-iteration CUDA graphs (its `cuda_graphs`, "none" unless stated)."""
    return megatron_row(row) and row.get("cuda_graphs", "none") != "full_iteration"  # not for an `undescribed` row


def main(argv: list[str] | None = None) -> int:
    """`python -m par3d.plan.validation` (validation_cli.main, imported here so that the command keeps its name)."""
    from .validation_cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
