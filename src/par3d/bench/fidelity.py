"""`par3d bench fidelity`: the calibrated planner's predicted step time vs the measured one.

A grid of layouts of one small GPT (dp/pp/tp, schedule, m, recompute, ZeRO-1; 1, 2 and 4 ranks) is
predicted with `par3d.predict` and a hardware file from `par3d calibrate`, then run with
`par3d.train.worker` (median step time, first step skipped).  Reported: the error of each layout,
the median absolute error, the Spearman rank correlation of predicted and measured times, and
whether the layout the planner would pick (least predicted time) is the one measured fastest.

Layouts run in one launched world per world size (1, 2, 4 ranks); `--rounds` launches them all
again in turn, and a layout's time is the median of all its steps.  With
`--one-world` every layout runs in a single 4-rank world, smaller layouts on its first ranks and
the others waiting; on a machine with fewer cores than ranks the waiting ranks can slow the
working ones, which this option exists to measure (docs/measured.md gives the numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

DEFAULT_OUT = os.path.join("benchmarks", "results", "fidelity.json")
DEFAULT_HW = os.path.join("benchmarks", "results", "hardware-cpu.json")
MODEL = {"vocab": 256, "seq_len": 64, "layers": 8, "hidden": 128, "heads": 4}
GLOBAL_BATCH = 16

# name -> (dp, pp, tp, schedule, m, v, recompute, zero): mixes that fit in 1-4 ranks
GRID: dict[str, tuple[int, int, int, str, int, int, str, int]] = {
    "single": (1, 1, 1, "1f1b", 1, 1, "none", 0),
    "single-m4": (1, 1, 1, "1f1b", 4, 1, "none", 0),
    "single-full-rc": (1, 1, 1, "1f1b", 1, 1, "full", 0),
    "dp2": (2, 1, 1, "1f1b", 1, 1, "none", 0),
    "dp2-zero1": (2, 1, 1, "1f1b", 1, 1, "none", 1),
    "dp2-m4-sel-rc": (2, 1, 1, "1f1b", 4, 1, "selective", 0),
    "tp2": (1, 1, 2, "1f1b", 1, 1, "none", 0),
    "tp2-full-rc": (1, 1, 2, "1f1b", 1, 1, "full", 0),
    "pp2-1f1b-m2": (1, 2, 1, "1f1b", 2, 1, "none", 0),
    "pp2-1f1b-m4": (1, 2, 1, "1f1b", 4, 1, "none", 0),
    "pp2-1f1b-m8": (1, 2, 1, "1f1b", 8, 1, "none", 0),
    "pp2-gpipe-m4": (1, 2, 1, "gpipe", 4, 1, "none", 0),
    "pp2-interleaved-m4": (1, 2, 1, "interleaved", 4, 2, "none", 0),
    "pp2-zbh1-m4": (1, 2, 1, "zb-h1", 4, 1, "none", 0),
    "dp4": (4, 1, 1, "1f1b", 1, 1, "none", 0),
    "dp2-pp2-m4": (2, 2, 1, "1f1b", 4, 1, "none", 0),
    "tp2-pp2-m4": (1, 2, 2, "1f1b", 4, 1, "none", 0),
    "pp4-1f1b-m8": (1, 4, 1, "1f1b", 8, 1, "none", 0),
}


def layout_config(name: str, steps: int, hardware: str | None = None) -> dict[str, Any]:
    from par3d.config import ModelConfig, ParallelConfig, RunConfig, TrainConfig

    dp, pp, tp, sched, m, v, rc, zero = GRID[name]
    cfg = RunConfig(model=ModelConfig(**MODEL),
                    parallel=ParallelConfig(dp=dp, pp=pp, tp=tp, schedule=sched, microbatches=m,
                                            virtual_stages=v, recompute=rc, zero_stage=zero),
                    train=TrainConfig(global_batch=GLOBAL_BATCH, steps=steps, warmup=0),
                    progress=False, hardware=hardware, timeout_s=300.0)
    return cfg.validate().to_dict()


def world_worker(cfgs: list[dict[str, Any]]) -> list[list[float]]:
    """On every rank of a launched world: run each layout once; rank 0 returns each layout's step
    times (the first step of each run skipped: it warms up)."""
    import torch.distributed as dist

    from par3d.train import worker

    times: list[list[float]] = []
    for cfg in cfgs:
        r = worker(cfg, {"quiet": True})
        times.append([h["step_time_s"] for h in r["history"][1:]])
        dist.barrier()  # the next layout starts together on every rank
    return times if dist.get_rank() == 0 else []


def measure(names: list[str], steps: int, one_world: bool, progress: bool,
            rounds: int = 1) -> dict[str, dict[str, Any]]:
    """Each layout's median step time over `rounds` runs.  A round launches every world once (one
    per world size, or one 4-rank world with `one_world`), so slow drift of the machine falls on
    every layout alike, whatever its number of ranks."""
    from par3d.distributed import launch

    cfgs = {n: layout_config(n, steps) for n in names}
    size = {n: GRID[n][0] * GRID[n][1] * GRID[n][2] for n in names}
    worlds = {max(size.values()): names} if one_world else \
        {w: [n for n in names if size[n] == w] for w in sorted(set(size.values()))}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(names) * rounds, desc="fidelity", unit="run", file=sys.stderr,
                   dynamic_ncols=True)
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(rounds):
        for w, group in worlds.items():
            got = launch(world_worker, w, ([cfgs[n] for n in group],), timeout_s=300, wall_timeout_s=3600,
                         threads=1)[0]
            for n, t in zip(group, got, strict=True):
                times[n] += t
            if bar is not None:
                bar.update(len(group))
    if bar is not None:
        bar.close()
    return {n: {"measured_s": statistics.median(t), "step_times_s": t} for n, t in times.items()}


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's ρ: the Pearson correlation of the ranks (ties get their mean rank)."""
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2.0
            i = j + 1
        return r

    if len(xs) < 2:
        return float("nan")
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (sx * sy) if sx and sy else float("nan")


def summarize(layouts: list[dict[str, Any]]) -> dict[str, Any]:
    """Errors, median absolute error, Spearman ρ and whether the predicted best is the measured best."""
    for row in layouts:
        row["error"] = (row["predicted_s"] - row["measured_s"]) / row["measured_s"]
    pred = [r["predicted_s"] for r in layouts]
    meas = [r["measured_s"] for r in layouts]
    pick = min(range(len(layouts)), key=lambda i: pred[i])
    fastest = min(range(len(layouts)), key=lambda i: meas[i])
    return {"layouts": layouts, "median_abs_error": statistics.median(abs(r["error"]) for r in layouts),
            "spearman": spearman(pred, meas), "pick_is_fastest": pick == fastest,
            "pick": layouts[pick]["name"], "fastest": layouts[fastest]["name"],
            "pick_regret": meas[pick] / meas[fastest] - 1.0}


def run_fidelity(hardware: str, names: list[str], steps: int, one_world: bool = False,
                 progress: bool = True, rounds: int = 1) -> dict[str, Any]:
    from par3d.config import RunConfig
    from par3d.plan.hardware import load_hardware_file
    from par3d.predict import predict

    prof = load_hardware_file(hardware)
    measured = measure(names, steps, one_world, progress, rounds)
    rows = []
    for n in names:
        dp, pp, tp, sched, m, v, rc, zero = GRID[n]
        p = predict(RunConfig.from_dict(layout_config(n, steps)), prof)
        rows.append({"name": n, "dp": dp, "pp": pp, "tp": tp, "schedule": sched, "microbatches": m,
                     "virtual_stages": v, "recompute": rc, "zero_stage": zero,
                     "predicted_s": p.step_time_s, "measured_s": measured[n]["measured_s"],
                     "predicted_bubble": p.bubble_fraction, "step_times_s": measured[n]["step_times_s"]})
    out = summarize(rows)
    out.update({"model": {**MODEL, "global_batch": GLOBAL_BATCH, "dtype": "fp32"}, "steps": steps,
                "hardware": hardware, "one_world": one_world,
                "load_average": list(os.getloadavg())})  # other processes on the machine perturb timings
    return out


def plot(res: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["layouts"]
    fig, ax = plt.subplots(figsize=(7.5, 6.5))
    colors = {1: "tab:blue", 2: "tab:orange", 4: "tab:green"}
    for r in rows:
        w = r["dp"] * r["pp"] * r["tp"]
        ax.scatter(r["measured_s"] * 1e3, r["predicted_s"] * 1e3, color=colors.get(w, "k"), s=28)
        ax.annotate(r["name"], (r["measured_s"] * 1e3, r["predicted_s"] * 1e3), fontsize=6.5,
                    xytext=(3, 3), textcoords="offset points")
    vals = [x * 1e3 for r in rows for x in (r["measured_s"], r["predicted_s"])]
    lo, hi = min(vals) * 0.8, max(vals) * 1.2
    ax.plot([lo, hi], [lo, hi], "k-", lw=1, label="predicted = measured")
    ax.fill_between([lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15], color="0.85", label="±15%")
    for w, c in colors.items():
        ax.scatter([], [], color=c, label=f"{w} rank{'s' if w > 1 else ''}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured step time (ms, median)")
    ax.set_ylabel("predicted step time (ms, calibrated planner)")
    ax.set_title(f"par3d bench fidelity: median |error| {res['median_abs_error']:.0%}, "
                 f"Spearman {res['spearman']:.2f}, pick {'=' if res['pick_is_fastest'] else '≠'} fastest",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_table(res: dict[str, Any]) -> str:
    lines = [f"{'layout':22s} {'ranks':>5s} {'predicted':>10s} {'measured':>10s} {'error':>7s}"]
    for r in res["layouts"]:
        lines.append(f"{r['name']:22s} {r['dp'] * r['pp'] * r['tp']:5d} {r['predicted_s'] * 1e3:8.1f}ms "
                     f"{r['measured_s'] * 1e3:8.1f}ms {r['error']:+7.0%}")
    lines.append(f"median |error| {res['median_abs_error']:.1%} (goal <= 15%)   Spearman {res['spearman']:.3f} "
                 f"(goal >= 0.9)   planner's pick {res['pick']} "
                 f"{'is' if res['pick_is_fastest'] else 'is not'} the measured fastest ({res['fastest']}; "
                 f"regret {res['pick_regret']:.0%})")
    return "\n".join(lines)


def register(bsub: Any) -> None:
    ap = bsub.add_parser("fidelity", help="calibrated planner's predicted vs measured step time",
                         description="Run a grid of layouts of a small GPT on this machine, predict each "
                                     "with the calibrated planner, and report per-layout error, median "
                                     "absolute error, Spearman rank correlation and whether the planner's "
                                     "pick is the measured fastest.")
    ap.add_argument("--hardware", default=DEFAULT_HW, metavar="FILE",
                    help=f"hardware file from `par3d calibrate` (default {DEFAULT_HW}; made with "
                         f"`par3d calibrate --quick` when absent)")
    ap.add_argument("--steps", type=int, default=None,
                    help="training steps per layout; the first is skipped, the median of the rest is "
                         "the measurement (default 8, 4 with --quick)")
    ap.add_argument("--layouts", default="all",
                    help=f"comma-separated layout names, or 'all' (default: all {len(GRID)}): "
                         + ", ".join(GRID))
    ap.add_argument("--out", default=DEFAULT_OUT, metavar="FILE",
                    help=f"results JSON (default {DEFAULT_OUT}); the plot goes next to it as .png")
    ap.add_argument("--one-world", action="store_true",
                    help="run every layout in one 4-rank world (smaller layouts on its first ranks) instead "
                         "of one world per size")
    ap.add_argument("--rounds", type=int, default=3,
                    help="launch every world this many times in turn and take the median of all of a "
                         "layout's steps, so the machine's drift falls on every layout alike (default 3)")
    ap.add_argument("--quick", action="store_true", help="fewer steps per layout and one round (noisier)")
    ap.add_argument("--json", action="store_true",
                    help='print {"layouts": [...], "median_abs_error", "spearman", "pick_is_fastest", ...}')
    ap.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    names = list(GRID) if args.layouts == "all" else [n.strip() for n in args.layouts.split(",") if n.strip()]
    bad = [n for n in names if n not in GRID]
    if bad or not names:
        print(f"par3d bench fidelity: unknown layout(s) {', '.join(bad) or '(none)'}; choose from "
              f"{', '.join(GRID)}", file=sys.stderr)
        return 2
    steps = args.steps or (4 if args.quick else 8)
    if steps < 2:
        print("par3d bench fidelity: --steps must be >= 2 (the first step is skipped)", file=sys.stderr)
        return 2
    if not os.path.isfile(args.hardware):
        from par3d.calibrate import calibrate

        print(f"par3d bench fidelity: {args.hardware} not found; running `par3d calibrate --quick`",
              file=sys.stderr)
        hw = calibrate(nproc=2, quick=True, progress=not args.json)
        os.makedirs(os.path.dirname(os.path.abspath(args.hardware)), exist_ok=True)
        with open(args.hardware, "w") as fh:
            json.dump(hw, fh, indent=1)
    rounds = 1 if args.quick else max(1, args.rounds)
    res = run_fidelity(args.hardware, names, steps, one_world=args.one_world, progress=not args.json,
                       rounds=rounds)
    res["rounds"] = rounds
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)
    png = os.path.splitext(args.out)[0] + ".png"
    plot(res, png)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print(format_table(res))
        print(f"wrote {args.out} and {png}")
    return 0
