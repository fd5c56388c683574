"""The training loop — the main job.  Trace it top to bottom:

    run(cfg, RunOptions)          parent: validate, then start the world (or join torchrun's)
      └ worker(cfg, RunOptions)   every rank, in named steps:
          _build            groups = build_groups(mesh, rank)              mesh.py: who talks to whom
                            chunks = GPTStage(units of this rank's stages) model.py + pipeline/partition.py
                            dp     = DataParallel(chunks, ...)             data_parallel.py: grads + optimizer
          _resume           checkpoint.load(...)      on --resume: any layout's checkpoint
          _start_pipeline   rt = PipelineRuntime(schedule[pp_rank], ...)   pipeline/runtime.py
          for step:
            _train_step     micro-batches = this DP rank's slice of the step's global batch   data.py
                            rt.run_step(...)  forwards/backwards in schedule order, DP buckets launched
                            dp.finish()
                            loss = Σ over micro-batches and DP ranks (already divided by global tokens)
                            dp.step(step)     unless the loss or gradient is NaN/Inf (skip, or stop)
            _record         history row, communication counts, timeline, activation memory
            _save           checkpoint.save(...)      every --save-every steps
          _results          this rank's return value; every rank's timeline gathered to rank 0

Every layout runs this same code; with dp = pp = tp = 1 it is the single-device reference.
Reliability (docs/reliability.md): `preflight` refuses bad input before any process starts, and
a watchdog ends a rank whose peers are gone or hung (a step in which every rank computes only
warns), so a failure never hangs the run.  Tests disturb a run only through the hooks of
`par3d.faults` (`RunOptions.faults`), never by code here.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from par3d.config import ConfigError, RunConfig
from par3d.faults import FaultInjector, RunHooks


@dataclass(frozen=True)
class RunOptions:
    """How a rank runs, beyond the configuration: what the caller (the CLI, a benchmark, a test)
    wants back and where to resume.  `run` fills `resume_dir`; the rest defaults to a plain run."""

    quiet: bool = False  # no progress bar
    resume_dir: str | None = None  # a checkpoint folder already resolved by `preflight`
    checkpoint_root: str | None = None  # where saves go (default: <train.out>/checkpoints)
    start_step: int = 0  # first step when not resuming
    stop_at_step: int | None = None  # stop before this step (a preempted run); None: train.steps
    bucket_numel: int = 1 << 20  # DP gradient bucket size, elements
    capture_grads: bool = False  # "grads": full gradients of the first step by global name
    capture_params: bool = False  # "params": full parameters after the last step
    capture_logits: bool = False  # "logits": full logits of the first 2 sequences before training (pp=1)
    keep_sizes: bool = False  # record every collective's message sizes (comm_per_step[i]["sizes"])
    all_events: bool = False  # "events_by_step": every step's timeline, not only the last
    faults: RunHooks | None = None  # the fault-injection seam (par3d.faults); None: PAR3D_TEST_* or none

    @classmethod
    def of(cls, options: RunOptions | Mapping[str, Any] | None) -> RunOptions:
        """`options` itself, or a RunOptions from a mapping of its field names (TypeError on others)."""
        if options is None:
            return cls()
        return options if isinstance(options, RunOptions) else cls(**options)


@dataclass
class _Rank:
    """Everything one rank builds before its first step (`_build`)."""

    cfg: RunConfig
    rank: int
    device: Any
    dtype: Any
    groups: Any
    chunks: list[Any]
    dpar: Any
    corpus: Any
    part: Any  # the layer partition over pipeline stages
    schedule: Any  # every pipeline rank's actions (built, or read from --schedule-csv)
    stages: list[int]  # the stages this rank holds, in chunk order (round-robin or the V)
    runtime: Any = None  # `_start_pipeline`
    report: Any = None  # the schedule checker's report (predicted in-flight activations)

    @property
    def first_in_replica(self) -> bool:
        """dp = 0, cp = 0, tp = 0: the rank that returns timelines and full tensors."""
        c = self.groups.coord
        return c.dp == 0 and c.tp == 0 and c.cp == 0


@dataclass
class _Tally:
    """What the loop accumulates; `_results` turns it into the rank's return value."""

    history: list[dict[str, Any]] = field(default_factory=list)
    comm_per_step: list[dict[str, Any]] = field(default_factory=list)
    events_last: list[Any] = field(default_factory=list)
    events_by_step: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # RunOptions.all_events
    peak_act: int = 0
    act_per_mb: int = 0
    saved: list[str] = field(default_factory=list)
    captured: dict[str, Any] = field(default_factory=dict)


def worker(cfg_dict: dict[str, Any], options: RunOptions | Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Runs on every rank.  Returns what the parent (or a test) needs: losses, timings, and on
    request full parameters/gradients by global name (from dp=0, tp=0 ranks)."""
    import torch.distributed as dist

    opts = RunOptions.of(options)
    cfg = RunConfig.from_dict(cfg_dict).resolve()
    rank = dist.get_rank() if dist.is_initialized() else 0
    r = _build(cfg, rank, opts)
    if r is None:  # this rank is not part of the layout (tests run small layouts in big worlds)
        return {"rank": rank, "idle": True}
    start_step, resume_dir = _resume(r, opts)
    _start_pipeline(r)
    hooks = opts.faults or FaultInjector.from_env() or RunHooks()
    tally = _Tally()
    if opts.capture_logits and cfg.parallel.pp == 1 and cfg.parallel.cp == 1:
        _capture_logits(r, tally)
    _reset_counter(opts.keep_sizes or cfg.comm_report)
    last_step = cfg.train.steps if opts.stop_at_step is None else min(cfg.train.steps, opts.stop_at_step)
    ckpt_root = opts.checkpoint_root or _checkpoints_root(cfg)
    peers = r.groups.world.ranks if (r.groups.world.size > 1 and dist.is_initialized()) else [rank]
    with _Progress(r, opts, start_step, append=bool(resume_dir)) as progress, \
            _Watchdog(rank, cfg.timeout_s, peers) as wd:
        for step in range(start_step, last_step):
            wd.beat(f"step {step}")
            hooks.step_started(rank, step)
            row, res = _train_step(r, step, hooks.loss_scale(step, _loss_scale(cfg)))
            if opts.capture_grads and step == start_step:
                tally.captured["grads"] = _gather_named(r, "grad")
            _record(r, opts, tally, row, res)
            progress.step_done(row)
            if cfg.save_every and (step + 1) % cfg.save_every == 0:
                hooks.before_save(rank, step, r.dpar)
                wd.beat(f"saving the checkpoint of step {step + 1}")
                _save(r, ckpt_root, step, tally, hooks)
    if opts.capture_params:
        tally.captured["params"] = _gather_named(r, "model")
    return _results(r, tally, resume_dir, start_step)


# ---- the steps of `worker`, in the order it takes them ----------------------------------------------

def _build(cfg: RunConfig, rank: int, opts: RunOptions) -> _Rank | None:
    """Device, process groups, this rank's model chunks and DP state, the data; None when this
    rank is outside the layout."""
    import torch
    import torch.distributed as dist

    from par3d.data import Corpus
    from par3d.data_parallel import DataParallel
    from par3d.mesh import Mesh, build_groups
    from par3d.model import GPTStage, ModelContext
    from par3d.pipeline.partition import gpt_partition
    from par3d.pipeline.schedules import p2p_pairs, placement, rank_stages
    from par3d.zero import ShardedDataParallel

    mc, pc, tc = cfg.model, cfg.parallel, cfg.train
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    dtype = torch.bfloat16 if tc.dtype == "bf16" else torch.float32

    schedule = pipeline_schedule(cfg)
    # the head's pipeline rank: the last, or rank 0 in a V (zb-v, dualpipe-v), beside the embedding
    mesh = Mesh(pc.dp, pc.pp, pc.tp, pc.cp, head_pp=placement(schedule)[pc.pp * pc.virtual_stages - 1])
    # the backend carries the pipeline's messages (NCCL always; gloo with --p2p backend): a group
    # per (channel, pair of ranks), so NCCL runs what schedules.nccl_problems proves safe
    backend_p2p = pc.p2p == "backend" or (dist.is_initialized() and dist.get_backend() == "nccl")
    groups = build_groups(mesh, rank, timeout_s=cfg.timeout_s,
                          p2p_pairs=p2p_pairs(schedule) if backend_p2p and pc.pp > 2 else None,
                          backend_p2p=backend_p2p)
    if groups is None:
        return None
    c = groups.coord
    p, v = pc.pp, pc.virtual_stages
    # dropout: one stream shared by the TP ranks (replicated activations); their head and sequence
    # shards draw from streams derived per TP rank (rng.py)
    torch.manual_seed(tc.seed + 1000 * c.dp + c.pp)

    part = gpt_partition(mc.layers, p * v, mc.hidden, mc.seq_len, mc.vocab, mc.ffn_hidden,
                         split=pc.pipeline_layout)
    ctx = ModelContext(tp=groups.tp, seed=tc.seed, sequence_parallel=pc.sequence_parallel and pc.tp > 1,
                       recompute=pc.recompute, dtype=dtype, cp=groups.cp)
    stages = rank_stages(schedule, c.pp)
    chunks = [GPTStage(mc, ctx, *part.bounds[s]) for s in stages]
    if cfg.init_from:  # Hugging Face weights: each rank reads its own slices (before the fp32 masters)
        from par3d import hf

        hf.load_into(cfg.init_from, chunks, groups.tp, mc)
    chunks = [ch.to(device) for ch in chunks]
    if pc.zero_stage >= 1 and groups.grad_group.size > 1:  # ZeRO 1-3: zero.py shards over dp x cp
        dpar: Any = ShardedDataParallel(chunks, groups, tc, pc.zero_stage, bucket_numel=opts.bucket_numel)
    else:
        dpar = DataParallel(chunks, groups, tc, 0, bucket_numel=opts.bucket_numel)
    return _Rank(cfg, rank, device, dtype, groups, chunks, dpar, Corpus.load(tc.data, tc.tokenizer), part,
                 schedule, stages)


def pipeline_schedule(cfg: RunConfig) -> Any:
    """Every pipeline rank's actions: `parallel.schedule` built, or `parallel.schedule_csv` read
    (validated before any process started, `RunConfig.validate`)."""
    from par3d.pipeline.schedules import build, from_csv

    pc = cfg.parallel
    if pc.schedule_csv:
        with open(pc.schedule_csv, newline="") as fh:
            return from_csv(fh.read()).schedule
    times = tuple(float(t) for t in pc.zbv_times) if pc.zbv_times else None  # zb-v's order, as planned
    return build(pc.schedule, pc.pp, pc.microbatches, pc.virtual_stages, times)


def _start_pipeline(r: _Rank) -> None:
    """The schedule of this rank's pipeline position (checked) and the runtime that executes it."""
    from par3d.pipeline.runtime import PipelineRuntime
    from par3d.pipeline.schedules import check, placement

    mc, pc, tc = r.cfg.model, r.cfg.parallel, r.cfg.train
    p, m, v = pc.pp, pc.microbatches, pc.virtual_stages
    schedule = r.schedule
    r.report = check(schedule, p, m, v)
    s_local = mc.seq_len // pc.cp  # this CP rank's two chunks of every sequence
    s_local = s_local // pc.tp if r.chunks[0].ctx.sequence_parallel else s_local
    r.runtime = PipelineRuntime(r.chunks, schedule[r.groups.coord.pp], r.groups, p, m, v,
                                (tc.micro_batch, s_local, mc.hidden), r.dtype, r.device,
                                set_sync=r.dpar.set_sync, synthetic_ms=r.cfg.synthetic_stage_ms,
                                p2p=pc.p2p, timeout_s=r.cfg.timeout_s, placement=placement(schedule),
                                around_backward=r.dpar)


def _resume(r: _Rank, opts: RunOptions) -> tuple[int, str | None]:
    """(first step, checkpoint folder or None).  A checkpoint restores weights, Adam state, the
    optimizer step and RNG; the data position is the step itself (sampling is a pure function of
    (seed, step))."""
    from par3d import checkpoint

    cfg = r.cfg
    resume_dir = opts.resume_dir or (
        checkpoint.resolve(cfg.resume, cfg.train.out, warn=r.rank == 0) if cfg.resume else None)
    if not resume_dir:
        return opts.start_step, None
    return int(checkpoint.load(resume_dir, r.chunks, r.dpar, r.groups, cfg)["step"]), resume_dir


def _checkpoints_root(cfg: RunConfig) -> str:
    from par3d import checkpoint

    return checkpoint.checkpoints_root(cfg.train.out)


def _loss_scale(cfg: RunConfig) -> float:
    """Per-token losses are divided by the global tokens of a step, so the sum over micro-batches
    and DP ranks is the mean loss."""
    return 1.0 / (cfg.train.global_batch * cfg.model.seq_len)


def _capture_logits(r: _Rank, tally: _Tally) -> None:
    """Full logits of the first two sequences of step 0, before any update (equivalence tests)."""
    import numpy as np
    import torch

    from par3d import comm
    from par3d.data import global_batch

    tc, mc = r.cfg.train, r.cfg.model
    x0, _ = global_batch(r.corpus, tc.seed, 0, tc.global_batch, mc.seq_len)
    with torch.no_grad(), r.dpar.gathered():  # ZeRO-3: every unit's weights, for this pass
        comm.COUNTER.enabled = False
        logits = r.chunks[0].logits(torch.from_numpy(np.ascontiguousarray(x0[:2])).to(r.device))
        comm.COUNTER.enabled = True
    if r.first_in_replica:
        tally.captured["logits"] = logits.float().cpu()


def _reset_counter(keep_sizes: bool) -> None:
    from par3d import comm

    comm.COUNTER.reset()
    comm.COUNTER.keep_sizes = bool(keep_sizes)


def _train_step(r: _Rank, step: int, loss_scale: float) -> tuple[dict[str, Any], Any]:
    """One optimizer step: this DP rank's micro-batches through the schedule, the gradient
    reduction, the loss summed over PP and DP, and the update unless the loss or gradient is
    NaN/Inf.  Returns the history row (communication not yet added) and the runtime's result."""
    import numpy as np
    import torch

    from par3d import comm, timing
    from par3d.context_parallel import split_sequence
    from par3d.data import rank_microbatches

    cfg, c, dpar = r.cfg, r.groups.coord, r.dpar
    mc, pc, tc = cfg.model, cfg.parallel, cfg.train
    t0 = timing.now(r.device)  # on a GPU: after the queued work, so a step times its kernels
    cp = r.groups.cp_group  # each CP rank takes its two chunks of every sequence
    mbs = [(split_sequence(torch.from_numpy(np.ascontiguousarray(x)).to(r.device), cp),
            split_sequence(torch.from_numpy(np.ascontiguousarray(y)).to(r.device), cp))
           for x, y in rank_microbatches(r.corpus, tc.seed, step, tc.global_batch, mc.seq_len,
                                         pc.dp, c.dp, pc.microbatches)]
    dpar.start_step()
    res = r.runtime.run_step(mbs, loss_scale)
    dpar.finish()
    loss_t = torch.tensor([res.loss_sum], dtype=torch.float64, device=r.device)  # NCCL needs device tensors
    comm.all_reduce(loss_t, r.groups.pp)
    comm.all_reduce(loss_t, r.groups.grad_group)  # dp x cp: every token of the global batch
    loss = float(loss_t)
    if math.isfinite(loss):  # every rank holds the same loss, so all ranks skip together
        info = dpar.step(step)
    else:
        info = {"grad_norm": float("nan"), "lr": dpar.lr_at(step), "skipped": True}
    dt = timing.now(r.device) - t0
    if info["skipped"]:
        _non_finite(step, loss, info["grad_norm"], tc.on_nonfinite, r.rank == 0)
    row = {"step": step, "loss": loss, "lr": info["lr"], "tokens": tc.global_batch * mc.seq_len * (step + 1),
           "step_time_s": dt, "grad_norm": info["grad_norm"], "skipped": bool(info["skipped"])}
    return row, res


def _record(r: _Rank, opts: RunOptions, tally: _Tally, row: dict[str, Any], res: Any) -> None:
    """The step's communication (then the counter restarts), timeline and activation memory."""
    from par3d import comm

    snap = comm.COUNTER.snapshot()
    sizes = ({f"{g}/{k}": list(v) for (g, k), v in comm.COUNTER.elements.items()}
             if comm.COUNTER.keep_sizes else None)
    tally.comm_per_step.append({"step": row["step"], "comm": snap, **({"sizes": sizes} if sizes else {})})
    comm.COUNTER.reset()
    if r.cfg.comm_report:
        row["comm"] = snap
        row["comm_sizes"] = sizes
    tally.history.append(row)
    tally.events_last = res.events
    if opts.all_events and r.first_in_replica:
        tally.events_by_step[row["step"]] = [e.to_dict() for e in res.events]
    tally.peak_act = max(tally.peak_act, res.peak_activation_bytes)
    tally.act_per_mb = max(tally.act_per_mb, res.activation_bytes_per_microbatch)


def _save(r: _Rank, root: str, step: int, tally: _Tally, hooks: RunHooks) -> None:
    """The checkpoint after step `step` (none is written when the state holds NaN/Inf)."""
    from par3d import checkpoint

    path = checkpoint.save(root, step + 1, r.chunks, r.dpar, r.groups, r.cfg,
                           hook=lambda _where: hooks.in_save(r.rank, step))
    if path is None and r.cfg.train.on_nonfinite == "stop":
        raise FloatingPointError(f"non-finite weights or optimizer state after step {step}; "
                                 f"stopping (train.on_nonfinite='stop')")
    if path is not None:
        tally.saved.append(path)


def _gather_named(r: _Rank, kind: str) -> dict[str, Any]:
    """Full tensors ("model" weights or the reduced "grad") by global name (`model.full_tensor`:
    TP slices gathered; ZeRO's slices gathered over dp x cp first), from dp=cp=tp=0 ranks only."""
    from par3d import comm
    from par3d.model import full_tensor, global_named_parameters

    mc = r.cfg.model
    comm.COUNTER.enabled = False
    try:
        out = {}
        for ci, chunk in enumerate(r.chunks):
            flat = r.dpar.full_flat(kind, ci)
            offsets = r.dpar.bufs[ci].offsets
            for name, q in global_named_parameters(chunk):
                if name == "head.weight" and mc.tied_embeddings:
                    continue  # the tied copy on the last stage; the reference holds one table
                o = offsets[id(q)]
                local = flat[o:o + q.numel()].view(q.shape)
                out[name] = full_tensor(name, local, q, r.groups.tp, mc.vocab)
    finally:
        comm.COUNTER.enabled = True
    return out if r.first_in_replica else {}


def _memory(r: _Rank, tally: _Tally) -> dict[str, Any]:
    """This rank's measured bytes (the DP object's weights, gradients, optimizer state and transient
    buffers; the activation meter's peak) beside plan/memory.py's prediction for the same layout."""
    from par3d.predict import predict_memory

    measured = dict(r.dpar.memory(), activations=tally.peak_act)
    try:
        predicted: dict[str, Any] | None = predict_memory(r.cfg, r.groups.coord.pp)
    except Exception as e:  # the report must not lose a finished run over a prediction problem
        predicted = {"error": f"{type(e).__name__}: {e}"}
    return {"measured": measured, "predicted": predicted}


_WORLD_KEYS = ("rank", "coord", "events", "peak_activation_bytes", "peak_inflight_predicted", "bounds",
               "events_by_step", "memory")


def _results(r: _Rank, tally: _Tally, resume_dir: str | None, start_step: int) -> dict[str, Any]:
    """This rank's return value; `world` holds every rank's timeline and memory."""
    import torch.distributed as dist

    c, part = r.groups.coord, r.part
    out: dict[str, Any] = {
        "rank": r.rank, "coord": [c.dp, c.pp, c.tp, c.cp], "history": tally.history,
        "comm_per_step": tally.comm_per_step,
        "peak_activation_bytes": tally.peak_act, "activation_bytes_per_microbatch": tally.act_per_mb,
        "p2p_transport": r.runtime.transport,
        "peak_inflight_predicted": r.report.peak_inflight[c.pp],
        "events": [e.to_dict() for e in tally.events_last] if r.first_in_replica else [],
        "events_by_step": tally.events_by_step,
        "bounds": [part.bounds[s] for s in r.stages], "imbalance": part.imbalance,
        "resumed_from": resume_dir, "start_step": start_step, "checkpoints": tally.saved,
    }
    out["memory"] = _memory(r, tally)
    out.update(tally.captured)
    mine = {k: out[k] for k in _WORLD_KEYS}
    if r.groups.world.size > 1:
        # rank 0 gets every rank's timeline and memory (also under torchrun, where the parent
        # process does not see the other ranks' return values)
        world: list[Any] = [None] * r.groups.world.size
        dist.all_gather_object(world, mine, group=r.groups.world.pg)
        out["world"] = world
    else:
        out["world"] = [mine]
    return out


class _Progress:
    """Rank 0's outputs while training: the metrics file (JSON lines) and the progress bar."""

    def __init__(self, r: _Rank, opts: RunOptions, start_step: int, append: bool):
        cfg, is_rank0 = r.cfg, r.rank == 0
        self.tokens_per_step = cfg.train.global_batch * cfg.model.seq_len
        self.fh = None
        if is_rank0 and cfg.metrics_out:
            if os.path.dirname(cfg.metrics_out):
                os.makedirs(os.path.dirname(cfg.metrics_out), exist_ok=True)
            # a resumed run appends: the metrics file then holds the whole run (a step redone after
            # a crash appears twice; the later line is the one that counts)
            self.fh = open(cfg.metrics_out, "a" if append else "w")  # noqa: SIM115
        self.bar = None
        if is_rank0 and cfg.progress and not opts.quiet:
            from tqdm import tqdm

            # a thread lock, not tqdm's default multiprocessing one: that is a named semaphore, which
            # a rank killed mid-run cannot release and the resource tracker then reports as leaked
            tqdm.set_lock(threading.RLock())
            self.bar = tqdm(total=cfg.train.steps, initial=start_step, desc="train", unit="step",
                            file=sys.stderr, dynamic_ncols=True)

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.fh:
            self.fh.close()

    def step_done(self, row: dict[str, Any]) -> None:
        if self.fh:
            self.fh.write(json.dumps(row) + "\n")
            self.fh.flush()
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{row['loss']:.4f}", tok_s=f"{self.tokens_per_step / row['step_time_s']:,.0f}")
            self.bar.update(1)


def _non_finite(step: int, loss: float, grad_norm: float, policy: str, is_rank0: bool) -> None:
    """A NaN/Inf loss or gradient norm: the update was skipped; stop the run if asked to."""
    what = f"non-finite loss ({loss}) or gradient norm ({grad_norm}) at step {step}"
    if policy == "stop":
        raise FloatingPointError(f"{what}; stopping (train.on_nonfinite='stop')")
    if is_rank0:
        print(f"par3d: {what}; update skipped (train.on_nonfinite='skip')", file=sys.stderr, flush=True)


class _Watchdog:
    """Watches the training loop from a thread: when no step has finished for `timeout_s` plus
    the slowest interval between two beats seen so far, it finds out why and says so.

      * a rank is gone (its heartbeat stopped, or the store on rank 0 went): this rank ends (one
        line on stderr, exit code 1) and its launcher (par3d's or torchrun) stops the others;
      * every rank is alive but none is computing (a rank hung, or a deadlock): the same;
      * ranks are still computing (their processes use CPU): one warning per `timeout_s`, and the
        run goes on — a slow step is not a failure (the memory check refuses most runs that would
        crawl; docs/reliability.md).

    Why a watchdog at all: collectives on torch *sub*groups do not honour init_process_group's
    timeout (new groups get torch's 30-minute default), so a peer that died or hung could block
    the other ranks for half an hour.  Heartbeats: every rank adds to two counters in the run's
    TCP store (a client of its own, so no other thread's use of the store is shared) about once a
    second — its beats, and its process's CPU milliseconds."""

    COMPUTING = 0.02  # share of one core a rank uses while computing (a blocked rank: ~0)

    def __init__(self, rank: int, timeout_s: float, peers: list[int], enabled: bool = True):
        self.rank, self.timeout_s, self.peers, self.enabled = rank, float(timeout_s), list(peers), enabled
        self.last, self.slowest, self.what = time.monotonic(), 0.0, "start-up"
        self.tick = min(1.0, self.timeout_s / 4)
        self._cpu_ms = 0  # published so far
        self._store: Any = None
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

    def _connect(self) -> Any:
        if len(self.peers) > 1 and self._store is None and "MASTER_ADDR" in os.environ:
            from datetime import timedelta

            import torch.distributed as dist

            self._store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                        is_master=False, timeout=timedelta(seconds=max(self.tick * 4, 5.0)))
        return self._store

    def _publish(self) -> None:
        total = int(1e3 * time.process_time())  # this process's CPU, every thread, milliseconds
        ms, self._cpu_ms = total - self._cpu_ms, total
        store = self._connect()
        if store is not None:
            store.add(f"par3d-watchdog/{self.rank}/beat", 1)
            store.add(f"par3d-watchdog/{self.rank}/cpu_ms", ms)

    def _sample(self) -> dict[int, tuple[int, int]]:
        """(beats, CPU ms) of every rank; this rank's own CPU without the store."""
        store = self._connect()
        if store is None:
            return {self.rank: (0, int(1e3 * time.process_time()))}
        return {r: (store.add(f"par3d-watchdog/{r}/beat", 0), store.add(f"par3d-watchdog/{r}/cpu_ms", 0))
                for r in self.peers}

    def diagnose(self, window_s: float) -> tuple[str, list[int]]:
        """("gone" | "computing" | "idle", the ranks concerned), from samples `window_s` apart.  A peer that
        did not beat in the first window is watched for a second one before it is called gone: a live peer
        starved of CPU (a host running more busy processes than it has cores) beats late, a dead one never
        (the suite's busy pair on two cores once went 2 s without a beat)."""
        try:
            a = self._sample()
            if self._beat_through(window_s):
                return "computing", []
            b, span = self._sample(), window_s
            if len(self.peers) == 1:
                b = {self.rank: (0, int(1e3 * time.process_time()))}
            gone = [r for r in a if r != self.rank and b[r][0] == a[r][0]]
            if gone:
                if self._beat_through(window_s):
                    return "computing", []
                b, span = self._sample(), 2 * window_s
                gone = [r for r in gone if b[r][0] == a[r][0]]
        except Exception:  # the store lives in rank 0's process: unreachable = rank 0 gone
            return "gone", [0]
        if gone:
            return "gone", gone
        busy = [r for r in a if b[r][1] - a[r][1] >= 1e3 * self.COMPUTING * span]
        return ("computing", busy) if busy else ("idle", [])

    def _beat_through(self, window_s: float) -> bool:
        """Wait `window_s`, beating all the while (a peer diagnosing at the same moment must not take this
        rank's silence for its death); True if the watchdog was stopped meanwhile."""
        n = max(1, math.ceil(window_s / self.tick))
        for _ in range(n):
            if self._stop.wait(window_s / n):
                return True
            self._publish()
        return False

    def _watch(self) -> None:
        warned = 0.0
        while not self._stop.wait(self.tick):
            try:
                self._publish()
            except Exception:
                pass  # judged below, when it matters
            idle = time.monotonic() - self.last
            limit = self.timeout_s + self.slowest
            if idle <= limit or time.monotonic() - warned < self.timeout_s:
                continue
            verdict, who = self.diagnose(max(2.5 * self.tick, 2.0))
            if self._stop.is_set():
                return
            idle = time.monotonic() - self.last
            if verdict == "computing" or len(self.peers) == 1:
                warned = time.monotonic()
                print(f"par3d: rank {self.rank}: no step finished in {idle:.0f} s (--timeout {self.timeout_s:g}) "
                      f"while ranks are still computing (ranks {', '.join(map(str, who)) or '-'} used CPU "
                      f"just now; in {self.what}); not stopping: a step may just be slow (see the memory "
                      f"estimate; a smaller --seq-len, --micro-batch or model is faster)",
                      file=sys.stderr, flush=True)
                continue
            why = (f"rank {', '.join(map(str, who))} is gone (no heartbeat)" if verdict == "gone" else
                   "every rank is alive but none is computing: a rank hung or the ranks deadlocked")
            print(f"par3d: rank {self.rank}: no progress for {idle:.0f} s in {self.what} "
                  f"(--timeout {self.timeout_s:g}); {why}; stopping", file=sys.stderr, flush=True)
            os._exit(1)  # the main thread may be blocked in C++; nothing else ends it


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
        corpus = Corpus.load(tc.data, tc.tokenizer)  # with a tokenizer: tokenized here, once, for every rank
    except (OSError, ValueError) as e:
        raise ConfigError([f"train.data={tc.data!r}: {e}"]) from None
    # (too little text for one sequence is already a validate() error for bytes)
    if len(corpus) < mc.seq_len + 1:
        errs.append(f"train.data={tc.data!r} holds {len(corpus)} tokens, fewer than seq_len+1={mc.seq_len + 1}; "
                    f"give more text or a smaller --seq-len")
    if tc.tokenizer is not None:
        if corpus.vocab > mc.vocab:
            errs.append(f"model.vocab={mc.vocab}: the tokenizer {tc.tokenizer!r} has {corpus.vocab} tokens; "
                        f"use --vocab {corpus.vocab} (or a model whose vocabulary covers the tokenizer's)")
    else:
        top = int(corpus.tokens.max()) if len(corpus) else 0
        if top >= mc.vocab:
            errs.append(f"model.vocab={mc.vocab}: the data holds token {top} (bytes are tokens 0..255); "
                        f"use --vocab 256")
    if cfg.init_from:
        errs.extend(check_init_from(cfg))
    launched = os.environ.get("WORLD_SIZE") if "RANK" in os.environ else None
    if launched is not None and int(launched) != cfg.parallel.world_size:
        errs.append(f"the launcher started {launched} processes but dp x pp x tp = "
                    f"{cfg.parallel.world_size}; make them equal")
    errs += _output_problems(cfg)
    errs += _memory_problems(cfg)
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


def _output_problems(cfg: RunConfig) -> list[str]:
    """Every output the run will write, tried now (outputs.py): --out, and the checkpoints under
    it with --save-every; on global rank 0 (the one that writes them) --metrics-out and --trace-out."""
    from par3d import checkpoint
    from par3d.outputs import check_outputs

    folders = [("--out", cfg.train.out)]
    if cfg.save_every:
        folders.append(("--save-every (checkpoints under --out)", checkpoint.checkpoints_root(cfg.train.out)))
    files = []
    if os.environ.get("RANK", "0") == "0":
        if cfg.trace_out:
            folders.append(("--trace-out", cfg.trace_out))
        if cfg.metrics_out:
            files.append(("--metrics-out", cfg.metrics_out))
    return check_outputs(folders, files, clean_up="RANK" not in os.environ)


def _memory_problems(cfg: RunConfig) -> list[str]:
    """The planner's memory estimate against this host's RAM (CPU ranks) or one GPU's memory
    (memcheck.py): a problem when it cannot fit, a warning on rank 0 over 80 %."""
    import torch

    from par3d import memcheck

    if torch.cuda.is_available():
        capacity, sharing, device = float(torch.cuda.mem_get_info()[0]), 1, "cuda"
    else:
        capacity, sharing, device = memcheck.host_memory()[1], memcheck.ranks_on_this_host(cfg), "cpu"
    if capacity <= 0:  # unknown (not Linux): nothing to compare with
        return []
    refusal, warning = memcheck.judge(memcheck.estimate(cfg, capacity, sharing, device), cfg)
    if warning and os.environ.get("RANK", "0") == "0":
        print(f"par3d: {warning}", file=sys.stderr)
    return [refusal] if refusal else []


def check_init_from(cfg: RunConfig) -> list[str]:
    """Problems with `--init-from` found without starting a process: the folder, its config.json
    against the run's model, the safetensors files, the optional dependency."""
    from par3d import hf

    try:
        hf.check_matches(hf.model_config_from_hf(hf.read_hf_config(cfg.init_from), cfg.model.seq_len,
                                                 cfg.init_from), cfg.model, cfg.init_from)
        hf.SafetensorsReader(cfg.init_from)
    except ImportError:
        return ["--init-from needs the safetensors package: pip install 'par3d[hf]'"]
    except ConfigError as e:
        return e.problems
    return []


def run(cfg: RunConfig, options: RunOptions | Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Check (raises ConfigError), start the world (locally or under torchrun); per-rank results."""
    from par3d.distributed import run_main

    resume_dir = preflight(cfg)
    options = replace(RunOptions.of(options), resume_dir=resume_dir)  # every rank resumes from the same folder
    nproc = cfg.parallel.world_size
    res = run_main(worker, nproc, (cfg.to_dict(), options), timeout_s=cfg.timeout_s,
                   threads=cfg.threads_per_rank)
    results = res if isinstance(res, list) else [res]
    return results
