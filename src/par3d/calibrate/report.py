"""The calibration's summary (text) and plot: measured points beside their fits."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from par3d.calibrate.fits import KINDS
from par3d.plan import comm as plan_comm
from par3d.plan.hardware import GB, US, Link


def plot(hw: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meas = hw["measurements"]
    fig, axes = plt.subplots(1, 4, figsize=(21, 4.8))
    _primitives_panel(axes[3], hw)
    ax = axes[0]
    for dt, f in hw["gemm_fit"].items():
        pts = sorted((p for p in meas["gemm"] if p["dtype"] == dt), key=lambda p: p["flops"])
        line = ax.plot([p["flops"] for p in pts], [p["gflops"] for p in pts], "o", ms=4, label=f"{dt} measured")
        lo, hi = pts[0]["flops"], pts[-1]["flops"]
        xs = [lo * (hi / lo) ** (i / 60) for i in range(61)]
        t0, r = f["t0_us"] * US, f["rate_gflops"] * 1e9
        ax.plot(xs, [x / (t0 + x / r) / 1e9 for x in xs], "-", color=line[0].get_color(),
                label=f"{dt} fit: t0={f['t0_us']:.1f} µs, R={f['rate_gflops']:.1f} GFLOP/s")
    ax.set_xscale("log")
    ax.set_xlabel("FLOPs per GEMM")
    ax.set_ylabel("GFLOP/s (one rank)")
    ax.set_title("GEMM rate: small-GEMM efficiency curve")
    ax.legend(fontsize=7)

    def curves(ax: Any, sel: Callable[[dict[str, Any]], bool], label: Callable[[dict[str, Any]], str],
               fit_of: Callable[[dict[str, Any]], dict[str, float]]) -> None:
        keys = sorted({(p["kind"], p["group"]) for p in meas["collectives"] if sel(p)})
        for kind, g in keys:
            pts = sorted((p for p in meas["collectives"] if p["kind"] == kind and p["group"] == g),
                         key=lambda p: p["bytes"])
            f = fit_of({"kind": kind, "group": g})
            link = Link("fit", f["alpha_us"] * US, f["bw_gbps"] * GB)
            line = ax.plot([p["bytes"] for p in pts], [p["seconds"] * 1e6 for p in pts], "o", ms=4,
                           label=label({"kind": kind, "group": g}) +
                           f": α={f['alpha_us']:.0f} µs, β={f['bw_gbps']:.2f} GB/s")
            pred = [(plan_comm.p2p(p["bytes"], link) if kind in ("p2p", "exchange")
                     else getattr(plan_comm, kind)(p["bytes"], g, link)).total * 1e6 for p in pts]
            ax.plot([p["bytes"] for p in pts], pred, "-", color=line[0].get_color())
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("message bytes")
        ax.set_ylabel("µs")
        ax.legend(fontsize=7)

    cf = hw["collective_fits"]
    if meas["collectives"]:
        gmax = max(p["group"] for p in meas["collectives"])
        curves(axes[1], lambda p: p["group"] == 2 or p["kind"] in ("p2p", "exchange"),
               lambda k: f"{k['kind']} ({k['group']} ranks)", lambda k: cf[k["kind"]][str(k["group"])])
        axes[1].set_title("collectives on 2 ranks: measured (dots), ring α-β fit (lines)")
        curves(axes[2], lambda p: p["kind"] == "all_reduce",
               lambda k: f"all-reduce {k['group']} ranks", lambda k: cf["all_reduce"][str(k["group"])])
        axes[2].set_title(f"all-reduce over 2..{gmax} ranks")
    else:  # --nproc 1 on a one-GPU machine: nothing measured between ranks (the catalogue's links are kept)
        for ax in axes[1:3]:
            ax.text(0.5, 0.5, "collectives not measured\n(one rank: --nproc 1)", ha="center", va="center",
                    transform=ax.transAxes)
            ax.set_axis_off()
    fig.suptitle(f"par3d calibrate — {hw['device']['name']}; fixed costs per block F/B "
                 f"{hw['overheads']['layer_f_s'] * 1e6:.0f}/{hw['overheads']['layer_b_s'] * 1e6:.0f} µs",
                 fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _primitives_panel(ax: Any, hw: dict[str, Any]) -> None:
    """Every primitive's measured forward and backward time against its fit (plan/kernels.py)."""
    from par3d.calibrate.fits import size_of
    from par3d.plan.kernels import FEATURES, KernelModel

    pts = [p for p in hw.get("measurements", {}).get("primitives") or [] if p["kind"] in FEATURES]
    if not pts or not hw.get("kernels"):
        ax.set_axis_off()
        return
    km = KernelModel.from_dict(hw["kernels"])
    for kind in sorted({p["kind"] for p in pts}):
        sel = [p for p in pts if p["kind"] == kind]
        for way, marker in (("forward", "o"), ("backward", "^")):
            pred = [km.time(kind, **size_of(p))[0 if way == "forward" else 1] * 1e6 for p in sel]
            ax.scatter([p[way + "_s"] * 1e6 for p in sel], pred, s=14, marker=marker,
                       label=f"{kind} {way[0].upper()}" if way == "forward" else None, alpha=0.8)
    vals = [p[w + "_s"] * 1e6 for p in pts for w in ("forward", "backward") if p[w + "_s"] > 0]
    lo, hi = min(vals) * 0.7, max(vals) * 1.4
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured µs (o forward, ^ backward)")
    ax.set_ylabel("fit µs")
    ax.set_title("primitives: measured vs fit (kernels)")
    ax.legend(fontsize=6)


def summary(hw: dict[str, Any]) -> str:
    d, ov = hw["device"], hw["overheads"]
    lines = [f"device      {d['name']}: " + ", ".join(f"{k} {v * 1e3:.1f} GFLOP/s" for k, v in d["peak_tflops"].items())
             + f" (asymptotic GEMM rate), memory {d['mem_bw_gbps']:.1f} GB/s",
             f"overheads   block F {ov['layer_f_s'] * 1e6:.0f} µs, B {ov['layer_b_s'] * 1e6:.0f} µs; action F "
             f"{ov['action_f_s'] * 1e6:.0f} µs, B {ov['action_b_s'] * 1e6:.0f} µs; step {ov['step_s'] * 1e3:.2f} ms"]
    if "intra" in hw:
        lines += [f"intra link  α={hw['intra']['alpha_us']:.1f} µs, β={hw['intra']['bw_gbps']:.3f} GB/s "
                  f"(pooled all-reduce fit, rel. rms {hw['collective_fits']['pooled_all_reduce']['rel_rms']:.0%})",
                  f"p2p         α={hw['links']['p2p']['alpha_us']:.1f} µs, β={hw['links']['p2p']['bw_gbps']:.3f} GB/s"]
    else:  # `--nproc 1` on one GPU (run.calibrate)
        lines.append("links       not measured (one GPU): the planner keeps the catalogue's for this GPU")
    for kind, k in (hw.get("kernels") or {}).get("primitives", {}).items():
        bwd = "" if kind == "merge" else f", backward {k['backward_rel_rms']:.0%}"  # the merge has no backward
        lines.append(f"  {kind:15s} fit over {k['points']} sizes: rel. rms forward {k['forward_rel_rms']:.0%}{bwd}")
    if hw.get("host"):
        h = hw["host"]
        lines.append(f"host        {h.get('gpu') or h.get('cpu')}, {h.get('cores')} cores, torch {h.get('torch')}, "
                     f"{h.get('date')}")
    if hw.get("corun_slowdown") is not None:
        lines.append(f"co-run      {hw['corun_slowdown']:.2f}x slower with every core busy, "
                     f"{hw.get('oversubscribed_slowdown', 1.0):.2f}x with twice as many ranks as cores "
                     f"(beyond time-sharing)")
        if hw.get("corun_fixed_slowdown") is not None:
            lines.append(f"co-run      fixed costs {hw['corun_fixed_slowdown']:.2f}x with every core busy, "
                         f"{hw.get('oversubscribed_fixed_slowdown', 1.0):.2f}x with twice as many")
        dp = (hw.get("measurements") or {}).get("reference_dp") or {}
        for key, label in (("corun_slowdown", "every core busy"), ("oversubscribed_slowdown", "twice as many")):
            if dp.get(key, {}).get("fits"):
                lines.append(f"  {label}, one factor per GPT: {', '.join(f'{x:.2f}' for x in dp[key]['fits'])} "
                             f"(reference, then the speed check's GPTs)")
    if hw.get("collective_sync"):
        cs = hw["collective_sync"]
        for rpc, lat, skew in zip(cs["ranks_per_core"], cs["latency_us"], cs["skew"]):
            lines.append(f"sync        {lat:.0f} µs per TP/CP sync point + {skew:.2f} x the CPU work since the last, "
                         f"{rpc:g} rank(s) per core")
    elif hw.get("collective_sync_us") is not None:
        lines.append(f"sync        {hw['collective_sync_us']:.0f} µs per collective inside a step, beyond its α-β fit")
    if hw.get("pipeline_hop_us") is not None:
        lines.append(f"hop         {hw['pipeline_hop_us']:.0f} µs per pipeline transfer inside a step, beyond its α-β fit")
    for kind in (*KINDS, "p2p", "exchange"):
        for g, f in hw["collective_fits"].get(kind, {}).items():
            lines.append(f"  {kind:15s} {g} ranks: α={f['alpha_us']:7.1f} µs  β={f['bw_gbps']:7.3f} GB/s  "
                         f"rel. rms {f['rel_rms']:.0%}")
    return "\n".join(lines)
