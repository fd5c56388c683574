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
import sys
from typing import Any

from par3d.argtypes import int_at_least
from par3d.commands.bench import default_out


def register(bsub: Any) -> None:
    ap = bsub.add_parser("synthetic", help="pipeline runtime overhead with waiting stages (seed 3.3)",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", type=int_at_least(1), default=4, help="pipeline stages p (default 4)")
    ap.add_argument("--microbatches", type=int_at_least(1), default=8, help="micro-batches m (default 8)")
    ap.add_argument("--tf", type=float, default=2.0, help="forward wait per stage and micro-batch, ms")
    ap.add_argument("--tb", type=float, default=2.0, help="backward wait per stage and micro-batch, ms")
    ap.add_argument("--schedules", default="gpipe,1f1b", help="comma-separated schedules (default gpipe,1f1b)")
    ap.add_argument("--steps", type=int_at_least(2), default=20, help="steps per schedule; the first is discarded")
    ap.add_argument("--out", default=default_out("synthetic"), metavar="FILE",
                    help=f"results file (JSON; default {default_out('synthetic')}); the committed results "
                         "change only when given explicitly, e.g. --out benchmarks/results/synthetic.json")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.set_defaults(func=run)


def measure(schedule: str, p: int, m: int, tf: float, tb: float, steps: int) -> dict[str, Any]:
    """One schedule's run (the probe `par3d calibrate` also uses for the pipeline hop)."""
    from par3d.calibrate.probes import measure_synthetic

    return measure_synthetic(schedule, p, m, tf, tb, steps)


def run(args: argparse.Namespace) -> int:
    rows = [measure(s.strip(), args.stages, args.microbatches, args.tf, args.tb, args.steps)
            for s in args.schedules.split(",") if s.strip()]
    out = {"rows": rows, "cpu_count": os.cpu_count()}
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
    print(f"wrote {args.out}", file=sys.stderr if args.json else sys.stdout)
    return 0
