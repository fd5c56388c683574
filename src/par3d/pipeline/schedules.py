"""Pipeline schedules as data, and a checker for them.

A schedule is, for every pipeline rank, the ordered list of `Action`s that rank executes.  The same
lists are checked here, timed by `simulate.py` and executed by `runtime.py`, so the bubble the
planner predicts is the bubble of the order the runtime really follows.

Stages are *global* (virtual) stage indices ``0 .. p*v-1``.  Stage ``s`` lives on pipeline rank
``s % p`` as model chunk ``s // p``; with ``v == 1`` the stage index is simply the rank.

This module is pure Python: it must never import torch (the planner and the CLI import it).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

KINDS = ("F", "B", "BI", "BW")
"""F: forward.  B: full backward.  BI / BW: the input-gradient and weight-gradient halves of B,
used by zero-bubble schedules; a (stage, micro-batch) uses either B or the pair BI + BW."""

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")


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
    """Pipeline rank that holds global stage ``stage`` (stages are dealt round-robin)."""
    return stage % p


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

    def unit(k: int, forward: bool) -> tuple[int, int]:
        group = k % (p * v)
        chunk = group // p if forward else v - 1 - group // p
        mb = (k // (p * v)) * p + k % p
        return chunk, mb

    out = []
    for r in range(p):
        warm = min(2 * (p - r - 1) + (v - 1) * p, total)
        acts: list[Action] = []

        def fwd(k: int, r: int = r) -> Action:
            c, i = unit(k, True)
            return Action("F", c * p + r, i)

        def bwd(k: int, r: int = r) -> Action:
            c, i = unit(k, False)
            return Action("B", c * p + r, i)

        acts += [fwd(k) for k in range(warm)]
        for k in range(total - warm):
            acts += [fwd(warm + k), bwd(k)]
        acts += [bwd(k) for k in range(total - warm, total)]
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


def build(name: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """Build a schedule by name: one of SCHEDULES.  Raises ScheduleError for impossible requests."""
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}; valid schedules: {', '.join(SCHEDULES)}",
                            param="name")
    _require(p, m)
    if name == "interleaved":
        return interleaved(p, m, v)
    if v != 1:
        raise ScheduleError(f"schedule {name!r} runs one model chunk per rank (v=1), got v={v}; "
                            "use the 'interleaved' schedule for v > 1", param="v")
    if name == "gpipe":
        return gpipe(p, m)
    if name == "1f1b":
        return one_f_one_b(p, m)
    return zero_bubble_h1(p, m)


# --------------------------------------------------------------------------------------------
# Dependencies, execution order and the checker
# --------------------------------------------------------------------------------------------

Key = tuple[str, int, int]  # (kind, stage, microbatch)


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


def _validate(schedule: list[list[Action]], p: int, m: int, v: int) -> set[Key]:
    """Every action well formed, on the right rank, exactly once; returns the set of keys."""
    if p < 1 or m < 1 or v < 1:
        raise ScheduleError(f"bad schedule shape p={p}, m={m}, v={v}: all must be >= 1")
    if len(schedule) != p:
        raise ScheduleError(f"schedule has {len(schedule)} rank lists, expected p={p}")
    n_stages = p * v
    seen: set[Key] = set()
    for r, acts in enumerate(schedule):
        for a in acts:
            if a.kind not in KINDS:
                raise ScheduleError(f"rank {r}: {a} has unknown kind; kinds are {KINDS}")
            if not 0 <= a.stage < n_stages:
                raise ScheduleError(f"rank {r}: {a} has a stage outside 0..{n_stages - 1}")
            if not 0 <= a.microbatch < m:
                raise ScheduleError(f"rank {r}: {a} has a micro-batch outside 0..{m - 1}")
            if stage_rank(a.stage, p) != r:
                raise ScheduleError(f"rank {r}: {a} belongs on rank {stage_rank(a.stage, p)}")
            if _key(a) in seen:
                raise ScheduleError(f"rank {r}: {a} is duplicated")
            seen.add(_key(a))
    for s in range(n_stages):
        for i in range(m):
            where = f"stage {s} (rank {stage_rank(s, p)}), micro-batch {i}"
            if ("F", s, i) not in seen:
                raise ScheduleError(f"missing F for {where}")
            has_b = ("B", s, i) in seen
            has_bi, has_bw = ("BI", s, i) in seen, ("BW", s, i) in seen
            if has_b and (has_bi or has_bw):
                raise ScheduleError(f"{where} has both B and a BI/BW split; use one or the other")
            if not has_b and not (has_bi and has_bw):
                missing = "B" if not (has_bi or has_bw) else ("BW" if has_bi else "BI")
                raise ScheduleError(f"missing {missing} for {where}")
    return seen


def execution_order(schedule: list[list[Action]], p: int, m: int, v: int = 1) -> list[Action]:
    """A global order in which the per-rank lists can run, each rank strictly in its own order and
    every action after the actions it depends on.  Raises ScheduleError for a violated same-rank
    dependency or for a deadlock (no rank can make progress before all are done).

    This models blocking point-to-point transfers: a rank that reaches an action whose input is not
    produced yet waits there, and cannot skip ahead.
    """
    present = _validate(schedule, p, m, v)
    n_stages = p * v
    position = {_key(a): (r, j) for r, acts in enumerate(schedule) for j, a in enumerate(acts)}
    # Same-rank ordering mistakes get a precise message before the deadlock search.
    for r, acts in enumerate(schedule):
        for j, a in enumerate(acts):
            for d in dependencies(a, n_stages, present):
                dr, dj = position[d]
                if dr == r and dj > j:
                    raise ScheduleError(
                        f"dependency violated on rank {r}: {a} (position {j}) needs "
                        f"{Action(*d)} which comes later (position {dj})")
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
                    waits = [str(Action(*d)) for d in dependencies(a, n_stages, present) if d not in done]
                    stuck.append(f"rank {r} blocked at {a} waiting for {', '.join(waits)}")
            raise ScheduleError("deadlock: " + "; ".join(stuck))
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


def check(schedule: list[list[Action]], p: int, m: int, v: int = 1) -> CheckReport:
    """Check completeness, dependencies and deadlock-freedom; report peak in-flight activations.

    Raises ScheduleError naming the offending action.
    """
    execution_order(schedule, p, m, v)
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
    receiver needs them (its action order).  Returns one line per violation; [] means safe."""
    last = p * v - 1
    sent: dict[tuple[str, int, int], list[tuple[int, int]]] = {}
    needed: dict[tuple[str, int, int], list[tuple[int, int]]] = {}
    for r, acts in enumerate(schedule):
        for a in acts:
            s, i = a.stage, a.microbatch
            if a.kind == "F" and s < last:
                sent.setdefault(("act", r, stage_rank(s + 1, p)), []).append((s + 1, i))
            if a.kind == "F" and s > 0:
                needed.setdefault(("act", stage_rank(s - 1, p), r), []).append((s, i))
            if a.kind in ("B", "BI") and s > 0:
                sent.setdefault(("grad", r, stage_rank(s - 1, p)), []).append((s - 1, i))
            if a.kind in ("B", "BI") and s < last:
                needed.setdefault(("grad", stage_rank(s + 1, p), r), []).append((s, i))
    problems = []
    for key in sorted(set(sent) | set(needed)):
        if sent.get(key, []) != needed.get(key, []):
            ch, src, dst = key
            problems.append(f"{ch} channel {src}->{dst}: sent {sent.get(key, [])[:6]}..., "
                            f"received {needed.get(key, [])[:6]}...")
    return problems
