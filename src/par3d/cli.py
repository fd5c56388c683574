"""`par3d train | plan | simulate | calibrate | bench | eval | export`.

Each subcommand lives in `par3d/commands/<name>.py` with `register(subparsers)`; registering must
not import torch so `par3d plan` and `--help` stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

COMMANDS = ("train", "plan", "simulate", "calibrate", "bench", "eval", "export")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="par3d",
        description="Train transformers with data x pipeline x tensor parallelism, and plan such runs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    register_modules(sub, "par3d.commands", COMMANDS)
    return parser


def register_modules(sub: Any, package: str, names: tuple[str, ...]) -> None:
    """Each `package.<name>` module adds its own subcommand (lazily importing what it runs)."""
    for name in names:
        importlib.import_module(f"{package}.{name}").register(sub)


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
