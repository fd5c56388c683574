"""`par3d calibrate`: measure this machine, write a hardware file for `par3d plan --hardware FILE`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

# under runs/ unless --out names another file: the committed benchmarks/results/hardware-cpu.json
# changes only with an explicit --out
DEFAULT_OUT = os.path.join("runs", "calibrate", "hardware.json")


def register(sub: Any) -> None:
    ap = sub.add_parser(
        "calibrate", help="measure primitives, GEMM FLOP/s, memory bandwidth, runtime overheads and collectives",
        description="Measure what one rank of this machine achieves (one thread per rank on a CPU, as "
                    "`par3d train` runs it; the rank's GPU where CUDA is present): the primitives of a "
                    "transformer block (linear, attention, layer norm, GeLU, add, embedding, cross entropy) "
                    "forward and backward over grids of sizes, GEMM FLOP/s over shapes and dtypes, memory "
                    "bandwidth, the training runtime's fixed per-block/"
                    "per-action/per-step costs, and alpha/beta of all-reduce, all-gather, reduce-scatter "
                    "and send/recv fitted over message and group sizes. Writes a hardware file that "
                    "`par3d plan --hardware FILE`, `par3d train --hardware FILE` and `par3d bench "
                    "fidelity` read.")
    ap.add_argument("--out", default=DEFAULT_OUT, metavar="FILE",
                    help=f"hardware file to write (JSON; default {DEFAULT_OUT}; the committed one changes only "
                         "when named: --out benchmarks/results/hardware-cpu.json)")
    ap.add_argument("--plot", default=None, metavar="PNG",
                    help="also draw the primitives' fits, the GEMM efficiency curve and the collective fits to "
                         "this PNG")
    ap.add_argument("--nproc", type=int, default=2,
                    help="ranks to launch for the collectives; groups of 2..NPROC ranks are measured "
                         "(default 2; on a GPU at most one rank per GPU, and 1 on a one-GPU machine: its "
                         "collectives and pipeline hop are then not measured and the catalogue's links kept)")
    ap.add_argument("--quick", action="store_true",
                    help="fewer shapes, message sizes and repetitions (~4x faster, noisier)")
    ap.add_argument("--sustained-s", type=float, default=60.0, metavar="S",
                    help="on a GPU: hold the best 16-bit GEMM for S seconds on every GPU of the node at once and "
                         "describe the GPU by that steady rate (its sustained clock at the power limit, what a "
                         "training step runs at) instead of the burst times a ratio borrowed from another GPU; "
                         "0 skips it (default: %(default)s; ignored on a CPU)")
    ap.add_argument("--json", action="store_true", help="print the hardware file's JSON instead of a summary")
    ap.set_defaults(func=run)


def _gpus() -> int:
    """CUDA devices visible here (0 without CUDA); torch is imported only when the flags are valid otherwise."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run(args: argparse.Namespace) -> int:
    if args.sustained_s < 0:
        print(f"par3d calibrate: --sustained-s {args.sustained_s}: a hold lasts 0 seconds (skip it) or more; "
              "use --sustained-s 60", file=sys.stderr)
        return 2
    gpus = _gpus()
    if args.nproc < 1 or (args.nproc < 2 and gpus == 0):
        print(f"par3d calibrate: --nproc {args.nproc}: collectives need at least 2 ranks; use --nproc 2"
              + (" (--nproc 1 is for a machine with one GPU)" if args.nproc == 1 else ""), file=sys.stderr)
        return 2
    if gpus and args.nproc > gpus:
        print(f"par3d calibrate: --nproc {args.nproc}: each rank needs its own GPU and {gpus} "
              f"{'is' if gpus == 1 else 'are'} visible; use --nproc {gpus}"
              + (" (collectives and the pipeline hop are then not measured: the catalogue's links are kept)"
                 if gpus == 1 else ""), file=sys.stderr)
        return 2
    from par3d.calibrate import calibrate, plot, summary
    from par3d.distributed import RankFailure

    try:
        hw = calibrate(nproc=args.nproc, quick=args.quick, progress=not args.json, sustained_s=args.sustained_s)
    except RankFailure as e:
        print(f"par3d calibrate: {e}", file=sys.stderr)
        return 1
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(hw, fh, indent=1)
    if args.plot:
        plot(hw, args.plot)
    if args.json:
        print(json.dumps(hw, indent=1))
    else:
        print(summary(hw))
    print(f"wrote {args.out}" + (f" and {args.plot}" if args.plot else ""), file=sys.stderr if args.json else sys.stdout)
    return 0
