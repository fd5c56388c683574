"""Probes of `par3d calibrate`: what one rank of this machine achieves, measured as a rank runs in
training (one intra-op thread on a CPU, as `par3d train` gives each rank; the rank's GPU where CUDA
is present).  Every clock is read after the device has finished (`torch.cuda.synchronize` on a GPU),
and every tensor lives on the rank's device (NCCL when CUDA).

1. Primitives (`measure_primitives`): a linear layer, causal scaled-dot-product attention, layer
   norm, GeLU, a residual add, the embedding lookup and par3d's vocabulary cross entropy, forward and
   backward with autograd, and ring attention's block and log-sum-exp merge as `context_parallel`
   runs them, over grids of sizes that span the range of models trained here — shapes
   of the primitives, never of a model that will be scored (`fits.fit_primitives`).
2. GEMMs (`measure_gemms`): plain `torch.mm` over transformer-like and square shapes (the asymptotic
   rate, the efficiency curve of the plot); memory bandwidth: a large copy.
3. The runtime's fixed costs (`measure_overheads`): `par3d.train.worker` on one rank with a GPT so
   small (h 16, s 8) that its arithmetic is negligible, 1 and 5 layers.
4. The reference GPT on several ranks (`probe_worker`): with DP over as many ranks as cores and
   twice as many (the contention of ranks computing side by side: shared caches and memory
   bandwidth, the backend's threads, time-sharing), and with TP (the cost of a collective inside a
   step); `fits` reads the terms off the planner's model.
5. Collectives (`collective_worker`), the pipeline transport and context parallelism's ring
   exchange, on a launched world.
6. A pipeline transfer inside a running step (`measure_synthetic`): the seed's §3.3 experiment,
   stages that wait instead of computing.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

KINDS = ("all_reduce", "all_gather", "reduce_scatter")

# the calibration's model references — what the held-out shapes of `bench fidelity` must differ from
REFERENCE = {"layers": 4, "hidden": 128, "heads": 4, "seq": 64, "micro_batch": 8, "m": 1}  # co-run, sync
TINY = {"hidden": 16, "heads": 2, "seq": 8, "micro_batch": 1, "m": 4, "vocab": 256}  # fixed costs; 1 and 5 layers
TINY_LAYERS = (1, 5)
# the in-step cost of a TP synchronisation point: TP over 2 ranks on a narrow GPT (~0.1 ms of
# compute between points), the reference (~1 ms) and a wide one (~4 ms), with one rank per core
# and, beside a second TP pair (DP 2), two: latency and skew per ranks-per-core
SYNC_SMALL = {"layers": 4, "hidden": 32, "heads": 2, "seq": 16, "micro_batch": 8, "m": 1}
SYNC_WIDE = {"layers": 2, "hidden": 192, "heads": 4, "seq": 96, "micro_batch": 8, "m": 1}
SYNC_SHAPES = (REFERENCE, SYNC_SMALL, SYNC_WIDE)


def device():
    """The rank's device: its GPU when CUDA is present (after `distributed.launch` set it)."""
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_call(fn: Callable[[], Any], min_s: float = 0.02, repeats: int = 3) -> float:
    """Least over `repeats` of the mean time of `fn` in a loop that lasts at least `min_s` (other
    processes on a shared machine only ever add time, so the least sample is the machine's).  The
    device is synchronised before every clock read."""
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t0, 1e-7)
    return min(loop_seconds(fn, max(1, int(min_s / one)), repeats))


def loop_seconds(fn: Callable[[], Any], n: int, repeats: int) -> list[float]:
    """`repeats` samples of the mean time of `fn` over `n` back-to-back calls, the device
    synchronised before each clock read (a GPU's launches are asynchronous)."""
    out = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        out.append((time.perf_counter() - t0) / n)
    return out


def _dtype(dt: str) -> Any:
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dt]


# ---- 1. primitives -------------------------------------------------------------------------------

def primitive_sizes(quick: bool) -> list[dict[str, Any]]:
    """The grid: sizes spanning T = 32..2048 tokens, h = 32..512, s = 16..512, vocab 128..2048,
    capped in FLOPs so that the calibration stays within minutes on one core."""
    tokens = (32, 256, 2048) if quick else (32, 128, 512, 2048)
    hidden = (32, 128, 512) if quick else (32, 64, 128, 256, 512)
    out: list[dict[str, Any]] = []
    for t in tokens:
        for h in hidden:
            for k, n in ((h, 3 * h), (h, h), (h, 4 * h), (4 * h, h)):
                if 2.0 * t * n * k <= 6e8:
                    out.append({"kind": "linear", "m": t, "n": n, "k": k})
    for bh in (4, 32) if quick else (4, 16, 64):
        for s in (16, 128, 512) if quick else (16, 64, 256, 512):
            for d in (8, 32) if quick else (8, 16, 32, 64):
                if bh * s * s * d <= 6.7e7:
                    out.append({"kind": "attention", "bh": bh, "s": s, "d": d})
    for rows in (32, 512, 8192) if quick else (32, 256, 2048, 8192):
        for h in (32, 512) if quick else (32, 128, 512):
            out.append({"kind": "layer_norm", "elements": rows * h, "rows": rows, "h": h})
            out.append({"kind": "embedding", "elements": rows * h, "rows": rows, "h": h})
    for n in (2**12, 2**16, 2**21) if quick else (2**12, 2**15, 2**18, 2**21):
        out.append({"kind": "gelu", "elements": n})
        out.append({"kind": "add", "elements": n})
    for rows in (32, 2048) if quick else (32, 256, 2048):
        for v in (128, 2048) if quick else (128, 512, 2048):
            out.append({"kind": "cross_entropy", "elements": rows * v, "rows": rows, "v": v})
    # ring attention's blocks (context_parallel.py): r query rows against c key rows, r = c, 2c, c/2
    for bh in (4, 32) if quick else (4, 16, 64):
        for c in (16, 128) if quick else (16, 64, 256):
            for r in (c, 2 * c, c // 2):
                for d in (8, 32) if quick else (8, 32, 64):
                    if bh * r * c * d <= 3.4e7:
                        out.append({"kind": "ring_block", "bh": bh, "r": r, "c": c, "d": d})
        for r in (16, 256) if quick else (16, 64, 256, 1024):
            for d in (8, 64) if quick else (8, 32, 64):
                out.append({"kind": "merge", "elements": bh * r * d, "rows": bh * r, "bh": bh, "r": r, "d": d})
    return out


def _ring_piece(p: dict[str, Any], dt: Any, dev: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(forward, backward) calls of one ring-attention piece, as `context_parallel` runs them: not
    autograd (the ring's backward is written out), so each is timed as it is."""
    import torch

    from par3d import context_parallel as cpm

    if p["kind"] == "merge":
        out, lse = torch.randn(p["bh"], p["r"], p["d"], dtype=dt, device=dev), torch.randn(p["bh"], p["r"], dtype=dt,
                                                                                           device=dev)
        o_b, lse_b = torch.randn_like(out), torch.randn_like(lse)
        return (lambda: cpm._merge(out, lse, o_b, lse_b)), (lambda: None)
    bh, r, c, d = p["bh"], p["r"], p["c"], p["d"]
    q, do = (torch.randn(1, bh, r, d, dtype=dt, device=dev) for _ in range(2))
    k, v = (torch.randn(1, bh, c, d, dtype=dt, device=dev) for _ in range(2))
    scale = 1.0 / d ** 0.5
    _, lse = cpm._block_forward(q, k, v, scale, None)
    d_row = torch.randn(1, bh, r, dtype=dt, device=dev)
    return (lambda: cpm._block_forward(q, k, v, scale, None)), \
        (lambda: cpm._block_backward(q, k, v, do, lse, d_row, scale, None))


def _primitive(p: dict[str, Any], dt: Any, dev: Any) -> tuple[Callable[[], Any], list[Any]]:
    """(a call building the forward graph, the leaves) for one grid point."""
    import torch
    import torch.nn.functional as F

    def leaf(*shape: int) -> Any:
        return torch.randn(*shape, dtype=dt, device=dev, requires_grad=True)

    kind = p["kind"]
    if kind == "linear":
        x, w, b = leaf(p["m"], p["k"]), leaf(p["n"], p["k"]), leaf(p["n"])
        return (lambda: F.linear(x, w, b)), [x, w, b]
    if kind == "attention":
        q, k, v = (leaf(1, p["bh"], p["s"], p["d"]) for _ in range(3))
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), [q, k, v]
    if kind == "layer_norm":
        x, w, b = leaf(p["rows"], p["h"]), leaf(p["h"]), leaf(p["h"])
        return (lambda: F.layer_norm(x, (p["h"],), w, b)), [x, w, b]
    if kind == "gelu":
        x = leaf(p["elements"])
        return (lambda: F.gelu(x)), [x]
    if kind == "add":
        x, y = leaf(p["elements"]), leaf(p["elements"])
        return (lambda: x + y), [x, y]
    if kind == "embedding":
        w = leaf(256, p["h"])
        idx = torch.randint(0, 256, (p["rows"],), device=dev)
        return (lambda: F.embedding(idx, w)), [w]
    if kind == "cross_entropy":
        from par3d.mesh import Group
        from par3d.tensor_parallel import vocab_parallel_cross_entropy

        logits = leaf(1, p["rows"], p["v"])
        target = torch.randint(0, p["v"], (1, p["rows"]), device=dev)
        one = Group("tp", [0], 0)
        return (lambda: vocab_parallel_cross_entropy(logits, target, one, 0, p["v"])), [logits]
    raise ValueError(kind)


def measure_primitives(dtype: str, quick: bool, tick: Callable[[], None]) -> list[dict[str, Any]]:
    """Forward and backward seconds of every grid point (backward: forward + backward − forward −
    the engine's per-call cost, the first entry; gradients accumulate into the leaves as over
    micro-batches)."""
    import torch

    dt, dev = _dtype(dtype), device()
    min_s = 0.006 if quick else 0.012
    # one backward() call costs the autograd engine's set-up whatever the graph; a block's backward
    # pays it once per action (the tiny probes measure that), not once per primitive: taken out
    x1 = torch.ones(1, dtype=dt, device=dev, requires_grad=True)
    g1 = torch.ones(1, dtype=dt, device=dev)
    engine = time_call(lambda: torch.autograd.backward(x1 * 1.0, g1), min_s=min_s) - \
        time_call(lambda: x1 * 1.0, min_s=min_s)
    out = [{"kind": "engine", "backward_s": engine, "forward_s": 0.0, "dtype": dtype}]
    for p in primitive_sizes(quick):
        if p["kind"] in ("ring_block", "merge"):
            fwd, bwd = _ring_piece(p, dt, dev)
            out.append({**p, "dtype": dtype, "forward_s": time_call(fwd, min_s=min_s),
                        "backward_s": time_call(bwd, min_s=min_s) if p["kind"] == "ring_block" else 0.0})
            tick()
            continue
        fn, _leaves = _primitive(p, dt, dev)
        y = fn()
        g = torch.ones_like(y)
        f = time_call(fn, min_s=min_s)
        fb = time_call(lambda fn=fn, g=g: torch.autograd.backward(fn(), g), min_s=min_s)
        out.append({**p, "dtype": dtype, "forward_s": f, "backward_s": max(fb - f - engine, 1e-7)})
        tick()
    return out


# ---- 2. GEMMs and memory bandwidth ---------------------------------------------------------------

def gemm_shapes(quick: bool, gpu: bool = False) -> list[tuple[int, int, int]]:
    """(M, N, K): tokens × out × in of transformer projections, plus squares for the asymptote.  On a GPU also
    GEMMs of depth 4,096 large enough to fill every SM for many waves: the planner's table model reaches a GPU's
    large-GEMM rate at K = 4,096 (compute.GEMM_K_REF; shallower GEMMs keep less by its depth curve), so the best
    of these is the burst rate `hardware.calibrated_gemm_share` takes (run once, on one H200: docs/measured.md §6)."""
    tokens = (64, 256, 1024) if quick else (32, 128, 512, 2048)
    hidden = (64, 128) if quick else (32, 128, 256)
    shapes = [(t, 4 * h, h) for t in tokens for h in hidden] + [(t, h, 4 * h) for t in tokens[-2:] for h in hidden]
    shapes += [(n, n, n) for n in ((256, 512) if quick else (128, 512, 1024))]
    if gpu:
        shapes += [(4096, 4096, 4096), (8192, 8192, 4096), (16384, 8192, 4096)]
    return shapes


def measure_gemms(dtypes: list[str], quick: bool, tick: Callable[[], None]) -> list[dict[str, Any]]:
    import torch

    dev = device()
    out = []
    for dt in dtypes:
        for m, n, k in gemm_shapes(quick, gpu=dev.type == "cuda"):
            a = torch.randn(m, k, dtype=_dtype(dt), device=dev)
            b = torch.randn(k, n, dtype=_dtype(dt), device=dev)
            s = time_call(lambda a=a, b=b: torch.mm(a, b), min_s=0.005 if quick else 0.01)
            out.append({"dtype": dt, "m": m, "n": n, "k": k, "flops": 2.0 * m * n * k, "seconds": s,
                        "gflops": 2.0 * m * n * k / s / 1e9})
            tick()
    return out


def sustained_windows(fn: Callable[[], Any], flops: float, seconds: float, window_s: float,
                      clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """FLOP/s of `fn` (`flops` per call) in back-to-back windows of about `window_s` over `seconds`: the steady
    rate a GEMM keeps once the clock has settled at the power limit (Bekman's "Maximum Sustainable Matmul
    FLOPS"; a burst, `time_call`, runs at boost clock).  The device is synchronised before every clock read."""
    out: list[float] = []
    sync()
    start = t0 = clock()
    calls = 0
    while True:
        fn()
        calls += 1
        if calls % 8:  # check the clock every few calls: a read synchronises the device
            continue
        sync()
        now = clock()
        if now - t0 >= window_s:
            out.append(calls * flops / (now - t0))
            t0, calls = now, 0
            if now - start >= seconds:
                return out


def steady_rate(windows: list[float]) -> float:
    """The sustained rate of a hold: the median of its second half's windows (the first half is the clock
    settling from boost to the power limit)."""
    tail = windows[len(windows) // 2:] or windows
    return statistics.median(tail)


def sustained_worker(dtype: str, shape: tuple[int, int, int], seconds: float, window_s: float) -> float:
    """One rank of `run.calibrate`'s sustained hold: its GPU runs one GEMM of `shape` (M, N, K) for `seconds`
    while every other GPU of the node runs its own -- the state of a training step, every GPU at its power limit
    at once ("Siblings: yes" in Bekman's table) -- and returns its steady FLOP/s.  Run once, as a world of one H200 (docs/measured.md §6)."""
    import torch

    dev = device()
    m, n, k = shape
    a = torch.randn(m, k, dtype=_dtype(dtype), device=dev)
    b = torch.randn(k, n, dtype=_dtype(dtype), device=dev)
    return steady_rate(sustained_windows(lambda: torch.mm(a, b), 2.0 * m * n * k, seconds, window_s))


def measure_mem_bw(quick: bool) -> float:
    import torch

    n = (8 if quick else 32) * 2**20 // 4  # far beyond a CPU's last-level cache
    if torch.cuda.is_available():  # a GPU's L2 holds tens of MB (an H200's 60): 8 MiB measured 2.8 of its
        # 4.3 TB/s there (one lease, docs/measured.md §6), so the buffer is 8 x the L2 and at least 256 MiB
        l2 = getattr(torch.cuda.get_device_properties(device()), "L2_cache_size", 0)
        n = max(n, 8 * l2 // 4, 256 * 2**20 // 4)
    a = torch.empty(n, device=device())
    b = torch.ones(n, device=device())
    s = time_call(lambda: a.copy_(b), min_s=0.05)
    return 2.0 * 4 * n / s  # read b + write a


def measure_attention_curve(quick: bool, lengths: tuple[int, ...] | None = None, tokens: int = 16384
                            ) -> list[dict[str, Any]]:
    """A GPU's causal attention as `model.Attention.core` calls it (`F.scaled_dot_product_attention`, whichever
    backend PyTorch picks), forward + backward, 16 heads of 128, bf16, at least 16K tokens per call: its share of
    the bf16 peak at each length, in the planner's count (3 x the causal forward's 2·b·heads·s²·d FLOPs over the
    time).  What `device.attn_curve` of a GPU file holds; no GPU has run this yet."""
    import torch
    import torch.nn.functional as F

    from par3d.plan.hardware import DEVICES, catalogue_gpu_of

    gpu = catalogue_gpu_of(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else None
    peak = DEVICES[gpu].peak("bf16") if gpu else None
    out = []
    for s in lengths or (1024, 2048, 4096, 8192, 16384):  # a few seconds in all: the same with --quick
        b, heads, d = max(1, tokens // s), 16, 128
        q, k, v = (torch.randn(b, heads, s, d, device=device(), dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        g = torch.randn(b, heads, s, d, device=device(), dtype=torch.bfloat16)

        def step(q: Any = q, k: Any = k, v: Any = v, g: Any = g) -> None:
            q.grad = k.grad = v.grad = None
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)
        t = time_call(step, min_s=0.05)
        flops = 3 * 2 * b * heads * s * s * d
        out.append({"tokens": s, "batch": b, "seconds": t, "tflops": flops / t / 1e12,
                    "share": flops / t / peak if peak else None})
        del q, k, v, g
    return out


def measure_eager_traffic(quick: bool, tokens: int | None = None, h: int = 4096) -> dict[str, Any]:
    """How fast `model.py`'s non-GEMM kernels move their bytes on this GPU: each piece the planner counts for an
    eager block (plan/eager.py `parts`: the two norms, the rotary embedding, GeLU and the gated unit, a residual
    add), forward and backward, on 16,384 (quick: 8,192) tokens x 4,096 in bf16, timed; bytes from the same
    counts the planner uses.  The whole set's bytes over its time is the file's achieved elementwise rate."""
    import torch
    import torch.nn.functional as F

    from par3d import model as M
    from par3d.plan.eager import parts

    dev, bf = device(), torch.bfloat16
    tokens = tokens or (8192 if quick else 16384)
    heads = h // 128
    per = parts(2)
    x = torch.randn(tokens, h, device=dev, dtype=bf, requires_grad=True)
    dy = torch.randn(tokens, h, device=dev, dtype=bf)
    rms, ln = M.RMSNorm(h, 1e-6, bf).to(dev), torch.nn.LayerNorm(h, dtype=bf).to(dev)
    xq = torch.randn(1, heads, tokens, h // heads, device=dev, dtype=bf, requires_grad=True)
    dq = torch.randn_like(xq)
    pos = torch.arange(tokens)
    u = torch.randn(tokens, h, device=dev, dtype=bf, requires_grad=True)

    def fb(fn: Callable[[], Any], grad: Any, *leaves: Any) -> Callable[[], None]:
        def run() -> None:
            for t in leaves:
                t.grad = None
            fn().backward(grad)
        return run
    cases = {"rmsnorm": (fb(lambda: rms(x), dy, x), h),
             "layernorm": (fb(lambda: ln(x), dy, x), h),
             "rotary": (fb(lambda: M.rotary(xq, 10000.0, pos), dq, xq), h),
             "gelu": (fb(lambda: F.gelu(x), dy, x), h),
             "swiglu": (fb(lambda: F.silu(x) * u, dy, x, u), h),
             "residual": (fb(lambda: x + u, dy, x, u), h)}
    out: dict[str, Any] = {"tokens": tokens, "width": h, "parts": {}}
    total_b = total_s = 0.0
    for name, (fn, width) in cases.items():
        t = time_call(fn, min_s=0.05)
        nbytes = sum(per[name]) * tokens * width
        out["parts"][name] = {"seconds": t, "bytes": nbytes, "gbps": nbytes / t / 1e9}
        total_b, total_s = total_b + nbytes, total_s + t
    out["gbps"] = total_b / total_s / 1e9
    return out


# ---- 3. the runtime's fixed costs ----------------------------------------------------------------

def probe_config(layers: int, hidden: int, heads: int, seq: int, micro_batch: int, m: int, steps: int,
                 vocab: int = 256, tp: int = 1, dp: int = 1) -> dict[str, Any]:
    from par3d.config import ModelConfig, ParallelConfig, RunConfig, TrainConfig

    cfg = RunConfig(model=ModelConfig(vocab=vocab, seq_len=seq, layers=layers, hidden=hidden, heads=heads),
                    parallel=ParallelConfig(microbatches=m, tp=tp, dp=dp),
                    train=TrainConfig(global_batch=micro_batch * m * dp, micro_batch=micro_batch, steps=steps,
                                      warmup=0),
                    progress=False)
    return cfg.validate().to_dict()


def reference_config(steps: int, tp: int = 1, dp: int = 1) -> dict[str, Any]:
    """The reference GPT; with dp > 1 every rank keeps the reference's micro-batch (weak scaling)."""
    return probe_config(steps=steps, tp=tp, dp=dp, **REFERENCE)


def sync_configs(steps: int, tp: int, dp: int) -> list[dict[str, Any]]:
    """The TP runs one ranks-per-core load of the point-sync fit measures (`fits.fit_point_sync`)."""
    return [probe_config(steps=steps, tp=tp, dp=dp, **shape) for shape in SYNC_SHAPES]


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


def overhead_passes(quick: bool) -> int:
    return 2 if quick else 3


def measure_overheads(quick: bool, tick: Callable[[], None]) -> dict[str, Any]:
    """Fixed costs per block, per action (apart from its blocks) and per step, as measured: the 5-
    minus the 1-layer probe's F and B over 4, the 1-layer's rest, and what a step takes beyond its
    actions.  (`fits.residual_overheads` then takes out what the primitives themselves predict.)

    This VM's speed drifts by tens of per cent over minutes, and a calibration taken in a slow
    minute skews every prediction after it; so the probes are taken in `overhead_passes` rounds,
    back to back, and every quantity is the median over the rounds."""
    steps = 5 if quick else 9
    shape = {k: v for k, v in TINY.items()}
    rounds: list[dict[str, Any]] = []
    for _ in range(overhead_passes(quick)):
        probes = {f"l{n}": run_probe(probe_config(layers=n, steps=steps, **shape)) for n in TINY_LAYERS}
        p1, p5 = probes["l1"], probes["l5"]
        span = TINY_LAYERS[1] - TINY_LAYERS[0]
        layer_f = max((p5["f_s"] - p1["f_s"]) / span, 0.0)
        layer_b = max((p5["b_s"] - p1["b_s"]) / span, 0.0)
        step_s = min(p["step_s"] - p["m"] * (p["f_s"] + p["b_s"]) for p in probes.values())
        ov = {"layer_f_s": layer_f, "layer_b_s": layer_b, "action_f_s": max(p1["f_s"] - layer_f, 0.0),
              "action_b_s": max(p1["b_s"] - layer_b, 0.0), "step_s": max(step_s, 0.0)}
        rounds.append({"overheads": ov, "probes": probes})
        tick()
    med = statistics.median
    ov = {k: med(r["overheads"][k] for r in rounds) for k in rounds[0]["overheads"]}
    return {"overheads": ov, "rounds": rounds, "tiny": TINY}


# ---- 3b. one rank running a whole model, and the machine's speed ------------------------------------

# the primitives inside a model's step vs timed one by one (`solo_slowdown`): the calibration GPTs of
# the sync-point fit, each on one rank
SOLO_SHAPES = SYNC_SHAPES
# the speed check: two calibration GPTs with DP over a world's ranks (every rank computing), a
# second or two of work in all, run again by `bench fidelity` at the start and the end of each world
# it launches — a VM's speed moves by tens of per cent over minutes, and a launch of several ranks
# on two vCPUs runs fast or ~1.4x slow as a whole (docs/measured.md §2).  Not the reference:
# `bench fidelity` scores that shape (in-sample)
SPEED_SHAPES = (SYNC_SMALL, SYNC_WIDE)
SPEED_STEPS = 6


def solo_passes(quick: bool) -> int:
    return 1 if quick else 3


def solo_configs() -> list[dict[str, Any]]:
    """The one-rank runs of `SOLO_SHAPES` (what `measure_solo` times and the solo slowdown is fitted on)."""
    return [probe_config(steps=SPEED_STEPS, **shape) for shape in SOLO_SHAPES]


def measure_solo() -> dict[str, Any]:
    """Each calibration GPT of `SOLO_SHAPES` on one rank, in this process (one thread): its median
    step time; and the one-rank speed check's total (`speed_check`'s statistic, from the same runs)."""
    times = [run_probe(cfg)["step_s"] for cfg in solo_configs()]
    speed = sum(t for shape, t in zip(SOLO_SHAPES, times, strict=True) if shape in SPEED_SHAPES)
    return {"step_s": times, "speed_s": speed}


def speed_configs(world: int) -> list[dict[str, Any]]:
    """The speed check's runs on a world of `world` ranks: each of `SPEED_SHAPES` with DP over them
    (each rank keeps the shape's micro-batch)."""
    return [probe_config(steps=SPEED_STEPS, dp=world, **shape) for shape in SPEED_SHAPES]


def speed_check(world: int = 1) -> float:
    """The speed check (seconds) on the current world of `world` ranks, or in this process when
    there is none: the sum of the median step times (first step skipped) of `speed_configs`.  On
    every rank of the world; rank 0's is the one read."""
    from par3d.train import worker

    total = 0.0
    for cfg in speed_configs(world):
        hist = worker(cfg, {"quiet": True})["history"]
        total += statistics.median(h["step_time_s"] for h in hist[1:] or hist)
    return total


# ---- 4. the reference on several ranks ------------------------------------------------------------

def multi_worker(cfgs: list[dict[str, Any]]) -> list[float]:
    """On every rank of a launched world: the median step time of each of `cfgs` (first step
    skipped), one after another (every run's `mesh.build_groups` makes the ranks meet first)."""
    return [probe_worker(cfg) for cfg in cfgs]


def probe_worker(cfg_dict: dict[str, Any]) -> float:
    """On every rank of a launched world: the median step time of `cfg_dict` (first step skipped)."""
    from par3d.train import worker

    hist = worker(cfg_dict, {"quiet": True})["history"]
    return statistics.median(h["step_time_s"] for h in hist[1:] or hist)


# ---- 5. collectives and the pipeline transport ---------------------------------------------------

def message_sizes(quick: bool) -> list[int]:
    """Bytes per message: 2^k from 256 B to 4 MiB (1 MiB when quick), multiples of 64 B·ranks."""
    hi = 20 if quick else 22
    return [2**k for k in range(8, hi + 1, 2 if quick else 1)]


def collective_worker(sizes: list[int], quick: bool, show_bar: bool) -> list[dict[str, Any]]:
    """Runs on every rank of a launched world; rank 0 returns the measurements.  Tensors live on
    the rank's device (NCCL needs them on the GPU); the device is synchronised before each clock
    read, so a GPU's asynchronous launches are not mistaken for finished transfers."""
    import torch
    import torch.distributed as dist

    from par3d import comm
    from par3d.mesh import Group

    rank, world = dist.get_rank(), dist.get_world_size()
    dev = device() if dist.get_backend() == "nccl" else torch.device("cpu")
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
        sync()
        n = max(2, min(200, int(2e6 / max(nbytes, 1))))  # small messages: more calls per sample
        return statistics.median(loop_seconds(fn, n, reps))

    for g in range(2, world + 1):
        ranks = list(range(g))
        pg = dist.new_group(ranks)  # every rank creates every group, in the same order
        if rank < g:
            grp = Group("calib", ranks, rank, pg)
            for kind in KINDS:
                for nbytes in sizes:
                    n = max(nbytes // 4, g) // g * g  # fp32 elements, divisible by the group
                    full = torch.ones(n, device=dev)
                    part = torch.ones(n // g, device=dev)
                    fn = {"all_reduce": lambda full=full, grp=grp: comm.all_reduce(full, grp),
                          "all_gather": lambda part=part, grp=grp: comm.all_gather(part, grp),
                          "reduce_scatter": lambda full=full, grp=grp: comm.reduce_scatter(full, grp)}[kind]
                    s = timed(fn, 4 * n)
                    out.append({"kind": kind, "group": g, "bytes": 4 * n, "seconds": s})
                    if bar is not None:
                        bar.update(1)
        dist.barrier()
    # send/recv between ranks 0 and 1: ping-pong, half a round trip per message, through the
    # transport the pipeline runtime will use here (shared memory between CPU ranks on one host,
    # the backend — NCCL — between GPUs)
    from par3d.pipeline import shm

    pair = dist.new_group([0, 1])
    use_shm = shm.agree(Group("pp", [0, 1], rank, pair), dev, "auto") if rank < 2 else None
    for nbytes in sizes:
        t = torch.ones(nbytes // 4, device=dev)
        if rank < 2:
            other = 1 - rank
            if use_shm is not None:
                link = shm.ShmTransport(Group("pp", [0, 1], rank, pair), rank, 2, 1, 1, tuple(t.shape),
                                        t.dtype, use_shm, 60.0, {"act", "grad"}, {"act", "grad"})

                def pp(t: Any = t, link: Any = link) -> None:
                    # rank 0 sends "act" (to stage 1) and takes "grad" back; rank 1 the mirror
                    if rank == 0:
                        link.send(t, "act", 1, 0)
                        link.recv("grad", 0, 0)
                    else:
                        link.recv("act", 1, 0)
                        link.send(t, "grad", 0, 0)
            else:
                def pp(t: Any = t, other: int = other) -> None:
                    if rank == 0:
                        dist.send(t, other, group=pair)
                        dist.recv(t, other, group=pair)
                    else:
                        dist.recv(t, other, group=pair)
                        dist.send(t, other, group=pair)
            seconds = timed(pp, nbytes) / 2
            if rank == 0:
                out.append({"kind": "p2p", "group": 2, "bytes": nbytes, "seconds": seconds,
                            "transport": "shm" if use_shm is not None else "backend"})
        if bar is not None:
            bar.update(1)
        dist.barrier()
    # the ring exchange of context parallelism (`comm.exchange`: one batched isend to the next
    # rank and irecv from the previous, through the backend, as `context_parallel` posts it), on
    # ranks 0 and 1: the time until both of a rank's transfers have completed
    if rank < 2:
        grp2 = Group("cp", [0, 1], rank, pair)
        other = 1 - rank
        for nbytes in sizes:
            snd, rcv = torch.ones(nbytes // 4, device=dev), torch.empty(nbytes // 4, device=dev)

            def ring(snd: Any = snd, rcv: Any = rcv) -> None:
                for w in comm.exchange(snd, other, rcv, other, grp2, 7003):
                    w.wait()

            seconds = timed(ring, nbytes)
            if rank == 0:
                out.append({"kind": "exchange", "group": 2, "bytes": nbytes, "seconds": seconds})
    dist.barrier()
    if bar is not None:
        bar.close()
    return out if rank == 0 else []


# ---- 6. the seed's §3.3 experiment ----------------------------------------------------------------

def measure_synthetic(schedule: str, p: int, m: int, tf: float, tb: float, steps: int) -> dict[str, Any]:
    """`p` pipeline stages that wait `tf` / `tb` ms instead of computing, activations and gradients
    still travelling between processes: the measured makespan (first action start to last action
    end, median over steps after the first) and bubble, beside (m+p-1)(tf+tb) and the simulator's."""
    from par3d.config import RunConfig
    from par3d.pipeline.schedules import build
    from par3d.pipeline.simulate import Event, simulate, timeline_from_events
    from par3d.train import run as train_run

    cfg = RunConfig()
    cfg.model.layers, cfg.model.hidden, cfg.model.heads, cfg.model.seq_len = p, 8, 2, 8
    cfg.parallel.pp, cfg.parallel.schedule, cfg.parallel.microbatches = p, schedule, m
    cfg.train.global_batch, cfg.train.micro_batch, cfg.train.steps = m, 1, steps
    cfg.synthetic_stage_ms = (tf, tb)
    cfg.progress = False
    results = train_run(cfg, {"all_events": True})
    r0 = next(r for r in results if r["rank"] == 0)
    spans, bubbles = [], []
    for step in range(1, steps):
        events = [Event.from_dict(e) for w in r0["world"] for e in w["events_by_step"][step]]
        tl = timeline_from_events(events, p, m)
        spans.append(tl.makespan)
        bubbles.append(tl.bubble_wall)
    sim = simulate(build(schedule, p, m), p, m, tf=tf / 1e3, tb=tb / 1e3)
    formula = (m + p - 1) * (tf + tb) / 1e3
    makespan = statistics.median(spans)
    bubble = statistics.median(bubbles)
    return {"schedule": schedule, "p": p, "m": m, "tf_ms": tf, "tb_ms": tb,
            "measured_makespan_s": makespan, "formula_makespan_s": formula,
            "makespan_excess": makespan / formula - 1,
            "measured_bubble_wall": bubble, "simulated_bubble_wall": sim.bubble_wall,
            "bubble_gap_pp": 100 * (bubble - sim.bubble_wall),
            "median_step_time_s": statistics.median(h["step_time_s"] for h in r0["history"][1:])}


__all__ = ["KINDS", "REFERENCE", "SOLO_SHAPES", "SPEED_SHAPES", "SPEED_STEPS", "SYNC_SHAPES", "SYNC_SMALL", "SYNC_WIDE", "TINY", "collective_worker", "device",
           "measure_gemms", "measure_mem_bw", "measure_overheads", "measure_primitives", "measure_synthetic",
           "message_sizes", "primitive_sizes", "multi_worker", "probe_config", "probe_worker", "reference_config", "run_probe", "measure_solo", "solo_configs", "solo_passes", "speed_check", "speed_configs", "sync_configs",
           "sync", "time_call"]
