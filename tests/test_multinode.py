"""Several nodes (reliability issue, point 7): two `torchrun --nnodes 2 --nproc-per-node 2` agents on
this machine, meeting through a c10d rendezvous on 127.0.0.1, run `par3d train --dp 2 --tp 2` as one
world of 4 ranks.  The losses rank 0 logs equal the single-process reference's within 1e-5 — the
same numbers a single-node run of that layout gives (tests/test_equiv_dp_tp.py: every layout equals
the reference) — and only global rank 0 writes metrics and the report."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from par3d.distributed import free_port

TOL = 1e-5
TRAIN = ["-m", "par3d", "train", "--dp", "2", "--tp", "2", "--layers", "2", "--hidden", "32", "--seq-len", "16",
         "--global-batch", "8", "--steps", "3", "--no-progress"]
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
ATTEMPT_S = 75  # a healthy run takes ~10 s on 2 cores; the margin is for a machine shared with other suites
RENDEZVOUS_DONE = "Rendezvous complete for workers"  # torchrun's agent logs this once both nodes have met


def _tree(root: int) -> list[int]:
    """`root` and all its descendants, read from /proc (children before they are re-parented)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _attempt(d: Path) -> tuple[list[int | None], list[str]]:
    """Run both agents once, for at most ATTEMPT_S seconds; return their exit codes (None: stopped) and logs."""
    port = free_port()  # a fresh port each attempt: another suite may have taken the last one meanwhile
    # LOGLEVEL=INFO: the agents log their rendezvous; SIGABRT below makes a stuck rank print its stack.
    # GLOO_SOCKET_IFNAME=lo: both "nodes" talk over loopback, as a real cluster names its interface,
    # so gloo need not resolve this machine's hostname (slow where a resolver does not answer).
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "LOGLEVEL": "INFO", "GLOO_SOCKET_IFNAME": "lo"}
    procs = []
    for node in (0, 1):
        # is_host: node 0 hosts the rendezvous store (both "nodes" have the endpoint's address)
        cmd = [TORCHRUN, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-conf", f"is_host={str(node == 0).lower()},join_timeout={ATTEMPT_S},read_timeout=30",
               "--node-rank", str(node), "--local-addr", "127.0.0.1", "--max-restarts", "0",
               *TRAIN, "--metrics-out", str(d / "metrics.jsonl"), "--out", str(d / "out")]
        log = open(d / f"node{node}.log", "w")  # noqa: SIM115  (closed below)
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=d, env=env,
                                       start_new_session=True), log))
    deadline = time.monotonic() + ATTEMPT_S
    try:
        while time.monotonic() < deadline and any(p.poll() is None for p, _ in procs):
            # One node failing (say, its port was taken) leaves the other waiting at the rendezvous.
            if any(p.poll() not in (None, 0) for p, _ in procs):
                break
            time.sleep(0.2)
    finally:
        # torchrun starts each worker in a session of its own, so the tree is collected from /proc
        # while the agents still live, and every process of it is stopped, not just the agents.
        tree = [pid for p, _ in procs if p.poll() is None for pid in _tree(p.pid)]
        for sig, pause in ((signal.SIGABRT, 2.0), (signal.SIGKILL, 0.0)):
            for pid in tree:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            time.sleep(pause if tree else 0)
        rcs = [None if p.pid in tree else p.returncode for p, _ in procs]
        for p, log in procs:
            p.wait()
            log.close()
    logs = [(d / f"node{n}.log").read_text(errors="replace") for n in (0, 1)]
    return rcs, logs


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory) -> dict:
    if not os.path.exists(TORCHRUN):
        pytest.skip("torchrun is not installed next to this Python")
    for attempt in range(2):
        d = tmp_path_factory.mktemp(f"nodes{attempt}")
        rcs, logs = _attempt(d)
        if rcs == [0, 0]:
            break
    met = any(RENDEZVOUS_DONE in log for log in logs)
    if rcs != [0, 0] and not met:
        # torchrun's own rendezvous never completed (twice): that is the machine (ports, sandbox),
        # not par3d, whose code only runs after it.  Fail loudly on anything after that point.
        pytest.skip("torchrun's c10d rendezvous did not complete on this machine:\n"
                    + "\n---\n".join(log[-2000:] for log in logs))
    metrics = d / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    return {"rcs": rcs, "logs": logs, "rows": rows}


def test_both_nodes_exit_cleanly(two_nodes):
    assert two_nodes["rcs"] == [0, 0], "\n---\n".join(log[-3000:] for log in two_nodes["logs"])


def test_two_nodes_log_the_single_process_losses(two_nodes):
    from par3d.cli import build_parser
    from par3d.commands.train import config_from_args
    from par3d.train import worker

    cfg = config_from_args(build_parser().parse_args(TRAIN[2:]))
    cfg.parallel.dp = cfg.parallel.tp = 1
    cfg.parallel.microbatches = cfg.train.micro_batch = None
    ref = [h["loss"] for h in worker(cfg.validate().to_dict(), {"quiet": True})["history"]]
    got = [row["loss"] for row in two_nodes["rows"]]
    assert [row["step"] for row in two_nodes["rows"]] == [0, 1, 2], "\n---\n".join(two_nodes["logs"])
    assert max(abs(a - b) for a, b in zip(got, ref)) <= TOL, (got, ref)


def test_only_global_rank_0_reports(two_nodes):
    reports = sum(log.count("par3d train: dp=2 pp=1 tp=2") for log in two_nodes["logs"])
    assert reports == 1
