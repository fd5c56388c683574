"""What binds ZB-V's order when a transfer separates the ranks (issue 12's sixty-fourth round; docs/planner.md §6).

par3d builds ZB-V by list scheduling for the chunk times alone (`schedules.zero_bubble_v`); the Zero Bubble authors'
runtime also knows the transfer.  This script builds greedy variants of that list scheduler -- told the transfer, with
slots of the 2p-chunk memory cap kept for the returning chunk's forward, weight gradients put ahead of forwards near
the cap, a start tolerance in favour of the input gradient, the embedding-only first chunk left out of the count, and
the cap itself raised -- and simulates every order with `pipeline/simulate.py` at the chunk times and transfer the
planner prices for three of the Zero Bubble paper's ZB-V rows, and on a grid of uniform cases.  It changes nothing in
par3d; it is the record behind the figures docs/planner.md quotes.  Since the sixty-fifth round par3d's order counts a
chunk after its BI at the share of its activations BI keeps for BW (`schedules.zero_bubble_v`'s fourth time,
`memory.weight_grad_share`); the rows report that order beside the one before it (whole until BW), and two variants
with the share.

    python benchmarks/zbv_cap.py [--out benchmarks/results/zbv_cap.json]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
from collections import deque

from par3d.pipeline.schedules import Action, ScheduleError, v_stage_rank, zero_bubble_v
from par3d.pipeline.simulate import simulate
from par3d.plan import cost, validation

ROWS = ("zb-28.3b-32gpu-b2-m96-zbv-t6", "zb-14.6b-24gpu-b2-m72-zbv-t6", "zb-6.2b-16gpu-b6-m48-zbv-t6")


def greedy_v(p: int, m: int, times: tuple[float, float, float], transfer: float = 0.0, reserve: int = 0,
             extra_cap: int = 0, bw_near_cap: int = -1, tolerance: float = 0.0,
             free_first_chunk: bool = False, held: float = 1.0) -> list[list[Action]]:
    """`schedules.zero_bubble_v`'s list scheduler with the variants' knobs (all off: the same order).

    transfer: the lag of a dependency between ranks, in the builder's clock; reserve: cap slots a rank's first chunk
    may not take (kept for the second chunk's forward); extra_cap: chunks added to the 2p cap; bw_near_cap >= 0: a
    pending BW goes ahead of forwards once the rank holds cap - bw_near_cap chunks; tolerance: a forward or BW is
    keyed this much later than its start, so an input gradient starting within it goes first; free_first_chunk:
    stage 0's activations (the embedding alone in the paper's runs) left out of the count; held: the share of a
    chunk's count its BI keeps until its BW (`schedules.zero_bubble_v`'s fourth time, since the sixty-fifth round)."""
    tf, tbi, tbw = times
    dur = {"F": tf, "BI": tbi, "BW": tbw}
    limit = 2 * p + extra_cap
    stages = [(r, 2 * p - 1 - r) for r in range(p)]
    last = 2 * p - 1
    rank_of = [v_stage_rank(s, p) for s in range(2 * p)]
    f_end: list[list[float | None]] = [[None] * m for _ in range(2 * p)]
    bi_end: list[list[float | None]] = [[None] * m for _ in range(2 * p)]
    out: list[list[Action]] = [[] for _ in range(p)]
    nf = [[0, 0] for _ in range(p)]
    nb = [[0, 0] for _ in range(p)]
    pending: list[deque[tuple[int, int]]] = [deque() for _ in range(p)]
    live, free, version = [0.0] * p, [0.0] * p, [0] * p
    heap: list[tuple] = []

    def lag(a: int, b: int) -> float:
        return 0.0 if rank_of[a] == rank_of[b] else transfer

    def weight(stage: int) -> int:
        return 0 if free_first_chunk and stage == 0 else 1

    def offer(r: int, over_cap: bool = False) -> None:
        ver = version[r] = version[r] + 1
        best = None
        fr = free[r]
        for ch in (1, 0):
            st, i = stages[r][ch], nb[r][ch]
            if i < m and f_end[st][i] is not None:
                e2 = fr if st == last else bi_end[st + 1][i]
                if e2 is not None:
                    t = max(fr, f_end[st][i], e2 + (lag(st, st + 1) if st < last else 0.0))  # type: ignore[type-var]
                    key = (t, 0, i, -ch, r, ver, "BI", ch, t)
                    best = key if best is None or key < best else best
            i = nf[r][ch]
            if i < m and (live[r] + 1 <= limit - (reserve if ch == 0 else 0) + 1e-9 or over_cap):
                e = fr if st == 0 else f_end[st - 1][i]
                if e is not None:
                    t = max(fr, e + (lag(st - 1, st) if st > 0 else 0.0))
                    key = (t + tolerance, 1, i, -ch, r, ver, "F", ch, t)
                    best = key if best is None or key < best else best
        if pending[r]:
            ch, i = pending[r][0]
            t = max(fr, bi_end[stages[r][ch]][i])  # type: ignore[type-var]
            near = bw_near_cap >= 0 and live[r] >= limit - bw_near_cap - 1e-9
            key = (t if near else t + tolerance, 0.5 if near else 2, i, -ch, r, ver, "BW", ch, t)
            best = key if best is None or key < best else best
        if best is not None:
            heapq.heappush(heap, best)

    for r in range(p):
        offer(r)
    for _ in range(6 * p * m):
        while heap and heap[0][5] != version[heap[0][4]]:
            heapq.heappop(heap)
        capped = not heap
        if capped:  # every rank waits behind the cap: one forward past it, as zero_bubble_v does
            for r in range(p):
                offer(r, over_cap=True)
            while heap and heap[0][5] != version[heap[0][4]]:
                heapq.heappop(heap)
        if not heap:
            raise ScheduleError(f"greedy_v: nothing to run for p={p}, m={m}")
        _, _, i, _, r, _, kind, ch, t = heapq.heappop(heap)
        st = stages[r][ch]
        stop = free[r] = t + dur[kind]
        other = -1
        if kind == "F":
            nf[r][ch] += 1
            live[r] += weight(st)
            f_end[st][i] = stop
            other = rank_of[st + 1] if st < last else -1
        elif kind == "BI":
            nb[r][ch] += 1
            live[r] -= weight(st) * (1.0 - held)
            pending[r].append((ch, i))
            bi_end[st][i] = stop
            other = rank_of[st - 1] if st > 0 else -1
        else:
            pending[r].popleft()
            live[r] -= weight(st) * held
        out[r].append(Action(kind, st, i))
        for d in (range(p) if capped else {r, other} - {-1}):
            offer(d)
    return out


VARIANTS = {  # name: greedy_v's knobs, the transfer given as a multiple of the row's; "held": "row" the row's share
    "transfer-blind (par3d)": {},
    "transfer-blind, BI keeps the held share (par3d since the sixty-fifth round)": {"held": "row"},
    "told the transfer, BI keeps the held share": {"told": 1.0, "held": "row"},
    "told the transfer": {"told": 1.0},
    "told, one slot reserved": {"told": 1.0, "reserve": 1},
    "told, one slot reserved, cap 3p": {"told": 1.0, "reserve": 1, "extra_cap": "p"},
    "transfer-blind, cap 3p": {"extra_cap": "p"},
}
AT_CAP = [dict(zip(("bw_near_cap", "reserve", "told", "tolerance", "free_first_chunk"), k))
          for k in itertools.product((-1, 0, 2, 8), (0, 1, 2, 4, 8), (0.0, 1.0), (0.0, 1.0), (False, True))]


def _order(p: int, m: int, times: tuple[float, ...], transfer: float, knobs: dict) -> list[list[Action]]:
    k = dict(knobs)
    if k.get("held") == "row":
        k["held"] = times[3] if len(times) > 3 else 1.0
    told = k.pop("told", 0.0) * transfer
    tol = k.pop("tolerance", 0.0) * transfer
    if k.get("extra_cap") == "p":
        k["extra_cap"] = p
    return greedy_v(p, m, times[:3], transfer=told, tolerance=tol, **k)


def rows_report() -> list[dict]:
    by_name = {r["name"]: r for r in validation.rows()}
    out = []
    for name in ROWS:
        row = by_name[name]
        c = validation.predict(row).plan.choice
        st = cost.stage_times(validation.model_of(row), validation.cluster_of(row), c)
        dur = cost.durations_of(st, c.schedule)
        times = cost.zbv_times(st, c)
        assert times is not None
        p, m, tr = c.pp, c.microbatches, st.transfer
        f = dur[(1, "F")]  # the builder's clock is in units of F

        def makespan(order: list[list[Action]], dur: dict = dur, p: int = p, m: int = m, tr: float = tr) -> float:
            return simulate(order, p, m, 2, durations=dur, transfer=tr).makespan

        base = makespan(zero_bubble_v(p, m, times[:3]))  # the order before the sixty-fifth round: whole until BW
        now = makespan(zero_bubble_v(p, m, times))
        got = {name_: makespan(_order(p, m, times, tr / f, knobs)) for name_, knobs in VARIANTS.items()}
        assert abs(got["transfer-blind (par3d)"] - base) < 1e-9 * base  # all knobs off: par3d's own order
        held_name = "transfer-blind, BI keeps the held share (par3d since the sixty-fifth round)"
        assert abs(got[held_name] - now) < 1e-9 * now  # and with the row's share, par3d's order now
        at_cap = min(makespan(_order(p, m, times, tr / f, k)) for k in AT_CAP)
        out.append({"row": name, "p": p, "m": m, "times": list(times), "transfer_over_f": round(tr / f, 4),
                    "held_vs_blind_pct": round(100 * (now - base) / base, 2),
                    "makespan_s": {k: round(v, 4) for k, v in got.items()},
                    "best_greedy_at_cap_s": round(at_cap, 4),
                    "best_greedy_at_cap_vs_blind_pct": round(100 * (at_cap - base) / base, 2),
                    "cap_3p_told_vs_blind_pct": round(100 * (got["told, one slot reserved, cap 3p"] - base) / base, 2)})
    return out


def grid_report() -> dict:
    """Uniform cases: each order's makespan over a simple bound, max over ranks of r(F + c) + 2m(F + BI + BW)."""
    worst: dict[str, float] = {}
    for p, mult, times, cf in itertools.product((4, 8, 16, 32), (2, 4), ((1.0, 1.0, 0.8), (1.0, 1.2, 0.85)),
                                                (0.05, 0.14, 0.3)):
        m = mult * p
        dur = {(s, k): v for s in range(2 * p) for k, v in zip(("F", "BI", "BW"), times)}
        bound = max(r * (times[0] + cf) + 2 * m * sum(times) for r in range(p))
        for name, knobs in VARIANTS.items():
            if "cap 3p" in name or "held" in knobs:  # (uniform cases carry no held share)
                continue
            ms = simulate(_order(p, m, times, cf, knobs), p, m, 2, durations=dur, transfer=cf).makespan
            worst[name] = max(worst.get(name, 0.0), ms / bound)
    return {k: round(v, 3) for k, v in worst.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="also write the results as JSON to this file")
    args = ap.parse_args()
    res = {"rows": rows_report(), "grid_worst_over_bound": grid_report()}
    print(json.dumps(res, indent=1))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)
            fh.write("\n")


if __name__ == "__main__":
    main()
