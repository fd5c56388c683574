"""Each fitted constant, refitted without each of its calibration rows in turn (issue 12's forty-fifth round).

Six kinds of constant in the planner are fitted to declared rows of the validation set (calibration.py's header
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
the H100's and GH200's ratios, FSDP's unit cost and the step share on the A100's rows (its comment states the rule).

`python -m par3d.plan.validation --leave-one-out` refits (about two minutes on two cores), writes
`leave_one_out.json` beside this file and prints the table docs/planner.md section 9 quotes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from statistics import median
from typing import Any

from . import calibration, compute, evidence, gemm_table
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
        return calibration.mean_error_at([row], *calibration.sustained_pricing(family, dtype, ratio))

    shared = family in gemm_table.SHARED_SUSTAINED
    return Constant(f"{family} sustained ratio" + ("" if shared else f" ({dtype})"),
                    gemm_table.FITTED_SUSTAINED[(family, dtype)],
                    lambda: calibration.sustained_cal_rows(family, dtype),
                    lambda cal: calibration.fit_sustained(family, dtype, cal=cal), error)


def _fsdp_unit() -> Constant:
    return Constant("FSDP unit cost (s)", FSDP_UNIT_S, calibration.fsdp_rows, lambda cal: calibration.fit_fsdp_unit(cal=cal),
                    lambda unit, row: calibration.fsdp_mean_error(unit, [row]))


def _moe_error(host: tuple[float, float], row: dict[str, Any]) -> float:
    return v.predict_on(row, replace(v.cluster_of(row), moe_host_s=tuple(host))).error


def _step_share() -> Constant:
    return Constant("step share", gemm_table.STEP_SHARE, calibration.step_share_rows,
                    lambda cal: calibration.fit_step_share(cal=cal),
                    lambda share, row: calibration.mean_error_at([row], *calibration.step_share_pricing(share)))


def constants() -> list[Constant]:
    """Every fitted constant, in the order `--fit` derives them (a later fit holds the earlier ones fixed)."""
    out = [_step_share()]
    for family, dtype in sorted(gemm_table.FITTED_SUSTAINED):
        if family in gemm_table.SHARED_SUSTAINED and dtype != "bf16":
            continue  # one ratio for every dtype: fitted once
        out.append(_sustained(family, dtype))
    out.append(_fsdp_unit())
    out.append(Constant("MoE host floor (s, s per routed expert)", MOE_HOST_S,
                        lambda: [r for r in calibration.moe_host_rows() if v.host_floored(r)],
                        lambda cal: calibration.fit_moe_host(cal), _moe_error))
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
    nvfp4 = [r for r in v.rows() if str(r["name"]).startswith(calibration.MBRIDGE_NVFP4_PREFIX)]
    return {"constants": per,
            "all": {"in_sample": _stats([r.in_sample_error for r in results]),
                    "left_out": _stats([r.left_out_error for r in results])},
            "not_refitted": {"rows": len(nvfp4), "why": "Megatron-Bridge's NVFP4 rows: in sample by the choice of "
                             "NVFP4's pricing rule (gemm_table.py), not by a fitted constant"}}


# ---- constants fitted on another source ----------------------------------------------------------------------------
#
# Leaving one row out keeps the row's source in the fit.  What a different *source* would have given: a constant
# refitted, by its own procedure, on all the held-out rows of one other source in its pool (a source: the rows' common
# name prefix up to the first "-", so MLPerf's rounds are one source), and the pool's other rows -- from neither that
# source nor the stored calibration's (the stored source's other rows are left out of the score too, so neither fit
# has seen a scored row's source) -- scored with it and with the stored value.  The pools: the H100's and the GH200's
# sustained ratio of each dtype, the dense held-out rows of that GPU and dtype; FSDP's unit cost, the held-out rows
# that ran PyTorch FSDP; the step share (fifty-sixth round, by the same rule, written down before its first run), the
# A100's dense held-out rows.  A refit at an end of its bisection's range (a ratio of 1.0: GEMMs at their burst rate;
# a unit cost of 0 or 30 ms; a step share of 0.8 or 1.1) is a source the constant cannot meet.  The rule (every source
# with at least SWAP_MIN_ROWS rows in the pool; the stored calibration's own source not a candidate; none whose swap
# leaves no row to score) was fixed before it was first run -- for the H100 ratios; the GH200's and FSDP's were added
# by the same rule after the H100's had been read (the GH200's pool leaves nothing to score: its only other source is
# Apertus).
SWAP_MIN_ROWS = 4


def _source(row: dict[str, Any]) -> str:
    return str(row["name"]).split("-")[0]


@dataclass(frozen=True)
class Swap:
    """A fitted constant whose calibration source can be swapped: its label in the table, the constant (stored value,
    calibration rows, fit, one row's error), the held-out rows that may calibrate or score it, and the ends of its
    fit's range."""
    name: str
    const: Constant
    pool: Callable[[], list[dict[str, Any]]]
    ends: tuple[float, float]

    @property
    def cal(self) -> Callable[[], list[dict[str, Any]]]:
        return self.const.cal


def _dense_held_out(family: str, dtype: str | None = None) -> Callable[[], list[dict[str, Any]]]:
    """A swap's pool: the dense held-out rows of a GPU family (of one dtype as the evidence counts it, where given)."""
    def pool() -> list[dict[str, Any]]:
        return [r for r in v.rows() if gemm_table.family_of(str(r["gpu"])) == family and not calibration.in_sample(r)
                and (dtype is None or evidence.evidence_dtype(str(r.get("dtype", "bf16"))) == dtype)
                and not v.model_of(r).moe]

    return pool


def _ratio_swap(family: str, dtype: str) -> Swap:
    return Swap(f"{family.upper()} {dtype.upper()} ratio", _sustained(family, dtype), _dense_held_out(family, dtype),
                (0.3, 1.0))


def _step_share_swap() -> Swap:
    """The step share, swapped among the A100's sources (issue 12's fifty-sixth round, by the same rule): its stored
    calibration is Narayanan et al.'s Megatron-LM runs, and the A100 is where it alone sets the GEMM rate (the other
    fitted GPUs' ratios absorb it), so the pool is the A100's dense held-out rows, 40 and 80 GB, every dtype."""
    return Swap("A100 step share", _step_share(), _dense_held_out("a100"), (0.8, 1.1))


def swaps() -> list[Swap]:
    fsdp = Swap("FSDP unit cost", _fsdp_unit(),
                lambda: [r for r in v.rows() if r.get("fsdp") and not calibration.in_sample(r)], (0.0, 0.03))
    return [_ratio_swap("h100", "bf16"), _ratio_swap("h100", "fp8"), _ratio_swap("gh200", "bf16"),
            _ratio_swap("gh200", "fp8"), fsdp, _step_share_swap()]


def swap_entries(sw: Swap, only: list[str] | None = None,
                 progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """`source_swap`'s entries of one constant (of the sources in `only` where given)."""
    out = []
    pool = sw.pool()
    cal_source = {_source(r) for r in sw.cal()}
    stored: dict[str, float] = {}  # each pool row's error at the stored value, priced once for every candidate
    for src in sorted({_source(r) for r in pool} - cal_source):
        cal = [r for r in pool if _source(r) == src]
        if len(cal) < SWAP_MIN_ROWS or (only is not None and src not in only):
            continue
        others = [r for r in pool if _source(r) != src and _source(r) not in cal_source]
        if not others:  # nothing left to score (the GH200's pool: Apertus and OpenEuroLLM's own other runs only)
            continue
        if progress is not None:
            progress(f"{sw.name} on {src}'s {len(cal)} rows")
        value = sw.const.fit(cal)
        for r in others:
            if r["name"] not in stored:
                stored[str(r["name"])] = sw.const.error(sw.const.stored, r)
        before = [stored[str(r["name"])] for r in others]
        after = [sw.const.error(value, r) for r in others]
        compute.layer_times.cache_clear()
        lo, hi = sw.ends
        out.append({"constant": sw.name, "source": src, "rows": len(cal), "stored": sw.const.stored,
                    "refit": round(value, 7), "at_bound": value < lo + 1e-4 or value > hi - 1e-4,
                    "scored": _stats(before), "with_refit": _stats(after)})
    return out


def source_swap(progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """For each swappable constant and each qualifying other source: the refit, and the pool's other rows' within
    ±10 % and median |error| with the stored value and with the refit."""
    return [e for sw in swaps() for e in swap_entries(sw, progress=progress)]


def run(progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every constant's leave-one-out rows, their summary and the source swap (what leave_one_out.json holds)."""
    results = [r for c in constants() for r in left_out(c, progress)]
    return {"rows": [_row_json(r) for r in results], "summary": summarise(results),
            "source_swap": source_swap(progress)}


def swap_table(data: dict[str, Any]) -> str:
    """The markdown table of the source swap (docs/planner.md section 9)."""
    out = ["| constant | fitted instead on | its rows | refit (stored) | the other held-out rows | within ±10 % "
           "(median), stored | with the refit |", "|---|---|---:|---|---:|---:|---:|"]
    for s in data["source_swap"]:
        a, b = s["scored"], s["with_refit"]
        bound = " (bound)" if s["at_bound"] else ""
        out.append(f"| {s['constant']} | {s['source']} | {s['rows']} | {_fmt(s['refit'])}{bound} ({_fmt(s['stored'])}) "
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
