"""Split a model's units into pipeline chunks so the slowest chunk is as fast as possible.

The pipeline runs at the pace of its slowest stage, so the objective is the maximum chunk cost,
not the variance.  Units stay contiguous (a chunk is a slice of the model) and every chunk gets at
least one unit.  Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Partition:
    bounds: list[tuple[int, int]]  # per chunk, [start, end) into the list of units
    costs: list[float]  # per chunk
    max_cost: float
    imbalance: float  # max_cost / mean_cost - 1 (0 = perfectly even)


def _make(bounds: list[tuple[int, int]], costs: list[float]) -> Partition:
    chunk_costs = [float(sum(costs[a:b])) for a, b in bounds]
    top = max(chunk_costs)
    mean = sum(chunk_costs) / len(chunk_costs)
    return Partition(bounds=bounds, costs=chunk_costs, max_cost=top,
                     imbalance=top / mean - 1.0 if mean > 0 else 0.0)


def partition(costs: list[float], n_chunks: int) -> Partition:
    """Contiguous split of ``costs`` into ``n_chunks`` chunks minimising the largest chunk cost.

    Exact dynamic programme, O(n_chunks · n · log n) — n is a few hundred layers at most.  Among optimal
    splits the one with the *later* chunks as large as allowed is returned, so earlier chunks are
    never heavier than needed: under 1F1B the early ranks hold the most in-flight activations.
    """
    n = len(costs)
    if n_chunks < 1:
        raise ValueError(f"need at least one chunk, got n_chunks={n_chunks}")
    if n_chunks > n:
        raise ValueError(f"cannot split {n} units into {n_chunks} chunks: every chunk needs at least one "
                         f"unit; use at most {n} chunks")
    if any(c < 0 for c in costs):
        raise ValueError("unit costs must be >= 0")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))

    def seg(a: int, b: int) -> float:
        # The one expression for a chunk's cost, so comparisons against the optimum are exact.
        return prefix[b] - prefix[a]

    inf = float("inf")
    # best[k][j]: smallest possible max cost splitting units [0, j) into k chunks, i.e.
    # min over i of max(best[k-1][i], seg(i, j)).  best[k-1][i] never falls as i grows and seg(i, j)
    # never rises (costs are >= 0 and rounding is monotone), so the minimum sits where they cross:
    # a bisection finds the first i with best[k-1][i] >= seg(i, j), and the minimum is one of the two
    # terms beside it — the same float the full scan would return, in O(log n) instead of O(n).
    best = [[inf] * (n + 1) for _ in range(n_chunks + 1)]
    best[0][0] = 0.0
    for k in range(1, n_chunks + 1):
        prev, row = best[k - 1], best[k]
        for j in range(k, n - (n_chunks - k) + 1):
            lo, hi = k - 1, j  # first i in [k-1, j) with prev[i] >= seg(i, j); j if none
            while lo < hi:
                mid = (lo + hi) // 2
                if prev[mid] >= seg(mid, j):
                    hi = mid
                else:
                    lo = mid + 1
            cands = []
            if lo < j:
                cands.append(max(prev[lo], seg(lo, j)))
            if lo > k - 1:
                cands.append(max(prev[lo - 1], seg(lo - 1, j)))
            row[j] = min(cands)
    target = best[n_chunks][n]

    # Walk back from the last chunk, giving each chunk the most units it can take while the prefix
    # can still be split into the remaining chunks within the optimum.
    bounds: list[tuple[int, int]] = []
    end = n
    for k in range(n_chunks, 0, -1):
        start = next(i for i in range(k - 1, end) if seg(i, end) <= target and best[k - 1][i] <= target)
        bounds.append((start, end))
        end = start
    bounds.reverse()
    return _make(bounds, list(map(float, costs)))


def gpt_unit_costs(layers: int, hidden: int, seq_len: int, vocab: int,
                   ffn_hidden: int | None = None, mtp_layers: int = 0) -> list[float]:
    """Forward FLOPs of one sequence through each unit of the runtime's GPT unit list.

    Unit 0 is the embedding, units 1..layers the transformer blocks, unit layers+1 the head (final
    LayerNorm, LM head, loss).  Only ratios matter for partitioning, and backward is ~2x forward for
    every unit alike, so forward FLOPs stand for the whole step.  `mtp_layers` multi-token-prediction
    modules (the planner's DeepSeek-V3; each a block, a 2h -> h projection and the head again) ride with the
    head, as Megatron-Core places them with the loss.
    """
    if min(layers, hidden, seq_len, vocab) < 1:
        raise ValueError("layers, hidden, seq_len and vocab must all be >= 1")
    h, s = hidden, seq_len
    f = 4 * h if ffn_hidden is None else ffn_hidden
    # Per token: Q, K, V and output projections 4 * 2h^2; MLP up and down 2 * 2hf (16h^2 at f = 4h);
    # attention scores QK^T and the weighted sum of V, 2sh each.
    block = 8 * h * h + 4 * h * f + 4 * s * h
    head = 2 * h * vocab
    embedding = h  # a gather plus the position add: small, but not free
    head += mtp_layers * (block + head + 4 * h * h)
    return [float(embedding * s)] + [float(block * s)] * layers + [float(head * s)]


def gpt_partition(layers: int, n_chunks: int, hidden: int, seq_len: int, vocab: int,
                  ffn_hidden: int | None = None, mtp_layers: int = 0,
                  split: list[int] | tuple[int, ...] | None = None) -> Partition:
    """Partition the GPT unit list so every chunk holds at least one transformer block.

    The embedding always travels with the first block and the head with the last block: the blocks
    are partitioned with those costs folded in, and the bounds mapped back to unit indices (chunk 0
    starts at unit 0, the last chunk ends at unit layers+2).

    With more chunks than blocks (at most layers + 2) the embedding and the head count as units of
    their own: the first chunk may hold only the embedding and the last only the head (output
    projection and loss), as Llama 3 balances its pipeline (Grattafiori et al. 2024, §3.3.2: one
    block fewer on the first and the last stage; 126 blocks + 2 = 16 stages × 8 chunks).

    `split` gives each chunk's blocks instead (the first chunk also takes the embedding, the last the head;
    either may hold no block), as Megatron-Core's `pipeline_model_parallel_layout` cuts a model: the bounds
    are those, the costs and the imbalance still the units'.
    """
    if n_chunks > layers + 2:
        raise ValueError(f"cannot split {layers} transformer blocks into {n_chunks} pipeline chunks: "
                         f"every chunk needs at least one block (or the embedding or the head alone); "
                         f"use at most {layers + 2} chunks")
    units = gpt_unit_costs(layers, hidden, seq_len, vocab, ffn_hidden, mtp_layers)
    if split:  # the layers of each chunk given (Megatron-Core's pipeline_model_parallel_layout): no search
        if len(split) != n_chunks or sum(split) != layers or min(split) < 0:
            raise ValueError(f"pipeline layout {','.join(map(str, split))}: {n_chunks} chunks of layers >= 0 summing "
                             f"to {layers} expected")
        starts = [1 + sum(split[:i]) for i in range(n_chunks)]
        given = [(a, a + n) for a, n in zip(starts, split)]
        given[0] = (0, given[0][1])
        given[-1] = (given[-1][0], layers + 2)
        return _make(given, units)
    if n_chunks > layers:
        return partition(units, n_chunks)
    blocks = units[1:-1]
    blocks[0] += units[0]
    blocks[-1] += units[-1]
    part = partition(blocks, n_chunks)
    # Block j is unit j+1; the first chunk also takes unit 0, the last also unit layers+1.
    bounds = [(a + 1, b + 1) for a, b in part.bounds]
    bounds[0] = (0, bounds[0][1])
    bounds[-1] = (bounds[-1][0], layers + 2)
    return _make(bounds, units)
