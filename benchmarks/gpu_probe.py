"""One GPU's kernels measured as the planner prices them: GEMMs by shape (bf16, fp8), fused attention by
sequence length (PyTorch's FlashAttention-2 and cuDNN backends), HBM-bound elementwise work, and the burst
and one-GPU sustained rate of the best GEMM.  Written for the one H200 this project was lent (issue 12); it
runs anywhere CUDA is (on a CPU it only proves it runs: `--smoke`).

The shapes are the planner's evidence sets, so each measurement scores a number the planner already holds
from a published source (`par3d.plan.gemm_shapes`: OpenXLA's H100 table and its newest revision's (n, k)
group; `hardware.FA_HOPPER` / `FA2_HOPPER`; `hardware.MEM_EFF`) -- nothing here is fitted.

Timing: CUDA events around `n` back-to-back calls after warm-up, the median of `repeats` such means; the
device is synchronised before every read.  FP8 GEMMs run through `torch._scaled_mm` (per-tensor scales, the
default split accumulator) on (b·m) x k rows, since it takes 2-D operands only.

    python benchmarks/gpu_probe.py --out benchmarks/results/gpu-probe-h200.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from par3d.plan.gemm_shapes import LATER, SETS  # noqa: E402


def timed(fn: Any, n: int, repeats: int, warmup: int = 3) -> float:
    """Median over `repeats` of the mean seconds of `n` back-to-back calls of `fn`."""
    for _ in range(warmup):
        fn()
    cuda = torch.cuda.is_available()
    out = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(n):
                fn()
            end.record()
            torch.cuda.synchronize()
            out.append(start.elapsed_time(end) / 1e3 / n)
        else:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            out.append((time.perf_counter() - t0) / n)
    return statistics.median(out)


def timed_graph(fn: Any, n: int, repeats: int) -> float:
    """As `timed`, but the `n` calls are captured once in a CUDA graph and replayed, so the host's launch rate
    (about 20 µs a call through PyTorch, the floor the first lease's small GEMMs met) does not count."""
    if not torch.cuda.is_available():
        return timed(fn, n, repeats)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture: cuBLAS picks its kernel and workspace here
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            fn()
    graph.replay()
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) / 1e3 / n)
    del graph
    return statistics.median(out)


def gemm_shapes(smoke: bool) -> list[tuple[str, int, int, int, int]]:
    """(set, b, m, n, k): OpenXLA's H100 fit set and the newest revision's H100 (n, k) group."""
    if smoke:
        return [("smoke", 1, 64, 64, 64), ("smoke", 2, 64, 32, 64)]
    b, m, pts = LATER["h100-sxm"]
    return ([("xla-h100", *p[:4]) for p in SETS["h100-sxm"]]
            + [("xla-later", b, m, n, k) for n, k, _, _ in pts])


def probe_gemms(dev: torch.device, smoke: bool) -> list[dict[str, Any]]:
    rows = []
    fp8 = dev.type == "cuda" and hasattr(torch, "float8_e4m3fn")
    for tag, b, m, n, k in gemm_shapes(smoke):
        dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
        x, w = torch.randn(b, m, k, device=dev, dtype=dt), torch.randn(b, k, n, device=dev, dtype=dt)
        s = timed(partial(torch.bmm, x, w), n=3 if smoke else 20, repeats=3 if smoke else 5)
        row = {"set": tag, "b": b, "m": m, "n": n, "k": k, "bf16_s": s, "bf16_tflops": 2 * b * m * n * k / s / 1e12}
        if fp8 and tag == "xla-later":
            a8 = torch.randn(b * m, k, device=dev).to(torch.float8_e4m3fn)
            w8 = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm needs
            one = torch.ones((), device=dev)
            s8 = timed(partial(torch._scaled_mm, a8, w8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                       n=20, repeats=5)
            row.update(fp8_s=s8, fp8_tflops=2 * b * m * n * k / s8 / 1e12)
        rows.append(row)
    return rows


def probe_gemms_graphed(dev: torch.device, smoke: bool) -> list[dict[str, Any]]:
    """The same shapes as `probe_gemms`, bf16 and fp8 on every one, each timed inside a CUDA graph (`timed_graph`):
    the second lease's answer to the first's launch floor (docs/measured.md §6)."""
    rows = []
    fp8 = dev.type == "cuda" and hasattr(torch, "float8_e4m3fn")
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    for tag, b, m, n, k in gemm_shapes(smoke):
        flops = 2 * b * m * n * k
        calls = 3 if smoke else max(5, min(100, int(5e12 / flops)))
        x, w = torch.randn(b, m, k, device=dev, dtype=dt), torch.randn(b, k, n, device=dev, dtype=dt)
        s = timed_graph(partial(torch.bmm, x, w), calls, 3 if smoke else 5)
        row = {"set": tag, "b": b, "m": m, "n": n, "k": k, "calls": calls, "bf16_s": s, "bf16_tflops": flops / s / 1e12}
        if fp8:
            a8 = torch.randn(b * m, k, device=dev).to(torch.float8_e4m3fn)
            w8 = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm needs
            one = torch.ones((), device=dev)
            s8 = timed_graph(partial(torch._scaled_mm, a8, w8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                             calls, 5)
            row.update(fp8_s=s8, fp8_tflops=flops / s8 / 1e12)
        del x, w
        rows.append(row)
    return rows


# Expert GEMMs of published mixture-of-experts runs, one rank's share under balanced routing (compute.layer_gemms:
# G experts on the rank, M tokens each = micro-batch x sequence x top-k x ep / experts): (name, G, M, hidden, ffn,
# gated).  Each layer's fc1 (h -> ffn, x2 when gated) and fc2 (ffn -> h), forward, input gradient and weight
# gradient, as one grouped GEMM each (torch._grouped_mm: one kernel over the G experts).
EXPERTS: tuple[tuple[str, int, int, int, int, bool], ...] = (
    ("mixtral-8x7b ep8", 1, 8192, 4096, 14336, True),
    ("mixtral-8x22b ep8", 1, 8192, 6144, 16384, True),
    ("deepseek-v3 ep64", 4, 8192, 7168, 2048, True),
    ("deepseek-v3 ep32", 8, 4096, 7168, 2048, True),
    ("qwen3-235b-a22b ep8", 16, 2048, 4096, 1536, True),
    ("qwen3-30b-a3b ep8", 16, 2048, 2048, 768, True),
    ("gpt-oss-120b ep8", 16, 1024, 2880, 2880, True),
    ("llama4-maverick ep64", 2, 4096, 5120, 8192, True),
)


def probe_grouped(dev: torch.device, smoke: bool) -> list[dict[str, Any]]:
    """Grouped expert GEMMs by pass: forward (tokens x h @ h x f per expert), input gradient (tokens x f @ f x h)
    and weight gradient (h x tokens @ tokens x f, the tokens as depth); seconds and TFLOP/s of each, so the
    backward's ratio to the forward (the planner prices it at 2) is read off directly."""
    rows = []
    if not hasattr(torch, "_grouped_mm"):
        return [{"error": "torch._grouped_mm missing"}]
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    cases = EXPERTS if not smoke else (("smoke", 2, 32, 64, 32, True),)
    for name, g, m, h, f, gated in cases:
        for layer, k_in, n_out in (("fc1", h, f * (2 if gated else 1)), ("fc2", f, h)):
            offs = torch.arange(1, g + 1, device=dev, dtype=torch.int32) * m
            x = torch.randn(g * m, k_in, device=dev, dtype=dt)
            w = torch.randn(g, n_out, k_in, device=dev, dtype=dt).transpose(-2, -1)  # (g, k, n), column-major
            dy = torch.randn(g * m, n_out, device=dev, dtype=dt)
            wt = w.transpose(-2, -1)  # (g, n, k): the input gradient's B
            xt = x.t()  # (k, g·m): the weight gradient's A, the tokens as depth
            flops = 2 * g * m * k_in * n_out
            row: dict[str, Any] = {"case": name, "layer": layer, "experts": g, "tokens": m, "k": k_in, "n": n_out}
            for part, a, b in (("fwd", x, w), ("dgrad", dy, wt), ("wgrad", xt, dy)):
                # the layouts a training step has first; where this build refuses one, the operands made
                # contiguous (the copy is not timed), and the row says which ran
                for layout, (aa, bb) in (("native", (a, b)), ("contiguous", (a.contiguous(), b.contiguous()))):
                    try:
                        s = timed_graph(partial(torch._grouped_mm, aa, bb, offs=offs), 3 if smoke else 10,
                                        3 if smoke else 5)
                        row[f"{part}_s"], row[f"{part}_tflops"], row[f"{part}_layout"] = s, flops / s / 1e12, layout
                        break
                    except Exception as e:  # say so, measure the rest
                        row[f"{part}_error_{layout}"] = f"{type(e).__name__}: {str(e)[:200]}"
            if "fwd_s" in row and "dgrad_s" in row and "wgrad_s" in row:
                row["bwd_over_fwd"] = (row["dgrad_s"] + row["wgrad_s"]) / row["fwd_s"]
            # the same work as a batched GEMM of equal M per expert (what the planner's table model prices)
            xb = x.view(g, m, k_in)
            wb = torch.randn(g, k_in, n_out, device=dev, dtype=dt)
            s = timed_graph(partial(torch.bmm, xb, wb), 3 if smoke else 10, 3 if smoke else 5)
            row["bmm_fwd_s"], row["bmm_fwd_tflops"] = s, flops / s / 1e12
            rows.append(row)
            del x, w, dy, wb
    return rows


def probe_nccl_pair(smoke: bool) -> dict[str, Any]:
    """Can two NCCL ranks share this one GPU (NCCL has refused a duplicate device)?  Two processes, an
    all-reduce and a send/recv; the answer or the error, nothing else."""
    code = (
        "import os, torch, torch.distributed as dist\n"
        "dist.init_process_group('nccl', device_id=torch.device('cuda', 0))\n"
        "r = dist.get_rank(); t = torch.full((4,), float(r + 1), device='cuda')\n"
        "dist.all_reduce(t); torch.cuda.synchronize()\n"
        "x = torch.zeros(4, device='cuda')\n"
        "(dist.send(t, 1) if r == 0 else dist.recv(x, 0)); torch.cuda.synchronize()\n"
        "print('rank', r, 'all_reduce', t.tolist(), 'recv', x.tolist(), flush=True)\n"
        "dist.destroy_process_group()\n")
    if smoke or not torch.cuda.is_available():
        return {"skipped": "no CUDA"}
    import socket
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    try:
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                            "--master-addr", "127.0.0.1", "--master-port", str(port), "--no-python",
                            sys.executable, "-c", code],
                           capture_output=True, text=True, timeout=90)
        return {"rc": p.returncode, "stdout": p.stdout[-1500:], "stderr": p.stderr[-2500:]}
    except subprocess.TimeoutExpired as e:
        return {"rc": None, "error": f"timed out: {str(e)[:300]}"}


def probe_peak(dev: torch.device, smoke: bool, hold_s: float) -> dict[str, Any]:
    """The best of a few large bf16/fp8 GEMMs as a burst (MAMF-like), then the best bf16 one held for `hold_s`."""
    sizes = [(256, 256, 256)] if smoke else [(8192, 8192, 8192), (16384, 8192, 8192), (8192, 16384, 4096),
                                              (16384, 16384, 8192), (4096, 8192, 16384)]
    out: dict[str, Any] = {"bf16": [], "fp8": []}
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    for m, n, k in sizes:
        a, b = torch.randn(m, k, device=dev, dtype=dt), torch.randn(k, n, device=dev, dtype=dt)
        s = timed(partial(torch.matmul, a, b), n=3 if smoke else 20, repeats=3 if smoke else 5)
        out["bf16"].append({"m": m, "n": n, "k": k, "tflops": 2 * m * n * k / s / 1e12})
        if dev.type == "cuda":
            a8 = a.to(torch.float8_e4m3fn)
            b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()
            one = torch.ones((), device=dev)
            s8 = timed(partial(torch._scaled_mm, a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                       n=20, repeats=5)
            out["fp8"].append({"m": m, "n": n, "k": k, "tflops": 2 * m * n * k / s8 / 1e12})
    if hold_s > 0 and dev.type == "cuda":
        best = max(out["bf16"], key=lambda r: r["tflops"])
        m, n, k = best["m"], best["n"], best["k"]
        a, b = torch.randn(m, k, device=dev, dtype=dt), torch.randn(k, n, device=dev, dtype=dt)
        t_end, windows = time.time() + hold_s, []
        while time.time() < t_end:
            s = timed(partial(torch.matmul, a, b), n=50, repeats=1, warmup=0)
            windows.append(2 * m * n * k / s / 1e12)
        out["held"] = {"m": m, "n": n, "k": k, "seconds": hold_s, "first": windows[0], "last": windows[-1],
                       "median_last_half": statistics.median(windows[len(windows) // 2:]), "windows": len(windows),
                       "smi_after": smi("clocks.sm,power.draw,temperature.gpu")}
    return out


def probe_attention(dev: torch.device, smoke: bool) -> list[dict[str, Any]]:
    """Causal self-attention forward and forward+backward, head dim 128, h heads, batch 1, per backend; TFLOP/s
    in the planner's count: 3 x the causal forward's 2·2·s²·d·h/2 FLOPs over the fwd+bwd time."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    if smoke:
        lengths, heads, backends = [64], 2, [("math", SDPBackend.MATH)]
    else:
        lengths, heads = [1024, 2048, 4096, 8192, 16384, 32768], 32
        backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    for s in lengths:
        b = max(1, 16384 // s) if not smoke else 1  # at least 16K tokens per call, as the B200 curve's file
        q, k, v = (torch.randn(b, heads, s, 128, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
        g = torch.randn(b, heads, s, 128, device=dev, dtype=dt)
        fwd_flops = 4 * b * heads * s * s * 128 / 2
        for name, be in backends:
            try:
                with sdpa_kernel([be]):
                    def fwd(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v) -> torch.Tensor:
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

                    def fwd_bwd(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v,
                                g: torch.Tensor = g) -> None:
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        q.grad = k.grad = v.grad = None
                        o.backward(g)
                    n = 2 if smoke else max(3, int(2e9 / (s * s * b)))
                    tf, tfb = timed(fwd, n, 3), timed(fwd_bwd, n, 3)
                rows.append({"backend": name, "seq": s, "batch": b, "heads": heads, "fwd_s": tf, "fwd_bwd_s": tfb,
                             "fwd_tflops": fwd_flops / tf / 1e12, "tflops": 3 * fwd_flops / tfb / 1e12})
            except Exception as e:  # a backend this build or GPU lacks: say so, measure the rest
                rows.append({"backend": name, "seq": s, "error": f"{type(e).__name__}: {str(e)[:200]}"})
    return rows


def probe_elementwise(dev: torch.device, smoke: bool) -> list[dict[str, Any]]:
    """HBM-bound kernels: a copy, LayerNorm and GeLU forward and backward on a (rows x 8,192) bf16 tensor; GB/s
    counts each kernel's minimum traffic (read every input once, write every output once)."""
    import torch.nn.functional as F

    rows_n, cols = (64, 64) if smoke else (32768, 8192)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    e = rows_n * cols * (2 if dt == torch.bfloat16 else 4)
    x = torch.randn(rows_n, cols, device=dev, dtype=dt, requires_grad=True)
    y = torch.empty_like(x)
    gy = torch.randn_like(x)
    w = torch.ones(cols, device=dev, dtype=dt, requires_grad=True)
    bias = torch.zeros(cols, device=dev, dtype=dt, requires_grad=True)
    out = []

    def add(name: str, fn: Any, nbytes: float) -> None:
        s = timed(fn, 3 if smoke else 20, 3 if smoke else 5)
        out.append({"kernel": name, "seconds": s, "bytes": nbytes, "gbps": nbytes / s / 1e9})
    add("copy", lambda: y.copy_(x), 2 * e)
    add("layernorm_fwd", lambda: F.layer_norm(x, (cols,), w, bias), 2 * e)
    add("gelu_fwd", lambda: F.gelu(x, approximate="tanh"), 2 * e)

    def ln_fb() -> None:
        x.grad = w.grad = bias.grad = None
        F.layer_norm(x, (cols,), w, bias).backward(gy)

    def gelu_fb() -> None:
        x.grad = None
        F.gelu(x, approximate="tanh").backward(gy)
    add("layernorm_fwd_bwd", ln_fb, 2 * e + 3 * e)  # fwd: x in, y out; bwd: x, dy in, dx out
    add("gelu_fwd_bwd", gelu_fb, 2 * e + 3 * e)
    return out


def probe_calibration(smoke: bool, hold_s: float) -> dict[str, Any]:
    """The GPU branch of `par3d calibrate` on this one GPU (its collectives need two ranks): the GEMM probes and
    fit, the HBM copy, the one-GPU sustained hold, and the `device.gemm` share and attention fields it writes."""
    from par3d.calibrate import fits, probes
    from par3d.calibrate.run import sustained_gemms
    from par3d.plan import gemm_table
    from par3d.plan.hardware import (
        DEVICES,
        TFLOPS,
        calibrated_attention,
        calibrated_gemm_share,
        catalogue_gpu_of,
    )

    gemms = probes.measure_gemms(["fp32", "bf16"], True, lambda: None)
    out: dict[str, Any] = {"gemm_fit": fits.fit_gemm(gemms), "mem_bw_gbps": probes.measure_mem_bw(True) / 1e9}
    if torch.cuda.is_available():
        gpu = catalogue_gpu_of(torch.cuda.get_device_name(0))
        family = "" if gpu is None else gemm_table.family_of(gpu)
        held = sustained_gemms(gemms, ["bf16"], hold_s) if hold_s > 0 else {}
        peak = DEVICES[gpu].peak_flops["bf16"] / TFLOPS if gpu else 0.0
        pts = [(p["flops"], p["gflops"] / 1e3) for p in gemms if p["dtype"] == "bf16"]
        out.update(catalogue_gpu=gpu, held=held, peak_bf16=peak,
                   gemm_share_burst=calibrated_gemm_share(pts, peak, family, "bf16") if gpu else None,
                   gemm_share_held=(calibrated_gemm_share(pts, peak, family, "bf16", held["bf16"]["tflops"])
                                    if gpu and "bf16" in held else None),
                   catalogue_share=DEVICES[gpu].gemm.get("bf16") if gpu else None,
                   attention=calibrated_attention(gpu))
    out["gemms"] = gemms
    return out


def smi(fields: str) -> str:
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Measure one GPU's GEMMs, attention and HBM-bound kernels on the "
                                             "planner's shapes; write JSON.")
    ap.add_argument("--out", required=True, help="JSON file to write (rewritten after each part)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes: prove the script runs (CPU or GPU)")
    ap.add_argument("--hold-s", type=float, default=20.0, help="seconds to hold the best bf16 GEMM (0: skip)")
    ap.add_argument("--parts", default="info,gemm,peak,attention,elementwise,calib", help="comma-separated parts to run")
    args = ap.parse_args(argv)
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    res: dict[str, Any] = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else platform.processor(),
                           "torch": torch.__version__, "cuda": torch.version.cuda,
                           "cudnn": torch.backends.cudnn.version() if dev.type == "cuda" else None,
                           "date": time.strftime("%Y-%m-%d"), "smoke": args.smoke}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    parts = {"info": lambda: smi("name,driver_version,clocks.max.sm,clocks.max.mem,power.limit,memory.total"),
             "gemm": lambda: probe_gemms(dev, args.smoke),
             "peak": lambda: probe_peak(dev, args.smoke, 0 if args.smoke else args.hold_s),
             "attention": lambda: probe_attention(dev, args.smoke),
             "elementwise": lambda: probe_elementwise(dev, args.smoke),
             "calib": lambda: probe_calibration(args.smoke, 0 if args.smoke else 10.0),
             "gemm_graph": lambda: probe_gemms_graphed(dev, args.smoke),
             "grouped": lambda: probe_grouped(dev, args.smoke),
             "nccl_pair": lambda: probe_nccl_pair(args.smoke)}
    for name in args.parts.split(","):
        t0 = time.time()
        try:
            res[name] = parts[name]()
        except Exception as e:  # keep what the other parts measured
            res[name] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
        res.setdefault("seconds", {})[name] = round(time.time() - t0, 1)
        out.write_text(json.dumps(res, indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v)
                                  else str(v)))
        print(f"{name}: {res['seconds'][name]} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
