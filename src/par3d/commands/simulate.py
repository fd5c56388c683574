"""`par3d simulate`: build a pipeline schedule, check it, time it, show the bubble.

Pure Python (no torch), so it answers instantly and works on any machine.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from par3d.pipeline.schedules import (
    SCHEDULES,
    CsvSchedule,
    ScheduleError,
    build,
    check,
    default_v,
    from_csv,
    peak_inflight,
    to_csv,
)
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
                        help="pipeline schedule (default: %(default)s); zb-v and dualpipe-v hold two chunks "
                             "per rank in a V (rank r: stages r and 2p-1-r)")
    parser.add_argument("--schedule-csv", metavar="FILE", default=None,
                        help="simulate this schedule instead of a built one: a compute-only CSV in "
                             "torch.distributed.pipelining's notation, one row per rank, cells like 0F1 "
                             "(stage 0, forward, micro-batch 1), 1I0 / 1W0 (input / weight half of a "
                             "backward), 2B3 (full backward); empty cells are bubbles.  p, m and v are read "
                             "from it (--stages, --microbatches, --virtual-stages, --schedule are ignored)")
    parser.add_argument("--to-csv", metavar="FILE", default=None,
                        help="write the schedule as such a CSV (loadable by --schedule-csv, par3d train "
                             "--schedule-csv, and torch's _PipelineScheduleRuntime._load_csv)")
    parser.add_argument("--stages", type=int, default=4,
                        help="pipeline parallel size p: number of pipeline ranks (default: %(default)s)")
    parser.add_argument("--microbatches", type=int, default=8,
                        help="micro-batches per step m (default: %(default)s)")
    parser.add_argument("--virtual-stages", type=int, default=None,
                        help="model chunks per rank v: >= 2 for 'interleaved', 2 for zb-v and dualpipe-v, "
                             "1 for the others (default: 2 for interleaved, zb-v, dualpipe-v, else 1)")
    parser.add_argument("--tf", type=float, default=1.0,
                        help="forward time of one whole pipeline stage per micro-batch; split evenly over "
                             "the v chunks when interleaved (default: %(default)s)")
    parser.add_argument("--tb", type=float, default=2.0,
                        help="backward time of one whole pipeline stage per micro-batch; with --tw, only its "
                             "input-gradient part (BI), the zero-bubble paper's T_B (default: %(default)s)")
    parser.add_argument("--tw", type=float, default=None,
                        help="weight-gradient (BW) time, the paper's T_W: a split backward is BI = --tb plus "
                             "BW = --tw, a full backward B = tb + tw (default: no split given; BI = BW = tb/2)")
    parser.add_argument("--held", type=float, default=1.0,
                        help="zb-v only: the share in (0, 1] of a chunk's activations its BI keeps for its BW (each "
                             "linear layer's input and output gradient), which zb-v's 2p-chunk memory cap counts; "
                             "par3d plan names the share it priced (default: %(default)s, a chunk whole until BW)")
    parser.add_argument("--head-held", type=float, default=None,
                        help="zb-v only: what the head's chunk keeps from its BI to its BW, in chunks' forwards (its "
                             "layers' share and the output layer's input and logits' gradient; may pass 1), which the "
                             "cap counts on rank 0 (default: --held)")
    parser.add_argument("--transfer", type=float, default=0.0,
                        help="time to send an activation or gradient between ranks (default: %(default)s)")
    parser.add_argument("--blocking-sends", action="store_true",
                        help="each send holds its rank until delivered, as Megatron's non-interleaved 1F1B and "
                             "DeepSpeed's pipeline engine wait on every point-to-point call (par3d plan "
                             "--p2p-blocking); default: sends posted and waited later, as par3d's runtime does")
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
    if args.tw is not None and not (math.isfinite(args.tw) and args.tw >= 0):
        raise _UsageError("--tw", f"must be a number >= 0, got {args.tw}")
    if not (math.isfinite(args.held) and 0 < args.held <= 1):
        raise _UsageError("--held", f"must be a share in (0, 1], got {args.held}")
    if args.held < 1 and (args.schedule_csv or args.schedule != "zb-v"):
        raise _UsageError("--held", "orders zb-v's actions only (its memory cap), and the schedule is "
                                    f"{'the file ' + repr(args.schedule_csv) if args.schedule_csv else repr(args.schedule)}"
                                    "; drop --held or use --schedule zb-v")
    if args.head_held is not None:
        if not (math.isfinite(args.head_held) and args.head_held > 0):
            raise _UsageError("--head-held", f"must be a positive number, got {args.head_held}")
        if args.schedule_csv or args.schedule != "zb-v":
            raise _UsageError("--head-held", "orders zb-v's actions only (its memory cap on rank 0), and the schedule "
                                             f"is {'the file ' + repr(args.schedule_csv) if args.schedule_csv else repr(args.schedule)}"
                                             "; drop --head-held or use --schedule zb-v")


def _times(args: argparse.Namespace) -> tuple[float, float, float]:
    """(forward, full backward, weight-gradient part of it) of one whole stage per micro-batch."""
    if args.tw is None:
        return args.tf, args.tb, args.tb / 2
    return args.tf, args.tb + args.tw, args.tw


def _chunk_times(args: argparse.Namespace, v: int) -> tuple[float, ...]:
    """(F, BI, BW) of one chunk, --held where below 1 and --head-held where it differs: what zb-v's list
    scheduling plans with."""
    tf, tb, tw = _times(args)
    times = (tf / v, (tb - tw) / v, tw / v)
    if args.head_held is not None and args.head_held != args.held:
        return times + (args.held, args.head_held)
    return times + (args.held,) if args.held < 1 else times


def _load_csv(path: str) -> CsvSchedule:
    try:
        with open(path, newline="") as fh:
            text = fh.read()
    except OSError as e:
        raise _UsageError("--schedule-csv", f"cannot read {path}: {e}") from None
    try:
        loaded = from_csv(text)
        loaded.check()
    except ScheduleError as e:
        raise _UsageError("--schedule-csv", f"{path} is not a valid schedule: {e}") from None
    return loaded


def _simulate(schedule: list, p: int, m: int, v: int, args: argparse.Namespace) -> tuple:
    tf, tb, tw = _times(args)
    report = check(schedule, p, m, v)
    tl = simulate(schedule, p, m, v, durations=uniform(tf / v, tb / v, tw / v), transfer=args.transfer,
                  blocking=args.blocking_sends)
    return report, tl


def comparison(args: argparse.Namespace, p: int, m: int) -> dict:
    """Every builder at this (p, m) and these times: bubble, makespan, peak activations.  Peak
    activations are counted in whole-stage micro-batches (a chunk's are 1/v of a stage's), so
    schedules with different v compare directly; None where a builder cannot run (m % p for
    interleaved, m < 2p for dualpipe-v)."""
    rows: dict = {}
    for name in SCHEDULES:
        v = default_v(name)
        try:
            sched = build(name, p, m, v, times=_chunk_times(args, v))
        except ScheduleError as e:
            rows[name] = {"error": str(e)}
            continue
        report, tl = _simulate(sched, p, m, v, args)
        rows[name] = {"v": v, "makespan": tl.makespan, "bubble_wall": tl.bubble_wall,
                      "bubble_ideal": tl.bubble_ideal,
                      "peak_activations": max(report.peak_inflight) / v}
    return rows


def _result(args: argparse.Namespace) -> dict:
    _validate(args)
    if args.schedule_csv:
        loaded = _load_csv(args.schedule_csv)
        schedule, p, m, v = loaded.schedule, loaded.p, loaded.m, loaded.v
        name = "csv"
    else:
        p, m, v = args.stages, args.microbatches, args.virtual_stages
        name = args.schedule
        if v is None:
            v = default_v(name)
        try:
            schedule = build(name, p, m, v, times=_chunk_times(args, v))
        except ScheduleError as e:
            raise _UsageError(_FLAG.get(e.param or "", "--schedule"), str(e)) from None
    report, tl = _simulate(schedule, p, m, v, args)
    tf, tb, tw = _times(args)
    out = {"schedule": name, "p": p, "m": m, "v": v, "tf": tf, "tb": tb, "tw": tw, "held": args.held,
           "head_held": args.held if args.head_held is None else args.head_held,
           "transfer": args.transfer, "blocking_sends": args.blocking_sends}
    if args.schedule_csv:
        out["schedule_csv"] = args.schedule_csv
    out.update({k: val for k, val in tl.to_dict().items() if k not in ("p", "m", "v", "events")})
    out["peak_inflight"] = report.peak_inflight
    out["peak_activations"] = [x / v for x in peak_inflight(schedule)]
    # Closed forms for GPipe/1F1B with equal stages and no transfer time; interleaving divides the
    # warm-up by v, i.e. m becomes v*m.  zb-h1 beats them: its bubble is about a third of 1F1B's.
    out["ideal_formula"] = {"wall": (p - 1) / (v * m + p - 1), "lecture": (p - 1) / (v * m)}
    out["comparison"] = comparison(args, p, m)
    out["events"] = [e.to_dict() for e in tl.events]
    out["_timeline"] = tl
    out["_schedule"] = schedule
    return out


def _report(res: dict) -> str:
    from par3d.trace import gantt_text

    tl = res["_timeline"]
    pct = "{:.2%}".format
    tw = f" (BI {res['tb'] - res['tw']:g} + BW {res['tw']:g})"
    vm, vm_wall = ("(v*m)", "v*m") if res["v"] > 1 else ("m", "m")
    lines = [
        f"schedule {res['schedule']}: p={res['p']} stages, m={res['m']} micro-batches, v={res['v']} chunk(s) per rank",
        f"times: tf={res['tf']:g} tb={res['tb']:g}{tw} transfer={res['transfer']:g} (per whole stage)"
        + (", blocking sends" if res["blocking_sends"] else ""),
        f"makespan            {res['makespan']:g}",
        f"bubble, wall time   {pct(res['bubble_wall']):>7}   (p-1)/({vm_wall}+p-1) = {pct(res['ideal_formula']['wall'])}",
        f"bubble, lecture     {pct(res['bubble_ideal']):>7}   (p-1)/{vm} = {pct(res['ideal_formula']['lecture'])}",
        f"utilisation         {pct(res['utilisation']):>7}",
        f"peak in-flight micro-batches per rank: {res['peak_inflight']}",
        "",
        gantt_text(tl),
        "",
        f"every schedule at p={res['p']}, m={res['m']} and these times "
        "(peak activations: in micro-batches of one whole stage):",
        f"  {'schedule':<12} {'v':>2} {'makespan':>9} {'bubble':>8} {'peak act.':>9}",
    ]
    for name, row in res["comparison"].items():
        if "error" in row:
            lines.append(f"  {name:<12} -- {row['error']}")
        else:
            lines.append(f"  {name:<12} {row['v']:>2} {row['makespan']:>9g} {pct(row['bubble_wall']):>8} "
                         f"{row['peak_activations']:>9g}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        res = _result(args)
    except _UsageError as e:
        print(f"par3d simulate: error: {e}", file=sys.stderr)
        return 2
    tl = res.pop("_timeline")
    schedule = res.pop("_schedule")
    labelled = {f"simulated {res['schedule']} p={res['p']} m={res['m']} v={res['v']}": tl.events}
    try:
        if args.to_csv:
            with open(args.to_csv, "w", newline="") as fh:
                fh.write(to_csv(schedule))
        if args.trace_out:
            from par3d.trace import write_chrome_trace

            write_chrome_trace(labelled, args.trace_out)
        if args.out:
            from par3d.trace import gantt_png

            gantt_png(labelled, args.out, title=f"{res['schedule']}: bubble {res['bubble_wall']:.1%} of wall time")
    except OSError as e:
        names = {args.out: "--out", args.to_csv: "--to-csv"}
        flag = names.get(getattr(e, "filename", None), "--trace-out")
        print(f"par3d simulate: error: {flag}: cannot write file: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(res))
    else:
        res["_timeline"] = tl
        print(_report(res))
        for flag, path in (("Gantt chart", args.out), ("trace", args.trace_out), ("schedule CSV", args.to_csv)):
            if path:
                print(f"{flag} written to {path}")
    return 0
