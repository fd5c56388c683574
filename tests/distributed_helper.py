"""Run a function on a world of N gloo ranks from a test.

Spawning a world costs seconds (every rank imports torch), so a test module spawns ONE world per
size, in a module-scoped fixture, whose worker runs many checks and returns a dict of results;
the individual tests then only assert on that dict:

    # tests/test_something.py
    import pytest
    import torch
    import torch.distributed as dist
    from distributed_helper import run_world

    def _worker(n: int) -> dict:              # module level: the ranks import it by name
        t = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(t)
        return {"sum": t.item(), "rank": dist.get_rank()}

    @pytest.fixture(scope="module")
    def world4() -> list[dict]:
        return run_world(_worker, 4, 10)      # one dict per rank, ordered by rank

    def test_sum(world4):
        assert all(r["sum"] == 6.0 for r in world4)

A rank that fails makes `run_world` raise `par3d.distributed.RankFailure` naming it, after every
rank has been stopped; `timeout_s` bounds each collective and (doubled) the whole world.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from par3d.distributed import launch


def run_world(fn: Callable[..., Any], nproc: int, *args: Any, timeout_s: float = 120.0) -> list[Any]:
    """`fn(*args)` on `nproc` local ranks (one thread each); their return values, ordered by rank."""
    return launch(fn, nproc, args, timeout_s=timeout_s, wall_timeout_s=timeout_s * 2, threads=1)
