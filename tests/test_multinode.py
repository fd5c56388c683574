"""Several nodes (reliability issue, point 7): two `torchrun --nnodes 2 --nproc-per-node 2` agents on
this machine, meeting through a c10d rendezvous on 127.0.0.1, run `par3d train --dp 2 --tp 2` as one
world of 4 ranks.  The losses rank 0 logs equal the single-process reference's within 1e-5 — the
same numbers a single-node run of that layout gives (tests/test_equiv_dp_tp.py: every layout equals
the reference) — and only global rank 0 writes metrics and the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from par3d.distributed import free_port

TOL = 1e-5
TRAIN = ["-m", "par3d", "train", "--dp", "2", "--tp", "2", "--layers", "2", "--hidden", "32", "--seq-len", "16",
         "--global-batch", "8", "--steps", "3", "--no-progress"]
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory) -> dict:
    if not os.path.exists(TORCHRUN):
        pytest.skip("torchrun is not installed next to this Python")
    d = tmp_path_factory.mktemp("nodes")
    port = free_port()
    procs = []
    try:
        for node in (0, 1):
            # is_host: node 0 hosts the rendezvous store (both "nodes" have the endpoint's address)
            cmd = [TORCHRUN, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", f"is_host={node == 0}".lower(),
                   "--node-rank", str(node), "--local-addr", "127.0.0.1", "--max-restarts", "0",
                   *TRAIN, "--metrics-out", str(d / "metrics.jsonl"), "--out", str(d / "out")]
            log = open(d / f"node{node}.log", "w")  # noqa: SIM115  (closed below)
            procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=d), log))
        rcs = [p.wait(timeout=90) for p, _ in procs]
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    logs = [(d / f"node{n}.log").read_text() for n in (0, 1)]
    with open(d / "metrics.jsonl") as fh:
        rows = [json.loads(line) for line in fh]
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
    assert [row["step"] for row in two_nodes["rows"]] == [0, 1, 2]
    assert max(abs(a - b) for a, b in zip(got, ref)) <= TOL, (got, ref)


def test_only_global_rank_0_reports(two_nodes):
    reports = sum(log.count("par3d train: dp=2 pp=1 tp=2") for log in two_nodes["logs"])
    assert reports == 1
