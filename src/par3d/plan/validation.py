"""The public validation set (validation.toml): published training runs predicted at their layout.

`rows()` reads the file; `predict(row)` runs the planner's search with the row's fixed choices on the
row's cluster (the catalogue GPU, plus the row's NICs where its network is not a DGX's) and returns the
planner's number in the row's metric.  `python -m par3d.plan.validation` prints the table that
docs/planner.md quotes (`--json`: the same figures as JSON; `--rows PREFIX`: one source's rows; `--help`: every flag).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from statistics import median
from typing import Any

from .compute import CROSS_ENTROPY, attention_core_flops_per_sequence, model_flops_per_sequence
from .cost import Choice, Options, Plan, evaluate
from .frameworks import FRAMEWORKS, get_framework
from .gemm_table import family_of
from .hardware import (
    EP_DISPATCHES,
    MOE_DISPATCHERS,
    P2P_BLOCKING,
    Cluster,
    attn_sustain_of,
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
    return _predict_or_none(named(row))


def _predict_or_none(row: dict[str, Any]) -> Prediction | None:
    """`predict`, or None where the row's published layout finds no plan (`predict_on`'s ValueError)."""
    try:
        return predict(row)
    except ValueError:
        return None


def predict_undescribed(row: dict[str, Any]) -> Prediction | None:
    """`predict` of the `undescribed` row; None where its published layout finds no plan without the row's software
    (e.g. a loss that needs more memory unfused)."""
    return _predict_or_none(undescribed(row))


def software_figures(preds: list[Prediction], plain: list[Prediction | None],
                     named: list[Prediction | None] | None = None) -> dict[str, dict[str, float | int]]:
    """The set scored with each row's software described (`preds`), without it (`plain`, the same rows in order) and,
    given `named` (the rows `named`, in order), with only its framework's name: rows, rows priced, within ±10 % (a row
    without a plan is not within) and the median |error| of the priced rows."""
    def stats(ps: list[Prediction | None]) -> dict[str, float | int]:
        errs = [abs(p.error) for p in ps if p is not None]
        return {"rows": len(ps), "priced": len(errs), "within_10pct": sum(e <= DEFAULT_BOUND for e in errs),
                "median_abs_error_pct": round(100 * median(errs), 1)}
    out = {SOFTWARE_KEYS[0]: stats(list(preds)), SOFTWARE_KEYS[1]: stats(plain)}
    if named is not None:
        out[SOFTWARE_KEYS[2]] = stats(named)
    return out


# evidence.json's entries of `software_figures`: as described, at par3d's defaults, with the framework named
SOFTWARE_KEYS = ("software/described", "software/defaults", "software/framework")


def software_by_field(preds: list[Prediction]) -> list[dict[str, Any]]:
    """What each software fact buys, one at a time: for each of `SOFTWARE_FIELDS` (and "megatron", the Megatron-Core
    pipeline split and MoE host floor that `megatron_row` rows take), the rows that state it re-priced without it
    (par3d's default in its place), the rest as described; the whole set's within ±10 % and median |error| then
    (a re-priced row without a plan counts as not within and is left out of the median)."""
    base = {str(p.row["name"]): p for p in preds}
    out: list[dict[str, Any]] = []
    for field in (*SOFTWARE_FIELDS, "megatron"):
        moved: dict[str, Prediction | None] = {}
        for name, p in base.items():
            row = p.row
            if field == "megatron" and megatron_row(row):
                stripped = {**row, DESCRIBED: False}
            elif field in row and field != "megatron":
                stripped = {k: v for k, v in row.items() if k != field}
            else:
                continue
            moved[name] = _predict_or_none(stripped)
        if not moved:
            continue
        errs = [abs(q.error) for n, q in ((n, moved.get(n, base[n])) for n in base) if q is not None]
        out.append({"field": field, "rows": len(moved), "no_plan": sum(q is None for q in moved.values()),
                    "within_10pct": sum(e <= DEFAULT_BOUND for e in errs),
                    "median_abs_error_pct": round(100 * median(errs), 1)})
    return out


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


def table(preds: list[Prediction]) -> str:
    out = ["| run | layout | published | predicted | error | assumed where the source is silent |",
           "|---|---|---:|---:|---:|---|"]
    for p in preds:
        lay = layout_of(p.plan.choice)
        miss = "" if abs(p.error) <= DEFAULT_BOUND else " (miss)"
        mem = "" if p.in_headroom else (" (in memory, not in the 5 % headroom)" if p.fits else " (over memory)")
        out.append(f"| {p.row['name']} | {lay}{mem} | {p.row['published']:g} | "
                   f"{p.value:.1f} | {p.error:+.1%}{miss} | {p.row.get('assumed', '')} |")
    return "\n".join(out)


# The rows that set a fitted constant are in sample; every other row is held out.
# - gemm_table.STEP_SHARE: the ten rows of Narayanan et al. 2021 Table 1 (A100), with the straggler spread
#   (gemm_table.STEP_SPREAD: cited, set by no row) in place;
# - gemm_table.FITTED_SUSTAINED (the H100's sustained/burst ratio per dtype, which no measurement gives):
#   the smallest-GPU-count column of each dgxc-benchmarking table, BF16 and FP8 (`sustained_rows`).
# - hardware.FSDP_UNIT_S (PyTorch FSDP's cost per wrapped layer per micro-batch): llm-foundry's 18 rows
#   (`fsdp_rows`).
IN_SAMPLE_PREFIX = "narayanan2021-t1-"
DGXC_PREFIX = "dgxc-24.11-"


def sustained_rows(all_rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The calibration rows of the H100's fitted sustained ratios: of each dgxc-benchmarking table (one
    model in one precision, weak-scaling over GPU counts) the column with the fewest GPUs -- the runs least
    touched by what a larger cluster adds (stragglers, contention), which the model does not price.  The
    rule was fixed before the fit was first run (issue 12's eighth round) and not changed after."""
    first: dict[str, dict[str, Any]] = {}
    for r in rows() if all_rows is None else all_rows:
        name = str(r["name"])
        if name.startswith(DGXC_PREFIX):
            table_key = name.rsplit("-", 1)[0]
            if table_key not in first or int(r["gpus"]) < int(first[table_key]["gpus"]):
                first[table_key] = r
    return list(first.values())


# OpenEuroLLM's GH200 strong-scaling table on JUPITER (issue 12's twenty-second round): its runs at 32, 64 and 128
# GPUs, BF16 and FP8 -- 256 or more micro-batches per step, so neither the bubble nor the DP collectives nor many
# GPUs' stragglers weigh -- set the GH200's sustained ratios (gemm_table.FITTED_SUSTAINED), three rows per dtype.
GH200_CAL_PREFIX = "oellm-32B-"
GH200_CAL_GPUS = (32, 64, 128)


def gh200_sustained_rows(all_rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The calibration rows of the GH200's fitted sustained ratios: OpenEuroLLM's 32B strong-scaling runs on
    32-128 GH200 of JUPITER, BF16 and FP8 (the rule fixed before the fit was first run; the production row and the
    larger runs held out, as every Apertus row)."""
    return [r for r in (rows() if all_rows is None else all_rows)
            if str(r["name"]).startswith(GH200_CAL_PREFIX) and "prod" not in str(r["name"])
            and int(r["gpus"]) in GH200_CAL_GPUS]


# Megatron-Bridge's first GB300 table (issue 12's twenty-third round): its three 25.11 rows (8B, 70B, 405B; FP8
# tensor-scaled) set the GB300's one sustained ratio (gemm_table.FITTED_SUSTAINED, both dtypes: SHARED_SUSTAINED);
# every later release's GB300 row, the MXFP8 ones and MLPerf's are held out.  The rule was fixed before the fit was
# first run.
GB300_CAL_PREFIX = "mbridge-25.11-"


def gb300_sustained_rows(all_rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The calibration rows of the GB300's fitted sustained ratio: Megatron-Bridge's 25.11 GB300 rows."""
    return [r for r in (rows() if all_rows is None else all_rows)
            if str(r["name"]).startswith(GB300_CAL_PREFIX) and r["gpu"] == "gb300"]


def _calibration_sets(every: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sustained_rows(every) + gh200_sustained_rows(every) + gb300_sustained_rows(every)


def calibration_rows_of(family: str) -> list[dict[str, Any]]:
    """The rows that set `family`'s fitted sustained ratios: dgxc-benchmarking's (H100), OpenEuroLLM's (GH200),
    Megatron-Bridge 25.11's (GB300)."""
    return [r for r in _calibration_sets(rows()) if family_of(str(r["gpu"])) == family]


@cache
def _sustained_names() -> frozenset[str]:
    return frozenset(str(r["name"]) for r in _calibration_sets(rows()))


# Megatron-Bridge's 26.04 MoE rows (issue 12's thirty-fourth round) set the MoE host floor (hardware.MOE_HOST_S):
# Qwen3-30B-A3B, Qwen3-235B-A22B, DeepSeek-V3 and Kimi K2 on H100, B200, B300, GB200 and GB300, 4 to 32 routed
# experts a rank; every other MoE row (26.04.01 and the other releases, dgxc-benchmarking's, NeMo's, Megatron-LM's
# discussion) is held out.  The rule was fixed before the fit was first run.
MOE_HOST_CAL_PREFIX = "mbridge-moe-26.04-"


def host_floored(row: dict[str, Any]) -> bool:
    """Whether a row's MoE layers wait for their host (cp_ep_comm.moe_host_floor): Megatron-Core's dropless layers (a
    Megatron-family row) without whole-iteration CUDA graphs (its `cuda_graphs`, "none" unless stated)."""
    return megatron_row(row) and row.get("cuda_graphs", "none") != "full_iteration"  # not for an `undescribed` row


def moe_host_rows(all_rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The calibration rows of the MoE host floor (hardware.MOE_HOST_S): Megatron-Bridge's 26.04 MoE rows."""
    return [r for r in (rows() if all_rows is None else all_rows) if str(r["name"]).startswith(MOE_HOST_CAL_PREFIX)]


def moe_host_error(host_s: tuple[float, float], cal: list[dict[str, Any]] | None = None) -> float:
    """Mean |error| of the MoE host floor's calibration rows with the floor at `host_s` (fixed, per routed expert)."""
    cal = moe_host_rows() if cal is None else cal
    return sum(abs(predict_on(r, replace(cluster_of(r), moe_host_s=host_s)).error) for r in cal) / len(cal)


def fit_moe_host(cal: list[dict[str, Any]] | None = None) -> tuple[float, float]:
    """The MoE host floor (hardware.MOE_HOST_S: seconds per MoE layer forward + backward, fixed and per routed expert
    on a rank) that minimises the mean |error| of Megatron-Bridge's 26.04 MoE rows (`moe_host_rows`; `cal` instead
    where given): a grid of 0-20 ms x 0-1.5 ms, then halving steps around the best.  A floor only slows a run, so the
    fit cannot trade a slow row for a fast one; the GEMM constants (fitted first, on other rows) are held fixed."""
    cal = [r for r in (moe_host_rows() if cal is None else cal) if host_floored(r)]
    best = min(((a * 1e-3, b * 1e-4) for a in range(0, 21, 2) for b in range(0, 16, 2)),
               key=lambda h: moe_host_error(h, cal))
    da, db = 1e-3, 1e-4
    while da > 1e-5:
        around = [(max(0.0, best[0] + i * da), max(0.0, best[1] + j * db)) for i in (-1, 0, 1) for j in (-1, 0, 1)]
        nxt = min(around, key=lambda h: moe_host_error(h, cal))
        if nxt == best:
            da, db = da / 2, db / 2
        best = nxt
    return best


def moe_host_by_release() -> list[tuple[str, int, tuple[float, float], int, int, int]]:
    """How much the MoE host floor depends on the release it is fitted to: for each Megatron-Bridge release with
    floored MoE rows, the pair fitted on that release's rows alone, and of the MoE rows of every other source and
    release, how many are within ±10 % without a floor and with that pair (release, rows fitted, pair, other rows,
    within without, within with)."""
    every = rows()
    moe = [r for r in every if model_of(r).moe]

    def release(r: dict[str, Any]) -> str | None:
        name = str(r["name"])
        return name.split("-")[2] if name.startswith("mbridge-moe-") else None

    def within(host: tuple[float, float], others: list[dict[str, Any]]) -> int:
        return sum(abs(predict_on(r, replace(cluster_of(r), moe_host_s=host if host_floored(r) else (0.0, 0.0)))
                       .error) <= DEFAULT_BOUND for r in others)

    out = []
    for rel in sorted({release(r) for r in moe if host_floored(r)} - {None}):  # type: ignore[type-var]
        pair = fit_moe_host([r for r in moe if release(r) == rel])
        others = [r for r in moe if release(r) != rel]
        out.append((str(rel), sum(1 for r in moe if release(r) == rel and host_floored(r)), pair, len(others),
                    within((0.0, 0.0), others), within(pair, others)))
    return out


def in_sample(row: dict[str, Any]) -> bool:
    name = str(row["name"])
    return (name.startswith((IN_SAMPLE_PREFIX, LLMFOUNDRY_PREFIX, MBRIDGE_NVFP4_PREFIX, MOE_HOST_CAL_PREFIX))
            or name in _sustained_names())


def _bisect(mean_error: Callable[[float], float], lo: float, hi: float, tol: float) -> float:
    """The x in [lo, hi] where `mean_error` (rising with x) crosses zero."""
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if mean_error(mid) > 0:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


def mean_error_at(cal: list[dict[str, Any]], gemm_share: Callable[[str, str], float],
                   attn_sustain: Callable[[str], float] | None = None) -> float:
    """Mean signed error of the calibration rows `cal` with each row's GEMM share of its dtype replaced
    by `gemm_share(gpu family, dtype)` (what a fit varies), and its attention kernel's in-step discount
    (`Device.attn_sustain`, derived from the same constants: hardware.attn_sustain_of) by
    `attn_sustain(gpu family)` where given."""
    errs = []
    for r in cal:
        cl = cluster_of(r)
        family = family_of(str(r["gpu"]))
        dev = replace(cl.device, gemm={**cl.device.gemm, cl.dtype: gemm_share(family, cl.dtype)})
        if attn_sustain is not None:
            dev = replace(dev, attn_sustain=attn_sustain(family))
        errs.append(predict_on(r, replace(cl, device=dev)).error)
    return sum(errs) / len(errs)


def step_share_rows() -> list[dict[str, Any]]:
    """The calibration rows of the step share (gemm_table.STEP_SHARE): the ten rows of Narayanan et al. 2021 Table 1."""
    return [r for r in rows() if str(r["name"]).startswith(IN_SAMPLE_PREFIX)]


def step_share_pricing(share: float) -> tuple[Callable[[str, str], float], Callable[[str], float]]:
    """What `mean_error_at` varies when the step share is `share`: every GPU's GEMM share of each dtype and its
    attention kernel's in-step discount, both derived from it."""
    from . import gemm_table

    def gemm_share(family: str, dtype: str) -> float:
        return gemm_table.achievable_fraction(family, dtype, step_share=share)  # type: ignore[return-value]
    return gemm_share, lambda f: attn_sustain_of(f, step_share=share)


def fit_step_share(lo: float = 0.8, hi: float = 1.1, tol: float = 1e-6,
                   cal: list[dict[str, Any]] | None = None) -> float:
    """The step share (gemm_table.STEP_SHARE) that makes the ten rows of Narayanan et al. 2021 Table 1
    (A100: its sustained ratio is a measured clock, nothing else of it is fitted) average zero error, by
    bisection, with the straggler spread (gemm_table.STEP_SPREAD, a cited constant) in place.  `cal`: other
    calibration rows in their place (the leave-one-out check, plan/leave_one_out.py)."""
    from . import compute

    cal = step_share_rows() if cal is None else cal
    out = _bisect(lambda share: mean_error_at(cal, *step_share_pricing(share)), lo, hi, tol)
    compute.layer_times.cache_clear()
    return out


def sustained_pricing(family: str, dtype: str, ratio: float
                      ) -> tuple[Callable[[str, str], float], Callable[[str], float] | None]:
    """What `mean_error_at` varies when `family`'s `dtype` GEMMs run at the sustained/burst `ratio` (every dtype's
    where the family shares one ratio: gemm_table.SHARED_SUSTAINED), the step share held at its stored value."""
    from . import gemm_table

    shared = family in gemm_table.SHARED_SUSTAINED

    def share(_f: str, d: str) -> float:
        peak, mamf, _ = gemm_table.TABLE[family][d if shared else dtype]
        return mamf / peak * ratio * gemm_table.STEP_SHARE

    # attention runs in BF16: its in-step discount moves with the BF16 ratio being fitted (hardware.attn_sustain_of)
    # and stays at the stored one while another dtype's is fitted
    bf16 = shared or dtype in ("bf16", "fp16")
    return share, ((lambda f: attn_sustain_of(f, sustained=ratio)) if bf16 else None)


def sustained_cal_rows(family: str, dtype: str) -> list[dict[str, Any]]:
    """The calibration rows of `family`'s `dtype` sustained ratio (every dtype's rows where the family shares one)."""
    from . import gemm_table

    shared = family in gemm_table.SHARED_SUSTAINED
    return [r for r in calibration_rows_of(family) if shared or str(r.get("dtype", "bf16")) == dtype]


def fit_sustained(family: str, dtype: str, lo: float = 0.3, hi: float = 1.0, tol: float = 1e-6,
                  cal: list[dict[str, Any]] | None = None) -> float:
    """The sustained/burst ratio of `family`'s `dtype` GEMMs (gemm_table.FITTED_SUSTAINED) that makes the
    calibration rows of that GPU and dtype (`calibration_rows_of`: dgxc-benchmarking's for the H100, OpenEuroLLM's
    for the GH200) average zero error, by bisection -- the prediction falls as the ratio falls.  The step share
    (fitted first, on A100 rows) is held fixed.  `cal`: other calibration rows in their place (the leave-one-out
    check, plan/leave_one_out.py)."""
    from . import compute

    cal = sustained_cal_rows(family, dtype) if cal is None else cal
    if not cal:
        raise ValueError(f"no calibration rows for {family} {dtype}")
    out = _bisect(lambda ratio: mean_error_at(cal, *sustained_pricing(family, dtype, ratio)), lo, hi, tol)
    compute.layer_times.cache_clear()
    return out


def fsdp_rows(all_rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The calibration rows of hardware.FSDP_UNIT_S: llm-foundry's large-scale H100 table (PyTorch FSDP; the
    one source measuring one FSDP stack over many model sizes and GPU counts).  The other FSDP rows (llm-foundry's
    2023 tables, fms-fsdp, torchtitan, OPT-175B) are held out.  The rule was fixed before the fit was first run
    (fifteenth round)."""
    return [r for r in (rows() if all_rows is None else all_rows) if str(r["name"]).startswith(LLMFOUNDRY_PREFIX)]


def fsdp_mean_error(unit_s: float, cal: list[dict[str, Any]] | None = None) -> float:
    """Mean signed error of the FSDP calibration rows with each wrapped unit costing `unit_s`."""
    cal = fsdp_rows() if cal is None else cal
    return sum(predict_on(r, replace(cluster_of(r), fsdp_unit_s=unit_s)).error for r in cal) / len(cal)


def fit_fsdp_unit(lo: float = 0.0, hi: float = 0.03, tol: float = 5e-5,
                  cal: list[dict[str, Any]] | None = None) -> float:
    """The per-unit cost of PyTorch FSDP (hardware.FSDP_UNIT_S, seconds per layer per micro-batch) that makes
    the llm-foundry rows (`fsdp_rows`) average zero error, by bisection -- the prediction falls as it grows.
    The GEMM constants (step share, sustained ratios: fitted first, on other rows) are held fixed.  `cal`: other
    calibration rows in their place (the leave-one-out check, plan/leave_one_out.py)."""
    cal = fsdp_rows() if cal is None else cal
    return _bisect(lambda u: -fsdp_mean_error(u, cal), lo, hi, tol)


def _error_counts(preds: list[Prediction]) -> tuple[int, int, float, float]:
    """Rows, rows within ±10 %, and the median and largest |error| (fractions) of `preds`."""
    errs = sorted(abs(p.error) for p in preds)
    return len(errs), sum(e <= DEFAULT_BOUND for e in errs), errs[len(errs) // 2], errs[-1]


def _counts(preds: list[Prediction]) -> str:
    n, within, med, top = _error_counts(preds)
    return f"{n} rows, {within} within ±{DEFAULT_BOUND:.0%}; median |error| {med:.1%}, max {top:.1%}"


# held-out sources large enough to be reported on their own lines, so that they do not hide the others:
# NVIDIA's dgxc-benchmarking tables (70 rows, one weak-scaling table per model and precision), MLPerf
# Training v3.1's GPT-3 submissions (8 rows, one recipe at 512 ... 10,752 GPUs), dgxc-benchmarking v25.05's
# first GB200 tables (20 rows with its two H100 ones: one early Blackwell software generation), MLPerf Training
# v4.0's and v4.1's GPT-3 175B (4 rows: H100; 5 rows: B200 and H100), v5.0's Llama 3.1 405B (14 rows: H100, H200
# and GB200) and v5.1's FP8 Llama 3.1 8B and 405B (17 rows: H100, H200, B200, GB200); the PyTorch FSDP rows held
# out from FSDP_UNIT_S's fit: llm-foundry's older tables (70), fms-fsdp's (4) and torchtitan's (8 on A100, 2 on H200).  (llm-foundry's
# large-scale 18 rows are in sample.)  The sixteenth round's two NeMo sources: its long-sequence tables and its
# 25.02 / 25.04 performance summaries; the seventeenth round's Megatron-LM README tables (11 rows).
MLPERF_PREFIX = "mlperf-3.1-"
LLMFOUNDRY_PREFIX = "llmfoundry-mpt-"  # llm-foundry's large-scale H100 table: FSDP_UNIT_S's calibration rows
DGXC_2505_PREFIX = "dgxc-25.05-"  # v25.05's GB200 tables and its new H100 15B layout (issue 12's twelfth round)
MLPERF40_PREFIX = "mlperf-4.0-"  # MLPerf Training v4.0's GPT-3 175B submissions (issue 12's thirteenth round)
MLPERF41_PREFIX = "mlperf-4.1-"  # MLPerf Training v4.1's GPT-3 175B submissions (issue 12's twelfth round)
MLPERF5_PREFIX = "mlperf-5.0-"  # MLPerf Training v5.0's Llama 3.1 405B submissions (issue 12's twelfth round)
MLPERF51_PREFIX = "mlperf-5.1-"  # MLPerf Training v5.1's FP8 Llama 3.1 8B and 405B submissions (thirteenth round)
MLPERF51_NVFP4_PREFIX = "mlperf-5.1-nvfp4-"  # and its NVFP4 submissions (twenty-seventh round): held out
MLPERF60_PREFIX = "mlperf-6.0-"  # MLPerf Training v6.0's Llama 3.1 8B / 405B and DeepSeek-V3 (thirty-seventh round)
LLMFOUNDRY23_PREFIX = "llmfoundry23-"  # llm-foundry's older small-scale BF16 tables at 2K tokens (fifteenth round)
FMS_PREFIX = "fmsfsdp-"  # fms-fsdp's PyTorch FSDP rows (A100): held out from FSDP_UNIT_S's fit
AUTOMODEL_PREFIX = "automodel-"  # NeMo AutoModel (FSDP2 + EP; H100): its dense row (seventeenth round), MoE (28th)
TORCHTITAN_PREFIX = "torchtitan-"  # torchtitan's FSDP2 rows (A100, fifteenth round; H200, twentieth): held out likewise
LONGSEQ_PREFIX = "nemo-longseq-"  # NeMo's long-sequence CP tables (H100, B200; 4K-1M tokens; sixteenth round)
NEMO25_PREFIX = ("nemo-25.02-", "nemo-25.04-")  # NeMo 25.02's DGX-B200 and 25.04's DGX-GB200 summaries (sixteenth round)
MEGATRON08_PREFIX = "megatron-r0.8-"  # Megatron-LM's README scaling tables, Megatron-Core r0.8.0 on H100 (seventeenth)
NEMO2208_PREFIX = "nemo-22.08-"  # NeMo Megatron 22.08's GPT-3 5B / 175B scaling tables on A100 (eighteenth round)
# Megatron-Bridge's performance tables, 25.11 ... 26.06 (twelfth round: H100, B200, GB200; twenty-first: GB300;
# twenty-second: the MXFP8 405B rows)
MBRIDGE_PREFIX = "mbridge-"
MBRIDGE_MOE_PREFIX = "mbridge-moe-"  # its mixture-of-experts rows (Qwen3; twenty-third round): held out
# its NVFP4 rows (Llama 3 70B, 3.1 405B; twenty-seventh round): in sample -- the rule carrying NVFP4's measured GEMM
# speed from the B300 to the other Blackwell parts was chosen after they were priced (gemm_table.NVFP4_OVER_BF16)
MBRIDGE_NVFP4_PREFIX = "mbridge-nvfp4-"
# the twenty-second round's five papers: MegaScale's Megatron-LM baseline, GLM-130B, GPT-NeoX-20B, LLaMA 65B and
# TinyLlama (12 rows; `str.startswith` takes the tuple)
PAPERS22_PREFIX: tuple[str, ...] = ("megascale-", "glm-130B-", "gpt-neox-", "llama1-", "tinyllama-")
APERTUS_PREFIX = "apertus-"  # Apertus on CSCS Alps (GH200; twenty-second round): held out from the GH200 fit
OLMOCORE_PREFIX = "olmo-core-"  # OLMo-core's README throughput table (FSDP2, torch.compile, H100; fortieth round)
BLOOM_PREFIX = "bloom-prequel-"  # BLOOM's pre-training layout trials (Jean Zay A100, DeepSpeed pipeline; fortieth round)
JAXTOOLBOX_PREFIX = "jaxtoolbox-pax-"  # NVIDIA JAX-Toolbox's Paxml GPT tables (XLA, 256 A100 / H100; forty-first round)
MDS_LONGSEQ_PREFIX = "mds4sci-longseq-"  # Megatron-DeepSpeed's long-sequence table (TP 32 over 4 nodes; forty-first round)
MAXTEXT_PREFIX = "maxtext-a3-"  # MaxText's Llama 2 7B on 1-16 A3 VMs (XLA, H100, TCPX; forty-first round)
FLAGPERF_PREFIX = "flagperf-"  # FlagPerf's Megatron-LM Llama 3 cases (H100, one A800 node at 7 layouts; forty-first round)
INTERNLM_PREFIX = "internlm7b-"  # InternLM-7B on 8-1024 A100 (InternEvo's July-2023 tables; forty-first round)
PADDLE_PREFIX = ("llama7b-paddle-", "llama13b-paddle-")  # FlagPerf's PaddlePaddle LLaMA layout ablations (forty-first round)
ZB_PREFIX = "zb-"  # the Zero Bubble paper's pure-pipeline runs (A100, 1F1B / interleaved / ZB-1p / ZB-V; forty-second round)
OELLM_PREFIX = "oellm-"  # OpenEuroLLM on JUPITER (GH200): its 32-128-GPU rows set the GH200's ratios, the rest held out
FLASHATTN_PREFIX = ("fa2paper-", "fa1paper-")  # the FlashAttention papers' end-to-end runs (one A100 node; 44th round)
MEGATRON_LLAMA_PREFIX = "megatron-llama-"  # Megatron-LLaMA's LLaMA-13B scaling table (32-512 A100; forty-fourth round)
BLOOMBERG_PREFIX = "bloomberggpt-"  # BloombergGPT's SageMaker ZeRO-3 run (512 A100-40GB; forty-fourth round)
FP8LM_PREFIX = "fp8lm-"  # FP8-LM's Table 5: BF16 and Transformer Engine FP8 on 32-128 H100 (Megatron-LM; forty-fifth round)
MOEFOLD_PREFIX = "moefold-"  # the MoE Parallel Folding paper's tables (Megatron-Core MoE on 64-1024 H100; forty-fifth round)
AMD_PREFIX = "amd-"  # AMD Instinct MLPerf Llama 3.1 8B runs not in MLPerf's own blocks (forty-sixth round)
MCOREMOE_PREFIX = "mcoremoe-"  # the Megatron MoE model zoo's Qwen3-235B-A22B tables (H100, GB200, GB300; forty-sixth round)
HAGEMANN_PREFIX = "hagemann23-"  # Hagemann et al. 2023's layout sweep (Aleph Alpha's code, 32-256 A100; forty-sixth round)
VOCABPAR_PREFIX = "vocabpar25-"  # the Vocabulary Parallelism paper's plain-1F1B baselines (8 A100, PP 8; forty-sixth round)
LIGHTSEQ_PREFIX = "lightseq23-"  # DistFlashAttn's Megatron-LM and DeepSpeed-Ulysses baselines (1-2 A100 boxes; 46th round)
REPORTS46_PREFIX = ("smollm3-", "granite3-")  # SmolLM3 (nanotron) and Granite 3.0 runs on H100 (forty-sixth round)
DGXC_2502_PREFIX = ("dgxc-25.02-", "dgxc-25.04-")  # dgxc-benchmarking v25.02 and v25.04's H100 tables (46th round)
NEMO2507_PREFIX = "nemo-25.07-"  # NeMo 25.07's DGX-GB200 FP8 summary (forty-sixth round)
MOERECIPES_PREFIX = "megatron-moerecipes-"  # Megatron-LM's dev-branch MoE recipe table (forty-sixth round)
OWN_LINES: tuple[tuple[str | tuple[str, ...], str], ...] = (
             (DGXC_PREFIX, "dgxc-benchmarking v24.11.1"), (MLPERF_PREFIX, "MLPerf Training v3.1"),
             (DGXC_2505_PREFIX, "dgxc-benchmarking v25.05 (GB200, NeMo 25.04)"),
             (MLPERF40_PREFIX, "MLPerf Training v4.0 (GPT-3 175B)"), (MLPERF41_PREFIX, "MLPerf Training v4.1 (GPT-3 175B)"),
             (MLPERF5_PREFIX, "MLPerf Training v5.0 (Llama 3.1 405B)"),
             (MLPERF51_NVFP4_PREFIX, "MLPerf Training v5.1's NVFP4 runs (Llama 3.1 8B, 405B; B200, GB200, B300, GB300)"),
             (MLPERF51_PREFIX, "MLPerf Training v5.1 (Llama 3.1 8B, 405B; FP8)"),
             (MLPERF60_PREFIX, "MLPerf Training v6.0 (Llama 3.1 8B, 405B, DeepSeek-V3; read after the model was frozen)"),
             (LLMFOUNDRY23_PREFIX, "llm-foundry's 2023 tables (FSDP, 8-128 A100 / H100)"),
             (FMS_PREFIX, "fms-fsdp (FSDP, A100)"), (TORCHTITAN_PREFIX, "torchtitan (FSDP2; A100, H200)"),
             (AUTOMODEL_PREFIX, "NeMo AutoModel (FSDP2, EP; H100, BF16)"),
             (LONGSEQ_PREFIX, "NeMo's long-sequence tables (CP, 4K-1M tokens)"),
             (NEMO25_PREFIX, "NeMo 25.02 (B200) and 25.04 (GB200) summaries, dense and Mixtral"),
             (MEGATRON08_PREFIX, "Megatron-LM's README (Megatron-Core r0.8.0, H100, BF16)"),
             (NEMO2208_PREFIX, "NeMo Megatron 22.08 (GPT-3 5B / 175B, A100)"),
             (MBRIDGE_MOE_PREFIX, "Megatron-Bridge's MoE tables (Qwen3-30B-A3B / 235B-A22B, DeepSeek-V3, Kimi K2)"),
             (MBRIDGE_PREFIX, "Megatron-Bridge's tables (FP8, MXFP8; H100, B200, GB200, GB300)"),
             (PAPERS22_PREFIX, "five papers (MegaScale's Megatron-LM baseline, GLM-130B, GPT-NeoX-20B, LLaMA 65B, "
                               "TinyLlama)"),
             (APERTUS_PREFIX, "Apertus (GH200, CSCS Alps)"),
             (OELLM_PREFIX, "OpenEuroLLM's other GH200 runs (JUPITER)"),
             (OLMOCORE_PREFIX, "OLMo-core's README table (FSDP2, torch.compile, 8 H100 assumed)"),
             (BLOOM_PREFIX, "BLOOM's layout trials (Megatron-DeepSpeed, 8-384 A100, Jean Zay)"),
             (JAXTOOLBOX_PREFIX, "JAX-Toolbox's Paxml tables (XLA, FSDP 256, A100 / H100)"),
             (MDS_LONGSEQ_PREFIX, "Megatron-DeepSpeed's long-sequence table (TP 32 over 4 A100 nodes, 2K-256K tokens)"),
             (MAXTEXT_PREFIX, "MaxText's Llama 2 7B on A3 (XLA, 8-128 H100)"),
             (FLAGPERF_PREFIX, "FlagPerf's Megatron-LM Llama 3 (core_v0.6.0; 8-440 H100, one A800 node)"),
             (INTERNLM_PREFIX, "InternEvo's InternLM-7B tables (July 2023; 8-1024 A100, RoCE)"),
             (PADDLE_PREFIX, "FlagPerf's PaddlePaddle LLaMA 7B / 13B at four layouts (one A100 node, fp16)"),
             (ZB_PREFIX, "the Zero Bubble paper's pipeline schedules (Megatron-LM fork, PP 8-32 on A100, fp16)"),
             (FLASHATTN_PREFIX, "the FlashAttention papers' end-to-end GPT runs (one A100 node; FA2, and Megatron-LM "
                                "without FlashAttention)"),
             (MEGATRON_LLAMA_PREFIX, "Megatron-LLaMA's LLaMA-13B table (FlashAttention-1; 32-512 A100)"),
             (BLOOMBERG_PREFIX, "BloombergGPT (SageMaker ZeRO-3 / MiCS, 512 A100-40GB)"),
             (FP8LM_PREFIX, "FP8-LM's Table 5 (Megatron-LM BF16 and Transformer Engine FP8; 32-128 H100)"),
             (MOEFOLD_PREFIX, "MoE Parallel Folding's tables (Megatron-Core MoE; 64-1024 H100, BF16)"),
             (AMD_PREFIX, "AMD Instinct partners' and MiTAC's MLPerf Llama 3.1 8B runs (MI325X, MI350X, MI355X; FP8)"),
             (MCOREMOE_PREFIX, "the Megatron MoE model zoo's Qwen3-235B-A22B tables (H100, GB200, GB300)"),
             (HAGEMANN_PREFIX, "Hagemann et al.'s layout sweep (Aleph Alpha's code; LLaMA 13B-65B on 32-256 A100)"),
             (VOCABPAR_PREFIX, "the Vocabulary Parallelism paper's 1F1B baselines (Megatron-Core fork; 8 A100, PP 8)"),
             (LIGHTSEQ_PREFIX, "DistFlashAttn's baselines (Megatron-LM TP 8 / 16, DeepSpeed-Ulysses; 1-2 A100 boxes)"),
             (REPORTS46_PREFIX, "SmolLM3's and Granite 3.0's runs (nanotron, an unnamed framework; 8-768 H100)"),
             (DGXC_2502_PREFIX, "dgxc-benchmarking v25.02 and v25.04 (H100; NeMo 24.12 and NeMo 2 containers)"),
             (NEMO2507_PREFIX, "NeMo 25.07's GB200 FP8 summary (Llama 3 8B, 70B, 3.1 405B)"),
             (MOERECIPES_PREFIX, "Megatron-LM's MoE recipe table (DeepSeek-V3, Qwen3; H100, B200, B300, GB200, GB300)"))


def _stats(preds: list[Prediction]) -> dict[str, float | int]:
    """`_error_counts` as the JSON report gives it (percentages to a tenth)."""
    n, within, med, top = _error_counts(preds)
    return {"rows": n, "within_10pct": within, "median_abs_error_pct": round(100 * med, 1),
            "max_abs_error_pct": round(100 * top, 1)}


def summary_groups(preds: list[Prediction]) -> list[tuple[str, list[Prediction]]]:
    """The rows of each summary line, labelled: all rows ("all"), then the in-sample rows (those that set a fitted
    constant: `in_sample`) and the held-out rest apart, the held-out rows once more split into the sources of
    `OWN_LINES` and the other sources."""
    ins = [p for p in preds if in_sample(p.row)]
    held = [p for p in preds if not in_sample(p.row)]
    out = [("all", preds)]
    if ins and held:
        out += [("in sample", ins), ("held out", held)]
        rest = held
        for prefix, label in OWN_LINES:
            own = [p for p in rest if str(p.row["name"]).startswith(prefix)]
            if own and len(own) < len(rest):
                out.append((f"held out, {label}", own))
                rest = [p for p in rest if not str(p.row["name"]).startswith(prefix)]
        if len(rest) < len(held):
            out.append(("held out, the other sources", rest))
    return out


# Two rows are a *layout pair* when they measured two layouts of one run: the same source document (its `source` up
# to the first "(" or ","), every field but the layout (`fixed`) and the row's own words (name, source, published
# number, assumptions, note, bound) equal -- same model, GPU, GPU count, batch, dtype and software settings -- and
# their published numbers more than ORDER_MARGIN apart (closer than the set's ±10 %, run-to-run spread and the
# model's own error could flip the order either way).  A planner that is to *choose* layouts must order such pairs as
# measured; the rows' errors alone do not say whether it does (two rows each 8 % off in opposite directions can
# swap).  Chosen before the rows that form most pairs (BLOOM's layout trials, issue 12's fortieth round) were priced.
ORDER_MARGIN = DEFAULT_BOUND
# the row fields that are not the run: its own words, its layout (`fixed`, and `pipeline_layout`, the cut of its pipeline)
# and `evaluate_unfit` (to price the published layout memory.py refuses); `_layout_groups` keys runs on the rest
_OWN_WORDS = frozenset({"name", "source", "published", "assumed", "note", "bound", "fixed", "pipeline_layout",
                        "evaluate_unfit"})


def _document(source: str) -> str:
    cut = [i for i in (source.find("("), source.find(",")) if i >= 0]
    return source[:min(cut)].strip() if cut else source.strip()


def _layout_groups(preds: list[Prediction]) -> list[list[Prediction]]:
    """`preds` grouped by run: one source document, every field but the layout and the row's own words equal."""
    groups: dict[str, list[Prediction]] = {}
    for p in preds:
        rest = {k: v for k, v in p.row.items() if k not in _OWN_WORDS}
        key = json.dumps([_document(str(p.row.get("source", ""))), rest], sort_keys=True, default=str)
        groups.setdefault(key, []).append(p)
    return list(groups.values())


def layout_pairs(preds: list[Prediction]) -> list[tuple[Prediction, Prediction]]:
    """The layout pairs among `preds` (see ORDER_MARGIN), each as (measured faster, measured slower)."""
    out = []
    for group in _layout_groups(preds):
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                fa, fb = float(a.row["published"]), float(b.row["published"])
                if a.row["fixed"] != b.row["fixed"] and abs(fa - fb) > ORDER_MARGIN * min(fa, fb):
                    out.append((a, b) if fa > fb else (b, a))
    return out


def layout_picks(preds: list[Prediction]) -> list[tuple[Prediction, Prediction, float]]:
    """For each run measured at three or more layouts: (the planner's pick -- the layout it predicts fastest --, the
    measured fastest, the regret: how much slower the pick measured than the fastest, as a fraction).  What the
    planner is for, choosing among layouts, scored on the layouts a team actually tried (added in issue 12's fortieth
    round after BLOOM's trials were priced; it mirrors `par3d bench fidelity`'s pick, with no threshold to choose)."""
    out = []
    for group in _layout_groups(preds):
        if len({json.dumps(p.row["fixed"], sort_keys=True) for p in group}) < 3:
            continue
        pick = max(group, key=lambda p: p.value)
        best = max(group, key=lambda p: float(p.row["published"]))
        out.append((pick, best, 1.0 - float(pick.row["published"]) / float(best.row["published"])))
    return out


def ordering(preds: list[Prediction]) -> tuple[int, int]:
    """(layout pairs, pairs the planner orders as measured: the faster run predicted faster)."""
    pairs = layout_pairs(preds)
    return len(pairs), sum(fast.value > slow.value for fast, slow in pairs)


def _pick_stats(preds: list[Prediction]) -> tuple[int, int, float, float, float] | None:
    """`layout_picks` summed up: (runs, picks that were the measured fastest, median, mean and largest regret as
    fractions); None where no run was measured at three layouts.  What the summary line and evidence.json both quote.
    The mean is what following the pick cost on average, and what `par3d plan` takes as its resolution between two
    layouts (forty-sixth round: the median is zero once more than half of the picks are the fastest, and a zero
    resolution would call no two plans a tie however near)."""
    regrets = sorted(r for _, _, r in layout_picks(preds))
    if not regrets:
        return None
    return len(regrets), sum(r == 0 for r in regrets), median(regrets), sum(regrets) / len(regrets), regrets[-1]


# ---- repeats: rows that state the same inputs (issue 12's fifty-fifth round) ------------------------------------
#
# Some runs were published more than once at inputs their rows state alike: Megatron-Bridge's tables repeat a recipe
# in each container release, MLPerf's submitters ran one system size on alike servers, BLOOM's trials re-ran a layout
# on another day.  The model prices such rows alike -- it reads only what they state -- so the spread of their
# published values is error no model of these inputs can remove: a floor under "every row within ±10 %", measured on
# the set itself rather than argued.
_NOT_INPUTS = frozenset({"name", "source", "published", "assumed", "note", "bound", "evaluate_unfit"})


def repeat_groups(preds: list[Prediction]) -> list[list[Prediction]]:
    """The groups of two or more rows whose every priced field is equal: only their name, source, words and published
    value differ."""
    groups: dict[str, list[Prediction]] = {}
    for p in preds:
        key = json.dumps({k: v for k, v in p.row.items() if k not in _NOT_INPUTS}, sort_keys=True, default=str)
        groups.setdefault(key, []).append(p)
    return [g for g in groups.values() if len(g) > 1]


def forced_misses(published: list[float], bound: float = DEFAULT_BOUND) -> int:
    """How many of `published` (one run's repeats) any single prediction misses by more than `bound`: all but the
    most of them whose bands [(1 − bound)·x, (1 + bound)·x] share a point (a band's edge, where the most overlap)."""
    bands = [((1 - bound) * x, (1 + bound) * x) for x in published]
    return len(bands) - max(sum(lo <= edge <= hi for lo, hi in bands) for band in bands for edge in band)


def repeat_stats(preds: list[Prediction]) -> dict[str, Any] | None:
    """`repeat_groups` summed up: groups, rows, the spread of a group's published values (largest / smallest − 1:
    median and largest), each row's distance from its group's median published value (median: the sources' own
    scatter), groups spread wider than twice the bound, the misses at ±10 % no prediction of these inputs can
    avoid (`forced_misses`) and the groups' row names (`runs`); None without repeats."""
    groups = repeat_groups(preds)
    if not groups:
        return None
    pubs = [[float(p.row["published"]) for p in g] for g in groups]
    spreads = sorted(max(x) / min(x) - 1 for x in pubs)
    scatter = [abs(v / median(x) - 1) for x in pubs for v in x]
    return {"groups": len(groups), "rows": sum(len(g) for g in groups), "spread_median_pct": round(100 * median(spreads), 1),
            "spread_max_pct": round(100 * spreads[-1], 1), "scatter_median_pct": round(100 * median(scatter), 1),
            "wider_than_2x_bound": sum(s > 2 * DEFAULT_BOUND for s in spreads),
            "forced_misses": sum(forced_misses(x) for x in pubs),
            "within_10pct": sum(abs(p.error) <= DEFAULT_BOUND for g in groups for p in g),
            "runs": [[p.row["name"] for p in g] for g in groups]}


def repeats_line(preds: list[Prediction]) -> str:
    """The summary line of `repeat_stats` (the table's last line, docs/planner.md section 9)."""
    s = repeat_stats(preds)
    if s is None:
        return ""
    return (f"repeats (rows stating the same inputs, priced alike): {s['groups']} runs, {s['rows']} rows; their published "
            f"values spread a median {s['spread_median_pct']}% (max {s['spread_max_pct']}%), each a median "
            f"{s['scatter_median_pct']}% from its run's median; {s['forced_misses']} of them outside ±10 % of any one "
            f"prediction; {s['within_10pct']} within ±10 % here")


def summary(preds: list[Prediction]) -> str:
    """The lines under the table: rows, how many within ±10 %, median and largest |error| for each of
    `summary_groups`."""
    lines = []
    for label, group in summary_groups(preds):
        if label == "all":
            lines.append(_counts(group))
        elif label == "in sample":
            lines.append("in sample (set the step share, the H100's, GH200's or GB300's sustained ratios or FSDP's "
                         f"per-unit cost, or chose NVFP4's GEMM rule): {_counts(group)}")
        else:
            lines.append(f"{label}: {_counts(group)}")
    n, right = ordering(preds)
    if n:
        lines.append(f"layout pairs (two layouts of one run, measured more than {ORDER_MARGIN:.0%} apart): {n}, "
                     f"ordered as measured: {right}")
    stats = _pick_stats(preds)
    if stats:
        runs, fastest, med, mean, top = stats
        lines.append(f"runs measured at three or more layouts: {runs}; the planner's pick the measured fastest in "
                     f"{fastest}, its regret median {med:.1%}, mean {mean:.1%}, max {top:.1%}")
    repeats = repeats_line(preds)
    if repeats:
        lines.append(repeats)
    return "\n".join(lines)


def report_json(preds: list[Prediction]) -> str:
    """What `--json` prints: every row's prediction at its published layout (name, GPU, dtype, whether a mixture of
    experts, whether in sample, the metric, published and predicted values, the signed error and the row's bound, the
    layout priced, memory), the summary lines' figures and the by-GPU evidence (`evidence`)."""
    out_rows = []
    for p in preds:
        c = p.plan.choice
        out_rows.append({
            "name": p.row["name"], "gpu": p.row["gpu"], "dtype": p.row.get("dtype", "bf16"), "moe": model_of(p.row).moe,
            "in_sample": in_sample(p.row), "metric": p.row["metric"], "published": float(p.row["published"]),
            "predicted": round(p.value, 3), "error_pct": round(100 * p.error, 2), "bound_pct": round(100 * p.bound, 1),
            "within_10pct": abs(p.error) <= DEFAULT_BOUND, "layout": layout_of(c),
            "choice": {"tp": c.tp, "cp": c.cp, "pp": c.pp, "dp": c.dp, "micro_batch": c.micro_batch,
                       "schedule": c.schedule, "virtual_stages": c.virtual_stages, "recompute": c.recompute,
                       "zero_stage": c.zero_stage},
            "fits": p.fits, "in_headroom": p.in_headroom, "assumed": p.row.get("assumed", "")})
    return json.dumps({"rows": out_rows,
                       "summary": [{"group": label, **_stats(group)} for label, group in summary_groups(preds)],
                       "layout_pairs": [{"faster": fast.row["name"], "slower": slow.row["name"],
                                         "ordered_as_measured": fast.value > slow.value}
                                        for fast, slow in layout_pairs(preds)],
                       "layout_picks": [{"pick": pick.row["name"], "fastest": best.row["name"],
                                         "regret_pct": round(100 * regret, 1)}
                                        for pick, best, regret in layout_picks(preds)],
                       "repeats": repeat_stats(preds) or {"runs": []},
                       "by_gpu": evidence(preds)}, indent=1, ensure_ascii=False)


def by_gpu(preds: list[Prediction]) -> str:
    """The set read by GPU and dtype (fp16 counted with bf16), the way `par3d plan` quotes its evidence: rows, how
    many set a constant (in sample), how many are within ±10 %, and the signed errors' lowest, median and highest
    -- the answer to "how far off has this model been on my GPU?"."""
    ev = evidence(preds)
    ins: dict[str, int] = {}
    for p in preds:
        if in_sample(p.row):
            key = _evidence_key(str(p.row["gpu"]), str(p.row.get("dtype", "bf16")), model_of(p.row).moe)
            ins[key] = ins.get(key, 0) + 1
    out = ["| GPU / dtype | rows | in sample | within ±10 % | median error | lowest … highest |",
           "|---|---:|---:|---:|---:|---|"]
    for key, e in sorted((k, v) for k, v in ev.items() if not k.startswith(NOT_A_GPU)):
        out.append(f"| {key} | {e['rows']} | {ins.get(key, 0)} | {e['within_10pct']} | {e['median_error_pct']:+.1f} % "
                   f"| {e['min_error_pct']:+.1f} … {e['max_error_pct']:+.1f} % |")
    return "\n".join(out)


# ---- the evidence behind a plan: how the model did on the published runs of one GPU and dtype ---------------
#
# `par3d plan` prints, beside its prediction, the signed errors of every validation row of the same catalogue GPU
# and dtype (docs/planner.md §9), read from evidence.json so that a plan costs no validation run; the file is
# this module's output (`python -m par3d.plan.validation --evidence`) and a test keeps the two equal.
EVIDENCE_PATH = os.path.join(os.path.dirname(__file__), "evidence.json")


#
# Beside the GPU, a regime: a kind of plan whose published runs the model misses one way, across sources, by
# more than its GPU's spread says (docs/planner.md §9, fourteenth round).  Read off the misses, so it is a
# description of the set, not a prediction; `par3d plan` quotes it as a caveat on the plans it matches.
# Each rule reads the plan's choice and whether the cluster runs PyTorch FSDP (`Cluster.fsdp`).  The second regime
# was read off the fortieth round's misses (OLMo-core's eight FSDP2 rows at 16-256 micro-batches, all slow) and the
# rows already in the set that share it; like the first, it describes the set.
REGIMES: dict[str, tuple[str, Callable[[Choice, bool], bool]]] = {
    "one-microbatch-wide-dp-no-recompute": (
        "one micro-batch per step, ZeRO/data parallelism over >= 32 ranks (dp x cp), no recomputation",
        lambda c, fsdp: c.microbatches == 1 and c.dp * c.cp >= 32 and c.recompute == "none"),
    "fsdp-many-microbatches": (
        "PyTorch FSDP (--fsdp) at >= 16 micro-batches per step",
        lambda c, fsdp: fsdp and c.microbatches >= 16),
}


def regimes_of(c: Choice, fsdp: bool = False) -> list[str]:
    """The names of the REGIMES a configuration falls in (`fsdp`: the cluster runs PyTorch FSDP)."""
    return [name for name, (_, rule) in REGIMES.items() if rule(c, fsdp)]


RANKING_KEY = "ranking/layouts"  # evidence.json's entry for the layout picks (not a GPU's)
NOT_A_GPU = ("regime/", "ranking/", "software/")  # evidence.json's entries that are not a GPU's and dtype's


def evidence(preds: list[Prediction], plain: list[Prediction | None] | None = None,
             named: list[Prediction | None] | None = None) -> dict[str, dict[str, float | int]]:
    """Per "gpu/dtype": rows, rows within ±10 %, and the lowest, median and highest signed error (%, one
    decimal) of the model on the published runs of that GPU and dtype (dense models; a mixture of experts' runs
    apart, as "gpu/dtype/moe": another part of the model, scored apart); per "regime/NAME" the same over the
    rows whose priced configuration falls in that regime (`REGIMES`); with `plain` (the rows `undescribed`,
    in order) and `named` (the rows `named`), the whole set with and without its software and with its framework
    named (`software_figures`)."""
    groups: dict[str, list[float]] = {}
    for p in preds:
        key = _evidence_key(str(p.row["gpu"]), str(p.row.get("dtype", "bf16")), model_of(p.row).moe)
        groups.setdefault(key, []).append(p.error)
        for name in regimes_of(p.plan.choice, cluster_of(p.row).fsdp):
            groups.setdefault(f"regime/{name}", []).append(p.error)
    out: dict[str, dict[str, float | int]] = {}
    for key, errs in sorted(groups.items()):
        errs.sort()
        out[key] = {"rows": len(errs), "within_10pct": sum(abs(e) <= DEFAULT_BOUND for e in errs),
                    "min_error_pct": round(100 * errs[0], 1), "median_error_pct": round(100 * median(errs), 1),
                    "max_error_pct": round(100 * errs[-1], 1)}
    stats = _pick_stats(preds)
    if stats:  # how well the model chose among the layouts a team measured (`layout_picks`, `ordering`)
        runs, fastest, med, mean, top = stats
        pairs, ordered = ordering(preds)
        out[RANKING_KEY] = {"runs": runs, "pick_fastest": fastest, "median_regret_pct": round(100 * med, 1),
                            "mean_regret_pct": round(100 * mean, 1), "max_regret_pct": round(100 * top, 1),
                            "pairs": pairs, "pairs_ordered": ordered}
    if plain is not None:
        out.update(software_figures(preds, plain, named))
    return out


def _evidence_key(gpu: str, dtype: str, moe: bool) -> str:
    return f"{gpu}/{evidence_dtype(dtype)}" + ("/moe" if moe else "")


def evidence_dtype(dtype: str) -> str:
    """fp16 and bf16 run the same tensor-core path at the same rate in the model: one group, "bf16"."""
    return "bf16" if dtype == "fp16" else dtype


def evidence_json(preds: list[Prediction], plain: list[Prediction | None] | None = None,
                  named: list[Prediction | None] | None = None) -> str:
    return json.dumps(evidence(preds, plain, named), indent=1, sort_keys=True) + "\n"


@cache
def _evidence_file() -> dict[str, dict[str, float | int]]:
    """evidence.json, read once a process (`par3d plan` asks for it per plan and per line); `main --evidence`, which
    rewrites it, clears the cache."""
    try:
        with open(EVIDENCE_PATH, encoding="utf-8") as fh:
            return dict(json.load(fh))
    except FileNotFoundError:
        return {}


def stored_evidence() -> dict[str, dict[str, float | int]]:
    """evidence.json as committed (empty if absent)."""
    return dict(_evidence_file())


def regime_evidence(c: Choice, fsdp: bool = False) -> list[dict[str, object]]:
    """The stored evidence of each regime a configuration falls in, with the regime's name and rule."""
    out: list[dict[str, object]] = []
    for name in regimes_of(c, fsdp):
        ev = stored_evidence().get(f"regime/{name}")
        if ev is not None:
            out.append({"regime": name, "rule": REGIMES[name][0], **ev})
    return out


def ranking_evidence() -> dict[str, float | int] | None:
    """The stored layout-pick figures (`layout_picks`, `ordering`): how often the model's pick among a run's measured
    layouts was the fastest and how much slower it measured; None if the set has no run with three layouts."""
    return stored_evidence().get(RANKING_KEY)


def software_evidence() -> dict[str, dict[str, float | int]] | None:
    """The stored `software_figures` (evidence.json): the whole set scored with and without its software facts and
    with its framework named; None if absent."""
    ev = stored_evidence()
    return {k: ev[k] for k in SOFTWARE_KEYS} if all(k in ev for k in SOFTWARE_KEYS) else None


def evidence_for(gpu: str, dtype: str, moe: bool = False) -> dict[str, float | int] | None:
    """The stored evidence for a catalogue GPU and dtype (fp16 counted with bf16) -- of mixtures of experts where
    `moe` --, None where the validation set has no row of it."""
    return stored_evidence().get(_evidence_key(gpu, dtype, moe))


def software_table(preds: list[Prediction], fields: list[dict[str, Any]] | None = None,
                   whole: dict[str, dict[str, float | int]] | None = None) -> str:
    """The markdown table of `--software` (docs/planner.md section 9): the set priced as described, without one
    software fact at a time, and without all of them."""
    if fields is None:
        fields = software_by_field(preds)
    if whole is None:
        whole = software_figures(preds, [predict_undescribed(p.row) for p in preds],
                                 [predict_named(p.row) for p in preds])
    d, u = whole[SOFTWARE_KEYS[0]], whole[SOFTWARE_KEYS[1]]
    out = ["| software fact left out | rows stating it | without a plan | within ±10 % | median |error| |",
           "|---|---:|---:|---:|---:|",
           f"| none (every row as described) | — | — | {d['within_10pct']} | {d['median_abs_error_pct']:.1f} % |"]
    for f in fields:
        out.append(f"| `{f['field']}` | {f['rows']} | {f['no_plan']} | {f['within_10pct']} "
                   f"| {f['median_abs_error_pct']:.1f} % |")
    out.append(f"| all of them | {u['rows']} | {u['rows'] - u['priced']} | {u['within_10pct']} "
               f"| {u['median_abs_error_pct']:.1f} % |")
    n = whole.get(SOFTWARE_KEYS[2])
    if n is not None:  # all of them, then each row's framework's preset in their place (`named`, --framework)
        out.append(f"| all of them, the framework named (`--framework`) | {n['rows']} | {n['rows'] - n['priced']} "
                   f"| {n['within_10pct']} | {n['median_abs_error_pct']:.1f} % |")
    return "\n".join(out)


def framework_table(preds: list[Prediction], plain: list[Prediction | None], named: list[Prediction | None]) -> str:
    """The markdown table below `--software`'s (docs/planner.md section 9, fifty-third round): for each framework
    preset (`framework_of`; "none" for software no preset describes), its rows within ±10 % as described, at par3d's
    defaults and with only the framework named (`par3d plan --framework`)."""
    groups: dict[str, list[tuple[Prediction, Prediction | None, Prediction | None]]] = {}
    for p, u, n in zip(preds, plain, named, strict=True):
        groups.setdefault(framework_of(p.row) or "none", []).append((p, u, n))

    def within(ps: list[Prediction | None]) -> int:
        return sum(q is not None and abs(q.error) <= DEFAULT_BOUND for q in ps)

    out = ["| framework (`--framework`) | rows | within ±10 %: as described | at par3d's defaults "
           "| the framework named |", "|---|---:|---:|---:|---:|"]
    for name in [f for f in (*FRAMEWORKS, "none") if f in groups]:
        g = groups[name]
        out.append(f"| {'`' + name + '`' if name != 'none' else 'none of them'} | {len(g)} "
                   f"| {within([t[0] for t in g])} | {within([t[1] for t in g])} | {within([t[2] for t in g])} |")
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m par3d.plan.validation",
        description="Score the planner on the published runs of src/par3d/plan/validation.toml: each row predicted "
                    "once at its published layout on its GPU and cluster.  Without flags: the table docs/planner.md "
                    "section 9 quotes, its summary (all rows, in sample, held out, by source) and the by-GPU reading.")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--json", action="store_true",
                      help="print every row's prediction, the summary figures and the by-GPU evidence as one JSON "
                           "object instead of the tables")
    what.add_argument("--evidence", action="store_true",
                      help="rewrite src/par3d/plan/evidence.json, the per-GPU/dtype errors `par3d plan` quotes")
    what.add_argument("--fit", action="store_true",
                      help="re-derive the fitted step share and sustained GEMM ratios on their declared calibration "
                           "rows and print them beside the stored constants (nothing is written)")
    what.add_argument("--fit-moe-host", action="store_true",
                      help="re-derive the MoE host floor on Megatron-Bridge 26.04's MoE rows and print it beside the "
                           "stored one (nothing is written)")
    parser.add_argument("--leave-one-out", action="store_true",
                      help="refit each fitted constant without each of its calibration rows in turn and price that "
                           "row with the refit (a prediction of a row the constant never saw), and the H100's ratios "
                           "on each other source's rows; writes src/par3d/plan/leave_one_out.json and prints the two "
                           "tables docs/planner.md quotes (with --json: the file's JSON instead; about a minute)")
    parser.add_argument("--software", action="store_true",
                      help="what each software fact of the rows buys: the set re-priced without one fact at a time "
                           "(par3d's default in its place), and without all of them (a markdown table; with --json "
                           "the same as JSON)")
    parser.add_argument("--by-release", action="store_true",
                        help="with --fit-moe-host: also fit the floor on each release's rows alone and score it on "
                             "the other mixture-of-experts rows")
    what.add_argument("--refresh", action="store_true",
                      help="after a change to the rows or the model: price the set once and rewrite what quotes it "
                           "-- evidence.json, leave_one_out.json (refitting, about a minute), the generated tables "
                           "of docs/planner.md and docs/planner_rounds.md, and each row's bound and note where its "
                           "error moved (needs --round and --reason; a row that newly misses also --before); the "
                           "prose figures are a person's to update (the tests name them).  Run from a checkout")
    parser.add_argument("--check", action="store_true",
                        help="with --refresh: write nothing, list what is stale, exit 1 if anything is")
    parser.add_argument("--before", metavar="FILE", default=None,
                        help="with --refresh: a --json report written before the change (each row's error before, "
                             "which a row's new note quotes)")
    parser.add_argument("--round", metavar="NAME", default=None,
                        help="with --refresh: the round the notes date a change to, as issue 12's notes spell it "
                             "(e.g. forty-eighth)")
    parser.add_argument("--reason", metavar="TEXT", default=None,
                        help="with --refresh: the change, one short phrase each rewritten note gives (the round's "
                             "entry in docs/planner_rounds.md says the rest)")
    parser.add_argument("--rows", metavar="PREFIX", default=None,
                        help="only the rows whose name starts with PREFIX (the table, its summary or --json; e.g. "
                             "mlperf-6.0-)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.by_release and not args.fit_moe_host:
        parser.error("--by-release: only with --fit-moe-host (it re-fits the MoE host floor per release)")
    if args.software and (args.evidence or args.fit or args.fit_moe_host or args.leave_one_out):
        parser.error("--software: only alone, with --json or with --rows (it re-prices the rows it reads)")
    if args.rows is not None and (args.evidence or args.fit or args.fit_moe_host or args.leave_one_out):
        parser.error("--rows: only with the table or --json, or --software (--evidence, --fit, --fit-moe-host "
                     "and --leave-one-out use their own declared rows)")
    if args.leave_one_out and (args.evidence or args.fit or args.fit_moe_host or args.software):
        parser.error("--leave-one-out: only alone or with --json (it refits on its own declared rows)")
    if (args.check or args.before or args.round or args.reason) and not args.refresh:
        parser.error("--check, --before, --round, --reason: only with --refresh")
    if args.refresh and (args.leave_one_out or args.software or args.rows is not None):
        parser.error("--refresh: only with --check, --before, --round and --reason (it prices every row and "
                     "refits the leave-one-out itself)")
    if args.refresh:
        return _refresh(args)
    if args.leave_one_out:  # each in-sample row priced with its constant refitted without it (45th round)
        from . import leave_one_out as loo

        data = loo.run(lambda msg: print(f"  refitting {msg}", file=sys.stderr, flush=True))
        with open(loo.PATH, "w", encoding="utf-8") as fh:
            fh.write(loo.to_json(data))
        if args.json:
            print(loo.to_json(data), end="")
        else:
            print(f"wrote {loo.PATH}\n\n{loo.table(data)}\n\n{loo.swap_table(data)}")
        return 0
    if args.fit:  # re-derive the fitted sustained ratios (gemm_table.FITTED_SUSTAINED)
        from . import gemm_table

        print(f"step share: fitted {fit_step_share():.4f} (stored {gemm_table.STEP_SHARE:.4f}) on the ten "
              f"{IN_SAMPLE_PREFIX}* rows, straggler spread {gemm_table.STEP_SPREAD}")
        for (family, dtype), stored in sorted(gemm_table.FITTED_SUSTAINED.items()):
            shared = family in gemm_table.SHARED_SUSTAINED
            print(f"{family} {dtype}: fitted {fit_sustained(family, dtype):.4f} (stored {stored:.4f}) on "
                  + ("every dtype's rows: " if shared else "")
                  + ", ".join(str(r["name"]) for r in calibration_rows_of(family)
                              if shared or r.get("dtype", "bf16") == dtype))
        return 0
    if args.fit_moe_host:  # re-derive hardware.MOE_HOST_S (seconds: a 2-D grid)
        from .hardware import MOE_HOST_S

        a, b = fit_moe_host()
        print(f"MoE host floor: fitted ({a * 1e3:.2f} ms, {b * 1e3:.3f} ms a routed expert) (stored "
              f"({MOE_HOST_S[0] * 1e3:.2f} ms, {MOE_HOST_S[1] * 1e3:.3f} ms)) on "
              + ", ".join(str(r["name"]) for r in moe_host_rows()))
        if args.by_release:  # the same fit on each release's rows alone, scored on the other MoE rows
            for rel, n, (pa, pb), others, before, after in moe_host_by_release():
                print(f"fitted on {rel}'s {n} rows: ({pa * 1e3:.2f} ms, {pb * 1e3:.3f} ms); the other {others} MoE "
                      f"rows within ±10 %: {before} without a floor, {after} with it")
        return 0
    chosen = [r for r in rows() if args.rows is None or str(r["name"]).startswith(args.rows)]
    if not chosen:
        parser.error(f"--rows {args.rows}: no row's name starts with it (names as in src/par3d/plan/validation.toml)")
    preds = [predict(r) for r in chosen]
    if args.evidence:  # rewrite evidence.json (what `par3d plan` quotes)
        with open(EVIDENCE_PATH, "w", encoding="utf-8") as fh:
            fh.write(evidence_json(preds, [predict_undescribed(r) for r in chosen], [predict_named(r) for r in chosen]))
        _evidence_file.cache_clear()
        print(f"wrote {EVIDENCE_PATH}")
        return 0
    if args.software:  # the software facts' worth (docs/planner.md section 9, forty-fourth round)
        fields = software_by_field(preds)
        plain, named_preds = [predict_undescribed(r) for r in chosen], [predict_named(r) for r in chosen]
        whole = software_figures(preds, plain, named_preds)
        if args.json:
            print(json.dumps({"by_field": fields, **whole}, indent=1))
            return 0
        print(software_table(preds, fields, whole))
        print("\n" + framework_table(preds, plain, named_preds))
        return 0
    if args.json:
        print(report_json(preds))
        return 0
    print(table(preds))
    print("\n" + summary(preds))
    print("\n" + by_gpu(preds))
    return 0


def _refresh(args: argparse.Namespace) -> int:
    """--refresh (refresh.py): evidence.json, leave_one_out.json, the docs' generated blocks, rows' bounds and
    notes, from one pricing of the set."""
    from . import leave_one_out as loo
    from . import refresh

    root = refresh.repo_root()
    before = None
    if args.before:
        with open(args.before, encoding="utf-8") as fh:
            before = refresh.errors_of(fh.read())
    every = rows()
    preds = [predict(r) for r in every]
    plain = [predict_undescribed(r) for r in every]
    named_preds = [predict_named(r) for r in every]
    ev = evidence_json(preds, plain, named_preds)
    with open(EVIDENCE_PATH, encoding="utf-8") as fh:
        ev_stale = fh.read() != ev
    data = loo.run(lambda msg: print(f"  refitting {msg}", file=sys.stderr, flush=True))
    loo_text = loo.to_json(data)
    with open(loo.PATH, encoding="utf-8") as fh:
        loo_stale = fh.read() != loo_text
    try:  # nothing is written before every row's new bound and note is known
        stale = refresh.refresh(root, preds, data, before, args.round, args.reason, write=not args.check,
                                plain=plain, named=named_preds)
    except ValueError as exc:
        print(f"--refresh: {exc}; nothing written", file=sys.stderr)
        return 2
    for path, text, changed in ((EVIDENCE_PATH, ev, ev_stale), (loo.PATH, loo_text, loo_stale)):
        if not changed:
            continue
        stale.append(os.path.basename(path))
        if args.check:
            print(f"stale: {os.path.basename(path)}")
        else:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
            print(f"refreshed {os.path.basename(path)}")
    _evidence_file.cache_clear()
    if not stale:
        print("nothing stale: every generated block, bound and note agrees with the set as priced now")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
