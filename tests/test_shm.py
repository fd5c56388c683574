"""The shared-memory pipeline transport on its own (issue 4): what the runtime relies on (and the
runtime step's garbage-collection pause).

One world of 3 ranks as one pipeline group (v = 2 chunks per rank, m = 3 micro-batches) runs
every check: each message arrives intact and in its own slot whatever order it is taken in; a
received tensor (a view of its slot) stays intact while the sender goes on to the next step;
slots are reused over steps (the ack protocol); every call is counted; a message that never
comes is a TimeoutError naming the peer; asking for "shm" where it cannot work is a clear error;
no file is left in /dev/shm."""

from __future__ import annotations

import glob

import pytest
from distributed_helper import run_world

P, V, M, STEPS = 3, 2, 3, 4
SHAPE = (2, 3, 5)


def _payload(step: int, what: str, tag_stage: int, mb: int):
    import torch

    g = torch.Generator().manual_seed(((step * 2 + (what == "grad")) * 64 + tag_stage) * 16 + mb)
    return torch.randn(SHAPE, generator=g)


def _worker() -> dict:
    import torch
    import torch.distributed as dist

    from par3d import comm
    from par3d.mesh import Group
    from par3d.pipeline import shm

    r = dist.get_rank()
    group = Group("pp", list(range(P)), r, dist.group.WORLD)
    token = shm.agree(group, torch.device("cpu"), "shm")
    # handoff: senders yield after publishing (the policy for waiting ranks on a crowded host)
    t = shm.ShmTransport(group, r, P, V, M, SHAPE, torch.float32, token, 0.5, {"act", "grad"}, {"act", "grad"},
                         handoff=True)
    comm.COUNTER.reset()
    dist.barrier()  # every rank has unlinked its names
    out: dict = {"rank": r, "ok": t.ok, "files_after_setup": glob.glob(f"/dev/shm/par3d-{token}-*")}
    # stages this rank holds: r, r + P; it receives activations for stages > 0 and gradients for
    # stages < last (tag_stage = the receiving stage, as the runtime numbers them)
    mine = [r + k * P for k in range(V)]
    last = P * V - 1
    bad = stale = 0

    def laid_out(x, mb: int):  # micro-batch 0 sends a non-contiguous tensor (the copy_ path)
        return x.transpose(0, 2).contiguous().transpose(0, 2) if mb == 0 else x

    def send_step(step: int) -> None:  # everything this rank owes: activations to s+1, gradients to s-1
        for s in mine:
            for mb in range(M):
                if s < last:
                    t.send(laid_out(_payload(step, "act", s + 1, mb), mb), "act", s + 1, mb)
                if s > 0:
                    t.send(laid_out(_payload(step, "grad", s - 1, mb), mb), "grad", s - 1, mb)

    send_step(0)
    for step in range(STEPS):
        wanted = [("act", s, mb) for s in mine for mb in range(M) if s > 0] + \
                 [("grad", s, mb) for s in mine for mb in range(M) if s < last]
        # take them in reverse order: slots, not arrival order, identify messages
        got = [(what, s, mb, t.recv(what, s, mb)) for what, s, mb in reversed(wanted)]
        bad += sum(int(not torch.equal(x, _payload(step, what, s, mb))) for what, s, mb, x in got)
        dist.barrier()  # everyone has taken this step's messages
        if step + 1 < STEPS:
            send_step(step + 1)  # the senders run ahead into the next step ...
        dist.barrier()
        # ... and what this rank received in this step is still intact (two slots per message)
        stale += sum(int(not torch.equal(x, _payload(step, what, s, mb))) for what, s, mb, x in got)
    out["stale"] = stale
    out["mismatches"] = bad
    out["received"] = sum(1 for s in mine for _ in range(M) for c in (s > 0, s < last) if c) * STEPS
    out["counted_before_flush"] = comm.COUNTER.snapshot().get("pp", {})
    t.flush_counts()
    out["counted"] = comm.COUNTER.snapshot().get("pp", {})
    # the same tensor object sent twice (remembered, no checks the second time), its values changed
    # in place in between: each message carries the values of its moment
    x = torch.zeros(SHAPE)
    seen = []
    for value in (1.0, 2.0):
        if r == 0:
            x.fill_(value)
            t.send(x, "act", 1, 0)
        dist.barrier()
        if r == 1:
            seen.append(t.recv("act", 1, 0).clone())
        dist.barrier()
    out["resent"] = [float(y.min()) == float(y.max()) == v for y, v in zip(seen, (1.0, 2.0))] if r == 1 else None
    # a message nobody sends: rank 0 waits for an activation of a stage it does not receive
    if r == 1:
        try:
            t.recv("act", 1, 0)
            out["timeout"] = None
        except TimeoutError as e:
            out["timeout"] = str(e)
    dist.barrier()
    # "shm" insisted upon where one rank cannot use it
    shm_eligible = shm.eligible_here
    if r == 2:
        shm.eligible_here = lambda device: False  # type: ignore[assignment]
    try:
        shm.agree(group, torch.device("cpu"), "shm")
        out["insist_error"] = None
    except RuntimeError as e:
        out["insist_error"] = str(e)
    out["auto_falls_back"] = shm.agree(group, torch.device("cpu"), "auto") is None
    shm.eligible_here = shm_eligible
    return out


@pytest.fixture(scope="module")
def world() -> list[dict]:
    return run_world(_worker, P, timeout_s=60)


def test_every_message_arrives_intact_in_its_slot(world):
    for r in world:
        assert r["ok"]
        assert r["mismatches"] == 0, r
        assert r["stale"] == 0, r
        assert r["received"] > 0


def test_a_tensor_sent_again_carries_its_new_values(world):
    assert world[1]["resent"] == [True, True]


def test_every_transfer_is_counted(world):
    for r in world:
        assert r["counted"]["recv"]["calls"] == r["received"]
        assert r["counted"]["recv"]["bytes"] == r["received"] * 2 * 3 * 5 * 4
        assert r["counted"]["send"]["calls"] == r["received"]  # a ring: as many out as in
        assert r["counted_before_flush"] == {}  # counted once a step, off the critical path


def test_a_missing_message_times_out_naming_the_peer(world):
    msg = world[1]["timeout"]
    assert msg is not None and "from rank 0" in msg and "waited" in msg


def test_insisting_on_shm_where_it_cannot_work_is_an_error(world):
    for r in world:
        assert r["insist_error"] is not None and "p2p='shm'" in r["insist_error"]
        assert "--p2p backend" in r["insist_error"]
        assert r["auto_falls_back"]


def test_no_file_is_left_in_dev_shm(world):
    for r in world:
        assert r["files_after_setup"] == []


def test_waiting_policy():
    import math

    from par3d.pipeline.shm import waiting_policy

    # computing ranks with a core each: poll 2 ms, nobody to hand over to
    assert waiting_policy(True, local_ranks=4, cores=4) == (2e-3, False)
    # oversubscribed and computing: poll briefly, never give the core away
    assert waiting_policy(True, local_ranks=4, cores=2) == (5e-5, False)
    # ranks that only wait (synthetic stages): poll until the message comes; hand the core to the
    # receiver only where cores are shared
    assert waiting_policy(False, local_ranks=2, cores=8) == (math.inf, False)
    assert waiting_policy(False, local_ranks=4, cores=2) == (math.inf, True)


def test_a_step_pauses_garbage_collection_and_restores_it():
    import gc

    from par3d.pipeline.runtime import PipelineRuntime

    rt = PipelineRuntime.__new__(PipelineRuntime)  # only run_step's wrapper is under test
    rt._walk = lambda *args: gc.isenabled()  # type: ignore[method-assign]
    assert gc.isenabled()
    assert rt.run_step([], 1.0) is False  # paused during the walk
    assert gc.isenabled()  # and back after it

    def boom(*args):
        raise RuntimeError("a stage failed")

    rt._walk = boom  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        rt.run_step([], 1.0)
    assert gc.isenabled()  # restored when the step fails too
    gc.disable()
    try:
        rt._walk = lambda *args: gc.isenabled()  # type: ignore[method-assign]
        rt.run_step([], 1.0)
        assert not gc.isenabled()  # a caller that had paused it keeps it paused
    finally:
        gc.enable()
