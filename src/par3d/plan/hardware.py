"""Devices, links and clusters: the numbers the planner's arithmetic runs on.

Units: FLOP/s, bytes/s, bytes, seconds (SI: 1 GB/s = 1e9 B/s).  Memory capacities are the
marketed sizes read as GiB (an "80 GB" A100 has 80 GiB = 85.9e9 B; an H200 has 141e9 B).

Sources
- A100: NVIDIA A100 Tensor Core GPU datasheet (312 TFLOP/s dense BF16/FP16, 19.5 FP32,
  1555 GB/s (40 GB) / 2039 GB/s (80 GB) HBM2e, 108 SMs), NVLink 3 = 600 GB/s bidirectional,
  i.e. 300 GB/s per direction per GPU (the seed's §2.5/§4.2 figure).
- H100 SXM: NVIDIA H100 datasheet (989 TFLOP/s dense BF16, 67 FP32, 3.35 TB/s HBM3, 132 SMs),
  NVLink 4 = 900 GB/s bidirectional = 450 GB/s per direction.
- H200: NVIDIA H200 datasheet (same compute as H100 SXM, 141 GB HBM3e at 4.8 TB/s).
- Links: InfiniBand HDR 200 Gb/s = 25 GB/s per NIC, NDR 400 Gb/s = 50 GB/s per NIC, one NIC per
  GPU as in a DGX; PCIe Gen4 x16 ≈ 32 GB/s (the seed's §1 list), Gen5 ≈ 64 GB/s.
  Latencies α: NVLink ~3 µs and IB ~2 µs per collective step are the seed's §4.2 / §3.1 values.

- B200 (DGX B200 datasheet): 2250 TFLOP/s dense BF16, 4500 FP8, 8 TB/s HBM3e, 180 GB per GPU
  (1440 GB per 8-GPU system), 148 SMs; NVLink 5 = 1800 GB/s bidirectional = 900 per direction;
  ConnectX-7 400 Gb/s NICs, eight per system.
- B300 and GB300 (Blackwell Ultra, issue 12's twenty-first round): B300 (DGX B300 datasheet) 2250 TFLOP/s dense
  BF16, 4500 FP8; GB300 (NVIDIA GB300 NVL72 specifications, per GPU) 2500 / 5000 -- the B200's and the GB200's
  peaks (Bekman's TFLOPS table lists the four so); 288 GB HBM3e at 8 TB/s each (DGX B300: 2.3 TB per 8 GPUs;
  GB300 NVL72: 288 GB per GPU; Bekman's memory table); 160 SMs (NVIDIA's Blackwell Ultra description, Hot
  Chips 2025: 160 SMs over the two dies; the B300 is taken to enable all of them, as the GB300); NVLink 5 as
  the B200; one ConnectX-8 at 800 Gb/s per GPU (DGX B300 datasheet, GB300 NVL72 specifications), 72 GPUs in one
  NVLink domain on the GB300 NVL72.
- GH200 (Grace Hopper Superchip, issue 12's twenty-second round; NVIDIA GH200 Grace Hopper Superchip specifications):
  the GH100 die at the H100's peaks (989 BF16, 1979 FP8 dense, 132 SMs), with 96 GB HBM3 at 4 TB/s (`gh200`: the
  variant in the large GH200 systems, e.g. CSCS Alps and JUPITER) or 144 GB HBM3e at 4.9 TB/s (`gh200-144gb`);
  NVLink 4, 900 GB/s bidirectional per GPU; NVLink-C2C to its Grace CPU, 900 GB/s bidirectional.  Nodes as the
  GH200 supercomputers build them (HPE Cray EX254n, Eviden BullSequana XH3000): 4 superchips, each GPU linked to
  the other three by NVLink 4 (a mesh, no NVSwitch: priced as the same 450 GB/s per direction -- NCCL's rings on a
  4-GPU mesh are not measured here), one 200 Gb/s NIC per GPU (Slingshot-11 or InfiniBand NDR200: `nic-200g`).

- AMD Instinct (issue 12's twenty-sixth round).  MI300X (AMD CDNA3; ROCm docs docs/conceptual/gpu-arch/mi300.md and
  reference/gpu-specs): 1307.4 TFLOP/s dense BF16/FP16, 2614.9 FP8, 163.4 FP32, 304 CUs, 192 GiB HBM3 at 5.3 TB/s,
  seven Infinity Fabric links of 64 GB/s per direction fully connecting 8 GPUs; MI325X: the same die and clock,
  256 GiB HBM3e at 6 TB/s; MI355X (CDNA4; Bekman's tables from AMD's pages, ROCm gpu-specs for the CUs and memory):
  2500 / 5000 dense, 157.3 FP32, 256 CUs, 288 GiB HBM3e at 8 TB/s; MI350X: the MI355X's die at 2200 MHz and 1000 W,
  its peaks by the clock.  Their GEMM rates and attention shares: gemm_table.py and below; their Infinity Fabric
  mesh: `mesh_share`, `XGMI_EFF`.

Two kernel models (compute.py):
- **table** (the default for catalogue GPUs): each GEMM from its shape and the GPU's measured
  achievable throughput (`gemm`, from gemm_table.py), non-GEMM work as HBM traffic at `mem_eff`
  of the bandwidth, FlashAttention's core at `attn_eff` of peak.
- **flat** (when a fixed `efficiency` is given: `--efficiency`, a hardware file's
  `device.efficiency` without a `gemm` table, the seed's examples): every GEMM at
  `efficiency` of peak, elementwise work folded into it.  The seed's §4.2 assumption is
  150 TFLOP/s = 48% of 312 (`SEED_EFFICIENCY`).

Achieved bandwidths (the `*_eff` factors):
- `mem_eff` 0.80: elementwise kernels reach about 80 % of HBM bandwidth (STREAM-like copy kernels
  reach ~90 %; layer norm / softmax / dropout kernels with reductions or masks less; a rounded
  middle, not fitted).
- NVLink 3 (A100): `nccl-tests` all_reduce_perf on one 8×A100 node reaches 232.5 GB/s bus bandwidth
  of the 300 GB/s per direction (NVIDIA/nccl-tests issue #175, NVIDIA/nccl issue #1048) → 0.775.
- NVLink 4 (H100/H200; NVLink 5 takes the same shares): NCCL's maintainer, NVIDIA/nccl-tests issue
  #212: with ~20 % protocol overhead NCCL reaches 370 of the 450 GB/s line rate in rings, all-gather
  and reduce-scatter (→ 0.822), and all-reduce with NVLink SHARP reaches ~480 GB/s bus bandwidth on
  8 GPUs (→ 480/450 for an all-reduce inside one node).
- InfiniBand/RoCE: one HDR NIC reaches its 24 GB/s line rate of 25 in the same thread; 4 NICs
  per node give 86-96 GB/s bus bandwidth of 100 across nodes (NVIDIA/nccl-tests issue #119) → 0.90.
- `overlap_slowdown` σ = 0.189: compute that runs while a collective proceeds slows by this share
  (parallel_comm.py's `overlapped`: shared SMs, HBM and power).  **Cited, not fitted**: Lee et al., "Characterizing
  Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning: Performance and Power
  Implications" (arXiv 2507.03114, 2025) measured an average computational slowdown of 18.9 % (at most
  40.0 %) against the same compute with no communication beside it, for GPT and LLaMA models on four
  A100, H100, MI250 and MI210 GPUs.  The average covers AMD GPUs too and one GPU count; no per-GPU,
  per-collective figure is used.  Until issue 12's twentieth round σ was 16 NCCL channels / SMs (one
  thread block per channel: 0.15 on A100, 0.12 on H100, 0.11 on B200), an assumption no measurement
  gave.  Calibratable as `device.overlap_slowdown` in a hardware file.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .profile import Profile

from . import gemm_table as _gt
from .models import fields_hash

GB = 1e9
GiB = 2**30
TFLOPS = 1e12
US = 1e-6

SEED_EFFICIENCY = 150.0 / 312.0  # seed §4.2: 150 TFLOP/s effective on a 312 TFLOP/s A100


class HardwareError(ValueError):
    """A hardware description that cannot be used; the message names the field and a fix."""


OVERLAP_SLOWDOWN = 0.189  # σ: Lee et al. 2025 (arXiv 2507.03114), measured average; see the docstring
MEM_EFF = 0.80  # elementwise kernels' share of HBM bandwidth (see the module docstring)
NVLINK_EFF = 232.5 / 300.0  # nccl-tests all_reduce busbw on 8×A100 / NVLink 3 per direction
NVLINK4_EFF = 370.0 / 450.0  # NCCL ring / all-gather / reduce-scatter on NVLink 4 (nccl-tests #212)
NVLS_ALLREDUCE_EFF = 480.0 / 450.0  # all-reduce bus bandwidth with NVLink SHARP on 8 H100 (same issue)


# RCCL on 8 MI300X over xGMI: all_reduce_perf bus bandwidth 318.98 GB/s at 16 GiB of the 448 GB/s seven links carry
# per direction (AMD, "Understanding RCCL Bandwidth and xGMI Performance on AMD Instinct MI300X", ROCm blogs 2025:
# "effectively capped at 310-330 GB/s"; Microsoft's Azure ND MI300X v5 guide 316.8 at 8 GB); no all-gather or
# reduce-scatter figure was found, so every kind takes it.  A single link measured 45-48 GB/s (TransferBench, the same
# blog): 318.98 / 7 = 45.6, so one share holds for one link and for seven.
XGMI_EFF = 318.98 / 448.0
XGMI_LINKS = 7  # Infinity Fabric links per GPU: a fully connected 8-GPU mesh (AMD's CDNA3 description, ROCm docs)


def nvlink_eff(link_name: str, kind: str) -> float:
    """Achieved share of an intra-node link's bandwidth for one collective kind (see the docstring)."""
    if link_name.startswith(("nvlink4", "nvlink5")):
        return NVLS_ALLREDUCE_EFF if kind == "all_reduce" else NVLINK4_EFF
    if link_name.startswith("xgmi"):
        return XGMI_EFF
    return NVLINK_EFF


def mesh_share(link_name: str, members: int) -> float:
    """The share of a GPU's intra-node bandwidth a group of `members` GPUs of one node can use: all of it through a
    switch (NVSwitch); on AMD's fully connected Infinity Fabric mesh only the links to the other members, (members - 1)
    of the seven -- a pair (a point-to-point, TP 2) gets one link, 64 of 448 GB/s (comm.py)."""
    if link_name.startswith("xgmi"):
        return min(max(members - 1, 1), XGMI_LINKS) / XGMI_LINKS
    return 1.0
NIC_EFF = 0.90  # nccl-tests multi-node busbw / NIC line rate (issue #119: 86-96 of 100 GB/s)
# PyTorch FSDP's cost per wrapped unit (one transformer block) per micro-batch beyond its collectives' time,
# exposed in the step: **fitted** (issue 12's fifteenth round, `calibration.fit_fsdp_unit`) so that the 18 rows
# of llm-foundry's large-scale H100 table (PyTorch FSDP, one micro-batch per step, 1B to 70B on 128 to 512
# GPUs) average zero error; no measurement gives it.  What it stands for is not measured apart: the per-unit
# hooks, the copies and casts around each gather and reduce-scatter, the rate limiter's waits.  Held out:
# llm-foundry's 2023 tables (1-21 micro-batches per step), fms-fsdp's, torchtitan's and OPT-175B's FSDP rows
# (docs/planner.md §9).  `Cluster.fsdp` turns it on.  6.5 ms until issue 12's seventeenth round, whose loss pricing
# (compute.LOSS_BYTES: flash-attn's fused cross-entropy, llm-foundry's default, moves fewer bytes than the 14 B a
# logit cost before) moved its calibration rows; 6.9 ms until its nineteenth round gave shallow GEMMs their measured
# depth curve (compute.GEMM_K0); 7.1 ms until its twentieth set the overlap slowdown (OVERLAP_SLOWDOWN); 7.2 ms until
# its twenty-fifth sized Megatron-Core's DP buckets, which refitted the H100's sustained ratios (the rows are H100's);
# 7.1 ms until its thirty-third, whose Megatron-Core pipeline split refitted those ratios again; 7.0 ms until its
# forty-seventh, which read NeMo 1.0's Llama 3 and Nemotron recipes as fusing the loss and so refitted those ratios;
# 6.7 ms until its forty-ninth, whose reading of Narayanan et al.'s Table 1 runs (their scripts' interleaved schedule
# and micro-batches) refitted the step share, and with it those ratios.
FSDP_UNIT_S = 6.8e-3

# A mixture of experts' host floor (cp_ep_comm.moe_host_floor): Megatron-Core's dropless MoE layer waits once a layer for the
# tokens per expert on the host (a device-to-host sync), so the host's issue time of each layer's kernels is not
# hidden behind the previous layer's GPU work, and a layer takes the longer of the two unless whole iterations are
# captured in CUDA graphs, which need no sync (Megatron-LM's "Optimizing DeepSeek-V3 Training Performance on NVIDIA
# GB200 NVL72", §2 "CPU overhead", §2.3, §3.1: whole-iteration graphs worth "at least 10 %" more there).  The host
# time of one MoE layer, forward and backward: MOE_HOST_S[0] + MOE_HOST_S[1] x the routed experts a rank holds (its
# grouped GEMM "multi-stream + cuBLAS": launches and quantizations per expert, ibid. §1).  **Fitted** (issue 12's
# thirty-fourth round, `calibration.fit_moe_host`) to Megatron-Bridge's 26.04 MoE rows alone; no measurement gives
# it; one pair for every GPU and host CPU (x86 and Grace alike).  0.459 ms a routed expert until issue 12's forty-seventh
# round, whose refit of the H100's sustained ratios moved the training factor its B300 / GB200 rows are priced with
# (0.458 from it), and again since the fiftieth round priced the flex dispatcher's rows per destination rank.
MOE_HOST_S = (4.91e-3, 0.459e-3)
CUDA_GRAPHS = ("full_iteration", "partial", "none")  # what a run captures in CUDA graphs (`--cuda-graphs`)
# Muon (`Cluster.optimizer`): the optimizers the planner prices, how a TP-split matrix is orthogonalized, and the
# Newton-Schulz steps per update -- 5 quintic steps, Megatron-Core's `muon_num_ns_steps` default and Megatron-Bridge's
# recipes' (Jordan et al. 2024, "Muon"; Liu et al. 2025, "Muon is Scalable for LLM Training")
OPTIMIZERS = ("adam", "muon")
MUON_TP_MODES = ("blockwise", "duplicated")
MUON_NS_STEPS = 5


def moe_host_of(cuda_graphs: str) -> tuple[float, float]:
    """`Cluster.moe_host_s` for a Megatron-Core run capturing `cuda_graphs` (CUDA_GRAPHS): the floor unless whole
    iterations are graphs (partial graphs priced as none)."""
    if cuda_graphs not in CUDA_GRAPHS:
        raise ValueError(f"cuda_graphs {cuda_graphs!r}: choose one of {', '.join(CUDA_GRAPHS)}")
    return (0.0, 0.0) if cuda_graphs == "full_iteration" else MOE_HOST_S


def log2_interp(curve: tuple[tuple[int, float], ...], seq: int) -> float:
    """A measured curve's value at `seq` tokens: linear in log2(seq) between its points, flat beyond its ends."""
    if seq <= curve[0][0]:
        return curve[0][1]
    for (s0, e0), (s1, e1) in zip(curve, curve[1:]):
        if seq <= s1:
            w = math.log2(seq / s0) / math.log2(s1 / s0)
            return e0 + w * (e1 - e0)
    return curve[-1][1]


@dataclass(frozen=True, eq=False)  # eq=False: hashable by identity (peak_flops is a dict)
class Device:
    name: str
    peak_flops: dict[str, float]  # dtype -> dense FLOP/s
    mem_bw: float  # HBM bytes/s
    mem_bytes: float  # capacity in bytes
    sms: int  # streaming multiprocessors (for wave quantization, seed §3.2)
    efficiency: float = SEED_EFFICIENCY  # flat model: achievable fraction of peak for every GEMM
    # table model: dtype -> sustained achievable fraction of peak for a large GEMM (gemm_table.py);
    # empty -> the flat model
    gemm: dict[str, float] = field(default_factory=dict)
    mem_eff: float = MEM_EFF
    attn_eff: float = 0.0  # FlashAttention's fwd+bwd share of peak; 0: no FlashAttention on this GPU
    overlap_slowdown: float | None = None  # σ; None -> OVERLAP_SLOWDOWN
    # the attention kernel's share of peak measured at several sequence lengths ((tokens, share), rising
    # tokens), where a measurement gives them; empty: `attn_eff` at every length (`attn_share`)
    attn_curve: tuple[tuple[int, float], ...] = ()
    # what a training step keeps of that benchmarked share (`attn_sustain_of`: the GEMMs' own discount, BF16);
    # 1.0 where the share given is already a training step's (a hardware file's own attn_eff)
    attn_sustain: float = 1.0

    @property
    def kernel_model(self) -> str:
        return "table" if self.gemm else "flat"

    @property
    def flash(self) -> bool:
        return self.attn_eff > 0

    @property
    def sigma(self) -> float:
        if self.overlap_slowdown is not None:
            return self.overlap_slowdown
        return OVERLAP_SLOWDOWN

    def attn_share(self, seq: int) -> float:
        """The attention kernel's share of peak inside a training step for sequences (or CP blocks) of `seq`
        tokens: its benchmarked share (`attn_curve` interpolated linearly in log2(tokens), held flat beyond its
        ends; `attn_eff` without a curve) times `attn_sustain`."""
        return self.attn_sustain * self.attn_benchmarked(seq)

    def attn_benchmarked(self, seq: int) -> float:
        return log2_interp(self.attn_curve, seq) if self.attn_curve else self.attn_eff

    def gemm_fraction(self, dtype: str) -> float:
        """Achievable share of peak for a large GEMM of this dtype (table model; flat: efficiency)."""
        if not self.gemm:
            return self.efficiency
        if dtype in self.gemm:
            return self.gemm[dtype]
        return self.gemm.get("bf16", self.efficiency)

    def peak(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise HardwareError(f"device {self.name!r} has no peak for dtype {dtype!r}; "
                                f"known: {', '.join(sorted(self.peak_flops))}")
        return self.peak_flops[dtype]

    def balance(self, dtype: str) -> float:
        """Roofline ridge point in FLOP/byte (seed §4.4: 312e12 / 2039e9 = 153)."""
        return self.peak(dtype) / self.mem_bw


@dataclass(frozen=True)
class Link:
    name: str
    alpha: float  # seconds per message step (latency)
    beta: float  # bytes/s per GPU, one direction

    def p2p(self, nbytes: float) -> float:
        """T = α + n/β (seed §4.5)."""
        return self.alpha + nbytes / self.beta


def _peaks(bf16: float, fp32: float, fp8: float | None = None) -> dict[str, float]:
    """Dense tensor-core peaks; fp16 = bf16 on these GPUs; fp8 only where the GPU has it."""
    out = {"bf16": bf16 * TFLOPS, "fp16": bf16 * TFLOPS, "fp32": fp32 * TFLOPS}
    if fp8 is not None:
        out["fp8"] = fp8 * TFLOPS
    return out


def _gemm(family: str) -> dict[str, float]:
    return {dt: f for dt in _gt.TABLE[family] if (f := _gt.achievable_fraction(family, dt)) is not None}


def attn_sustain_of(family: str, sustained: float | None = None, step_share: float | None = None) -> float:
    """What a training step keeps of an attention kernel's benchmarked share on a `family` GPU: the same
    discount its GEMMs take from MAMF (gemm_table: the sustained/burst ratio × the step share), at BF16, the
    dtype attention runs in (`sustained` / `step_share` in place of the stored ones: what a fit varies).  Why the same: every attention share in this file (FlashAttention's papers,
    cudnn-frontend's sdpa benchmark) times one kernel alone, at the burst clock, exactly as MAMF times a GEMM;
    inside a step the attention kernel shares the clock, power and the step's other losses with the GEMMs
    around it.  No number is fitted for it (issue 12's sixteenth round: NeMo's long-sequence tables, where
    attention is up to 97 % of the work, had shown the attention priced 15-19 % fast)."""
    return ((_gt.sustained_ratio(family, "bf16") if sustained is None else sustained)
            * (_gt.STEP_SHARE if step_share is None else step_share))


# FlashAttention's forward+backward throughput as a share of dense peak, head dim 128, causal
# (FLOPs counted as FlashAttention counts them: the causal half):
# - A100: FlashAttention-2 reaches ~190 TFLOP/s fwd+bwd at 2K-8K tokens (Dao 2023, "FlashAttention-2",
#   Fig. 6) → 0.60 of 312;
# - H100/H200: FlashAttention-3 reaches ~500-550 TFLOP/s fwd+bwd BF16 (Shah et al. 2024,
#   "FlashAttention-3", backward and forward benchmarks) → 0.53 of 989.
FA_A100, FA_HOPPER = 0.60, 0.53
# FlashAttention-1 on A100 (issue 12's forty-fourth round): FlashAttention-2 yields "around 2× speedup compared to
# FlashAttention" (Dao 2023, abstract), which reached "only 25-40% of the theoretical maximum FLOPs/s" (its
# introduction) → half of FA2's share, 0.30 of 312, inside that range: for the runs of flash-attn 1.x
# (`attention_kernel="fa1"`; no measurement of it on another GPU is in this file, so the A100 only).
FA1_A100 = FA_A100 / 2
# FlashAttention-2 on H100: "only 35 % utilization" (Shah et al. 2024, FlashAttention-3, abstract) →
# 0.35 of 989, for runs that predate FlashAttention-3 (`attention_kernel="fa2"`).
FA2_HOPPER = 0.35
# B200: FlashAttention-3 is Hopper-only (sm90); Transformer Engine's fused attention on Blackwell is
# cuDNN's.  NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training (artifacts/
# sdpa_bf16_benchmark_results_NVIDIA_B200.csv, cuDNN 9.13, NGC PyTorch 25.09), BF16, causal, head dim 128,
# 128 query / 8 K/V heads, 8,192 tokens: forward 1.877 ms, backward 5.833 ms for a causal forward of
# 2.20 TFLOP → 3 × 2.20 TFLOP / 7.71 ms = 855 TFLOP/s in this model's count (backward = 2 × forward)
# → 0.38 of 2250.  The same file's FlashAttention-2 (2.7.4) takes 22.79 ms → 290 TFLOP/s → 0.129.
# The same file at every length it measured (512 ... 131,072 tokens), by the same count (3 × the causal
# forward's FLOPs / (forward + backward time) / 2250): the share a B200 keeps at short sequences and CP
# blocks is far below its 8,192-token one (cuDNN 0.15 at 2,048, 0.28 at 4,096).  No such curve is
# published for A100/H100 in a file; they keep their one share (measured at 2K-16K tokens).
B200_CUDNN_CURVE: tuple[tuple[int, float], ...] = (
    (512, 0.044), (1024, 0.111), (2048, 0.151), (4096, 0.281), (8192, 0.380), (16384, 0.433), (32768, 0.451),
    (65536, 0.437), (131072, 0.427))
B200_FA2_CURVE: tuple[tuple[int, float], ...] = (
    (512, 0.029), (1024, 0.044), (2048, 0.081), (4096, 0.111), (8192, 0.129), (16384, 0.136), (32768, 0.140),
    (65536, 0.141), (131072, 0.141))
# GB200: the same benchmark's GB200 file (artifacts/sdpa_bf16_benchmark_results_NVIDIA_GB200.csv; cuDNN through
# its frontend, `cudnn_fe`, and PyTorch's FlashAttention-2, `pyt_flash_attention`), same shapes, same count, of
# 2500: its own measurement, in place of the B200's share it borrowed until issue 12's tenth round
GB200_CUDNN_CURVE: tuple[tuple[int, float], ...] = (
    (512, 0.120), (1024, 0.197), (2048, 0.253), (4096, 0.388), (8192, 0.445), (16384, 0.477), (32768, 0.490),
    (65536, 0.449), (131072, 0.431))
GB200_FA2_CURVE: tuple[tuple[int, float], ...] = (
    (512, 0.052), (1024, 0.075), (2048, 0.097), (4096, 0.113), (8192, 0.122), (16384, 0.127), (32768, 0.130),
    (65536, 0.131), (131072, 0.131))
# cuDNN's generation.  The B200 file above ran NGC PyTorch 25.09 (cuDNN 9.13.1: the benchmark README at the
# commit that holds it, cudnn-frontend 0b1577c), the GB200 file NGC PyTorch 25.11 (cuDNN 9.17.0, cudnn-frontend
# b372d39), so their shares differ by software as well as by GPU.  The GB300 was measured in both (its
# artifacts file at each commit): the newer generation runs the same shapes 1.17x faster at 8,192 tokens (1.29x
# at 4,096, 1.12x at 16,384).  Bridged through it, each GPU's curve in the other generation: the GB200 at cuDNN
# 9.13 = its 9.17 times x the GB300's 9.13/9.17 ratio at the same length (0.380 of 2500 at 8,192 tokens -- the
# B200's own 0.380 of 2250: at equal software the two keep the same share of peak), the B200 at cuDNN 9.17 the
# other way.  `--attention-kernel cudnn9.13 | cudnn9.17` picks the generation a run's container had; by default
# each GPU takes its own file's (B200 9.13, GB200 9.17).  At 512-1,024 tokens the two harnesses differ (PyTorch's
# SDPA in the 25.09 files, the frontend directly in the 25.11 ones), so the bridge there is mostly launch cost.
GB200_CUDNN913_CURVE: tuple[tuple[int, float], ...] = (
    (512, 0.026), (1024, 0.087), (2048, 0.174), (4096, 0.301), (8192, 0.380), (16384, 0.427), (32768, 0.447),
    (65536, 0.416), (131072, 0.406))
B200_CUDNN917_CURVE: tuple[tuple[int, float], ...] = (
    (512, 0.198), (1024, 0.249), (2048, 0.219), (4096, 0.363), (8192, 0.445), (16384, 0.484), (32768, 0.494),
    (65536, 0.472), (131072, 0.453))
# GB300 (issue 12's twenty-first round): its own files of the same benchmark, the ones the eleventh round bridged
# through -- cuDNN 9.17 (cudnn-frontend b372d39, NGC PyTorch 25.11, `cudnn_fe`), 9.13 (0b1577c, NGC 25.09, PyTorch's
# SDPA `pyt_cudnn`) and PyTorch's FlashAttention-2 (b372d39, `pyt_flash_attention`, 2.8.3) -- by the same count, of
# 2500.  Blackwell Ultra doubles the exponentials attention's softmax needs (NVIDIA's description: SFU EX2 rate),
# and it shows: 0.487 of peak at 8,192 tokens against the GB200's 0.445 in the same container.  The B300 has no
# file: it takes the GB300's shares of its own peak, as the B200 and the GB200 keep the same share at equal
# software (0.380 each at cuDNN 9.13, above).
GB300_CUDNN_CURVE: tuple[tuple[int, float], ...] = (
    (512, 0.123), (1024, 0.200), (2048, 0.255), (4096, 0.421), (8192, 0.487), (16384, 0.523), (32768, 0.536),
    (65536, 0.522), (131072, 0.503))
GB300_CUDNN913_CURVE: tuple[tuple[int, float], ...] = (
    (512, 0.027), (1024, 0.089), (2048, 0.176), (4096, 0.327), (8192, 0.417), (16384, 0.469), (32768, 0.489),
    (65536, 0.483), (131072, 0.474))
GB300_FA2_CURVE: tuple[tuple[int, float], ...] = (
    (512, 0.052), (1024, 0.076), (2048, 0.099), (4096, 0.114), (8192, 0.124), (16384, 0.129), (32768, 0.132),
    (65536, 0.133), (131072, 0.133))
# AMD Instinct (issue 12's twenty-sixth round): AITER's fused attention kernels (fwd_v3 / bwd_v3, the CK backend
# Transformer Engine on ROCm runs), measured in ROCm/aiter op_tests/cpp/mha/README.md (0403bcd): BF16, head dim 128,
# causal, batch 4 with 32 query / 8 K/V heads at 4,096 and 8,192 tokens, batch 1 with 64 / 8 at 16,384; forward and
# the bf16-atomic backward ("a16", what AMD's MLPerf v5.1 configs run: NVTE_CK_IS_V3_ATOMIC_FP32=0), TFLOP/s
# (MI300X; MI355X): 4,096: 486.73 / 464.83; 1130.115 / 957.41 -- 8,192: 547.09 / 468.205; 1318.92 / 1069.935 --
# 16,384: 541.55 / 458.075; 1392.485 / 1162.805.  The benchmark counts the causal half and a backward of 2.5x the
# forward's FLOPs (aiter's benchmark_mha_bwd.cpp: Q@K, dS@Q, dS@K and dO@V, P@dO); this model prices the backward as
# 2x the forward, so a kernel pair that takes 1/fwd + 2.5/bwd per FLOP of forward keeps 3 / (1/fwd + 2.5/bwd) of peak.
def _fa_pair_share(fwd: float, bwd: float, peak: float) -> float:
    """A forward/backward kernel pair's share of peak in this model's count (see above)."""
    return round(3.0 / (1.0 / fwd + 2.5 / bwd) / peak, 3)


MI300X_CK_CURVE: tuple[tuple[int, float], ...] = tuple(
    (s, _fa_pair_share(f, b, 1307.4)) for s, f, b in ((4096, 486.73, 464.83), (8192, 547.09, 468.205),
                                                       (16384, 541.55, 458.075)))
MI355X_CK_CURVE: tuple[tuple[int, float], ...] = tuple(
    (s, _fa_pair_share(f, b, 2500.0)) for s, f, b in ((4096, 1130.115, 957.41), (8192, 1318.92, 1069.935),
                                                       (16384, 1392.485, 1162.805)))
# the 8,192-token shares: what `attn_eff` reports and `--attention-kernel` swaps (the curves give the rest)
FA_B200_CUDNN, FA2_B200 = dict(B200_CUDNN_CURVE)[8192], dict(B200_FA2_CURVE)[8192]
FA_GB200_CUDNN, FA2_GB200 = dict(GB200_CUDNN_CURVE)[8192], dict(GB200_FA2_CURVE)[8192]
FA_GB300_CUDNN, FA2_GB300 = dict(GB300_CUDNN_CURVE)[8192], dict(GB300_FA2_CURVE)[8192]
ATTENTION_KERNELS = ("fa1", "fa2", "fa3", "cudnn9.13", "cudnn9.17")
_CUDNN_CURVES: dict[str, dict[str, tuple[tuple[int, float], ...]]] = {
    "b200": {"cudnn9.13": B200_CUDNN_CURVE, "cudnn9.17": B200_CUDNN917_CURVE},
    "gb200": {"cudnn9.13": GB200_CUDNN913_CURVE, "cudnn9.17": GB200_CUDNN_CURVE},
    "gb300": {"cudnn9.13": GB300_CUDNN913_CURVE, "cudnn9.17": GB300_CUDNN_CURVE},
    "b300": {"cudnn9.13": GB300_CUDNN913_CURVE, "cudnn9.17": GB300_CUDNN_CURVE},
}
# The share of each FlashAttention generation a catalogue GPU runs (its default, `Device.attn_eff`, is
# the newest it has): A100 FA2 only; FA3 on Hopper; B200's default is cuDNN's fused kernel, no FA3.
_KERNEL_SHARES: dict[str, dict[str, float]] = {
    "a100-40gb": {"fa1": FA1_A100, "fa2": FA_A100}, "a100-80gb": {"fa1": FA1_A100, "fa2": FA_A100},
    "h100-sxm": {"fa2": FA2_HOPPER, "fa3": FA_HOPPER}, "h200": {"fa2": FA2_HOPPER, "fa3": FA_HOPPER},
    "gh200": {"fa2": FA2_HOPPER, "fa3": FA_HOPPER}, "gh200-144gb": {"fa2": FA2_HOPPER, "fa3": FA_HOPPER},
    "b200": {"fa2": FA2_B200, **{k: dict(v)[8192] for k, v in _CUDNN_CURVES["b200"].items()}},
    "gb200": {"fa2": FA2_GB200, **{k: dict(v)[8192] for k, v in _CUDNN_CURVES["gb200"].items()}},
    **{g: {"fa2": FA2_GB300, **{k: dict(v)[8192] for k, v in _CUDNN_CURVES[g].items()}} for g in ("b300", "gb300")},
}
# the measured curves of those kernels, where there are (B200, GB200, GB300: cudnn-frontend's files above)
_KERNEL_CURVES: dict[str, dict[str, tuple[tuple[int, float], ...]]] = {
    "b200": {"fa2": B200_FA2_CURVE, **_CUDNN_CURVES["b200"]},
    "gb200": {"fa2": GB200_FA2_CURVE, **_CUDNN_CURVES["gb200"]},
    **{g: {"fa2": GB300_FA2_CURVE, **_CUDNN_CURVES[g]} for g in ("b300", "gb300")},
}


def with_attention_kernel(dev: Device, kernel: str | None) -> Device:
    """The device with the FlashAttention generation a run used (None: the newest the GPU has:
    FlashAttention-3 on H100/H200, cuDNN's fused attention on B200, FlashAttention-2 on A100).  A GPU
    described by a hardware file (or a catalogue GPU whose `attn_eff` it overrides) is priced as Hopper
    when its share is Hopper's FA3 one, else keeps its `attn_eff` for "fa2" and refuses "fa3"."""
    if kernel is None or not dev.flash:
        return dev
    if kernel not in ATTENTION_KERNELS:
        raise HardwareError(f"attention kernel {kernel!r}: choose one of {', '.join(ATTENTION_KERNELS)}")
    shares = _KERNEL_SHARES.get(dev.name)
    if shares is None or (dev.name in DEVICES and dev.attn_eff != DEVICES[dev.name].attn_eff):
        shares = _KERNEL_SHARES["h100-sxm"] if dev.attn_eff == FA_HOPPER else {"fa2": dev.attn_eff}
    if kernel not in shares:
        if kernel.startswith("cudnn"):
            raise HardwareError(f"attention kernel {kernel!r}: cuDNN's fused attention is priced by generation on "
                                f"Blackwell (B200, GB200, B300, GB300) only, not {dev.name}; use 'fa2' or 'fa3' or leave "
                                f"--attention-kernel out (the GPU's newest)")
        if kernel == "fa1":
            raise HardwareError(f"attention kernel 'fa1': FlashAttention-1 is priced on the A100 only (the GPU its "
                                f"share was measured on), not {dev.name}; use 'fa2' or leave --attention-kernel out")
        raise HardwareError(f"attention kernel {kernel!r}: FlashAttention-3 runs on Hopper (H100, H200, GH200) only, "
                            f"not {dev.name}; use 'fa2' or leave --attention-kernel out (the GPU's newest)")
    return replace(dev, attn_eff=shares[kernel], attn_curve=_KERNEL_CURVES.get(dev.name, {}).get(kernel, ()))


# FP8 attention (Transformer Engine's fp8_dot_product_attention, Megatron-Core's --fp8-dot-product-attention: cuDNN's
# fused attention with FP8 Q, K, V; issue 12's twenty-seventh round).  NVIDIA/cudnn-frontend's sdpa benchmark times
# both precisions in one file, same harness and shapes as the BF16 curves above (causal, head dim 128, 128 query / 8
# K/V heads, batch 1): artifacts/sdpa_fp8_benchmark_results_NVIDIA_{B200,GB300}.csv at 0b1577c and ..._GB200.csv at
# d48a60e.  Per length, (BF16 forward, BF16 backward, FP8 forward, FP8 backward) in ms; an FP8 kernel pair runs in
# (fwd + bwd) of BF16 over (fwd + bwd) of FP8 less time -- a ratio of times, the same in any FLOP count.  The files
# are of two cuDNN generations, and the ratio moves with it (at 8,192 tokens 1.22x on the B200 and 1.29x on the
# GB300 at 9.13, 1.08x on the GB200 at 9.17, whose BF16 kernel gained more), so a run's ratio is taken from the
# generation of its attention kernel (`--attention-kernel`, or the GPU's default): at cuDNN 9.13 the GPU's own file,
# the GB200 the B200's (the same die, as the BF16 bridge above) and the B300 the GB300's; at 9.17 the GB200's, the one
# measurement of that generation, for every Blackwell part -- an assumption.
_FP8_ATTN_MS: dict[str, tuple[tuple[int, float, float, float, float], ...]] = {
    "b200": ((512, 0.035, 0.107, 0.044, 0.126), (1024, 0.061, 0.228, 0.067, 0.228), (2048, 0.151, 0.630, 0.141, 0.618),
             (4096, 0.482, 1.650, 0.447, 1.414), (8192, 1.589, 5.526, 1.464, 4.382),
             (16384, 5.962, 19.094, 5.197, 14.964), (32768, 23.228, 74.527, 19.751, 55.593),
             (65536, 94.215, 284.695, 77.531, 216.304), (131072, 395.922, 1248.042, 307.690, 870.832)),
    "gb200": ((512, 0.021, 0.066, 0.018, 0.072), (1024, 0.047, 0.163, 0.040, 0.157), (2048, 0.129, 0.524, 0.104, 0.512),
              (4096, 0.399, 1.304, 0.331, 1.264), (8192, 1.389, 4.539, 1.161, 4.352),
              (16384, 5.257, 16.875, 4.327, 16.020), (32768, 20.855, 67.092, 16.564, 61.559),
              (65536, 88.377, 282.172, 64.518, 242.637), (131072, 382.750, 1185.117, 259.183, 977.197)),
    "gb300": ((512, 0.049, 0.123, 0.063, 0.147), (1024, 0.070, 0.235, 0.081, 0.233), (2048, 0.137, 0.631, 0.133, 0.599),
              (4096, 0.380, 1.459, 0.328, 1.189), (8192, 1.281, 4.778, 1.060, 3.632),
              (16384, 4.791, 17.037, 3.881, 12.595), (32768, 18.680, 65.150, 14.961, 46.779),
              (65536, 76.825, 251.544, 58.975, 180.145), (131072, 323.592, 1044.691, 236.917, 715.422)),
}
_FP8_SPEEDUP = {g: tuple((n, round((bf + bb) / (ff + fb), 3)) for n, bf, bb, ff, fb in rows)
                for g, rows in _FP8_ATTN_MS.items()}
# cuDNN generation -> GPU -> (tokens, FP8/BF16 speed-up)
FP8_ATTN_SPEEDUP: dict[str, dict[str, tuple[tuple[int, float], ...]]] = {
    "cudnn9.13": {"b200": _FP8_SPEEDUP["b200"], "gb200": _FP8_SPEEDUP["b200"], "b300": _FP8_SPEEDUP["gb300"],
                  "gb300": _FP8_SPEEDUP["gb300"]},
    "cudnn9.17": {g: _FP8_SPEEDUP["gb200"] for g in ("b200", "gb200", "b300", "gb300")},
}


def with_fp8_attention(dev: Device) -> Device:
    """A device whose attention kernel runs in FP8 (`--fp8-attention`): its attention shares (of the BF16 peak, as
    the model counts them) times cuDNN's measured FP8/BF16 speed-up at each length, of its kernel's generation
    (`FP8_ATTN_SPEEDUP`)."""
    gen = next((k for k, v in _CUDNN_CURVES.get(dev.name, {}).items() if v == dev.attn_curve), None)
    if gen is None:
        have = ", ".join(FP8_ATTN_SPEEDUP["cudnn9.13"])
        raise HardwareError(f"FP8 attention runs on cuDNN's fused attention, measured on {have}: not on {dev.name} "
                            f"with this attention kernel; drop --fp8-attention (or --attention-kernel fa2)")
    speedup = FP8_ATTN_SPEEDUP[gen][dev.name]
    curve = tuple((n, round(v * log2_interp(speedup, n), 4)) for n, v in dev.attn_curve)
    return replace(dev, attn_curve=curve, attn_eff=dev.attn_eff * log2_interp(speedup, 8192))


# GPUs whose tensor cores take MXFP8's block scales (Blackwell's block-scaled MMA; Hopper has none): NVIDIA's
# Blackwell architecture (B200 / GB200 datasheets list FP8/FP6 at one rate; the MX formats are among them)
MXFP8_GPUS = ("b200", "gb200", "b300", "gb300")


def layer_gemm_dtype(dev: Device, dtype: str, fp8_block: str) -> str:
    """The dtype a layer's Transformer Engine GEMMs are priced at: the block-scaled recipe ("mxfp8", "nvfp4") on a
    device that has its rate (`with_mxfp8`, `with_nvfp4`), else the training dtype."""
    return fp8_block if fp8_block and dtype == "fp8" and fp8_block in dev.peak_flops else dtype


def with_mxfp8(dev: Device) -> Device:
    """A Blackwell device with MXFP8's GEMMs (`--fp8-scaling mxfp8`) as a dtype of their own: the FP8 peak, and the
    BF16 share of peak times MXFP8's measured kernel speed over BF16's (gemm_table.MXFP8_OVER_BF16) over the
    peaks' ratio -- so that an MXFP8 GEMM runs 1.75x the BF16 one, as Transformer Engine's B300 measurement does."""
    peak = dev.peak_flops["fp8"]
    share = dev.gemm["bf16"] * dev.peak_flops["bf16"] / peak * _gt.MXFP8_OVER_BF16
    return replace(dev, peak_flops={**dev.peak_flops, "mxfp8": peak}, gemm={**dev.gemm, "mxfp8": share})


def with_nvfp4(dev: Device) -> Device:
    """A Blackwell device with NVFP4's GEMMs (`--dtype nvfp4`) as a dtype of their own: its dense FP4 peak
    (gemm_table.FP4_PEAK) and the share of it at which an NVFP4 GEMM runs NVFP4_OVER_BF16 (3.42x) the BF16 one, as
    Transformer Engine's B300 measurement does (a rule chosen after Megatron-Bridge's NVFP4 rows: gemm_table.py)."""
    peak = _gt.FP4_PEAK[dev.name] * TFLOPS
    share = dev.gemm["bf16"] * dev.peak_flops["bf16"] / peak * _gt.NVFP4_OVER_BF16
    return replace(dev, peak_flops={**dev.peak_flops, "nvfp4": peak}, gemm={**dev.gemm, "nvfp4": share})


def _instinct(name: str, peaks: dict[str, float], hbm_gbps: float, mem_gib: int, cus: int,
              curve: tuple[tuple[int, float], ...]) -> Device:
    """An AMD Instinct device: its GEMM table entry (gemm_table.py), AITER's attention curve, CUs as SMs."""
    return Device(name, peaks, hbm_gbps * GB, mem_gib * GiB, cus, gemm=_gemm(name), attn_eff=dict(curve)[8192],
                  attn_curve=curve, attn_sustain=attn_sustain_of(name))


DEVICES: dict[str, Device] = {
    "a100-40gb": Device("a100-40gb", _peaks(312, 19.5), 1555 * GB, 40 * GiB, 108, gemm=_gemm("a100"),
                        attn_eff=FA_A100, attn_sustain=attn_sustain_of("a100")),
    "a100-80gb": Device("a100-80gb", _peaks(312, 19.5), 2039 * GB, 80 * GiB, 108, gemm=_gemm("a100"),
                        attn_eff=FA_A100, attn_sustain=attn_sustain_of("a100")),
    "h100-sxm": Device("h100-sxm", _peaks(989, 67, 1979), 3350 * GB, 80 * GiB, 132, gemm=_gemm("h100"),
                       attn_eff=FA_HOPPER, attn_sustain=attn_sustain_of("h100")),
    "h200": Device("h200", _peaks(989, 67, 1979), 4800 * GB, 141 * GB, 132, gemm=_gemm("h200"),
                   attn_eff=FA_HOPPER, attn_sustain=attn_sustain_of("h200")),
    "b200": Device("b200", _peaks(2250, 80, 4500), 8000 * GB, 180 * GB, 148, gemm=_gemm("b200"),
                   attn_eff=FA_B200_CUDNN, attn_curve=B200_CUDNN_CURVE, attn_sustain=attn_sustain_of("b200")),
    # GB200 NVL72 (NVIDIA GB200 NVL72 specifications, per GPU): the B200 die at 1200 W, 2500 BF16 / 5000 FP8
    # dense, 186 GB HBM3e at 8 TB/s; 72 GPUs in one NVLink 5 domain (DEFAULT_GPUS_PER_NODE).  Attention: its
    # own cuDNN measurement (GB200_CUDNN_CURVE; 0.445 at 8,192 tokens; the B200's 0.38 until issue 12's tenth round).
    "gb200": Device("gb200", _peaks(2500, 80, 5000), 8000 * GB, 186 * GB, 148, gemm=_gemm("gb200"),
                    attn_eff=FA_GB200_CUDNN, attn_curve=GB200_CUDNN_CURVE,
                    attn_sustain=attn_sustain_of("gb200")),
    # Blackwell Ultra (module docstring): B300 8 per node, GB300 72 per NVLink domain; GEMMs from gemm_table (the
    # B300's measured MAMF, the GB300's bridged), attention from the GB300's own cuDNN 9.17 file (the B300 takes it)
    "b300": Device("b300", _peaks(2250, 80, 4500), 8000 * GB, 288 * GB, 160, gemm=_gemm("b300"),
                   attn_eff=FA_GB300_CUDNN, attn_curve=GB300_CUDNN_CURVE, attn_sustain=attn_sustain_of("b300")),
    "gb300": Device("gb300", _peaks(2500, 80, 5000), 8000 * GB, 288 * GB, 160, gemm=_gemm("gb300"),
                    attn_eff=FA_GB300_CUDNN, attn_curve=GB300_CUDNN_CURVE, attn_sustain=attn_sustain_of("gb300")),
    # Grace Hopper (module docstring): the Hopper die and FlashAttention-3 share; GEMMs from the GH200's own measured
    # MAMF, the 96 GB HPC module's sustained ratios fitted (gemm_table), the 144 GB HBM3e module's the H200's; 96 GB
    # HBM3 (read as GiB, as the H100's 80) or 144 GB HBM3e
    "gh200": Device("gh200", _peaks(989, 67, 1979), 4000 * GB, 96 * GiB, 132, gemm=_gemm("gh200"),
                    attn_eff=FA_HOPPER, attn_sustain=attn_sustain_of("gh200")),
    "gh200-144gb": Device("gh200-144gb", _peaks(989, 67, 1979), 4900 * GB, 144 * GB, 132, gemm=_gemm("gh200-144gb"),
                          attn_eff=FA_HOPPER, attn_sustain=attn_sustain_of("gh200-144gb")),
    # AMD Instinct (issue 12's twenty-sixth round; module docstring): CUs counted as SMs for the waves; memory in GiB as
    # ROCm's GPU-specs table gives it ("VRAM (GiB)": 192, 256, 288); AITER's attention (MI325X: the MI300X's die and
    # kernels, no measurement of its own)
    "mi300x": _instinct("mi300x", _peaks(1307.4, 163.4, 2614.9), 5300, 192, 304, MI300X_CK_CURVE),
    "mi325x": _instinct("mi325x", _peaks(1307.4, 163.4, 2614.9), 6000, 256, 304, MI300X_CK_CURVE),
    "mi355x": _instinct("mi355x", _peaks(2500, 157.3, 5000), 8000, 288, 256, MI355X_CK_CURVE),
    # MI350X: the MI355X's die at 2200 MHz and 1000 W (FP32 by the clock); its kernels keep the MI355X's shares of peak
    "mi350x": _instinct("mi350x", _peaks(2306.9, 144.2, 4613.7), 8000, 288, 256, MI355X_CK_CURVE),
}
# Blackwell's block-scaled MMA takes MXFP8 and NVFP4
DEVICES.update({g: with_nvfp4(with_mxfp8(DEVICES[g])) for g in MXFP8_GPUS})
ALIASES = {"a100": "a100-80gb", "h100": "h100-sxm", "a100-80g": "a100-80gb", "a100-40g": "a100-40gb",
           "h100-80gb": "h100-sxm", "b200-sxm": "b200", "gb200-nvl72": "gb200", "b300-sxm": "b300",
           "gb300-nvl72": "gb300", "gh200-96gb": "gh200"}

LINKS: dict[str, Link] = {
    "nvlink3": Link("nvlink3", 3 * US, 300 * GB),  # A100 NVLink/NVSwitch, per direction per GPU
    "nvlink4": Link("nvlink4", 3 * US, 450 * GB),  # H100/H200 NVLink/NVSwitch
    "ib-hdr": Link("ib-hdr", 2 * US, 25 * GB),  # 200 Gb/s per GPU
    "ib-ndr": Link("ib-ndr", 2 * US, 50 * GB),  # 400 Gb/s per GPU
    "nvlink5": Link("nvlink5", 3 * US, 900 * GB),  # B200 NVLink 5
    "ib-xdr": Link("ib-xdr", 2 * US, 100 * GB),  # 800 Gb/s per GPU (ConnectX-8: B300, GB300)
    "nic-200g": Link("nic-200g", 2 * US, 25 * GB),  # 200 Gb/s per GPU: Slingshot-11 or IB NDR200 (GH200 nodes)
    "pcie4": Link("pcie4", 5 * US, 32 * GB),
    "pcie5": Link("pcie5", 5 * US, 64 * GB),
    # Grace <-> Blackwell: NVLink-C2C, 900 GB/s bidirectional per superchip (NVIDIA GB200 NVL72 / GB300 NVL72
    # specifications), shared by its two GPUs: 225 GB/s per GPU and direction (the split is an assumption)
    "nvlink-c2c": Link("nvlink-c2c", 5 * US, 225 * GB),
    # Grace <-> Hopper: the same 900 GB/s bidirectional NVLink-C2C, one GPU per superchip (GH200 specifications)
    "nvlink-c2c-gh200": Link("nvlink-c2c-gh200", 5 * US, 450 * GB),
    # AMD Instinct MI300X / MI325X: seven Infinity Fabric (xGMI) links per GPU, 64 GB/s each per direction, a fully
    # connected 8-GPU mesh (ROCm docs mi300.md; AMD's RCCL/xGMI blog): 448 GB/s per GPU over all seven (`mesh_share`)
    "xgmi3": Link("xgmi3", 3 * US, 448 * GB),
    # MI355X: seven links of 153.6 GB/s bidirectional (a secondary source, not AMD's text: an assumption), 76.8 each
    # per direction, 537.6 per GPU
    "xgmi4": Link("xgmi4", 3 * US, 537.6 * GB),
}
# the link between a GPU and its host's memory, what activation offloading (`Cluster.offload_layers`) copies over:
# the Grace superchips' NVLink-C2C; PCIe Gen4 (A100) / Gen5 x16 on the x86 DGX/HGX nodes
HOST_LINKS: dict[str, str] = {"gb200": "nvlink-c2c", "gb300": "nvlink-c2c", "a100-40gb": "pcie4", "a100-80gb": "pcie4",
                              "gh200": "nvlink-c2c-gh200", "gh200-144gb": "nvlink-c2c-gh200"}
# the host's DRAM behind a GPU, what an offloaded optimizer step (`Cluster.offload_optimizer`, dp_tail.optimizer_time)
# streams its states through: (GB/s at the memory's line rate -- channels x transfer rate x 8 B --, GPUs sharing it).
# DGX A100: 2 x AMD EPYC 7742, 8 channels of DDR4-3200 each (AMD's 204.8 GB/s a socket); DGX H100 / H200: 2 x Xeon
# Platinum 8480C, 8 of DDR5-4800 (307.2 GB/s a socket); DGX B200: 2 x Xeon Platinum 8570, 8 of DDR5-5600 (358.4 GB/s);
# Grace: 512 GB/s of LPDDR5X (the GB200 NVL72's 18.4 TB/s over its 36 Graces), one per two GPUs in GB200 / GB300
# (GB300's taken as GB200's), one per GPU in GH200 (taken as the same Grace).  Line rate, not a measured share: the
# CPU step priced on it is a lower bound of its time (docs/planner.md §3).
HOST_MEM: dict[str, tuple[float, int]] = {"a100-40gb": (409.6, 8), "a100-80gb": (409.6, 8), "h100-sxm": (614.4, 8),
                                          "h200": (614.4, 8), "b200": (716.8, 8), "gb200": (512.0, 2),
                                          "gb300": (512.0, 2), "gh200": (512.0, 1), "gh200-144gb": (512.0, 1)}
DEFAULT_LINKS = {  # (intra-node, inter-node NIC) for a DGX/HGX-style node: one NIC per GPU
    "a100-40gb": ("nvlink3", "ib-hdr"),
    "a100-80gb": ("nvlink3", "ib-hdr"),
    "h100-sxm": ("nvlink4", "ib-ndr"),
    "h200": ("nvlink4", "ib-ndr"),
    "b200": ("nvlink5", "ib-ndr"),
    # a GB200 compute tray: 4 GPUs, 4 ConnectX-7 at 400 Gb/s (one per GPU) out of the NVLink domain
    "gb200": ("nvlink5", "ib-ndr"),
    # Blackwell Ultra systems: one ConnectX-8 at 800 Gb/s per GPU (DGX B300; the GB300 NVL72's compute trays)
    "b300": ("nvlink5", "ib-xdr"),
    "gb300": ("nvlink5", "ib-xdr"),
    # a GH200 node (HPE Cray EX254n, BullSequana XH3000): four GPUs on NVLink 4, one 200 Gb/s NIC each
    "gh200": ("nvlink4", "nic-200g"),
    "gh200-144gb": ("nvlink4", "nic-200g"),
    # AMD Instinct platforms: 8 GPUs on Infinity Fabric, one 400 Gb/s NIC per GPU (AMD's ROCm deployment guides: 8
    # Pensando Pollara 400 NICs per MI355X node, "a dedicated 1:1 mapping between GPUs and network interfaces"; the
    # MI300X platforms likewise, an assumption: `ib-ndr` is any 400 Gb/s NIC)
    "mi300x": ("xgmi3", "ib-ndr"),
    "mi325x": ("xgmi3", "ib-ndr"),
    "mi355x": ("xgmi4", "ib-ndr"),
    "mi350x": ("xgmi4", "ib-ndr"),
}
# GPUs that share the intra-node (NVLink) link: 8 in a DGX/HGX node; the GB200 NVL72 rack's 72 GPUs are
# one NVLink domain (a job may take part of a rack: a group is priced by the ranks it spans, comm.py)
DEFAULT_GPUS_PER_NODE: dict[str, int] = {"gb200": 72, "gb300": 72, "gh200": 4, "gh200-144gb": 4}


def default_gpus_per_node(gpu: str) -> int:
    """The catalogue GPU's NVLink domain: 8 (DGX/HGX) unless DEFAULT_GPUS_PER_NODE says otherwise."""
    name = ALIASES.get(gpu.lower(), gpu.lower())
    return DEFAULT_GPUS_PER_NODE.get(name, 8)


CP_COMMS = ("ring", "all-gather", "a2a")  # how context parallelism moves K/V (Cluster.cp_comm)
EP_DISPATCHES = ("alltoall", "dedup")  # how a mixture of experts' tokens cross nodes (Cluster.ep_dispatch)
P2P_BLOCKING = ("none", "1f1b", "all")  # whether the framework's pipeline sends hold their GPU (Cluster.p2p_blocking)
MOE_DISPATCHERS = ("alltoall", "flex")  # Megatron-Core's token dispatcher of a mixture of experts (Cluster.moe_dispatcher)
# Transformer Engine's low-precision recipes (Cluster.fp8_scaling): FP8 by tensor (delayed, current), by block (mxfp8),
# and NVFP4 (`--dtype nvfp4`: the layers' GEMMs in 4 bits, everything else as FP8 training keeps it)
FP8_SCALINGS = ("delayed", "current", "mxfp8", "nvfp4")


def fp8_scaling_error(gpu: str, dtype: str, scaling: str) -> str | None:
    """Why an FP8 recipe cannot run on a GPU (None: it can): the recipe unknown, or MXFP8 off Blackwell."""
    if scaling not in FP8_SCALINGS:
        return f"fp8 scaling {scaling!r}: choose one of {', '.join(FP8_SCALINGS)}"
    if scaling in ("mxfp8", "nvfp4") and dtype == "fp8" and gpu not in MXFP8_GPUS:
        return (f"{'fp8 scaling ' if scaling == 'mxfp8' else 'precision '}{scaling!r} needs Blackwell tensor cores "
                f"(block-scaled MMA: {', '.join(MXFP8_GPUS)}), not {gpu}; use --dtype fp8 with --fp8-scaling delayed or "
                f"current")
    return None


@dataclass(frozen=True)
class Cluster:
    """GPUs, nodes and links.  `inter` is the inter-node bandwidth *per GPU* (the node's NICs shared
    by its GPUs: nics_per_node × NIC bandwidth / gpus_per_node); `nics_per_node` None means one NIC
    per GPU (a DGX), so `inter` is also one NIC.  `hierarchical` prices collectives as NCCL runs
    them (comm.collective); False keeps the seed's flat ring over the slowest link."""

    device: Device
    gpus: int
    gpus_per_node: int
    intra: Link
    inter: Link
    dtype: str = "bf16"
    # what the host and par3d's runtime add to the step-time model (plan/profile.py); None: a GPU
    # cluster as the arithmetic alone describes it
    profile: Profile | None = None
    nics_per_node: int | None = None
    flash_attention: bool = True  # use FlashAttention where the device has it
    hierarchical: bool | None = None  # None: NCCL-like with the table kernel model, flat with the flat one
    # the framework reduces gradients bucket by bucket during the backward (PyTorch DDP/FSDP, Megatron-LM
    # with --overlap-grad-reduce); False: after it (Megatron-LM before 2023, DeepSpeed's default)
    overlap_grad_reduce: bool = True
    # ZeRO-1/2: the updated weights' all-gather runs one bucket ahead of the next step's forward
    # (Megatron-Core's --overlap-param-gather, Apex DistributedFusedAdam's overlap_param_sync, which
    # NeMo's and Megatron-Bridge's recipes set); False: after the optimizer, exposed (Megatron-LM's
    # default, DeepSpeed's ZeRO-1/2)
    overlap_param_gather: bool = True
    # the framework reduces gradients over DP/CP in fp32 and keeps fp32 (main) gradients: Megatron-Core's
    # `grad_reduce_in_fp32` (Megatron-LM sets it for bf16 unless told otherwise), PyTorch FSDP's
    # `reduce_dtype=torch.float32` (torchtitan's default), Llama 3's FSDP (Grattafiori et al. 2024 §3.3.4);
    # False: in the training dtype, 2 B per gradient (the seed's count; NVIDIA's perf recipes)
    grad_reduce_fp32: bool = False
    # DeepSpeed's BF16_Optimizer (bf16 with the config's ZeRO stage 0: "it implements its own zero stage 1
    # equivalent"; BLOOM-176B's run): each micro-batch's bf16 gradients added into a full fp32 buffer, the bf16
    # gradients all-reduced (not reduce-scattered) over DP after the backward, the updated bf16 shards all-gathered
    # (dp_tail.bf16_optimizer_accumulation, dp_tail.optimizer_time, memory "bf16_optimizer" accounting)
    bf16_optimizer: bool = False
    # ZeRO-1 whose gradient reduction is a full all-reduce over DP after the backward, not a reduce-scatter, each rank
    # then stepping its shard and all-gathering the updated weights (Aleph Alpha's scaling: optimizer.py's
    # `allreduce_gradients` under `zero`, allreduce.py's `allreduce_no_retain`; DeepSpeed's ZeRO-1 with
    # `reduce_scatter: false` moves the same bytes); False: ZeRO-1/2 reduce-scatter their gradients
    zero1_all_reduce: bool = False
    # the gradients are held in the training dtype and cast to fp32 bucket by bucket for their reduction, then copied
    # back (Aleph Alpha's scaling: allreduce.py's flatten, 1/dp scale, `tensor.to(torch.float32)`, all-reduce and two
    # copies back): 4 B a gradient in the collective, 2 B held (unlike `grad_reduce_fp32`'s fp32 main gradients), the
    # passes serial with it (dp_tail.GRAD_CAST_BYTES)
    grad_reduce_cast: bool = False
    # what ZeRO-3 gathers as one unit: "layer" (par3d's runtime, PyTorch FSDP wrapping each block:
    # one transformer block, prefetched one block ahead) or "submodule" (DeepSpeed ZeRO-3: every
    # parametrised sub-module's hook fetches its own weights, one weight matrix ahead; parallel_comm.py)
    zero3_unit: str = "layer"
    # the data-parallel runtime is PyTorch FSDP (FULL_SHARD for ZeRO-3, SHARD_GRAD_OP for ZeRO-2, HSDP; FairScale's
    # FSDP before it), each transformer block one wrapped unit: under ZeRO-2/3 every unit costs FSDP_UNIT_S per
    # micro-batch (cost.stage_times); ZeRO-0 is DDP, and the search skips ZeRO-1, which FSDP has not.
    # False: Megatron-Core's distributed optimizer or Megatron-FSDP, DeepSpeed
    fsdp: bool = False
    fsdp_unit_s: float = FSDP_UNIT_S  # what each unit costs under `fsdp` (calibration.fit_fsdp_unit varies it)
    # which PyTorch FSDP: 2 = fully_shard (torchtitan, NeMo AutoModel; PyTorch's current one), whose gathers land in a
    # flat buffer copied out to the parameters on the compute stream (parallel_comm.fsdp2_copy_out); 1 = FullyShardedDataParallel's
    # FlatParameter (llm-foundry / Composer, fms-fsdp) or FairScale's, whose parameters are views of the gathered tensor
    fsdp_version: int = 2
    # activation offloading (Megatron-Core's cpu_offloading_num_layers): the activations of this many transformer
    # layers go to host memory in the forward and come back in the backward, over `host` (plan_memory.offload_exposed);
    # Megatron-Core runs it without pipeline parallelism and without recomputation (the search keeps to those)
    offload_layers: int = 0
    # optimizer offloading (Megatron-Core's --optimizer-cpu-offload with --optimizer-offload-fraction; DeepSpeed's
    # offload_optimizer, the whole of it): this share of each rank's optimizer states lives in host memory and is
    # stepped there (`HOST_MEM`), its fp32 gradients copied down and its fp32 weights back up (dp_tail.optimizer_time)
    offload_optimizer: float = 0.0
    # Megatron-Core's TP communication overlap (`tp_comm_overlap`, Transformer Engine's userbuffers; needs
    # sequence parallelism): each TP all-gather runs in chunks under the GEMM that consumes it and each
    # reduce-scatter under the GEMM that produces it (parallel_comm.tp_overlap_exposed).  Off by default, as in
    # Megatron-Core; NeMo / Megatron-Bridge's H100 recipes turn it on.
    tp_comm_overlap: bool = False
    # whether the pipeline's point-to-point sends hold their rank until delivered (cost.p2p_blocks): "none" (par3d's
    # runtime posts each send and waits at the step's end), "1f1b" (Megatron-Core: the non-interleaved 1F1B waits on
    # each call, the interleaved schedule overlaps them, overlap_p2p_comm), "all" (DeepSpeed's pipeline engine,
    # Megatron-LM before overlap_p2p_comm)
    p2p_blocking: str = "none"
    # the pipeline's boundary tensors cross as the sender's 1/tp slice and are rebuilt by an all-gather over TP: the
    # receiving stage's forward gathers its input, the sending stage's backward its output and the gradient it receives
    # (DeepSpeed's pipeline engine at TP > 1: runtime/pipe/engine.py's PartitionedTensor, `is_pipe_partitioned =
    # is_model_parallel` from 65c2f974d, 2020, through 2022; without sequence parallelism)
    p2p_partitioned: bool = False
    # a mixture of experts' token all-to-alls overlapped with compute (Megatron-Core's
    # `overlap_moe_expert_parallel_comm`, the "moe_a2a_overlap" of Megatron-Bridge's recipes: one micro-batch's
    # dispatch and combine beside another's computation, DualPipe-style): cp_ep_comm.ep_exchange.  Off by default.
    ep_comm_overlap: bool = False
    # a mixture of experts' host floor, seconds per MoE layer forward + backward (fixed, per routed expert on the rank):
    # MOE_HOST_S where Megatron-Core runs without whole-iteration CUDA graphs (`--cuda-graphs partial|none`); (0, 0)
    # -- none, the default -- where whole iterations are captured (cp_ep_comm.moe_host_floor)
    moe_host_s: tuple[float, float] = (0.0, 0.0)
    # how a mixture of experts' tokens cross nodes (cp_ep_comm.ep_exchange): "alltoall" (Megatron-Core's alltoall dispatcher:
    # every copy bound for another node crosses the NICs) or "dedup" (DeepEP, HybridEP -- the flex dispatcher: once
    # per remote node, forwarded inside it over NVLink; moe_dispatcher "flex" prices it so too, as its code runs);
    # and whether the forward dispatch moves FP8 tokens
    ep_dispatch: str = "alltoall"
    ep_dispatch_fp8: bool = False
    # which of Megatron-Core's token dispatchers runs the MoE layers (cp_ep_comm.choice_layer_times): "alltoall" sorts the
    # copies a rank receives by local expert after the dispatch and back before the combine (its "Permutation 2",
    # compute.module_elementwise_bytes), "flex" (DeepEP, HybridEP) sends a row per destination rank and permutes the
    # rows received into the experts' copies (compute.ep_destination_ranks); "" follows ep_dispatch
    # (dedup is the flex dispatcher's scheme) -- `dispatcher`
    moe_dispatcher: str = ""
    # forward reduce-scatters that Transformer Engine's userbuffers overlap by its "pipeline" method instead
    # of the ring exchange: (GEMM name as compute.layer_gemms calls it, num_sm, num_splits) -- the GEMM runs
    # in num_splits chunks on SMs − num_sm (`set_sm_margin`) while num_sm SMs reduce-scatter the previous
    # chunk (parallel_comm.tp_overlap_exposed).  Empty: every forward collective by ring exchange (the backward: bulk and
    # ring exchange, as every config runs it).  A recipe's userbuffers
    # config says which (e.g. NeMo-Framework-Launcher conf/training/tp_overlap/*.yaml: proj_fprop/fc2_fprop)
    tp_overlap_pipeline: tuple[tuple[str, int, int], ...] = ()
    # how Transformer Engine scales FP8 tensors (dtype fp8 only): "delayed" (amax from earlier steps' history,
    # fused into the cast: one read) or "current" (Float8CurrentScaling: an amax pass over the tensor before
    # its cast, two reads; compute.elementwise_bytes).  NeMo 24.07 ran delayed, Megatron-Bridge's FP8-CS current;
    # "mxfp8" (MXFP8BlockScaling, Blackwell only: a scale per 32 elements found in the cast, `MXFP8_GPUS`), the
    # block-scaled GEMMs at their measured rate (`fp8_block`, `gemm_dtype`, `with_mxfp8`)
    fp8_scaling: str = "delayed"
    # dtype fp8: ZeRO-1/2's gather of updated weights moves fp8 copies (1 B per weight; Megatron-Core's DDP
    # `fp8_param_gather`, set by NeMo 2's and Megatron-Bridge's FP8 precision presets and by MLPerf's NeMo
    # configs, FP8_PARAM_GATHER / FP8_PARAMS) instead of bf16 (2 B, the default here: parallel_comm.weight_bytes)
    fp8_param_gather: bool = False
    # how context parallelism moves K/V (cp_ep_comm.py): "ring" passes blocks around the CP ring behind the
    # attention (Liu et al. 2023; Megatron-LM); "all-gather" gathers every rank's K/V before the
    # attention and reduce-scatters dK/dV after it, both exposed (Llama 3, Grattafiori et al. 2024 §3.3.2);
    # "a2a" all-to-alls Q, K, V from sequence shards to head shards and the output back, exposed
    # (DeepSpeed-Ulysses, Jacobs et al. 2023; Megatron-Core's cp_comm_type "a2a": cp_ep_comm.cp_all_to_all)
    cp_comm: str = "ring"
    # the optimizer of the weight matrices (memory.state_bytes_per_param, dp_tail.optimizer_time): "adam" (mixed-precision
    # Adam / AdamW: fp32 master, m and v) or "muon" (Megatron-Core's Muon, `--optimizer muon` / Megatron-Bridge's
    # `dist_muon`: an fp32 momentum beside the fp32 master, each matrix's update orthogonalized by Newton-Schulz,
    # dp_tail.newton_schulz_seconds; the embedding and output layer on Adam, its `muon_scalar_optimizer` default).
    # `muon_tp_mode` how a TP-split matrix is orthogonalized: "blockwise" (each rank its shard: Megatron-Bridge's
    # recipes) or "duplicated" (every TP rank the whole matrix, gathered over TP: Megatron-Core's default)
    optimizer: str = "adam"
    muon_tp_mode: str = "blockwise"
    # the attention kernel in FP8 (`with_fp8_attention`: the device's attention shares carry it; this says so)
    fp8_attention: bool = False
    # how the loss's cross-entropy over the logits runs (compute.LOSS_BYTES: HBM bytes per logit): "unfused"
    # (Megatron-Core's default VocabParallelCrossEntropy, PyTorch's F.cross_entropy on fp32 logits), "fused"
    # (Megatron-Core's cross_entropy_loss_fusion, native: NeMo 2's GPTConfig default) or "kernel" (one fused
    # kernel pair: Transformer Engine's parallel cross entropy, flash-attn's CrossEntropyLoss)
    cross_entropy: str = "unfused"
    # whose non-GEMM kernels a step runs: "fused" (Megatron-Core / Transformer Engine: compute.elementwise_bytes) or
    # "eager" (par3d's own runtime, model.py line by line in PyTorch: plan/eager.py); a GPU hardware file written by
    # `par3d calibrate` describes par3d's runtime and says "eager" (profile.cluster_from_file)
    elementwise: str = "fused"
    # the spread of the GPUs' step times (coefficient of variation: the silicon and power management of
    # one SKU, and per-step jitter); a synchronous step runs at its slowest GPU's pace (cost.straggler_factor).
    # None: gemm_table.STEP_SPREAD on hierarchical (catalogue-GPU) clusters, 0 on flat/calibrated ones
    straggler_cv: float | None = None
    # parameters per DP gradient bucket (dp_tail.dp_bucket, dp_tail.stage_buckets): None, Megatron-Core's DDP default
    # (max(4·10⁷, 10⁶ · dp·cp), a rank's later model chunks one bucket each; FSDP: one per layer); a number, buckets
    # of that size (DeepSpeed's reduce_bucket_size, PyTorch DDP's bucket_cap_mb / 2 B); 0, one bucket per layer
    dp_bucket_params: float | None = None

    def __hash__(self) -> int:
        # the planner's caches (comm.collective's, the lru_caches) key on the cluster ~10⁶ times a search
        return fields_hash(self)

    def __getstate__(self) -> dict:
        # a hash is this process's: a pickled cluster computes its own again
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @property
    def step_spread(self) -> float:
        if self.straggler_cv is not None:
            return self.straggler_cv
        return _gt.STEP_SPREAD if self.hier else 0.0

    @property
    def host(self) -> Link:
        """The GPU's link to host memory (`HOST_LINKS`; PCIe Gen5 for a GPU not listed)."""
        return LINKS[HOST_LINKS.get(self.device.name, "pcie5")]

    @property
    def fp8_current(self) -> bool:
        return self.dtype == "fp8" and self.fp8_scaling == "current"

    @property
    def fp8_block(self) -> str:
        """The block-scaled recipe ("" for none): "mxfp8" (`fp8_scaling = "mxfp8"`: the casts write a scale per 32
        elements of each copy) or "nvfp4" (`--dtype nvfp4`: compute.elementwise_bytes)."""
        return self.fp8_scaling if self.dtype == "fp8" and self.fp8_scaling in ("mxfp8", "nvfp4") else ""

    @property
    def precision(self) -> str:
        """The training precision as a user names it: "nvfp4" for NVFP4 (held as dtype fp8 with the nvfp4 recipe),
        else the dtype."""
        return "nvfp4" if self.fp8_block == "nvfp4" else self.dtype

    @property
    def gemm_dtype(self) -> str:
        """The dtype the layers' Transformer Engine GEMMs are priced at: "mxfp8" under MXFP8 on a GPU that has it
        (its own measured rate: `with_mxfp8`), else the training dtype."""
        return layer_gemm_dtype(self.device, self.dtype, self.fp8_block)

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)

    @property
    def flash(self) -> bool:
        return self.flash_attention and self.device.flash and self.device.kernel_model == "table"

    @property
    def hier(self) -> bool:
        """Collectives priced as NCCL runs them (comm.collective) rather than the seed's flat ring."""
        return self.hierarchical if self.hierarchical is not None else self.device.kernel_model == "table"

    @property
    def dispatcher(self) -> str:
        """The MoE token dispatcher the step is priced with: `moe_dispatcher`, or the one ep_dispatch implies."""
        return self.moe_dispatcher or ("flex" if self.ep_dispatch == "dedup" else "alltoall")

    @property
    def nics(self) -> int:
        return self.nics_per_node if self.nics_per_node is not None else self.gpus_per_node

    def link_for_span(self, span: int) -> Link:
        """A group whose consecutive-rank span fits inside a node talks over the intra-node link."""
        return self.intra if span <= self.gpus_per_node else self.inter

    def to_dict(self) -> dict[str, Any]:
        d = self.device
        return {
            "device": {"name": d.name, "peak_tflops": {k: v / TFLOPS for k, v in d.peak_flops.items()},
                       "mem_bw_gbps": d.mem_bw / GB, "mem_gib": d.mem_bytes / GiB, "sms": d.sms,
                       "efficiency": d.efficiency, "gemm": dict(d.gemm), "mem_eff": d.mem_eff,
                       "attn_eff": d.attn_eff, "attn_sustain": d.attn_sustain, "overlap_slowdown": d.sigma},
            "gpus": self.gpus, "gpus_per_node": self.gpus_per_node, "dtype": self.dtype,
            "nics_per_node": self.nics, "flash_attention": self.flash, "kernel_model": d.kernel_model,
            "overlap_grad_reduce": self.overlap_grad_reduce, "overlap_param_gather": self.overlap_param_gather,
            "grad_reduce_fp32": self.grad_reduce_fp32, "bf16_optimizer": self.bf16_optimizer,
            "zero1_all_reduce": self.zero1_all_reduce, "grad_reduce_cast": self.grad_reduce_cast,
            "zero3_unit": self.zero3_unit, "fsdp": self.fsdp, "fsdp_unit_ms": self.fsdp_unit_s * 1e3,
            "fsdp_version": self.fsdp_version,
            "tp_comm_overlap": self.tp_comm_overlap, "ep_comm_overlap": self.ep_comm_overlap,
            "p2p_blocking": self.p2p_blocking, "p2p_partitioned": self.p2p_partitioned,
            "moe_host_ms": [x * 1e3 for x in self.moe_host_s],
            "ep_dispatch": self.ep_dispatch, "ep_dispatch_fp8": self.ep_dispatch_fp8, "moe_dispatcher": self.dispatcher,
            "cp_comm": self.cp_comm, "optimizer": self.optimizer, "muon_tp_mode": self.muon_tp_mode,
            "tp_overlap_pipeline": {g: {"num_sm": n, "num_splits": k} for g, n, k in self.tp_overlap_pipeline},
            "fp8_scaling": self.fp8_scaling, "precision": self.precision, "fp8_param_gather": self.fp8_param_gather,
            "fp8_attention": self.fp8_attention,
            "cross_entropy": self.cross_entropy,
            "elementwise": self.elementwise,
            "offload_layers": self.offload_layers, "offload_optimizer": self.offload_optimizer,
            "straggler_cv": self.step_spread,
            "intra": {"name": self.intra.name, "alpha_us": self.intra.alpha / US, "bw_gbps": self.intra.beta / GB},
            "inter": {"name": self.inter.name, "alpha_us": self.inter.alpha / US, "bw_gbps": self.inter.beta / GB},
        }


# Export variants: the catalogue GPU's die, memory and clocks with a slower NVLink (NVIDIA's H800 SXM5 and A800 SXM4
# 80GB datasheets: NVLink 400 GB/s bidirectional, against the H100's 900 and the A100's 600), i.e. 200 GB/s per
# direction per GPU: (the catalogue GPU, NVLink GB/s per direction).  `make_cluster` gives them that link; everything
# else -- GEMM tables, fitted sustained ratios, attention, NICs -- is the base GPU's, so a plan on them is scored by
# the base GPU's evidence (DeepSeek-V3's H800 row, validation.toml, is priced this way).
EXPORT_VARIANTS: dict[str, tuple[str, float]] = {"h800": ("h100-sxm", 200.0), "h800-sxm": ("h100-sxm", 200.0),
                                                 "a800": ("a100-80gb", 200.0), "a800-80gb": ("a100-80gb", 200.0)}


def device_names() -> list[str]:
    return sorted(DEVICES)


def get_device(name: str) -> Device:
    """The catalogue device of a GPU name (an alias, or an export variant's base GPU)."""
    if not isinstance(name, str):  # e.g. a --hardware file's device.base that is not a name
        raise HardwareError(f"GPU {name!r} is not a name; choose one of {', '.join(device_names())}")
    key = ALIASES.get(name.lower(), name.lower())
    key = EXPORT_VARIANTS[key][0] if key in EXPORT_VARIANTS else key
    if key not in DEVICES:
        raise HardwareError(f"unknown GPU {name!r}; choose one of {', '.join(device_names())} (or an export "
                            f"variant: {', '.join(sorted(EXPORT_VARIANTS))}) or describe it in a --hardware file")
    return DEVICES[key]


def catalogue_gpu_of(device_name: str) -> str | None:
    """The catalogue GPU a CUDA device name (`torch.cuda.get_device_name`, e.g. "NVIDIA A100-SXM4-80GB",
    "NVIDIA GB200") is, or None.  The most specific name wins: "GB300" holds "B300" and "GB200" holds "B200",
    so the longest family token that appears is taken ("GH200" holds "H200"), and among A100s and GH200s the
    memory size in the name."""
    name = device_name.lower().replace(" ", "").replace("-", "")
    hits = [k for k in DEVICES if k.split("-")[0] in name]
    if not hits:
        return None
    best = max(len(k.split("-")[0]) for k in hits)
    hits = [k for k in hits if len(k.split("-")[0]) == best]
    # a size token matches with or without its final "b" (torch names the 144 GB GH200 "NVIDIA GH200 144G HBM3e")
    # the entry whose size tokens all appear, the one naming most of them first (a bare "gh200" matches any GH200)
    hits.sort(key=lambda k: -len(k.split("-")))
    return next((k for k in hits if all(t.removesuffix("b") in name for t in k.split("-")[1:])), hits[0])


def make_cluster(gpu: str = "a100-80gb", gpus: int = 8, gpus_per_node: int | None = None,
                 intra_bw_gbps: float | None = None, inter_bw_gbps: float | None = None,
                 dtype: str = "bf16", efficiency: float | None = None, nics_per_node: int | None = None,
                 nic_bw_gbps: float | None = None, flash_attention: bool = True,
                 hierarchical: bool | None = None, attention_kernel: str | None = None,
                 cp_comm: str = "ring", fp8_attention: bool = False) -> Cluster:
    """A catalogue GPU in DGX-style nodes.  `efficiency` switches to the flat kernel model (and,
    unless `hierarchical` says otherwise, the seed's flat rings).  `nics_per_node` × `nic_bw_gbps`
    (default: the GPU's NIC, one per GPU) is the node's inter-node bandwidth; `inter_bw_gbps`
    instead gives the per-GPU share directly (the older flag)."""
    dev = with_attention_kernel(get_device(gpu), attention_kernel)
    if fp8_attention:
        if dtype != "fp8":
            raise HardwareError(f"FP8 attention with dtype {dtype}: Transformer Engine runs FP8 attention only in FP8 "
                                f"training; use --dtype fp8 or nvfp4, or drop --fp8-attention")
        dev = with_fp8_attention(dev)
    if gpus_per_node is None:  # the GPU's NVLink domain (8; GB200 NVL72: 72)
        gpus_per_node = default_gpus_per_node(dev.name)
    if cp_comm not in CP_COMMS:
        raise HardwareError(f"cp_comm {cp_comm!r}: choose one of {', '.join(CP_COMMS)}")
    if efficiency is not None:
        dev = replace(dev, efficiency=efficiency, gemm={})
    li, le = DEFAULT_LINKS[dev.name]
    intra, inter = LINKS[li], LINKS[le]
    variant = EXPORT_VARIANTS.get(ALIASES.get(gpu.lower(), gpu.lower()))
    if intra_bw_gbps is None and variant is not None:  # an export variant's NVLink, unless the caller gives one
        intra_bw_gbps = variant[1]
    if intra_bw_gbps is not None:
        intra = replace(intra, name=f"{intra.name}@{intra_bw_gbps:g}GBps", beta=intra_bw_gbps * GB)
    if nic_bw_gbps is not None:
        inter = replace(inter, name=f"nic@{nic_bw_gbps:g}GBps", beta=nic_bw_gbps * GB)
    if nics_per_node is not None:  # the per-GPU share of the node's NICs
        inter = replace(inter, name=f"{nics_per_node}x{inter.name}/{gpus_per_node}",
                        beta=inter.beta * nics_per_node / gpus_per_node)
    if inter_bw_gbps is not None:
        inter = replace(inter, name=f"{inter.name}@{inter_bw_gbps:g}GBps", beta=inter_bw_gbps * GB)
    dev.peak(dtype)
    return Cluster(dev, gpus, gpus_per_node, intra, inter, dtype, nics_per_node=nics_per_node,
                   flash_attention=flash_attention, hierarchical=hierarchical, cp_comm=cp_comm,
                   fp8_attention=fp8_attention)


def gemm_entry_from_points(points: list[tuple[float, float]], peak_tflops: float) -> float:
    """The best measured (FLOPs, TFLOP/s) point's share of the dtype's peak: a calibration's GEMMs are a
    short burst, so this is the GPU's MAMF share (gemm_table.py), before the sustained clock and the
    step share (`calibrated_gemm_share`)."""
    if not points:
        raise HardwareError("gemm_entry_from_points: no measured points")
    return max(t for _, t in points) / peak_tflops


def calibrated_gemm_share(points: list[tuple[float, float]], peak_tflops: float, family: str,
                          dtype: str, sustained_tflops: float | None = None) -> float:
    """The `device.gemm[dtype]` value `par3d calibrate` on a GPU writes.  With `sustained_tflops` (the GPU's own
    held GEMM with every GPU of its node loaded, `calibrate --sustained-s`: its MSMF): MSMF / peak × the training
    factor × the step share, as the catalogue describes its MSMF-measured GPUs (an MSMF equal to the table's
    gives the catalogue's share) -- no borrowed ratio.  Without it: the best burst GEMM's share of peak (at boost
    clock, like Bekman's MAMF) × the GPU's sustained/burst ratio (`gemm_table.sustained_ratio`: MSMF/MAMF where
    measured, the fitted ratio for the H100, the A100's HPL clock ratio, the B200's for GPUs measured at burst
    only) × the step share.  Run once, on one H200 (docs/measured.md §6)."""
    if sustained_tflops is not None:
        return min(1.0, sustained_tflops / peak_tflops) * _gt.training_factor(dtype) * _gt.STEP_SHARE
    burst = gemm_entry_from_points(points, peak_tflops)
    return min(1.0, burst) * _gt.sustained_ratio(family, dtype) * _gt.STEP_SHARE


def calibrated_attention(gpu: str | None) -> dict[str, float]:
    """The attention fields `par3d calibrate` on a GPU falls back to where its own attention probe gives no share
    (an unknown GPU's peak; `probes.measure_attention_curve` times the runtime's call otherwise): a catalogue GPU
    keeps the catalogue's benchmarked share (at 8,192 tokens, `attn_eff`) and its in-step discount (`attn_sustain`)
    -- without them the file would price unfused attention; an unknown GPU gets none.  Ran on one H200 (the second
    lease, before the probe existed)."""
    if gpu is None or gpu not in DEVICES or not DEVICES[gpu].flash:
        return {}
    dev = DEVICES[gpu]
    return {"attn_eff": dev.attn_eff, "attn_sustain": dev.attn_sustain}


# ---- hardware files (written by `par3d calibrate`, read by `--hardware FILE`) ---------------------

@dataclass
class HardwareFile:
    """The parsed content of a hardware file: a device, the links, and optionally gpus_per_node."""

    device: Device
    intra: Link
    inter: Link
    gpus_per_node: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _num(d: dict[str, Any], key: str, where: str, path: str) -> float:
    v = d.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
        raise HardwareError(f"--hardware {path}: {where}.{key}={v!r} must be a positive number")
    return float(v)


def _share(d: dict[str, Any], key: str, path: str) -> float:
    """device.KEY as a number (its range is checked with the device's other shares)."""
    v = d.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v != v:
        raise HardwareError(f"--hardware {path}: device.{key}={v!r} must be a number")
    return float(v)


def _link(d: Any, where: str, path: str) -> Link:
    if not isinstance(d, dict):
        raise HardwareError(f"--hardware {path}: [{where}] must be a table with alpha_us and bw_gbps")
    return Link(str(d.get("name", where)), _num(d, "alpha_us", where, path) * US,
                _num(d, "bw_gbps", where, path) * GB)


def _attn_curve(raw: Any, path: str) -> tuple[tuple[int, float], ...]:
    """device.attn_curve: [[tokens, share of peak], ...], tokens rising (what `par3d calibrate` measures on a GPU)."""
    ok = isinstance(raw, list) and raw and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], int) and p[0] > 0
        and isinstance(p[1], (int, float)) and 0 < p[1] <= 1 for p in raw)
    if not ok or [p[0] for p in raw] != sorted({p[0] for p in raw}):
        raise HardwareError(f"--hardware {path}: device.attn_curve={raw!r} must be a list of [tokens, share] pairs, "
                            f"tokens rising and shares in (0, 1], e.g. [[2048, 0.3], [8192, 0.4]]")
    return tuple((int(n), float(v)) for n, v in raw)


def load_hardware_file(path: str) -> HardwareFile:
    """JSON or TOML; the schema is `Cluster.to_dict()`'s (see docs/planner.md, "Hardware files").

    A `device` may instead name a catalogue GPU (`base = "a100-80gb"`) and override some fields.
    """
    if not os.path.isfile(path):
        raise HardwareError(f"--hardware {path}: no such file; give a JSON or TOML hardware file "
                            f"(see docs/planner.md) or drop --hardware to use --gpu")
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        d = tomllib.loads(raw.decode()) if path.endswith(".toml") else json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise HardwareError(f"--hardware {path}: cannot parse ({e}); write JSON, or TOML with a .toml name") from e
    return hardware_from_dict(d, path)


def hardware_from_dict(d: Any, path: str = "(hardware)") -> HardwareFile:
    """A hardware file's parsed content; `path` names it in errors."""
    if not isinstance(d, dict) or not isinstance(d.get("device"), dict):
        raise HardwareError(f"--hardware {path}: needs a [device] table with peak_tflops, mem_bw_gbps, "
                            f"mem_gib and sms")
    dv = d["device"]
    base = get_device(dv["base"]) if "base" in dv else None
    peaks = dv.get("peak_tflops")
    if peaks is None and base is None:
        raise HardwareError(f"--hardware {path}: device.peak_tflops is missing; e.g. {{\"bf16\": 312}}")
    if peaks is not None:
        if not isinstance(peaks, dict) or not all(isinstance(v, (int, float)) and v > 0 for v in peaks.values()):
            raise HardwareError(f"--hardware {path}: device.peak_tflops must map dtype -> positive TFLOP/s")
        peak_flops = {k: float(v) * TFLOPS for k, v in peaks.items()}
    else:
        peak_flops = dict(base.peak_flops)  # type: ignore[union-attr]

    def get(key: str, scale: float, fallback: float | None) -> float:
        if key in dv:
            return _num(dv, key, "device", path) * scale
        if fallback is None:
            raise HardwareError(f"--hardware {path}: device.{key} is missing")
        return fallback

    gemm_raw = dv.get("gemm")
    if gemm_raw is not None:
        if not isinstance(gemm_raw, dict) or not all(isinstance(v, (int, float)) and 0 < v <= 1
                                                     for v in gemm_raw.values()):
            raise HardwareError(f"--hardware {path}: device.gemm must map dtype -> achievable share of peak "
                                f"in (0, 1], e.g. {{\"bf16\": 0.8}}")
        gemm = {k: float(v) for k, v in gemm_raw.items()}
    elif "efficiency" in dv or base is None:
        gemm = {}  # a fixed efficiency (or no base GPU): the flat kernel model
    else:
        gemm = dict(base.gemm)
    dev = Device(
        name=str(dv.get("name", base.name if base else os.path.basename(path))),
        peak_flops=peak_flops,
        mem_bw=get("mem_bw_gbps", GB, base.mem_bw if base else None),
        mem_bytes=get("mem_gib", GiB, base.mem_bytes if base else None),
        sms=int(get("sms", 1, base.sms if base else None)),
        efficiency=get("efficiency", 1, base.efficiency if base else SEED_EFFICIENCY),
        gemm=gemm,
        mem_eff=get("mem_eff", 1, base.mem_eff if base else MEM_EFF),
        attn_eff=_share(dv, "attn_eff", path) if "attn_eff" in dv else (base.attn_eff if base else 0.0),
        # a file's own attn_eff is taken as a training step's share unless it says what a step keeps of it
        # (`attn_sustain`, as Cluster.to_dict writes it); the catalogue's benchmarked one keeps its discount
        attn_sustain=(_share(dv, "attn_sustain", path) if "attn_sustain" in dv
                      else 1.0 if "attn_eff" in dv or base is None else base.attn_sustain),
        overlap_slowdown=(_share(dv, "overlap_slowdown", path) if "overlap_slowdown" in dv
                          else (base.overlap_slowdown if base else None)),
        attn_curve=_attn_curve(dv.get("attn_curve"), path) if "attn_curve" in dv else (),
    )
    for key, val in (("efficiency", dev.efficiency), ("mem_eff", dev.mem_eff)):
        if not 0 < val <= 1:
            raise HardwareError(f"--hardware {path}: device.{key}={val} must be in (0, 1]")
    if not 0 <= dev.attn_eff <= 1 or not 0 <= (dev.overlap_slowdown or 0.0) < 1 or not 0 < dev.attn_sustain <= 1:
        raise HardwareError(f"--hardware {path}: device.attn_eff must be in [0, 1], device.attn_sustain in "
                            f"(0, 1] and device.overlap_slowdown in [0, 1)")
    li, le = DEFAULT_LINKS.get(base.name if base else "", ("nvlink3", "ib-hdr"))
    intra = _link(d["intra"], "intra", path) if "intra" in d else LINKS[li]
    inter = _link(d["inter"], "inter", path) if "inter" in d else LINKS[le]
    gpn = d.get("gpus_per_node")
    if gpn is not None and (not isinstance(gpn, int) or gpn < 1):
        raise HardwareError(f"--hardware {path}: gpus_per_node={gpn!r} must be an integer >= 1")
    nics = d.get("nics_per_node")
    if nics is not None and (not isinstance(nics, int) or nics < 1):
        raise HardwareError(f"--hardware {path}: nics_per_node={nics!r} must be an integer >= 1")
    extra = {k: v for k, v in d.items() if k not in ("device", "intra", "inter", "gpus_per_node")}
    return HardwareFile(dev, intra, inter, gpn, extra)


def describe(c: Cluster) -> str:
    d = c.device
    # the attention share a step keeps (benchmarked × Device.attn_sustain), at 8K tokens where a curve has more
    attn = f", FlashAttention at {d.attn_share(8192):.0%} of bf16 peak in a step" if c.flash else ""
    # NVFP4: the layers' GEMMs at the FP4 peak and share (the rest of the step, and MFU, at FP8's)
    gd = "nvfp4" if c.fp8_block == "nvfp4" and "nvfp4" in d.peak_flops else c.dtype
    eff = (f"GEMMs up to {d.gemm_fraction(gd):.0%} of peak (table), HBM at {d.mem_eff:.0%}{attn}"
           if d.kernel_model == "table" else f"{d.efficiency:.0%} achievable")
    return (f"{c.gpus} x {d.name} ({d.peak(gd) / TFLOPS:.0f} TFLOP/s {gd} peak, "
            f"{eff}, {d.mem_bw / GB:.0f} GB/s HBM, {d.mem_bytes / GiB:.0f} GiB), "
            f"{c.gpus_per_node}/node; intra {c.intra.beta / GB:g} GB/s α={c.intra.alpha / US:g} µs, "
            f"inter {c.inter.beta / GB:g} GB/s per GPU ({c.nics} NICs/node) α={c.inter.alpha / US:g} µs")


__all__ = ["Cluster", "Device", "Link", "DEVICES", "EXPORT_VARIANTS", "LINKS", "GB", "GiB", "TFLOPS", "US", "HardwareError",
           "get_device", "make_cluster", "load_hardware_file", "hardware_from_dict", "describe",
           "gemm_entry_from_points", "calibrated_gemm_share", "SEED_EFFICIENCY"]
