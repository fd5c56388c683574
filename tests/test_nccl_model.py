"""The runtime's backend transfers under NCCL's rules (issue 14, item 12): replayed by
`schedules.nccl_problems` for every schedule they neither hang nor hand a message to the wrong
receive; the replay is not vacuous — it finds the hangs of one communicator for everything and of
two (activations | gradients, the runtime before issue 14) for the interleaved schedule at p = 2."""

from __future__ import annotations

import pytest

from par3d.pipeline import schedules
from par3d.pipeline.schedules import build, nccl_problems, p2p_channel

CASES = [(name, p, m, v) for name in ("gpipe", "1f1b", "zb-h1") for p in (2, 3, 4) for m in (1, 2, 4, 8)
         for v in (1,)] + [("interleaved", p, m, v) for p in (2, 3, 4) for v in (2, 3) for m in (p, 2 * p, 4 * p)] \
    + [(name, p, m, 2) for name in ("zb-v", "dualpipe-v") for p in (2, 3, 4) for m in (2 * p, 4 * p)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_every_schedule_is_safe_on_nccl(case):
    name, p, m, v = case
    assert nccl_problems(build(name, p, m, v), p, v) == []


def test_one_direction_per_communicator_between_two_ranks():
    # p = 2 interleaved: activations go 0->1 and (wrapping) 1->0; gradients 1->0 and 0->1
    chans = {(w, s, d): p2p_channel(w, s, d) for w in ("act", "grad") for s, d in ((0, 1), (1, 0))}
    assert len(set(chans.values())) == 4


@pytest.mark.parametrize("channels, hangs", [
    (lambda w, s, d: "one", {"gpipe", "1f1b", "zb-h1", "interleaved", "zb-v", "dualpipe-v"}),
    (lambda w, s, d: w, {"interleaved", "zb-v", "dualpipe-v"}),  # the runtime's two groups today
])
def test_fewer_communicators_hang_and_the_replay_says_so(monkeypatch, channels, hangs):
    monkeypatch.setattr(schedules, "p2p_channel", channels)
    found = {name for name, p, m, v in CASES if nccl_problems(build(name, p, m, v), p, v)}
    assert found == hangs
    problems = nccl_problems(build("interleaved", 2, 4, 2), 2, 2)
    assert problems and "would hang on NCCL" in problems[0], problems


def test_one_communicator_per_rank_and_channel_hangs_beyond_two_ranks():
    # a pp group of > 2 ranks initialised eagerly: one communicator per channel for all peers;
    # why the runtime gets a two-rank group per (channel, pair) instead (mesh.build_groups)
    found = {(name, p) for name, p, m, v in CASES if nccl_problems(build(name, p, m, v), p, v, per_pair=False)}
    assert ("1f1b", 4) in found and all(p > 2 for _name, p in found), found


def test_the_pairs_that_exchange_messages():
    from par3d.pipeline.schedules import p2p_pairs

    assert p2p_pairs(build("1f1b", 4, 8, 1)) == [(0, 1), (1, 2), (2, 3)]
    assert p2p_pairs(build("interleaved", 4, 8, 2)) == [(0, 1), (0, 3), (1, 2), (2, 3)]  # the wrap 3 -> 0
    assert p2p_pairs(build("zb-v", 4, 8, 2)) == [(0, 1), (1, 2), (2, 3)]  # the V turns on rank 3
    assert p2p_pairs(build("gpipe", 1, 4, 1)) == []
