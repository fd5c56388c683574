"""The simulator's recurrence, compiled once per schedule and replayed for many duration sets.

`pipeline/simulate.py` times a schedule action by action: an action starts when its rank is free
and its inputs have arrived (`transfer` later when they come from another rank), and it builds an
`Event` for each action.  The search times thousands of duration sets on a few dozen schedules, so
here the schedule is turned once into a flat program — per action its rank, the index of its
duration and the indices of what it waits for — and replayed with plain float arithmetic.

The numbers are the simulator's, bit for bit: every start is the same `max` of the same sums, busy
time is accumulated per rank as `(start + t) - start` in start order, the makespan is the largest
end, and the bubble is `1 - sum(busy) / (p · makespan)` (tests/test_plan_model.py compares them
with `simulate` on every schedule).  Start times do not depend on which dependency-respecting order
the actions are visited in, so the program uses a cheap topological order rather than the
checker's; `stage_layout.validate_schedule` still runs the full check on every reported plan.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from par3d.pipeline.schedules import ScheduleError, build_keys, schedule_placement, sends_to
from par3d.pipeline.simulate import hop_times


@dataclass(frozen=True)
class Program:
    p: int
    keys: tuple[tuple[int, str], ...]  # (stage, kind) of each duration slot
    ranks: tuple[int, ...]  # per action, in a dependency-respecting order
    slots: tuple[int, ...]  # per action, index into `keys`
    # per action, its (at most two) dependencies in `dependencies`' order: the action index (-1: none)
    dep1: tuple[int, ...]
    dep2: tuple[int, ...]
    # per global stage, the action index of its first forward (micro-batch 0) and of its last
    # gradient-producing action (B, or BW for the split backwards): when its weights are first needed
    # and when its gradients are final (dp_tail.dp_tail's bucket timing)
    first_f: tuple[int, ...] = ()
    last_grad: tuple[int, ...] = ()
    # per action, the stage boundary each dependency crossed (s: between global stages s and s + 1; -1: none, or
    # on the same rank, then its output arrives at once): which hop's time it waits for
    bnd1: tuple[int, ...] = ()
    bnd2: tuple[int, ...] = ()
    # per action, the stage boundary its output crosses to another rank (an F's to the next stage, a B's or BI's
    # to the previous; -1: none, or the neighbour on the same rank): the send that holds the rank when the
    # framework's point-to-point calls block (`replay_marks`' `blocking`)
    out: tuple[int, ...] = ()


KIND_CODE = {"F": 0, "B": 1, "BI": 2, "BW": 3}


# Compiled programs kept, least recently used first out, bounded by their total actions rather than their count: one
# program of a deep pipeline with many micro-batches (64 stages x 1,536 micro-batches: ~200,000 actions) weighs as much
# as a thousand small ones.  The budget holds every distinct schedule the validation set prices (about 280 programs,
# 2.7 million actions), so pricing its rows again -- without their software, with only their framework named, under a
# refit -- compiles nothing twice; a count bound of 128 recompiled most of them on each pass.
PROGRAM_CACHE_ACTIONS = 4_000_000
_programs: OrderedDict[tuple, Program] = OrderedDict()
_cached_actions = 0


def program(schedule: str, p: int, m: int, v: int, times: tuple[float, ...] | None = None) -> Program:
    """`compile_program`, cached (`PROGRAM_CACHE_ACTIONS`): the same arguments give the same object."""
    global _cached_actions
    key = (schedule, p, m, v, times)
    prog = _programs.get(key)
    if prog is not None:
        _programs.move_to_end(key)
        return prog
    prog = compile_program(schedule, p, m, v, times)
    _programs[key] = prog
    _cached_actions += len(prog.ranks)
    while _cached_actions > PROGRAM_CACHE_ACTIONS and len(_programs) > 1:
        _, old = _programs.popitem(last=False)
        _cached_actions -= len(old.ranks)
    return prog


def clear_programs() -> None:
    """Forget every cached program."""
    global _cached_actions
    _programs.clear()
    _cached_actions = 0


def compile_program(schedule: str, p: int, m: int, v: int,
                    times: tuple[float, ...] | None = None) -> Program:
    """Compile `build(schedule, p, m, v, times)` (read as `build_keys`): each rank runs its list in order; an action runs once all
    its dependencies have (the blocking semantics of `schedules.execution_order`).  What an action
    waits for is `schedules.dependencies`' rule, with actions numbered (kind, stage, micro-batch) →
    int so the compile is list indexing rather than tuple hashing; where it sends is `schedules.sends_to`'s,
    looked up per (kind, stage).  One pass reads the built lists, one places the actions: the search compiles a
    program per distinct schedule, tens of thousands of actions each, so the loops are kept flat."""
    sched = build_keys(schedule, p, m, v, times)  # build's lists, as (kind, stage, micro-batch) tuples
    n_stages = p * v
    span = n_stages * m
    bi0, b0 = KIND_CODE["BI"] * span, KIND_CODE["B"] * span
    # the rank of each stage: the builder's declared placement (round-robin or V; a test checks it
    # against `placement`, which reads it off a built schedule by scanning every action)
    rank_of = schedule_placement(schedule, p, v)
    kind_code = KIND_CODE
    codes = [kind_code[kind] * span + stage * m + mb for acts in sched for kind, stage, mb in acts]
    # per (kind, stage): the stage boundary its output crosses to another rank (`sends_to`), -1 if none or on its rank
    sends = [[-1] * n_stages for _ in KIND_CODE]
    for kind_name, kc in KIND_CODE.items():
        for s in range(n_stages):
            nb = sends_to(kind_name, s, n_stages)
            if nb >= 0 and rank_of[nb] != rank_of[s]:
                sends[kc][s] = min(nb, s)
    present = bytearray(4 * span)
    for c in codes:
        present[c] = 1
    starts = [0]
    for acts in sched:
        starts.append(starts[-1] + len(acts))
    n = starts[-1]
    index = [-1] * (4 * span)  # code -> position in the program
    slot_of: dict[int, int] = {}
    ranks: list[int] = []
    slots: list[int] = []
    dep1: list[int] = []
    dep2: list[int] = []
    bnd1: list[int] = []
    bnd2: list[int] = []
    out: list[int] = []
    first = [-1] * n_stages
    last = [-1] * n_stages
    waiting: dict[int, list[int]] = {}
    nxt = starts[:-1]
    todo = list(range(p - 1, -1, -1))
    last_stage = n_stages - 1
    while todo:
        r = todo.pop()
        j, stop = nxt[r], starts[r + 1]
        while j < stop:
            c = codes[j]
            kind = c // span
            sm = c - kind * span
            stage = sm // m
            # the rule of schedules.dependencies, on codes: F waits for F of the previous stage; BW for its BI;
            # B and BI for their own F and for the next stage's BI (when it split its B) or B
            if kind == 0:  # F
                d1 = c - m if stage > 0 else -1
                d2 = -1
            elif kind == 3:  # BW
                d1, d2 = bi0 + sm, -1
            else:  # B, BI
                d1 = sm  # its own F (F's codes start at 0)
                if stage < last_stage:
                    d2 = bi0 + sm + m
                    if not present[d2]:
                        d2 = b0 + sm + m
                else:
                    d2 = -1
            if d1 >= 0 and index[d1] < 0:
                waiting.setdefault(d1, []).append(r)
                break
            if d2 >= 0 and index[d2] < 0:
                waiting.setdefault(d2, []).append(r)
                break
            at = len(ranks)
            index[c] = at
            ranks.append(r)
            sc = kind * n_stages + stage
            k = slot_of.get(sc)
            if k is None:
                k = slot_of[sc] = len(slot_of)
            slots.append(k)
            # a dependency's stage is (code % span) // m; the boundary it crossed, where it came from another rank
            if d1 >= 0:
                dep1.append(index[d1])
                ds = (d1 % span) // m
                bnd1.append((ds if ds < stage else stage) if rank_of[ds] != r else -1)
            else:
                dep1.append(-1)
                bnd1.append(-1)
            if d2 >= 0:
                dep2.append(index[d2])
                ds = (d2 % span) // m
                bnd2.append((ds if ds < stage else stage) if rank_of[ds] != r else -1)
            else:
                dep2.append(-1)
                bnd2.append(-1)
            if kind == 0:
                if sm == stage * m:  # micro-batch 0
                    first[stage] = at
            elif kind != 2:
                # a stage's actions all run on one rank in its list's order: the last B/BW placed is the last listed
                last[stage] = at
            out.append(sends[kind][stage])
            j += 1
            w = waiting.pop(c, None)
            if w is not None:
                todo.extend(w)
        nxt[r] = j
    if len(ranks) != n:
        raise ScheduleError(f"{schedule} p={p} m={m} v={v}: the schedule deadlocks")
    kinds = ("F", "B", "BI", "BW")
    keys = tuple((sc % n_stages, kinds[sc // n_stages]) for sc in sorted(slot_of, key=slot_of.__getitem__))
    return Program(p, keys, tuple(ranks), tuple(slots), tuple(dep1), tuple(dep2), tuple(first), tuple(last),
                   tuple(bnd1), tuple(bnd2), tuple(out))


@dataclass(frozen=True)
class Marks:
    """Per global stage, from one replay: when its first forward starts (its weights are needed), when
    its last gradient-producing action ends (its gradients are final) and how long that action took."""

    first_f: tuple[float, ...]
    grad_end: tuple[float, ...]
    grad_dur: tuple[float, ...]

    def scaled(self, k: float) -> Marks:
        return Marks(tuple(t * k for t in self.first_f), tuple(t * k for t in self.grad_end),
                     tuple(t * k for t in self.grad_dur))


def replay(prog: Program, durations: dict[tuple[int, str], float],
           transfer: float | Sequence[float], blocking: bool = False) -> tuple[float, float, list[float]]:
    """(makespan, bubble_wall, busy per rank) exactly as `simulate(...)` reports them."""
    return replay_marks(prog, durations, transfer, blocking)[:3]


def replay_marks(prog: Program, durations: dict[tuple[int, str], float],
                 transfer: float | Sequence[float],
                 blocking: bool = False) -> tuple[float, float, list[float], Marks]:
    """`replay`'s three numbers and the stages' `Marks`.  `transfer`: one time for every hop between ranks, or one
    per stage boundary (index s: between global stages s and s + 1), as `pipeline/simulate.py` takes it: a dependency
    from another rank arrives its boundary's hop later.  `blocking`: a send holds its rank that long too (simulate's
    `blocking`)."""
    hops = hop_times(transfer, len(prog.first_f))
    dur = [float(durations[k]) for k in prog.keys]
    free = [0.0] * prog.p
    busy = [0.0] * prog.p
    begin = [0.0] * len(prog.ranks)
    end = [0.0] * len(prog.ranks)
    makespan = 0.0
    outs = prog.out if blocking else (-1,) * len(prog.ranks)
    for i, (r, k, d1, b1, d2, b2, o) in enumerate(zip(prog.ranks, prog.slots, prog.dep1, prog.bnd1, prog.dep2,
                                                      prog.bnd2, outs)):
        start = free[r]
        if d1 >= 0:
            e = end[d1] + hops[b1] if b1 >= 0 else end[d1] + 0.0
            if e > start:
                start = e
            if d2 >= 0:
                e = end[d2] + hops[b2] if b2 >= 0 else end[d2] + 0.0
                if e > start:
                    start = e
        stop = start + dur[k]
        begin[i] = start
        end[i] = stop
        free[r] = stop + hops[o] if o >= 0 else stop
        busy[r] += stop - start
        if stop > makespan:
            makespan = stop
    bubble = 1.0 - sum(busy) / (prog.p * makespan) if makespan > 0 else 0.0
    marks = Marks(tuple(begin[i] for i in prog.first_f), tuple(end[i] for i in prog.last_grad),
                  tuple(end[i] - begin[i] for i in prog.last_grad))
    return makespan, bubble, busy, marks
