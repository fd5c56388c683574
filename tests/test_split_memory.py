"""ZB-H1's memory (issue 12's sixty-sixth round): a chunk past its BI holds what its weight GEMMs need -- each linear
layer's input and output gradient, and on the head the output layer's, the logits' gradient -- not its forward's
saved bytes, so a rank's peak is the largest of its (before BI, past BI) states' sums (stage_layout.split_states),
not its peak count of whole chunks.  The runtime's meter measures the same (tests/test_runtime_memory.py)."""

from __future__ import annotations

import pytest

from par3d.plan.choice import Choice
from par3d.plan.hardware import make_cluster
from par3d.plan.memory import head_grad_bytes, layer_activation_bytes, rank_memory, weight_grad_bytes
from par3d.plan.models import CATALOGUE
from par3d.plan.plan_memory import memory
from par3d.plan.stage_layout import counted_peaks, rank_shapes, split_states, walked_states

LLAMA = CATALOGUE["llama3-8b"]  # vocab 128,256: the head's kept gradient outweighs a few layers


def test_split_states_are_the_walk_at_full_m_and_sum_to_the_checkers_peak():
    for p in range(1, 9):
        for m in range(1, 4 * p + 3):
            states = split_states("zb-h1", p, m, 1)
            assert states == walked_states("zb-h1", p, m, 1), (p, m)  # the walk at min(m, 2p) is the full one's
            peaks = counted_peaks("zb-h1", p, m, 1)
            for r in range(p):  # the state of most chunks alive is the checker's count; none exceeds it
                assert max(a + b for a, b in states[r]) == peaks[r], (p, m, r)
    for sched in ("1f1b", "gpipe", "interleaved", "zb-v", "dualpipe-v"):  # counted whole until the backward
        assert split_states(sched, 4, 8, 2 if sched != "1f1b" and sched != "gpipe" else 1) is None


@pytest.mark.parametrize("model", [LLAMA, CATALOGUE["gpt3-1.3b"]], ids=["llama3-8b", "gpt3-1.3b"])
def test_memory_is_the_heaviest_rank_of_the_split_count(model):
    """`memory` prices only the ranks that can be the heaviest (`_heavy_ranks`, which drops ZB-H1's middle ranks
    as averages of their neighbours): the same total as pricing every rank."""
    cluster = make_cluster("h100-sxm", 64)
    checked = 0
    for tp, sp in ((1, False), (2, True)):
        for p in (2, 4, 8):
            if model.layers % p:
                continue
            for m in (2, p, 4 * p):
                for recompute in ("none", "selective", "full"):
                    c = Choice(tp, p, 1, 1, m, "zb-h1", 1, recompute, 0, sp)
                    split = split_states("zb-h1", p, m, 1)
                    shapes = rank_shapes(model, tp, p, 1, "zb-h1")
                    totals = [rank_memory(model, shape, counted_peaks("zb-h1", p, m, 1)[r], tp=tp, dp=1, b=1, sp=sp,
                                          recompute=recompute, zero=0, dtype=cluster.precision, flash=cluster.flash,
                                          cross_entropy=cluster.cross_entropy, split=split[r]).total
                              for r, shape in enumerate(shapes)]
                    mem, rank = memory(model, cluster, c)
                    assert mem.total == pytest.approx(max(totals), rel=1e-12), (tp, p, m, recompute)
                    assert totals[rank] == pytest.approx(max(totals), rel=1e-12)
                    checked += 1
    assert checked >= 30


def test_the_head_rank_keeps_its_pending_output_gradients():
    """ZB-H1's last rank defers up to p - 1 BWs, each keeping the logits' gradient (b·s·V/t): with Llama 3's 128K
    vocabulary on 8 stages that is more than the whole-chunk count gave, by at least six such gradients; and under
    full recomputation a chunk past BI holds many times what its forward saved (the recomputed GEMMs' inputs)."""
    cluster = make_cluster("h100-sxm", 8)
    p, m, dtype = 8, 16, cluster.precision
    shapes = rank_shapes(LLAMA, 1, p, 1, "zb-h1")
    assert shapes[-1].head
    peaks = counted_peaks("zb-h1", p, m, 1)
    kw = dict(tp=1, dp=1, b=1, sp=False, recompute="none", zero=0, dtype=dtype, flash=cluster.flash,
              cross_entropy=cluster.cross_entropy)
    split = split_states("zb-h1", p, m, 1)
    whole = rank_memory(LLAMA, shapes[-1], peaks[-1], **kw).activations
    now = rank_memory(LLAMA, shapes[-1], peaks[-1], split=split[-1], **kw).activations
    dlogits = 2.0 * LLAMA.seq_len * LLAMA.vocab
    assert head_grad_bytes(LLAMA, 1, 1, dtype) > dlogits
    assert now - whole > 6 * dlogits
    # full recomputation: the forward keeps a layer's input, BI's recomputed forward leaves its GEMMs' (x, dy)
    rec = layer_activation_bytes(LLAMA, 1, 1, False, "full", dtype, 1, cluster.flash)
    assert weight_grad_bytes(LLAMA, 1, 1, False, dtype) > 5 * rec
    full = dict(kw, recompute="full")
    r = p // 2  # a middle rank: r BWs deferred
    assert (rank_memory(LLAMA, shapes[r], peaks[r], split=split[r], **full).activations
            > 2 * rank_memory(LLAMA, shapes[r], peaks[r], **full).activations)
