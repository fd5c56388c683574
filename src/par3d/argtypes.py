"""Argument types the command lines share: a bad value is refused by argparse (exit 2) naming the flag, the value and
the rule, before anything runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def int_at_least(lo: int) -> Callable[[str], int]:
    """An integer flag of at least `lo` (a count of runs, steps, stages, GPUs ...)."""

    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer; give an integer >= {lo}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"{v} must be an integer >= {lo}")
        return v

    return conv


__all__ = ["int_at_least"]
