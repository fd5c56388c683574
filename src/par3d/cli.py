"""`par3d train | plan | simulate | calibrate | bench`.

Each subcommand lives in `par3d/commands/<name>.py` with `register(subparsers)`; registering must
not import torch so `par3d plan` and `--help` stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("train", "plan", "simulate", "calibrate", "bench")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="par3d",
        description="Train transformers with data x pipeline x tensor parallelism, and plan such runs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"par3d.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"par3d.commands.{name}":
                continue  # not built yet
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    raise SystemExit(main())
