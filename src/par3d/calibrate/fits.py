"""Fits of `par3d calibrate`: from measured points to the hardware file's numbers.  Pure arithmetic
(no torch), so every fit is tested on synthetic points with known answers (tests/test_calibrate.py).

- `fit_primitives`: per primitive (plan/kernels.py's `FEATURES`), least squares of the forward and
  the backward time on the primitive's regressors, in relative error (sizes span decades);
- `fit_gemm`: t = t0 + FLOPs/R per dtype over plain `torch.mm` calls (the asymptotic rate R is the
  file's `peak_tflops`; the plot shows the small-GEMM efficiency curve);
- `fit_link` / `fit_collectives`: α and β of the planner's ring model (`plan/comm.py`) per
  (kind, group size), the coefficients of α and 1/β being what the model gives for a unit link;
- `residual_overheads`: the runtime's fixed costs per block and per action — what the tiny probes
  took beyond the primitives' own prediction at their shape;
- `fit_contention`: how much slower ranks compute side by side than alone, beyond time-sharing, so
  that the model matches the reference GPT with DP over the cores (and twice as many ranks);
- `fit_collective_sync`, `fit_pipeline_hop`: what a collective / a pipeline transfer costs inside a
  step beyond the α-β fit of isolated calls, read off the planner's own model as d(step)/d(term).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from par3d.plan import comm as plan_comm
from par3d.plan.hardware import GB, US, Link
from par3d.plan.kernels import FEATURES, KernelModel, features

KINDS = ("all_reduce", "all_gather", "reduce_scatter")


def lstsq(rows: Sequence[Sequence[float]], ys: Sequence[float], relative: bool = True) -> list[float]:
    """Least squares y ≈ Σ c_i·x_i (normal equations, Gaussian elimination with pivoting); with
    `relative`, each equation is divided by y so that sizes spanning decades weigh alike.  Each
    column is scaled to unit size first (features differ by twelve orders of magnitude)."""
    k = len(rows[0])
    scale = [max((abs(r[i]) for r in rows), default=1.0) or 1.0 for i in range(k)]
    a = [[0.0] * (k + 1) for _ in range(k)]
    for r, y in zip(rows, ys, strict=True):
        w = 1.0 / (y * y) if relative and y > 0 else 1.0
        x = [r[i] / scale[i] for i in range(k)]
        for i in range(k):
            a[i][k] += w * x[i] * y
            for j in range(k):
                a[i][j] += w * x[i] * x[j]
    for c in range(k):
        p = max(range(c, k), key=lambda i: abs(a[i][c]))
        a[c], a[p] = a[p], a[c]
        if abs(a[c][c]) < 1e-300:
            continue
        for i in range(k):
            if i != c:
                f = a[i][c] / a[c][c]
                for j in range(c, k + 1):
                    a[i][j] -= f * a[c][j]
    return [(a[i][k] / a[i][i] if abs(a[i][i]) > 1e-300 else 0.0) / scale[i] for i in range(k)]


def lstsq2(rows: list[tuple[float, float]], ys: list[float], relative: bool = True) -> tuple[float, float]:
    """y ≈ a·x1 + b·x2."""
    a, b = lstsq(rows, ys, relative)
    return a, b


def rel_rms(pred: Iterable[float], meas: Iterable[float]) -> float:
    errs = [(p - m) / m for p, m in zip(pred, meas, strict=True) if m > 0]
    return (sum(e * e for e in errs) / len(errs)) ** 0.5 if errs else float("nan")


# ---- primitives ----------------------------------------------------------------------------------

def fit_primitives(points: list[dict[str, Any]], dtype: str = "fp32") -> dict[str, Any]:
    """`points`: {"kind", size keys (m/n/k, bh/s/d, elements/rows), "forward_s", "backward_s"}.
    Returns the hardware file's `kernels` table: per primitive the forward and backward
    coefficients and the fit's relative rms error."""
    prims: dict[str, Any] = {}
    for kind in FEATURES:
        pts = [p for p in points if p["kind"] == kind]
        if not pts:
            continue
        rows = [features(kind, **size_of(p)) for p in pts]
        entry: dict[str, Any] = {"features": list(FEATURES[kind]), "points": len(pts)}
        for way in ("forward", "backward"):
            ys = [max(p[way + "_s"], 1e-9) for p in pts]
            coef = lstsq(rows, ys) if len(pts) >= len(rows[0]) else [statistics_mean(ys)] + [0.0] * (len(rows[0]) - 1)
            entry[way] = coef
            entry[way + "_rel_rms"] = rel_rms([max(0.0, sum(c * x for c, x in zip(coef, r))) for r in rows], ys)
        prims[kind] = entry
    return {"dtype": dtype, "primitives": prims}


def statistics_mean(ys: Sequence[float]) -> float:
    return sum(ys) / len(ys)


def size_of(p: dict[str, Any]) -> dict[str, float]:
    keys = ("bh", "r", "c", "d") if p.get("kind") == "ring_block" else \
        ("m", "n", "k", "bh", "s", "d", "elements", "rows")
    return {k: float(p[k]) for k in keys if k in p}


def residual_overheads(measured: dict[str, float], kernels: dict[str, Any] | None,
                       tiny: dict[str, int]) -> dict[str, float]:
    """The runtime's fixed costs beyond its primitives.  `measured`: per-block F/B, per-action F/B
    (apart from blocks) and per-step costs of the tiny probes (`probes.measure_overheads`);
    `tiny`: their shape.  The primitives' own prediction at that shape is taken out (their fixed
    per-call costs are in the kernel fits already), never below zero."""
    if not kernels:
        return dict(measured)
    km = KernelModel.from_dict(kernels)
    h, s, b, v = tiny["hidden"], tiny["seq"], tiny["micro_batch"], tiny["vocab"]
    blk = km.block(h, 4 * h, tiny["heads"], s, b, 1, False)
    emb, head = km.embedding(h, s, b, 1, False), km.head(h, v, s, b, 1, False)
    out = dict(measured)
    out["layer_f_s"] = max(0.0, measured["layer_f_s"] - blk.fwd)
    out["layer_b_s"] = max(0.0, measured["layer_b_s"] - blk.bwd)
    out["action_f_s"] = max(0.0, measured["action_f_s"] - emb[0] - head[0])
    out["action_b_s"] = max(0.0, measured["action_b_s"] - emb[1] - head[1])
    return out


# ---- GEMMs ---------------------------------------------------------------------------------------

def fit_gemm(points: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per dtype: t = t0 + FLOPs/R (least squares, relative error)."""
    fits = {}
    for dt in sorted({p["dtype"] for p in points}):
        pts = [p for p in points if p["dtype"] == dt]
        t0, inv_r = lstsq2([(1.0, p["flops"]) for p in pts], [p["seconds"] for p in pts])
        best = max(p["gflops"] for p in pts) * 1e9
        rate = 1.0 / inv_r if inv_r > 0 else best
        rate = min(max(rate, best), 3 * best)  # the asymptote is at least the best rate seen
        t0 = max(t0, 0.0)
        fits[dt] = {"t0_us": t0 / US, "rate_gflops": rate / 1e9, "best_gflops": best / 1e9,
                    "rel_rms": rel_rms([t0 + p["flops"] / rate for p in pts], [p["seconds"] for p in pts])}
    return fits


# ---- collectives ---------------------------------------------------------------------------------

def _coefficients(kind: str, nbytes: float, g: int) -> tuple[float, float]:
    """(coefficient of α, coefficient of 1/β) in the planner's ring model, from a unit link."""
    unit = Link("unit", 1.0, 1.0)
    c = (plan_comm.p2p(nbytes, unit) if kind in ("p2p", "exchange")
         else getattr(plan_comm, kind)(nbytes, g, unit))
    return c.alpha, c.beta


def fit_link(points: list[dict[str, Any]]) -> dict[str, float]:
    rows = [_coefficients(p["kind"], p["bytes"], p["group"]) for p in points]
    ys = [p["seconds"] for p in points]
    alpha, inv_beta = lstsq2(rows, ys)
    if inv_beta <= 0:  # latency-bound everywhere: bandwidth from the largest message alone
        big = max(points, key=lambda p: p["bytes"])
        inv_beta = big["seconds"] / max(_coefficients(big["kind"], big["bytes"], big["group"])[1], 1.0)
    alpha = max(alpha, 1e-7)
    pred = [alpha * a + inv_beta * b for a, b in rows]
    return {"alpha_us": alpha / US, "bw_gbps": 1.0 / inv_beta / GB, "rel_rms": rel_rms(pred, ys),
            "points": len(points)}


def fit_collectives(points: list[dict[str, Any]]) -> dict[str, Any]:
    fits: dict[str, Any] = {}
    for kind in (*KINDS, "p2p", "exchange"):
        for g in sorted({p["group"] for p in points if p["kind"] == kind}):
            sel = [p for p in points if p["kind"] == kind and p["group"] == g]
            fits.setdefault(kind, {})[str(g)] = fit_link(sel)
    fits["pooled_all_reduce"] = fit_link([p for p in points if p["kind"] == "all_reduce"])
    return fits


# ---- terms read off the planner's model ---------------------------------------------------------

def fit_collective_sync(hw: dict[str, Any], tp_cfg: dict[str, Any], measured_step_s: float) -> float:
    """Seconds each collective costs inside a training step beyond the α-β fit of isolated calls.

    In a step, a rank reaches each of the TP all-reduces at its own moment, and the partner that
    arrives first waits: every collective is a synchronisation point where the ranks' jitter
    (time-shared cores, the OS's threads) adds up.  Fitted on the reference model run with TP over
    all calibration ranks, as sync = (measured − predicted without it) / (collectives on the
    critical path), the latter read off the planner's model as d(step)/d(sync)."""
    from par3d.config import RunConfig
    from par3d.plan.hardware import hardware_from_dict
    from par3d.predict import predict

    cfg = RunConfig.from_dict(tp_cfg)
    base = predict(cfg, hardware_from_dict({**hw, "collective_sync_us": 0.0})).step_time_s
    per_s = (predict(cfg, hardware_from_dict({**hw, "collective_sync_us": 1e3})).step_time_s - base) / 1e-3
    return max(0.0, (measured_step_s - base) / per_s) if per_s > 0 else 0.0


def sync_load(hw: dict[str, Any], cfg: dict[str, Any]) -> float:
    """The ranks per core at which the planner's model prices the sync points of `cfg`
    (plan/cost.py's `point_sync_load`, read before the points' own waits)."""
    from par3d.config import RunConfig
    from par3d.plan import cost
    from par3d.plan.hardware import hardware_from_dict
    from par3d.predict import choice, cluster_of, model_spec

    run = RunConfig.from_dict(cfg).resolve()
    h = hardware_from_dict({k: v for k, v in hw.items() if k not in ("collective_sync", "collective_sync_us")})
    cl, ch, model = cluster_of(h, run), choice(run, strict=True), model_spec(run)
    st = cost.stage_times(model, cl, ch)
    makespan, _, busy = cost.simulate_stages(st, ch)
    return cost.point_sync_load(st, ch, cl.profile, makespan, busy) if cl.profile is not None else 1.0


def fit_point_sync(hw: dict[str, Any], runs: list[tuple[dict[str, Any], float]]) -> dict[str, Any]:
    """The in-step cost of a TP synchronisation point at the load of `runs` (ranks per core,
    `sync_load`, their mean): `latency_us` per point plus `skew` times the CPU work since the
    last point (plan/profile.py's `SyncModel`), such that the planner's model matches the measured
    step times of `runs` best (least squares of the relative errors) — TP runs of GPTs with little
    and much compute between points, which separate the two terms.  The model is nearly linear in
    both: Gauss-Newton on its finite differences, three rounds; a term that would go negative is
    held at 0 and the other refitted alone."""
    from par3d.config import RunConfig
    from par3d.plan.hardware import hardware_from_dict
    from par3d.predict import predict

    cfgs = [RunConfig.from_dict(c) for c, _ in runs]
    meas = [m for _, m in runs]
    ranks_per_core = sum(sync_load(hw, c) for c, _ in runs) / len(runs)

    def steps(lat_us: float, skew: float) -> list[float]:
        sm = {"ranks_per_core": [ranks_per_core], "latency_us": [lat_us], "skew": [skew]}
        h = hardware_from_dict({**hw, "collective_sync": sm})
        return [predict(c, h).step_time_s for c in cfgs]

    def solve(at: tuple[float, float], free: tuple[bool, bool]) -> tuple[float, float]:
        base = steps(*at)
        cols = []
        for i, d in enumerate((100.0, 0.05)):  # µs of latency, skew
            if free[i]:
                moved = steps(at[0] + d, at[1]) if i == 0 else steps(at[0], at[1] + d)
                cols.append([(x1 - x0) / d / m for x0, x1, m in zip(base, moved, meas)])
            else:
                cols.append([0.0] * len(meas))
        r = [(m - x) / m for x, m in zip(base, meas)]
        idx = [i for i in range(2) if free[i]]
        steps_ = lstsq([[cols[i][j] for i in idx] for j in range(len(meas))], r, relative=False)
        out = list(at)
        for i, d in zip(idx, steps_):
            out[i] += d
        return out[0], out[1]

    lat, skew = 0.0, 0.0
    free = (True, len(runs) >= 2)
    for _ in range(3):
        nl, ns = solve((lat, skew), free)
        if ns < 0.0:
            free, skew = (True, False), 0.0
            nl, ns = solve((max(nl, 0.0), 0.0), free)
        if nl < 0.0:
            free, lat = (False, free[1]), 0.0
            nl, ns = solve((0.0, max(ns, 0.0)), free)
        lat, skew = max(nl, 0.0), max(ns, 0.0)
    return {"ranks_per_core": ranks_per_core, "latency_us": lat, "skew": skew,
            "measured_s": meas, "predicted_s": steps(lat, skew)}


def fit_contention(hw: dict[str, Any], cfg: dict[str, Any], measured_step_s: float, key: str,
                   lo: float = 1.0, hi: float = 4.0) -> float:
    """The slowdown `key` that makes the planner's model match a measured run: `solo_slowdown` on one
    rank (the primitives inside a model's step vs timed one by one), `corun_slowdown` with DP over
    as many busy ranks as cores, `oversubscribed_slowdown` with twice as many (ranks computing side
    by side slow each other beyond time-sharing: shared caches and memory bandwidth, the backend's
    threads).  The model's step time grows with the slowdown, so bisection; clamped to [lo, hi]."""
    from par3d.config import RunConfig
    from par3d.plan.hardware import hardware_from_dict
    from par3d.predict import predict

    run = RunConfig.from_dict(cfg)

    def step(x: float) -> float:
        extra = {key: x}
        if key == "corun_slowdown":  # an oversubscribed slowdown not fitted yet follows the co-run one
            extra["oversubscribed_slowdown"] = hw.get("oversubscribed_slowdown", x)
        return predict(run, hardware_from_dict({**hw, **extra})).step_time_s

    if step(lo) >= measured_step_s:
        return lo
    if step(hi) <= measured_step_s:
        return hi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if step(mid) < measured_step_s else (lo, mid)
    return (lo + hi) / 2


def fit_corun(hw: dict[str, Any], runs: list[tuple[dict[str, Any], float]], key: str, key_fixed: str,
              lo: float = 1.0, hi: float = 4.0) -> tuple[float, float]:
    """The co-run slowdowns `key` (the primitives' arithmetic) and `key_fixed` (the fixed costs per
    block, action and step) that make the planner's model match DP runs with every rank computing
    (`runs`: config, measured step), by least squares in relative error.  With every rank of a DP
    layout computing, the model's step is linear in the two: A + x·arithmetic + y·fixed, read off
    three predictions per run.  Each clamped to [lo, hi]; one at its bound, the other refitted."""
    from par3d.config import RunConfig
    from par3d.plan.hardware import hardware_from_dict
    from par3d.predict import predict

    def step(run: RunConfig, x: float, y: float) -> float:
        return predict(run, hardware_from_dict({**hw, key: x, key_fixed: y})).step_time_s

    rows, ys = [], []
    for cfg, t in runs:
        run = RunConfig.from_dict(cfg)
        base = step(run, 1.0, 1.0)
        arith, fixed = step(run, 2.0, 1.0) - base, step(run, 1.0, 2.0) - base
        rows.append((arith, fixed))
        ys.append(t - (base - arith - fixed))  # what the two slowed parts took

    def one(col: int, other: float) -> float:  # the other factor held: least squares of the one left
        num = sum((y - other * r[1 - col]) * r[col] / (y * y) for r, y in zip(rows, ys, strict=True) if y > 0)
        den = sum(r[col] * r[col] / (y * y) for r, y in zip(rows, ys, strict=True) if y > 0)
        return min(hi, max(lo, num / den)) if den > 0 else lo

    x, y = lstsq2(rows, ys) if all(r[1] > 0 for r in rows) else (one(0, 1.0), 1.0)
    if not lo <= x <= hi:
        x = min(hi, max(lo, x))
        y = one(1, x)
    if not lo <= y <= hi:
        y = min(hi, max(lo, y))
        x = one(0, y)
    return x, y


def fit_pipeline_hop(p: int, m: int, stage_ms: float, measured_makespan_s: float) -> dict[str, float]:
    """Seconds a pipeline transfer costs inside a step beyond the α-β fit of isolated sends: the
    seed's §3.3 experiment's makespan beyond the schedule's own, over the number of transfers on
    the critical path (d(makespan)/d(transfer) from the simulator)."""
    from par3d.pipeline.schedules import build
    from par3d.pipeline.simulate import simulate

    t = stage_ms / 1e3
    sched = build("1f1b", p, m)
    base = simulate(sched, p, m, tf=t, tb=t).makespan
    hops = (simulate(sched, p, m, tf=t, tb=t, transfer=1e-3).makespan - base) / 1e-3
    return {"stages": p, "microbatches": m, "stage_ms": stage_ms, "measured_makespan_s": measured_makespan_s,
            "schedule_makespan_s": base, "hops": hops, "hop_s": max(0.0, (measured_makespan_s - base) / hops)}


__all__ = ["KINDS", "fit_collective_sync", "fit_collectives", "fit_contention", "fit_corun", "fit_gemm", "fit_link", "fit_pipeline_hop",
           "fit_point_sync", "sync_load",
           "fit_primitives", "lstsq", "lstsq2", "rel_rms", "residual_overheads"]
