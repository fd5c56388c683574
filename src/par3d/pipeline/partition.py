"""Split a model's units into pipeline chunks so the slowest chunk is as fast as possible.

The pipeline runs at the pace of its slowest stage, so the objective is the maximum chunk cost,
not the variance.  Units stay contiguous (a chunk is a slice of the model) and every chunk gets at
least one unit.  Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


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


def _prefix(costs: list[float]) -> list[float]:
    """Running sums of `costs` from 0: a chunk [a, b) costs prefix[b] - prefix[a] (one expression for every cut)."""
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    return prefix


def partition(costs: list[float], n_chunks: int) -> Partition:
    """Contiguous split of ``costs`` into ``n_chunks`` chunks minimising the largest chunk cost.

    Exact dynamic programme, O(n_chunks · n) (one forward pointer a row) — n is a few hundred layers at most.  Among optimal
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
    return _make(list(_optimal_bounds(tuple(map(float, costs)), n_chunks)), list(map(float, costs)))


@lru_cache(maxsize=4096)
def _optimal_bounds(costs: tuple[float, ...], n_chunks: int) -> tuple[tuple[int, int], ...]:
    """`partition`'s bounds, once per (costs, chunks): the planner's interleaved cut (`round_partition`) asks again
    for the same slices while it moves round boundaries."""
    n = len(costs)
    prefix = _prefix(costs)

    def seg(a: int, b: int) -> float:
        # The one expression for a chunk's cost, so comparisons against the optimum are exact.
        return prefix[b] - prefix[a]

    inf = float("inf")
    # best[k][j]: smallest possible max cost splitting units [0, j) into k chunks, i.e.
    # min over i of max(best[k-1][i], seg(i, j)).  best[k-1][i] never falls as i grows and seg(i, j)
    # never rises (costs are >= 0 and rounding is monotone), so the minimum sits where they cross:
    # the first i with best[k-1][i] >= seg(i, j), and the minimum is one of the two terms beside it —
    # the same float the full scan would return.  seg(i, j) never falls as j grows either, so that first
    # i never moves back: one pointer walks it forward over the row, O(n) a row instead of a bisection a cell.
    # (seg(i, j) is written out as prefix[j] - prefix[i], the same expression: this loop runs ~10⁴-10⁵
    # times for a deep pipeline.)
    best = [[inf] * (n + 1) for _ in range(n_chunks + 1)]
    best[0][0] = 0.0
    for k in range(1, n_chunks + 1):
        prev, row = best[k - 1], best[k]
        lo = k - 1  # first i in [k-1, j) with prev[i] >= seg(i, j); j if none
        for j in range(k, n - (n_chunks - k) + 1):
            pj = prefix[j]
            while lo < j and prev[lo] < pj - prefix[lo]:
                lo += 1
            cands = []
            if lo < j:
                cands.append(max(prev[lo], pj - prefix[lo]))
            if lo > k - 1:
                cands.append(max(prev[lo - 1], pj - prefix[lo - 1]))
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
    return tuple(bounds)


def _round_key(bounds: list[tuple[int, int]], prefix: list[float], p: int) -> tuple[float, float]:
    """(the sum over the rounds of each round's heaviest chunk, the sum of squared chunks) of a cut into rounds of
    p chunks (round k: chunks k·p .. k·p + p - 1, one on each rank, round-robin or V alike).  In an interleaved
    pipeline's steady state the p ranks run round k's chunks of a micro-batch one after another, each waiting for the
    slowest, so a micro-batch costs a rank about the sum of the rounds' slowest chunks; then the more even chunks.
    The first term is rounded to 1e-4 of the whole: below that is the embedding's gather, which decides nothing."""
    costs = [prefix[b] - prefix[a] for a, b in bounds]
    rounds = sum(max(costs[k:k + p]) for k in range(0, len(costs), p))
    return round(rounds / prefix[-1], 4) if prefix[-1] > 0 else 0.0, sum(c * c for c in costs)


def _even_optimal(costs: list[float], k: int) -> list[tuple[int, int]]:
    """A split of `costs` into k chunks with `partition`'s optimal heaviest chunk, each chunk cut, from the front,
    as near the remaining cost over the remaining chunks as the optimum allows (`partition`'s own walk-back makes the
    front chunks as light as it can instead)."""
    n = len(costs)
    target = partition(costs, k).max_cost * (1 + 1e-12)  # (its chunk costs are sums, these prefix differences)
    prefix = _prefix(costs)

    def fits(a: int, chunks: int) -> bool:  # can units [a, n) be split into `chunks` chunks, each <= target?
        if n - a < chunks:
            return False
        used, start = 0, a
        while start < n:
            end = start + 1
            while end < n and prefix[end + 1] - prefix[start] <= target:
                end += 1
            used, start = used + 1, end
        return used <= chunks

    bounds, start = [], 0
    for i in range(k - 1):
        left = k - i
        goal = (prefix[n] - prefix[start]) / left
        ends = [e for e in range(start + 1, n - left + 2)
                if prefix[e] - prefix[start] <= target and fits(e, left - 1)]
        end = min(ends, key=lambda e: (abs(prefix[e] - prefix[start] - goal), e))
        bounds.append((start, end))
        start = end
    bounds.append((start, n))
    return bounds


def round_partition(costs: list[float], n_chunks: int, p: int) -> Partition | None:
    """A contiguous split of `costs` into the `n_chunks` chunks of an interleaved or V pipeline of `p` ranks
    (v = n_chunks / p rounds of p chunks) that weighs rounds rather than single chunks (`_round_key`): v rounds of
    equal unit counts (the spare units to the middle rounds; the first and the last carry the embedding and the
    head), each cut into its p chunks at the optimal heaviest chunk, as evenly as that allows (`_even_optimal`), then
    a round's boundary moved by one unit while `_round_key` falls.  `partition`'s own cut minimises the heaviest
    chunk, and its walk-back can leave the
    first chunks one unit each -- (1, 1, 1, 1, 3, 5, ...) -- which under interleaving costs every round.  None where
    a round cannot hold p units.  Neither cut is always faster (a light first chunk shortens the fill and the
    first rank's gradient tail when micro-batches are few); the planner prices both (cost.evaluate)."""
    v, n = n_chunks // p, len(costs)
    if p < 1 or n_chunks % p or v < 2 or n < v * p:
        return None
    prefix = _prefix(costs)

    def cut(edges: list[int]) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for a, b in zip(edges, edges[1:]):
            out += [(a + x, a + y) for x, y in _even_optimal(costs[a:b], p)]
        return out

    q, r = divmod(n, v)
    extra = set(range(1, r + 1)) if r <= v - 2 else set(range(r))
    edges = [0]
    for k in range(v):
        edges.append(edges[-1] + q + (k in extra))
    bounds = cut(edges)
    key = _round_key(bounds, prefix, p)
    improved = True
    while improved:
        improved = False
        for k in range(1, v):
            for step in (-1, 1):
                trial = edges[:k] + [edges[k] + step] + edges[k + 1:]
                if min(trial[k] - trial[k - 1], trial[k + 1] - trial[k]) < p:
                    continue
                t = cut(trial)
                if (tk := _round_key(t, prefix, p)) < key:
                    edges, bounds, key, improved = trial, t, tk, True
                    break
    return _make(bounds, list(map(float, costs)))


@lru_cache(maxsize=256)
def gpt_round_split(layers: int, n_chunks: int, p: int, hidden: int, seq_len: int, vocab: int,
                    ffn_hidden: int | None = None, mtp_layers: int = 0) -> tuple[int, ...] | None:
    """The blocks of each chunk of `round_partition` over the GPT unit list (the embedding folded into the first
    block, the head into the last, as `gpt_partition` folds them), in the form `gpt_partition`'s `split` and
    --pipeline-layout take; None where it does not apply (v = 1, more chunks than blocks, or a round of fewer
    than p blocks)."""
    if n_chunks > layers:
        return None
    units = gpt_unit_costs(layers, hidden, seq_len, vocab, ffn_hidden, mtp_layers)
    blocks = units[1:-1]
    blocks[0] += units[0]
    blocks[-1] += units[-1]
    part = round_partition(blocks, n_chunks, p)
    return None if part is None else tuple(b - a for a, b in part.bounds)


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
