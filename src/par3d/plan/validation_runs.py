"""Validation rows grouped into runs: layout pairs and picks (one run measured at several layouts -- does the
planner order and choose them as measured?), repeats (one run published more than once at inputs its rows state
alike -- how far the sources scatter on their own) and scale pairs (one run published at two GPU counts -- does the
planner predict how its per-GPU throughput changes with scale?).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from statistics import median
from typing import Any

from .calibration import in_sample
from .validation import DEFAULT_BOUND, Prediction, cluster_of, model_of

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


def source_document(source: str) -> str:
    """A row's source document: its `source` up to its first parenthesis or comma."""
    cut = [i for i in (source.find("("), source.find(",")) if i >= 0]
    return source[:min(cut)].strip() if cut else source.strip()


def _grouped(preds: list[Prediction], key_of: Callable[[Prediction], Any]) -> list[list[Prediction]]:
    """`preds` grouped by `key_of(p)` (row fields: compared as their JSON), in the order first seen."""
    groups: dict[str, list[Prediction]] = {}
    for p in preds:
        groups.setdefault(json.dumps(key_of(p), sort_keys=True, default=str), []).append(p)
    return list(groups.values())


def _run_key(p: Prediction, drop: Callable[[str], bool], *more: Any) -> list[Any]:
    """A row's source document and its fields but those `drop` names (and `more`): what one run's rows share."""
    return [source_document(str(p.row.get("source", ""))), {k: v for k, v in p.row.items() if not drop(k)}, *more]


def _layout_groups(preds: list[Prediction]) -> list[list[Prediction]]:
    """`preds` grouped by run: one source document, every field but the layout and the row's own words equal."""
    return _grouped(preds, lambda p: _run_key(p, _OWN_WORDS.__contains__))


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


def pick_stats(preds: list[Prediction]) -> tuple[int, int, float, float, float] | None:
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
    groups = _grouped(preds, lambda p: {k: v for k, v in p.row.items() if k not in _NOT_INPUTS})
    return [g for g in groups if len(g) > 1]


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


# ---- scale pairs: one run published at two GPU counts (issue 12's fifty-seventh round) --------------------------
#
# A team sizing a cluster reads off the plan how per-GPU throughput changes with the GPU count; the rows' own errors
# do not say whether that reading holds (two rows each 8 % fast scale exactly as predicted).  Two rows are a *scale
# pair* when they are one run at two GPU counts: one source document, every field equal but the row's own words, the
# GPU count and the global batch, the same `fixed` layout apart from its DP degree, and GPU counts at least
# SCALE_FACTOR apart.  The published scaling is the ratio of their per-GPU figures (every metric of the set is per GPU:
# TFLOP/s or tokens/s), the predicted scaling the same ratio of the predictions, and a pair's error the one over the
# other, less one (positive: the planner loses less per GPU at scale than was measured).  SCALE_BOUND is half the
# rows' bound: a ratio of two rows of one run cancels what their errors share.  The definition, the bound and the
# report (with the flat baseline: per-GPU throughput predicted not to change) were written to a decision file before
# the first pair was scored; no constant, row or model term is set from it.
SCALE_FACTOR = 2
SCALE_BOUND = DEFAULT_BOUND / 2
_NOT_SCALE = frozenset(_NOT_INPUTS | {"gpus", "global_batch", "fixed"})


def scale_pairs(preds: list[Prediction]) -> list[tuple[Prediction, Prediction]]:
    """The scale pairs among `preds`, each as (fewer GPUs, more GPUs), grouped run by run."""
    out = []
    for group in _grouped(preds, lambda p: _run_key(p, _NOT_SCALE.__contains__,
                                                   {k: v for k, v in p.row.get("fixed", {}).items() if k != "dp"})):
        group = sorted(group, key=lambda p: int(p.row["gpus"]))
        for i, a in enumerate(group):
            out.extend((a, b) for b in group[i + 1:] if int(b.row["gpus"]) >= SCALE_FACTOR * int(a.row["gpus"]))
    return out


def scale_ratios(fewer: Prediction, more: Prediction) -> tuple[float, float]:
    """(published, predicted) per-GPU throughput at more GPUs over that at fewer."""
    return (float(more.row["published"]) / float(fewer.row["published"]), more.value / fewer.value)


def scale_error(fewer: Prediction, more: Prediction) -> float:
    """The predicted scaling over the published, less one (positive: the planner loses less per GPU than measured)."""
    published, predicted = scale_ratios(fewer, more)
    return predicted / published - 1.0


def scale_stats(preds: list[Prediction]) -> dict[str, Any] | None:
    """`scale_pairs` summed up: pairs and runs; pairs whose predicted scaling is within SCALE_BOUND of the published,
    and the same for the flat baseline (per-GPU throughput unchanged at scale); the median |error| and the median
    signed error; the held-out pairs (neither row in sample), the dense and the mixture-of-experts pairs; and the pairs
    whose published per-GPU throughput moved more than SCALE_BOUND (how many the planner moves the same way, how many
    within).  None without pairs."""
    pairs = scale_pairs(preds)
    if not pairs:
        return None

    def within(ps: list[tuple[Prediction, Prediction]]) -> int:
        return sum(abs(scale_error(a, b)) <= SCALE_BOUND for a, b in ps)

    def flat(ps: list[tuple[Prediction, Prediction]]) -> int:  # the baseline: per-GPU throughput unchanged
        return sum(abs(1 / scale_ratios(a, b)[0] - 1) <= SCALE_BOUND for a, b in ps)

    errors = [scale_error(a, b) for a, b in pairs]
    held_out = [(a, b) for a, b in pairs if not in_sample(a.row) and not in_sample(b.row)]
    moe = [(a, b) for a, b in pairs if model_of(a.row).moe]
    moved = [(a, b) for a, b in pairs if abs(scale_ratios(a, b)[0] - 1) > SCALE_BOUND]
    strong, weak = scaling_kind(pairs, "strong"), scaling_kind(pairs, "weak")
    apart = [(a, b) for a, b in pairs if _open_fields(a) != _open_fields(b)]
    return {"pairs": len(pairs), "runs": len(_runs(pairs)),
            "within_5pct": within(pairs), "flat_within_5pct": flat(pairs),
            "median_abs_pct": round(100 * median(abs(e) for e in errors), 1),
            "median_signed_pct": round(100 * median(errors), 1),
            "held_out": len(held_out), "held_out_within_5pct": within(held_out),
            "dense": len(pairs) - len(moe), "dense_within_5pct": within(pairs) - within(moe),
            "moe": len(moe), "moe_within_5pct": within(moe),
            "moved": len(moved), "moved_same_way": sum((r[1] - 1) * (r[0] - 1) > 0
                                                       for r in (scale_ratios(a, b) for a, b in moved)),
            "moved_within_5pct": within(moved),
            "strong": len(strong), "strong_within_5pct": within(strong), "strong_flat_within_5pct": flat(strong),
            "weak": len(weak), "weak_within_5pct": within(weak), "weak_flat_within_5pct": flat(weak),
            "searched_apart": len(apart), "searched_apart_within_5pct": within(apart)}


def _open_fields(p: Prediction) -> tuple:
    """The priced choice but its DP degree: a row's fields that its source leaves open (not in `fixed`) are searched
    row by row, so two rows of one run may be priced at different schedules, micro-batches or recomputation."""
    c = p.plan.choice
    return (c.tp, c.cp, c.pp, c.ep, c.etp, c.micro_batch, c.schedule, c.virtual_stages, c.recompute,
            c.recompute_layers, c.zero_stage, c.sequence_parallel)


def scaling_kind(pairs: list[tuple[Prediction, Prediction]], kind: str) -> list[tuple[Prediction, Prediction]]:
    """The pairs of one kind of scaling: "strong", the global batch the same at both GPU counts (each GPU's share of a
    step shrinks), or "weak", the global batch grown in proportion to the GPU count (each GPU's share the same); the
    pairs whose batch changed otherwise are neither.  A reading of the scale pairs added after their first scoring
    (fifty-seventh round): it splits the figure, it selects nothing."""
    if kind == "strong":
        return [(a, b) for a, b in pairs if int(a.row["global_batch"]) == int(b.row["global_batch"])]
    if kind == "weak":
        return [(a, b) for a, b in pairs
                if int(b.row["global_batch"]) * int(a.row["gpus"]) == int(a.row["global_batch"]) * int(b.row["gpus"])]
    raise ValueError(f"scaling kind {kind!r}: choose strong or weak")


def _runs(pairs: list[tuple[Prediction, Prediction]]) -> list[frozenset[str]]:
    """The runs the pairs come from: the rows linked by a pair, as sets of row names."""
    runs: list[set[str]] = []
    for a, b in pairs:
        names = {a.row["name"], b.row["name"]}
        touching = [r for r in runs if r & names]
        for r in touching:
            runs.remove(r)
            names |= r
        runs.append(names)
    return [frozenset(r) for r in runs]


def scale_line(preds: list[Prediction]) -> str:
    """The summary line of `scale_stats` (the table's last line, docs/planner.md section 9)."""
    s = scale_stats(preds)
    if s is None:
        return ""
    return (f"scale pairs (one run at two GPU counts {SCALE_FACTOR}x or more apart, its layout alike): {s['pairs']} "
            f"pairs of {s['runs']} runs; per-GPU scaling predicted within ±{SCALE_BOUND:.0%} in {s['within_5pct']} "
            f"(held flat: {s['flat_within_5pct']}), median |error| {s['median_abs_pct']}%, signed "
            f"{s['median_signed_pct']:+}%; held out {s['held_out']} ({s['held_out_within_5pct']}); dense "
            f"{s['dense']} ({s['dense_within_5pct']}), mixtures of experts {s['moe']} ({s['moe_within_5pct']}); "
            f"measured to move more than {SCALE_BOUND:.0%}: {s['moved']}, predicted the same way in "
            f"{s['moved_same_way']}, within ±{SCALE_BOUND:.0%} in {s['moved_within_5pct']}; the global batch fixed "
            f"(strong scaling): {s['strong']} ({s['strong_within_5pct']}; flat {s['strong_flat_within_5pct']}), grown "
            f"with the GPUs (weak): {s['weak']} ({s['weak_within_5pct']}; flat {s['weak_flat_within_5pct']}); "
            f"priced at different searched settings: {s['searched_apart']} ({s['searched_apart_within_5pct']})")


# ---- precision pairs: one run published in two precisions (issue 12's fifty-seventh round) ----------------------
#
# A team choosing whether to train in FP8 reads the speed-up off two plans.  Two rows are a *precision pair* when they
# are one run in two precisions: one source document, every field equal but the row's own words, `dtype` and the
# fields only a precision has (those whose name starts with "fp8" or "nvfp4"), the same `fixed` layout.  Each pair is
# (higher precision, lower: bf16/fp16 > fp8 > nvfp4); every metric of the set counts the same work per token in either
# precision, so the ratio of the per-GPU figures is the speed-up.  A pair's error is the predicted speed-up over the
# published, less one (positive: the planner expects more of the lower precision than was measured), bound ±5 % as the
# scale pairs', beside two baselines: no gain, and the GPU's peak ratio.  Written to a decision file before the first
# pair was scored; nothing is set from it.
PRECISION_RANK = {"bf16": 0, "fp16": 0, "fp8": 1, "nvfp4": 2}
_PRECISION_ONLY = ("fp8", "nvfp4")


def precision_pairs(preds: list[Prediction]) -> list[tuple[Prediction, Prediction]]:
    """The precision pairs among `preds`, each as (higher precision, lower)."""
    def precision_field(k: str) -> bool:
        return k in _NOT_INPUTS or k == "dtype" or k.startswith(_PRECISION_ONLY)

    out = []
    for group in _grouped(preds, lambda p: _run_key(p, precision_field)):
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                ra, rb = (PRECISION_RANK[str(p.row.get("dtype", "bf16"))] for p in (a, b))
                if ra != rb:
                    out.append((a, b) if ra < rb else (b, a))
    return out


def precision_ratios(higher: Prediction, lower: Prediction) -> tuple[float, float]:
    """(published, predicted) speed-up of the lower precision: its per-GPU figure over the higher's."""
    return float(lower.row["published"]) / float(higher.row["published"]), lower.value / higher.value


def precision_error(higher: Prediction, lower: Prediction) -> float:
    """The predicted speed-up over the published, less one."""
    published, predicted = precision_ratios(higher, lower)
    return predicted / published - 1.0


def precision_kind(higher: Prediction, lower: Prediction) -> str:
    """A pair's GPU and precisions, and whether a mixture of experts (another part of the model, scored apart as the
    evidence is): "h100-sxm bf16→fp8", "gb200 bf16→fp8 moe"."""
    return (f"{higher.row['gpu']} {higher.row.get('dtype', 'bf16')}→{lower.row.get('dtype', 'bf16')}"
            + (" moe" if model_of(higher.row).moe else ""))


def peak_ratio(higher: Prediction, lower: Prediction) -> float:
    """The GPU's dense peak in the lower precision over its peak in the higher (the catalogue's, as the rows price)."""
    hi, lo = cluster_of(higher.row), cluster_of(lower.row)
    return lo.device.peak(lo.precision) / hi.device.peak(hi.precision)


def precision_stats(preds: list[Prediction]) -> dict[str, Any] | None:
    """`precision_pairs` summed up: pairs; within SCALE_BOUND, and the two baselines' (no gain; the GPU's peak ratio,
    `peak_ratio`); median |error| and signed;
    the held-out pairs (neither row in sample); and per GPU and precisions (`precision_kind`) the pairs, within and the
    median signed error.  None without pairs."""
    pairs = precision_pairs(preds)
    if not pairs:
        return None
    errors = [precision_error(a, b) for a, b in pairs]
    held = [e for (a, b), e in zip(pairs, errors) if not in_sample(a.row) and not in_sample(b.row)]
    by_kind: dict[str, list[float]] = {}
    for (a, b), e in zip(pairs, errors):
        by_kind.setdefault(precision_kind(a, b), []).append(e)
    out: dict[str, Any] = {"pairs": len(pairs), "within_5pct": sum(abs(e) <= SCALE_BOUND for e in errors),
           "no_gain_within_5pct": sum(abs(1 / precision_ratios(a, b)[0] - 1) <= SCALE_BOUND for a, b in pairs),
           "peak_within_5pct": sum(abs(peak_ratio(a, b) / precision_ratios(a, b)[0] - 1) <= SCALE_BOUND
                                   for a, b in pairs),
           "median_abs_pct": round(100 * median(abs(e) for e in errors), 1),
           "median_signed_pct": round(100 * median(errors), 1),
           "held_out": len(held), "held_out_within_5pct": sum(abs(e) <= SCALE_BOUND for e in held),
           "by_kind": {k: {"pairs": len(es), "within_5pct": sum(abs(e) <= SCALE_BOUND for e in es),
                           "median_signed_pct": round(100 * median(es), 1)} for k, es in sorted(by_kind.items())}}
    return out


def precision_line(preds: list[Prediction]) -> str:
    """The summary line of `precision_stats` (the table's last line, docs/planner.md section 9)."""
    s = precision_stats(preds)
    if s is None:
        return ""
    kinds = "; ".join(f"{k} {v['pairs']} ({v['within_5pct']}, {v['median_signed_pct']:+}%)" for k, v in s["by_kind"].items())
    return (f"precision pairs (one run in two precisions, its layout alike): {s['pairs']}; the speed-up predicted within "
            f"±{SCALE_BOUND:.0%} in {s['within_5pct']} (no gain: {s['no_gain_within_5pct']}, the peak ratio {s['peak_within_5pct']}), median |error| "
            f"{s['median_abs_pct']}%, signed {s['median_signed_pct']:+}%; held out {s['held_out']} "
            f"({s['held_out_within_5pct']}); by GPU: {kinds}")
