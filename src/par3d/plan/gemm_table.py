"""Measured GEMM throughput per GPU and dtype: the data the kernel model (compute.py) runs on.

Every number has its source.  TFLOP/s are dense (no sparsity), 10^12 FLOP/s.

- `peak`: the vendor's dense tensor-core peak (datasheets: NVIDIA A100 Tensor Core GPU datasheet
  (312 BF16/FP16); H100 SXM5 datasheet (989 BF16/FP16, 1979 FP8); H200 datasheet (same compute as
  H100 SXM); B200 in the DGX B200 datasheet (2250 BF16/FP16, 4500 FP8 dense per GPU)).
- `mamf`: Maximum Achievable Matmul FLOPS, the best large aligned GEMM measured with cuBLAS through
  torch.matmul (S. Bekman, "Machine Learning Engineering", compute/accelerator/README.md, MAMF
  comparison table, and the H200→B200 comparison in the same book): A100 SXM 267.9 BF16 (85.9 %),
  H100 SXM 792.1 BF16 (80.1 %), H100/H200 SXM 794.5 BF16, H200 SXM FP8 1453.4 (73.4 %),
  B200 SXM 1745.0 BF16 (77.6 %), B200 FP8 3432.5 (76.3 %).  FP16 runs the same tensor-core path
  as BF16 at the same peak, so it takes the BF16 entry; H100's FP8 takes H200's (same GH100 die,
  same clocks; only HBM differs, which a compute-bound GEMM does not see).
- `sustained`: the share of `mamf` a GPU keeps inside a real training step, for hours, at its
  power limit (MAMF is a short burst at boost clock).
  * H100, H200, B200 — not fitted: the HPL sustained-clock ratio.  1305 MHz is the clock an A100
    sustains at its 400 W limit running HPL, against 1410 MHz boost (NVIDIA's HPL submissions, as
    summarised by G. Lockwood, "Peak FLOPS", glennklockwood.com) → 0.926; the later GPUs take the
    same ratio (no equally citable sustained clock of their own).
  * A100 — **fitted**: 0.926 × 0.91 = 0.843, the one number that makes the ten rows of Narayanan
    et al. 2021 Table 1 average zero error (validation.toml; with 0.926 they average +6.5 %).  It is
    the only throughput constant set from a validation row; every other row is out of sample.
    The per-layer times of Korthikanti et al. 2022 Table 4 (22B layer, TP 8, micro-batch 4: 7.7 ms
    forward, 11.9 ms backward) are matched within 1 % at 0.926 and within 8 % at 0.843: the fitted
    share also carries what a whole step adds to its layers (launch gaps, stragglers, logging).
  `par3d calibrate` on a GPU replaces these with measured ones.

`hardware.py` builds each catalogue device's `gemm` entry from this table; a hardware file may
carry its own (`par3d calibrate` on a GPU writes one: see `hardware.gemm_entry_from_points`).
"""

from __future__ import annotations

HPL_SUSTAINED = 1305.0 / 1410.0  # A100's HPL sustained clock / boost clock (see above)
SUSTAINED_A100 = HPL_SUSTAINED * 0.91  # fitted to Narayanan et al. 2021 Table 1 (see above)

# gpu family -> dtype -> (peak TFLOP/s, MAMF TFLOP/s)
TABLE: dict[str, dict[str, tuple[float, float]]] = {
    "a100": {"bf16": (312.0, 267.9), "fp16": (312.0, 267.9)},
    "h100": {"bf16": (989.0, 792.1), "fp16": (989.0, 792.1), "fp8": (1979.0, 1453.4)},
    "h200": {"bf16": (989.0, 794.5), "fp16": (989.0, 794.5), "fp8": (1979.0, 1453.4)},
    "b200": {"bf16": (2250.0, 1745.0), "fp16": (2250.0, 1745.0), "fp8": (4500.0, 3432.5)},
}
SUSTAINED: dict[str, float] = {"a100": SUSTAINED_A100, "h100": HPL_SUSTAINED, "h200": HPL_SUSTAINED,
                               "b200": HPL_SUSTAINED}


def achievable_fraction(family: str, dtype: str) -> float | None:
    """Sustained achievable share of peak for a large GEMM: mamf/peak × sustained; None if unknown."""
    row = TABLE.get(family, {}).get(dtype)
    if row is None:
        return None
    peak, mamf = row
    return mamf / peak * SUSTAINED.get(family, 1.0)


__all__ = ["TABLE", "SUSTAINED", "achievable_fraction"]
