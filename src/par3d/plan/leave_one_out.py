"""Each fitted constant, refitted without each of its calibration rows in turn (issue 12's forty-fifth round).

Six kinds of constant in the planner are fitted to declared rows of the validation set (validation.py's header
comment names them): the step share (Narayanan et al. 2021 Table 1), the H100's, GH200's and GB300's sustained GEMM
ratios (dgxc-benchmarking's, OpenEuroLLM's, Megatron-Bridge 25.11's rows), PyTorch FSDP's unit cost (llm-foundry's
table) and the MoE host floor (Megatron-Bridge 26.04's MoE rows).  Those rows are in sample: their error says how
well a constant fits, not how well the model predicts.  Here each such row is priced once more with its constant
refitted, by the constant's own declared procedure, on the other calibration rows only -- the row's leave-one-out
error, a prediction of a row the constant never saw.  The other constants stay at their stored values (each fit
holds the constants fitted before it fixed, as `--fit` does).

Megatron-Bridge's 18 NVFP4 rows are in sample by a choice (the rule that prices NVFP4, chosen after they were
priced: gemm_table.py), not by a fit, so there is nothing to refit; they are counted apart.

Leaving a row out keeps its source's other rows in the fit; `source_swap` asks what another source would have given
the H100's ratios (its comment states the rule).

`python -m par3d.plan.validation --leave-one-out` refits (about a minute on two cores), writes
`leave_one_out.json` beside this file and prints the table docs/planner.md section 9 quotes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from statistics import median
from typing import Any

from . import compute, gemm_table
from . import validation as v
from .hardware import FSDP_UNIT_S, MOE_HOST_S

PATH = os.path.join(os.path.dirname(__file__), "leave_one_out.json")


@dataclass(frozen=True)
class Constant:
    """One fitted constant: its name, stored value, calibration rows, its fit on any subset of them, and the signed
    error of one row priced with a given value of it."""
    name: str
    stored: float | tuple[float, float]
    cal: Callable[[], list[dict[str, Any]]]
    fit: Callable[[list[dict[str, Any]]], Any]
    error: Callable[[Any, dict[str, Any]], float]


def _sustained(family: str, dtype: str) -> Constant:
    def error(ratio: float, row: dict[str, Any]) -> float:
        return v._mean_error_at([row], *v.sustained_pricing(family, dtype, ratio))

    shared = family in gemm_table.SHARED_SUSTAINED
    return Constant(f"{family} sustained ratio" + ("" if shared else f" ({dtype})"),
                    gemm_table.FITTED_SUSTAINED[(family, dtype)],
                    lambda: v.sustained_cal_rows(family, dtype),
                    lambda cal: v.fit_sustained(family, dtype, cal=cal), error)


def _moe_error(host: tuple[float, float], row: dict[str, Any]) -> float:
    return v._predict_on(row, replace(v.cluster_of(row), moe_host_s=tuple(host))).error


def constants() -> list[Constant]:
    """Every fitted constant, in the order `--fit` derives them (a later fit holds the earlier ones fixed)."""
    out = [Constant("step share", gemm_table.STEP_SHARE, v.step_share_rows,
                    lambda cal: v.fit_step_share(cal=cal),
                    lambda share, row: v._mean_error_at([row], *v.step_share_pricing(share)))]
    for family, dtype in sorted(gemm_table.FITTED_SUSTAINED):
        if family in gemm_table.SHARED_SUSTAINED and dtype != "bf16":
            continue  # one ratio for every dtype: fitted once
        out.append(_sustained(family, dtype))
    out.append(Constant("FSDP unit cost (s)", FSDP_UNIT_S, v.fsdp_rows, lambda cal: v.fit_fsdp_unit(cal=cal),
                        lambda unit, row: v.fsdp_mean_error(unit, [row])))
    out.append(Constant("MoE host floor (s, s per routed expert)", MOE_HOST_S,
                        lambda: [r for r in v.moe_host_rows() if v.host_floored(r)],
                        lambda cal: v.fit_moe_host(cal), _moe_error))
    return out


@dataclass(frozen=True)
class LeftOut:
    constant: str
    row: str
    stored: float | tuple[float, float]  # the constant as stored (fitted on every calibration row)
    refit: float | tuple[float, float]  # refitted without this row
    in_sample_error: float  # the row's signed error with the stored constant
    left_out_error: float  # with the refitted one: a prediction of a row the constant never saw


def left_out(const: Constant, progress: Callable[[str], None] | None = None) -> list[LeftOut]:
    """Each calibration row of `const` priced with the constant as stored and refitted without that row."""
    cal = const.cal()
    out = []
    for i, row in enumerate(cal):
        if progress is not None:
            progress(f"{const.name}: {i + 1}/{len(cal)} {row['name']}")
        refit = const.fit(cal[:i] + cal[i + 1:])
        refit = tuple(refit) if isinstance(refit, (tuple, list)) else float(refit)
        out.append(LeftOut(const.name, str(row["name"]), const.stored, refit,
                           const.error(const.stored, row), const.error(refit, row)))
    compute.layer_times.cache_clear()
    return out


def _stats(errors: list[float]) -> dict[str, float | int]:
    return {"rows": len(errors), "within_10pct": sum(abs(e) <= v.DEFAULT_BOUND for e in errors),
            "median_abs_error_pct": round(100 * median(abs(e) for e in errors), 2) if errors else 0.0}


def summarise(results: list[LeftOut]) -> dict[str, Any]:
    """Per constant and over every refitted row: rows, within ±10 % and median |error|, in sample and left out."""
    per: dict[str, Any] = {}
    for name in dict.fromkeys(r.constant for r in results):
        mine = [r for r in results if r.constant == name]
        vals = [r.refit for r in mine]
        lo = tuple(map(min, zip(*vals))) if isinstance(vals[0], tuple) else min(vals)  # per component
        hi = tuple(map(max, zip(*vals))) if isinstance(vals[0], tuple) else max(vals)
        per[name] = {"stored": _round(mine[0].stored), "refit_min": _round(lo), "refit_max": _round(hi),
                     "in_sample": _stats([r.in_sample_error for r in mine]),
                     "left_out": _stats([r.left_out_error for r in mine])}
    nvfp4 = [r for r in v.rows() if str(r["name"]).startswith(v.MBRIDGE_NVFP4_PREFIX)]
    return {"constants": per,
            "all": {"in_sample": _stats([r.in_sample_error for r in results]),
                    "left_out": _stats([r.left_out_error for r in results])},
            "not_refitted": {"rows": len(nvfp4), "why": "Megatron-Bridge's NVFP4 rows: in sample by the choice of "
                             "NVFP4's pricing rule (gemm_table.py), not by a fitted constant"}}


# ---- the H100's ratios fitted on another source --------------------------------------------------------------------
#
# Leaving one row out keeps the row's source in the fit.  What a different *source* would have given: the H100's
# sustained ratio of each dtype refitted, by the same procedure, on all the dense held-out H100 rows of one other
# source of that dtype (a source: the rows' common name prefix up to the first "-", so MLPerf's rounds are one
# source), and the other dense held-out H100 rows of that dtype -- from neither that source nor the stored
# calibration's (dgxc-benchmarking's other columns are left out of the score too, so neither fit has seen a scored
# row's source) -- scored with it and with the stored ratio.  A refit at the bisection's upper end (1.0: the GEMMs
# at their burst rate) is a source the ratio cannot reach, its rows slower than the model at any ratio.  The rule (every source with at least SWAP_MIN_ROWS such
# rows; dgxc-benchmarking, the stored calibration's own source, not a candidate) was fixed before it was first run.
SWAP_GPU = "h100-sxm"
SWAP_MIN_ROWS = 4


def _source(row: dict[str, Any]) -> str:
    return str(row["name"]).split("-")[0]


def swap_pool(dtype: str) -> list[dict[str, Any]]:
    """The dense held-out H100 rows of `dtype` (fp16 counted with bf16)."""
    def dt(r: dict[str, Any]) -> str:
        d = str(r.get("dtype", "bf16"))
        return "bf16" if d == "fp16" else d
    return [r for r in v.rows() if r["gpu"] == SWAP_GPU and not v.in_sample(r) and dt(r) == dtype
            and not v.model_of(r).moe]


def source_swap_entries(dtype: str, only: list[str] | None = None,
                        progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """`source_swap`'s entries of one dtype (of the sources in `only` where given)."""
    out = []
    pool = swap_pool(dtype)
    stored_ratio = gemm_table.FITTED_SUSTAINED[("h100", dtype)]
    cal_source = {_source(r) for r in v.sustained_cal_rows("h100", dtype)}
    for src in sorted({_source(r) for r in pool} - cal_source):
        cal = [r for r in pool if _source(r) == src]
        if len(cal) < SWAP_MIN_ROWS or (only is not None and src not in only):
            continue
        if progress is not None:
            progress(f"h100 {dtype} on {src}'s {len(cal)} rows")
        ratio = v.fit_sustained("h100", dtype, cal=cal)
        others = [r for r in pool if _source(r) != src and _source(r) not in cal_source]
        before = [v._mean_error_at([r], *v.sustained_pricing("h100", dtype, stored_ratio)) for r in others]
        after = [v._mean_error_at([r], *v.sustained_pricing("h100", dtype, ratio)) for r in others]
        compute.layer_times.cache_clear()
        out.append({"dtype": dtype, "source": src, "rows": len(cal), "stored": stored_ratio,
                    "refit": round(ratio, 7), "at_bound": ratio > 1.0 - 1e-4, "scored": _stats(before),
                    "with_refit": _stats(after)})
    return out


def source_swap(progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """For each dtype of the H100's fitted ratios and each qualifying other source: the refitted ratio, and the
    other held-out rows' within ±10 % and median |error| with the stored ratio and with the refit."""
    return [e for dtype in ("bf16", "fp8") for e in source_swap_entries(dtype, progress=progress)]


def run(progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every constant's leave-one-out rows, their summary and the H100 source swap (what leave_one_out.json holds)."""
    results = [r for c in constants() for r in left_out(c, progress)]
    return {"rows": [_row_json(r) for r in results], "summary": summarise(results),
            "source_swap": source_swap(progress)}


def swap_table(data: dict[str, Any]) -> str:
    """The markdown table of the H100 source swap (docs/planner.md section 9)."""
    out = ["| H100 ratio | fitted instead on | its rows | ratio (stored) | the other held-out H100 rows | within ±10 % "
           "(median), stored ratio | with the refit |", "|---|---|---:|---|---:|---:|---:|"]
    for s in data["source_swap"]:
        a, b = s["scored"], s["with_refit"]
        out.append(f"| {s['dtype'].upper()} | {s['source']} | {s['rows']} | {s['refit']:.4f}{' (bound)' if s['at_bound'] else ''} "
                   f"({s['stored']:.4f}) "
                   f"| {a['rows']} | {a['within_10pct']} ({a['median_abs_error_pct']:.1f} %) "
                   f"| {b['within_10pct']} ({b['median_abs_error_pct']:.1f} %) |")
    return "\n".join(out)


def _round(x: float | tuple[float, float]) -> float | list[float]:
    return [round(a, 7) for a in x] if isinstance(x, tuple) else round(x, 7)


def _row_json(r: LeftOut) -> dict[str, Any]:
    d = asdict(r)
    for k in ("stored", "refit"):
        d[k] = _round(getattr(r, k))
    for k in ("in_sample_error", "left_out_error"):
        d[k] = round(100 * getattr(r, k), 2)  # percent
    return d


def to_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, default=_round) + "\n"


def stored() -> dict[str, Any]:
    """leave_one_out.json as committed."""
    with open(PATH, encoding="utf-8") as fh:
        return json.load(fh)


def _fmt(x: Any) -> str:
    if isinstance(x, (list, tuple)):
        return "(" + ", ".join(f"{a * 1e3:.2f} ms" for a in x) + ")"
    return f"{x * 1e3:.2f} ms" if x < 0.1 else f"{x:.4f}"


def table(data: dict[str, Any]) -> str:
    """The markdown table docs/planner.md section 9 quotes: per constant, its stored value, the range of its
    refits, and its rows within ±10 % (median |error|) in sample and left out."""
    out = ["| fitted constant | rows | stored | refitted without one row | in sample: within ±10 % (median) "
           "| left out: within ±10 % (median) |", "|---|---:|---|---|---:|---:|"]
    for name, c in data["summary"]["constants"].items():
        i, o = c["in_sample"], c["left_out"]
        out.append(f"| {name} | {i['rows']} | {_fmt(c['stored'])} | {_fmt(c['refit_min'])} … {_fmt(c['refit_max'])} "
                   f"| {i['within_10pct']} ({i['median_abs_error_pct']:.1f} %) "
                   f"| {o['within_10pct']} ({o['median_abs_error_pct']:.1f} %) |")
    a = data["summary"]["all"]
    i, o = a["in_sample"], a["left_out"]
    out.append(f"| **all** | {i['rows']} | | | {i['within_10pct']} ({i['median_abs_error_pct']:.1f} %) "
               f"| {o['within_10pct']} ({o['median_abs_error_pct']:.1f} %) |")
    return "\n".join(out)
