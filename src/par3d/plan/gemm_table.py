"""Measured GEMM throughput per GPU and dtype: the data the kernel model (compute.py) runs on.

Every number has its source.  TFLOP/s are dense (no sparsity), 10^12 FLOP/s.

- `peak`: the vendor's dense tensor-core peak (datasheets: NVIDIA A100 Tensor Core GPU datasheet
  (312 BF16/FP16); H100 SXM5 datasheet (989 BF16/FP16, 1979 FP8); H200 datasheet (same compute as
  H100 SXM); B200 in the DGX B200 datasheet (2250 BF16/FP16, 4500 FP8 dense per GPU)).
- `mamf`: Maximum Achievable Matmul FLOPS, the best large aligned GEMM measured with cuBLAS through
  torch (`torch.mm`; FP8 through `torch._scaled_mm` with per-tensor scales and its default
  `use_fast_accum=False`, i.e. the split accumulator Transformer Engine uses for its dgrad and wgrad
  GEMMs) as a short burst at boost clock (S. Bekman, "Machine Learning Engineering",
  compute/accelerator/README.md, "Maximum Achievable and Sustainable Matmul FLOPS comparison table",
  2026 revision, mamf-finder v4): A100 SXM 267.9 BF16 (the earlier revision's figure, which the
  A100's fit below was made on); H100 SXM 795 BF16, 1403 FP8; H200 SXM 850 BF16, 1525 FP8;
  B200 SXM 1737 BF16, 3350 FP8.  GB200 (the B200 die at the GB200 NVL72's 1200 W, peaks 2500 BF16 /
  5000 FP8 per GPU: NVIDIA GB200 NVL72 specifications, per GPU as Bekman's TFLOPS table gives them):
  1822.0 BF16, 3615.6 FP8 (the table's 2026-08 revision, torch 2.10.0.dev, the only revision with a
  GB200 row; the same revision has B200 at 1745.0 / 3432.5, so GB200/B200 = 1.04 / 1.05, not the
  1.11 of the peaks).  FP16 runs the same tensor-core path as BF16 at the same peak, so it takes the
  BF16 entry.
  B300 and GB300 (Blackwell Ultra; issue 12's twenty-first round).  Peaks: 2250 BF16 / 4500 FP8 dense (B300,
  the DGX B300 datasheet) and 2500 / 5000 (GB300, NVIDIA GB300 NVL72 specifications), as Bekman's TFLOPS table
  lists them -- the same as the B200's and the GB200's: Blackwell Ultra adds FP4 and attention's exponentials,
  not BF16/FP8 tensor throughput.  MAMF: B300 SXM 1769.0 BF16, 3353.3 FP8 (the table's newest revision, ml-engineering
  744d01e, torch 2.9.1+cu130: "same as B200, newer torch/cuda").  GB300: no measurement; bridged from the B300 as the
  GB200 stands to the B200 in the same table (1822.0 / 1745.0 BF16, 3615.6 / 3432.5 FP8): 1769.0 × 1.0441 = 1847.0
  BF16, 3353.3 × 1.0533 = 3532.2 FP8 -- an assumption (the one pair measured in both packages says what the Grace
  package does to the same die's burst).
  GH200 (Grace Hopper; issue 12's twenty-second round): the H100's peaks, 989 BF16 / 1979 FP8 dense (NVIDIA GH200
  Grace Hopper Superchip specifications; Bekman's TFLOPS table lists them so); MAMF measured on a GH200 (the table's
  "900W 141GiB HBM3e version", torch 2.6.0+cu126): 828.6 BF16, 1535.0 FP8 -- above the H100's 795 / 1403 and the
  H200's 850 / 1525 burst at the same peak.  Both GH200 memory variants (96 GB HBM3, 144 GB HBM3e) take it.
  AMD Instinct (issue 12's twenty-sixth round).  Peaks: MI300X 1307.4 BF16/FP16, 2614.9 FP8 dense (AMD's CDNA3
  description, ROCm docs docs/conceptual/gpu-arch/mi300.md: 2048 / 4096 FLOPs per clock per CU × 304 CUs × 2100
  MHz); MI325X the same die and clock (AMD's MI325X footnote quoted in ROCm's "Understanding Peak and Max-Achievable
  FLOPS" blog: 1307.4 FP16 dense); MI355X 2500 / 5000 dense (Bekman's TFLOPS table, from AMD's MI355X page: CDNA4,
  256 CUs at 2400 MHz).  MAMF BF16 from Bekman's table (the cache-resetting revision the NVIDIA rows above come
  from): MI300X 668.4 (torch 2.5.1 + ROCm 6.3, TunableOp on; an earlier revision without the cache reset had 781.9
  on ROCm 6.2), MI325X 784.9 (torch 2.6.0 + ROCm 6.2.4), MI355X 1565.0 (torch 2.8.0 + ROCm 7.0.2).  FP8: the table
  has no AMD FP8 row.  MI300X 1159.2: Microsoft's Azure ND MI300X v5 benchmark guide (hipBLASLt, 8192³ FP8, the
  best of its shapes) -- another harness, no cache reset; MI325X that × its BF16 MAMF over the MI300X's (an
  assumption: the same die, its FP8 not measured); MI355X twice its BF16 MAMF, 3130.0 (an assumption: the FP8
  share of the doubled peak equal to BF16's, as the B200's measured FP8/BF16 MAMF, 1.93, nearly is).  MI350X: the
  MI355X's die at 2200 MHz and 1000 W (Bekman's tables; ROCm's GPU-specs table gives both 256 CUs and 288 GiB): peaks
  2306.9 / 4613.7 (4096 / 8192 FLOPs per clock per CU × 256 × 2200 MHz, AMD's "2.3 PFLOPS") and its MAMF the
  MI355X's × 2200/2400 -- an assumption, no MI350X GEMM is measured.  No AMD part
  has an MSMF: each takes the measured sustained/burst ratio of the NVIDIA part of its generation and power class
  (`SUSTAINED_FROM`: MI300X at 750 W and MI325X at 1000 W the H200's, MI355X at 1400 W and MI350X at 1000 W the B200's) × the training
  factor -- an assumption, stated as such; no AMD number is fitted, and the one AMD validation row is held out.
- `msmf`: Maximum *Sustainable* Matmul FLOPS from the same table: the steady throughput of a GEMM
  held for a timed window with every other GPU of the 8-GPU node running matmuls too ("Siblings:
  yes"), i.e. at the power limit as in a training step: H200 SXM 755 BF16, 1354 FP8 (683-689 W,
  1767-1918 MHz against the 1980 MHz burst); B200 SXM 1439 BF16, 2788 FP8 (975-987 W, ~1400-1450
  MHz against 1965).  The table has no MSMF for H100 SXM or A100 SXM.
- `sustained`: the share of `mamf` a GPU's GEMMs keep for hours at its power limit, as in a training
  step (MAMF is a short burst at boost clock) = MSMF / MAMF of the same measurement.
  * H200: 755/850 = 0.888 (BF16), 1354/1525 = 0.888 (FP8).  B200: 1439/1737 = 0.828 (BF16),
    2788/3350 = 0.832 (FP8).  Measured; each is used × the training factor (below).
  * H100 SXM: **fitted** (issue 12's eighth round; `FITTED_SUSTAINED`).  The table has no H100 MSMF, so the
    H100's sustained ratio is the one number of its description no measurement gives.  Until the eighth
    round it borrowed the H200's (0.888: same GH100 die, same 700 W limit); with it every held-out H100
    source came out fast (NeMo 24.07 +7.7 % on average, MLPerf v3.1 +11.4 %, dgxc-benchmarking +5.9 %;
    the A100 rows, whose ratio is a measured clock, +1 %).  Now it is set per dtype so that twelve declared
    calibration rows average zero error: the smallest-GPU-count column of each of dgxc-benchmarking
    v24.11.1's six dense H100 tables, BF16 and FP8 (`calibration.sustained_rows`, the rule chosen before
    the fit was first run, and not changed after): 0.8852 BF16 (= 704 of MAMF 795), 0.8401 FP8 (= 1179 of
    1403; 0.8660 and 0.8219 before issue 12's forty-ninth round refitted the step share on Narayanan et al.'s Table 1
    rows as their scripts ran them, which these ratios offset, and read NeMo 1.0's Apex buckets (one a virtual-pipeline
    chunk, or one a layer) on these rows; 0.8721 and 0.8311 before issue 12's forty-seventh round read ten of those rows' yamls -- the Llama 3.1 and
    Nemotron-4 tables, NeMo 1.0 on Megatron-Core 0.9 -- as fusing the loss's cross-entropy, cross_entropy_loss_fusion:
    true, which they had been priced without; 0.8426 and 0.8030 before issue 12's forty-fourth round refitted the step share, which they offset to the
    fourth digit; 0.8521 and 0.8120 before issue 12's forty-third round refitted the step share, which they offset: the
    H100's GEMM rate is as it was; 0.8556 and 0.8157 before issue 12's thirty-third round priced those rows' pipelines as Megatron-Core splits
    them, stage_layout.megatron_split; 0.8146 FP8 before its thirty-second round gave FP8 GEMMs a depth constant of their own, compute.depth_k0;
    0.8338 before issue 12's twenty-eighth round priced Transformer Engine's quantized sequence-parallel
    all-gathers, parallel_comm.GATHERED_INPUT_BYTES; 0.861 and 0.814 before issue 12's tenth round priced stragglers, `STEP_SPREAD`; 0.8007 before its
    thirteenth round priced the calibration rows' fp8 weight gathers, `fp8_param_gather`; 0.8415 and 0.7959
    before its sixteenth round gave attention the same in-step discount, hardware.attn_sustain_of; 0.8544 and
    0.8165 before its seventeenth round priced the loss's cross-entropy kernel by kernel, compute.LOSS_BYTES,
    which the calibration rows (then read as Megatron-Core's unfused loss) had carried in these ratios; 0.8591 and
    0.8288 before its nineteenth round gave GEMMs shallower than K = 4,096 their measured depth curve,
    compute.GEMM_K0, and the embedding's gradient a DP bucket of its own, dp_tail.stage_buckets; 0.8476 and 0.8207
    before its twentieth set the overlap slowdown to a measured 18.9 %, hardware.OVERLAP_SLOWDOWN; 0.8560 and
    0.8339 before its twenty-fifth sized the DP buckets as Megatron-Core's DDP does, dp_tail.dp_bucket).  Those twelve
    rows are in sample; every other H100 row is held out.  What the FP8 number
    holds beyond the clock (TE's casts and amax bookkeeping as priced in compute.py may fall short) is
    not separated: it is the H100's FP8 step as the table's runs sustain it.  Reproduce with
    `python -m par3d.plan.validation --fit`; tests/test_plan_published.py re-runs the fit.
  * The **training factor** (issue 12's twelfth round; `training_factor`): the H100's fitted ratio over the H200's
    measured MSMF / MAMF -- the same GH100 die at the same 700 W limit, so the quotient is what a training step
    keeps of a GEMM-only sustained rate, not a property of either chip: 0.8852 / 0.888 = 0.997 (BF16),
    0.8401 / 0.888 = 0.946 (FP8; 0.975 and 0.926 before issue 12's forty-ninth round's refit, 0.982 and 0.936 before issue 12's forty-seventh round's refit, 0.949 and 0.904 before issue 12's forty-fourth round's step share refit, 0.959 and 0.915 before issue 12's forty-third round's, 0.964 and 0.919 before issue 12's thirty-third round, 0.917 FP8 before its
    thirty-second, 0.939 before its twenty-eighth).  It multiplies every MSMF-based ratio (H200, B200, GB200), as the step share
    multiplies every GPU's: the H200 thus runs at the H100's fitted ratios (the same die), the B200 at 0.826
    (BF16) and 0.787 (FP8) of MAMF (0.808 and 0.770 before the forty-ninth round's refit, 0.813 and 0.779 before the forty-seventh round's refit, 0.786 and 0.753 before the forty-fourth round's refit; the products with the step share unchanged).  No number is fitted for it; the decision to apply it beyond the H100 was taken
    after the held-out H200 and Blackwell rows had all come out fast (+3 ... +13 % on current software, as the
    H100's did before its fit: docs/planner.md section 9), so those rows are not independent evidence for it.
  * GB200: the table has no GB200 MSMF; it takes the B200's measured ratio (`SUSTAINED_FROM`: the same die,
    clocked by the same boost logic, at 1200 W instead of 1000 W — so if anything it sustains more of its
    burst, and this is the cautious side), × the training factor.  Not fitted: the GB200 validation rows are
    all held out.
  * B300: no MSMF; it takes the B200's measured ratio (`SUSTAINED_FROM`), × the training factor -- an assumption,
    not a fit: the B300 runs at the B200's 1000 W maximum TGP (Bekman's power table, DGX B300 power capping).  Its
    validation rows are held out.
  * GB300: **fitted** (issue 12's twenty-third round; `FITTED_SUSTAINED`, one ratio for both dtypes:
    `SHARED_SUSTAINED`).  No MSMF is measured.  Described until then with the B200's ratio (× the training factor,
    0.78), every Megatron-Bridge GB300 row came out 14-20 % slow (held out, 17 rows over five releases, FP8 and
    MXFP8), while the same tables' GB200 rows, at the same die's ratio, sat within a few per cent: the GB300 module
    runs at 1400 W (its rack-planning figures; the GB200 at 1200 W, the B200 at 1000 W), and the tables run it 19-25 %
    faster than the GB200 at equal dense peaks and the same recipe (70B: the same layout).  Set as one number -- a
    sustained clock, dtype-blind; the rows are FP8 and attention (BF16) moves with it -- so that Megatron-Bridge's
    first GB300 table (its three 25.11 rows: 8B, 70B, 405B; `calibration.gb300_sustained_rows`, the rule fixed before
    the fit was first run) averages zero error: 0.9875 (0.9663 before issue 12's forty-ninth round's step share refit; 0.9336 before issue 12's forty-fourth round's step share refit; 0.9441 before its forty-third round's; 0.9453 before issue 12's twenty-eighth round priced the FP8 sequence-parallel
    all-gathers quantized, parallel_comm.GATHERED_INPUT_BYTES; 0.9455 before issue 12's twenty-fifth round sized the DP
    buckets, dp_tail.dp_bucket).  Every later release's GB300 row, the MXFP8 ones and MLPerf's
    are held out; MLPerf v5.1's 8B runs on the GB300 disagree (one submission +7 %, another of the same config +17 %
    after the fit, within before it).
  * GH200 (the 96 GB module, `gh200`): **fitted** (issue 12's twenty-second round; `FITTED_SUSTAINED`).  No MSMF is
    measured; first described with the H200's measured ratio (the same GH100 die), every one of the 26 GH200 runs
    then read (held out) came out 27-116 % fast, and the systems they ran on cap the whole module's power below an
    H100's 700 W for its GPU alone (Apertus on CSCS Alps: "560 W power usage per Grace-Hopper module ... below the
    set power limit of 660 W", the Grace CPU and its LPDDR5X included).  Set per dtype, as the H100's, so that
    declared calibration rows average zero error: OpenEuroLLM's 32B strong-scaling runs on 32, 64 and 128 GH200 of
    JUPITER (`calibration.gh200_sustained_rows`, three per dtype, 256+ micro-batches per step; the rule fixed before
    the fit was first run): 0.6662 BF16, 0.5671 FP8 (0.6521 and 0.5550 before issue 12's forty-ninth round's step share
    refit; 0.7109 and 0.6151 before issue 12's forty-seventh round read those
    rows' config: their loss Transformer Engine's cross-entropy kernel, not Megatron-Core's unfused one, their Q/K norms,
    and their pipeline cut 9 + 8 x 6 + 7 layers, not evenly; 0.6869 and 0.5943 before issue 12's forty-fourth round's step share
    refit; 0.6946 and 0.6010 before its forty-third round's; 0.6589 and 0.5223 before issue 12's thirty-third round priced
    those rows' pipeline chunks as Megatron-Core splits them, stage_layout.megatron_split, not by the planner's balanced
    partition; 0.5217 FP8 before its thirty-second round gave FP8 GEMMs their own depth constant,
    compute.depth_k0; 0.6173 and 0.4868 before issue 12's thirty-first round read those
    rows' model TFLOP/s in Megatron-LM's own count, which halves the causal attention core since 8873b55, 2025-03-06:
    `validation.metric_value`; 0.4925 FP8 before issue 12's twenty-eighth round priced the FP8
    sequence-parallel all-gathers quantized, parallel_comm.GATHERED_INPUT_BYTES; 0.6174 and 0.4927 before issue 12's twenty-fifth round sized
    the DP buckets, dp_tail.dp_bucket; fitted after BF16: attention's in-step discount moves with the
    BF16 ratio).  It holds what those modules sustain at their sites' power caps and what that stack's FP8 costs
    beyond its GEMMs, not a property of the die; Apertus's nine runs (Alps, another site and software) are the
    held-out test.  `gh200-144gb` (the HBM3e module, up to 1000 W, Bekman's measured unit) keeps the H200's measured
    ratio (`SUSTAINED_FROM`) × the training factor: no run of it was found.
  * A100: the HPL sustained-clock ratio 1305/1410 = 0.926: 1305 MHz is the clock an A100 sustains
    at its 400 W limit running HPL, against 1410 MHz boost (NVIDIA's HPL submissions, as summarised
    by G. Lockwood, "Peak FLOPS", glennklockwood.com).  Not fitted.
- `STEP_SPREAD` = 0.015 — **cited, not fitted**: the spread (coefficient of variation) of one GPU model's
  speed across a cluster.  Sinha et al., "Not All GPUs Are Created Equal: Characterizing Variability in
  Large-Scale, Accelerator-Rich Systems" (SC'22; arXiv 2208.11035v3) measured 8 % average performance
  variation across the GPUs of one SKU (Summit, Vortex and Longhorn: V100; TACC Frontera's GPU nodes;
  Corona: AMD MI60 — manufacturing and power-management variability), outliers (up to 1.5x slower than
  the median GPU) counted apart.  Read as the range of the non-outlier GPUs (the paper's box plots,
  whiskers 1.5 IQR beyond the quartiles), a normal spread's is ±2.70 σ, so 8 % ≈ 5.4 σ: σ ≈ 1.5 %.  No
  A100/H100/B200 figure is published; the V100-era one is transferred as it is.  A synchronous step waits
  at its collectives for the slowest of its N GPUs: cost.straggler_factor = 1 + σ · E[max of N standard
  normals].  (The SC'22 proceedings' abstract, of an earlier analysis of four of the clusters, states 32 %;
  docs/planner.md §9 says why 1.5 % is kept.)
- `STEP_SHARE` = 0.9509 — **fitted**, the throughput constant every GPU shares, set from validation rows: the share
  of its layers' GEMM rate a whole training step keeps (launch gaps between kernels, the data loader,
  logging — the slowest GPU's lag is priced apart since issue 12's tenth round, `STEP_SPREAD`; before
  it this share carried it too and was 0.91; 0.9716 before issue 12's forty-ninth round read the ten rows as
  Megatron-LM's sc21 scripts ran them (examples/sc21/run_table_1.sh at de7dc40f88: the interleaved schedule on four,
  their micro-batches, PyTorch's DDP reducing behind the backward on the four without a pipeline, local DDP's one
  flattened all-reduce on the others), which made them 1-3 % faster; 1.0056 before issue 12's forty-fourth round priced the unfused
  attention's softmax and dropout by what their backward kernels move (compute.scores_backward_bytes: 1.2x their
  forward bytes, not 2x) and had selective recomputation re-run them, which made the ten rows, none of which ran
  FlashAttention, 0.2-7 % faster; 0.9944 before issue 12's forty-third round priced Megatron-LM 2021's
  blocking point-to-point calls on six of the ten rows, cost.p2p_blocks, after which it is above one: it no longer
  reads as a share lost alone, the A100's HPL clock ratio it multiplies being likely below a training step's; 0.966 before issue 12's seventeenth round priced the loss's
  cross-entropy as Megatron-LM's kernels move it, compute.LOSS_BYTES; 0.9704 before its nineteenth round gave
  GEMMs shallower than K = 4,096 their measured depth curve, compute.GEMM_K0), the number that makes the ten rows of
  Narayanan et al. 2021 Table 1 average zero error with the straggler factor in place
  (validation.toml; `python -m par3d.plan.validation --fit`; at 0.926 alone and no stragglers they
  average +6.5 %).  It is a property of a step, not of the A100's silicon: the per-layer times of
  Korthikanti et al. 2022 Table 4 (22B layer, TP 8, micro-batch 4: 7.7 ms forward, 11.9 ms backward)
  are matched within 1 % at the clock ratio alone, so the layers need no more and the share (with the
  stragglers priced apart) is what the step adds.  It therefore applies to every GPU (until issue 12's fourth round it applied to the
  A100 only, and every NVIDIA H100/B200 row came out fast, +0.6 … +13.9 %: docs/planner.md §9).
  The share of peak a deep GEMM (K >= 4,096) reaches is mamf/peak × sustained × `STEP_SHARE`; a shallower one
  keeps less by the depth curve (compute.py, fitted to a GEMM benchmark: gemm_shapes.py).
  `par3d calibrate` on a GPU replaces MAMF with its own burst measurement and applies the same
  sustained ratio and step share (`hardware.calibrated_gemm_share`).

`hardware.py` builds each catalogue device's `gemm` entry from this table; a hardware file may
carry its own (`par3d calibrate` on a GPU writes one: see `hardware.calibrated_gemm_share`).
"""

from __future__ import annotations

HPL_SUSTAINED = 1305.0 / 1410.0  # A100's HPL sustained clock / boost clock (see above)
STEP_SPREAD = 0.015  # the GPUs' speed spread (coefficient of variation): Sinha et al. SC'22, see above
STEP_SHARE = 0.9509  # a whole step's share of its layers' GEMM rate: fitted to Narayanan et al. 2021 Table 1
# MXFP8's block-scaled GEMMs against BF16's on Blackwell, measured: Transformer Engine's GEMM profiling guide
# (NVIDIA/TransformerEngine docs/features/low_precision_training/gemm_profiling/gemm_profiling.rst, ce616e1) times
# the 12 GEMMs of one layer of a model with hidden 4,096 and intermediate 16,384 at 15,872 tokens on a B300 with
# pre-quantized inputs (the kernels alone): 12.835 ms in BF16, 7.324 ms in MXFP8 -> 1.75x.  The FP8 table above is
# tensor-scaled `_scaled_mm` (MAMF 1.90x the BF16 one on the B300): MXFP8's kernels run below it, so MXFP8 GEMMs take
# BF16's share times this ratio (hardware.with_mxfp8), not FP8's share.  Not fitted to any training row.
MXFP8_OVER_BF16 = 12.835 / 7.324
# NVFP4 (issue 12's twenty-seventh round; Transformer Engine's NVFP4BlockScaling: E2M1 values, an E4M3 scale per 16
# elements and an FP32 scale per tensor; Megatron-Core's `--fp4-format e2m1`, Megatron-Bridge's compute dtype "nvfp4").
# The same guide and layer on the B300, pre-quantized: 3.754 ms in NVFP4 against BF16's 12.835 -> 3.42x, carried to
# every Blackwell part as MXFP8's ratio is: NVFP4 GEMMs run 3.42x the GPU's BF16 GEMMs (hardware.with_nvfp4).  No NVFP4
# GEMM is measured on a B200 or GB200, whose FP4 peak is 4x their BF16 peak where the B300's is 6.2x (`FP4_PEAK`).
# The rule was chosen after Megatron-Bridge's NVFP4 rows had been priced (validation.toml: they are in sample for it):
# the first rule, written before them -- each GPU's NVFP4 GEMMs at the B300's share of its own FP4 peak, 3.42 / 6.22
# of the peak ratio, 2.2x BF16 on the B200 / GB200 -- put the GB200 rows at a median -22.6 % (none within 10 %), this
# one at -1.8 % (7 of 9); the GB300 rows, on which the two rules nearly agree, -14.5 / -12.9 %.  MLPerf Training v5.1's
# NVFP4 runs (B200, GB200), read after the choice, are its held-out test (docs/planner.md section 9).
NVFP4_OVER_BF16 = 12.835 / 3.754
# Dense FP4 tensor-core peaks, TFLOP/s per GPU: B200 9,000 and GB200 10,000 (Bekman's TFLOPS table, from the DGX B200
# datasheet and the GB200 NVL72 specifications); B300 14,000 and GB300 15,000 (Verda's GB300 NVL72 architecture
# post, per-GPU table without sparsity; the GB300 NVL72's 1,080 dense PFLOPS / 72 GPUs = 15,000).
FP4_PEAK: dict[str, float] = {"b200": 9000.0, "gb200": 10000.0, "b300": 14000.0, "gb300": 15000.0}
# What NVFP4's quantization costs against MXFP8's, the same guide's autocast-minus-pre-quantized time of that layer
# (every GEMM operand quantized as training does it: the amaxes, the random Hadamard transform of the weight-gradient
# inputs, the scales, the casts): 6.439 - 3.754 = 2.685 ms in NVFP4, 8.507 - 7.324 = 1.183 ms in MXFP8 -> 2.27x.
# compute.elementwise_bytes prices MXFP8's casts as HBM traffic: for that layer 0.87 ms (the activations' and, the
# backward at twice the forward, the gradients' casts) + 0.19 ms for the weights' (which the benchmark re-casts at
# every GEMM) = 1.06 ms of the 1.18 measured.  NVFP4's casts are that traffic × this ratio.  Not fitted to any
# training row.
NVFP4_CAST_OVER_MXFP8 = (6.439 - 3.754) / (8.507 - 7.324)

# gpu family -> dtype -> (peak TFLOP/s, MAMF TFLOP/s, MSMF TFLOP/s or None where not measured)
TABLE: dict[str, dict[str, tuple[float, float, float | None]]] = {
    "a100": {"bf16": (312.0, 267.9, None), "fp16": (312.0, 267.9, None)},
    "h100": {"bf16": (989.0, 795.0, None), "fp16": (989.0, 795.0, None), "fp8": (1979.0, 1403.0, None)},
    "h200": {"bf16": (989.0, 850.0, 755.0), "fp16": (989.0, 850.0, 755.0), "fp8": (1979.0, 1525.0, 1354.0)},
    "b200": {"bf16": (2250.0, 1737.0, 1439.0), "fp16": (2250.0, 1737.0, 1439.0),
             "fp8": (4500.0, 3350.0, 2788.0)},
    "gb200": {"bf16": (2500.0, 1822.0, None), "fp16": (2500.0, 1822.0, None), "fp8": (5000.0, 3615.6, None)},
    "b300": {"bf16": (2250.0, 1769.0, None), "fp16": (2250.0, 1769.0, None), "fp8": (4500.0, 3353.3, None)},
    # GB300: the B300's MAMF × the GB200/B200 ratio of the same table (see above; not measured)
    "gb300": {"bf16": (2500.0, 1847.0, None), "fp16": (2500.0, 1847.0, None), "fp8": (5000.0, 3532.2, None)},
    # GH200: the GH100 die of the H100/H200 at their peaks; Bekman's measured burst (its "900W 141GiB HBM3e version");
    # "gh200" the 96 GB module of the HPC systems (its sustained ratios FITTED, below), "gh200-144gb" the HBM3e module
    "gh200": {"bf16": (989.0, 828.6, None), "fp16": (989.0, 828.6, None), "fp8": (1979.0, 1535.0, None)},
    "gh200-144gb": {"bf16": (989.0, 828.6, None), "fp16": (989.0, 828.6, None), "fp8": (1979.0, 1535.0, None)},
    # AMD Instinct (issue 12's twenty-sixth round; see above): MI300X / MI325X the CDNA3 die, MI355X CDNA4
    "mi300x": {"bf16": (1307.4, 668.4, None), "fp16": (1307.4, 668.4, None), "fp8": (2614.9, 1159.2, None)},
    "mi325x": {"bf16": (1307.4, 784.9, None), "fp16": (1307.4, 784.9, None),
               "fp8": (2614.9, round(1159.2 * 784.9 / 668.4, 1), None)},
    "mi355x": {"bf16": (2500.0, 1565.0, None), "fp16": (2500.0, 1565.0, None), "fp8": (5000.0, 3130.0, None)},
    # MI350X: the MI355X's die at 2200 MHz and 1000 W; peaks by the clock, MAMF the MI355X's by the clock (assumed)
    "mi350x": {"bf16": (2306.9, 1434.6, None), "fp16": (2306.9, 1434.6, None), "fp8": (4613.7, 2869.2, None)},
}
# a GPU without its own MSMF that takes the sustained/burst ratio measured on another part (see above: the
# GB200 is the B200's die; the B300 is Blackwell Ultra at the B200's power, whose sustained clock nobody has published)
SUSTAINED_FROM: dict[str, str] = {"gb200": "b200", "b300": "b200", "gh200-144gb": "h200",
                                   "mi300x": "h200", "mi325x": "h200", "mi355x": "b200", "mi350x": "b200"}
# a GPU whose sustained/burst ratio is a clock ratio from another source (no MSMF in the table)
SUSTAINED_CLOCK: dict[str, float] = {"a100": HPL_SUSTAINED}
# (gpu family, dtype) -> sustained/burst ratio FITTED to declared calibration rows (see above: the H100, the GH200
# and the GB300 have no MSMF); fp16 takes bf16's.  Reproduced by `python -m par3d.plan.validation --fit`.
FITTED_SUSTAINED: dict[tuple[str, str], float] = {("h100", "bf16"): 0.8852, ("h100", "fp8"): 0.8401,
                                                   ("gh200", "bf16"): 0.6662, ("gh200", "fp8"): 0.5671,
                                                   ("gb300", "bf16"): 0.9875, ("gb300", "fp8"): 0.9875}
# families whose one fitted ratio holds for every dtype (a sustained clock: the calibration rows are of one dtype, and
# attention, which runs in BF16, moves with it): the fit uses all their rows (calibration.fit_sustained)
SHARED_SUSTAINED: frozenset[str] = frozenset({"gb300"})


def family_of(gpu: str) -> str:
    """The TABLE family a catalogue GPU's numbers come from: its own entry where it has one (gh200-144gb), else the
    name before the memory size ("a100-80gb" -> "a100", "h100-sxm" -> "h100")."""
    return gpu if gpu in TABLE else gpu.split("-")[0]


def training_factor(dtype: str) -> float:
    """What a training step keeps of the sustained GEMM rate a GEMM-only benchmark (MSMF) measures: the H100's
    fitted ratio over the H200's measured MSMF / MAMF -- the same GH100 die at the same 700 W limit, so the
    quotient is the step's, not the silicon's (issue 12's twelfth round; 1.0 where either is missing)."""
    d = "bf16" if dtype == "fp16" else dtype
    fitted = FITTED_SUSTAINED.get(("h100", d))
    row = TABLE["h200"].get(d)
    if fitted is None or row is None or row[2] is None:
        return 1.0
    return fitted / (row[2] / row[1])


def sustained_ratio(family: str, dtype: str) -> float:
    """The share of MAMF a GPU's GEMMs keep in a training step: fitted (H100); MSMF / MAMF × the training
    factor where MSMF is measured (H200, B200; GB200 takes the B200's: `SUSTAINED_FROM`); A100: the HPL clock
    ratio."""
    fitted = FITTED_SUSTAINED.get((family, "bf16" if dtype == "fp16" else dtype))
    if fitted is not None:
        return fitted
    if family in SUSTAINED_CLOCK:
        return SUSTAINED_CLOCK[family]
    family = SUSTAINED_FROM.get(family, family)
    row = TABLE.get(family, {}).get(dtype)
    if row is not None and row[2] is not None:
        return row[2] / row[1] * training_factor(dtype)
    return HPL_SUSTAINED


def achievable_fraction(family: str, dtype: str, step_share: float | None = None) -> float | None:
    """The share of peak a large GEMM reaches inside a training step: mamf/peak × sustained ×
    `STEP_SHARE` (`step_share` in its place: what calibration.fit_step_share varies); None if unknown."""
    row = TABLE.get(family, {}).get(dtype)
    if row is None:
        return None
    peak, mamf, _ = row
    return mamf / peak * sustained_ratio(family, dtype) * (STEP_SHARE if step_share is None else step_share)


__all__ = ["FITTED_SUSTAINED", "FP4_PEAK", "NVFP4_CAST_OVER_MXFP8", "NVFP4_OVER_BF16", "SHARED_SUSTAINED", "SUSTAINED_FROM", "STEP_SHARE", "STEP_SPREAD", "TABLE", "achievable_fraction",
           "sustained_ratio", "training_factor"]
