"""Validation rows grouped into runs: layout pairs and picks (one run measured at several layouts -- does the
planner order and choose them as measured?) and repeats (one run published more than once at inputs its rows state
alike -- how far the sources scatter on their own).
"""

from __future__ import annotations

import json
from statistics import median
from typing import Any

from .validation import DEFAULT_BOUND, Prediction

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
