"""`par3d bench peers | fidelity | synthetic | planner | split`: measured comparisons (see benchmarks/)."""

from __future__ import annotations

import argparse
import os
from typing import Any

BENCHES = ("peers", "fidelity", "synthetic", "planner", "split")
# every bench writes here unless --out names another file: the committed results under
# benchmarks/results/ change only when asked for explicitly
RUNS_DIR = os.path.join("runs", "bench")


def default_out(name: str, ext: str = "json") -> str:
    return os.path.join(RUNS_DIR, f"{name}.{ext}")


def register(sub: Any) -> None:
    ap = sub.add_parser("bench", help="run a benchmark (peers, fidelity, synthetic, planner, split)",
                        description="Side-by-side measurements; each writes a results file under "
                                    f"{RUNS_DIR}/ (or --out FILE; the committed ones are under "
                                    "benchmarks/results/) and --json prints it.")
    bsub = ap.add_subparsers(dest="bench", metavar="BENCH")
    from par3d.cli import register_modules

    register_modules(bsub, "par3d.bench", BENCHES)

    def _help(args: argparse.Namespace) -> int:
        ap.print_help()
        return 2

    ap.set_defaults(func=_help)
