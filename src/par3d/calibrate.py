"""`par3d calibrate`: measure this machine and write a hardware file the planner reads.

What one rank achieves is measured, as a rank runs in training: one intra-op thread on a CPU
(`par3d train` gives each rank one), the rank's GPU where CUDA is present.

1. GEMMs: FLOP/s over transformer-like and square shapes, per dtype.  A least-squares fit of
   t = t0 + FLOPs/R per dtype gives the asymptotic rate R (the file's `peak_tflops`) and the
   fixed cost t0 of one call; achieved/R is the small-GEMM efficiency curve (plotted).
2. Memory bandwidth: a large tensor copy, bytes read + written per second.
3. Fixed overheads of the training runtime (see predict.py): `par3d.train.worker` on one rank with
   a tiny GPT (1 and 5 layers, 4 micro-batches) whose arithmetic is negligible: the per-block
   and per-action costs of forward and backward come from its recorded pipeline events, the
   per-step cost from its step time.  Then one reference-size GPT run gives `efficiency`, the
   share of R a real block reaches once those overheads are removed.
4. Collectives: all-reduce, all-gather, reduce-scatter (par3d.comm's, on gloo or NCCL) over
   message sizes and group sizes 2..nproc, and send/recv ping-pong; α and β are fitted per
   (kind, group size) by least squares on the planner's ring model (`plan/comm.py`): the
   coefficients of α and 1/β are what that model gives for a unit link.  The `intra` link is
   the pooled all-reduce fit (TP and DP use all-reduce); send/recv goes to `links.p2p`.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from par3d.plan import comm as plan_comm
from par3d.plan.hardware import GB, TFLOPS, US, Link

KINDS = ("all_reduce", "all_gather", "reduce_scatter")


# ---- timing helpers --------------------------------------------------------------------------------

def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_call(fn: Callable[[], Any], min_s: float = 0.02, repeats: int = 3) -> float:
    """Least over `repeats` of the mean time of `fn` in a loop that lasts at least `min_s` (other
    processes on a shared machine only ever add time, so the least sample is the machine's)."""
    fn()
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    one = max(time.perf_counter() - t0, 1e-7)
    n = max(1, int(min_s / one))
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        _sync()
        out.append((time.perf_counter() - t0) / n)
    return min(out)


def lstsq2(rows: list[tuple[float, float]], ys: list[float], relative: bool = True) -> tuple[float, float]:
    """Least squares for y ≈ a·x1 + b·x2; with `relative`, each equation is divided by y so that
    sizes spanning decades weigh alike (a fit of relative error)."""
    s11 = s12 = s22 = r1 = r2 = 0.0
    for (x1, x2), y in zip(rows, ys, strict=True):
        w = 1.0 / (y * y) if relative and y > 0 else 1.0
        s11 += w * x1 * x1
        s12 += w * x1 * x2
        s22 += w * x2 * x2
        r1 += w * x1 * y
        r2 += w * x2 * y
    det = s11 * s22 - s12 * s12
    if abs(det) < 1e-300:
        return 0.0, (r2 / s22 if s22 else 0.0)
    return (r1 * s22 - r2 * s12) / det, (s11 * r2 - s12 * r1) / det


def rel_rms(pred: Iterable[float], meas: Iterable[float]) -> float:
    errs = [(p - m) / m for p, m in zip(pred, meas, strict=True) if m > 0]
    return (sum(e * e for e in errs) / len(errs)) ** 0.5 if errs else float("nan")


# ---- 1. GEMMs ------------------------------------------------------------------------------------

def gemm_shapes(quick: bool) -> list[tuple[int, int, int]]:
    """(M, N, K): tokens × out × in of transformer projections, plus squares for the asymptote."""
    tokens = (64, 256, 1024) if quick else (32, 64, 128, 256, 512, 1024, 2048)
    hidden = (64, 128) if quick else (32, 64, 128, 256)
    shapes = [(t, 4 * h, h) for t in tokens for h in hidden] + [(t, h, 4 * h) for t in tokens[-2:] for h in hidden]
    shapes += [(n, n, n) for n in ((256, 512) if quick else (128, 256, 512, 768, 1024))]
    return shapes


def measure_gemms(dtypes: list[str], quick: bool, tick: Callable[[], None]) -> list[dict[str, Any]]:
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    out = []
    for dt in dtypes:
        tdt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dt]
        for m, n, k in gemm_shapes(quick):
            a = torch.randn(m, k, dtype=tdt, device=dev)
            b = torch.randn(k, n, dtype=tdt, device=dev)
            s = time_call(lambda a=a, b=b: torch.mm(a, b), min_s=0.01 if quick else 0.03)
            out.append({"dtype": dt, "m": m, "n": n, "k": k, "flops": 2.0 * m * n * k, "seconds": s,
                        "gflops": 2.0 * m * n * k / s / 1e9})
            tick()
    return out


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


# ---- 2. memory bandwidth -------------------------------------------------------------------------

def measure_mem_bw(quick: bool) -> float:
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n = (8 if quick else 32) * 2**20 // 4  # far beyond the last-level cache
    a = torch.empty(n, device=dev)
    b = torch.ones(n, device=dev)
    s = time_call(lambda: a.copy_(b), min_s=0.05)
    return 2.0 * 4 * n / s  # read b + write a


# ---- 3. runtime overheads and efficiency ------------------------------------------------------------

def probe_config(layers: int, hidden: int, heads: int, seq: int, micro_batch: int, m: int,
                 steps: int) -> dict[str, Any]:
    from par3d.config import ModelConfig, ParallelConfig, RunConfig, TrainConfig

    cfg = RunConfig(model=ModelConfig(vocab=256, seq_len=seq, layers=layers, hidden=hidden, heads=heads),
                    parallel=ParallelConfig(microbatches=m),
                    train=TrainConfig(global_batch=micro_batch * m, micro_batch=micro_batch, steps=steps,
                                      warmup=0),
                    progress=False)
    return cfg.validate().to_dict()


def run_probe(cfg_dict: dict[str, Any]) -> dict[str, float]:
    """One rank, in this process: the median step time (first step skipped: the statistic
    `bench fidelity` and the end-of-run report measure) and the least F / B action durations of the
    last step (least, because other processes only ever add time; only their differences are used)."""
    from par3d.train import worker

    r = worker(cfg_dict, {"quiet": True})
    hist = r["history"][1:] or r["history"]
    ev = r["events"]
    f = [e["end"] - e["start"] for e in ev if e["kind"] == "F"]
    b = [e["end"] - e["start"] for e in ev if e["kind"] == "B"]
    return {"step_s": statistics.median(h["step_time_s"] for h in hist), "f_s": min(f), "b_s": min(b),
            "m": len(f)}


REFERENCE = {"layers": 4, "hidden": 128, "heads": 4, "seq": 64, "micro_batch": 8, "m": 1}
# the reference is also run at these micro-batch sizes: efficiency as a function of the tokens per
# micro-batch (predict.efficiency_at)
EFFICIENCY_MICRO_BATCHES = (2, 8, 16)


def overhead_passes(quick: bool) -> int:
    return 2 if quick else 3


def measure_overheads(quick: bool, tick: Callable[[], None]) -> dict[str, Any]:
    """Fixed costs per block, per action and per step, and the reference's step time at each of
    `EFFICIENCY_MICRO_BATCHES`.

    This VM's speed drifts by tens of per cent over minutes (the per-block cost of the same probe
    came out 200–460 µs in runs ten minutes apart), and a calibration taken in a slow minute
    skews every prediction after it.  So the probes are taken in `overhead_passes` rounds, the 1-
    and 5-layer probes and the references back to back in each, and every quantity is the median
    over the rounds."""
    steps = 5 if quick else 9
    tiny = {"hidden": 16, "heads": 2, "seq": 8, "micro_batch": 1, "m": 4}  # 4 actions: 4 samples each
    # the references anchor efficiency, co-run and sync: more steps, as their medians matter most
    ref_cfgs = {b: probe_config(steps=2 * steps - 1, **{**REFERENCE, "micro_batch": b})
                for b in EFFICIENCY_MICRO_BATCHES}
    rounds: list[dict[str, Any]] = []
    for _ in range(overhead_passes(quick)):
        probes = {}
        for name, layers in (("l1", 1), ("l5", 5)):
            probes[name] = run_probe(probe_config(layers=layers, steps=steps, **tiny))
        p1, p5 = probes["l1"], probes["l5"]
        layer_f = max((p5["f_s"] - p1["f_s"]) / 4, 0.0)
        layer_b = max((p5["b_s"] - p1["b_s"]) / 4, 0.0)
        # the step's own cost: what the step takes beyond its actions
        step_s = min(p["step_s"] - p["m"] * (p["f_s"] + p["b_s"]) for p in probes.values())
        ov = {"layer_f_s": layer_f, "layer_b_s": layer_b, "action_f_s": max(p1["f_s"] - layer_f, 0.0),
              "action_b_s": max(p1["b_s"] - layer_b, 0.0), "step_s": max(step_s, 0.0)}
        refs = {b: run_probe(c) for b, c in ref_cfgs.items()}
        rounds.append({"overheads": ov, "probes": probes, "reference": refs[REFERENCE["micro_batch"]],
                       "reference_by_micro_batch": {str(b): r["step_s"] for b, r in refs.items()}})
        tick()
    tick()
    med = statistics.median
    ov = {k: med(r["overheads"][k] for r in rounds) for k in rounds[0]["overheads"]}
    ref = {k: med(r["reference"][k] for r in rounds) for k in rounds[0]["reference"]}
    by_mb = {b: med(r["reference_by_micro_batch"][str(b)] for r in rounds) for b in ref_cfgs}
    return {"overheads": ov, "probes": rounds[-1]["probes"], "reference": {**REFERENCE, **ref},
            "reference_by_micro_batch": by_mb, "rounds": rounds, "_ref_cfgs": ref_cfgs}


def corun_worker(cfg_dict: dict[str, Any]) -> float:
    """One of several processes running the reference at once, each on its own (no
    communication), with the one thread a training rank gets: its median step time."""
    import torch

    torch.set_num_threads(1)
    return probe_worker(cfg_dict)


def measure_corun(ref_cfg: dict[str, Any], cores: int, repeats: int = 3) -> dict[str, float]:
    """How much slower one rank computes when others compute beside it, beyond plain time-sharing.

    The reference is run by 1, `cores` and 2·`cores` independent processes at once, back to back,
    `repeats` times over (so the machine's drift falls on all three alike); per repeat, the step
    time of n processes over the solo one, divided by the time-sharing factor max(1, n/cores), and
    the median over repeats.  `at_cores` is the cost of shared caches and memory bandwidth;
    `oversubscribed` adds what time-sharing itself costs (context switches, cold caches)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if cores < 2:
        return {"at_cores": 1.0, "oversubscribed": 1.0}
    ratios: dict[int, list[float]] = {cores: [], 2 * cores: []}
    with ProcessPoolExecutor(2 * cores, mp_context=multiprocessing.get_context("spawn")) as ex:
        list(ex.map(corun_worker, [ref_cfg] * 2 * cores))  # start every worker (torch import) first
        for _ in range(repeats):
            solo = next(iter(ex.map(corun_worker, [ref_cfg])))
            for n in ratios:
                many = statistics.median(ex.map(corun_worker, [ref_cfg] * n))
                ratios[n].append(many / solo / max(1.0, n / cores))
    return {"at_cores": max(1.0, statistics.median(ratios[cores])),
            "oversubscribed": max(1.0, statistics.median(ratios[2 * cores]))}


def fit_efficiency(hw: dict[str, Any], ref_cfg: dict[str, Any], measured_step_s: float) -> float:
    """The efficiency e that makes the predicted reference step equal the measured one:
    step(e) = fixed + compute/e, so e = compute / (measured - fixed), both from predict.py."""
    from par3d.config import RunConfig
    from par3d.predict import predict, with_efficiency

    prof = profile_of(hw)
    cfg = RunConfig.from_dict(ref_cfg)
    at1 = predict(cfg, with_efficiency(prof, 1.0)).step_time_s
    fixed = predict(cfg, with_efficiency(prof, 1e9)).step_time_s  # compute → 0: only fixed costs
    compute = at1 - fixed
    return min(1.0, max(0.02, compute / max(measured_step_s - fixed, 1e-9)))


def probe_worker(cfg_dict: dict[str, Any]) -> float:
    """On every rank of a launched world: the median step time of `cfg_dict` (first step skipped)."""
    from par3d.train import worker

    hist = worker(cfg_dict, {"quiet": True})["history"]
    return statistics.median(h["step_time_s"] for h in hist[1:] or hist)


def profile_of(hw: dict[str, Any]) -> Any:
    """A hardware file's content not yet written, as the planner reads it."""
    from par3d.plan.hardware import hardware_from_dict

    return hardware_from_dict(hw, "calibration")


def fit_collective_sync(hw: dict[str, Any], tp_cfg: dict[str, Any], measured_step_s: float) -> float:
    """Seconds each collective costs inside a training step beyond the α-β fit of isolated calls.

    In a step, a rank reaches each of the TP all-reduces at its own moment, and the partner that
    arrives first waits: every collective is a synchronisation point where the ranks' jitter
    (time-shared cores, the OS's threads) adds up.  Fitted on the reference model run with TP over
    all calibration ranks, as sync = (measured − predicted without it) / (collectives on the
    critical path), the latter read off predict.py as d(step)/d(sync)."""
    from par3d.config import RunConfig
    from par3d.predict import predict

    cfg = RunConfig.from_dict(tp_cfg)
    prof = profile_of({**hw, "collective_sync_us": 0.0})
    base = predict(cfg, prof).step_time_s
    per_s = (predict(cfg, profile_of({**hw, "collective_sync_us": 1e3})).step_time_s - base) / 1e-3
    return max(0.0, (measured_step_s - base) / per_s) if per_s > 0 else 0.0


def fit_pipeline_hop(nproc: int, quick: bool) -> dict[str, float]:
    """Seconds a pipeline transfer costs inside a step beyond the α-β fit of isolated sends.

    The seed's section 3.3 experiment (`bench synthetic`): `nproc` stages that wait 2 ms instead of
    computing, 1F1B over 4 micro-batches, so the measured makespan beyond the schedule's own is the
    transfers on the critical path (posting a send, waking the receiving rank).  The simulator
    gives d(makespan)/d(transfer), the number of such hops; hop = excess / hops."""
    from par3d.bench.synthetic import measure
    from par3d.pipeline.schedules import build
    from par3d.pipeline.simulate import simulate

    p, m, t = max(2, nproc), 4, 2.0
    got = measure("1f1b", p, m, t, t, steps=4 if quick else 8)
    sched = build("1f1b", p, m)
    base = simulate(sched, p, m, tf=t / 1e3, tb=t / 1e3).makespan
    hops = (simulate(sched, p, m, tf=t / 1e3, tb=t / 1e3, transfer=1e-3).makespan - base) / 1e-3
    return {"stages": p, "microbatches": m, "stage_ms": t, "measured_makespan_s": got["measured_makespan_s"],
            "schedule_makespan_s": base, "hops": hops,
            "hop_s": max(0.0, (got["measured_makespan_s"] - base) / hops)}


# ---- 4. collectives ----------------------------------------------------------------------------

def message_sizes(quick: bool) -> list[int]:
    """Bytes per message: 2^k from 256 B to 4 MiB (1 MiB when quick), multiples of 64 B·ranks."""
    hi = 20 if quick else 22
    return [2**k for k in range(8, hi + 1, 2 if quick else 1)]


def collective_worker(sizes: list[int], quick: bool, show_bar: bool) -> list[dict[str, Any]]:
    """Runs on every rank of a launched world; rank 0 returns the measurements."""
    import torch
    import torch.distributed as dist

    from par3d import comm
    from par3d.mesh import Group

    rank, world = dist.get_rank(), dist.get_world_size()
    reps = 3 if quick else 5
    out: list[dict[str, Any]] = []
    bar = None
    if rank == 0 and show_bar:
        from tqdm import tqdm

        bar = tqdm(total=(world - 1) * len(sizes) * len(KINDS) + len(sizes), desc="collectives",
                   unit="pt", file=sys.stderr, dynamic_ncols=True, leave=False)
    comm.COUNTER.enabled = False

    def timed(fn: Callable[[], Any], nbytes: int) -> float:
        fn()  # warm-up (connections, buffers)
        n = max(2, min(200, int(2e6 / max(nbytes, 1))))  # small messages: more calls per sample
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            samples.append((time.perf_counter() - t0) / n)
        return statistics.median(samples)

    for g in range(2, world + 1):
        ranks = list(range(g))
        pg = dist.new_group(ranks)  # every rank creates every group, in the same order
        if rank < g:
            grp = Group("calib", ranks, rank, pg)
            for kind in KINDS:
                for nbytes in sizes:
                    n = max(nbytes // 4, g) // g * g  # fp32 elements, divisible by the group
                    full = torch.ones(n)
                    part = torch.ones(n // g)
                    fn = {"all_reduce": lambda full=full, grp=grp: comm.all_reduce(full, grp),
                          "all_gather": lambda part=part, grp=grp: comm.all_gather(part, grp),
                          "reduce_scatter": lambda full=full, grp=grp: comm.reduce_scatter(full, grp)}[kind]
                    s = timed(fn, 4 * n)
                    out.append({"kind": kind, "group": g, "bytes": 4 * n, "seconds": s})
                    if bar is not None:
                        bar.update(1)
        dist.barrier()
    # send/recv between ranks 0 and 1: ping-pong, half a round trip per message, through the
    # transport the pipeline runtime will use here (shared memory between CPU ranks on one host)
    from par3d.pipeline import shm

    pair = dist.new_group([0, 1])
    use_shm = shm.agree(Group("pp", [0, 1], rank, pair), torch.device("cpu"), "auto") if rank < 2 else None
    for nbytes in sizes:
        t = torch.ones(nbytes // 4)
        if rank < 2:
            other = 1 - rank
            if use_shm is not None:
                link = shm.ShmTransport(Group("pp", [0, 1], rank, pair), rank, 2, 1, 1, tuple(t.shape),
                                        t.dtype, use_shm, 60.0, {"act", "grad"}, {"act", "grad"})

                def pp(t: torch.Tensor = t, link: shm.ShmTransport = link) -> None:
                    # rank 0 sends "act" (to stage 1) and takes "grad" back; rank 1 the mirror
                    if rank == 0:
                        link.send(t, "act", 1, 0)
                        link.recv("grad", 0, 0)
                    else:
                        link.recv("act", 1, 0)
                        link.send(t, "grad", 0, 0)
            else:
                def pp(t: torch.Tensor = t, other: int = other) -> None:
                    if rank == 0:
                        dist.send(t, other)
                        dist.recv(t, other)
                    else:
                        dist.recv(t, other)
                        dist.send(t, other)
            seconds = timed(pp, nbytes) / 2
            if rank == 0:
                out.append({"kind": "p2p", "group": 2, "bytes": nbytes, "seconds": seconds,
                            "transport": "shm" if use_shm is not None else "backend"})
        if bar is not None:
            bar.update(1)
        dist.barrier()
    if bar is not None:
        bar.close()
    return out if rank == 0 else []


def _coefficients(kind: str, nbytes: float, g: int) -> tuple[float, float]:
    """(coefficient of α, coefficient of 1/β) in the planner's ring model, from a unit link."""
    unit = Link("unit", 1.0, 1.0)
    c = (plan_comm.p2p(nbytes, unit) if kind == "p2p"
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
    for kind in (*KINDS, "p2p"):
        for g in sorted({p["group"] for p in points if p["kind"] == kind}):
            sel = [p for p in points if p["kind"] == kind and p["group"] == g]
            fits.setdefault(kind, {})[str(g)] = fit_link(sel)
    fits["pooled_all_reduce"] = fit_link([p for p in points if p["kind"] == "all_reduce"])
    return fits


# ---- the whole calibration -------------------------------------------------------------------

def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def machine_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def mem_gib_per_rank(nproc: int) -> float:
    try:
        with open("/proc/meminfo") as fh:
            kib = next(int(line.split()[1]) for line in fh if line.startswith("MemTotal"))
        return kib / 2**20 / max(nproc, 1)
    except (OSError, StopIteration):
        return 4.0


def calibrate(nproc: int = 2, quick: bool = False, progress: bool = True) -> dict[str, Any]:
    """Measure everything; return the hardware file's content (a dict)."""
    import torch

    from par3d.distributed import launch

    torch.set_num_threads(1)  # what one training rank gets
    on_gpu = torch.cuda.is_available()
    dtypes = ["fp32", "bf16"]
    n_gemm = len(gemm_shapes(quick)) * len(dtypes)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n_gemm + 1 + overhead_passes(quick) + 1 + 1 + 3, desc="calibrate", unit="probe", file=sys.stderr,
                   dynamic_ncols=True)

    def tick() -> None:
        if bar is not None:
            bar.update(1)

    t_start = time.time()
    gemms = measure_gemms(dtypes, quick, tick)
    gfit = fit_gemm(gemms)
    mem_bw = measure_mem_bw(quick)
    tick()
    over = measure_overheads(quick, tick)
    coll = launch(collective_worker, nproc, (message_sizes(quick), quick, progress), timeout_s=120,
                  wall_timeout_s=900, threads=1)[0]
    tick()
    if bar is not None:
        bar.close()
    cfits = fit_collectives(coll)
    pooled, p2p = cfits["pooled_all_reduce"], cfits["p2p"]["2"]
    link = {"name": f"{'nccl' if on_gpu else 'gloo'}-local", "alpha_us": pooled["alpha_us"],
            "bw_gbps": pooled["bw_gbps"]}
    name = torch.cuda.get_device_name(0) if on_gpu else f"{cpu_name()} (1 thread)"
    hw: dict[str, Any] = {
        "device": {"name": name,
                   "peak_tflops": {dt: f["rate_gflops"] * 1e9 / TFLOPS for dt, f in gfit.items()},
                   "mem_bw_gbps": mem_bw / GB, "mem_gib": mem_gib_per_rank(nproc), "sms": 1,
                   "efficiency": 1.0},
        "gpus_per_node": nproc,
        "intra": link,
        "inter": dict(link, name=link["name"] + " (same machine)"),
        "cores": None if on_gpu else machine_cores(),
        "threads_per_rank": 1,
        "overheads": over["overheads"],
        "links": {"p2p": {"alpha_us": p2p["alpha_us"], "bw_gbps": p2p["bw_gbps"]}},
        "gemm_fit": gfit,
        "collective_fits": cfits,
    }
    # the efficiency at each micro-batch size (few-row GEMMs run slower); the file's single value
    # is the one at the reference's
    eff = {b: fit_efficiency(hw, over["_ref_cfgs"][b], step_s) for b, step_s in over["reference_by_micro_batch"].items()}
    hw["efficiency_by_tokens"] = [[b * REFERENCE["seq"], e] for b, e in eff.items()]
    hw["device"]["efficiency"] = eff[REFERENCE["micro_batch"]]
    ref_cfg = over["_ref_cfgs"][REFERENCE["micro_batch"]]
    if not on_gpu:
        corun = measure_corun(ref_cfg, machine_cores(), repeats=2 if quick else 3)
        hw["corun_slowdown"] = corun["at_cores"]
        hw["oversubscribed_slowdown"] = corun["oversubscribed"]
    tick()
    # the reference with TP over the calibration ranks: what a collective costs inside a step
    tp_cfg = {**ref_cfg, "parallel": {**ref_cfg["parallel"], "tp": nproc}}
    tp_step = launch(probe_worker, nproc, (tp_cfg,), timeout_s=120, wall_timeout_s=600, threads=1)[0]
    hw["collective_sync_us"] = fit_collective_sync(hw, tp_cfg, tp_step) / US
    tick()
    hop = fit_pipeline_hop(nproc, quick)
    hw["pipeline_hop_us"] = hop["hop_s"] / US
    tick()
    hw["measurements"] = {"gemm": gemms, "mem_bw_gbps": mem_bw / GB, "probes": over["probes"],
                          "overhead_rounds": over["rounds"],
                          "reference": over["reference"], "collectives": coll,
                          "reference_by_micro_batch": over["reference_by_micro_batch"],
                          "reference_tp": {"tp": nproc, "step_s": tp_step}, "pipeline_hop": hop}
    hw["calibrated"] = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                        "torch": torch.__version__, "host_cores": machine_cores(), "nproc": nproc,
                        "quick": quick, "seconds": round(time.time() - t_start, 1),
                        "load_average": list(os.getloadavg())}  # other processes perturb timings
    return hw


# ---- the plot ----------------------------------------------------------------------------------

def plot(hw: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meas = hw["measurements"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
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
            pred = [(plan_comm.p2p(p["bytes"], link) if kind == "p2p"
                     else getattr(plan_comm, kind)(p["bytes"], g, link)).total * 1e6 for p in pts]
            ax.plot([p["bytes"] for p in pts], pred, "-", color=line[0].get_color())
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("message bytes")
        ax.set_ylabel("µs")
        ax.legend(fontsize=7)

    cf = hw["collective_fits"]
    gmax = max(p["group"] for p in meas["collectives"])
    curves(axes[1], lambda p: p["group"] == 2 or p["kind"] == "p2p",
           lambda k: f"{k['kind']} ({k['group']} ranks)", lambda k: cf[k["kind"]][str(k["group"])])
    axes[1].set_title("collectives on 2 ranks: measured (dots), ring α-β fit (lines)")
    curves(axes[2], lambda p: p["kind"] == "all_reduce",
           lambda k: f"all-reduce {k['group']} ranks", lambda k: cf["all_reduce"][str(k["group"])])
    axes[2].set_title(f"all-reduce over 2..{gmax} ranks")
    fig.suptitle(f"par3d calibrate — {hw['device']['name']}; block efficiency "
                 f"{hw['device']['efficiency']:.0%} of R; overheads per block F/B "
                 f"{hw['overheads']['layer_f_s'] * 1e6:.0f}/{hw['overheads']['layer_b_s'] * 1e6:.0f} µs",
                 fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(hw: dict[str, Any]) -> str:
    d, ov = hw["device"], hw["overheads"]
    lines = [f"device      {d['name']}: " + ", ".join(f"{k} {v * 1e3:.1f} GFLOP/s" for k, v in d["peak_tflops"].items())
             + f" (asymptotic GEMM rate), block efficiency {d['efficiency']:.0%}, memory {d['mem_bw_gbps']:.1f} GB/s",
             f"overheads   block F {ov['layer_f_s'] * 1e6:.0f} µs, B {ov['layer_b_s'] * 1e6:.0f} µs; action F "
             f"{ov['action_f_s'] * 1e6:.0f} µs, B {ov['action_b_s'] * 1e6:.0f} µs; step {ov['step_s'] * 1e3:.2f} ms",
             f"intra link  α={hw['intra']['alpha_us']:.1f} µs, β={hw['intra']['bw_gbps']:.3f} GB/s "
             f"(pooled all-reduce fit, rel. rms {hw['collective_fits']['pooled_all_reduce']['rel_rms']:.0%})",
             f"p2p         α={hw['links']['p2p']['alpha_us']:.1f} µs, β={hw['links']['p2p']['bw_gbps']:.3f} GB/s"]
    if hw.get("efficiency_by_tokens"):
        lines.append("efficiency  " + ", ".join(f"{e:.0%} at {int(t)} tokens" for t, e in hw["efficiency_by_tokens"])
                     + " per micro-batch")
    if hw.get("corun_slowdown") is not None:
        lines.append(f"co-run      {hw['corun_slowdown']:.2f}x slower with every core busy, "
                     f"{hw.get('oversubscribed_slowdown', 1.0):.2f}x with twice as many ranks as cores "
                     f"(beyond time-sharing)")
    if hw.get("collective_sync_us") is not None:
        lines.append(f"sync        {hw['collective_sync_us']:.0f} µs per collective inside a step, beyond its α-β fit")
    if hw.get("pipeline_hop_us") is not None:
        lines.append(f"hop         {hw['pipeline_hop_us']:.0f} µs per pipeline transfer inside a step, beyond its α-β fit")
    for kind in (*KINDS, "p2p"):
        for g, f in hw["collective_fits"][kind].items():
            lines.append(f"  {kind:15s} {g} ranks: α={f['alpha_us']:7.1f} µs  β={f['bw_gbps']:7.3f} GB/s  "
                         f"rel. rms {f['rel_rms']:.0%}")
    return "\n".join(lines)
