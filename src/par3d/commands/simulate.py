"""`par3d simulate`: build a pipeline schedule, check it, time it, show the bubble.

Pure Python (no torch), so it answers instantly and works on any machine.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from par3d.pipeline.schedules import SCHEDULES, ScheduleError, build, check
from par3d.pipeline.simulate import simulate, uniform

# Which flag to blame for a ScheduleError about each request parameter.
_FLAG = {"p": "--stages", "m": "--microbatches", "v": "--virtual-stages", "name": "--schedule"}


class _UsageError(Exception):
    def __init__(self, flag: str, message: str):
        super().__init__(f"{flag}: {message}")


def register(sub) -> None:
    parser = sub.add_parser(
        "simulate",
        help="simulate a pipeline schedule: makespan, bubble, utilisation, Gantt chart",
        description="Build a pipeline schedule, check it (dependencies, deadlock, peak in-flight "
                    "micro-batches) and simulate it with given per-stage times. Reports the makespan and "
                    "the bubble in two conventions: the idle share of wall time, 1 - busy/(p*makespan), "
                    "and the lecture's idle time over the busiest rank's work, (p-1)/m for 1F1B.",
    )
    parser.add_argument("--schedule", choices=SCHEDULES, default="1f1b",
                        help="pipeline schedule (default: %(default)s)")
    parser.add_argument("--stages", type=int, default=4,
                        help="pipeline parallel size p: number of pipeline ranks (default: %(default)s)")
    parser.add_argument("--microbatches", type=int, default=8,
                        help="micro-batches per step m (default: %(default)s)")
    parser.add_argument("--virtual-stages", type=int, default=None,
                        help="model chunks per rank v: >= 2 for 'interleaved', 1 for the others "
                             "(default: 2 for interleaved, else 1)")
    parser.add_argument("--tf", type=float, default=1.0,
                        help="forward time of one whole pipeline stage per micro-batch; split evenly over "
                             "the v chunks when interleaved (default: %(default)s)")
    parser.add_argument("--tb", type=float, default=2.0,
                        help="backward time of one whole pipeline stage per micro-batch (default: %(default)s)")
    parser.add_argument("--tw", type=float, default=None,
                        help="zb-h1 only: weight-gradient (BW) part of --tb; the input-gradient part is tb - tw "
                             "(default: tb/2)")
    parser.add_argument("--transfer", type=float, default=0.0,
                        help="time to send an activation or gradient between ranks (default: %(default)s)")
    parser.add_argument("--out", metavar="PNG", default=None, help="write a Gantt chart to this PNG file")
    parser.add_argument("--trace-out", metavar="JSON", default=None,
                        help="write a Chrome/Perfetto trace (open in ui.perfetto.dev) to this file")
    parser.add_argument("--json", action="store_true",
                        help="print the result, with every event, as JSON instead of a report")
    parser.set_defaults(func=run)


def _validate(args: argparse.Namespace) -> None:
    for flag, value in (("--tf", args.tf), ("--tb", args.tb)):
        if not (math.isfinite(value) and value > 0):
            raise _UsageError(flag, f"must be a positive number, got {value}")
    if not (math.isfinite(args.transfer) and args.transfer >= 0):
        raise _UsageError("--transfer", f"must be a number >= 0, got {args.transfer}")
    if args.tw is not None:
        if args.schedule != "zb-h1":
            raise _UsageError("--tw", f"only applies to --schedule zb-h1 (got --schedule {args.schedule})")
        if not (math.isfinite(args.tw) and 0 <= args.tw <= args.tb):
            raise _UsageError("--tw", f"must be between 0 and --tb ({args.tb}), got {args.tw}")


def _result(args: argparse.Namespace) -> dict:
    _validate(args)
    p, m, v = args.stages, args.microbatches, args.virtual_stages
    if v is None:
        v = 2 if args.schedule == "interleaved" else 1
    try:
        schedule = build(args.schedule, p, m, v)
    except ScheduleError as e:
        raise _UsageError(_FLAG.get(e.param or "", "--schedule"), str(e)) from None
    report = check(schedule, p, m, v)
    durations = None if args.tw is None else uniform(args.tf / v, args.tb / v, args.tw / v)
    tl = simulate(schedule, p, m, v, durations=durations, tf=args.tf, tb=args.tb, transfer=args.transfer)
    out = {"schedule": args.schedule, "p": p, "m": m, "v": v,
           "tf": args.tf, "tb": args.tb, "tw": args.tb / 2 if args.tw is None else args.tw,
           "transfer": args.transfer}
    out.update({k: val for k, val in tl.to_dict().items() if k not in ("p", "m", "v", "events")})
    out["peak_inflight"] = report.peak_inflight
    # Closed forms for GPipe/1F1B with equal stages and no transfer time; interleaving divides the
    # warm-up by v, i.e. m becomes v*m.  zb-h1 beats them: its bubble is about a third of 1F1B's.
    out["ideal_formula"] = {"wall": (p - 1) / (v * m + p - 1), "lecture": (p - 1) / (v * m)}
    out["events"] = [e.to_dict() for e in tl.events]
    out["_timeline"] = tl
    return out


def _report(res: dict) -> str:
    from par3d.trace import gantt_text

    tl = res["_timeline"]
    pct = "{:.2%}".format
    tw = f" tw={res['tw']:g}" if res["schedule"] == "zb-h1" else ""
    vm, vm_wall = ("(v*m)", "v*m") if res["v"] > 1 else ("m", "m")
    lines = [
        f"schedule {res['schedule']}: p={res['p']} stages, m={res['m']} micro-batches, v={res['v']} chunk(s) per rank",
        f"times: tf={res['tf']:g} tb={res['tb']:g}{tw} transfer={res['transfer']:g} (per whole stage)",
        f"makespan            {res['makespan']:g}",
        f"bubble, wall time   {pct(res['bubble_wall']):>7}   (p-1)/({vm_wall}+p-1) = {pct(res['ideal_formula']['wall'])}",
        f"bubble, lecture     {pct(res['bubble_ideal']):>7}   (p-1)/{vm} = {pct(res['ideal_formula']['lecture'])}",
        f"utilisation         {pct(res['utilisation']):>7}",
        f"peak in-flight micro-batches per rank: {res['peak_inflight']}",
        "",
        gantt_text(tl),
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        res = _result(args)
    except _UsageError as e:
        print(f"par3d simulate: error: {e}", file=sys.stderr)
        return 2
    tl = res.pop("_timeline")
    labelled = {f"simulated {res['schedule']} p={res['p']} m={res['m']} v={res['v']}": tl.events}
    try:
        if args.trace_out:
            from par3d.trace import write_chrome_trace

            write_chrome_trace(labelled, args.trace_out)
        if args.out:
            from par3d.trace import gantt_png

            gantt_png(labelled, args.out, title=f"{res['schedule']}: bubble {res['bubble_wall']:.1%} of wall time")
    except OSError as e:
        flag = "--out" if args.out and getattr(e, "filename", None) == args.out else "--trace-out"
        print(f"par3d simulate: error: {flag}: cannot write file: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(res))
    else:
        res["_timeline"] = tl
        print(_report(res))
        for flag, path in (("Gantt chart", args.out), ("trace", args.trace_out)):
            if path:
                print(f"{flag} written to {path}")
    return 0
