"""Pipeline schedules as data, and a checker for them.

A schedule is, for every pipeline rank, the ordered list of `Action`s that rank executes.  The same
lists are checked here, timed by `simulate.py` and executed by `runtime.py`, so the bubble the
planner predicts is the bubble of the order the runtime really follows.

Stages are *global* (virtual) stage indices ``0 .. p*v-1``.  Which rank holds a stage is read off
the schedule itself (`placement`): the builders deal stages round-robin ("loop": stage ``s`` on
rank ``s % p``, as model chunk ``s // p``; with ``v == 1`` the stage index is simply the rank), except
the V schedules (ZB-V, DualPipe-V), which hold stages ``r`` and ``2p-1-r`` on rank ``r``.  A rank's
chunks are its stages in increasing order, so chunk ``k`` is stage ``k*p + r`` (loop) or ``r`` /
``2p-1-r`` (V).  Schedules also travel as CSV in torch.distributed.pipelining's compute-only
notation (`to_csv`, `from_csv`).

This module is pure Python: it must never import torch (the planner and the CLI import it).
"""

from __future__ import annotations

import csv
import heapq
import io
import math
import re
from collections import deque
from collections.abc import Callable, Container
from dataclasses import dataclass

KINDS = ("F", "B", "BI", "BW")
"""F: forward.  B: full backward.  BI / BW: the input-gradient and weight-gradient halves of B,
used by zero-bubble schedules; a (stage, micro-batch) uses either B or the pair BI + BW."""

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe-v")
V_SCHEDULES = ("zb-v", "dualpipe-v")
"""Schedules on the V placement: two chunks per rank, rank r holding stages r and 2p-1-r."""


class ScheduleError(ValueError):
    """A schedule that cannot be built or that is wrong.

    ``param`` names the offending request parameter ("p", "m", "v", "name") when there is one, so a
    CLI can point at the right flag.
    """

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Action:
    kind: str  # one of KINDS
    stage: int  # global (virtual) stage, 0 .. p*v-1
    microbatch: int  # 0 .. m-1

    def __str__(self) -> str:
        return f"{self.kind}(stage={self.stage}, mb={self.microbatch})"


def stage_rank(stage: int, p: int) -> int:
    """Pipeline rank that holds global stage ``stage`` when stages are dealt round-robin (the
    "loop" placement of every schedule but the V ones; see `placement` for any schedule)."""
    return stage % p


def v_stage_rank(stage: int, p: int) -> int:
    """Pipeline rank of ``stage`` on the V placement: stages 0..p-1 go down the ranks, p..2p-1 come
    back up, so rank r holds r and 2p-1-r (the first and the last stage are both on rank 0)."""
    return stage if stage < p else 2 * p - 1 - stage


def placement(schedule: list[list[Action]], w: Where | None = None) -> dict[int, int]:
    """Stage -> rank, read off the schedule (where its actions are).  Raises ScheduleError naming
    both places when a stage's actions are on two ranks."""
    w = w or Where()
    where: dict[int, tuple[int, int, Action]] = {}
    for r, acts in enumerate(schedule):
        for j, a in enumerate(acts):
            first = where.setdefault(a.stage, (r, j, a))
            if first[0] != r:
                raise ScheduleError(
                    f"stage {a.stage} is on two ranks: {w.at(first[0], first[1])} ({w.act(first[2])}) and "
                    f"{w.at(r, j)} ({w.act(a)}); every stage lives on one rank")
    return {s: r for s, (r, _, _) in where.items()}


def schedule_placement(name: str, p: int, v: int = 1) -> list[int]:
    """The rank of every global stage in what builder ``name`` makes, without building it: the V
    for V_SCHEDULES, round-robin for the others (`placement` reads it off any built or loaded
    schedule; a test checks that the two agree for every builder, p and m)."""
    rank = v_stage_rank if name in V_SCHEDULES else stage_rank
    return [rank(s, p) for s in range(p * v)]


def rank_stages(schedule: list[list[Action]], rank: int) -> list[int]:
    """The stages rank ``rank`` holds, in increasing order: its model chunks 0, 1, ..."""
    return sorted({a.stage for a in schedule[rank]})


def stage_chunk(stage: int, p: int) -> int:
    """Index of the model chunk, on its rank, that global stage ``stage`` is."""
    return stage // p


# --------------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------------


def _require(p: int, m: int) -> None:
    if p < 1:
        raise ScheduleError(f"need at least one pipeline stage, got p={p}", param="p")
    if m < 1:
        raise ScheduleError(f"need at least one micro-batch, got m={m}", param="m")


def gpipe(p: int, m: int) -> list[list[Action]]:
    """GPipe (Huang et al. 2019): every rank runs all m forwards, then all m backwards.

    Backwards run in micro-batch order 0..m-1 (the same order 1F1B uses), so with equal stages the
    backward wave is the mirror image of the forward wave.  Peak in-flight is m on every rank.
    """
    _require(p, m)
    return [
        [Action("F", r, i) for i in range(m)] + [Action("B", r, i) for i in range(m)] for r in range(p)
    ]


def one_f_one_b(p: int, m: int) -> list[list[Action]]:
    """1F1B / PipeDream-Flush (Narayanan et al. 2021).

    Rank r runs ``w = min(p-r-1, m)`` warm-up forwards, then alternates one forward and one backward,
    then drains the remaining backwards.  At most ``min(p-r, m)`` micro-batches are in flight on rank
    r, against m for GPipe, for the same bubble.
    """
    _require(p, m)
    out = []
    for r in range(p):
        w = min(p - r - 1, m)
        acts = [Action("F", r, i) for i in range(w)]
        for i in range(m - w):
            acts += [Action("F", r, w + i), Action("B", r, i)]
        acts += [Action("B", r, i) for i in range(m - w, m)]
        out.append(acts)
    return out


def interleaved(p: int, m: int, v: int) -> list[list[Action]]:
    """Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM): v model chunks per rank.

    Each rank works through ``m*v`` (chunk, micro-batch) units.  Forwards go in groups of p
    micro-batches per chunk: chunk 0 for micro-batches 0..p-1, chunk 1 for the same p, ..., then the
    next p micro-batches.  Backwards follow the same grouping with the chunks reversed.  Rank r warms
    up with ``2*(p-r-1) + (v-1)*p`` forwards (capped at m*v), then alternates 1F/1B, then drains.
    The grouping by p is why m must be a multiple of p.
    """
    _require(p, m)
    if v < 2:
        raise ScheduleError(f"interleaved needs v >= 2 model chunks per rank, got v={v}; "
                            "use the '1f1b' schedule for v=1", param="v")
    if m % p:
        lo, hi = (m // p) * p, (m // p + 1) * p
        hint = f"{lo} or {hi}" if lo else f"{hi}"
        raise ScheduleError(
            f"interleaved needs the number of micro-batches to be a multiple of the pipeline size: "
            f"m={m} is not a multiple of p={p}; use m={hint}", param="m")
    total = m * v
    # unit k of a rank's forwards (backwards): its chunk's first stage (chunk * p; the rank adds its own r) and its
    # micro-batch -- the same for every rank, so worked out once
    pv = p * v
    f_base = [(k % pv) // p * p for k in range(total)]
    b_base = [(v - 1 - (k % pv) // p) * p for k in range(total)]
    mbs = [(k // pv) * p + k % p for k in range(total)]
    out = []
    for r in range(p):
        warm = min(2 * (p - r - 1) + (v - 1) * p, total)
        acts = [Action("F", f_base[k] + r, mbs[k]) for k in range(warm)]
        for k in range(total - warm):
            acts.append(Action("F", f_base[warm + k] + r, mbs[warm + k]))
            acts.append(Action("B", b_base[k] + r, mbs[k]))
        acts += [Action("B", b_base[k] + r, mbs[k]) for k in range(total - warm, total)]
        out.append(acts)
    return out


def zero_bubble_h1(p: int, m: int) -> list[list[Action]]:
    """ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism").

    B is split into BI (gradient w.r.t. the stage input: the previous stage waits for it) and BW
    (gradient w.r.t. the weights: nothing waits for it).  Rank r follows 1F1B with BI in place of B
    (``w = min(p-r-1, m)`` warm-up forwards, then F/BI pairs, then the remaining BIs), and runs each
    BW only once r later BIs have been done; the delayed BWs fill the tail where 1F1B idles.

    Every rank therefore holds up to ``min(p, m)`` micro-batches in flight (F done, BW not done):
    1F1B's peak on rank 0, the rank that needs most memory, so the peak over ranks equals 1F1B's, as
    in the paper (the extra ones on later ranks only keep BW inputs, less than full activations).
    With F = BI = BW times and no transfer time the makespan is ``3m + p - 1`` units, a bubble of
    (p-1)/(3m) against 1F1B's (p-1)/m (for m >= p).
    """
    _require(p, m)
    out = []
    for r in range(p):
        w = min(p - r - 1, m)
        acts = [Action("F", r, i) for i in range(w)]
        pending: list[int] = []  # micro-batches whose BI is done and BW not yet
        for i in range(m - w):
            acts += [Action("F", r, w + i), Action("BI", r, i)]
            pending.append(i)
            if len(pending) > r:  # r BWs may wait; more would exceed rank 0's 1F1B memory
                acts.append(Action("BW", r, pending.pop(0)))
        for i in range(m - w, m):
            acts.append(Action("BI", r, i))
            pending.append(i)
            acts.append(Action("BW", r, pending.pop(0)))
        acts += [Action("BW", r, i) for i in pending]
        out.append(acts)
    return out


def zero_bubble_v(p: int, m: int, times: tuple[float, ...] = (1.0, 1.0, 1.0)) -> list[list[Action]]:
    """ZB-V (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", section 6): two chunks per rank on
    the V placement (rank r holds stages r and 2p-1-r), every backward split into BI and BW.

    Built by list scheduling on a simulated clock with per-chunk times ``times`` = (F, BI, BW)
    (default equal, the paper's setting and what `par3d train` and the planner build; `par3d
    simulate` passes its own): each
    rank, as soon as it is free, starts the action that can start earliest, and among those
    that can start at the same moment prefers the oldest BI (it is on the critical path: the
    previous stage waits for it), then an F while fewer than 2p chunk activations are alive (p
    whole stages: 1F1B's peak on rank 0, the paper's memory bound; the deeper chunk first), then
    the oldest pending BW (nothing waits for it: it fills what would be bubble).  Each chunk's
    forwards and BIs go in micro-batch order, so every channel's messages arrive in the order
    they are needed, and an order read off a feasible timeline cannot deadlock.  With equal
    times the only idle time left is the V's warm-up: rank r cannot start before the first
    micro-batch has passed r chunks (docs/pipeline.md).  With uneven times the 2p cap can leave
    every rank waiting (each capped rank's BI waits on a stage that needs a forward first); then,
    and only then, one forward goes past the cap, so the schedule always exists and its peak may
    exceed 2p chunks.

    A fourth element of ``times``, ``held`` in (0, 1], is the share of a chunk's activations its BI leaves for
    its BW (default 1: a chunk counts whole until its BW).  A split backward frees the graph at BI and keeps
    only each linear layer's input and output gradient for the weight GEMMs (`par3d.weight_grad`), so the cap
    counts an F as 1, its BI as -(1 - held) and its BW as -held: the Zero Bubble authors' V scheduler counts
    memory so (its f_mem, b_mem, w_mem; issue 12's sixty-fifth round), and without FlashAttention, whose s²
    scores BI frees, ``held`` is well under 1 and the cap admits more forwards in flight.

    A fifth element, ``head`` (default ``held``), is the same for the head's chunk (the V's last stage, on rank 0),
    in units of a chunk's forward too: its BI keeps the output layer's input and the logits' gradient (b·s·V/t) as
    well, more than a forward saves where the vocabulary is large against a chunk, so a head BI can raise rank 0's
    count; the cap still holds its forwards back, and the count passes 2p by at most ``head`` - 1 (one head BI at
    a time: it runs right after its forward, the earliest BI ready).  The planner's memory count adds that
    (issue 12's sixty-sixth round).
    """
    return _as_actions(_zero_bubble_v_keys(p, m, times))


def _zero_bubble_v_keys(p: int, m: int, times: tuple[float, ...]) -> list[list[Key]]:
    """`zero_bubble_v`'s lists as (kind, stage, micro-batch) tuples (`build_keys`)."""
    _require(p, m)
    tf, tbi, tbw = (float(t) for t in times[:3])
    held = float(times[3]) if len(times) > 3 else 1.0
    if not 0.0 < held <= 1.0:
        raise ScheduleError(f"zb-v: held={held} is the share of a chunk's activations kept from BI to BW; "
                            "it must be in (0, 1]", param="times")
    head = float(times[4]) if len(times) > 4 else held
    if not 0.0 < head < math.inf:
        raise ScheduleError(f"zb-v: head={head} is what the head's chunk keeps from BI to BW, in chunks' forwards; "
                            "it must be a positive number", param="times")
    cost = {"F": tf, "BI": tbi, "BW": tbw}
    # a forward fits while the chunks alive (each F 1, less 1 - held after its BI) leave room for one more
    room = 2 * p - 1 + 1e-9
    stages = [(r, 2 * p - 1 - r) for r in range(p)]
    n_stages = 2 * p
    last = n_stages - 1
    rank_of = [v_stage_rank(st, p) for st in range(n_stages)]
    # ends of the scheduled F and BI actions per (stage, micro-batch); None: not scheduled yet
    f_end: list[list[float | None]] = [[None] * m for _ in range(n_stages)]
    bi_end: list[list[float | None]] = [[None] * m for _ in range(n_stages)]
    out: list[list[Key]] = [[] for _ in range(p)]
    nf = [[0, 0] for _ in range(p)]  # next micro-batch to forward, per chunk
    nb = [[0, 0] for _ in range(p)]  # next micro-batch for BI, per chunk
    pending: list[deque[tuple[int, int]]] = [deque() for _ in range(p)]  # (chunk, mb) with BI done, BW not
    live = [0.0] * p
    free = [0.0] * p
    version = [0] * p
    # heap entries (start, kind's priority, micro-batch, -chunk, rank, version, kind, chunk): the first five are the
    # order the choice is made in; an entry whose version is not its rank's latest is stale
    heap: list[tuple] = []
    standing: list[tuple | None] = [None] * p  # each rank's latest offer (None: nothing ready)
    push, pop = heapq.heappush, heapq.heappop

    def offer(r: int, over_cap: bool = False) -> None:
        """Push rank r's best ready action: (earliest start; then BI > F > BW; then the older
        micro-batch; then the deeper chunk; then the lower rank) -- the order of keys the global
        choice is made in, so keeping each rank's best and taking the least is the same choice."""
        ver = version[r] = version[r] + 1
        best: tuple | None = None
        fr = free[r]
        st_r, nb_r, nf_r = stages[r], nb[r], nf[r]
        can_f = live[r] <= room or over_cap
        for c in (1, 0):
            st, i = st_r[c], nb_r[c]
            if i < m:  # BI waits for its own F and the next stage's BI
                e = f_end[st][i]
                if e is not None:
                    e2 = bi_end[st + 1][i] if st < last else fr
                    if e2 is not None:
                        t = fr if fr >= e and fr >= e2 else (e if e >= e2 else e2)
                        key = (t, 0, i, -c, r, ver, "BI", c)
                        if best is None or key < best:
                            best = key
            i = nf_r[c]
            if can_f and i < m:  # F waits for the previous stage's F
                e = f_end[st - 1][i] if st > 0 else fr
                if e is not None:
                    key = (fr if fr >= e else e, 1, i, -c, r, ver, "F", c)
                    if best is None or key < best:
                        best = key
        if pending[r]:
            c, i = pending[r][0]
            e = bi_end[st_r[c]][i]
            key = (fr if fr >= e else e, 2, i, -c, r, ver, "BW", c)  # type: ignore[operator]
            if best is None or key < best:
                best = key
        standing[r] = best
        if best is not None:
            push(heap, best)

    def arrived(d: int, kind: str, st: int, i: int) -> None:
        """Rank d's `kind` (F or BI) of stage `st` for micro-batch `i` has just got its input from another rank
        (an F the previous stage's F, a BI the next stage's BI).  Nothing else of d's changed since its last
        offer, so its best ready action is the better of its standing offer and this action, where this is d's
        next of its kind and now ready: only then is the offer made again (`offer` finds that same least key);
        else the standing entry is the one a new offer would push.  (Most arrivals change nothing: ~9 in 10 at p = 64.)"""
        c = 0 if stages[d][0] == st else 1
        fr = free[d]
        if kind == "F":
            if nf[d][c] != i or live[d] > room:
                return
            e = f_end[st - 1][i]
            t = fr if fr >= e else e  # type: ignore[operator]
            key = (t, 1, i, -c)
        else:
            e = f_end[st][i]
            if nb[d][c] != i or e is None:
                return
            e2 = bi_end[st + 1][i]
            t = fr if fr >= e and fr >= e2 else (e if e >= e2 else e2)  # type: ignore[operator]
            key = (t, 0, i, -c)
        best = standing[d]
        if best is None or key < best[:4]:
            offer(d)

    for r in range(p):
        offer(r)
    for _ in range(3 * n_stages * m):
        while heap and heap[0][5] != version[heap[0][4]]:
            pop(heap)  # an offer made stale by a later one of the same rank
        capped = not heap
        if capped:  # every rank waits behind the memory cap: let one forward past it
            for r in range(p):
                offer(r, over_cap=True)
            while heap and heap[0][5] != version[heap[0][4]]:
                pop(heap)
        if not heap:  # cannot happen: the stage holding the oldest unfinished work can go on
            raise ScheduleError(f"zb-v: list scheduling found nothing to run for p={p}, m={m}")
        t, _prio, i, _c, r, _ver, kind, c = pop(heap)
        st = stages[r][c]
        stop = free[r] = t + cost[kind]
        other = to = -1  # the one other rank whose ready actions this one changes: the one holding stage `to`
        if kind == "F":
            nf[r][c] += 1
            live[r] += 1
            f_end[st][i] = stop
            if st < last:
                to = st + 1
                other = rank_of[to]
        elif kind == "BI":
            nb[r][c] += 1
            live[r] -= 1.0 - (head if st == last else held)
            pending[r].append((c, i))
            bi_end[st][i] = stop
            if st > 0:
                to = st - 1
                other = rank_of[to]
        else:
            pending[r].popleft()
            live[r] -= head if st == last else held
        out[r].append((kind, st, i))
        # only these ranks' ready actions or start times changed; after a capped pick every
        # rank's offer is made again under the cap (the other over-cap offers must not stand)
        if capped:
            for d in range(p):
                offer(d)
        else:
            offer(r)
            if other >= 0 and other != r:
                arrived(other, kind, to, i)
    return out


def dualpipe_v(p: int, m: int) -> list[list[Action]]:
    """DualPipe-V: DeepSeek's DualPipe (DeepSeek-V3 technical report, section 3.2.1) cut in half,
    as published in the DualPipe repository ("DualPipeV") and in torch.distributed.pipelining,
    on the V placement (rank r holds stages r and 2p-1-r).

    Rank r's phases (chunk 0 = stage r, chunk 1 = stage 2p-1-r; "B" a full backward):
      1. 2(p-r-1) forwards of chunk 0;              2. r+1 pairs: F chunk 0, F chunk 1;
      3. p-r-1 times: BI chunk 1, a BW, F chunk 1   (zero-bubble warm-up);
      4. m-2p+r+1 times: F chunk 0 + B chunk 1, then F chunk 1 + B chunk 0;
      5. p-r-1 times: B chunk 1, then F chunk 1 + B chunk 0;
      6. r+1 times: backward chunk 1, backward chunk 0 (split into BI/BW from half-way on);
      7. p-r-1 times: a BW, BI chunk 0;             8. the r+1 remaining BWs.
    In phases 4-5 the real DualPipe overlaps each "F + B" pair (two micro-batches, so one's
    communication hides behind the other's compute); this compute-only list runs the pair's F
    then its B, which is how a runtime without a second stream executes it.  Needs m >= 2p.
    """
    return _as_actions(_dualpipe_v_keys(p, m))


def _dualpipe_v_keys(p: int, m: int) -> list[list[Key]]:
    """`dualpipe_v`'s lists as (kind, stage, micro-batch) tuples (`build_keys`), phase by phase."""
    _require(p, m)
    if m < 2 * p:
        raise ScheduleError(f"dualpipe-v needs at least 2p micro-batches: m={m} < 2p={2 * p}; use m={2 * p}",
                            param="m")
    out = []
    for r in range(p):
        s0, s1 = r, 2 * p - 1 - r
        acts: list[Key] = []
        add = acts.append
        nf = {s0: 0, s1: 0}  # next micro-batch to forward, per stage
        nb = {s0: 0, s1: 0}  # next micro-batch to backward, per stage
        weights: deque[tuple[int, int]] = deque()  # (stage, micro-batch) with BI done, BW not
        split = False

        def f(s: int, add: Callable[[Key], None] = add, nf: dict[int, int] = nf) -> None:
            i = nf[s]
            nf[s] = i + 1
            add(("F", s, i))

        def b(s: int, zb: bool, add: Callable[[Key], None] = add, nb: dict[int, int] = nb,
              weights: deque[tuple[int, int]] = weights) -> None:
            i = nb[s]
            nb[s] = i + 1
            if zb:
                add(("BI", s, i))
                weights.append((s, i))
            else:
                add(("B", s, i))

        def w(add: Callable[[Key], None] = add, weights: deque[tuple[int, int]] = weights) -> None:
            if weights:
                s, i = weights.popleft()
                add(("BW", s, i))

        for _ in range(2 * (p - r - 1)):
            f(s0)
        for _ in range(r + 1):
            f(s0)
            f(s1)
        for _ in range(p - r - 1):
            b(s1, True)
            w()
            f(s1)
        for _ in range(m - 2 * p + r + 1):
            f(s0)
            b(s1, False)
            f(s1)
            b(s0, False)
        for _ in range(p - r - 1):
            b(s1, False)
            f(s1)
            b(s0, False)
        half = (r + 1) // 2
        for k in range(r + 1):
            if k == half and r % 2 == 1:
                split = True
            b(s1, split)
            if k == half and r % 2 == 0:
                split = True
            b(s0, split)
        for _ in range(p - r - 1):
            w()
            b(s0, split)
        while weights:
            w()
        out.append(acts)
    return out


def _as_actions(lists: list[list[Key]]) -> list[list[Action]]:
    """Per rank, its (kind, stage, micro-batch) tuples as Actions."""
    return [[Action(kind, stage, mb) for kind, stage, mb in acts] for acts in lists]


def build(name: str, p: int, m: int, v: int = 1,
          times: tuple[float, ...] | None = None) -> list[list[Action]]:
    """Build a schedule by name: one of SCHEDULES.  Raises ScheduleError for impossible requests.
    The V schedules (V_SCHEDULES) run v = 2 chunks per rank; interleaved any v >= 2; the others 1.
    ``times`` (F, BI, BW of one chunk) tunes the builders that schedule by simulation (zb-v);
    the others have one order for every time."""
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}; valid schedules: {', '.join(SCHEDULES)}",
                            param="name")
    _require(p, m)
    if name == "interleaved":
        return interleaved(p, m, v)
    if name in V_SCHEDULES:
        if v != 2:
            raise ScheduleError(f"schedule {name!r} runs two model chunks per rank in a V (v=2), got v={v}; "
                                "use --virtual-stages 2", param="v")
        return _as_actions(_v_keys(name, p, m, times))
    if v != 1:
        raise ScheduleError(f"schedule {name!r} runs one model chunk per rank (v=1), got v={v}; "
                            "use the 'interleaved' schedule for v > 1", param="v")
    if name == "gpipe":
        return gpipe(p, m)
    if name == "1f1b":
        return one_f_one_b(p, m)
    return zero_bubble_h1(p, m)


def build_keys(name: str, p: int, m: int, v: int = 1,
               times: tuple[float, ...] | None = None) -> list[list[Key]]:
    """`build`'s lists as (kind, stage, micro-batch) tuples, the same errors for the same requests.  The V
    builders make the tuples and `build` wraps them in Actions; the planner's compile (plan/replay.py) reads
    just these three fields of up to ~10⁵ actions of one schedule, so it takes them without the objects."""
    if name in V_SCHEDULES and v == 2:
        _require(p, m)
        return _v_keys(name, p, m, times)
    return [[(a.kind, a.stage, a.microbatch) for a in acts] for acts in build(name, p, m, v, times)]


def _v_keys(name: str, p: int, m: int, times: tuple[float, ...] | None) -> list[list[Key]]:
    return _zero_bubble_v_keys(p, m, times or (1.0, 1.0, 1.0)) if name == "zb-v" else _dualpipe_v_keys(p, m)


def default_v(name: str) -> int:
    """Chunks per rank a schedule runs when none is asked for: 2 for interleaved and the V ones."""
    return 2 if name == "interleaved" or name in V_SCHEDULES else 1


# --------------------------------------------------------------------------------------------
# Dependencies, execution order and the checker
# --------------------------------------------------------------------------------------------

Key = tuple[str, int, int]  # (kind, stage, microbatch)


class Where:
    """How the checker names a place and an action in its messages.  The default counts a rank's
    actions from 0; a schedule read from CSV names the CSV's row and column and torch's notation."""

    def at(self, r: int, j: int) -> str:
        return f"rank {r}, position {j}"

    def act(self, a: Action) -> str:
        return str(a)


def _key(a: Action) -> Key:
    return (a.kind, a.stage, a.microbatch)


def dependencies(action: Action, n_stages: int, present: Container[Key]) -> list[Key]:
    """What ``action`` waits for.  ``present`` is the set of actions in the schedule, used to tell
    whether stage s+1 ran a full B or the BI/BW pair for this micro-batch."""
    kind, s, i = action.kind, action.stage, action.microbatch
    if kind == "F":
        return [("F", s - 1, i)] if s > 0 else []
    if kind == "BW":
        return [("BI", s, i)]
    deps = [("F", s, i)]
    if s < n_stages - 1:
        deps.append(("BI", s + 1, i) if ("BI", s + 1, i) in present else ("B", s + 1, i))
    return deps


def sends_to(kind: str, stage: int, n_stages: int) -> int:
    """The stage an action's output goes to (the mirror of `dependencies`): an F's activation to the next stage, a B's
    or BI's input gradient to the previous one; -1 for BW, and at the pipeline's ends."""
    nb = stage + 1 if kind == "F" else stage - 1 if kind in ("B", "BI") else -1
    return nb if 0 <= nb < n_stages else -1


def _validate(schedule: list[list[Action]], p: int, m: int, v: int, w: Where | None = None) -> set[Key]:
    """Every action well formed, each stage on one rank, v stages per rank, every (stage,
    micro-batch) exactly one F and one B or BI + BW; returns the set of keys."""
    if p < 1 or m < 1 or v < 1:
        raise ScheduleError(f"bad schedule shape p={p}, m={m}, v={v}: all must be >= 1")
    if len(schedule) != p:
        raise ScheduleError(f"schedule has {len(schedule)} rank lists, expected p={p}")
    w = w or Where()
    n_stages = p * v
    seen: dict[Key, tuple[int, int]] = {}
    for r, acts in enumerate(schedule):
        for j, a in enumerate(acts):
            if a.kind not in KINDS:
                raise ScheduleError(f"{w.at(r, j)}: {a} has unknown kind; kinds are {KINDS}")
            if not 0 <= a.stage < n_stages:
                raise ScheduleError(f"{w.at(r, j)}: {w.act(a)} has a stage outside 0..{n_stages - 1}")
            if not 0 <= a.microbatch < m:
                raise ScheduleError(f"{w.at(r, j)}: {w.act(a)} has a micro-batch outside 0..{m - 1}")
            if _key(a) in seen:
                raise ScheduleError(f"{w.at(r, j)}: {w.act(a)} is duplicated (first at {w.at(*seen[_key(a)])})")
            seen[_key(a)] = (r, j)
    where_of = placement(schedule, w)
    for r in range(p):
        held = rank_stages(schedule, r)
        if len(held) != v:
            raise ScheduleError(f"rank {r} holds {len(held)} stage(s) {held}; every rank must hold v={v} "
                                f"(p={p} ranks x v={v} = {n_stages} stages)")
    for s in range(n_stages):
        for i in range(m):
            where = f"stage {s} (rank {where_of.get(s, '?')}), micro-batch {i}"
            if ("F", s, i) not in seen:
                raise ScheduleError(f"missing F for {where}")
            has_b = ("B", s, i) in seen
            has_bi, has_bw = ("BI", s, i) in seen, ("BW", s, i) in seen
            if has_b and (has_bi or has_bw):
                raise ScheduleError(f"{where} has both B (at {w.at(*seen[('B', s, i)])}) and a BI/BW split; "
                                    "use one or the other")
            if not has_b and not (has_bi and has_bw):
                if has_bi or has_bw:
                    have, missing = ("BI", "BW") if has_bi else ("BW", "BI")
                    raise ScheduleError(f"missing {missing} for {where}: it has {w.act(Action(have, s, i))} at "
                                        f"{w.at(*seen[(have, s, i)])} (a split backward needs both halves)")
                raise ScheduleError(f"missing B for {where}")
    return set(seen)


def execution_order(schedule: list[list[Action]], p: int, m: int, v: int = 1,
                    w: Where | None = None) -> list[Action]:
    """A global order in which the per-rank lists can run, each rank strictly in its own order and
    every action after the actions it depends on.  Raises ScheduleError for a violated same-rank
    dependency or for a deadlock (no rank can make progress before all are done).

    This models blocking point-to-point transfers: a rank that reaches an action whose input is not
    produced yet waits there, and cannot skip ahead.
    """
    w = w or Where()
    present = _validate(schedule, p, m, v, w)
    n_stages = p * v
    position = {_key(a): (r, j) for r, acts in enumerate(schedule) for j, a in enumerate(acts)}
    # Same-rank ordering mistakes get a precise message before the deadlock search.
    for r, acts in enumerate(schedule):
        for j, a in enumerate(acts):
            for d in dependencies(a, n_stages, present):
                dr, dj = position[d]
                if dr == r and dj > j:
                    raise ScheduleError(
                        f"dependency violated at {w.at(r, j)}: {w.act(a)} needs {w.act(Action(*d))}, "
                        f"which comes later on the same rank (at {w.at(r, dj)})")
    done: set[Key] = set()
    nxt = [0] * p
    order: list[Action] = []
    while len(order) < len(position):
        progressed = False
        for r in range(p):
            # Run this rank as far as it can go before looking at the others.
            while nxt[r] < len(schedule[r]):
                a = schedule[r][nxt[r]]
                if any(d not in done for d in dependencies(a, n_stages, present)):
                    break
                done.add(_key(a))
                order.append(a)
                nxt[r] += 1
                progressed = True
        if not progressed:
            stuck = []
            for r in range(p):
                if nxt[r] < len(schedule[r]):
                    a = schedule[r][nxt[r]]
                    waits = [f"{w.act(Action(*d))} ({w.at(*position[d])})"
                             for d in dependencies(a, n_stages, present) if d not in done]
                    stuck.append(f"{w.at(r, nxt[r])} blocked at {w.act(a)} waiting for {', '.join(waits)}")
            raise ScheduleError("deadlock under blocking transfers (every rank waits for another): "
                                + "; ".join(stuck))
    return order


@dataclass
class CheckReport:
    peak_inflight: list[int]
    """Per pipeline rank: the most (stage, micro-batch) pairs whose activations are alive at once,
    i.e. F done and B (or BW, for split backwards) not yet done."""


def peak_inflight(schedule: list[list[Action]]) -> list[int]:
    peaks = []
    for acts in schedule:
        live = peak = 0
        for a in acts:
            if a.kind == "F":
                live += 1
            elif a.kind in ("B", "BW"):
                live -= 1
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


def check(schedule: list[list[Action]], p: int, m: int, v: int = 1, w: Where | None = None) -> CheckReport:
    """Check completeness, dependencies and deadlock-freedom; report peak in-flight activations.

    Raises ScheduleError naming the offending action (rank, position, action).
    """
    execution_order(schedule, p, m, v, w)
    return CheckReport(peak_inflight=peak_inflight(schedule))


# --------------------------------------------------------------------------------------------
# Message order (for transports that ignore tags)
# --------------------------------------------------------------------------------------------


def p2p_order_problems(schedule: list[list[Action]], p: int, v: int = 1) -> list[str]:
    """Where a receiver would take a pair's messages in another order than they were sent.

    gloo matches point-to-point messages by tag, NCCL only by order per (sender, receiver, process
    group).  The runtime sends activations and gradients on two separate groups, so what must hold
    for NCCL is: on each channel ("act" forward, "grad" backward) and each ordered pair of ranks,
    the order in which the sender issues its sends (its action order) equals the order in which the
    receiver needs them (its action order).  Transfers between two stages of one rank (the V's
    turn) are no messages.  Returns one line per violation; [] means safe."""
    last = p * v - 1
    rank_of = placement(schedule)
    sent: dict[tuple[str, int, int], list[tuple[int, int]]] = {}
    needed: dict[tuple[str, int, int], list[tuple[int, int]]] = {}

    def add(table: dict, ch: str, src: int, dst: int, item: tuple[int, int]) -> None:
        if src != dst:
            table.setdefault((ch, src, dst), []).append(item)

    for r, acts in enumerate(schedule):
        for a in acts:
            s, i = a.stage, a.microbatch
            if a.kind == "F" and s < last:
                add(sent, "act", r, rank_of[s + 1], (s + 1, i))
            if a.kind == "F" and s > 0:
                add(needed, "act", rank_of[s - 1], r, (s, i))
            if a.kind in ("B", "BI") and s > 0:
                add(sent, "grad", r, rank_of[s - 1], (s - 1, i))
            if a.kind in ("B", "BI") and s < last:
                add(needed, "grad", rank_of[s + 1], r, (s, i))
    problems = []
    for key in sorted(set(sent) | set(needed)):
        if sent.get(key, []) != needed.get(key, []):
            ch, src, dst = key
            problems.append(f"{ch} channel {src}->{dst}: sent {sent.get(key, [])[:6]}..., "
                            f"received {needed.get(key, [])[:6]}...")
    return problems


# --------------------------------------------------------------------------------------------
# torch.distributed.pipelining's compute-only CSV
# --------------------------------------------------------------------------------------------

# Our kinds in torch's action notation "<stage><letter><micro-batch>" (e.g. 0F1: stage 0's forward
# of micro-batch 1; I / W: the input- and weight-gradient halves of a backward; B: a full one).
_TORCH_LETTER = {"F": "F", "B": "B", "BI": "I", "BW": "W"}
_FROM_LETTER = {v: k for k, v in _TORCH_LETTER.items()}


def torch_notation(a: Action) -> str:
    return f"{a.stage}{_TORCH_LETTER[a.kind]}{a.microbatch}"


def to_csv(schedule: list[list[Action]]) -> str:
    """One row per rank, one cell per action in torch's notation: the compute-only CSV that
    torch.distributed.pipelining's `_PipelineScheduleRuntime` loads (its `_load_csv`)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for acts in schedule:
        writer.writerow([torch_notation(a) for a in acts])
    return buf.getvalue()




@dataclass
class CsvSchedule(Where):
    schedule: list[list[Action]]
    p: int
    m: int
    v: int
    columns: list[list[int]]
    """columns[r][j]: the CSV column (0-based) of rank r's j-th action; empty cells are bubbles,
    so the two differ after a bubble."""

    def at(self, r: int, j: int) -> str:
        return f"rank {r} (row {r + 1}), position {self.columns[r][j]}"

    def act(self, a: Action) -> str:
        return torch_notation(a) if a.kind in _TORCH_LETTER else str(a)

    def check(self) -> CheckReport:
        """`check`, its messages naming the CSV's rows, columns (bubbles counted) and cells."""
        return check(self.schedule, self.p, self.m, self.v, self)


_CELL = re.compile(r"^(\d+)([A-Z_]+?)(\d*)$")


def from_csv(text: str) -> CsvSchedule:
    """Parse a compute-only CSV in torch's notation (one row per rank; cells F, B, I, W as in
    ``0F1``; empty cells are bubbles).  p is the number of rows, v the stages per rank, m the
    micro-batches.  Communication actions (SEND_F, RECV_B, ...) are refused: the runtime derives
    its transfers from the compute order.  Raises ScheduleError naming rank, position and cell;
    `CsvSchedule.check` then checks it the same way."""
    rows = list(csv.reader(io.StringIO(text)))
    while rows and not any(c.strip() for c in rows[-1]):
        rows.pop()  # trailing blank lines
    if not rows:
        raise ScheduleError("the schedule CSV is empty: expected one row of actions per pipeline rank")
    schedule: list[list[Action]] = []
    columns: list[list[int]] = []
    for r, row in enumerate(rows):
        acts, cols = [], []
        for c, cell in enumerate(row):
            cell = cell.strip()
            if not cell:
                continue  # a bubble
            got = _CELL.match(cell)
            if got is None or got.group(2) not in _FROM_LETTER or not got.group(3):
                if got is not None and got.group(2) not in _FROM_LETTER:
                    why = (f"{got.group(2)!r} is a communication or unknown action; a compute-only CSV holds "
                           "F, B, I and W")
                else:
                    why = "expected <stage><F|B|I|W><micro-batch>, e.g. 0F1"
                raise ScheduleError(f"rank {r} (row {r + 1}), position {c}: cannot read {cell!r}: {why}")
            acts.append(Action(_FROM_LETTER[got.group(2)], int(got.group(1)), int(got.group(3))))
            cols.append(c)
        schedule.append(acts)
        columns.append(cols)
    p = len(schedule)
    empty = [r for r, acts in enumerate(schedule) if not acts]
    if empty:
        raise ScheduleError(f"rank {empty[0]} (row {empty[0] + 1}) has no actions; every pipeline rank "
                            "must hold at least one stage")
    n_stages = 1 + max(a.stage for acts in schedule for a in acts)
    m = 1 + max(a.microbatch for acts in schedule for a in acts)
    if n_stages % p:
        raise ScheduleError(f"the CSV uses stages 0..{n_stages - 1} on {p} ranks: {n_stages} stages cannot be "
                            "dealt evenly (every rank holds the same number of stages)")
    return CsvSchedule(schedule, p, m, n_stages // p, columns)


def builder_of(schedule: list[list[Action]], p: int, m: int, v: int) -> str | None:
    """The builder (one of SCHEDULES, default times) that makes exactly `schedule` at (p, m, v),
    or None: a CSV read back from ``--to-csv`` is known by name again, e.g. to the planner, which
    prices named schedules only."""
    for name in SCHEDULES:
        try:
            if build(name, p, m, v) == schedule:
                return name
        except ScheduleError:
            continue
    return None


# --------------------------------------------------------------------------------------------
# NCCL's blocking, replayed (the backend path: NCCL's, and gloo's with --p2p backend)
# --------------------------------------------------------------------------------------------

Message = tuple[str, int, int]  # (what: "act" | "grad", receiving stage, micro-batch)
P2P_LOOKAHEAD = 2  # receives the runtime posts ahead of the action that needs them


def p2p_channel(what: str, src: int, dst: int) -> str:
    """The process group a message travels on: activations and gradients apart, and each apart
    again for the messages that go against their usual direction (the interleaved schedule's
    wrap-around from the last rank to the first, and its gradients back), so that between two
    ranks every communicator carries messages one way only."""
    wrap = (what == "act" and dst < src) or (what == "grad" and dst > src)
    return f"{what}_wrap" if wrap else what


def p2p_pairs(schedule: list[list[Action]]) -> list[tuple[int, int]]:
    """The pairs (a, b), a < b, of ranks between which the runtime sends messages: a stage and the
    next one placed on two different ranks."""
    rank_of = placement(schedule)
    pairs = {(min(rank_of[s], rank_of[s + 1]), max(rank_of[s], rank_of[s + 1]))
             for s in rank_of if s + 1 in rank_of and rank_of[s] != rank_of[s + 1]}
    return sorted(pairs)


def rank_p2p(actions: list[Action], rank: int, rank_of: dict[int, int], n_stages: int,
             lookahead: int) -> list[tuple[str, int, Message, int]]:
    """What one rank posts, in the order the runtime posts it: before action i the receives of
    actions up to i + lookahead not yet posted, after action i its send.  Items: (kind "send" |
    "recv", peer rank, message, the action that needs a receive or produced a send)."""
    last = n_stages - 1

    def recv_of(i: int) -> tuple[str, int, Message, int] | None:
        a = actions[i]
        s, mb = a.stage, a.microbatch
        if a.kind == "F" and s > 0 and rank_of[s - 1] != rank:
            return ("recv", rank_of[s - 1], ("act", s, mb), i)
        if a.kind in ("B", "BI") and s < last and rank_of[s + 1] != rank:
            return ("recv", rank_of[s + 1], ("grad", s, mb), i)
        return None

    out: list[tuple[str, int, Message, int]] = []
    posted = 0
    for i, a in enumerate(actions):
        while posted < min(i + 1 + lookahead, len(actions)):
            r = recv_of(posted)
            posted += 1
            if r is not None:
                out.append(r)
        s, mb = a.stage, a.microbatch
        if a.kind == "F" and s < last and rank_of[s + 1] != rank:
            out.append(("send", rank_of[s + 1], ("act", s + 1, mb), i))
        elif a.kind in ("B", "BI") and s > 0 and rank_of[s - 1] != rank:
            out.append(("send", rank_of[s - 1], ("grad", s - 1, mb), i))
    return out


def nccl_problems(schedule: list[list[Action]], p: int, v: int = 1, lookahead: int = P2P_LOOKAHEAD,
                  per_pair: bool = True) -> list[str]:
    """Why the runtime's point-to-point transfers of `schedule` could hang or mix up messages on
    NCCL; [] when they cannot.

    The model (NCCL's, as PyTorch drives it): transfers between two ranks on one process group
    share one communicator, whose operations run one after another in the order they were posted;
    a send and its receive both wait until the other has started (nothing is buffered, the
    strictest case: large messages); the k-th send on a communicator meets the k-th receive,
    whatever the tags say.  A rank's host never waits on a send (its compute goes on); it waits
    on a receive before the action that needs it.  Replayed with the runtime's posting order
    (`rank_p2p`) and channels (`p2p_channel`) the transfers must (1) pair each message with its
    own receive and (2) all finish.  (Posting every exchange of a step boundary as one batch on a
    single communicator instead, Megatron-LM's `batch_isend_irecv`, fails (2) for the interleaved
    schedule under this model — two ranks' batches can each wait for a receive the other posts
    only in its next batch; docs/pipeline.md.)

    `per_pair`: one communicator per (channel, pair of ranks) — what the runtime has, with a
    two-rank group per channel and pair (`mesh.build_groups`' p2p_pairs; at p = 2 the pp group
    and its twins).  False: one per (channel, rank) for all its peers — what a group of more
    than two ranks gets when torch initialises it eagerly (a device given to
    init_process_group): its sends and receives to every peer share one communicator."""
    rank_of = placement(schedule)
    n = p * v
    posts = [rank_p2p(acts, r, rank_of, n, lookahead) for r, acts in enumerate(schedule)]
    # streams: (channel, unordered pair); k-th send on a stream from src meets k-th recv at dst
    queue: dict[tuple[int, str, tuple[int, int]], list[int]] = {}  # (rank, channel, pair) -> post indices
    match_key: list[list[tuple[str, tuple[int, int], int]]] = []
    count: dict[tuple[str, int, int, str], int] = {}
    for r, ops in enumerate(posts):
        keys = []
        for j, (kind, peer, msg, _i) in enumerate(ops):
            src, dst = (r, peer) if kind == "send" else (peer, r)
            ch = p2p_channel(msg[0], src, dst)
            pair = (min(r, peer), max(r, peer)) if per_pair else (0, 0)
            queue.setdefault((r, ch, pair), []).append(j)
            k = count.get((ch, src, dst, kind), 0)
            count[(ch, src, dst, kind)] = k + 1
            keys.append((ch, (src, dst), k))
        match_key.append(keys)
    where: dict[tuple[str, tuple[int, int], int, str], tuple[int, int]] = {}
    for r, ops in enumerate(posts):
        for j, (kind, *_rest) in enumerate(ops):
            ch, sd, k = match_key[r][j]
            where[(ch, sd, k, kind)] = (r, j)
    problems = []
    for (ch, sd, k, kind), (r, j) in sorted(where.items()):
        if kind != "send":
            continue
        other = where.get((ch, sd, k, "recv"))
        if other is None or posts[other[0]][other[1]][2] != posts[r][j][2]:
            got = None if other is None else posts[other[0]][other[1]][2]
            problems.append(f"{ch} {sd[0]}->{sd[1]}: send #{k} is {posts[r][j][2]} but receive #{k} "
                            f"is {got} (NCCL would hand the message to the wrong receive)")
    if problems:
        return problems
    # replay: post j of rank r has started when the rank's host reached it (all its receives for
    # earlier actions done) and every earlier post on its stream has finished
    nxt = [0] * len(posts)  # the host's next post
    done = [[False] * len(ops) for ops in posts]
    stream_pos = {key: 0 for key in queue}  # index into the stream's list of the first unfinished post

    def started(r: int, j: int) -> bool:
        if j >= nxt[r]:
            return False
        ch, sd, _k = match_key[r][j]
        key = (r, ch, (min(sd), max(sd)) if per_pair else (0, 0))
        return queue[key][stream_pos[key]] == j

    while True:
        moved = False
        for r, ops in enumerate(posts):  # the host goes on until a receive it needs is not done
            while nxt[r] < len(ops):
                kind, _peer, _msg, i = ops[nxt[r]]
                pending = [j for j, (k2, _p, _m, i2) in enumerate(ops[:nxt[r]])
                           if k2 == "recv" and i2 <= i and not done[r][j]]
                if kind == "send" and pending:  # the send's action waits for its inputs first
                    break
                if kind == "recv":
                    needed = [j for j, (k2, _p, _m, i2) in enumerate(ops[:nxt[r]])
                              if k2 == "recv" and i2 < i - lookahead and not done[r][j]]
                    if needed:
                        break
                nxt[r] += 1
                moved = True
        for r, ops in enumerate(posts):
            for j in range(nxt[r]):
                if done[r][j] or not started(r, j):
                    continue
                ch, sd, k = match_key[r][j]
                kind = ops[j][0]
                pr, pj = where[(ch, sd, k, "recv" if kind == "send" else "send")]
                if started(pr, pj):
                    for rr, jj in ((r, j), (pr, pj)):
                        done[rr][jj] = True
                        c2, sd2, _ = match_key[rr][jj]
                        key = (rr, c2, (min(sd2), max(sd2)) if per_pair else (0, 0))
                        while stream_pos[key] < len(queue[key]) and done[rr][queue[key][stream_pos[key]]]:
                            stream_pos[key] += 1
                    moved = True
        if all(all(d) for d in done) and all(nxt[r] == len(ops) for r, ops in enumerate(posts)):
            return []
        if not moved:
            stuck = []
            for r, ops in enumerate(posts):
                waiting = [ops[j][:3] for j in range(nxt[r]) if not done[r][j]]
                if waiting or nxt[r] < len(ops):
                    stuck.append(f"rank {r} waits on {waiting[:2]}")
            return ["point-to-point transfers would hang on NCCL: " + "; ".join(stuck)]
