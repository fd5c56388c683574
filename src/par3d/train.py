"""The training loop — the main job.  Trace it top to bottom:

    run(cfg)                      parent: validate, then start the world (or join torchrun's)
      └ worker(cfg)               every rank:
          groups = build_groups(mesh, rank)                 mesh.py: who talks to whom
          chunks = GPTStage(units of this rank's stages)    model.py + pipeline/partition.py
          dp     = DataParallel(chunks, ...)                data_parallel.py: grads + optimizer
          rt     = PipelineRuntime(schedule[pp_rank], ...)  pipeline/runtime.py
          checkpoint.load(...)                              on --resume: any layout's checkpoint
          for step:
              micro-batches = this DP rank's slice of the step's global batch     data.py
              rt.run_step(...)    forwards/backwards in schedule order, DP buckets launched
              dp.finish()
              loss = Σ over micro-batches and DP ranks (already divided by global tokens)
              dp.step(step)       unless the loss or gradient is NaN/Inf (skip, or stop)
              checkpoint.save(...)                          every --save-every steps

Every layout runs this same code; with dp = pp = tp = 1 it is the single-device reference.
Reliability (docs/reliability.md): `preflight` refuses bad input before any process starts, and
a watchdog ends a rank whose peers stopped answering, so a failure never hangs the run.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from typing import Any

from par3d.config import ConfigError, RunConfig


def global_named_parameters(stage: Any) -> list[tuple[str, Any]]:
    """(name, parameter) with block indices made global, so names do not depend on the split."""
    first_block = max(stage.start, 1) - 1
    out = []
    for name, p in stage.named_parameters():
        if name.startswith("blocks."):
            _, idx, rest = name.split(".", 2)
            name = f"blocks.{int(idx) + first_block}.{rest}"
        out.append((name, p))
    return out


def worker(cfg_dict: dict[str, Any], options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Runs on every rank.  Returns what the parent (or a test) needs: losses, timings, and on
    request full parameters/gradients by global name (from dp=0, tp=0 ranks)."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from par3d import checkpoint, comm
    from par3d.data import Corpus, rank_microbatches
    from par3d.data_parallel import DataParallel
    from par3d.mesh import Mesh, build_groups
    from par3d.model import GPTStage, ModelContext
    from par3d.pipeline.partition import gpt_partition
    from par3d.pipeline.runtime import PipelineRuntime
    from par3d.pipeline.schedules import build, check

    options = options or {}
    cfg = RunConfig.from_dict(cfg_dict).resolve()
    mc, pc, tc = cfg.model, cfg.parallel, cfg.train
    rank = dist.get_rank() if dist.is_initialized() else 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    dtype = torch.bfloat16 if tc.dtype == "bf16" else torch.float32

    mesh = Mesh(pc.dp, pc.pp, pc.tp)
    groups = build_groups(mesh, rank, timeout_s=cfg.timeout_s)
    if groups is None:  # this rank is not part of the layout (tests run small layouts in big worlds)
        return {"rank": rank, "idle": True}
    c = groups.coord
    p, m, v = pc.pp, pc.microbatches, pc.virtual_stages
    # dropout streams: identical across TP ranks (they hold replicated activations)
    torch.manual_seed(tc.seed + 1000 * c.dp + c.pp)

    part = gpt_partition(mc.layers, p * v, mc.hidden, mc.seq_len, mc.vocab, mc.ffn_hidden)
    ctx = ModelContext(tp=groups.tp, seed=tc.seed, sequence_parallel=pc.sequence_parallel and pc.tp > 1,
                       recompute=pc.recompute, dtype=dtype)
    chunks = [GPTStage(mc, ctx, *part.bounds[k * p + c.pp]).to(device) for k in range(v)]
    dpar = DataParallel(chunks, groups, tc, pc.zero_stage,
                        bucket_numel=int(options.get("bucket_numel", 1 << 20)))
    start_step = int(options.get("start_step", 0))
    resume_dir = options.get("resume_dir") or (
        checkpoint.resolve(cfg.resume, tc.out, warn=rank == 0) if cfg.resume else None)
    if resume_dir:
        # weights, Adam state, optimizer step and RNG; the data position is the step itself
        # (sampling is a pure function of (seed, step))
        start_step = int(checkpoint.load(resume_dir, chunks, dpar, groups, cfg)["step"])
    ckpt_root = options.get("checkpoint_root") or checkpoint.checkpoints_root(tc.out)
    schedule = build(pc.schedule, p, m, v)
    report = check(schedule, p, m, v)
    s_local = mc.seq_len // pc.tp if ctx.sequence_parallel else mc.seq_len
    runtime = PipelineRuntime(chunks, schedule[c.pp], groups, p, m, v, (tc.micro_batch, s_local, mc.hidden),
                              dtype, device, set_sync=dpar.set_sync, synthetic_ms=cfg.synthetic_stage_ms,
                              p2p=pc.p2p, timeout_s=cfg.timeout_s)
    corpus = Corpus.load(tc.data)
    loss_scale = 1.0 / (tc.global_batch * mc.seq_len)
    tokens_per_step = tc.global_batch * mc.seq_len

    is_rank0 = rank == 0
    if is_rank0 and cfg.metrics_out and os.path.dirname(cfg.metrics_out):
        os.makedirs(os.path.dirname(cfg.metrics_out), exist_ok=True)
    # a resumed run appends: the metrics file then holds the whole run (a step redone after a crash
    # appears twice; the later line is the one that counts)
    metrics_fh = (open(cfg.metrics_out, "a" if resume_dir else "w")  # noqa: SIM115
                  if (is_rank0 and cfg.metrics_out) else None)
    bar = None
    if is_rank0 and cfg.progress and not options.get("quiet"):
        from tqdm import tqdm

        bar = tqdm(total=tc.steps, initial=start_step, desc="train", unit="step", file=sys.stderr,
                   dynamic_ncols=True)

    history: list[dict[str, Any]] = []
    captured: dict[str, Any] = {}
    if options.get("capture_logits") and p == 1:
        from par3d.data import global_batch

        x0, _ = global_batch(corpus, tc.seed, 0, tc.global_batch, mc.seq_len)
        with torch.no_grad():
            comm.COUNTER.enabled = False
            logits = chunks[0].logits(torch.from_numpy(np.ascontiguousarray(x0[:2])).to(device))
            comm.COUNTER.enabled = True
        if c.dp == 0 and c.tp == 0:
            captured["logits"] = logits.float().cpu()
    events_last: list[Any] = []
    events_by_step: dict[int, list[dict[str, Any]]] = {}  # only with options["all_events"] (benchmarks)
    peak_act = 0
    act_per_mb = 0
    comm.COUNTER.reset()
    comm.COUNTER.keep_sizes = bool(options.get("keep_sizes") or cfg.comm_report)
    comm_per_step: list[dict[str, Any]] = []
    saved: list[str] = []
    last_step = min(tc.steps, int(options.get("stop_at_step", tc.steps)))  # tests: a preempted run
    nan_loss_at = options.get("nan_loss_at_step")  # test-only: poison one step's loss
    nan_master_at = options.get("nan_master_at_step")  # test-only: poison the weights before a save
    watch = groups.world.size > 1 and dist.is_initialized()
    with _Watchdog(rank, cfg.timeout_s, enabled=watch) as wd:
        for step in range(start_step, last_step):
            wd.beat(f"step {step}")
            _test_fault(rank, step, "step")
            t0 = time.perf_counter()
            mbs = [(torch.from_numpy(np.ascontiguousarray(x)).to(device),
                    torch.from_numpy(np.ascontiguousarray(y)).to(device))
                   for x, y in rank_microbatches(corpus, tc.seed, step, tc.global_batch, mc.seq_len,
                                                 pc.dp, c.dp, m)]
            dpar.start_step()
            res = runtime.run_step(mbs, float("nan") if step == nan_loss_at else loss_scale)
            dpar.finish()
            if options.get("capture_grads") and step == start_step:
                captured["grads"] = _gather_named(chunks, groups, mc, lambda q: q.main_grad)
            loss_t = torch.tensor([res.loss_sum], dtype=torch.float64, device=device)  # NCCL needs device tensors
            comm.all_reduce(loss_t, groups.pp)
            comm.all_reduce(loss_t, groups.dp)
            loss = float(loss_t)
            if math.isfinite(loss):  # every rank holds the same loss, so all ranks skip together
                info = dpar.step(step)
            else:
                info = {"grad_norm": float("nan"), "lr": dpar.lr_at(step), "skipped": True}
            dt = time.perf_counter() - t0
            if info["skipped"]:
                _non_finite(step, loss, info["grad_norm"], tc.on_nonfinite, is_rank0)
            snap = comm.COUNTER.snapshot()
            sizes = ({f"{g}/{k}": list(v) for (g, k), v in comm.COUNTER.elements.items()}
                     if comm.COUNTER.keep_sizes else None)
            comm_per_step.append({"step": step, "comm": snap, **({"sizes": sizes} if sizes else {})})
            comm.COUNTER.reset()
            row = {"step": step, "loss": loss, "lr": info["lr"], "tokens": tokens_per_step * (step + 1),
                   "step_time_s": dt, "grad_norm": info["grad_norm"], "skipped": bool(info["skipped"])}
            if cfg.comm_report:
                row["comm"] = snap
                row["comm_sizes"] = sizes
            history.append(row)
            events_last = res.events
            if options.get("all_events") and c.dp == 0 and c.tp == 0:
                events_by_step[step] = [e.to_dict() for e in res.events]
            peak_act = max(peak_act, res.peak_activation_bytes)
            act_per_mb = max(act_per_mb, res.activation_bytes_per_microbatch)
            if metrics_fh:
                metrics_fh.write(json.dumps(row) + "\n")
                metrics_fh.flush()
            if bar is not None:
                bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_step / dt:,.0f}")
                bar.update(1)
            if cfg.save_every and (step + 1) % cfg.save_every == 0:
                if step == nan_master_at and is_rank0:
                    dpar.bufs[0].master[0] = float("nan")
                wd.beat(f"saving the checkpoint of step {step + 1}")
                path = checkpoint.save(ckpt_root, step + 1, chunks, dpar, groups, cfg,
                                       hook=lambda where, s=step: _test_fault(rank, s, where))
                if path is None and tc.on_nonfinite == "stop":
                    raise FloatingPointError(f"non-finite weights or optimizer state after step {step}; "
                                             f"stopping (train.on_nonfinite='stop')")
                if path is not None:
                    saved.append(path)
    if bar is not None:
        bar.close()
    if metrics_fh:
        metrics_fh.close()
    if options.get("capture_params"):
        captured["params"] = _gather_named(chunks, groups, mc, lambda q: q.detach())
    out: dict[str, Any] = {
        "rank": rank, "coord": [c.dp, c.pp, c.tp], "history": history, "comm_per_step": comm_per_step,
        "peak_activation_bytes": peak_act, "activation_bytes_per_microbatch": act_per_mb,
        "p2p_transport": runtime.transport,
        "peak_inflight_predicted": report.peak_inflight[c.pp],
        "events": [e.to_dict() for e in events_last] if (c.dp == 0 and c.tp == 0) else [],
        "events_by_step": events_by_step,
        "bounds": [part.bounds[k * p + c.pp] for k in range(v)], "imbalance": part.imbalance,
        "resumed_from": resume_dir, "start_step": start_step, "checkpoints": saved,
    }
    out.update(captured)
    if groups.world.size > 1:
        # rank 0 gets every rank's timeline and memory (also under torchrun, where the parent
        # process does not see the other ranks' return values)
        mine = {k: out[k] for k in ("rank", "coord", "events", "peak_activation_bytes",
                                     "peak_inflight_predicted", "bounds", "events_by_step")}
        world: list[Any] = [None] * groups.world.size
        dist.all_gather_object(world, mine, group=groups.world.pg)
        out["world"] = world
    else:
        out["world"] = [{k: out[k] for k in ("rank", "coord", "events", "peak_activation_bytes",
                                             "peak_inflight_predicted", "bounds", "events_by_step")}]
    return out


def _gather_named(chunks: list[Any], groups: Any, mc: Any, get: Any) -> dict[str, Any]:
    """Full tensors by global name (TP slices gathered), returned from dp=0, tp=0 ranks only."""
    from par3d import comm
    from par3d.tensor_parallel import unshard

    comm.COUNTER.enabled = False
    try:
        out = {}
        for chunk in chunks:
            for name, q in global_named_parameters(chunk):
                if name == "head.weight" and mc.tied_embeddings:
                    continue  # the tied copy on the last stage; the reference holds one table
                full = unshard(get(q).float(), q, groups.tp)
                if name in ("embedding.tok.weight", "head.weight"):
                    full = full[:mc.vocab]
                out[name] = full.detach().cpu().clone()
    finally:
        comm.COUNTER.enabled = True
    return out if (groups.coord.dp == 0 and groups.coord.tp == 0) else {}


def _non_finite(step: int, loss: float, grad_norm: float, policy: str, is_rank0: bool) -> None:
    """A NaN/Inf loss or gradient norm: the update was skipped; stop the run if asked to."""
    what = f"non-finite loss ({loss}) or gradient norm ({grad_norm}) at step {step}"
    if policy == "stop":
        raise FloatingPointError(f"{what}; stopping (train.on_nonfinite='stop')")
    if is_rank0:
        print(f"par3d: {what}; update skipped (train.on_nonfinite='skip')", file=sys.stderr, flush=True)


class _Watchdog:
    """Ends this rank (one line on stderr, exit code 1) when the loop makes no progress for
    `timeout_s` plus the slowest interval between two beats seen so far.

    Why: collectives on torch *sub*groups do not honour init_process_group's timeout (new groups
    get torch's 30-minute default), so a peer that died or hung could block the other ranks for
    half an hour.  When this rank exits, the launcher (par3d's or torchrun) stops the others."""

    def __init__(self, rank: int, timeout_s: float, enabled: bool = True):
        self.rank, self.timeout_s, self.enabled = rank, float(timeout_s), enabled
        self.last, self.slowest, self.what = time.monotonic(), 0.0, "start-up"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="par3d-watchdog", daemon=True)

    def __enter__(self) -> _Watchdog:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self.enabled:
            self._thread.join()

    def beat(self, what: str) -> None:
        now = time.monotonic()
        self.slowest = max(self.slowest, now - self.last)
        self.last, self.what = now, what

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            idle = time.monotonic() - self.last
            if idle > self.timeout_s + self.slowest:
                print(f"par3d: rank {self.rank}: no progress for {idle:.0f} s in {self.what} "
                      f"(--timeout {self.timeout_s:g}); a peer died or hung, stopping",
                      file=sys.stderr, flush=True)
                os._exit(1)  # the main thread may be blocked in C++; nothing else ends it


_FAULT_VARS = ("PAR3D_TEST_KILL_RANK_AT_STEP", "PAR3D_TEST_RAISE_RANK_AT_STEP", "PAR3D_TEST_HANG_RANK_AT_STEP")


def _test_fault(rank: int, step: int, where: str) -> None:
    """TEST-ONLY fault injection, for the failure tests; never set these variables in a real run.

    PAR3D_TEST_{KILL,RAISE,HANG}_RANK_AT_STEP="RANK:STEP" makes global rank RANK SIGKILL itself,
    raise, or sleep forever at the start of step STEP (0-based); "RANK:STEP:save" does it in the
    middle of the checkpoint save after that step (the temporary folder exists, nothing is final).
    """
    for var in _FAULT_VARS:
        spec = os.environ.get(var)
        if not spec:
            continue
        r, s, *w = spec.split(":")
        if (int(r), int(s), w[0] if w else "step") != (rank, step, where):
            continue
        if var == "PAR3D_TEST_KILL_RANK_AT_STEP":
            os.kill(os.getpid(), signal.SIGKILL)
        if var == "PAR3D_TEST_RAISE_RANK_AT_STEP":
            raise RuntimeError(f"injected failure on rank {rank} at step {step} ({var})")
        while True:
            time.sleep(1)


# ---- the parent side ------------------------------------------------------------------------------

def preflight(cfg: RunConfig) -> str | None:
    """Every check that can be made before a process starts: `cfg.validate()`, then what needs
    the files' contents or the environment: the data fits the vocabulary, a launcher's world
    matches the layout, and a checkpoint to resume from is whole and holds this model.  Raises
    ConfigError; returns the checkpoint folder to resume from (None: a fresh start)."""
    from par3d import checkpoint
    from par3d.data import Corpus

    cfg.validate()
    mc, tc = cfg.model, cfg.train
    errs = []
    try:
        corpus = Corpus.load(tc.data)
    except (OSError, ValueError) as e:
        raise ConfigError([f"train.data={tc.data!r}: {e}"]) from None
    # (too little text for one sequence is already a validate() error)
    top = int(corpus.tokens.max()) if len(corpus) else 0
    if top >= mc.vocab:
        errs.append(f"model.vocab={mc.vocab}: the data holds token {top} (bytes are tokens 0..255); "
                    f"use --vocab 256")
    launched = os.environ.get("WORLD_SIZE") if "RANK" in os.environ else None
    if launched is not None and int(launched) != cfg.parallel.world_size:
        errs.append(f"the launcher started {launched} processes but dp x pp x tp = "
                    f"{cfg.parallel.world_size}; make them equal")
    if errs:
        raise ConfigError(errs)
    if cfg.resume is None:
        return None
    is_rank0 = os.environ.get("RANK", "0") == "0"
    path = checkpoint.resolve(cfg.resume, tc.out, warn=is_rank0)
    notes = checkpoint.check_compatible(checkpoint.read_manifest(path), cfg, path)
    if is_rank0:
        for note in notes:
            print(f"par3d: {note}", file=sys.stderr)
    return path


def run(cfg: RunConfig, options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Check (raises ConfigError), start the world (locally or under torchrun); per-rank results."""
    from par3d.distributed import run_main

    resume_dir = preflight(cfg)
    options = dict(options or {}, resume_dir=resume_dir)  # every rank resumes from the same folder
    nproc = cfg.parallel.world_size
    res = run_main(worker, nproc, (cfg.to_dict(), options), timeout_s=cfg.timeout_s,
                   threads=cfg.threads_per_rank)
    results = res if isinstance(res, list) else [res]
    return results
