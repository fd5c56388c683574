"""Which validation rows set a fitted constant (in sample) and the fits themselves: the step share, the sustained
GEMM ratios (H100, GH200, GB300), PyTorch FSDP's cost per wrapped unit and the MoE host floor, each re-derived from
its declared calibration rows by bisection on their mean error (`python -m par3d.plan.validation --fit`,
`--fit-moe-host`).  Every other row is held out (docs/planner.md section 9).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import cache
from typing import Any

from .gemm_table import family_of
from .hardware import attn_sustain_of
from .validation import DEFAULT_BOUND, cluster_of, host_floored, model_of, predict_on, rows

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


def predictions_at_step_share(share: float, every: list[dict[str, Any]] | None = None) -> list[Any]:
    """Every row (or `every`) priced with the step share at `share`, every other constant at its stored value: how far
    a figure leans on the step share (the scale pairs' sensitivity, docs/planner.md section 9)."""
    from . import compute

    gemm_share, attn_sustain = step_share_pricing(share)
    out = []
    for r in rows() if every is None else every:
        cl = cluster_of(r)
        family = family_of(str(r["gpu"]))
        dev = replace(cl.device, gemm={**cl.device.gemm, cl.dtype: gemm_share(family, cl.dtype)},
                      attn_sustain=attn_sustain(family))
        out.append(predict_on(r, replace(cl, device=dev)))
    compute.layer_times.cache_clear()
    return out


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
LLMFOUNDRY_PREFIX = "llmfoundry-mpt-"  # llm-foundry's large-scale H100 table: FSDP_UNIT_S's calibration rows
# its NVFP4 rows (Llama 3 70B, 3.1 405B; twenty-seventh round): in sample -- the rule carrying NVFP4's measured GEMM
# speed from the B300 to the other Blackwell parts was chosen after they were priced (gemm_table.NVFP4_OVER_BF16)
MBRIDGE_NVFP4_PREFIX = "mbridge-nvfp4-"
