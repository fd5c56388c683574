"""The evidence behind a plan: evidence.json, the model's errors on the published runs of each GPU and dtype, of
each regime it misses one way, of its layout picks and of the rows' software facts -- written by
`python -m par3d.plan.validation --evidence` and read by `par3d plan` without a validation run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from functools import cache
from statistics import median
from typing import Any

from .cost import Choice
from .hardware import Cluster
from .validation import DEFAULT_BOUND, Prediction, cluster_of, model_of
from .validation_runs import ordering, pick_stats, precision_stats, scale_stats

# ---- the evidence behind a plan: how the model did on the published runs of one GPU and dtype ---------------
#
# `par3d plan` prints, beside its prediction, the signed errors of every validation row of the same catalogue GPU
# and dtype (docs/planner.md §9), read from evidence.json so that a plan costs no validation run; the file is
# this module's output (`python -m par3d.plan.validation --evidence`) and a test keeps the two equal.
EVIDENCE_PATH = os.path.join(os.path.dirname(__file__), "evidence.json")


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


# Beside the GPU, a regime: a kind of plan whose published runs the model misses one way, across sources, by
# more than its GPU's spread says (docs/planner.md §9, fourteenth round).  Read off the misses, so it is a
# description of the set, not a prediction; `par3d plan` quotes it as a caveat on the plans it matches.
# Each rule reads the plan's choice and its cluster (whether it runs PyTorch FSDP, `Cluster.fsdp`; its NVLink domain,
# `Cluster.gpus_per_node`).  The second regime was read off the fortieth round's misses (OLMo-core's eight FSDP2 rows
# at 16-256 micro-batches, all slow) and the rows already in the set that share it; like the first, it describes the
# set.  The third was read off the mixtures of experts' misses in issue 12's fifty-sixth round (Megatron-Bridge's
# five Qwen3-235B-A22B rows on 32-way expert parallelism over H100 nodes, +14 ... +21 %, and the rows that share the
# trait: dgxc-benchmarking's, NeMo AutoModel's, the Megatron MoE model zoo's and recipes' and DeepSeek-V3's own): an
# expert-parallel group wider than a node's NVLink domain, so that the tokens' all-to-all crosses the NICs.  Nothing in
# the model moved for it: no source measures how far below the NIC's rate those all-to-alls run.  The fourth (issue
# 12's sixty-fourth round) was read off the A100 rows at TP 8 -- a whole DGX A100 node's NVLink domain -- that the
# sixty-third round examined for a change and left (docs/planner.md, Limitations): BLOOM's layout trials, Hagemann et
# al.'s sweep, NeMo Megatron 22.08 and MT-NLG fast at identical GEMM shapes and all-reduce sizes where Megatron-LM's
# own runs (Narayanan et al., Korthikanti et al., MegaScale's baseline, DistFlashAttn's baselines) are met, all
# but FlagPerf's one A800 node; no source measures what those
# runtimes spend per layer and micro-batch, so nothing in the model moved for it either.
REGIMES: dict[str, tuple[str, Callable[[Choice, Cluster], bool]]] = {
    "one-microbatch-wide-dp-no-recompute": (
        "one micro-batch per step, ZeRO/data parallelism over >= 32 ranks (dp x cp), no recomputation",
        lambda c, cluster: c.microbatches == 1 and c.dp * c.cp >= 32 and c.recompute == "none"),
    "fsdp-many-microbatches": (
        "PyTorch FSDP (--fsdp) at >= 16 micro-batches per step",
        lambda c, cluster: cluster.fsdp and c.microbatches >= 16),
    "ep-across-nodes": (
        "an expert-parallel group wider than a node's NVLink domain (--ep above the GPUs per node: the tokens' "
        "all-to-all crosses the NICs)",
        lambda c, cluster: c.ep > cluster.gpus_per_node),
    "a100-tp8": (
        "TP 8 on A100 GPUs, eight to a node (a whole DGX A100 node's NVLink domain; Megatron-LM's own runs there are "
        "nearly all met, the DeepSpeed pipeline engine's, NeMo 1.x's and Aleph Alpha's run slower)",
        lambda c, cluster: cluster.device.name.startswith("a100") and c.tp == 8 and cluster.gpus_per_node == 8),
}


def regimes_of(c: Choice, cluster: Cluster) -> list[str]:
    """The names of the REGIMES a configuration falls in on `cluster`."""
    return [name for name, (_, rule) in REGIMES.items() if rule(c, cluster)]


RANKING_KEY = "ranking/layouts"  # evidence.json's entry for the layout picks (not a GPU's)
SCALING_KEY = "scaling/pairs"  # its entry for the scale pairs (validation_runs.scale_stats; fifty-seventh round)
SCALING_FIELDS = ("pairs", "runs", "within_5pct", "flat_within_5pct", "median_abs_pct", "median_signed_pct",
                  "dense", "dense_within_5pct", "moe", "moe_within_5pct", "moved", "moved_same_way",
                  "moved_within_5pct", "strong", "strong_within_5pct", "strong_flat_within_5pct", "weak",
                  "weak_within_5pct", "weak_flat_within_5pct")
PRECISION_KEY = "precision/pairs"  # its entry for the precision pairs (validation_runs.precision_stats; same round)
NOT_A_GPU = ("regime/", "ranking/", "software/", "scaling/", "precision/")  # evidence.json's entries that are not a GPU's and dtype's


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
        key = evidence_key(str(p.row["gpu"]), str(p.row.get("dtype", "bf16")), model_of(p.row).moe)
        groups.setdefault(key, []).append(p.error)
        for name in regimes_of(p.plan.choice, cluster_of(p.row)):
            groups.setdefault(f"regime/{name}", []).append(p.error)
    out: dict[str, dict[str, float | int]] = {}
    for key, errs in sorted(groups.items()):
        errs.sort()
        out[key] = {"rows": len(errs), "within_10pct": sum(abs(e) <= DEFAULT_BOUND for e in errs),
                    "min_error_pct": round(100 * errs[0], 1), "median_error_pct": round(100 * median(errs), 1),
                    "max_error_pct": round(100 * errs[-1], 1)}
    stats = pick_stats(preds)
    if stats:  # how well the model chose among the layouts a team measured (`layout_picks`, `ordering`)
        runs, fastest, med, mean, top = stats
        pairs, ordered = ordering(preds)
        out[RANKING_KEY] = {"runs": runs, "pick_fastest": fastest, "median_regret_pct": round(100 * med, 1),
                            "mean_regret_pct": round(100 * mean, 1), "max_regret_pct": round(100 * top, 1),
                            "pairs": pairs, "pairs_ordered": ordered}
    scaling = scale_stats(preds)
    if scaling:  # how well the model read per-GPU throughput at two GPU counts of one run (`scale_pairs`)
        out[SCALING_KEY] = {k: scaling[k] for k in SCALING_FIELDS}
    precision = precision_stats(preds)
    if precision:  # how well it read the speed-up of a lower precision in one run published in two (`precision_pairs`)
        out[PRECISION_KEY] = precision
    if plain is not None:
        out.update(software_figures(preds, plain, named))
    return out


def evidence_key(gpu: str, dtype: str, moe: bool) -> str:
    return f"{gpu}/{evidence_dtype(dtype)}" + ("/moe" if moe else "")


def evidence_dtype(dtype: str) -> str:
    """fp16 and bf16 run the same tensor-core path at the same rate in the model: one group, "bf16"."""
    return "bf16" if dtype == "fp16" else dtype


def evidence_json(preds: list[Prediction], plain: list[Prediction | None] | None = None,
                  named: list[Prediction | None] | None = None) -> str:
    return json.dumps(evidence(preds, plain, named), indent=1, sort_keys=True) + "\n"


@cache
def evidence_file() -> dict[str, dict[str, float | int]]:
    """evidence.json, read once a process (`par3d plan` asks for it per plan and per line); `main --evidence`, which
    rewrites it, clears the cache."""
    try:
        with open(EVIDENCE_PATH, encoding="utf-8") as fh:
            return dict(json.load(fh))
    except FileNotFoundError:
        return {}


def stored_evidence() -> dict[str, dict[str, float | int]]:
    """evidence.json as committed (empty if absent)."""
    return dict(evidence_file())


def regime_evidence(c: Choice, cluster: Cluster) -> list[dict[str, object]]:
    """The stored evidence of each regime a configuration falls in on `cluster`, with the regime's name and rule."""
    out: list[dict[str, object]] = []
    for name in regimes_of(c, cluster):
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


def scaling_evidence() -> dict[str, float | int] | None:
    """The stored scale-pair figures (`scale_stats`): how often the model's per-GPU scaling between two GPU counts of
    one published run was within ±5 % of the measured, beside the flat baseline; None if absent."""
    return stored_evidence().get(SCALING_KEY)


def precision_evidence() -> dict[str, Any] | None:
    """The stored precision-pair figures (`precision_stats`): how often the model's speed-up of a lower precision was
    within ±5 % of the measured, over the set and per GPU and precisions; None if absent."""
    return stored_evidence().get(PRECISION_KEY)


def evidence_for(gpu: str, dtype: str, moe: bool = False) -> dict[str, float | int] | None:
    """The stored evidence for a catalogue GPU and dtype (fp16 counted with bf16) -- of mixtures of experts where
    `moe` --, None where the validation set has no row of it."""
    return stored_evidence().get(evidence_key(gpu, dtype, moe))
