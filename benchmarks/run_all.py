"""Run every registered `par3d bench <name>` benchmark, one after the other.

Each benchmark writes its own results under benchmarks/results/ (see benchmarks/README.md).  The
list comes from the benchmarks that exist in this checkout (src/par3d/bench/*.py registered by
the `par3d bench` dispatcher), so a benchmark added later is picked up without editing this file.

    python benchmarks/run_all.py                 # every benchmark, default settings
    python benchmarks/run_all.py --quick         # pass --quick to each that has it (a smoke run)
    python benchmarks/run_all.py peers           # only the named ones
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time


def available() -> list[str]:
    """Benchmarks the `par3d bench` dispatcher knows and whose module exists here."""
    from par3d.commands.bench import BENCHES

    return list(BENCHES)


def accepts(name: str, flag: str) -> bool:
    """Whether `par3d bench <name>` has option `flag` (not every benchmark has --quick)."""
    from par3d.cli import build_parser

    def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        acts = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return dict(acts[0].choices) if acts else {}

    bench = subparsers(build_parser()).get("bench")
    sub = subparsers(bench).get(name) if bench is not None else None
    return sub is not None and flag in sub._option_string_actions


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run every `par3d bench` benchmark (results under "
                                             "benchmarks/results/).")
    ap.add_argument("names", nargs="*", help="benchmarks to run (default: all that exist)")
    ap.add_argument("--quick", action="store_true", help="pass --quick to each benchmark (smoke run)")
    args = ap.parse_args(argv)
    have = available()
    names = args.names or have
    unknown = [n for n in names if n not in have]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(have)}", file=sys.stderr)
        return 2
    failed = []
    for name in names:
        quick = args.quick and accepts(name, "--quick")
        if args.quick and not quick:
            print(f"== {name} has no --quick; running it with its defaults", flush=True)
        cmd = [sys.executable, "-m", "par3d", "bench", name] + (["--quick"] if quick else [])
        print(f"== {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        # a separate process per benchmark: each starts its own gloo worlds, and one that fails
        # does not take the others down
        rc = subprocess.call(cmd)
        print(f"== {name}: exit {rc} after {time.perf_counter() - t0:.0f} s", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
