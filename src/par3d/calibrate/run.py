"""The whole calibration: run the probes (`probes.py`), fit (`fits.py`), return the hardware file's
content.  What lands where is listed in docs/measured.md, section 1."""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

from par3d.calibrate import fits, probes
from par3d.plan.hardware import GB, TFLOPS, US, log2_interp


def mem_gib_per_rank(nproc: int) -> float:
    try:
        with open("/proc/meminfo") as fh:
            kib = next(int(line.split()[1]) for line in fh if line.startswith("MemTotal"))
        return kib / 2**20 / max(nproc, 1)
    except (OSError, StopIteration):
        return 4.0


def probe_runs(quick: bool) -> int:
    """Launches of each multi-rank world; the median over them is kept — the statistic `bench
    fidelity` and the end-of-run report measure (a layout's median step), so a shared machine's
    bursts weigh on the calibration as they do on what it predicts.  Five: a launch of several
    ranks on a VM runs fast or slow as a whole (docs/measured.md §2), and with three the median
    was a slow launch often enough to move the co-run slowdown from 1.14 to 1.48 between
    calibrations minutes apart."""
    return 1 if quick else 5


def gpu_fields(gpu: str | None) -> dict[str, Any]:
    """The device fields a GPU's hardware file takes from the GPU itself: its memory in GiB, its SM count, and the
    catalogue GPU it is (`base`), if any.  Found missing on the one GPU this project was lent (docs/measured.md §6):
    the file said 1 SM and the host's RAM."""
    import torch

    props = torch.cuda.get_device_properties(0)
    return {"mem_gib": props.total_memory / 2**30, "sms": props.multi_processor_count,
            **({"base": gpu} if gpu else {})}


def run_together(cfgs: list[dict[str, Any]], ranks: int, quick: bool) -> list[float]:
    """The median step time of each of `cfgs`, all run one after another in the same launched world
    of `ranks` ranks, the median over `probe_runs` launches.  Together, because a launch of several
    ranks on a VM's vCPUs runs fast or slow as a whole (docs/measured.md §2): the runs that a fit
    compares (DP against TP on the same cores) then share each launch's speed."""
    from par3d.distributed import launch

    got = [launch(probes.multi_worker, ranks, (cfgs,), timeout_s=120, wall_timeout_s=900, threads=1)[0]
           for _ in range(probe_runs(quick))]
    return [statistics.median(g[i] for g in got) for i in range(len(cfgs))]


def sustained_gemms(gemms: list[dict[str, Any]], dtypes: list[str], seconds: float,
                    window_s: float = 1.0) -> dict[str, dict[str, Any]]:
    """Each dtype's fastest burst GEMM of depth 4,096 held for `seconds` on every GPU of the node at once
    (`probes.sustained_worker`): the GPU's own MSMF, which `hardware.calibrated_gemm_share` then takes in place
    of a sustained/burst ratio borrowed from another GPU.  Run once, on one H200 (docs/measured.md §6)."""
    import torch

    from par3d.distributed import launch

    gpus = torch.cuda.device_count()
    out: dict[str, dict[str, Any]] = {}
    for dt in dtypes:
        deep = [g for g in gemms if g["dtype"] == dt and g["k"] == 4096] or [g for g in gemms if g["dtype"] == dt]
        best = max(deep, key=lambda g: g["gflops"])
        shape = (best["m"], best["n"], best["k"])
        rates = launch(probes.sustained_worker, gpus, (dt, shape, seconds, window_s), timeout_s=120,
                       wall_timeout_s=seconds * 3 + 300)
        out[dt] = {"shape": list(shape), "seconds": seconds, "gpus": gpus,
                   "tflops_per_gpu": [r / TFLOPS for r in rates], "tflops": statistics.median(rates) / TFLOPS,
                   "burst_tflops": best["gflops"] / 1e3}
    return out


def calibrate(nproc: int = 2, quick: bool = False, progress: bool = True, sustained_s: float = 60.0) -> dict[str, Any]:
    """Measure everything; return the hardware file's content (a dict).  On a GPU, `sustained_s` > 0 also holds
    each dtype's best GEMM that long on every GPU of the node (its MSMF; `sustained_gemms`)."""
    import torch

    from par3d import host
    from par3d.distributed import launch

    torch.set_num_threads(1)  # what one training rank gets
    on_gpu = torch.cuda.is_available()
    dtypes = ["fp32", "bf16"]
    kernel_dtype = "fp32"  # `par3d train`'s default dtype
    n_prims = 0 if on_gpu else len(probes.primitive_sizes(quick))
    n_gemm = len(probes.gemm_shapes(quick, gpu=on_gpu)) * len(dtypes)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n_prims + n_gemm + probes.overhead_passes(quick) + 5 + (2 if on_gpu else 0), desc="calibrate", unit="probe",
                   file=sys.stderr, dynamic_ncols=True)

    def tick() -> None:
        if bar is not None:
            bar.update(1)

    t_start = time.time()
    # on a CPU a block's arithmetic comes from its measured primitives; on a GPU from the planner's
    # table model (plan/gemm_table.py), whose `device.gemm` share the GEMM probes fill (below)
    prims = [] if on_gpu else probes.measure_primitives(kernel_dtype, quick, tick)
    kernels = fits.fit_primitives(prims, kernel_dtype) if prims else None
    gemms = probes.measure_gemms(dtypes, quick, tick)
    gfit = fits.fit_gemm(gemms)
    mem_bw = probes.measure_mem_bw(quick)
    tick()
    # one rank running the calibration GPTs, in passes spread over the calibration (its start,
    # middle and end): the solo slowdown and the speed check `bench fidelity` repeats
    solo = [probes.measure_solo()]
    tick()
    over = probes.measure_overheads(quick, tick)
    overheads = fits.residual_overheads(over["overheads"], kernels, over["tiny"])
    # one GPU (`--nproc 1`, a GPU only): no pair of ranks to time a collective or a pipeline hop between, so the
    # file leaves the links out and the planner keeps the catalogue's for that GPU (hardware.load_hardware_file)
    single = on_gpu and nproc == 1
    coll: list[dict[str, Any]] = [] if single else launch(
        probes.collective_worker, nproc, (probes.message_sizes(quick), quick, progress), timeout_s=120,
        wall_timeout_s=900, threads=1)[0]
    tick()
    cfits = fits.fit_collectives(coll) if coll else {}
    if probes.solo_passes(quick) > 2:
        solo.append(probes.measure_solo())
    links: dict[str, Any] = {}  # the file's intra / inter / links: measured between pairs of ranks, so none on one GPU
    if not single:
        pooled, p2p = cfits["pooled_all_reduce"], cfits["p2p"]["2"]
        link = {"name": f"{'nccl' if on_gpu else 'gloo'}-local", "alpha_us": pooled["alpha_us"],
                "bw_gbps": pooled["bw_gbps"]}
        links = {"intra": link, "inter": dict(link, name=link["name"] + " (same machine)"),
                 "links": {"p2p": {"alpha_us": p2p["alpha_us"], "bw_gbps": p2p["bw_gbps"]},
                           # context parallelism's ring exchange (through the backend)
                           **({"cp": {"alpha_us": cfits["exchange"]["2"]["alpha_us"],
                                      "bw_gbps": cfits["exchange"]["2"]["bw_gbps"]}} if "exchange" in cfits else {})}}
    name = torch.cuda.get_device_name(0) if on_gpu else f"{host.cpu_name()} (1 thread)"
    peaks = {dt: f["rate_gflops"] * 1e9 / TFLOPS for dt, f in gfit.items()}
    gemm_share: dict[str, float] = {}
    attention: dict[str, Any] = {}
    curve: list[dict[str, Any]] = []
    eager_traffic: dict[str, Any] = {}
    mem_eff: float | None = None
    held: dict[str, dict[str, Any]] = {}
    gpu: str | None = None
    if on_gpu:  # the datasheet's peaks, and the best measured GEMM's share of them at the sustained clock and
        # the step share, as the catalogue describes its GPUs (hardware.calibrated_gemm_share; run once, on one H200)
        from par3d.plan import gemm_table
        from par3d.plan.hardware import DEVICES, calibrated_attention, calibrated_gemm_share, catalogue_gpu_of

        gpu = catalogue_gpu_of(name)
        family = "" if gpu is None else gemm_table.family_of(gpu)  # gemm_table's family ("": unknown GPU)
        if gpu is not None:
            known = DEVICES[gpu]
            peaks = {dt: known.peak_flops[dt] / TFLOPS for dt in peaks if dt in known.peak_flops}
        # the training dtype's GEMM held at the power limit (fp32 keeps the burst route: no step trains in it)
        held = sustained_gemms(gemms, [dt for dt in peaks if dt != "fp32"], sustained_s) if sustained_s > 0 else {}
        gemm_share = {dt: calibrated_gemm_share([(p["flops"], p["gflops"] / 1e3) for p in gemms if p["dtype"] == dt],
                                                peaks[dt], family, dt,
                                                held[dt]["tflops"] if dt in held else None)
                      for dt in peaks}
        # par3d's own runtime on this GPU: its attention call timed by length (the share a step gets: no discount), and
        # how fast its eager non-GEMM kernels move the bytes plan/eager.py counts, over the copy's rate
        curve = probes.measure_attention_curve(quick)
        tick()
        eager_traffic = probes.measure_eager_traffic(quick)
        tick()
        pts = [[c["tokens"], round(c["share"], 4)] for c in curve if c["share"]]
        attention = ({"attn_curve": pts, "attn_eff": log2_interp(tuple(map(tuple, pts)), 8192), "attn_sustain": 1.0}
                     if pts else calibrated_attention(gpu))
        mem_eff = min(1.0, eager_traffic["gbps"] * GB / mem_bw)
    hw: dict[str, Any] = {
        "device": {"name": name,
                   "peak_tflops": peaks, **({"gemm": gemm_share} if gemm_share else {}), **attention,
                   # on a GPU its own memory and SM count (wave quantization), and the catalogue GPU it is
                   # (`base`: what the file leaves out -- the links with --nproc 1 -- is then that GPU's)
                   "mem_bw_gbps": mem_bw / GB, **({"mem_eff": round(mem_eff, 4)} if mem_eff else {}),
                   **(gpu_fields(gpu) if on_gpu else {"mem_gib": mem_gib_per_rank(nproc), "sms": 1}),
                   # the arithmetic of a block comes from `kernels` (measured primitives); the
                   # roofline's efficiency is only used for a dtype they were not measured in
                   "efficiency": 1.0},
        **({} if single else {"gpus_per_node": nproc}),
        **links,
        "cores": None if on_gpu else host.machine_cores(),
        "threads_per_rank": 1,
        **({"kernels": kernels} if kernels else {}),
        "overheads": overheads,
        "gemm_fit": gfit,
        "collective_fits": cfits,
    }
    steps = 7 if quick else 11
    # the reference on several ranks: DP over as many ranks as cores and twice as many (the co-run
    # slowdowns), TP over the calibration ranks (what a collective costs inside a step); and the sync
    # points of TP pairs with one rank per core (TP over the cores' worth of ranks) and with two
    # (beside a second pair: DP over them), each on three calibration GPTs (plan/profile.py's
    # SyncModel).  The runs on one number of ranks share their launches (`run_together`)
    runs: dict[str, Any] = {}
    cores = host.machine_cores()
    worlds: dict[int, list[tuple[str, dict[str, Any]]]] = {}
    tp = min(2, cores)
    # the sync points' two loads: (ranks per core, DP beside the TP pairs)
    loads = ((tp / cores, cores // tp), (2 * tp / cores, 2 * cores // tp))
    if not on_gpu and cores >= 2:
        for n, key in ((cores, "corun_slowdown"), (2 * cores, "oversubscribed_slowdown")):
            worlds.setdefault(n, []).append((key, probes.reference_config(steps=steps, dp=n)))
        for rpc, dp in loads:
            for k, cfg in enumerate(probes.sync_configs(steps, tp, dp)):
                worlds.setdefault(tp * dp, []).append((f"sync {rpc} {k}", cfg))
        # the speed check `bench fidelity` repeats in each world it launches, at the world's size
        for n in sorted({cores, 2 * cores}):
            for k, cfg in enumerate(probes.speed_configs(n)):
                worlds[n].append((f"speed {n} {k}", cfg))
    tp_cfg = probes.reference_config(steps=steps, tp=nproc)
    if not any(cfg == tp_cfg for w in worlds.values() for _, cfg in w):
        worlds.setdefault(nproc, []).append(("tp", tp_cfg))
    if bar is not None:
        bar.total += len(worlds)
        bar.refresh()
    got: dict[str, float] = {}
    cfg_of = {label: cfg for w in worlds.values() for label, cfg in w}
    for n, items in sorted(worlds.items()):
        for (label, _), t in zip(items, run_together([c for _, c in items], n, quick), strict=True):
            got[label] = t
        tick()
    for key, n in (("corun_slowdown", cores), ("oversubscribed_slowdown", 2 * cores)):
        if key in got:
            # the reference and the speed check's two calibration GPTs, each with DP over the n ranks
            # in the same launches: the co-run slowdowns of the arithmetic and of the fixed costs,
            # fitted on all three together (`fits.fit_corun`; the narrow one is mostly fixed costs)
            dp_runs = [(cfg_of[key], got[key])] + [(cfg_of[f"speed {n} {k}"], got[f"speed {n} {k}"])
                                                   for k in range(len(probes.SPEED_SHAPES))]
            runs[key] = {"dp": n, "step_s": got[key], "_runs": dp_runs}
    tp_step = next(got[label] for label, cfg in cfg_of.items() if cfg == tp_cfg)
    sync_runs: dict[str, Any] = {}
    if not on_gpu and cores >= 2:
        for rpc, dp in loads:
            pairs = [(cfg_of[f"sync {rpc} {k}"], got[f"sync {rpc} {k}"]) for k in range(len(probes.SYNC_SHAPES))]
            sync_runs[str(rpc)] = {"tp": tp, "dp": dp, "ranks": tp * dp, "runs": pairs}
    if probes.solo_passes(quick) > 1:
        solo.append(probes.measure_solo())
    tick()
    solo_step = [statistics.median(p["step_s"][i] for p in solo) for i in range(len(probes.SOLO_SHAPES))]
    solo_cfgs = probes.solo_configs()
    if kernels:  # the arithmetic comes from the primitives: how much slower they run inside a step
        hw["solo_slowdown"] = statistics.median(fits.fit_contention(hw, cfg, t, "solo_slowdown", lo=0.5, hi=3.0)
                                                for cfg, t in zip(solo_cfgs, solo_step, strict=True))
    if not on_gpu:  # `bench fidelity` repeats it in each world it launches, at the world's size
        by_world = {"1": statistics.median(p["speed_s"] for p in solo)}
        for n in sorted({cores, 2 * cores}) if cores >= 2 else ():
            by_world[str(n)] = sum(got[f"speed {n} {k}"] for k in range(len(probes.SPEED_SHAPES)))
        hw["speed_check"] = {"shapes": [{k: sh[k] for k in ("layers", "hidden", "heads", "seq", "micro_batch")}
                                        for sh in probes.SPEED_SHAPES],
                             "steps": probes.SPEED_STEPS, "step_s": by_world, "passes_1": [p["speed_s"] for p in solo]}
    # each term's fit depends a little on the others (DP's gradient reductions pay the sync, TP's
    # ranks compute side by side): fitted in turn, twice
    for _ in range(1 if sync_runs else 2):
        for key, r in runs.items():
            fixed_key = key.replace("_slowdown", "_fixed_slowdown")
            hw.pop(fixed_key, None)  # each GPT's one-factor fit (a diagnostic): fixed costs slowed alike
            r["fits"] = [fits.fit_contention(hw, cfg, t, key) for cfg, t in r["_runs"]]
            hw[key], hw[fixed_key] = fits.fit_corun(hw, r["_runs"], key, fixed_key)
        if not sync_runs and not single:  # one rank runs no collective to fit a sync on
            hw["collective_sync_us"] = fits.fit_collective_sync(hw, tp_cfg, tp_step) / US
    sync_fits = {}
    if sync_runs:  # the DP-only runs above meet no sync point: the contention is fitted first
        sync_fits = {rpc: fits.fit_point_sync(hw, r["runs"]) for rpc, r in sync_runs.items()}
        order = sorted(sync_fits, key=lambda k: sync_fits[k]["ranks_per_core"])
        # two loads the model reads alike keep the more crowded one's fit (a SyncModel's loads increase)
        order = [k for i, k in enumerate(order) if i + 1 == len(order)
                 or sync_fits[order[i + 1]]["ranks_per_core"] - sync_fits[k]["ranks_per_core"] > 1e-3]
        hw["collective_sync"] = {"ranks_per_core": [sync_fits[k]["ranks_per_core"] for k in order],
                                 "latency_us": [sync_fits[k]["latency_us"] for k in order],
                                 "skew": [sync_fits[k]["skew"] for k in order]}
    contention = {key: {"dp": r["dp"], "step_s": r["step_s"], "fits": r["fits"],
                        "models": [{k: cfg["model"][k] for k in ("layers", "hidden", "seq_len")} for cfg, _ in r["_runs"]],
                        "steps_s": [t for _, t in r["_runs"]]} for key, r in runs.items()}
    p, m, stage_ms = max(2, nproc), 4, 2.0
    hop: dict[str, Any] = {}
    if not single:  # a pipeline of two stages needs two GPUs
        syn = probes.measure_synthetic("1f1b", p, m, stage_ms, stage_ms, steps=4 if quick else 8)
        hop = fits.fit_pipeline_hop(p, m, stage_ms, syn["measured_makespan_s"])
        hw["pipeline_hop_us"] = hop["hop_s"] / US
    tick()
    if bar is not None:
        bar.close()
    hw["measurements"] = {"primitives": prims, "gemm": gemms, "mem_bw_gbps": mem_bw / GB,
                          **({"sustained_gemm": held} if held else {}),
                          "overheads_measured": over["overheads"], "overhead_rounds": over["rounds"],
                          "tiny": over["tiny"], "collectives": coll,
                          "reference": dict(probes.REFERENCE), "reference_dp": contention,
                          "reference_tp": {"tp": nproc, "step_s": tp_step}, "pipeline_hop": hop,
                          "solo": {"models": [{k: sh[k] for k in ("layers", "hidden", "seq")} for sh in probes.SOLO_SHAPES],
                                   "passes": solo, "step_s": solo_step},
                          "collective_sync": {rpc: {"tp": r["tp"], "dp": r["dp"], "ranks": r["ranks"],
                                                    "models": [{k: c["model"][k] for k in ("layers", "hidden", "seq_len")}
                                                               for c, _ in r["runs"]],
                                                    **sync_fits[rpc]} for rpc, r in sync_runs.items()}}
    if on_gpu:  # the file describes par3d's runtime on this GPU: eager kernels (plan/eager.py), and what was timed
        hw["runtime"] = {"elementwise": "eager"}
        hw["measurements"].update(attention=curve, eager_traffic=eager_traffic)
    hw["host"] = host.describe(torch.cuda.get_device_name(0) if on_gpu else None)
    hw["calibrated"] = {"date": hw["host"]["date"], "torch": torch.__version__, "host_cores": host.machine_cores(),
                        "nproc": nproc, "quick": quick, "seconds": round(time.time() - t_start, 1),
                        "load_average": list(os.getloadavg()),  # other processes perturb timings
                        # the model shapes the calibration ran: `bench fidelity`'s held-out shapes
                        # differ from every one of them in width, depth and sequence length
                        "references": [{"layers": probes.REFERENCE["layers"], "hidden": probes.REFERENCE["hidden"],
                                        "seq_len": probes.REFERENCE["seq"]}]
                        + [{"layers": n, "hidden": probes.TINY["hidden"], "seq_len": probes.TINY["seq"]}
                           for n in probes.TINY_LAYERS]
                        + [{"layers": p, "hidden": 8, "seq_len": 8}]
                        + ([{"layers": sh["layers"], "hidden": sh["hidden"], "seq_len": sh["seq"]}
                            for sh in probes.SYNC_SHAPES[1:]] if sync_runs else [])}
    return hw


__all__ = ["calibrate", "mem_gib_per_rank"]
