"""The watchdog tells a slow step from a lost peer (issue 14, item 3).

Before: with every rank computing one very slow step (`--seq-len 100000`), the watchdog said "a
peer died or hung" and stopped the run.  Now each rank publishes a heartbeat (beats and CPU time)
in the run's TCP store, and a rank whose loop made no progress for `--timeout` says which it is:

* real processes around a TCP store of the test's (no launcher, which would notice a local death
  itself; the watchdog is for peers it cannot see, e.g. on another node): a SIGKILLed peer is
  "gone" and the rank stops; a peer alive but idle is a hang and the rank stops; every rank busy
  is "still computing" and the rank goes on;
* a real 2-rank pipeline run whose step 1 keeps every rank busy for 5 s under `--timeout 1.5`
  warns and finishes, and leaves no `/dev/shm` segment of its run;
* the diagnosis itself from given heartbeat samples (no process).
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from par3d.config import RunConfig

# a rank's main loop that never beats, as a stuck or very slow step looks to the watchdog
_RANK = """
import sys, time
from par3d.train import _Watchdog
rank, mode, timeout = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
with _Watchdog(rank, timeout, [0, 1]):
    print("ready", flush=True)
    x = 0
    while True:
        if mode == "busy":
            x += 1
        else:
            time.sleep(0.05)
"""


def _store():
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)


def _start(store, rank: int, mode: str) -> subprocess.Popen:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port))
    # rank 0 watches (--timeout 1); rank 1's own watchdog waits longer, so it never ends first
    timeout = "1" if rank == 0 else "60"
    return subprocess.Popen([sys.executable, "-c", _RANK, str(rank), mode, timeout], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_ready(*procs: subprocess.Popen) -> None:
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr.read()[-2000:]


@pytest.fixture(scope="module")
def verdicts() -> dict[str, tuple[int | None, str, float]]:
    """Three pairs of ranks at once: rank 1 SIGKILLed ("gone"), alive but idle ("hang"), both busy
    ("busy").  Per case: rank 0's exit code (None: still running), its stderr, seconds to exit."""
    stores = {case: _store() for case in ("gone", "hang", "busy")}
    procs = {case: (_start(st, 0, "busy" if case == "busy" else "idle"),
                    _start(st, 1, "busy" if case == "busy" else "idle")) for case, st in stores.items()}
    try:
        for pair in procs.values():
            _wait_ready(*pair)
        t0 = time.monotonic()
        procs["gone"][1].send_signal(signal.SIGKILL)
        out: dict[str, tuple[int | None, str, float]] = {}
        for case in ("gone", "hang"):
            r0 = procs[case][0]
            try:
                r0.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            out[case] = (r0.poll(), "", time.monotonic() - t0)
        time.sleep(max(0.0, 6.0 - (time.monotonic() - t0)))  # past --timeout + the diagnosis window
        out["busy"] = (procs["busy"][0].poll(), "", time.monotonic() - t0)
    finally:
        for pair in procs.values():
            for p in pair:
                if p.poll() is None:
                    p.kill()
                p.wait()
    return {case: (code, procs[case][0].stderr.read(), dt) for case, (code, _e, dt) in out.items()}


def test_a_killed_peer_is_gone_and_the_rank_stops(verdicts):
    code, err, dt = verdicts["gone"]
    assert code == 1, err[-2000:]
    assert "rank 1 is gone (no heartbeat); stopping" in err, err[-2000:]
    assert dt < 20


def test_an_idle_peer_is_a_hang_and_the_rank_stops(verdicts):
    code, err, dt = verdicts["hang"]
    assert code == 1, err[-2000:]
    assert "every rank is alive but none is computing" in err, err[-2000:]
    assert "gone" not in err


def test_busy_ranks_are_still_computing_and_the_rank_goes_on(verdicts):
    code, err, _dt = verdicts["busy"]
    assert code is None, err[-2000:]  # still running when the test stopped it
    assert "while ranks are still computing (ranks 0, 1 used CPU" in err, err[-2000:]
    assert "; stopping" not in err


# ---- a real run: one slow step on every rank -----------------------------------------------------

class BusyAtStep:
    """Every rank computes for SECONDS at the start of step 1 (a step far slower than --timeout;
    all ranks at once: a rank left waiting in a collective would hit the backend's own timeout)."""

    SECONDS = 5.0

    def step_started(self, rank: int, step: int) -> None:
        if step == 1:
            end = time.monotonic() + self.SECONDS
            x = 0
            while time.monotonic() < end:
                x += 1

    def loss_scale(self, step: int, scale: float) -> float:
        return scale

    def before_save(self, rank: int, step: int, dpar) -> None:
        pass

    def in_save(self, rank: int, step: int) -> None:
        pass


def test_a_slow_step_is_reported_as_computing_and_the_run_goes_on(capfd, monkeypatch):
    from par3d.train import RunOptions, run

    run_id = uuid.uuid4().hex[:8]
    monkeypatch.setenv("PAR3D_RUN_ID", run_id)
    cfg = RunConfig()
    cfg.parallel.pp, cfg.parallel.microbatches = 2, 2
    cfg.model.layers, cfg.model.hidden, cfg.model.seq_len = 2, 32, 16
    cfg.train.global_batch, cfg.train.steps = 4, 3
    cfg.progress, cfg.timeout_s = False, 1.5
    results = run(cfg, RunOptions(quiet=True, faults=BusyAtStep()))
    err = capfd.readouterr().err
    assert [len(r["history"]) for r in results] == [3, 3]
    assert "while ranks are still computing (ranks " in err, err[-2000:]
    assert "; stopping" not in err and "gone" not in err
    assert glob.glob(f"/dev/shm/par3d-{run_id}-*") == []


# ---- the diagnosis (no process) -------------------------------------------------------------------

def test_watchdog_diagnosis_from_heartbeats(monkeypatch):
    from par3d.train import _Watchdog

    wd = _Watchdog(0, 10.0, [0, 1, 2], enabled=False)
    samples = iter([])
    monkeypatch.setattr(wd, "_sample", lambda: next(samples))
    monkeypatch.setattr(wd, "_publish", lambda: None)
    monkeypatch.setattr(wd._stop, "wait", lambda seconds: False)  # the window passes at once
    cases = {  # (beats, CPU ms) of ranks 0, 1, 2 at the start and the end of a 2 s window [and of a second one,
        # taken only when a peer did not beat in the first: it is gone only if it did not beat in either]
        "gone": ([(5, 0), (5, 0), (5, 0)], [(7, 0), (5, 900), (7, 0)], [(9, 0), (5, 900), (9, 0)], ("gone", [1])),
        "late": ([(5, 0), (5, 0), (5, 0)], [(7, 0), (5, 1800), (7, 0)], [(9, 0), (6, 3600), (9, 0)], ("computing", [1])),
        "computing": ([(5, 0), (5, 0), (5, 0)], [(7, 0), (7, 0), (7, 1800)], None, ("computing", [2])),
        "idle": ([(5, 0), (5, 0), (5, 0)], [(7, 10), (7, 5), (7, 0)], None, ("idle", [])),
    }
    for a, b, c, want in cases.values():
        samples = iter([dict(enumerate(a)), dict(enumerate(b))] + ([dict(enumerate(c))] if c else []))
        assert wd.diagnose(2.0) == want
        assert next(samples, None) is None  # the second window is sampled only when a peer looked gone

    def unreachable():
        raise ConnectionError("store gone")

    monkeypatch.setattr(wd, "_sample", unreachable)
    assert wd.diagnose(2.0) == ("gone", [0])
