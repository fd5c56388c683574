"""`par3d bench fidelity`: the calibrated planner's predicted step time vs the measured one, on
model shapes the calibration never ran.

A grid of layouts (dp/pp/tp, schedule, m, recompute, ZeRO-1; 1, 2 and 4 ranks) of several GPT shapes
(`--model`) is predicted with the planner's model (`par3d.predict`, the same as `par3d plan
--hardware`) and a hardware file from `par3d calibrate`, then run with `par3d.train.worker` (median
step time, first step of each run skipped).  The default shapes are the calibration's own reference
(in-sample) and three that differ from every model the calibration ran in width, depth and sequence
length (held-out; the file lists those models under `calibrated.references`).  Reported per shape
and apart for the in-sample and the held-out shapes: the error of each layout, the median absolute
error, the Spearman rank correlation of predicted and measured times, and whether the layout the
planner would pick (least predicted time) is the measured fastest, and by how much it is slower.

Layouts run in one launched world per world size (1, 2, 4 ranks), every shape's layouts in it;
`--rounds` launches them all again in turn, and a layout's time is the median of all its steps.
Each launched world first and last runs the calibration's speed check at its size (two calibration
GPTs with DP over its ranks, `calibrate/probes.py`'s `speed_check`): a VM's speed moves by tens of
per cent within minutes, and a launch of several ranks runs fast or slow as a whole; the
prediction times that factor is scored beside the planner's own (`*_checked`),
to tell how much of the error is the machine's speed moving since the calibration.
With `--one-world` every layout runs in a single 4-rank world, smaller layouts on its first ranks
and the others waiting (on a machine with fewer cores than ranks the waiting ranks can slow the
working ones, which this option exists to measure).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

from par3d.argtypes import int_at_least

DEFAULT_OUT = os.path.join("runs", "bench", "fidelity.json")

# name -> model shape and global batch.  "reference" is `par3d calibrate`'s reference GPT
# (calibrate/probes.py's REFERENCE); the others differ from it and from the tiny fixed-cost probes
# (h 16, s 8, 1 and 5 layers) and the synthetic pipeline (h 8, s 8, 2 layers) in every dimension
SHAPES: dict[str, dict[str, int]] = {
    "reference": {"layers": 4, "hidden": 128, "heads": 4, "seq_len": 64, "vocab": 256, "global_batch": 16},
    "narrow-deep": {"layers": 12, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 256, "global_batch": 16},
    "wide": {"layers": 6, "hidden": 256, "heads": 8, "seq_len": 128, "vocab": 256, "global_batch": 8},
    "long": {"layers": 8, "hidden": 96, "heads": 4, "seq_len": 256, "vocab": 256, "global_batch": 8},
}
MODEL_KEYS = ("layers", "hidden", "heads", "seq_len", "vocab", "global_batch")
MODEL = SHAPES["reference"]  # the single-shape default of older callers
GLOBAL_BATCH = MODEL["global_batch"]

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
    "dp2-zero2": (2, 1, 1, "1f1b", 1, 1, "none", 2),
    "dp2-zero3": (2, 1, 1, "1f1b", 1, 1, "none", 3),
    "dp2-tp2-zero3": (2, 1, 2, "1f1b", 1, 1, "none", 3),
    "cp2": (1, 1, 1, "1f1b", 1, 1, "none", 0),
    "cp2-tp2": (1, 1, 2, "1f1b", 1, 1, "none", 0),
}
# context-parallel degree of the layouts that have one (the others: 1)
CP_OF: dict[str, int] = {"cp2": 2, "cp2-tp2": 2}


def parse_model(text: str) -> tuple[str, dict[str, int]]:
    """`--model` value: a name of `SHAPES`, or `[NAME:]layers=L,hidden=H,heads=A,seq_len=S[,vocab=V]
    [,global_batch=G]` (vocab 256 and global batch 8 by default)."""
    text = text.strip()
    if text in SHAPES:
        return text, dict(SHAPES[text])
    name, _, body = text.rpartition(":") if ":" in text else ("", "", text)
    shape: dict[str, int] = {"vocab": 256, "global_batch": 8}
    for part in body.split(","):
        key, eq, val = part.partition("=")
        key = key.strip().replace("-", "_")
        key = {"seq": "seq_len", "l": "layers", "h": "hidden", "a": "heads", "s": "seq_len", "v": "vocab"}.get(key, key)
        if not eq or key not in MODEL_KEYS:
            raise ValueError(f"--model {text!r}: {part!r} is not KEY=VALUE with KEY one of {', '.join(MODEL_KEYS)}"
                             f" (or give a name: {', '.join(SHAPES)})")
        try:
            shape[key] = int(val)
        except ValueError:
            raise ValueError(f"--model {text!r}: {key}={val!r} must be an integer") from None
    missing = [k for k in ("layers", "hidden", "heads", "seq_len") if k not in shape]
    if missing:
        raise ValueError(f"--model {text!r}: missing {', '.join(missing)}; e.g. layers=8,hidden=96,heads=4,seq_len=128")
    if shape["hidden"] % shape["heads"]:
        raise ValueError(f"--model {text!r}: hidden={shape['hidden']} must be divisible by heads={shape['heads']}")
    return name or f"L{shape['layers']}-h{shape['hidden']}-s{shape['seq_len']}", shape


def layout_config(name: str, steps: int, hardware: str | None = None,
                  shape: dict[str, int] | None = None) -> dict[str, Any]:
    """The run of layout `name` of `GRID` on model `shape` (default the reference)."""
    from par3d.config import ModelConfig, ParallelConfig, RunConfig, TrainConfig

    shape = shape or MODEL
    dp, pp, tp, sched, m, v, rc, zero = GRID[name]
    cfg = RunConfig(model=ModelConfig(**{k: shape[k] for k in ("layers", "hidden", "heads", "seq_len", "vocab")}),
                    parallel=ParallelConfig(dp=dp, pp=pp, tp=tp, schedule=sched, microbatches=m,
                                            virtual_stages=v, recompute=rc, zero_stage=zero,
                                            cp=CP_OF.get(name, 1)),
                    train=TrainConfig(global_batch=shape["global_batch"], steps=steps, warmup=0),
                    progress=False, hardware=hardware, timeout_s=300.0)
    return cfg.validate().to_dict()


def valid_layouts(shape: dict[str, int], names: list[str]) -> list[str]:
    """The layouts of `names` this shape can run (pipeline chunks need layers, TP must divide the
    heads, the global batch must split into the micro-batches)."""
    from par3d.config import ConfigError

    out = []
    for n in names:
        try:
            layout_config(n, 3, shape=shape)
        except ConfigError:
            continue
        out.append(n)
    return out


def world_worker(cfgs: list[dict[str, Any]], check: bool = False) -> dict[str, Any]:
    """On every rank of a launched world: run each layout once; rank 0 returns each layout's step
    times (the first step of each run skipped: it warms up) and, with `check`, the speed check on
    every rank of this world before the first layout and after the last."""
    import torch.distributed as dist

    from par3d.calibrate.probes import speed_check
    from par3d.train import worker

    checks = [speed_check(dist.get_world_size())] if check else []
    times: list[list[float]] = []
    for cfg in cfgs:
        r = worker(cfg, {"quiet": True})
        times.append([h["step_time_s"] for h in r["history"][1:]])  # each run's groups meet first
    if check:
        checks.append(speed_check(dist.get_world_size()))
    return {"times": times, "checks": checks} if dist.get_rank() == 0 else {}


Case = tuple[str, str]  # (shape name, layout name)


def measure(cases: dict[Case, dict[str, Any]], one_world: bool, progress: bool,
            rounds: int = 1, speed_ref: dict[str, float] | None = None) -> dict[str, Any]:
    """Each case's median step time over `rounds` runs.  A round launches every world once (one per
    world size, or one 4-rank world with `one_world`), every shape's layouts of that size in it, so
    slow drift of the machine falls on every layout alike, whatever its number of ranks; every
    other round runs a world's layouts in reverse order, so drift within a world does too.

    With `speed_ref` (the hardware file's `speed_check` step time by world size), each launched
    world of a size it has runs the speed check first and last, and each case gets the machine's
    speed factor while it ran: the mean of its world's two checks over the file's, averaged over the
    rounds (1.0 = as fast as during the calibration; not with `one_world`, whose smaller layouts
    leave ranks idle)."""
    from par3d.distributed import launch

    size = {c: GRID[c[1]][0] * GRID[c[1]][1] * GRID[c[1]][2] * CP_OF.get(c[1], 1) for c in cases}
    worlds = {max(size.values()): list(cases)} if one_world else \
        {w: [c for c in cases if size[c] == w] for w in sorted(set(size.values()))}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(cases) * rounds, desc="fidelity", unit="run", file=sys.stderr, dynamic_ncols=True)
    times: dict[Case, list[float]] = {c: [] for c in cases}
    factors: dict[Case, list[float]] = {c: [] for c in cases}
    checks: list[dict[str, Any]] = []
    for r in range(rounds):
        for w, group in worlds.items():
            order = group[::-1] if r % 2 else group
            ref = None if one_world else (speed_ref or {}).get(str(w))
            got = launch(world_worker, w, ([cases[c] for c in order], ref is not None), timeout_s=300,
                         wall_timeout_s=3600, threads=1)[0]
            f = statistics.fmean(got["checks"]) / ref if ref else 1.0
            if ref:
                checks.append({"round": r, "world": w, "checks_s": got["checks"], "factor": f})
            for c, t in zip(order, got["times"], strict=True):
                times[c] += t
                factors[c].append(f)
            if bar is not None:
                bar.update(len(group))
    if bar is not None:
        bar.close()
    out: dict[str, Any] = {c: {"measured_s": statistics.median(t), "step_times_s": t,
                               "speed_factor": statistics.fmean(factors[c])} for c, t in times.items()}
    out["speed_checks"] = checks
    return out


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


def role(shape: dict[str, int], references: list[dict[str, int]]) -> str:
    """"in-sample" for a model the calibration ran, "held-out" for one that differs from every
    reference in width, depth and sequence length, "partly" otherwise."""
    keys = ("layers", "hidden", "seq_len")
    if any(all(shape[k] == r.get(k) for k in keys) for r in references):
        return "in-sample"
    if all(all(shape[k] != r.get(k) for k in keys) for r in references):
        return "held-out"
    return "partly"


def pooled(shapes: list[dict[str, Any]]) -> dict[str, Any]:
    """Over several shapes: the median |error| of all their layouts, the median of the shapes'
    Spearman ρ (ranks are compared within a shape: across shapes the sizes alone would rank them),
    whether every shape's pick is its fastest, and the worst pick's regret."""
    if not shapes:
        return {}
    rows = [r for s in shapes for r in s["layouts"]]
    regret = max(s["pick_regret"] for s in shapes)
    return {"shapes": [s["name"] for s in shapes], "layouts": len(rows),
            "median_abs_error": statistics.median(abs(r["error"]) for r in rows),
            "spearman": statistics.median(s["spearman"] for s in shapes),
            "spearman_min": min(s["spearman"] for s in shapes),
            "pick_is_fastest": all(s["pick_is_fastest"] for s in shapes),
            "pick_regret": regret, "pick_within_5pct": regret <= 0.05}


def run_fidelity(hardware: str, names: list[str], steps: int, one_world: bool = False,
                 progress: bool = True, rounds: int = 1,
                 shapes: dict[str, dict[str, int]] | None = None, speed_check: bool = True) -> dict[str, Any]:
    """Predict and measure every layout of `shapes`.  A row's `predicted_s` is the planner's
    prediction from the hardware file, what the summaries score; `predicted_checked_s` is it times
    the machine's speed while the layout ran against the calibration's (`speed_factor`, from the
    speed check; 1.0 without one), scored apart under the keys ending `_checked` — what of the error
    is the machine's speed moving since the calibration, not the model."""
    from par3d.config import RunConfig
    from par3d.plan.hardware import load_hardware_file
    from par3d.predict import predict

    hw = load_hardware_file(hardware)
    shapes = shapes or {"reference": MODEL}
    refs = (hw.extra.get("calibrated") or {}).get("references") or \
        [{"layers": 4, "hidden": 128, "seq_len": 64}]  # files written before the list: the reference
    speed_ref = (hw.extra.get("speed_check") or {}).get("step_s") if speed_check else None
    cases: dict[Case, dict[str, Any]] = {}
    for sname, shape in shapes.items():
        for n in valid_layouts(shape, names):
            cases[(sname, n)] = layout_config(n, steps, shape=shape)
    measured = measure(cases, one_world, progress, rounds, speed_ref)
    per_shape, per_shape_checked = [], []
    for sname, shape in shapes.items():
        rows = []
        for (sn, n), cfg in cases.items():
            if sn != sname:
                continue
            dp, pp, tp, sched, m, v, rc, zero = GRID[n]
            p = predict(RunConfig.from_dict(cfg), hw)
            got = measured[(sn, n)]
            rows.append({"name": n, "shape": sname, "dp": dp, "pp": pp, "tp": tp, "schedule": sched,
                         "microbatches": m, "virtual_stages": v, "recompute": rc, "zero_stage": zero,
                         "cp": CP_OF.get(n, 1), "predicted_s": p.step_time_s,
                         "predicted_checked_s": p.step_time_s * got["speed_factor"], "speed_factor": got["speed_factor"],
                         "measured_s": got["measured_s"],
                         "predicted_bubble": p.bubble_fraction, "step_times_s": got["step_times_s"]})
        if len(rows) < 2:
            continue
        checked = [dict(r, predicted_s=r["predicted_checked_s"]) for r in rows]
        per_shape.append({"name": sname, "model": shape, "role": role(shape, refs), **summarize(rows)})
        per_shape_checked.append({"name": sname, "role": role(shape, refs), **summarize(checked)})
        for r, q in zip(rows, checked, strict=True):
            r["error_checked"] = q["error"]
    ins = [s for s in per_shape if s["role"] == "in-sample"]
    held = [s for s in per_shape if s["role"] == "held-out"]
    # the current keys describe the in-sample shape (the one the calibration ran), or the first
    first = ins[0] if ins else per_shape[0]
    out = {k: first[k] for k in ("layouts", "median_abs_error", "spearman", "pick_is_fastest", "pick", "fastest",
                                 "pick_regret")}
    out.update({"in_sample": pooled(ins), "heldout": pooled(held),
                "in_sample_checked": pooled([s for s in per_shape_checked if s["role"] == "in-sample"]),
                "heldout_checked": pooled([s for s in per_shape_checked if s["role"] == "held-out"]),
                "shapes": per_shape,
                "speed_check": {"calibrated_s": speed_ref, "worlds": measured["speed_checks"]},
                "model": {**first["model"], "dtype": "fp32"}, "steps": steps, "hardware": hardware,
                "calibration_references": refs, "one_world": one_world,
                "load_average": list(os.getloadavg())})  # other processes on the machine perturb timings
    return out


MARKERS = {1: "o", 2: "s", 4: "^"}


def plot(res: dict[str, Any], path: str) -> None:
    import matplotlib.pyplot as plt

    fig = figure(res)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(res: dict[str, Any]) -> Any:
    """Predicted vs measured, one colour per shape and one marker per world size; the ±15 % band
    and the diagonal drawn beneath the points, so every marker stays visible."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = res.get("shapes") or [{"name": "layouts", "role": "", "layouts": res["layouts"]}]
    rows = [r for s in shapes for r in s["layouts"]]
    fig, ax = plt.subplots(figsize=(8.5, 7.5))
    vals = [x * 1e3 for r in rows for x in (r["measured_s"], r["predicted_s"])]
    lo, hi = min(vals) * 0.8, max(vals) * 1.25
    ax.fill_between([lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15], color="0.9", zorder=0,
                    label="±15%")
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, zorder=1, label="predicted = measured")
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink"]
    for i, s in enumerate(shapes):
        c = colors[i % len(colors)]
        for r in s["layouts"]:
            w = r["dp"] * r["pp"] * r["tp"] * r.get("cp", 1)
            ax.scatter(r["measured_s"] * 1e3, r["predicted_s"] * 1e3, color=c, marker=MARKERS.get(w, "D"), s=30,
                       edgecolors="k", linewidths=0.4, zorder=3)
        lab = f"{s['name']} ({s['role']})" if s.get("role") else s["name"]
        if "median_abs_error" in s:
            lab += f": |err| {s['median_abs_error']:.0%}, ρ {s['spearman']:.2f}"
        ax.scatter([], [], color=c, marker="o", label=lab)
    for w, mk in MARKERS.items():
        ax.scatter([], [], color="w", edgecolors="k", marker=mk, label=f"{w} rank{'s' if w > 1 else ''}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured step time (ms, median)")
    ax.set_ylabel("predicted step time (ms, calibrated planner)")
    held = res.get("heldout") or {}
    title = "par3d bench fidelity"
    if held:
        title += (f": held-out median |error| {held['median_abs_error']:.0%}, Spearman {held['spearman']:.2f}, "
                  f"pick regret {held['pick_regret']:.0%}")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def _goal_line(label: str, g: dict[str, Any]) -> str:
    return (f"{label}: median |error| {g['median_abs_error']:.1%} (goal <= 15%)   Spearman {g['spearman']:.3f} "
            f"(goal >= 0.9; min {g['spearman_min']:.3f})   pick {'=' if g['pick_is_fastest'] else '!='} fastest, "
            f"worst regret {g['pick_regret']:.1%} (goal <= 5%)   [{', '.join(g['shapes'])}]")


def format_table(res: dict[str, Any]) -> str:
    shapes = res.get("shapes") or [{"name": "", "role": "", **res}]
    lines = []
    for s in shapes:
        if s.get("name"):
            m = s.get("model", {})
            lines.append(f"== {s['name']} ({s['role']}): {m.get('layers')} layers, h {m.get('hidden')}, "
                         f"{m.get('heads')} heads, s {m.get('seq_len')}, vocab {m.get('vocab')}, "
                         f"global batch {m.get('global_batch')}")
        lines.append(f"{'layout':22s} {'ranks':>5s} {'predicted':>10s} {'measured':>10s} {'error':>7s} "
                     f"{'speed':>6s} {'checked':>10s} {'error':>7s}")
        for r in s["layouts"]:
            chk = r.get("predicted_checked_s", r["predicted_s"])
            lines.append(f"{r['name']:22s} {r['dp'] * r['pp'] * r['tp'] * r.get('cp', 1):5d} {r['predicted_s'] * 1e3:8.1f}ms "
                         f"{r['measured_s'] * 1e3:8.1f}ms {r['error']:+7.0%} {r.get('speed_factor', 1.0):6.2f} "
                         f"{chk * 1e3:8.1f}ms {r.get('error_checked', r['error']):+7.0%}")
        lines.append(f"median |error| {s['median_abs_error']:.1%}   Spearman {s['spearman']:.3f}   planner's pick "
                     f"{s['pick']} {'is' if s['pick_is_fastest'] else 'is not'} the measured fastest ({s['fastest']};"
                     f" regret {s['pick_regret']:.0%})")
    sc = res.get("speed_check") or {}
    if sc.get("worlds"):
        lines.append("speed check (each world's time against the calibration's at its size; 'checked' is the "
                     "prediction times it): "
                     + ", ".join(f"{c['world']} rank{'s' if c['world'] > 1 else ''} {c['factor']:.2f}"
                                 for c in sc["worlds"]))
    else:
        lines.append("speed check: none (--no-speed-check, --one-world, or a hardware file without `speed_check`)")
    for key, label in (("in_sample", "in-sample"), ("heldout", "held-out"),
                       ("in_sample_checked", "in-sample, speed-checked"), ("heldout_checked", "held-out, speed-checked")):
        if res.get(key) and (not key.endswith("_checked") or sc.get("worlds")):
            lines.append(_goal_line(label, res[key]))
    return "\n".join(lines)


def register(bsub: Any) -> None:
    ap = bsub.add_parser("fidelity", help="calibrated planner's predicted vs measured step time, held-out shapes",
                         description="Run a grid of layouts of several GPT shapes on this machine, predict each "
                                     "with the calibrated planner, and report per-layout error, median "
                                     "absolute error, Spearman rank correlation and whether the planner's "
                                     "pick is the measured fastest — for the calibration's own shape "
                                     "(in-sample) and for shapes it never ran (held-out) apart.")
    ap.add_argument("--hardware", default=None, metavar="FILE",
                    help="hardware file from `par3d calibrate`; without it this machine is calibrated first "
                         "(written next to --out as *-hardware.json)")
    ap.add_argument("--model", action="append", default=None, metavar="SHAPE",
                    help="a model shape to score, repeatable: a name (" + ", ".join(SHAPES) + ") or "
                         "[NAME:]layers=L,hidden=H,heads=A,seq_len=S[,vocab=V][,global_batch=G] "
                         "(default: all four named shapes: the calibration's reference and three held-out)")
    ap.add_argument("--steps", type=int_at_least(2), default=None,
                    help="training steps per layout and round; the first is skipped (default 5, 3 with --quick)")
    ap.add_argument("--layouts", default="all",
                    help=f"comma-separated layout names, or 'all' (default: all {len(GRID)}; those a shape "
                         "cannot run are skipped): " + ", ".join(GRID))
    ap.add_argument("--out", default=DEFAULT_OUT, metavar="FILE",
                    help=f"results JSON (default {DEFAULT_OUT}); the plot goes next to it as .png.  The "
                         "committed results change only when named, e.g. --out benchmarks/results/fidelity.json")
    ap.add_argument("--one-world", action="store_true",
                    help="run every layout in one 4-rank world (smaller layouts on its first ranks) instead "
                         "of one world per size")
    ap.add_argument("--rounds", type=int_at_least(1), default=3,
                    help="launch every world this many times in turn and take the median of all of a "
                         "layout's steps, so the machine's drift falls on every layout alike and one launch "
                         "that runs fast or slow as a whole does not set the median (default 3; every other "
                         "round runs a world's layouts in reverse order)")
    ap.add_argument("--no-speed-check", dest="speed_check", action="store_false",
                    help="do not run the speed check in each world (by default each world runs the "
                         "calibration's speed check first and last, and the predictions scaled by how fast "
                         "the machine ran it against the file's time are scored beside the planner's own, "
                         "as *_checked)")
    ap.add_argument("--quick", action="store_true",
                    help="fewer steps, one round and a quick calibration when one is needed (noisier)")
    ap.add_argument("--json", action="store_true",
                    help='print {"layouts", "median_abs_error", "spearman", "pick_is_fastest", "in_sample", '
                         '"heldout", "in_sample_checked", "heldout_checked", "speed_check", "shapes", ...}')
    ap.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    names = list(GRID) if args.layouts == "all" else [n.strip() for n in args.layouts.split(",") if n.strip()]
    bad = [n for n in names if n not in GRID]
    if bad or not names:
        print(f"par3d bench fidelity: unknown layout(s) {', '.join(bad) or '(none)'}; choose from "
              f"{', '.join(GRID)}", file=sys.stderr)
        return 2
    try:
        shapes = dict(parse_model(t) for t in (args.model or list(SHAPES)))
    except ValueError as e:
        print(f"par3d bench fidelity: {e}", file=sys.stderr)
        return 2
    usable = {k: v for k, v in shapes.items() if len(valid_layouts(v, names)) >= 2}
    if not usable:
        print("par3d bench fidelity: no shape can run two of the chosen layouts; pick more --layouts or another "
              "--model (layers >= pp, heads divisible by tp, global_batch divisible by micro-batches x dp)",
              file=sys.stderr)
        return 2
    steps = args.steps or (3 if args.quick else 5)
    if steps < 2:
        print("par3d bench fidelity: --steps must be >= 2 (the first step is skipped)", file=sys.stderr)
        return 2
    hardware = args.hardware
    if hardware is not None:
        from par3d.host import warn_if_other_host
        from par3d.plan.hardware import HardwareError, load_hardware_file

        try:
            warn_if_other_host(hardware, load_hardware_file(hardware).extra, "par3d bench fidelity")
        except HardwareError as e:
            print(f"par3d bench fidelity: {e}", file=sys.stderr)
            return 2
    else:
        from par3d.calibrate import calibrate

        hardware = os.path.splitext(args.out)[0] + "-hardware.json"
        print(f"par3d bench fidelity: no --hardware given; calibrating this machine first (-> {hardware})",
              file=sys.stderr)
        hw = calibrate(nproc=2, quick=args.quick, progress=True)
        os.makedirs(os.path.dirname(os.path.abspath(hardware)), exist_ok=True)
        with open(hardware, "w") as fh:
            json.dump(hw, fh, indent=1)
    rounds = 1 if args.quick else max(1, args.rounds)
    res = run_fidelity(hardware, names, steps, one_world=args.one_world, progress=not args.json,
                       rounds=rounds, shapes=usable, speed_check=args.speed_check)
    res["rounds"] = rounds
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)
    png = os.path.splitext(args.out)[0] + ".png"
    plot(res, png)
    if args.json:
        print(json.dumps(res, indent=1))
        print(f"wrote {args.out} and {png}", file=sys.stderr)
    else:
        print(format_table(res))
        print(f"wrote {args.out} and {png}")
    return 0
