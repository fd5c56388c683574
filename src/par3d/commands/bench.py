"""`par3d bench peers | fidelity | synthetic`: measured comparisons (see benchmarks/)."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

BENCHES = ("peers", "fidelity", "synthetic")


def register(sub: Any) -> None:
    ap = sub.add_parser("bench", help="run a benchmark (peers, fidelity, synthetic)",
                        description="Side-by-side measurements; each writes a results file under "
                                    "benchmarks/results/ and --json prints it.")
    bsub = ap.add_subparsers(dest="bench", metavar="BENCH")
    for name in BENCHES:
        try:
            mod = importlib.import_module(f"par3d.bench.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"par3d.bench.{name}":
                continue
            raise
        mod.register(bsub)

    def _help(args: argparse.Namespace) -> int:
        ap.print_help()
        return 2

    ap.set_defaults(func=_help)
