"""The end-of-run report of `par3d train`: losses and speed, the measured pipeline timeline next
to the simulated one (same schedule, measured per-action durations), the bubble both ways,
communication per group and kind, and peak activation memory per rank.

The simulated timeline uses the *median measured* duration of each (stage, kind) and zero
transfer time, so the gap between the two bubbles is what the runtime adds on top of the
schedule (transfers, waits, Python overhead) — the seed's section 3.3 comparison, on real ranks.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections import Counter
from typing import Any

from par3d.config import RunConfig


def _measured_timeline(world: list[dict[str, Any]], p: int, m: int, v: int) -> Any:
    from par3d.pipeline.simulate import Event, timeline_from_events

    events = [Event.from_dict(e) for r in world for e in r.get("events", [])]
    if not events:
        return None
    return timeline_from_events(events, p, m, v)


def _simulated_from(measured: Any, cfg: Any) -> Any:
    from par3d.pipeline.simulate import simulate
    from par3d.train import pipeline_schedule

    pc = cfg.parallel
    p, m, v = pc.pp, pc.microbatches, pc.virtual_stages

    by: dict[tuple[int, str], list[float]] = {}
    for e in measured.events:
        by.setdefault((e.stage, e.kind), []).append(e.end - e.start)
    durations = {k: statistics.median(v_) for k, v_ in by.items()}
    return simulate(pipeline_schedule(cfg), p, m, v, durations=durations, transfer=0.0)


def _size_histogram(sizes: dict[str, list[int]]) -> dict[str, dict[int, int]]:
    """{"group/kind": [elements per call, ...]} -> {"group/kind": {elements: calls}}, largest first."""
    return {key: dict(sorted(Counter(v).items(), reverse=True)) for key, v in sorted(sizes.items())}


def _format_sizes(rep: dict[str, Any]) -> list[str]:
    """--comm-report: elements per call of the last step, with the seed's units named (§2.3: a TP
    all-reduce moves one b·s·h activation; the vocab-parallel loss moves b·s values)."""
    u = rep["units"]
    names = {u["b*s*h"]: "b·s·h", u["b*s"]: "b·s"}
    lines = ["  comm sizes      elements per call, last step (b·s·h = "
             f"{u['b*s*h']:,}, b·s = {u['b*s']:,})"]
    for key, hist in rep["comm_sizes_last_step"].items():
        parts = " + ".join(f"{n} × {e:,}" + (f" ({names[e]})" if e in names else "") for e, n in hist.items())
        lines.append(f"    {key:22s} {parts}")
    # the seed's per-layer accounting, read back from the counts (one stage holds every layer)
    full = rep["comm_sizes_last_step"].get("tp/all_reduce", {}).get(u["b*s*h"], 0)
    lay, m = rep["layout"], rep["layout"]["microbatches"]
    if full and lay["pp"] == 1 and not lay["sequence_parallel"]:
        per_layer = (full - 2 * m) / (u["layers"] * m)
        lines.append(f"    = per micro-batch: {per_layer:g} TP all-reduces of b·s·h per layer (seed §2.3: 2 forward, "
                     f"2 backward) x {u['layers']} layers + 2 (embedding, LM head), over m = {m}")
    return lines


def _rank_key(w: dict[str, Any]) -> str:
    c = w["coord"]
    return f"dp{c[0]}/pp{c[1]}/tp{c[2]}" + (f"/cp{c[3]}" if len(c) > 3 and c[3] else "")


def _format_memory(mem: dict[str, Any]) -> list[str]:
    """One line per rank: measured / predicted MiB of weights, gradients, optimizer, activations."""
    lines = ["  memory (MiB)    measured / predicted: weights, grads, optimizer, activations"]
    for key, m in mem["measured"].items():
        p = mem["predicted"].get(key) or {}
        parts = []
        for k in ("weights", "grads", "optimizer", "activations"):
            pv = p.get(k)
            parts.append(f"{m[k] / 2**20:.2f} / " + (f"{pv / 2**20:.2f}" if isinstance(pv, (int, float)) else "-"))
        extra = ""
        if m.get("gathered_weights_peak") or m.get("grad_buckets_peak"):
            extra = (f"  (transient: gathered {m['gathered_weights_peak'] / 2**20:.2f}, grad buckets "
                     f"{m['grad_buckets_peak'] / 2**20:.2f})")
        lines.append(f"    {key:16s} " + ", ".join(parts) + extra)
    return lines


def build_report(cfg: RunConfig, r0: dict[str, Any]) -> dict[str, Any]:
    pc = cfg.parallel
    hist = r0["history"]
    times = [h["step_time_s"] for h in hist[1:]] or [h["step_time_s"] for h in hist]
    med = statistics.median(times) if times else float("nan")
    tokens = cfg.train.global_batch * cfg.model.seq_len
    world = r0.get("world", [])
    bs = int(cfg.train.micro_batch or 1) * cfg.model.seq_len  # tokens per micro-batch (the seed's b·s)
    rep: dict[str, Any] = {
        "layout": {"dp": pc.dp, "pp": pc.pp, "tp": pc.tp, "cp": pc.cp,
                   "schedule": "csv" if pc.schedule_csv else pc.schedule, "schedule_csv": pc.schedule_csv,
                   "microbatches": pc.microbatches,
                   "virtual_stages": pc.virtual_stages, "zero_stage": pc.zero_stage, "recompute": pc.recompute,
                   "sequence_parallel": pc.sequence_parallel, "dtype": cfg.train.dtype,
                   "p2p_transport": r0.get("p2p_transport", "none")},
        "steps": len(hist),
        "first_loss": hist[0]["loss"] if hist else None,
        "last_loss": hist[-1]["loss"] if hist else None,
        "median_step_time_s": med,
        "tokens_per_s": tokens / med if med and med == med else None,
        "comm_last_step": r0["comm_per_step"][-1]["comm"] if r0.get("comm_per_step") else {},
        "comm_sizes_last_step": _size_histogram(r0["comm_per_step"][-1].get("sizes") or {})
        if r0.get("comm_per_step") else {},
        "peak_activation_mib": {
            f"dp{w['coord'][0]}/pp{w['coord'][1]}/tp{w['coord'][2]}": round(w["peak_activation_bytes"] / 2**20, 3)
            for w in world},
        "peak_inflight_predicted": {f"pp{w['coord'][1]}": w["peak_inflight_predicted"] for w in world},
        # measured bytes per rank beside the planner's prediction (zero.py / data_parallel.py memory())
        "memory": {"measured": {_rank_key(w): w["memory"]["measured"] for w in world if w.get("memory")},
                   "predicted": {_rank_key(w): w["memory"]["predicted"] for w in world if w.get("memory")}},
        "units": {"b*s*h": bs * cfg.model.hidden, "b*s": bs, "layers": cfg.model.layers},
    }
    measured = _measured_timeline(world, pc.pp, pc.microbatches, pc.virtual_stages)
    if measured is not None:
        sim = _simulated_from(measured, cfg)
        rep["pipeline"] = {
            "measured": {"makespan_s": measured.makespan, "bubble_wall": measured.bubble_wall,
                         "bubble_ideal": measured.bubble_ideal},
            "simulated": {"makespan_s": sim.makespan, "bubble_wall": sim.bubble_wall,
                          "bubble_ideal": sim.bubble_ideal},
            "formula_wall": (pc.pp - 1) / (pc.microbatches + pc.pp - 1),
            "step_time_s": hist[-1]["step_time_s"] if hist else None,  # the step these timelines are of
        }
        if cfg.synthetic_stage_ms is not None and not pc.schedule_csv and pc.schedule in ("gpipe", "1f1b"):
            # the seed's 3.3 experiment: what the schedule alone takes with equal waiting stages
            tf, tb = cfg.synthetic_stage_ms
            rep["pipeline"]["formula_makespan_s"] = (pc.microbatches + pc.pp - 1) * (tf + tb) / 1e3
        rep["_timelines"] = (measured, sim)
    if cfg.hardware:
        try:
            from par3d.predict import predict_step_time

            rep["predicted_step_time_s"] = predict_step_time(cfg, cfg.hardware)
            rep["predicted_with"] = cfg.hardware
        except Exception as e:  # a prediction problem must not lose the run's report
            rep["predicted_step_time_s"] = None
            rep["prediction_error"] = f"{type(e).__name__}: {e}"
    return rep


def write_trace(cfg: RunConfig, rep: dict[str, Any], out_dir: str) -> dict[str, str]:
    from par3d.trace import gantt_png, write_chrome_trace

    os.makedirs(out_dir, exist_ok=True)
    measured, sim = rep["_timelines"]
    files = {"trace": os.path.join(out_dir, "trace.json"), "gantt": os.path.join(out_dir, "gantt.png"),
             "report": os.path.join(out_dir, "report.json")}
    write_chrome_trace({"measured": measured.events, "simulated": sim.events}, files["trace"])
    pc = cfg.parallel
    gantt_png({"measured": measured.events, "simulated": sim.events}, files["gantt"],
              title=f"{pc.schedule_csv or pc.schedule} p={pc.pp} m={pc.microbatches} v={pc.virtual_stages} "
                    f"(dp={pc.dp}, tp={pc.tp}) — last step")
    return files


def finish_run(cfg: RunConfig, results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Print the summary table; write the trace folder when asked.  Only rank 0 reports."""
    r0 = next((r for r in results if r.get("rank") == 0), None)
    if r0 is None:
        return None
    rep = build_report(cfg, r0)
    if cfg.trace_out and "_timelines" in rep:
        rep["files"] = write_trace(cfg, rep, cfg.trace_out)
    rep.pop("_timelines", None)
    if cfg.trace_out:
        os.makedirs(cfg.trace_out, exist_ok=True)
        with open(os.path.join(cfg.trace_out, "report.json"), "w") as fh:
            json.dump(rep, fh, indent=2)
    if not cfg.json:
        print(format_report(rep), file=sys.stdout)
    return rep


def format_report(rep: dict[str, Any]) -> str:
    lay = rep["layout"]
    lines = [
        f"par3d train: dp={lay['dp']} pp={lay['pp']} tp={lay['tp']} schedule={lay['schedule']}"
        + (f" ({lay['schedule_csv']})" if lay.get("schedule_csv") else "") + f" "
        f"m={lay['microbatches']} v={lay['virtual_stages']} zero={lay['zero_stage']} "
        f"recompute={lay['recompute']} sp={lay['sequence_parallel']} dtype={lay['dtype']}"
        + (f" p2p={lay['p2p_transport']}" if lay.get("p2p_transport", "none") != "none" else ""),
        f"  loss            {rep['first_loss']:.4f} -> {rep['last_loss']:.4f} over {rep['steps']} steps"
        if rep["first_loss"] is not None else "  loss            (no steps)",
        f"  step time       {rep['median_step_time_s'] * 1e3:.1f} ms (median)   "
        f"{(rep['tokens_per_s'] or 0):,.0f} tokens/s",
    ]
    if "predicted_step_time_s" in rep and rep["predicted_step_time_s"]:
        # the planner's own model on this layout: `par3d plan --hardware FILE` prints the same number
        lines.append(f"  predicted step  {rep['predicted_step_time_s'] * 1e3:.1f} ms (planner's model with "
                     f"{rep.get('predicted_with', 'the hardware file')}, as `par3d plan --hardware` gives it)")
    if "pipeline" in rep:
        pl = rep["pipeline"]
        lines.append(f"  bubble (wall)   measured {pl['measured']['bubble_wall']:.1%}   simulated "
                     f"{pl['simulated']['bubble_wall']:.1%}   (p-1)/(m+p-1) = {pl['formula_wall']:.1%}")
        lines.append(f"  pipeline        last step: first action to last {pl['measured']['makespan_s'] * 1e3:.1f} ms "
                     f"(simulated {pl['simulated']['makespan_s'] * 1e3:.1f} ms"
                     + (f", (m+p-1)(tf+tb) = {pl['formula_makespan_s'] * 1e3:.1f} ms"
                        if "formula_makespan_s" in pl else "") + ")"
                     + (f" of a {pl['step_time_s'] * 1e3:.1f} ms step" if pl.get("step_time_s") else ""))
    for g, kinds in rep["comm_last_step"].items():
        parts = ", ".join(f"{k} {v['calls']}x {v['bytes'] / 2**20:.2f} MiB" for k, v in kinds.items())
        lines.append(f"  comm[{g:5s}]     {parts}")
    if rep.get("comm_sizes_last_step"):
        lines += _format_sizes(rep)
    acts = rep["peak_activation_mib"]
    if acts:
        lines.append("  peak activations " + ", ".join(f"{k}: {v:.2f} MiB" for k, v in acts.items()))
    if rep.get("memory", {}).get("measured"):
        lines += _format_memory(rep["memory"])
    if "files" in rep:
        lines.append("  wrote " + ", ".join(rep["files"].values()))
    return "\n".join(lines)
