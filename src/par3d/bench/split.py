"""`par3d bench split`: does the zero-bubble split backward pay for itself on this machine?

Two measurements, side by side in one run:

1. **BI + BW against B** (one process, one thread, as a pipeline rank runs).  One model chunk
   (`GPTStage`) does forward + full backward (B), and forward + BI + BW (`par3d.weight_grad`:
   BI defers the linear weight GEMMs, BW runs only them), in interleaved order A B B A ... so
   drift falls on both alike; per step the backward's wall time is taken (the forward is not
   timed).  Also timed, for the record: the split the runtime had before (BI = autograd
   restricted to the stage input with the graph kept, BW = a second walk for the weights).
   Reported: medians, (BI + BW) / B, and BW's share of the split (what the planner's T_W is).

2. **Schedules on the real runtime**: `par3d train`'s pipeline with 1f1b, zb-h1 and zb-v at the
   same p and m, runs alternated (1f1b, zb-h1, zb-v, zb-v, zb-h1, 1f1b, ...), the median step
   time of each and the median pipeline makespan (first action to last), next to what the
   simulator predicts for each schedule from the durations measured in the zb-h1 runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

from par3d.argtypes import int_at_least
from par3d.commands.bench import default_out


def register(bsub: Any) -> None:
    ap = bsub.add_parser("split", help="BI + BW against B, and zb-h1 / zb-v against 1f1b on the runtime",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int_at_least(1), default=256, help="hidden size of the timed chunk (default 256)")
    ap.add_argument("--layers", type=int_at_least(1), default=2, help="transformer blocks in the timed chunk (default 2)")
    ap.add_argument("--seq-len", type=int_at_least(1), default=64, help="tokens per sequence (default 64)")
    ap.add_argument("--micro-batch", type=int_at_least(1), default=4, help="sequences per micro-batch (default 4)")
    ap.add_argument("--steps", type=int_at_least(1), default=40, help="timed steps per side in part 1 (default 40)")
    ap.add_argument("--stages", type=int_at_least(1), default=2, help="pipeline ranks in part 2 (default 2)")
    ap.add_argument("--microbatches", type=int_at_least(1), default=8, help="micro-batches in part 2 (default 8)")
    ap.add_argument("--train-steps", type=int_at_least(3), default=12, help="steps per run in part 2; the first 2 are "
                                                                "discarded (default 12)")
    ap.add_argument("--repeats", type=int_at_least(1), default=3, help="runs per schedule in part 2 (default 3)")
    ap.add_argument("--schedules", default="1f1b,zb-h1,zb-v", help="part 2's schedules (default 1f1b,zb-h1,zb-v)")
    ap.add_argument("--skip-runtime", action="store_true", help="only part 1")
    ap.add_argument("--quick", action="store_true", help="a smoke run: few steps, one repeat")
    ap.add_argument("--out", default=default_out("split_backward"),
                    help="results file (JSON; default %(default)s; the committed one: "
                         "benchmarks/results/split_backward.json)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.set_defaults(func=run)


def _chunk(hidden: int, layers: int, seq_len: int) -> Any:
    from par3d.config import ModelConfig
    from par3d.mesh import Group
    from par3d.model import GPTStage, ModelContext

    mc = ModelConfig(vocab=256, seq_len=seq_len, layers=layers + 2, hidden=hidden, heads=max(1, hidden // 64))
    ctx = ModelContext(tp=Group("tp", [0], 0))
    # a middle chunk (blocks only): what most pipeline stages are
    return GPTStage(mc, ctx, 2, 2 + layers)


def backward_split(hidden: int, layers: int, seq_len: int, micro_batch: int, steps: int) -> dict[str, Any]:
    import torch

    from par3d import weight_grad

    torch.set_num_threads(1)
    torch.manual_seed(0)
    chunk = _chunk(hidden, layers, seq_len)
    x = torch.randn(micro_batch, seq_len, hidden)
    dy = torch.randn(micro_batch, seq_len, hidden)
    params = [q for q in chunk.parameters() if q.requires_grad]

    def fwd() -> tuple[Any, Any]:
        inp = x.detach().requires_grad_(True)
        return inp, chunk(inp)

    def full() -> float:
        _, out = fwd()
        t0 = time.perf_counter()
        torch.autograd.backward(out, dy)
        return time.perf_counter() - t0

    def split() -> tuple[float, float]:
        with weight_grad.splittable():
            _, out = fwd()
            store: list = []
            t0 = time.perf_counter()
            with weight_grad.deferring(store):
                torch.autograd.backward(out, dy)
            t1 = time.perf_counter()
            weight_grad.apply(store)
            return t1 - t0, time.perf_counter() - t1

    def rewalk() -> tuple[float, float]:  # the runtime's split before issue 17
        inp, out = fwd()
        t0 = time.perf_counter()
        torch.autograd.backward(out, dy, inputs=[inp], retain_graph=True)
        t1 = time.perf_counter()
        torch.autograd.backward(out, dy, inputs=params)
        return t1 - t0, time.perf_counter() - t1

    for _ in range(3):  # warm-up: allocator, caches
        full(), split(), rewalk()
    b, bi, bw, rbi, rbw = [], [], [], [], []
    for k in range(steps):
        order = ("full", "split", "rewalk") if k % 2 == 0 else ("rewalk", "split", "full")
        for what in order:
            for q in params:
                q.grad = None
            if what == "full":
                b.append(full())
            elif what == "split":
                i, w = split()
                bi.append(i)
                bw.append(w)
            else:
                i, w = rewalk()
                rbi.append(i)
                rbw.append(w)
    med = statistics.median
    s = [i + w for i, w in zip(bi, bw)]
    r = [i + w for i, w in zip(rbi, rbw)]
    return {"hidden": hidden, "layers": layers, "seq_len": seq_len, "micro_batch": micro_batch, "steps": steps,
            "b_s": med(b), "bi_s": med(bi), "bw_s": med(bw), "bi_plus_bw_s": med(s),
            "ratio_split_over_b": med(s) / med(b), "bw_share_of_split": med(bw) / med(s),
            "before_bi_s": med(rbi), "before_bw_s": med(rbw), "before_ratio_over_b": med(r) / med(b),
            "spread_b": (statistics.quantiles(b, n=4)[2] - statistics.quantiles(b, n=4)[0]) / med(b)}


def _train(schedule: str, p: int, m: int, steps: int, hidden: int, layers: int, seq_len: int,
           micro_batch: int) -> dict[str, Any]:
    from par3d.config import RunConfig
    from par3d.pipeline.simulate import Event, timeline_from_events
    from par3d.train import RunOptions
    from par3d.train import run as train_run

    cfg = RunConfig()
    cfg.model.layers, cfg.model.hidden, cfg.model.heads, cfg.model.seq_len = layers, hidden, hidden // 64, seq_len
    cfg.parallel.pp, cfg.parallel.schedule, cfg.parallel.microbatches = p, schedule, m
    cfg.train.global_batch, cfg.train.micro_batch, cfg.train.steps = m * micro_batch, micro_batch, steps
    cfg.train.warmup = 0
    cfg.progress = False
    cfg.validate()
    results = train_run(cfg, RunOptions(all_events=True))
    r0 = next(r for r in results if r["rank"] == 0)
    v = cfg.parallel.virtual_stages
    spans, events_of = [], {}
    for step in range(2, steps):
        events = [Event.from_dict(e) for w in r0["world"] for e in w["events_by_step"][step]]
        spans.append(timeline_from_events(events, p, m, v).makespan)
        events_of[step] = events
    return {"step_times": [h["step_time_s"] for h in r0["history"][2:]], "makespans": spans,
            "events": events_of[steps - 1], "v": v}


def runtime_schedules(names: list[str], p: int, m: int, steps: int, repeats: int, hidden: int, layers: int,
                      seq_len: int, micro_batch: int) -> dict[str, Any]:
    from par3d.pipeline.schedules import build, default_v
    from par3d.pipeline.simulate import simulate

    got: dict[str, dict[str, list]] = {n: {"step": [], "span": []} for n in names}
    durations: dict[tuple[str], list[float]] = {}
    for k in range(repeats):
        for name in (names if k % 2 == 0 else list(reversed(names))):
            res = _train(name, p, m, steps, hidden, layers, seq_len, micro_batch)
            got[name]["step"] += res["step_times"]
            got[name]["span"] += res["makespans"]
            if name == "zb-h1":
                for e in res["events"]:
                    durations.setdefault((e.kind,), []).append(e.end - e.start)
    med = statistics.median
    # per-kind medians of the zb-h1 runs (one stage's F, BI, BW), for every schedule's simulation
    t = {k[0]: med(v) for k, v in durations.items()}
    rows = {}
    for name in names:
        v = default_v(name)
        row: dict[str, Any] = {"median_step_s": med(got[name]["step"]), "median_makespan_s": med(got[name]["span"])}
        if t:
            tf, tb = t["F"], t["BI"] + t["BW"]
            times = (tf / v, t["BI"] / v, t["BW"] / v)

            def dur(stage: int, kind: str, v: int = v, tf: float = tf, tb: float = tb) -> float:
                return {"F": tf, "B": tb, "BI": t["BI"], "BW": t["BW"]}[kind] / v

            row["simulated_makespan_s"] = simulate(build(name, p, m, v, times=times), p, m, v, durations=dur).makespan
        rows[name] = row
    base = rows.get("1f1b")
    if base:
        for row in rows.values():
            row["step_vs_1f1b"] = row["median_step_s"] / base["median_step_s"]
            row["makespan_vs_1f1b"] = row["median_makespan_s"] / base["median_makespan_s"]
            if "simulated_makespan_s" in row:
                row["simulated_vs_1f1b"] = row["simulated_makespan_s"] / base["simulated_makespan_s"]
    return {"p": p, "m": m, "hidden": hidden, "layers": layers, "seq_len": seq_len, "micro_batch": micro_batch,
            "steps_per_run": steps, "repeats": repeats, "measured_zb_h1_durations_s": t, "rows": rows}


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.steps, args.train_steps, args.repeats = 6, 4, 1
    out: dict[str, Any] = {"cpu_count": os.cpu_count(), "quick": bool(args.quick)}
    out["backward"] = backward_split(args.hidden, args.layers, args.seq_len, args.micro_batch, args.steps)
    if not args.skip_runtime:
        names = [s.strip() for s in args.schedules.split(",") if s.strip()]
        out["runtime"] = runtime_schedules(names, args.stages, args.microbatches, args.train_steps, args.repeats,
                                           args.hidden, 2 * args.stages * args.layers, args.seq_len,
                                           args.micro_batch)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=2)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    b = out["backward"]
    print(f"one chunk ({b['layers']} blocks, h={b['hidden']}, s={b['seq_len']}, b={b['micro_batch']}), "
          f"median of {b['steps']} interleaved steps:")
    print(f"  B        {b['b_s'] * 1e3:8.2f} ms")
    print(f"  BI + BW  {b['bi_plus_bw_s'] * 1e3:8.2f} ms  = {b['ratio_split_over_b']:.3f} x B "
          f"(BI {b['bi_s'] * 1e3:.2f} + BW {b['bw_s'] * 1e3:.2f}; BW {b['bw_share_of_split']:.0%} of the split)")
    print(f"  before   {(b['before_bi_s'] + b['before_bw_s']) * 1e3:8.2f} ms  = {b['before_ratio_over_b']:.3f} x B "
          "(BI restricted to the input, BW re-walking the graph)")
    if "runtime" in out:
        rt = out["runtime"]
        print(f"runtime, p={rt['p']} m={rt['m']} ({rt['layers']} layers, h={rt['hidden']}):")
        for name, row in rt["rows"].items():
            sim = f"  simulated {row['simulated_vs_1f1b']:.3f} x" if "simulated_vs_1f1b" in row else ""
            print(f"  {name:10s} step {row['median_step_s'] * 1e3:8.2f} ms ({row.get('step_vs_1f1b', 1):.3f} x 1f1b)"
                  f"  makespan {row['median_makespan_s'] * 1e3:8.2f} ms ({row.get('makespan_vs_1f1b', 1):.3f} x){sim}")
    print(f"results written to {args.out}" if args.out else "", file=sys.stderr)
    return 0
