"""The validation set's report: the per-row table, the summary by source (in sample, held out, each large source on
its line), the by-GPU reading, `--json`'s object and the software tables -- what docs/planner.md section 9 quotes.
"""

from __future__ import annotations

import json
from statistics import median
from typing import Any

from .calibration import DGXC_PREFIX, in_sample
from .evidence import NOT_A_GPU, SOFTWARE_KEYS, evidence, evidence_key, software_figures
from .frameworks import FRAMEWORKS
from .validation import (
    DEFAULT_BOUND,
    DESCRIBED,
    SOFTWARE_FIELDS,
    Prediction,
    framework_of,
    layout_of,
    megatron_row,
    model_of,
    predict_named,
    predict_or_none,
    predict_undescribed,
)
from .validation_runs import (
    ORDER_MARGIN,
    SCALE_BOUND,
    layout_pairs,
    layout_picks,
    ordering,
    pick_stats,
    precision_line,
    precision_stats,
    repeat_stats,
    repeats_line,
    scale_error,
    scale_line,
    scale_pairs,
    scale_ratios,
    scale_stats,
    source_document,
)


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
            moved[name] = predict_or_none(stripped)
        if not moved:
            continue
        errs = [abs(q.error) for n, q in ((n, moved.get(n, base[n])) for n in base) if q is not None]
        out.append({"field": field, "rows": len(moved), "no_plan": sum(q is None for q in moved.values()),
                    "within_10pct": sum(e <= DEFAULT_BOUND for e in errs),
                    "median_abs_error_pct": round(100 * median(errs), 1)})
    return out


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
    stats = pick_stats(preds)
    if stats:
        runs, fastest, med, mean, top = stats
        lines.append(f"runs measured at three or more layouts: {runs}; the planner's pick the measured fastest in "
                     f"{fastest}, its regret median {med:.1%}, mean {mean:.1%}, max {top:.1%}")
    repeats = repeats_line(preds)
    if repeats:
        lines.append(repeats)
    scaling = scale_line(preds)
    if scaling:
        lines.append(scaling)
    precision = precision_line(preds)
    if precision:
        lines.append(precision)
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
                       "scaling": scaling_json(preds),
                       "precision": precision_stats(preds) or {},
                       "by_gpu": evidence(preds)}, indent=1, ensure_ascii=False)


def scaling_json(preds: list[Prediction]) -> dict[str, Any]:
    """`--json`'s `scaling` (and `--scaling --json`): `scale_stats` and every pair scored, its two ratios and error."""
    pairs = []
    for a, b in scale_pairs(preds):
        published, predicted = scale_ratios(a, b)
        pairs.append({"fewer": a.row["name"], "more": b.row["name"], "published_ratio": round(published, 4),
                      "predicted_ratio": round(predicted, 4), "error_pct": round(100 * scale_error(a, b), 2)})
    return {**(scale_stats(preds) or {}), "pairs_scored": pairs}


def by_gpu(preds: list[Prediction]) -> str:
    """The set read by GPU and dtype (fp16 counted with bf16), the way `par3d plan` quotes its evidence: rows, how
    many set a constant (in sample), how many are within ±10 %, and the signed errors' lowest, median and highest
    -- the answer to "how far off has this model been on my GPU?"."""
    ev = evidence(preds)
    ins: dict[str, int] = {}
    for p in preds:
        if in_sample(p.row):
            key = evidence_key(str(p.row["gpu"]), str(p.row.get("dtype", "bf16")), model_of(p.row).moe)
            ins[key] = ins.get(key, 0) + 1
    out = ["| GPU / dtype | rows | in sample | within ±10 % | median error | lowest … highest |",
           "|---|---:|---:|---:|---:|---|"]
    for key, e in sorted((k, v) for k, v in ev.items() if not k.startswith(NOT_A_GPU)):
        out.append(f"| {key} | {e['rows']} | {ins.get(key, 0)} | {e['within_10pct']} | {e['median_error_pct']:+.1f} % "
                   f"| {e['min_error_pct']:+.1f} … {e['max_error_pct']:+.1f} % |")
    return "\n".join(out)


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


def scale_table(preds: list[Prediction]) -> str:
    """The scale pairs (validation_runs.scale_pairs) by source document: pairs, how many the planner's per-GPU scaling
    meets within ±5 % and how many the flat baseline does (per-GPU throughput unchanged), and the pairs' signed
    errors -- where the planner reads scale well and where it does not (docs/planner.md section 9)."""
    by_doc: dict[str, list[tuple[Prediction, Prediction]]] = {}
    for a, b in scale_pairs(preds):
        by_doc.setdefault(source_document(str(a.row["source"])), []).append((a, b))
    out = [f"| source | pairs | GPU counts | within ±{SCALE_BOUND:.0%} | held flat, within | median error | "
           "lowest … highest |", "|---|---:|---|---:|---:|---:|---|"]
    for doc, pairs in sorted(by_doc.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        errors = sorted(scale_error(a, b) for a, b in pairs)
        gpus = sorted({int(p.row["gpus"]) for pair in pairs for p in pair})
        flat = sum(abs(1 / scale_ratios(a, b)[0] - 1) <= SCALE_BOUND for a, b in pairs)
        out.append(f"| {doc} | {len(pairs)} | {gpus[0]:,}–{gpus[-1]:,} | "
                   f"{sum(abs(e) <= SCALE_BOUND for e in errors)} | {flat} | {100 * median(errors):+.1f} % | "
                   f"{100 * errors[0]:+.1f} … {100 * errors[-1]:+.1f} % |")
    return "\n".join(out)
