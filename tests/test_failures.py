"""Failures never hang and never leave processes behind (reliability issue, points 1 and 4).

Faults are injected through par3d.faults (the loop's only seam for tests): a FaultInjector passed
in RunOptions(faults=...), or, for a `par3d train` subprocess, the test-only variables
PAR3D_TEST_{KILL,RAISE,HANG}_RANK_AT_STEP that it reads when a rank starts.

  * acceptance: `par3d train` on 4 ranks, rank 2 SIGKILLed in the middle of a checkpoint save:
    exit code != 0 within 60 s, one line naming rank 2, no process left, and the previous
    checkpoint is whole, loadable, and continues the run (the half-written one is never loaded);
  * a rank that raises: the run ends with that rank's error;
  * a rank that hangs: the others stop after --timeout, not after torch's 30-minute default.

Leftover processes are found by a marker in their environment (children inherit it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from par3d import checkpoint
from par3d.checkpoint import CheckpointError


def _with_marker(marker: str) -> list[int]:
    """Our processes whose environment holds `marker` (this process and resource trackers aside)."""
    needle = f"PAR3D_TEST_MARKER={marker}".encode()
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read()
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
        except OSError:  # gone, or not ours
            continue
        if needle in env.split(b"\0") and b"resource_tracker" not in cmd:
            found.append(pid)
    return found


def _gone(marker: str, within_s: float = 5.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := _with_marker(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


MODEL = ["--layers", "4", "--hidden", "32", "--heads", "4", "--seq-len", "16", "--global-batch", "8"]


@pytest.fixture(scope="module")
def killed_in_save(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("killed")
    marker = uuid.uuid4().hex
    env = dict(os.environ, PAR3D_TEST_MARKER=marker, PAR3D_TEST_KILL_RANK_AT_STEP="2:3:save",
               PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "par3d", "train", "--dp", "1", "--pp", "2", "--tp", "2", *MODEL,
           "--steps", "8", "--save-every", "2", "--out", str(out), "--no-progress"]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=out)
    return {"rc": r.returncode, "stderr": r.stderr, "elapsed": time.monotonic() - t0, "out": str(out),
            "left": _gone(marker)}


def test_sigkill_of_one_of_four_ranks_ends_the_run(killed_in_save):
    r = killed_in_save
    assert r["rc"] != 0
    assert r["elapsed"] < 60, f"took {r['elapsed']:.0f} s"
    lines = [ln for ln in r["stderr"].splitlines() if ln.startswith("par3d train:")]
    assert lines == ["par3d train: rank 2 failed: killed by signal SIGKILL"], r["stderr"][-2000:]
    assert "Traceback" not in r["stderr"]
    assert r["left"] == [], f"processes left behind: {r['left']}"


def test_sigkill_during_a_save_leaves_the_previous_checkpoint_loadable(killed_in_save):
    from par3d.train import worker

    root = checkpoint.checkpoints_root(killed_in_save["out"])
    half = os.path.join(root, ".tmp-" + checkpoint.step_dir_name(4))
    assert os.path.isdir(half), os.listdir(root)  # the save of step 4 was under way...
    with pytest.raises(CheckpointError):
        checkpoint.read_manifest(half)  # ...and what it left is never loaded
    latest = checkpoint.resolve("latest", killed_in_save["out"])
    assert latest.endswith(checkpoint.step_dir_name(2))
    # the survivor continues the run: resumed in one process, it gives the uninterrupted losses
    from par3d.cli import build_parser
    from par3d.commands.train import config_from_args

    args = build_parser().parse_args(["train", "--dp", "1", *MODEL, "--steps", "8", "--no-progress"])
    cfg = config_from_args(args).validate()
    ref = worker(cfg.to_dict(), {"quiet": True, "stop_at_step": 4})["history"]
    cfg.resume = latest
    got = worker(cfg.to_dict(), {"quiet": True, "stop_at_step": 4})["history"]
    assert [h["step"] for h in got] == [2, 3]
    for a, b in zip(got, ref[2:]):
        assert abs(a["loss"] - b["loss"]) <= 1e-4


def _run_with_fault(monkeypatch, var: str, spec: str, timeout_s: float = 60.0):
    from par3d.config import RunConfig
    from par3d.distributed import RankFailure
    from par3d.train import run

    marker = uuid.uuid4().hex
    monkeypatch.setenv("PAR3D_TEST_MARKER", marker)
    monkeypatch.setenv(var, spec)
    cfg = RunConfig()
    cfg.parallel.dp = 2
    cfg.model.layers, cfg.model.hidden, cfg.model.seq_len = 2, 32, 16
    cfg.train.global_batch, cfg.train.steps = 4, 4
    cfg.progress, cfg.timeout_s = False, timeout_s
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run(cfg)
    return info.value, time.monotonic() - t0, _gone(marker)


def test_an_exception_in_a_rank_ends_the_run_with_its_error(monkeypatch):
    err, elapsed, left = _run_with_fault(monkeypatch, "PAR3D_TEST_RAISE_RANK_AT_STEP", "1:1")
    assert str(err) == "rank 1 failed: RuntimeError: injected failure on rank 1 at step 1 " \
                       "(PAR3D_TEST_RAISE_RANK_AT_STEP)"
    assert left == []


def test_a_hung_rank_ends_the_run_after_the_timeout(monkeypatch):
    err, elapsed, left = _run_with_fault(monkeypatch, "PAR3D_TEST_HANG_RANK_AT_STEP", "1:1", timeout_s=3)
    assert str(err).startswith("rank "), str(err)
    assert elapsed < 45, f"took {elapsed:.0f} s with --timeout 3"
    assert left == []


# ---- the seam itself (no process) ------------------------------------------------------------------

def test_faults_come_from_the_environment_only_when_named():
    from par3d.faults import Fault, FaultInjector

    assert FaultInjector.from_env({}) is None
    got = FaultInjector.from_env({"PAR3D_TEST_KILL_RANK_AT_STEP": "2:3:save",
                                  "PAR3D_TEST_HANG_RANK_AT_STEP": "1:0"})
    assert got is not None
    assert got.faults == (Fault("kill", 2, 3, "save"), Fault("hang", 1, 0, "step"))
    got.step_started(2, 3)  # a fault fires only at its own (rank, step, place): nothing happens here
    got.in_save(0, 3)
    assert FaultInjector(nan_loss_at_step=1).loss_scale(1, 0.5) != FaultInjector().loss_scale(1, 0.5)


def test_run_options_are_typed():
    from par3d.train import RunOptions

    assert RunOptions.of({"quiet": True, "stop_at_step": 4}) == RunOptions(quiet=True, stop_at_step=4)
    with pytest.raises(TypeError, match="nan_loss_at_step"):  # faults go through RunOptions.faults
        RunOptions.of({"nan_loss_at_step": 1})


def _reports_lost_peer(conn) -> None:
    import pickle as _p

    conn.send_bytes(_p.dumps(("error", "RuntimeError: Connection closed by peer", None, time.time())))
    time.sleep(30)


def _killed_a_moment_later() -> None:
    import signal as _s

    time.sleep(0.3)
    os.kill(os.getpid(), _s.SIGKILL)


def test_a_death_seen_just_after_a_peers_error_is_the_reported_cause():
    """The launcher's race: a peer's "connection closed" is read before the killed rank's exit shows;
    the death (the cause) must still be what is reported, not the peer's symptom."""
    import multiprocessing as mp

    from par3d import distributed

    ctx = mp.get_context("fork")
    r0, s0 = ctx.Pipe(duplex=False)
    r1, s1 = ctx.Pipe(duplex=False)
    procs = [ctx.Process(target=_reports_lost_peer, args=(s0,)), ctx.Process(target=_killed_a_moment_later)]
    for p in procs:
        p.start()
    s0.close()
    s1.close()
    try:
        with pytest.raises(distributed.RankFailure) as e:
            distributed._wait(procs, [r0, r1], 20.0)
        assert e.value.rank == 1 and e.value.error == "killed by signal SIGKILL"
    finally:
        distributed._stop(procs)
