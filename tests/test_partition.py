"""Partitioning layers into pipeline chunks: optimal, complete, contiguous."""

import itertools
import random

import pytest

from par3d.pipeline.partition import _even_optimal, _make, gpt_partition, gpt_unit_costs, partition


def _brute_force_best(costs, k):
    n = len(costs)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), k - 1):
        edges = (0, *cuts, n)
        best = min(best, max(sum(costs[a:b]) for a, b in zip(edges, edges[1:])))
    return best


def _assert_valid(part, n, k):
    assert len(part.bounds) == len(part.costs) == k
    assert part.bounds[0][0] == 0 and part.bounds[-1][1] == n
    for (_, b), (c, _) in zip(part.bounds, part.bounds[1:]):
        assert b == c  # contiguous: no unit dropped or repeated
    assert all(b > a for a, b in part.bounds)


def test_partition_is_optimal_against_brute_force():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 9)
        k = rng.randint(1, n)
        costs = [rng.choice([0.0, 1.0, 2.0, rng.uniform(0, 10)]) for _ in range(n)]
        part = partition(costs, k)
        _assert_valid(part, n, k)
        assert part.max_cost == pytest.approx(_brute_force_best(costs, k), rel=1e-9, abs=1e-12)
        # the even cut of round_partition's rounds keeps the optimum (its chunks cut from the front, as even as it allows)
        even = _make(_even_optimal(costs, k), costs)
        _assert_valid(even, n, k)
        assert even.max_cost <= part.max_cost * (1 + 1e-12) + 1e-12
        assert sum(part.costs) == pytest.approx(sum(costs))
        assert max(part.costs) == pytest.approx(part.max_cost)


def test_ties_leave_earlier_chunks_lighter():
    part = partition([1.0] * 5, 2)
    assert part.bounds == [(0, 2), (2, 5)]
    assert part.costs == [2.0, 3.0]
    assert part.imbalance == pytest.approx(3.0 / 2.5 - 1)
    even = partition([1.0] * 8, 4)
    assert even.bounds == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert even.imbalance == 0.0


def test_partition_errors():
    with pytest.raises(ValueError, match="at most 3 chunks"):
        partition([1.0, 2.0, 3.0], 4)
    with pytest.raises(ValueError, match="at least one chunk"):
        partition([1.0], 0)


def test_gpt_unit_costs():
    layers, h, s, vocab = 4, 64, 32, 1000
    costs = gpt_unit_costs(layers, h, s, vocab)
    assert len(costs) == layers + 2
    assert costs[1:-1] == [float(s * (24 * h * h + 4 * s * h))] * layers
    assert costs[-1] == float(s * 2 * h * vocab)
    assert 0 < costs[0] < costs[1]
    # A narrower MLP is cheaper.
    assert gpt_unit_costs(layers, h, s, vocab, ffn_hidden=2 * h)[1] < costs[1]


@pytest.mark.parametrize("layers,n_chunks", [(1, 1), (4, 4), (12, 4), (24, 8), (7, 3)])
def test_gpt_partition_keeps_a_block_in_every_chunk(layers, n_chunks):
    part = gpt_partition(layers, n_chunks, hidden=256, seq_len=128, vocab=50000)
    _assert_valid(part, layers + 2, n_chunks)
    for a, b in part.bounds:
        assert any(1 <= u <= layers for u in range(a, b))
    total = sum(gpt_unit_costs(layers, 256, 128, 50000))
    assert sum(part.costs) == pytest.approx(total)


def test_gpt_partition_gives_the_heavy_head_fewer_blocks():
    # Here the head costs about three blocks, so the last chunk gets fewer blocks than the others.
    part = gpt_partition(16, 4, hidden=128, seq_len=64, vocab=5_000)
    blocks = [b - a for a, b in part.bounds]
    blocks[0] -= 1  # embedding
    blocks[-1] -= 1  # head
    assert blocks[-1] < blocks[0]
    assert sum(blocks) == 16
    with pytest.raises(ValueError, match="at least one block"):
        gpt_partition(3, 6, hidden=64, seq_len=16, vocab=100)


def test_gpt_partition_embedding_and_head_alone():
    # layers + 2 chunks: one unit each, the embedding alone first and the head alone last (Llama 3)
    part = gpt_partition(6, 8, hidden=128, seq_len=64, vocab=5_000)
    assert part.bounds == [(u, u + 1) for u in range(8)]
    # layers + 1: every chunk still holds at least one unit, all units covered in order
    part = gpt_partition(6, 7, hidden=128, seq_len=64, vocab=5_000)
    _assert_valid(part, 8, 7)


def test_bisected_programme_matches_the_full_scan():
    # partition() bisects for the crossing of best[k-1][i] (rising) and seg(i, j) (falling); the full
    # O(k·n²) scan it replaced must give the same split on any costs, ties and zeros included
    def full_scan(costs, k):
        n, prefix = len(costs), [0.0]
        for c in costs:
            prefix.append(prefix[-1] + c)
        best = [[float("inf")] * (n + 1) for _ in range(k + 1)]
        best[0][0] = 0.0
        for kk in range(1, k + 1):
            for j in range(kk, n - (k - kk) + 1):
                best[kk][j] = min(max(best[kk - 1][i], prefix[j] - prefix[i]) for i in range(kk - 1, j))
        target, bounds, end = best[k][n], [], n
        for kk in range(k, 0, -1):
            start = next(i for i in range(kk - 1, end)
                         if prefix[end] - prefix[i] <= target and best[kk - 1][i] <= target)
            bounds.append((start, end))
            end = start
        return bounds[::-1]

    rng = random.Random(7)
    for _ in range(500):
        n = rng.randint(1, 30)
        k = rng.randint(1, n)
        costs = [float(rng.choice([0, 1, 2, 5])) if rng.random() < 0.4 else rng.uniform(0, 10) for _ in range(n)]
        assert partition(costs, k).bounds == full_scan(costs, k), (costs, k)


def test_even_optimal_evens_the_front():
    # uniform units: partition's walk-back leaves the front chunks light, the even one does not
    assert [b - a for a, b in partition([1.0] * 10, 4).bounds] == [1, 3, 3, 3]
    assert [b - a for a, b in _even_optimal([1.0] * 10, 4)] == [2, 3, 2, 3]


def test_round_partition_weighs_rounds_of_chunks():
    from par3d.pipeline.partition import _round_key, gpt_round_split, round_partition

    # 24 uniform units, 2 ranks x 4 rounds: 3 a chunk, every round's heaviest 3
    part = round_partition([1.0] * 24, 8, 2)
    assert part is not None and [b - a for a, b in part.bounds] == [3] * 8
    # a heavy last unit (the head): the chunk-optimal cut leaves the first chunks one unit each; the round-wise
    # cut spreads the units over the rounds (only the head's chunk is short)
    costs = [1.0] * 47 + [6.0]
    base, rounds = partition(costs, 24), round_partition(costs, 24, 2)
    assert rounds is not None and len(rounds.bounds) == 24
    assert [b - a for a, b in base.bounds][:4] == [1, 1, 1, 1]
    assert min(b - a for a, b in rounds.bounds[:-1]) >= 2
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    assert _round_key(rounds.bounds, prefix, 2)[0] > 0
    assert rounds.max_cost >= base.max_cost
    # not applicable: one chunk a rank, chunks not a multiple of the ranks, fewer units than chunks
    assert round_partition([1.0] * 8, 4, 4) is None and round_partition([1.0] * 8, 6, 4) is None
    assert round_partition([1.0] * 7, 8, 2) is None
    split = gpt_round_split(48, 24, 2, hidden=2048, seq_len=4096, vocab=151936)
    assert split is not None and len(split) == 24 and sum(split) == 48 and min(split) >= 1
    assert gpt_round_split(126, 128, 16, hidden=16384, seq_len=8192, vocab=128256) is None  # more chunks than blocks
