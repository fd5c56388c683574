"""`par3d bench synthetic`: the seed's section 3.3 experiment on real processes.

Each pipeline stage "computes" by waiting t_f / t_b milliseconds instead of running a model; the
activations and gradients still travel between processes.  With equal stages the schedule alone
gives a step of (m+p-1)(t_f+t_b) and a wall-time bubble of (p-1)/(m+p-1); whatever the run
measures beyond that is the runtime's own overhead (transfers, Python, waking up).

Reported per schedule: the measured pipeline makespan (first action start to last action end,
median over steps) vs (m+p-1)(t_f+t_b), and the measured bubble vs the simulated one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any


def register(bsub: Any) -> None:
    ap = bsub.add_parser("synthetic", help="pipeline runtime overhead with waiting stages (seed 3.3)",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", type=int, default=4, help="pipeline stages p (default 4)")
    ap.add_argument("--microbatches", type=int, default=8, help="micro-batches m (default 8)")
    ap.add_argument("--tf", type=float, default=2.0, help="forward wait per stage and micro-batch, ms")
    ap.add_argument("--tb", type=float, default=2.0, help="backward wait per stage and micro-batch, ms")
    ap.add_argument("--schedules", default="gpipe,1f1b", help="comma-separated schedules (default gpipe,1f1b)")
    ap.add_argument("--steps", type=int, default=20, help="steps per schedule; the first is discarded")
    ap.add_argument("--out", default="benchmarks/results/synthetic.json", help="results file (JSON)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.set_defaults(func=run)


def measure(schedule: str, p: int, m: int, tf: float, tb: float, steps: int) -> dict[str, Any]:
    from par3d.config import RunConfig
    from par3d.pipeline.schedules import build
    from par3d.pipeline.simulate import Event, simulate, timeline_from_events
    from par3d.train import RunOptions
    from par3d.train import run as train_run

    cfg = RunConfig()
    cfg.model.layers, cfg.model.hidden, cfg.model.heads, cfg.model.seq_len = p, 8, 2, 8
    cfg.parallel.pp, cfg.parallel.schedule, cfg.parallel.microbatches = p, schedule, m
    cfg.train.global_batch, cfg.train.micro_batch, cfg.train.steps = m, 1, steps
    cfg.synthetic_stage_ms = (tf, tb)
    cfg.progress = False
    results = train_run(cfg, RunOptions(all_events=True))
    r0 = next(r for r in results if r["rank"] == 0)
    spans, bubbles = [], []
    for step in range(1, steps):
        events = [Event.from_dict(e) for w in r0["world"] for e in w["events_by_step"][step]]
        tl = timeline_from_events(events, p, m)
        spans.append(tl.makespan)
        bubbles.append(tl.bubble_wall)
    sim = simulate(build(schedule, p, m), p, m, tf=tf / 1e3, tb=tb / 1e3)
    formula = (m + p - 1) * (tf + tb) / 1e3
    makespan = statistics.median(spans)
    bubble = statistics.median(bubbles)
    return {"schedule": schedule, "p": p, "m": m, "tf_ms": tf, "tb_ms": tb,
            "measured_makespan_s": makespan, "formula_makespan_s": formula,
            "makespan_excess": makespan / formula - 1,
            "measured_bubble_wall": bubble, "simulated_bubble_wall": sim.bubble_wall,
            "bubble_gap_pp": 100 * (bubble - sim.bubble_wall),
            "median_step_time_s": statistics.median(h["step_time_s"] for h in r0["history"][1:])}


def run(args: argparse.Namespace) -> int:
    rows = [measure(s.strip(), args.stages, args.microbatches, args.tf, args.tb, args.steps)
            for s in args.schedules.split(",") if s.strip()]
    out = {"rows": rows, "cpu_count": os.cpu_count()}
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=2)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{'schedule':10s} {'makespan':>10s} {'(m+p-1)(tf+tb)':>15s} {'excess':>8s} "
              f"{'bubble':>8s} {'simulated':>9s} {'gap':>7s}")
        for r in rows:
            print(f"{r['schedule']:10s} {r['measured_makespan_s'] * 1e3:8.2f}ms {r['formula_makespan_s'] * 1e3:13.2f}ms "
                  f"{r['makespan_excess']:8.1%} {r['measured_bubble_wall']:8.1%} {r['simulated_bubble_wall']:9.1%} "
                  f"{r['bubble_gap_pp']:+6.2f}pp", file=sys.stdout)
    return 0
