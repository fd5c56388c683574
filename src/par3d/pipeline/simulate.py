"""Time a pipeline schedule: the *predicted* timeline.

Every rank runs its action list strictly in order; an action starts when its rank is free and its
inputs have arrived (``transfer`` seconds after the producing action ended on another rank, at once
on the same rank).  The events produced here have the same format as those the runtime records with
wall-clock times, so predicted and measured timelines can be compared, reported and drawn alike.

Pure Python: no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from par3d.pipeline.schedules import Action, dependencies, execution_order, placement, sends_to

DurationFn = Callable[[int, str], float]


@dataclass
class Event:
    rank: int  # pipeline rank
    kind: str  # F, B, BI or BW
    stage: int  # global (virtual) stage
    microbatch: int
    start: float  # seconds
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict:
        return {"rank": self.rank, "kind": self.kind, "stage": self.stage, "microbatch": self.microbatch,
                "start": self.start, "end": self.end}

    @staticmethod
    def from_dict(d: dict) -> Event:
        return Event(rank=int(d["rank"]), kind=str(d["kind"]), stage=int(d["stage"]),
                     microbatch=int(d["microbatch"]), start=float(d["start"]), end=float(d["end"]))


@dataclass
class Timeline:
    events: list[Event]
    p: int
    m: int
    v: int
    makespan: float
    busy: list[float] = field(default_factory=list)  # per rank, seconds of work
    bubble_wall: float = 0.0  # idle share of all ranks' wall time: 1 - sum(busy) / (p * makespan)
    bubble_ideal: float = 0.0  # idle time relative to the busiest rank's work: (makespan - max busy) / max busy
    utilisation: float = 1.0  # 1 - bubble_wall

    def to_dict(self) -> dict:
        return {"p": self.p, "m": self.m, "v": self.v, "makespan": self.makespan, "busy": list(self.busy),
                "bubble_wall": self.bubble_wall, "bubble_ideal": self.bubble_ideal,
                "utilisation": self.utilisation, "events": [e.to_dict() for e in self.events]}


def timeline_from_events(events: list[Event], p: int, m: int, v: int = 1) -> Timeline:
    """Summarise events (simulated or measured) into a Timeline.

    Times are shifted so the earliest start is 0, so measured wall-clock events and simulated ones
    line up.  The two bubble conventions:

    * ``bubble_wall``: the share of the p ranks' wall time spent idle.  Equal stages, GPipe/1F1B:
      (p-1)/(m+p-1).
    * ``bubble_ideal``: idle time over useful time of the busiest rank, the convention of the
      Megatron paper and the lecture.  Equal stages, GPipe/1F1B: (p-1)/m.
    """
    t0 = min((e.start for e in events), default=0.0)
    shifted = sorted(
        (Event(e.rank, e.kind, e.stage, e.microbatch, e.start - t0, e.end - t0) for e in events),
        key=lambda e: (e.start, e.rank, e.end),
    )
    makespan = max((e.end for e in shifted), default=0.0)
    busy = [0.0] * p
    for e in shifted:
        if not 0 <= e.rank < p:
            raise ValueError(f"event {e} has rank {e.rank} outside 0..{p - 1}")
        busy[e.rank] += e.end - e.start
    if makespan > 0:
        bubble_wall = 1.0 - sum(busy) / (p * makespan)
        top = max(busy)
        bubble_ideal = (makespan - top) / top if top > 0 else 0.0
    else:  # nothing ran (or took no time): no idle time either
        bubble_wall = bubble_ideal = 0.0
    return Timeline(events=shifted, p=p, m=m, v=v, makespan=makespan, busy=busy, bubble_wall=bubble_wall,
                    bubble_ideal=bubble_ideal, utilisation=1.0 - bubble_wall)


def uniform(tf: float, tb: float, tw: float | None = None) -> DurationFn:
    """Every stage takes ``tf`` forward and ``tb`` backward.  A split backward takes ``tw`` for BW
    (default tb/2) and the rest, ``tb - tw``, for BI, so BI + BW always costs a full B."""
    w = tb / 2 if tw is None else tw
    if not 0 <= w <= tb:
        raise ValueError(f"weight-gradient time tw={w} must be between 0 and tb={tb}")
    table = {"F": tf, "B": tb, "BI": tb - w, "BW": w}

    def duration(stage: int, kind: str) -> float:
        return table[kind]

    return duration


def _duration_fn(durations: dict[tuple[int, str], float] | DurationFn | None, tf: float, tb: float,
                 v: int) -> DurationFn:
    if durations is None:
        # tf and tb are the times of a whole pipeline stage; with v chunks per rank each chunk is 1/v
        # of it, so the totals (and the bubbles) compare directly with v = 1.
        return uniform(tf / v, tb / v)
    if callable(durations):
        return durations
    table = dict(durations)

    def lookup(stage: int, kind: str) -> float:
        if (stage, kind) in table:
            return table[(stage, kind)]
        if kind in ("BI", "BW"):
            # BI and BW default to halves of the stage's B (or of tb when B is not given either).
            return table.get((stage, "B"), tb / v) / 2
        raise ValueError(f"durations has no entry for (stage={stage}, kind={kind!r})")

    return lookup


def hop_times(transfer: float | Sequence[float], n_stages: int) -> list[float]:
    """`transfer` as one time per stage boundary (index s: between stages s and s + 1): a single time for every hop,
    or the sequence as given (`simulate` checks its length and signs)."""
    if isinstance(transfer, (int, float)):
        return [float(transfer)] * max(n_stages - 1, 0)
    return [float(t) for t in transfer]


def simulate(schedule: list[list[Action]], p: int, m: int, v: int = 1,
             durations: dict[tuple[int, str], float] | DurationFn | None = None,
             tf: float = 1.0, tb: float = 2.0, transfer: float | Sequence[float] = 0.0,
             blocking: bool = False) -> Timeline:
    """Predicted timeline of ``schedule``.

    ``durations`` maps (stage, kind) to seconds, or is a function of (stage, kind).  When None, every
    stage takes ``tf`` forward and ``tb`` backward, divided by v for interleaved schedules (see
    `_duration_fn`), and BI/BW take half of B each.  ``transfer`` is the delay between an action
    ending on one rank and a dependent action starting on another: one for every hop, or one per stage
    boundary (index s: between stages s and s + 1; a pipeline across nodes, whose hops inside a node are
    faster than those between nodes).  ``blocking``: a send holds its rank until it is delivered (the
    framework waits on each point-to-point call before its next compute, as Megatron's non-interleaved 1F1B
    and DeepSpeed's pipeline engine do), so an action whose output goes to another rank keeps that rank
    busy its hop longer; par3d's runtime posts its sends and waits at the end (the default, False).

    Raises ScheduleError if the schedule is incomplete, violates a dependency or deadlocks.
    """
    hops = hop_times(transfer, p * v)
    if len(hops) != max(p * v - 1, 0) or any(t < 0 for t in hops):
        raise ValueError(f"transfer time must be >= 0, one or one per stage boundary ({p * v - 1}), got {transfer}")
    dur = _duration_fn(durations, tf, tb, v)
    n_stages = p * v
    order = execution_order(schedule, p, m, v)  # validates, and gives a dependency-respecting order
    present = {(a.kind, a.stage, a.microbatch) for a in order}
    rank_of = placement(schedule)  # round-robin, or the V (the last stage back on rank 0)
    end: dict[tuple[str, int, int], float] = {}
    free = [0.0] * p
    events = []
    for a in order:
        r = rank_of[a.stage]
        start = free[r]
        for d in dependencies(a, n_stages, present):
            lag = 0.0 if rank_of[d[1]] == r else hops[min(d[1], a.stage)]
            start = max(start, end[d] + lag)
        t = float(dur(a.stage, a.kind))
        if t < 0:
            raise ValueError(f"negative duration {t} for {a}")
        end[(a.kind, a.stage, a.microbatch)] = start + t
        free[r] = start + t
        if blocking and (nb := sends_to(a.kind, a.stage, n_stages)) >= 0 and rank_of[nb] != r:
            free[r] = start + t + hops[min(nb, a.stage)]
        events.append(Event(r, a.kind, a.stage, a.microbatch, start, start + t))
    return timeline_from_events(events, p, m, v)
