"""Measured GEMM throughput by shape: what the table kernel model's depth curve (compute.GEMM_K0) and fixed cost
(compute.GEMM_FIXED_S) are fitted to, and what scores them (issue 12's nineteenth round).

Source: OpenXLA's default matmul performance table (`kDefaultMatmulPTable` in
xla/service/gpu/model/matmul_interpolator_data.h, the data XLA's GPU cost model interpolates), as vendored in
TensorFlow at third_party/xla/xla/service/gpu/model/matmul_interpolator_data.h.  Each entry is a batched GEMM
(b, m, n, k) and its measured FLOP/s per dtype on one GPU generation.
- `H100`: the "sm_90" block, "bf16xbf16->bf16" (tensorflow/tensorflow 372d578bb861, 2025).  The fit set is every
  entry of the training regime, a rule fixed before the fit was run: b·m >= 4,096 rows (the token dimension of a
  micro-batch) and n >= 1,024 (an output wide enough to fill the GPU), all five depths k = 256 ... 4,096: 90 of
  the block's 375 entries, in TFLOP/s to one decimal.
- `B200`: held out, never fitted: the "sm_100" block of a later revision of the same file (it appends the block
  after sm_90's; read from the TensorFlow mirror anisuli787/Anisul 2721ea87), the same rule applied to the block's
  first 16,000 characters of entries: 27 GEMMs.  (The newest revision re-measures both blocks with FP8 columns;
  not used.)

What the model does with a shape (compute.roofline, table model): time = max(FLOPs · (K + K0) / K / (L ·
wave_eff), bytes / (HBM · mem_eff)) + t_fixed, with the GPU's SM count, HBM bandwidth and mem_eff from the
catalogue.  `fit` searches K0 and t_fixed with the level L free (the level of a training step comes from
gemm_table.py, not from here: only the curve's shape is taken), minimising the mean |error|; the stored
compute.GEMM_K0 = 136 and GEMM_FIXED_S = 6 µs are its result (`python -m par3d.plan.gemm_shapes --fit`).

Scores (mean |error| with L free; `python -m par3d.plan.gemm_shapes`): H100 in sample 1.6 % (the model before
this round, K0 = 0 and 3 µs: 13.1 %; at its MAMF level 14.1 %, every shallow GEMM fast, by up to 46 %); B200 held
out 5.8 % (before: 27.8 %).
"""

from __future__ import annotations

import argparse
import statistics
import sys

from .compute import GEMM_FIXED_S, GEMM_K0, Gemm, wave_efficiency
from .hardware import Device, get_device

# (b, m, n, k, measured TFLOP/s)
H100: tuple[tuple[int, int, int, int, float], ...] = (
    (4, 1024, 2048, 2048, 712.7), (1, 4096, 1024, 512, 343.7), (1, 4096, 4096, 256, 392.2),
    (2, 2048, 4096, 1024, 678.7), (2, 4096, 4096, 2048, 763.0), (4, 4096, 4096, 512, 619.9),
    (2, 4096, 1024, 4096, 750.6), (1, 4096, 4096, 4096, 783.3), (4, 1024, 1024, 2048, 626.1),
    (4, 4096, 1024, 1024, 673.8), (2, 4096, 1024, 256, 301.6), (4, 2048, 2048, 2048, 725.7),
    (2, 4096, 2048, 4096, 783.2), (4, 4096, 1024, 512, 542.0), (4, 4096, 4096, 256, 503.9),
    (2, 2048, 2048, 1024, 600.2), (4, 4096, 4096, 4096, 793.1), (4, 2048, 1024, 2048, 710.6),
    (2, 4096, 2048, 256, 394.5), (1, 4096, 1024, 1024, 488.1), (4, 4096, 2048, 512, 607.5),
    (4, 4096, 1024, 256, 393.3), (1, 4096, 4096, 512, 543.1), (2, 4096, 1024, 512, 445.5),
    (2, 2048, 2048, 2048, 717.7), (4, 4096, 1024, 4096, 777.6), (4, 4096, 2048, 256, 458.5),
    (2, 4096, 4096, 4096, 807.7), (2, 4096, 2048, 512, 546.4), (2, 2048, 1024, 2048, 629.4),
    (4, 4096, 2048, 4096, 808.7), (4, 1024, 4096, 1024, 674.9), (1, 4096, 4096, 2048, 738.7),
    (4, 2048, 2048, 1024, 674.0), (2, 4096, 4096, 256, 464.0), (1, 4096, 1024, 256, 216.5),
    (1, 4096, 1024, 4096, 738.5), (1, 4096, 2048, 256, 304.0), (2, 4096, 4096, 512, 607.7),
    (2, 4096, 1024, 1024, 598.2), (1, 4096, 2048, 4096, 758.4), (4, 4096, 4096, 2048, 764.6),
    (4, 1024, 2048, 1024, 598.2), (4, 2048, 4096, 1024, 688.6), (2, 4096, 2048, 1024, 680.9),
    (4, 2048, 4096, 256, 458.9), (2, 2048, 2048, 4096, 756.7), (4, 4096, 1024, 2048, 720.5),
    (4, 1024, 1024, 1024, 489.8), (4, 2048, 4096, 4096, 801.9), (2, 2048, 2048, 256, 299.6),
    (4, 2048, 2048, 512, 542.3), (4, 1024, 4096, 512, 541.7), (2, 2048, 1024, 4096, 737.2),
    (4, 4096, 2048, 2048, 759.3), (4, 2048, 1024, 512, 443.3), (2, 2048, 1024, 256, 215.8),
    (2, 4096, 4096, 1024, 693.0), (2, 2048, 4096, 2048, 729.1), (4, 1024, 4096, 256, 391.3),
    (1, 4096, 1024, 2048, 632.0), (4, 1024, 2048, 512, 442.2), (4, 2048, 4096, 512, 607.3),
    (4, 2048, 1024, 1024, 596.5), (4, 1024, 4096, 4096, 773.5), (4, 1024, 1024, 512, 337.7),
    (1, 4096, 2048, 2048, 716.1), (2, 2048, 4096, 512, 542.3), (4, 1024, 2048, 256, 300.3),
    (2, 2048, 1024, 1024, 489.0), (4, 2048, 4096, 2048, 752.5), (1, 4096, 2048, 1024, 593.2),
    (4, 4096, 4096, 1024, 725.5), (4, 1024, 2048, 4096, 743.6), (4, 1024, 1024, 256, 214.7),
    (4, 1024, 1024, 4096, 735.9), (2, 4096, 1024, 2048, 713.4), (4, 2048, 2048, 256, 394.8),
    (2, 2048, 2048, 512, 447.0), (2, 2048, 4096, 4096, 779.3), (4, 2048, 2048, 4096, 779.1),
    (1, 4096, 4096, 1024, 677.4), (4, 1024, 4096, 2048, 718.7), (4, 4096, 2048, 1024, 687.9),
    (4, 2048, 1024, 256, 300.9), (2, 2048, 1024, 512, 342.4), (2, 4096, 2048, 2048, 733.3),
    (2, 2048, 4096, 256, 393.9), (4, 2048, 1024, 4096, 745.0), (1, 4096, 2048, 512, 447.0),
)
B200: tuple[tuple[int, int, int, int, float], ...] = (
    (4, 4096, 4096, 2048, 1544.0), (2, 4096, 2048, 2048, 1276.5), (4, 4096, 1024, 256, 497.0),
    (2, 2048, 2048, 512, 619.1), (2, 2048, 4096, 256, 518.6), (1, 4096, 2048, 2048, 1141.6),
    (4, 2048, 4096, 512, 898.7), (4, 2048, 1024, 1024, 868.7), (2, 2048, 2048, 4096, 1324.9),
    (4, 2048, 4096, 4096, 1462.7), (4, 4096, 1024, 4096, 1394.5), (4, 4096, 2048, 256, 768.5),
    (4, 1024, 2048, 1024, 871.3), (2, 2048, 1024, 512, 432.9), (4, 4096, 2048, 2048, 1329.2),
    (1, 4096, 1024, 256, 241.3), (2, 4096, 4096, 2048, 1337.9), (4, 1024, 4096, 1024, 1048.0),
    (2, 2048, 1024, 1024, 679.6), (1, 4096, 4096, 2048, 1270.1), (4, 2048, 4096, 256, 769.0),
    (2, 2048, 4096, 512, 764.1), (4, 2048, 2048, 512, 772.3), (2, 4096, 1024, 256, 380.7),
    (2, 4096, 1024, 4096, 1339.6), (1, 4096, 2048, 256, 371.8), (4, 2048, 2048, 4096, 1411.1),
)
SETS = {"h100-sxm": H100, "b200": B200}


def tflops(dev: Device, b: int, m: int, n: int, k: int, level: float, k0: float, fixed_s: float) -> float:
    """The model's TFLOP/s for one bf16 GEMM at a rate of `level` TFLOP/s at infinite depth."""
    g = Gemm("gemm", m, n, k, b)
    t = max(g.flops * (k + k0) / k / (level * 1e12 * wave_efficiency(g, dev.sms)),
            g.bytes(2) / (dev.mem_bw * dev.mem_eff)) + fixed_s
    return g.flops / t / 1e12


def errors(gpu: str, level: float, k0: float, fixed_s: float) -> list[float]:
    dev = get_device(gpu)
    return [tflops(dev, b, m, n, k, level, k0, fixed_s) / meas - 1 for b, m, n, k, meas in SETS[gpu]]


def best_level(gpu: str, k0: float, fixed_s: float) -> tuple[float, float]:
    """(mean |error|, level) with the level chosen to minimise the mean |error| (golden section)."""
    def cost(level: float) -> float:
        return statistics.fmean(abs(e) for e in errors(gpu, level, k0, fixed_s))
    top = max(p[-1] for p in SETS[gpu])
    lo, hi = 0.8 * top, 1.5 * top
    g = (5 ** 0.5 - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    for _ in range(40):
        if cost(a) < cost(b):
            hi, b = b, a
            a = hi - g * (hi - lo)
        else:
            lo, a = a, b
            b = lo + g * (hi - lo)
    level = (lo + hi) / 2
    return cost(level), level


def fit(k0s: range = range(0, 304, 8), fixed: tuple[float, ...] = tuple(i * 0.5e-6 for i in range(21))
        ) -> tuple[int, float, float, float]:
    """(K0, fixed s, level, mean |error|) minimising the H100 set's mean |error| over the grid."""
    best: tuple[int, float, float, float] | None = None
    for k0 in k0s:
        for f in fixed:
            err, level = best_level("h100-sxm", k0, f)
            if best is None or err < best[3]:
                best = (k0, f, level, err)
    assert best is not None
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m par3d.plan.gemm_shapes",
                                 description="Score (or re-fit, --fit) the table kernel model's GEMM depth curve "
                                             "against OpenXLA's measured GEMM tables.")
    ap.add_argument("--fit", action="store_true", help="search K0 and the fixed cost on the H100 set (a few s)")
    args = ap.parse_args(argv)
    if args.fit:
        k0, f, level, err = fit()
        print(f"fitted K0 {k0}, fixed {f * 1e6:.1f} us (level {level:.0f} TFLOP/s), mean |error| {err:.1%}; "
              f"stored K0 {GEMM_K0}, fixed {GEMM_FIXED_S * 1e6:.1f} us")
    for gpu, role in (("h100-sxm", "in sample"), ("b200", "held out")):
        for name, k0, f in (("this model", GEMM_K0, GEMM_FIXED_S), ("K0 0, 3 us (before)", 0, 3e-6)):
            err, level = best_level(gpu, k0, f)
            print(f"{gpu} ({role}, {len(SETS[gpu])} GEMMs), {name}: mean |error| {err:.1%} at level {level:.0f}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
