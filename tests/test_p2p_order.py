"""Every schedule is safe on transports that match messages by order (NCCL), given the
runtime's two channels (activations, gradients): the receiver needs each pair's messages in the
order the sender issues them."""

from __future__ import annotations

import pytest

from par3d.pipeline.schedules import Action, build, p2p_order_problems


@pytest.mark.parametrize("name,v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3),
                                    ("zb-h1", 1)])
@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_schedules_are_fifo_consistent_per_channel(name, v, p):
    for m in (p, 2 * p, 3 * p):
        assert p2p_order_problems(build(name, p, m, v), p, v) == []


def test_a_reordered_receiver_is_caught():
    sched = build("gpipe", 2, 2)
    r1 = sched[1]
    # rank 1 consumes micro-batch 1's activation before micro-batch 0's
    r1[0], r1[1] = Action("F", 1, 1), Action("F", 1, 0)
    problems = p2p_order_problems(sched, 2)
    assert problems and problems[0].startswith("act channel 0->1")
