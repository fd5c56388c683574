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

What the model does with a shape (compute.table_gemm_seconds, which compute.roofline prices every GEMM with):
time = max(FLOPs · d(K) / (L · wave_eff), bytes / (HBM · mem_eff)) + t_fixed, d(K) the depth curve (K0 in it),
L the rate at K = 4,096, with the GPU's SM count, HBM bandwidth and mem_eff from the catalogue.  `fit` searches K0 and t_fixed with the level L free (the level of a training step comes from
gemm_table.py, not from here: only the curve's shape is taken), minimising the mean |error|; the stored
compute.GEMM_K0 = 136 and GEMM_FIXED_S = 6 µs are its result (`python -m par3d.plan.gemm_shapes --fit`).

Scores (mean |error| with L free; `python -m par3d.plan.gemm_shapes`): H100 in sample 1.6 % (the model before
this round, K0 = 0 and 3 µs: 13.1 %; at its MAMF level 14.1 %, every shallow GEMM fast, by up to 46 %); B200 held
out 5.8 % (before: 27.8 %).  The newest revision's re-measured groups (`LATER`, held out): bf16 H100 1.5 % (11.2 %),
B200 5.2 % (20.8 %); FP8, which the model prices on the same curve untested until now: H100 5.8 % (10.3 %), B200
15.6 % (38.4 %) -- the B200's FP8 GEMMs lose more with shallow K than the bf16 curve says (its own best K0 is
about 500, which would take the H100's FP8 group from 5.8 to 9.7 %): not adopted, an FP8 curve of its own needs
FP8 measurements the model can trust (the H100's exceed its peak).  Since issue 12's thirty-second round FP8 GEMMs
take a depth constant derived rather than fitted (compute.depth_k0: K0 times their rate over BF16's, the per-tile
overhead being fixed in seconds), which `main` scores as "this model": B200 15.6 -> 10.8 %, H100 5.8 -> 6.4 %, the
H200 measured here 19.8 -> 15.3 %.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from .compute import GEMM_FIXED_S, GEMM_K0, Gemm, depth_k0, table_gemm_seconds
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

# Held out too: the newest revision of the same file (read from the TensorFlow mirror punittiwari50/tensorflow-tensorflow
# 7cc7ba55), which re-measures both GPUs and adds FP8 columns ("f8e4m3fnxf8e4m3fn->bf16").  Read: one (b, m) group
# per GPU, every n >= 1,024 and k: sm_90 b = 2, m = 4,096; sm_100 b = 4, m = 4,096.  (n, k, bf16, fp8 TFLOP/s.)
# The H100's FP8 entries exceed its dense FP8 peak (2,538 > 1,979 TFLOP/s at 2 x 4096^3), so its FP8 column is not
# a measurement the model can take at face value; they are listed, and scored only as a shape.
LATER: dict[str, tuple[int, int, tuple[tuple[int, int, float, float], ...]]] = {
    "h100-sxm": (2, 4096, (
        (1024, 256, 308.2, 474.3), (2048, 256, 400.1, 709.2), (4096, 256, 467.5, 955.3),
        (1024, 512, 453.1, 827.2), (2048, 512, 548.7, 1269.2), (4096, 512, 613.2, 1569.8),
        (1024, 1024, 598.5, 1418.4), (2048, 1024, 684.3, 1893.6), (4096, 1024, 691.8, 2218.5),
        (1024, 2048, 721.8, 1973.7), (2048, 2048, 730.6, 2288.2), (4096, 2048, 759.2, 2395.4),
        (1024, 4096, 746.6, 2312.9), (2048, 4096, 779.0, 2368.3), (4096, 4096, 804.2, 2537.6))),
    "b200": (4, 4096, (
        (1024, 256, 536.7, 670.2), (2048, 256, 790.6, 840.7), (4096, 256, 791.8, 1012.8),
        (1024, 512, 801.2, 1046.3), (2048, 512, 913.2, 1534.9), (4096, 512, 1090.6, 1712.2),
        (1024, 1024, 1060.5, 1868.7), (2048, 1024, 1163.1, 2400.8), (4096, 1024, 1350.5, 2651.2),
        (1024, 2048, 1265.2, 2422.3), (2048, 2048, 1345.8, 2884.9), (4096, 2048, 1539.9, 3122.5),
        (1024, 4096, 1411.9, 2662.0), (2048, 4096, 1465.7, 3133.3), (4096, 4096, 1670.5, 3279.7))),
}


# Held out, measured by this project (issue 12's thirty-first round): the same shapes timed on the one H200 it was
# lent (benchmarks/gpu_probe.py -> benchmarks/results/gpu-probe-h200.json, 2026-12-04; torch.bmm in bf16, fp8
# through torch._scaled_mm on (b·m) x k rows; the median of 5 means of 20 back-to-back calls, CUDA events).  The
# smallest GEMMs here (2-4 GFLOP, ~20 µs) are bound by the host's launch rate on that VM, not by the GPU (docs/
# measured.md §6): they are kept, not filtered.  (b, m, n, k, TFLOP/s) for the OpenXLA H100 set's 90 shapes, and
# (n, k, bf16, fp8) for the newest revision's group (b = 2, m = 4,096).
H200_HERE: tuple[tuple[int, int, int, int, float], ...] = (
    (4, 1024, 2048, 2048, 708.5), (1, 4096, 1024, 512, 193.0), (1, 4096, 4096, 256, 365.7),
    (2, 2048, 4096, 1024, 673.2), (2, 4096, 4096, 2048, 771.6), (4, 4096, 4096, 512, 631.9),
    (2, 4096, 1024, 4096, 765.9), (1, 4096, 4096, 4096, 782.0), (4, 1024, 1024, 2048, 553.4),
    (4, 4096, 1024, 1024, 550.7), (2, 4096, 1024, 256, 201.2), (4, 2048, 2048, 2048, 632.4),
    (2, 4096, 2048, 4096, 709.4), (4, 4096, 1024, 512, 468.1), (4, 4096, 4096, 256, 444.7),
    (2, 2048, 2048, 1024, 555.4), (4, 4096, 4096, 4096, 706.6), (4, 2048, 1024, 2048, 582.9),
    (2, 4096, 2048, 256, 332.9), (1, 4096, 1024, 1024, 430.8), (4, 4096, 2048, 512, 490.1),
    (4, 4096, 1024, 256, 329.1), (1, 4096, 4096, 512, 448.5), (2, 4096, 1024, 512, 414.7),
    (2, 2048, 2048, 2048, 636.1), (4, 4096, 1024, 4096, 725.7), (4, 4096, 2048, 256, 412.5),
    (2, 4096, 4096, 4096, 744.8), (2, 4096, 2048, 512, 450.8), (2, 2048, 1024, 2048, 569.7),
    (4, 4096, 2048, 4096, 699.9), (4, 1024, 4096, 1024, 542.0), (1, 4096, 4096, 2048, 618.9),
    (4, 2048, 2048, 1024, 541.5), (2, 4096, 4096, 256, 388.1), (1, 4096, 1024, 256, 99.2),
    (1, 4096, 1024, 4096, 638.5), (1, 4096, 2048, 256, 209.4), (2, 4096, 4096, 512, 528.2),
    (2, 4096, 1024, 1024, 565.8), (1, 4096, 2048, 4096, 742.7), (4, 4096, 4096, 2048, 679.7),
    (4, 1024, 2048, 1024, 538.9), (4, 2048, 4096, 1024, 614.3), (2, 4096, 2048, 1024, 573.6),
    (4, 2048, 4096, 256, 392.2), (2, 2048, 2048, 4096, 682.8), (4, 4096, 1024, 2048, 675.0),
    (4, 1024, 1024, 1024, 410.3), (4, 2048, 4096, 4096, 722.4), (2, 2048, 2048, 256, 214.7),
    (4, 2048, 2048, 512, 438.8), (4, 1024, 4096, 512, 433.9), (2, 2048, 1024, 4096, 606.7),
    (4, 4096, 2048, 2048, 657.4), (4, 2048, 1024, 512, 435.7), (2, 2048, 1024, 256, 106.0),
    (2, 4096, 4096, 1024, 612.1), (2, 2048, 4096, 2048, 675.4), (4, 1024, 4096, 256, 350.4),
    (1, 4096, 1024, 2048, 602.9), (4, 1024, 2048, 512, 456.0), (4, 2048, 4096, 512, 546.7),
    (4, 2048, 1024, 1024, 575.9), (4, 1024, 4096, 4096, 749.4), (4, 1024, 1024, 512, 288.1),
    (1, 4096, 2048, 2048, 650.5), (2, 2048, 4096, 512, 478.0), (4, 1024, 2048, 256, 291.0),
    (2, 2048, 1024, 1024, 503.0), (4, 2048, 4096, 2048, 701.4), (1, 4096, 2048, 1024, 566.2),
    (4, 4096, 4096, 1024, 633.8), (4, 1024, 2048, 4096, 708.0), (4, 1024, 1024, 256, 102.9),
    (4, 1024, 1024, 4096, 648.4), (2, 4096, 1024, 2048, 623.3), (4, 2048, 2048, 256, 347.8),
    (2, 2048, 2048, 512, 422.9), (2, 2048, 4096, 4096, 724.0), (4, 2048, 2048, 4096, 718.3),
    (1, 4096, 4096, 1024, 556.6), (4, 1024, 4096, 2048, 634.9), (4, 4096, 2048, 1024, 607.1),
    (4, 2048, 1024, 256, 211.3), (2, 2048, 1024, 512, 209.8), (2, 4096, 2048, 2048, 656.4),
    (2, 2048, 4096, 256, 343.1), (4, 2048, 1024, 4096, 684.2), (1, 4096, 2048, 512, 425.2),
)
H200_HERE_LATER: tuple[tuple[int, int, float, float], ...] = (
    (1024, 256, 221.5, 200.2), (2048, 256, 382.4, 384.4), (4096, 256, 456.5, 445.4), (1024, 512, 493.4, 402.1),
    (2048, 512, 530.8, 673.7), (4096, 512, 594.2, 800.3), (1024, 1024, 616.6, 592.5), (2048, 1024, 658.4, 943.6),
    (4096, 1024, 704.3, 1080.4), (1024, 2048, 700.8, 1075.1), (2048, 2048, 683.9, 1093.0), (4096, 2048, 710.1, 1192.1),
    (1024, 4096, 677.8, 1123.3), (2048, 4096, 686.4, 1206.0), (4096, 4096, 668.0, 1190.7),
)


def here_later(dtype: str) -> tuple[tuple[int, int, int, int, float], ...]:
    """The H200's measured newest-revision group as (b, m, n, k, TFLOP/s) of `dtype` ("bf16" or "fp8")."""
    return tuple((2, 4096, n, k, bf16 if dtype == "bf16" else fp8) for n, k, bf16, fp8 in H200_HERE_LATER)


# The second lease (2026-12-04, benchmarks/results/gpu-probe2-h200.json): the same shapes, each timed inside a CUDA
# graph (benchmarks/gpu_probe.py `timed_graph`) so that PyTorch's launch rate, the first lease's floor on the small
# GEMMs, does not count; bf16 and fp8 (`torch._scaled_mm`, (b·m) x k rows) on every shape.  Held out: nothing was
# fitted to them.  (b, m, n, k, bf16 TFLOP/s, fp8 TFLOP/s)
H200_GRAPHED: tuple[tuple[int, int, int, int, float, float], ...] = (
    (4, 1024, 2048, 2048, 738.4, 1167.5), (1, 4096, 1024, 512, 477.0, 571.5), (1, 4096, 4096, 256, 418.5, 418.6),
    (2, 2048, 4096, 1024, 680.1, 939.0), (2, 4096, 4096, 2048, 706.4, 1242.3), (4, 4096, 4096, 512, 559.7, 850.4),
    (2, 4096, 1024, 4096, 739.0, 1133.3), (1, 4096, 4096, 4096, 678.0, 1192.2), (4, 1024, 1024, 2048, 616.8, 1038.3),
    (4, 4096, 1024, 1024, 652.1, 880.4), (2, 4096, 1024, 256, 367.2, 331.3), (4, 2048, 2048, 2048, 738.4, 1106.3),
    (2, 4096, 2048, 4096, 689.2, 1217.5), (4, 4096, 1024, 512, 456.8, 596.0), (4, 4096, 4096, 256, 499.7, 512.0),
    (2, 2048, 2048, 1024, 669.9, 882.6), (4, 4096, 4096, 4096, 763.2, 1407.5), (4, 2048, 1024, 2048, 527.4, 810.0),
    (2, 4096, 2048, 256, 296.0, 361.2), (1, 4096, 1024, 1024, 547.8, 753.8), (4, 4096, 2048, 512, 608.3, 812.6),
    (4, 4096, 1024, 256, 383.0, 398.7), (1, 4096, 4096, 512, 551.7, 700.7), (2, 4096, 1024, 512, 556.7, 606.5),
    (2, 2048, 2048, 2048, 741.9, 1158.1), (4, 4096, 1024, 4096, 754.0, 1301.1), (4, 4096, 2048, 256, 376.7, 409.1),
    (2, 4096, 4096, 4096, 703.9, 1266.8), (2, 4096, 2048, 512, 453.3, 648.7), (2, 2048, 1024, 2048, 676.6, 1070.8),
    (4, 4096, 2048, 4096, 742.2, 1317.2), (4, 1024, 4096, 1024, 575.0, 886.3), (1, 4096, 4096, 2048, 672.5, 1041.4),
    (4, 2048, 2048, 1024, 590.5, 908.8), (2, 4096, 4096, 256, 430.9, 424.8), (1, 4096, 1024, 256, 302.6, 310.7),
    (1, 4096, 1024, 4096, 729.5, 1155.2), (1, 4096, 2048, 256, 354.5, 299.9), (2, 4096, 4096, 512, 589.7, 762.8),
    (2, 4096, 1024, 1024, 631.1, 828.9), (1, 4096, 2048, 4096, 769.6, 1107.1), (4, 4096, 4096, 2048, 634.6, 1191.0),
    (4, 1024, 2048, 1024, 544.8, 751.7), (4, 2048, 4096, 1024, 669.9, 963.5), (2, 4096, 2048, 1024, 591.2, 884.1),
    (4, 2048, 4096, 256, 431.5, 453.9), (2, 2048, 2048, 4096, 779.7, 1295.1), (4, 4096, 1024, 2048, 644.5, 1073.3),
    (4, 1024, 1024, 1024, 516.3, 753.4), (4, 2048, 4096, 4096, 738.4, 1217.8), (2, 2048, 2048, 256, 346.9, 293.6),
    (4, 2048, 2048, 512, 501.4, 659.1), (4, 1024, 4096, 512, 533.6, 696.3), (2, 2048, 1024, 4096, 734.8, 1101.6),
    (4, 4096, 2048, 2048, 627.7, 1050.6), (4, 2048, 1024, 512, 431.0, 471.2), (2, 2048, 1024, 256, 293.6, 297.1),
    (2, 4096, 4096, 1024, 690.6, 975.2), (2, 2048, 4096, 2048, 661.8, 1097.4), (4, 1024, 4096, 256, 345.0, 375.9),
    (1, 4096, 1024, 2048, 656.4, 1123.5), (4, 1024, 2048, 512, 547.4, 592.8), (4, 2048, 4096, 512, 609.4, 857.8),
    (4, 2048, 1024, 1024, 657.9, 815.1), (4, 1024, 4096, 4096, 766.1, 1179.3), (4, 1024, 1024, 512, 381.5, 447.1),
    (1, 4096, 2048, 2048, 694.5, 1092.6), (2, 2048, 4096, 512, 513.9, 658.4), (4, 1024, 2048, 256, 393.5, 339.6),
    (2, 2048, 1024, 1024, 596.1, 823.1), (4, 2048, 4096, 2048, 752.6, 1100.7), (1, 4096, 2048, 1024, 564.4, 819.4),
    (4, 4096, 4096, 1024, 678.7, 1018.8), (4, 1024, 2048, 4096, 701.1, 1144.4), (4, 1024, 1024, 256, 279.6, 280.0),
    (4, 1024, 1024, 4096, 734.0, 1205.2), (2, 4096, 1024, 2048, 698.8, 986.7), (4, 2048, 2048, 256, 361.0, 381.8),
    (2, 2048, 2048, 512, 523.0, 599.4), (2, 2048, 4096, 4096, 773.6, 1198.8), (4, 2048, 2048, 4096, 624.7, 1152.7),
    (1, 4096, 4096, 1024, 546.4, 845.9), (4, 1024, 4096, 2048, 693.7, 1054.0), (4, 4096, 2048, 1024, 614.5, 980.8),
    (4, 2048, 1024, 256, 359.2, 324.3), (2, 2048, 1024, 512, 440.3, 544.1), (2, 4096, 2048, 2048, 742.3, 1066.7),
    (2, 2048, 4096, 256, 342.0, 339.3), (4, 2048, 1024, 4096, 703.4, 1142.5), (1, 4096, 2048, 512, 472.3, 500.3),
)
# the newest revision's (n, k) group (b 2, m 4,096), graphed: (n, k, bf16, fp8)
H200_GRAPHED_LATER: tuple[tuple[int, int, float, float], ...] = (
    (1024, 256, 378.9, 328.6), (2048, 256, 382.8, 388.9), (4096, 256, 444.1, 480.3), (1024, 512, 562.5, 603.6),
    (2048, 512, 558.4, 714.3), (4096, 512, 609.9, 759.6), (1024, 1024, 624.5, 834.1), (2048, 1024, 663.8, 963.3),
    (4096, 1024, 661.4, 984.2), (1024, 2048, 670.6, 983.5), (2048, 2048, 683.7, 1128.3), (4096, 2048, 669.5, 1171.1),
    (1024, 4096, 668.7, 1101.9), (2048, 4096, 657.8, 1169.7), (4096, 4096, 667.1, 1177.0),
)


def here_graphed(dtype: str, later_group: bool = False) -> tuple[tuple[int, int, int, int, float], ...]:
    """The second lease's graphed H200 GEMMs as (b, m, n, k, TFLOP/s of `dtype`): the H100 set's shapes, or with
    `later_group` the newest revision's group."""
    i = 0 if dtype == "bf16" else 1
    if later_group:
        return tuple((2, 4096, n, k, (bf16, fp8)[i]) for n, k, bf16, fp8 in H200_GRAPHED_LATER)
    return tuple((b, m, n, k, (bf16, fp8)[i]) for b, m, n, k, bf16, fp8 in H200_GRAPHED)


def later(gpu: str, dtype: str) -> tuple[tuple[int, int, int, int, float], ...]:
    """The newest revision's group for `gpu` as (b, m, n, k, TFLOP/s) of `dtype` ("bf16" or "fp8")."""
    b, m, pts = LATER[gpu]
    return tuple((b, m, n, k, bf16 if dtype == "bf16" else fp8) for n, k, bf16, fp8 in pts)


Points = tuple[tuple[int, int, int, int, float], ...]


def tflops(dev: Device, b: int, m: int, n: int, k: int, level: float, k0: float, fixed_s: float,
           dtype_bytes: int = 2) -> float:
    """The model's TFLOP/s for one GEMM (compute.table_gemm_seconds) at a large-GEMM rate of `level` TFLOP/s."""
    g = Gemm("gemm", m, n, k, b)
    return g.flops / table_gemm_seconds(g, level * 1e12, dev.sms, dev.mem_bw * dev.mem_eff, dtype_bytes,
                                        k0, fixed_s) / 1e12


def errors(gpu: str, level: float, k0: float, fixed_s: float, points: Points | None = None,
           dtype_bytes: int = 2) -> list[float]:
    dev = get_device(gpu)
    pts = SETS[gpu] if points is None else points
    return [tflops(dev, b, m, n, k, level, k0, fixed_s, dtype_bytes) / meas - 1 for b, m, n, k, meas in pts]


def best_level(gpu: str, k0: float, fixed_s: float, points: Points | None = None,
               dtype_bytes: int = 2) -> tuple[float, float]:
    """(mean |error|, level) with the level chosen to minimise the mean |error| (golden section)."""
    pts = SETS[gpu] if points is None else points

    def cost(level: float) -> float:
        return statistics.fmean(abs(e) for e in errors(gpu, level, k0, fixed_s, pts, dtype_bytes))
    top = max(p[-1] for p in pts)
    lo, hi = 0.8 * top, 1.6 * top
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
    ap.add_argument("--json", action="store_true",
                    help="print each GEMM set's score (GPU, role, GEMMs, model, mean |error|, level, K0) as JSON "
                         "instead of text (not with --fit)")
    args = ap.parse_args(argv)
    if args.fit and args.json:
        ap.error("--json: not with --fit (the fit prints one line; run --json alone for the scores)")
    if args.fit:
        k0, f, level, err = fit()
        print(f"fitted K0 {k0}, fixed {f * 1e6:.1f} us (level {level:.0f} TFLOP/s), mean |error| {err:.1%}; "
              f"stored K0 {GEMM_K0}, fixed {GEMM_FIXED_S * 1e6:.1f} us")
    cases: list[tuple[str, str, Points, int]] = [
        ("h100-sxm", "in sample", SETS["h100-sxm"], 2), ("b200", "held out", SETS["b200"], 2)]
    cases += [(gpu, f"held out, newest revision, {dt}", later(gpu, dt), 2 if dt == "bf16" else 1)
              for gpu in LATER for dt in ("bf16", "fp8")]
    cases += [("h200", "held out, measured on the lent H200, the H100 set's shapes", H200_HERE, 2)]
    cases += [("h200", f"held out, measured on the lent H200, newest revision's group, {dt}", here_later(dt),
               2 if dt == "bf16" else 1) for dt in ("bf16", "fp8")]
    cases += [("h200", f"held out, the second lease, graphed, {grp}, {dt}", here_graphed(dt, grp == "newest group"),
               2 if dt == "bf16" else 1) for grp in ("the H100 set's shapes", "newest group") for dt in ("bf16", "fp8")]
    scores = []
    for gpu, role, pts, nbytes in cases:
        # an FP8 GEMM's depth constant is BF16's times its rate over BF16's (compute.depth_k0)
        k0_here = depth_k0(get_device(gpu), "fp8") if nbytes == 1 else GEMM_K0
        for name, k0, f in (("this model", k0_here, GEMM_FIXED_S), ("K0 0, 3 us (before)", 0, 3e-6)):
            err, level = best_level(gpu, k0, f, pts, nbytes)
            scores.append({"gpu": gpu, "role": role, "gemms": len(pts), "model": name, "mean_abs_error": err,
                           "level_tflops": level, "k0": k0})
    if args.json:
        print(json.dumps(scores, indent=1))
        return 0
    for sc in scores:
        print(f"{sc['gpu']} ({sc['role']}, {sc['gemms']} GEMMs), {sc['model']}: mean |error| "
              f"{sc['mean_abs_error']:.1%} at level {sc['level_tflops']:.0f}"
              + (f" (K0 {sc['k0']:.0f})" if sc["model"] == "this model" else ""))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
