"""`par3d bench peers`: par3d's parallel machinery against PyTorch's own, side by side.

Three pairs, each on identical shapes, weights (ours copied into theirs) and data, in one world of
ranks per rank count (gloo on CPU ranks; NCCL with one GPU per rank where CUDA is available).  The
torch side is configured as its documentation recommends for the device:

  tp_block_N          one transformer block, forward + backward, tensor-parallel over N ranks:
                      ours  = `model.Block` built from `tensor_parallel` layers (fused QKV, f/g ops)
                      theirs = a plain nn.Module block with the SAME fused QKV projection (one
                               [3h, h] GEMM, rows grouped by rank so that a contiguous column split
                               gives each rank whole heads' Q, K and V), parallelised with
                               `torch.distributed.tensor.parallel.parallelize_module`
                               (ColwiseParallel on qkv, fc1; RowwiseParallel on W_o, fc2)
  pp_<schedule>_N_<t> a whole GPT cut into N (interleaved: 2N) stages, m = 2N micro-batches,
                      forward + backward of one global batch, one row per transport t of ours:
                      ours  = `pipeline.runtime.PipelineRuntime` running `pipeline.schedules`, over
                              shared memory (t = shm, CPU ranks only) or the backend's isend/irecv
                              (t = backend, what torch's side uses too)
                      theirs = `torch.distributed.pipelining` PipelineStage + ScheduleGPipe /
                               Schedule1F1B / ScheduleInterleaved1F1B, same split, same modules
  dp_N                one training step of a whole GPT replicated on N ranks:
                      ours  = `data_parallel.DataParallel` (bucketed all-reduce during backward,
                              flat-buffer AdamW with clipping)
                      theirs = DistributedDataParallel(gradient_as_bucket_view=True) +
                               clip_grad_norm_ + torch.optim.AdamW(fused=True where the device
                               supports it, else foreach=True)

Timing is interleaved (ABBA order: ours, theirs, theirs, ours, ...; with two of ours A B C, C B A)
so drift of a shared, oversubscribed machine hits every side alike.  Every timed step starts after
a barrier; on a GPU the clock is read only after `torch.cuda.synchronize()`, so a step's time is its
kernels', not their launches'.  A step's time is the slowest rank's, and a row reports the median
over steps.  Before any timing the first step's loss of every side is compared: a fast wrong
implementation is not a result.  Nothing here has run on a GPU yet (docs/measured.md).

A peer API that fails here keeps its row with `theirs_s: null` and the error text in `note`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from par3d.argtypes import int_at_least

if TYPE_CHECKING:  # torch is imported lazily: registering the command must stay torch-free
    import torch
    from torch import nn

SCHEDULES = ("gpipe", "1f1b", "interleaved")
DEFAULT_OUT = "runs/bench/peers.json"  # never the committed benchmarks/results/ unless asked
FAMILIES = ("tp", "pp", "dp")
LOSS_TOL = 1e-4

# Shapes: a GPT small enough that a step takes tens of milliseconds on one core per rank, large
# enough that compute, not Python overhead alone, is what gets timed.
DEFAULT_SHAPES: dict[str, int] = {"vocab": 256, "seq_len": 64, "layers": 8, "hidden": 128, "heads": 8,
                                  "micro_batch": 2, "tp_batch": 8}
QUICK_SHAPES: dict[str, int] = {"vocab": 128, "seq_len": 32, "layers": 8, "hidden": 64, "heads": 4,
                                "micro_batch": 1, "tp_batch": 4}

# Why a row may miss ours <= theirs, by family: findings of profiling this benchmark's shapes (see
# benchmarks/README.md).  Attached to a row only when its ratio is > 1.
SLOWER_BECAUSE: dict[str, str] = {
    "dp": "both sides run the same modules' forward and backward (most of the step), one bucketed "
          "all-reduce overlapped with backward and a fused AdamW; on one process par3d's step is within "
          "a few per cent of DDP + clip_grad_norm_ + fused AdamW either way, so a ratio near 1 is parity "
          "and its side of 1 is decided by how the OS schedules the ranks' gloo threads",
    "pp": "both runtimes run the same actions in the same order with the same dependency chain, and "
          "par3d's stage does the same work per micro-batch as torch's (profiled: event timelines per "
          "rank and each stage's work timed alone); with more ranks than cores, step time follows how "
          "the OS schedules ranks blocked in receives, which varies from run to run",
    "tp_block": "not expected: both blocks have one fused QKV GEMM and do 2 all-reduces forward and 2 "
                "backward; torch's adds DTensor dispatch around each parallel linear",
}


# ---- command line ------------------------------------------------------------------------------

def register(bsub: Any) -> None:
    ap = bsub.add_parser(
        "peers", help="par3d's TP / PP / DP against torch.distributed's, side by side",
        description="Times par3d's tensor-parallel block, pipeline runtime (GPipe, 1F1B, interleaved) "
                    "and data parallelism against torch.distributed.tensor.parallel, "
                    "torch.distributed.pipelining and DistributedDataParallel on identical models, "
                    "weights and data, on gloo ranks.  Reports median step times and ours/theirs "
                    "ratios, and checks that both sides compute the same loss.")
    ap.add_argument("--ranks", default="2,4",
                    help="comma-separated rank counts; one world of gloo processes per count "
                         "(default: %(default)s)")
    ap.add_argument("--steps", type=int_at_least(1), default=None,
                    help="timed iterations per side and row (default: 10, or 4 with --quick)")
    ap.add_argument("--warmup", type=int_at_least(0), default=None,
                    help="untimed iterations per side before timing (default: 3, or 1 with --quick)")
    ap.add_argument("--cases", default="tp,pp,dp",
                    help="comma-separated families to run: tp (one block), pp (gpipe, 1f1b, interleaved), "
                         "dp (a training step) (default: %(default)s)")
    ap.add_argument("--repeat", type=int_at_least(1), default=1,
                    help="whole runs back to back (default: %(default)s); with more than one, each row "
                         "reports the run with its median ratio, plus every run's ratio and their range")
    ap.add_argument("--quick", action="store_true",
                    help="smaller shapes and fewer steps: a smoke run of a few tens of seconds")
    ap.add_argument("--out", default=DEFAULT_OUT,
                    help="results JSON file (a markdown table is written next to it with suffix .md); "
                         "a directory gets peers.json and peers.md inside (default: %(default)s; the "
                         "committed results change only when this names benchmarks/results/)")
    ap.add_argument("--json", action="store_true",
                    help='print {"rows": [{"case", "ours_s", "theirs_s", "ratio", ...}, ...]} to stdout '
                         "instead of the table")
    ap.set_defaults(func=run)


def _parse_ranks(text: str) -> list[int]:
    try:
        ranks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--ranks: {text!r} is not a comma-separated list of integers, e.g. 2,4") from None
    bad = [r for r in ranks if r < 2]
    if not ranks or bad:
        raise SystemExit(f"--ranks: every rank count must be >= 2 (got {text!r})")
    return ranks


def _out_paths(out: str) -> tuple[Path, Path]:
    p = Path(out)
    if p.is_dir() or p.suffix != ".json":
        p = p / "peers.json"
    return p, p.with_suffix(".md")


def run(args: argparse.Namespace) -> int:
    from par3d.distributed import launch

    ranks = _parse_ranks(args.ranks)
    shapes = dict(QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    steps = args.steps if args.steps is not None else (4 if args.quick else 10)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    if steps < 1 or warmup < 0 or args.repeat < 1:
        raise SystemExit("--steps and --repeat must be >= 1 and --warmup >= 0")
    for n in ranks:
        if shapes["heads"] % n or shapes["layers"] < 2 * n:
            raise SystemExit(f"--ranks {n}: the benchmark model has {shapes['heads']} heads and "
                             f"{shapes['layers']} layers; N must divide the heads and 2N <= layers")
    families = [c.strip() for c in args.cases.split(",") if c.strip()]
    if not families or any(f not in FAMILIES for f in families):
        raise SystemExit(f"--cases: choose from {', '.join(FAMILIES)} (got {args.cases!r})")
    spec = {"shapes": shapes, "steps": steps, "warmup": warmup, "verbose": not args.json,
            "families": families}
    t_start = time.perf_counter()
    load0 = os.getloadavg()[0]
    runs: list[list[dict[str, Any]]] = []
    where: dict[str, str] = {}
    for k in range(args.repeat):
        if args.repeat > 1 and not args.json:
            print(f"run {k + 1} of {args.repeat}", file=sys.stderr, flush=True)
        rows: list[dict[str, Any]] = []
        for n in ranks:
            # one world per rank count; one thread per CPU rank (the ranks share the machine's cores)
            res = launch(_worker, n, (spec,), timeout_s=120.0, wall_timeout_s=900.0, threads=1)
            rows += res[0]["rows"]
            where = {"backend": res[0]["backend"], "device": res[0]["device"]}
        runs.append(rows)
    rows = _median_runs(runs)
    for row in rows:
        if row["ratio"] is not None and row["ratio"] > 1.0 and not row.get("note"):
            row["note"] = _why_slower(row)
    result = {"rows": rows, "meta": _meta(spec, ranks, time.perf_counter() - t_start, load0, where)}
    result["meta"]["repeat"] = args.repeat
    json_path, md_path = _out_paths(args.out)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    md_path.write_text(markdown(result))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(markdown(result), end="")
        print(f"wrote {json_path} and {md_path}", file=sys.stderr)
    return 0


def _median_runs(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per case: from a single run, that run's row; from several, the row of the run whose
    ratio is the median (a real run's numbers, so ratio = ours_s / theirs_s still holds), with
    `ratio_runs` (every run's ratio, in order) and `ratio_range` ([min, max]) added."""
    if len(runs) == 1:
        return runs[0]
    out = []
    for i, first in enumerate(runs[0]):
        same = [run[i] for run in runs]
        assert all(r["case"] == first["case"] for r in same)
        ratios = [r["ratio"] for r in same]
        if any(x is None for x in ratios):
            out.append(dict(first, ratio_runs=ratios, ratio_range=None))
            continue
        pick = sorted(range(len(same)), key=lambda j: ratios[j])[(len(same) - 1) // 2]
        out.append(dict(same[pick], ratio_runs=ratios, ratio_range=[min(ratios), max(ratios)],
                        median_of_run=pick + 1))
    return out


def _why_slower(row: dict[str, Any]) -> str:
    """The note of a row that misses ours <= theirs: noise, and/or the profiled cause."""
    parts = []
    if row["ratio"] - 1.0 <= row["spread"]:
        parts.append(f"within noise: step times' inter-quartile range is {row['spread']:.0%} of the median "
                     "on this shared, oversubscribed machine")
    fam = row["case"].rsplit("_", 1)[0].split("_")[0] if row["case"].startswith(("pp", "dp")) else "tp_block"
    if fam in SLOWER_BECAUSE:
        parts.append(SLOWER_BECAUSE[fam])
    return "; ".join(parts)


def _meta(spec: dict[str, Any], ranks: list[int], wall_s: float, load0: float,
          where: dict[str, str]) -> dict[str, Any]:
    import torch

    return {"load_average_1min": [round(load0, 2), round(os.getloadavg()[0], 2)], "torch": torch.__version__,
            "backend": where.get("backend", "?"), "device": where.get("device", "?"), "threads_per_rank": 1,
            "ranks": ranks,
            "cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
            "shapes": spec["shapes"], "steps": spec["steps"], "warmup": spec["warmup"],
            "wall_s": round(wall_s, 1), "loss_tolerance": LOSS_TOL}


def _fmt(x: float | None, unit: str = "ms") -> str:
    if x is None:
        return "—"
    return f"{x * 1e3:.1f}" if unit == "ms" else f"{x:.2f}"


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    sh = meta["shapes"]
    where = (f"{meta['cpus']} CPU cores, 1 thread per rank" if meta.get("device", "cpu") == "cpu"
             else f"one {meta['device']} per rank")
    lines = [
        "# par3d vs torch.distributed peers",
        "",
        f"torch {meta['torch']}, {meta.get('backend', 'gloo')}, {where}; "
        f"GPT vocab={sh['vocab']} seq={sh['seq_len']} layers={sh['layers']} hidden={sh['hidden']} "
        f"heads={sh['heads']}; median of {meta['steps']} interleaved steps per side after "
        f"{meta['warmup']} warm-up steps.  ratio = ours / theirs (< 1: par3d faster).",
        "",
    ]
    repeat = meta.get("repeat", 1)
    if repeat > 1:
        lines[2] += (f"  {repeat} whole runs back to back: each row is the run with that row's median "
                     f"ratio; 'ratio in each run' gives every run's ratio and their range.")
    lines += ["| case | ours (ms) | theirs (ms) | ratio | CPU ratio | spread | same loss |"
              + (" ratio in each run [range] |" if repeat > 1 else "") + " note |",
              "|---|---:|---:|---:|---:|---:|:---:|" + ("---|" if repeat > 1 else "") + "---|"]
    for r in result["rows"]:
        note = (r.get("note") or "").replace("|", "\\|").replace("\n", " ")
        spread = f"{r['spread']:.0%}" if r.get("spread") is not None else "—"
        each = ""
        if repeat > 1:
            rng = r.get("ratio_range")
            each = (", ".join(_fmt(x, "x") for x in r.get("ratio_runs", []))
                    + (f" [{_fmt(rng[0], 'x')}–{_fmt(rng[1], 'x')}]" if rng else "") + " | ")
        lines.append(f"| {r['case']} | {_fmt(r['ours_s'])} | {_fmt(r['theirs_s'])} | "
                     f"{_fmt(r['ratio'], 'x')} | {_fmt(r.get('cpu_ratio'), 'x')} | {spread} | "
                     f"{'yes' if r['same_loss'] else 'no'} | {each}{note} |")
    lines += ["", "ratio: median wall time of a step (slowest rank), ours / theirs.  CPU ratio: the same "
              "for CPU seconds summed over ranks.  spread: the larger inter-quartile range of the two "
              "sides' step times, relative to the median — a ratio within 1 ± spread is not a difference.",
              f"Load average (1 min) before/after the run: {meta['load_average_1min']}."]
    peers: dict[str, list[str]] = {}
    for r in result["rows"]:
        fam = peers.setdefault(r["case"].split("_")[0], [])
        if r.get("peer") and r["peer"] not in fam:
            fam.append(r["peer"])
    if any(peers.values()):
        lines += ["", "theirs: " + "; ".join(f"{fam}: {' / '.join(p)}" for fam, p in peers.items() if p) + "."]
    return "\n".join(lines) + "\n"


# ---- the ranks ---------------------------------------------------------------------------------

def _device() -> torch.device:
    """This rank's device: its GPU where CUDA is available (the launcher pinned it), else the CPU."""
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _sync(device: torch.device) -> None:
    """Wait for this rank's queued kernels, so that a clock read afterwards measures their work."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Every rank runs every case of this world; rank 0's rows are the result."""
    import torch.distributed as dist

    n = dist.get_world_size()
    device = _device()
    fams = spec["families"]
    cases: list[tuple[str, Callable[[], list[dict[str, Any]]]]] = []
    if "tp" in fams:
        cases.append((f"tp_block_{n}", lambda: _case_tp(spec, device)))
    if "pp" in fams:
        for sched in SCHEDULES:
            cases.append((f"pp_{sched}_{n}", lambda s=sched: _case_pp(spec, s, device)))  # type: ignore[misc]
    if "dp" in fams:
        cases.append((f"dp_{n}", lambda: _case_dp(spec, device)))
    rows = []
    for name, fn in cases:
        t0 = time.perf_counter()
        for res in fn():
            ratio = round(res["ours_s"] / res["theirs_s"], 3) if res["theirs_s"] else None
            cpu_ratio = round(res["ours_cpu_s"] / res["theirs_cpu_s"], 3) if res["theirs_cpu_s"] else None
            ours = res.pop("ours")
            case = name if ours == "ours" else f"{name}_{ours.removeprefix('ours-')}"
            row = {"case": case, "ours": ours, "ours_s": res.pop("ours_s"), "theirs_s": res.pop("theirs_s"),
                   "ratio": ratio, "cpu_ratio": cpu_ratio, "ranks": n, **res}
            rows.append(row)
            if spec.get("verbose") and dist.get_rank() == 0:
                print(f"  {case}: ours {_fmt(row['ours_s'])} ms, theirs {_fmt(row['theirs_s'])} ms, "
                      f"ratio {_fmt(row['ratio'], 'x')}, same_loss={row['same_loss']} "
                      f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    return {"rows": rows, "backend": dist.get_backend(), "device": _device_name(device)}


def _device_name(device: torch.device) -> str:
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _agree(ok: bool, device: torch.device) -> bool:
    """True when every rank's `ok` is True (a peer that failed on one rank fails the row)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([0.0 if ok else 1.0], device=device)  # NCCL reduces device tensors only
    dist.all_reduce(t)
    return float(t) == 0.0


def _share(value: float | None, device: torch.device) -> float:
    """The one rank's value (others pass None) on every rank."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([value if value is not None else 0.0], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t)


def _first_error(err: str | None) -> str | None:
    """The error text of the lowest rank that failed, on every rank."""
    import torch.distributed as dist

    errs: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(errs, err)
    return next((e for e in errs if e), None)


def _time_sides(sides: list[Callable[[], Any]], steps: int, warmup: int,
                device: torch.device) -> list[dict[str, float]]:
    """Time the sides in rotating order (A B C, C B A, ...).  Per side: the median wall time of a
    step (the slowest rank's), the median CPU time of a step summed over ranks (what an
    oversubscribed machine really pays), and the relative inter-quartile spread of its wall times."""
    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        for f in sides:
            f()
    wall: list[list[float]] = [[] for _ in sides]
    cpu: list[list[float]] = [[] for _ in sides]
    for i in range(steps):
        order = list(range(len(sides))) if i % 2 == 0 else list(reversed(range(len(sides))))
        for k in order:
            _sync(device)
            dist.barrier()  # every rank starts the step together
            t0, c0 = time.perf_counter(), time.process_time()
            sides[k]()
            _sync(device)  # a GPU step ends when its kernels do, not when they are queued
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    w = torch.tensor(wall, dtype=torch.float64, device=device)
    dist.all_reduce(w, op=dist.ReduceOp.MAX)  # a step lasts as long as its slowest rank
    c = torch.tensor(cpu, dtype=torch.float64, device=device)
    dist.all_reduce(c)  # CPU time is paid by every rank
    out = []
    for row_w, row_c in zip(w.tolist(), c.tolist()):
        med = statistics.median(row_w)
        spread = 0.0
        if len(row_w) >= 4:
            q = statistics.quantiles(row_w, n=4)
            spread = (q[2] - q[0]) / med
        out.append({"wall_s": med, "cpu_s": statistics.median(row_c), "spread": spread})
    return out


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= LOSS_TOL * max(1.0, abs(a))


def _finish_rows(spec: dict[str, Any], ours: dict[str, Callable[[], float]],
                 theirs_step: Callable[[], float] | None, err: str | None, device: torch.device,
                 peer: str) -> list[dict[str, Any]]:
    """Compare the first step's losses, then time every side together; a failed peer is left out
    of the timing.  One row per entry of `ours` (label -> step), each against the same theirs."""
    losses_ours = {label: step() for label, step in ours.items()}
    loss_theirs: float | None = None
    if theirs_step is not None and err is None:
        try:
            loss_theirs = theirs_step()
        except Exception as e:  # a peer API that fails here is a result, not a crash
            err = f"{type(e).__name__}: {e}"
    err = _first_error(err)
    if err is not None:
        theirs_step = None
        loss_theirs = None
    sides = list(ours.values()) + ([theirs_step] if theirs_step is not None else [])
    timed = _time_sides(sides, spec["steps"], spec["warmup"], device)
    them = timed[len(ours)] if theirs_step is not None else None
    rows = []
    for k, label in enumerate(ours):
        mine = timed[k]
        row: dict[str, Any] = {
            "ours": label, "ours_s": round(mine["wall_s"], 6),
            "theirs_s": round(them["wall_s"], 6) if them else None,
            "ours_cpu_s": round(mine["cpu_s"], 6), "theirs_cpu_s": round(them["cpu_s"], 6) if them else None,
            "spread": round(max(mine["spread"], them["spread"] if them else 0.0), 6),
            "same_loss": loss_theirs is not None and _same(losses_ours[label], loss_theirs),
            "loss_ours": losses_ours[label], "loss_theirs": loss_theirs, "peer": peer}
        if err is not None:
            row["note"] = f"peer failed on {_device_name(device)}: {err.splitlines()[0][:300]}"
        rows.append(row)
    return rows


def _cfg(spec: dict[str, Any]) -> Any:
    from par3d.config import ModelConfig

    s = spec["shapes"]
    return ModelConfig(vocab=s["vocab"], seq_len=s["seq_len"], layers=s["layers"], hidden=s["hidden"],
                       heads=s["heads"])


def _solo_ctx() -> Any:
    """A TP group of one: par3d's layers are then plain layers holding the *full* weights."""
    from par3d.mesh import Group
    from par3d.model import ModelContext

    return ModelContext(tp=Group("solo", [0], 0, None), seed=0)


def _tokens(spec: dict[str, Any], batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The same synthetic batch on every rank: inputs and next-token targets."""
    import torch

    s = spec["shapes"]
    g = torch.Generator().manual_seed(1234)
    seq = torch.randint(0, s["vocab"], (batch, s["seq_len"] + 1), generator=g)
    return seq[:, :-1].contiguous().to(device), seq[:, 1:].contiguous().to(device)


def _zero_grads(params: list[nn.Parameter]) -> None:
    for p in params:
        p.grad = None


# ---- TP: one block ------------------------------------------------------------------------------

def _plain_block_cls() -> type:
    import torch.nn.functional as F
    from torch import nn

    class PlainBlock(nn.Module):
        """A textbook pre-LN block with one fused QKV projection, as ours has.  Its [3h, h] weight
        holds, for each TP rank in turn, the Q, K and V rows of that rank's heads, so that the
        contiguous column split of ColwiseParallel gives every rank whole heads' [Q | K | V]
        (with one rank it is the plain [Q | K | V] layout)."""

        def __init__(self, hidden: int, heads: int, ffn: int, bias: bool = True):
            super().__init__()
            self.head_dim = hidden // heads
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv = nn.Linear(hidden, 3 * hidden, bias=bias)
            self.o = nn.Linear(hidden, hidden, bias=bias)
            self.fc1, self.fc2 = nn.Linear(hidden, ffn, bias=bias), nn.Linear(ffn, hidden, bias=bias)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = self.ln1(x)
            b, s, _ = a.shape
            # -1 heads: after the column split each rank holds heads/N of them
            q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in self.qkv(a).chunk(3, dim=-1))
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(att.transpose(1, 2).reshape(b, s, -1))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    return PlainBlock


def _rank_grouped_qkv(w: torch.Tensor, h: int, n: int) -> torch.Tensor:
    """Rows [Q | K | V] (each h) reordered to [Q_0 K_0 V_0 | Q_1 K_1 V_1 | ...]: rank r's h/n rows of
    each (whole heads), so that a contiguous split into n gives rank r its own heads' Q, K, V."""
    import torch

    q, k, v = w[:h], w[h:2 * h], w[2 * h:]
    return torch.cat([t.chunk(n)[r] for r in range(n) for t in (q, k, v)])


def _case_tp(spec: dict[str, Any], device: torch.device) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist

    from par3d.mesh import Mesh, build_groups
    from par3d.model import Block, ModelContext

    cfg = _cfg(spec)
    n, rank = dist.get_world_size(), dist.get_rank()
    groups = build_groups(Mesh(1, 1, n), rank)
    ours = Block(cfg, ModelContext(tp=groups.tp, seed=0), 0).to(device)
    g = torch.Generator().manual_seed(99)
    x = torch.randn(spec["shapes"]["tp_batch"], cfg.seq_len, cfg.hidden, generator=g).to(device)

    def loss_of(y: torch.Tensor) -> torch.Tensor:
        return y.pow(2).mean()

    ours_params = list(ours.parameters())

    def ours_step() -> float:
        _zero_grads(ours_params)
        xi = x.clone().requires_grad_(True)  # a block inside a model also produces dL/dx
        loss = loss_of(ours(xi))
        loss.backward()
        return float(loss.detach())

    theirs_step: Callable[[], float] | None = None
    err: str | None = None
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        ref = Block(cfg, _solo_ctx(), 0)  # the full weights our shards were cut from
        h = cfg.hidden
        bias = ref.attn.qkv.bias is not None  # the model's linears have biases or not, all alike
        theirs = _plain_block_cls()(h, cfg.heads, cfg.ffn, bias)
        with torch.no_grad():
            for mine, other in ((theirs.ln1, ref.ln1), (theirs.ln2, ref.ln2)):
                mine.weight.copy_(other.weight)
                mine.bias.copy_(other.bias)
            theirs.qkv.weight.copy_(_rank_grouped_qkv(ref.attn.qkv.weight, h, n))
            if bias:
                theirs.qkv.bias.copy_(_rank_grouped_qkv(ref.attn.qkv.bias, h, n))
            for mine, other in ((theirs.o, ref.attn.proj), (theirs.fc1, ref.mlp.fc1), (theirs.fc2, ref.mlp.fc2)):
                mine.weight.copy_(other.weight)
                if bias:
                    mine.bias.copy_(other.bias)
        theirs = theirs.to(device)
        mesh = init_device_mesh(device.type, (n,))
        plan = {"qkv": ColwiseParallel(), "o": RowwiseParallel(), "fc1": ColwiseParallel(),
                "fc2": RowwiseParallel()}
        theirs = parallelize_module(theirs, mesh, plan)
        theirs_params = list(theirs.parameters())

        def theirs_step() -> float:
            _zero_grads(theirs_params)
            xi = x.clone().requires_grad_(True)
            loss = loss_of(theirs(xi))
            loss.backward()
            return float(loss.detach())
    except Exception as e:
        err = f"{type(e).__name__}: {e}"
    return _finish_rows(spec, {"ours": ours_step}, theirs_step, err, device,
                        "parallelize_module(fused qkv, fc1: ColwiseParallel; o, fc2: RowwiseParallel)")


# ---- PP: a whole GPT ----------------------------------------------------------------------------

def _peer_stage_cls() -> type:
    from torch import nn

    class PeerStage(nn.Module):
        """A par3d GPTStage (TP group of one: plain layers) as torch.distributed.pipelining wants a
        stage: activations in, activations (or logits) out; the loss lives in the schedule."""

        def __init__(self, stage: nn.Module):
            super().__init__()
            self.stage = stage

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            st = self.stage
            if st.embedding is not None:
                x = st.embedding(x)
            for block in st.blocks:
                x = block(x)
            return st.head.logits_local(x) if st.head is not None else x

    return PeerStage


def _case_pp(spec: dict[str, Any], schedule: str, device: torch.device) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from par3d.mesh import Mesh, build_groups
    from par3d.model import GPTStage
    from par3d.pipeline.partition import gpt_partition
    from par3d.pipeline.runtime import PipelineRuntime
    from par3d.pipeline.schedules import build, p2p_pairs

    cfg = _cfg(spec)
    p, rank = dist.get_world_size(), dist.get_rank()
    v = 2 if schedule == "interleaved" else 1
    m = 2 * p
    mb = spec["shapes"]["micro_batch"]
    # a two-rank group per (channel, pair) beyond p = 2, as train.py builds for the backend transport
    groups = build_groups(Mesh(1, p, 1), rank, p2p_pairs=p2p_pairs(build(schedule, p, m, v)))
    part = gpt_partition(cfg.layers, p * v, cfg.hidden, cfg.seq_len, cfg.vocab, cfg.ffn)
    ctx = _solo_ctx()  # no TP: the pipeline is what is compared
    stage_ids = [k * p + rank for k in range(v)]  # global stage k*p + r lives on rank r (both sides)
    chunks = [GPTStage(cfg, ctx, *part.bounds[s]).to(device) for s in stage_ids]
    actions = build(schedule, p, m, v)[rank]
    # shared memory carries CPU tensors only: on GPUs ours has the backend (NCCL) transport alone
    transports = ("shm", "backend") if device.type == "cpu" else ("backend",)
    runtimes = {t: PipelineRuntime(chunks, actions, groups, p, m, v, (mb, cfg.seq_len, cfg.hidden),
                                   torch.float32, device, p2p=t) for t in transports}
    x, y = _tokens(spec, m * mb, device)
    mbs = [(x[i * mb:(i + 1) * mb], y[i * mb:(i + 1) * mb]) for i in range(m)]
    loss_scale = 1.0 / (m * mb * cfg.seq_len)  # global mean over tokens, as train.py does
    is_last = rank == (p * v - 1) % p
    ours_params = [q for c in chunks for q in c.parameters()]

    def ours_step(runtime: PipelineRuntime) -> Callable[[], float]:
        def step() -> float:
            _zero_grads(ours_params)
            res = runtime.run_step(mbs, loss_scale, record=False)
            return _share(res.loss_sum if is_last else None, device)
        return step

    theirs_step: Callable[[], float] | None = None
    err: str | None = None
    try:
        from torch.distributed import pipelining as pl

        peer_cls = _peer_stage_cls()
        mods = []
        for s, mine in zip(stage_ids, chunks):
            copy = GPTStage(cfg, ctx, *part.bounds[s]).to(device)
            copy.load_state_dict(mine.state_dict())
            mods.append(peer_cls(copy))
        stages = [pl.PipelineStage(mod, s, p * v, device, group=groups.pp.pg)
                  for s, mod in zip(stage_ids, mods)]

        def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            # mean over a micro-batch's tokens; scale_grads divides by m -> the global mean
            return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten())

        if schedule == "gpipe":
            sched = pl.ScheduleGPipe(stages[0], m, loss_fn=loss_fn)
        elif schedule == "1f1b":
            sched = pl.Schedule1F1B(stages[0], m, loss_fn=loss_fn)
        else:
            sched = pl.ScheduleInterleaved1F1B(stages, m, loss_fn=loss_fn)
        theirs_params = [q for mod in mods for q in mod.parameters()]
        is_first = rank == 0

        def theirs_step() -> float:
            _zero_grads(theirs_params)
            losses: list[torch.Tensor] = []
            args = (x,) if is_first else ()
            kwargs: dict[str, Any] = {"target": y, "losses": losses} if is_last else {}
            sched.step(*args, return_outputs=False, **kwargs)
            return _share(float(torch.stack(losses).detach().mean()) if is_last else None, device)
    except Exception as e:
        err = f"{type(e).__name__}: {e}"
    peer = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B"}[schedule]
    return _finish_rows(spec, {f"ours-{t}": ours_step(rt) for t, rt in runtimes.items()}, theirs_step, err,
                        device, f"torch.distributed.pipelining {peer} over {dist.get_backend()}")


# ---- DP: a training step -----------------------------------------------------------------------

def _peer_adamw(param_groups: list[dict[str, Any]], **kw: Any) -> tuple[Any, str]:
    """torch's AdamW as its documentation recommends: the fused kernel where the device has one,
    else the multi-tensor (foreach) implementation; never the per-tensor loop."""
    import torch

    try:
        return torch.optim.AdamW(param_groups, fused=True, **kw), "fused=True"
    except (RuntimeError, ValueError):  # no fused kernel for these tensors' device
        return torch.optim.AdamW(param_groups, foreach=True, **kw), "foreach=True"


def _case_dp(spec: dict[str, Any], device: torch.device) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist

    from par3d.config import TrainConfig
    from par3d.data_parallel import DataParallel
    from par3d.mesh import Mesh, build_groups
    from par3d.model import GPTStage

    cfg = _cfg(spec)
    n, rank = dist.get_world_size(), dist.get_rank()
    groups = build_groups(Mesh(n, 1, 1), rank)
    mb = spec["shapes"]["micro_batch"] * 2
    x, y = _tokens(spec, n * mb, device)
    x, y = x[rank * mb:(rank + 1) * mb], y[rank * mb:(rank + 1) * mb]  # this rank's share
    # constant learning rate (min_lr = lr, no warm-up): the same update rule as torch's AdamW
    tc = TrainConfig(global_batch=n * mb, lr=1e-3, min_lr=1e-3, warmup=0, weight_decay=0.1, grad_clip=1.0,
                     beta1=0.9, beta2=0.95, eps=1e-8)
    ours = GPTStage(cfg, _solo_ctx()).to(device)
    theirs_model = GPTStage(cfg, _solo_ctx()).to(device)
    theirs_model.load_state_dict(ours.state_dict())  # before DataParallel hooks ours
    dpar = DataParallel([ours], groups, tc, zero_stage=0)
    loss_scale = 1.0 / (n * mb * cfg.seq_len)
    count = {"ours": 0}

    def ours_step() -> float:
        dpar.start_step()
        dpar.set_sync(0, True)
        loss = ours(x, y).sum() * loss_scale
        loss.backward()
        dpar.finish()
        dpar.step(count["ours"])
        count["ours"] += 1
        t = loss.detach().double().reshape(1)
        dist.all_reduce(t)  # sum of the shares = the global mean
        return float(t)

    theirs_step: Callable[[], float] | None = None
    err: str | None = None
    adamw = "?"
    try:
        from torch.nn.parallel import DistributedDataParallel as DDP

        # gradients live in DDP's buckets (no copy in or out): the documented memory/speed option
        ddp = DDP(theirs_model, device_ids=[device.index] if device.type == "cuda" else None,
                  gradient_as_bucket_view=True)
        decay = [q for q in theirs_model.parameters() if q.dim() >= 2]
        no_decay = [q for q in theirs_model.parameters() if q.dim() < 2]
        opt, adamw = _peer_adamw([{"params": decay, "weight_decay": tc.weight_decay},
                                  {"params": no_decay, "weight_decay": 0.0}],
                                 lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=tc.eps)

        def theirs_step() -> float:
            opt.zero_grad(set_to_none=True)
            loss = ddp(x, y).mean()  # DDP averages gradients over ranks -> the global mean
            loss.backward()
            torch.nn.utils.clip_grad_norm_(theirs_model.parameters(), tc.grad_clip)
            opt.step()
            t = loss.detach().double().reshape(1) / n
            dist.all_reduce(t)
            return float(t)
    except Exception as e:
        err = f"{type(e).__name__}: {e}"
    return _finish_rows(spec, {"ours": ours_step}, theirs_step, err, device,
                        f"DDP(gradient_as_bucket_view=True) + clip_grad_norm_ + AdamW({adamw})")
