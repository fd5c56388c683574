"""par3d.distributed: spawned gloo worlds, their results, and how they fail.

Each world costs seconds of torch import per rank, so there are few of them: one healthy 4-rank
world whose worker returns everything the tests check, and one world per failure mode.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from distributed_helper import run_world

from par3d.distributed import (
    RankFailure,
    backend_and_device,
    free_port,
    is_rank0,
    launch,
    under_launcher,
)

# --------------------------------------------------------------------------- workers (module level)


def _healthy(scale: int) -> dict:
    rank = dist.get_rank()
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return {
        "rank": rank,
        "world": dist.get_world_size(),
        "sum": t.item() * scale,
        "backend": dist.get_backend(),
        "threads": torch.get_num_threads(),
        "env": {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")},
        "is_rank0": is_rank0(),
        "under_launcher": under_launcher(),
        "pid": os.getpid(),
    }


def _record_pid(pid_dir: str) -> int:
    rank = dist.get_rank()
    Path(pid_dir, f"{rank}.pid").write_text(str(os.getpid()))
    dist.barrier()  # every rank has started and recorded its pid
    return rank


def _raises(pid_dir: str, bad: int) -> None:
    if _record_pid(pid_dir) == bad:
        raise ValueError(f"rank {bad} is bad")
    dist.all_reduce(torch.ones(1))  # blocks forever: the bad rank never joins


def _sigkills(pid_dir: str, bad: int) -> None:
    if _record_pid(pid_dir) == bad:
        time.sleep(0.5)  # let the others enter the collective first
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))


def _hangs() -> None:
    time.sleep(3600)


# --------------------------------------------------------------------------- helpers


def _aborts_in_teardown(value: int) -> int:
    # what torch's C++ threads occasionally do on the way out: abort after the work is done
    dist.destroy_process_group = lambda *a, **k: os.abort()
    return value * 10 + dist.get_rank()


def _makes_a_progress_bar() -> int:
    import sys

    from tqdm import tqdm

    tqdm(total=1, file=sys.stderr).close()  # tqdm's lock is a multiprocessing semaphore
    return dist.get_rank()


def _assert_all_gone(pid_dir: Path, nproc: int) -> None:
    assert multiprocessing.active_children() == []
    pids = [int(pid_dir.joinpath(f"{r}.pid").read_text()) for r in range(nproc)]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _fail(fn, nproc: int, *args) -> tuple[RankFailure, float]:
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_world(fn, nproc, *args)
    return info.value, time.monotonic() - start


# --------------------------------------------------------------------------- a healthy world


@pytest.fixture(scope="module")
def world4() -> list[dict]:
    return run_world(_healthy, 4, 10)


def test_values_come_back_ordered_by_rank(world4):
    assert [r["rank"] for r in world4] == [0, 1, 2, 3]
    assert all(r["world"] == 4 for r in world4)


def test_all_reduce_sums_rank_ids(world4):
    assert all(r["sum"] == (0 + 1 + 2 + 3) * 10 for r in world4)
    assert all(r["backend"] == "gloo" for r in world4)


def test_ranks_get_torchrun_environment(world4):
    for r in world4:
        assert r["env"] == {
            "RANK": str(r["rank"]),
            "LOCAL_RANK": str(r["rank"]),
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "4",
        }
        assert r["threads"] == 1
        assert r["under_launcher"]
    assert [r["is_rank0"] for r in world4] == [True, False, False, False]
    assert len({r["pid"] for r in world4}) == 4


def test_healthy_world_leaves_no_process(world4):
    assert multiprocessing.active_children() == []
    for r in world4:
        with pytest.raises(ProcessLookupError):
            os.kill(r["pid"], 0)


# --------------------------------------------------------------------------- failures


def test_raising_rank_fails_the_world(tmp_path):
    failure, elapsed = _fail(_raises, 2, str(tmp_path), 1)
    assert failure.rank == 1
    assert str(failure) == "rank 1 failed: ValueError: rank 1 is bad"
    assert failure.error == "ValueError: rank 1 is bad"
    assert "Traceback" in failure.traceback and "_raises" in failure.traceback
    assert elapsed < 30  # the peer's collective timeout is 120 s: it was stopped, not timed out
    _assert_all_gone(tmp_path, 2)


def test_sigkilled_rank_stops_peers_blocked_in_a_collective(tmp_path):
    failure, elapsed = _fail(_sigkills, 3, str(tmp_path), 1)
    assert failure.rank == 1
    assert "SIGKILL" in str(failure) and "signal" in failure.error
    assert str(failure) == "rank 1 failed: killed by signal SIGKILL"
    assert elapsed < 30  # the peers' collective timeout is 120 s: they were stopped, not timed out
    _assert_all_gone(tmp_path, 3)


def test_a_rank_aborting_in_teardown_after_its_result_keeps_the_result(capfd):
    """The result is delivered after every rank finished (a barrier) and before the process group
    is torn down, so a crash in the tear-down does not turn a finished world into a failed one."""
    assert launch(_aborts_in_teardown, 2, (7,), timeout_s=30, wall_timeout_s=60) == [70, 71]
    err = capfd.readouterr().err
    assert "finished, then its process ended with signal SIGABRT" in err and "result is kept" in err


def test_finished_ranks_leave_no_leaked_semaphore(tmp_path):
    """Ranks skip the C++ tear-down but still run Python's exit handlers, so the resource tracker
    has nothing to report when the launching process exits (a new user saw the warning once)."""
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                      "from test_distributed import _makes_a_progress_bar\n"
                      "from par3d.distributed import launch\n"
                      "if __name__ == '__main__':\n"
                      "    print(launch(_makes_a_progress_bar, 2, timeout_s=30, wall_timeout_s=60))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "[0, 1]" in done.stdout
    assert "leaked" not in done.stderr, done.stderr


def test_wall_timeout_stops_a_hung_world():
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        launch(_hangs, 1, wall_timeout_s=3.0)
    assert info.value.rank == -1
    assert info.value.error.startswith("timed out after 3 s")
    assert time.monotonic() - start < 30
    assert multiprocessing.active_children() == []


def test_port_taken_before_rank0_binds_it_is_retried(monkeypatch):
    import par3d.distributed as distributed

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        ports = iter([busy.getsockname()[1]])
        real_free_port = distributed.free_port
        monkeypatch.setattr(distributed, "free_port", lambda: next(ports, None) or real_free_port())
        results = launch(_healthy, 2, (1,), timeout_s=60, wall_timeout_s=120)
    assert [r["sum"] for r in results] == [1.0, 1.0]
    assert multiprocessing.active_children() == []


def test_unpicklable_function_fails_before_spawning():
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        launch(lambda: None, 2)
    assert multiprocessing.active_children() == []


# --------------------------------------------------------------------------- no processes needed


def test_free_port_returns_distinct_usable_ports():
    ports = {free_port() for _ in range(8)}
    assert len(ports) >= 7  # the OS may, rarely, hand the same ephemeral port out twice
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))


def test_rank_failure_is_one_line_and_picklable():
    e = RankFailure(3, "RuntimeError: first line\nsecond line", "Traceback ...")
    assert str(e) == "rank 3 failed: RuntimeError: first line"
    back = pickle.loads(pickle.dumps(e))
    assert (back.rank, back.error, back.traceback, str(back)) == (e.rank, e.error, e.traceback, str(e))
    assert str(RankFailure(-1, "timed out after 5 s")) == "world failed: timed out after 5 s"


def test_under_launcher_needs_all_torchrun_variables(monkeypatch):
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert under_launcher()
    monkeypatch.delenv("MASTER_PORT")
    assert not under_launcher()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only expectation")
def test_cpu_backend_is_gloo():
    assert backend_and_device(0) == ("gloo", torch.device("cpu"))
