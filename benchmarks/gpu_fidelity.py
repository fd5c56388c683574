"""The planner against par3d's own training runtime on one GPU: `par3d plan`'s step time for a set of single-GPU
runs, written down *before* they were measured, then `par3d train`'s measured median step time of each (issue 12:
the planner's compute model on a real GPU, with nothing between the GPUs to hide behind).

Three steps, each its own command, so the predictions exist (and are committed) before any measurement:

    python benchmarks/gpu_fidelity.py predict --out benchmarks/results/gpu-fidelity-h200.json   # CPU, here
    python benchmarks/gpu_fidelity.py measure --out RESULTS.json                                 # on the GPU
    python benchmarks/gpu_fidelity.py score benchmarks/results/gpu-fidelity-h200.json RESULTS.json

The second set (`HELD_OUT`) in one command on the GPU, priced from the file that GPU's own calibration writes first:

    python benchmarks/gpu_fidelity.py lease --out-dir $OUT

The runtime is plain PyTorch, eager: bf16 weights and activations with fp32 master weights, gradients and Adam
state; attention through `F.scaled_dot_product_attention` (PyTorch's FlashAttention-2 backend on Hopper, hence
`--attention-kernel fa2`); the loss through `F.cross_entropy` (`--cross-entropy unfused`); no dropout.  The plan
gets those facts as flags; nothing of it is fitted to the measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# (name, arch, layers, hidden, heads, kv_heads, ffn, seq, micro_batch, global_batch, recompute)
RUNS: tuple[tuple[str, str, int, int, int, int, int, int, int, int, str], ...] = (
    ("gpt-1.4b", "gpt", 24, 2048, 16, 16, 8192, 2048, 4, 8, "none"),
    ("gpt-350m", "gpt", 24, 1024, 16, 16, 4096, 2048, 4, 8, "none"),
    ("gpt-160m-s1k", "gpt", 12, 1024, 16, 16, 4096, 1024, 8, 16, "none"),
    ("gpt2-small", "gpt", 12, 768, 12, 12, 3072, 1024, 16, 32, "none"),
    ("gpt-wide-8l", "gpt", 8, 4096, 32, 32, 16384, 2048, 2, 4, "none"),
    ("gpt-wide-2l", "gpt", 2, 8192, 64, 64, 32768, 2048, 2, 4, "none"),
    ("gpt-long-8k", "gpt", 4, 4096, 32, 32, 16384, 8192, 1, 2, "none"),
    ("gpt-1.4b-full", "gpt", 24, 2048, 16, 16, 8192, 2048, 4, 8, "full"),
    ("gpt-1.4b-selective", "gpt", 24, 2048, 16, 16, 8192, 2048, 4, 8, "selective"),
    ("gpt-1.4b-mb1", "gpt", 24, 2048, 16, 16, 8192, 2048, 1, 8, "none"),
    ("llama-16l-gqa", "llama", 16, 2048, 16, 4, 5632, 4096, 2, 4, "none"),
    ("llama-8l-4k", "llama", 8, 4096, 32, 8, 11008, 2048, 2, 4, "none"),
)
# The second lease's runs (2026-12-04): shapes none of the above has, written down with the eager accounting
# (plan/eager.py) and the GPU's own calibration file committed before any of them ran; priced from the
# `par3d calibrate --nproc 1` file the same lease measured just before them (`predict --hardware`).
HELD_OUT: tuple[tuple[str, str, int, int, int, int, int, int, int, int, str], ...] = (
    ("llama-24l-2k", "llama", 24, 2048, 16, 8, 5504, 2048, 4, 8, "none"),
    ("llama-mha-12l", "llama", 12, 1536, 12, 12, 4096, 2048, 4, 8, "none"),
    ("llama-wide-4l", "llama", 4, 5120, 40, 8, 13824, 4096, 1, 2, "none"),
    ("llama-long-16k", "llama", 4, 2048, 16, 4, 5632, 16384, 1, 2, "none"),
    ("llama-16l-full", "llama", 16, 2048, 16, 4, 5632, 4096, 2, 4, "full"),
    ("gpt-20l-1536", "gpt", 20, 1536, 12, 12, 6144, 2048, 4, 8, "none"),
    ("gpt-36l-s512", "gpt", 36, 1280, 20, 20, 5120, 512, 16, 32, "none"),
    ("gpt-1.4b-mb2", "gpt", 24, 2048, 16, 16, 8192, 2048, 2, 8, "none"),
)
SETS = {"first": RUNS, "second": HELD_OUT}
VOCAB = 50304
STEPS = 6


def shape_flags(run: tuple) -> list[str]:
    _, arch, layers, hidden, heads, kv, ffn, seq, mb, gb, _ = run
    return ["--layers", str(layers), "--hidden", str(hidden), "--heads", str(heads), "--seq-len", str(seq),
            "--vocab", str(VOCAB), "--kv-heads", str(kv), "--ffn-hidden", str(ffn), "--global-batch", str(gb),
            "--micro-batch", str(mb)]


def plan_flags(run: tuple, hardware: str | None = None) -> list[str]:
    """The plan of one run: on the catalogue's H200 with the runtime's facts as flags (the first lease), or on a
    GPU file `par3d calibrate` wrote (`hardware`: its own attention curve and eager accounting)."""
    arch, recompute = run[1], run[-1]
    model = (["--no-gated-mlp", "--norm", "layer", "--position", "learned", "--bias"] if arch == "gpt" else
             ["--gated-mlp", "--norm", "rms", "--position", "rotary", "--no-bias"])
    gpu, kernel = (["--hardware", hardware], []) if hardware else (["--gpu", "h200"], ["--attention-kernel", "fa2"])
    return (shape_flags(run) + model + ["--no-tied-embeddings", *gpu, "--gpus", "1", "--gpus-per-node", "1",
                                        "--tp", "1", "--pp", "1", "--dp", "1", "--dtype", "bf16", "--recompute",
                                        recompute, *kernel, "--cross-entropy", "unfused", "--json"])


def train_flags(run: tuple) -> list[str]:
    arch, recompute = run[1], run[-1]
    return (shape_flags(run) + ["--arch", arch, "--dp", "1", "--pp", "1", "--tp", "1", "--dtype", "bf16",
                                "--recompute", recompute, "--steps", str(STEPS), "--threads", "8", "--no-progress",
                                "--json"])


def predict(out: Path, runs: tuple = RUNS, hardware: str | None = None) -> None:
    rows = []
    for run in runs:
        r = subprocess.run([sys.executable, "-m", "par3d", "plan", *plan_flags(run, hardware)], capture_output=True,
                           text=True, timeout=300)
        if r.returncode != 0:
            raise SystemExit(f"par3d plan failed for {run[0]}: {r.stderr[-2000:]}")
        p = json.loads(r.stdout)["plans"][0]
        rows.append({"name": run[0], "plan_flags": plan_flags(run, hardware), "train_flags": train_flags(run),
                     "predicted_step_s": p["step_time_s"], "predicted_mfu": p["mfu"]})
        print(f"{run[0]}: {p['step_time_s'] * 1e3:.1f} ms", flush=True)
    out.write_text(json.dumps({"predicted_on": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "gpu": "h200", "hardware": hardware, "runs": rows}, indent=1) + "\n")


def measure(out: Path, timeout_s: float, runs: tuple = RUNS) -> None:
    res: dict[str, Any] = {"measured_on": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": {}}
    for run in runs:
        t0 = time.time()
        r = subprocess.run([sys.executable, "-m", "par3d", "train", *train_flags(run), "--out", f"/tmp/fid/{run[0]}"],
                           capture_output=True, text=True, timeout=timeout_s, env=dict(os.environ))
        try:
            d = json.loads(r.stdout)
            res["runs"][run[0]] = {"median_step_s": d["median_step_time_s"], "tokens_per_s": d["tokens_per_s"],
                                   "last_loss": d["last_loss"], "wall_s": round(time.time() - t0, 1)}
        except (json.JSONDecodeError, KeyError):
            res["runs"][run[0]] = {"error": (r.stderr or r.stdout)[-1500:]}
        print(run[0], res["runs"][run[0]].get("median_step_s"), flush=True)
        out.write_text(json.dumps(res, indent=1) + "\n")


def score(pred_file: Path, meas_file: Path) -> dict[str, Any]:
    pred, meas = json.loads(pred_file.read_text()), json.loads(meas_file.read_text())
    rows = []
    for p in pred["runs"]:
        m = meas["runs"].get(p["name"], {})
        if "median_step_s" in m:
            rows.append({"name": p["name"], "predicted_ms": p["predicted_step_s"] * 1e3,
                         "measured_ms": m["median_step_s"] * 1e3,
                         "error": p["predicted_step_s"] / m["median_step_s"] - 1})
    errs = [abs(r["error"]) for r in rows]
    return {"rows": rows, "within_10": sum(e <= 0.10 for e in errs), "n": len(rows),
            "median_abs_error": statistics.median(errs) if errs else None}


def lease(out_dir: Path, timeout_s: float) -> int:
    """The whole check for a GPU lease, in the order that keeps it honest: `par3d calibrate --nproc 1` writes this
    GPU's file; the second set's predictions are made from that file by the committed planner before any of those
    runs starts; then the runs; then the score.  Everything lands in `out_dir` (hardware.json, predicted.json,
    measured.json, score.json)."""
    import torch

    if not torch.cuda.is_available():
        print("gpu_fidelity.py lease: no CUDA device here; run it on the GPU machine", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    hw = out_dir / "hardware.json"
    r = subprocess.run([sys.executable, "-m", "par3d", "calibrate", "--nproc", "1", "--quick", "--sustained-s", "10",
                        "--out", str(hw)], timeout=240)
    if r.returncode != 0 or not hw.exists():
        print(f"calibrate failed (rc {r.returncode})", file=sys.stderr)
        return 1
    predict(out_dir / "predicted.json", HELD_OUT, str(hw))
    measure(out_dir / "measured.json", timeout_s, HELD_OUT)
    s = score(out_dir / "predicted.json", out_dir / "measured.json")
    (out_dir / "score.json").write_text(json.dumps(s, indent=1) + "\n")
    print(f"{s['within_10']} of {s['n']} within ±10 %, median |error| {s['median_abs_error']:.1%}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="par3d plan's step time against par3d train's on one GPU.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("predict", help="write the plan's predictions (no GPU needed)")
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--set", choices=tuple(SETS), default="first", help="which runs (default: %(default)s)")
    a.add_argument("--hardware", help="price on this GPU file (`par3d calibrate` on the GPU) instead of --gpu h200")
    b = sub.add_parser("measure", help="run each training run on this GPU, write the measured step times")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--timeout-s", type=float, default=120.0, help="limit for each run")
    b.add_argument("--set", choices=tuple(SETS), default="first", help="which runs (default: %(default)s)")
    c = sub.add_parser("score", help="join predictions and measurements: errors, within ±10 %%, median")
    c.add_argument("predicted", type=Path)
    c.add_argument("measured", type=Path)
    c.add_argument("--json", action="store_true", help="print JSON")
    d = sub.add_parser("lease", help="on a GPU: calibrate, predict the second set from that file, measure, score")
    d.add_argument("--out-dir", type=Path, required=True, help="folder for hardware/predicted/measured/score JSON")
    d.add_argument("--timeout-s", type=float, default=120.0, help="limit for each training run")
    args = ap.parse_args(argv)
    if args.cmd == "lease":
        return lease(args.out_dir, args.timeout_s)
    if args.cmd == "predict":
        predict(args.out, SETS[args.set], args.hardware)
    elif args.cmd == "measure":
        measure(args.out, args.timeout_s, SETS[args.set])
    else:
        s = score(args.predicted, args.measured)
        if args.json:
            print(json.dumps(s, indent=1))
        else:
            for r in s["rows"]:
                print(f"{r['name']:22s} plan {r['predicted_ms']:8.1f} ms  measured {r['measured_ms']:8.1f} ms  "
                      f"{r['error']:+.1%}")
            print(f"{s['within_10']} of {s['n']} within ±10 %, median |error| {s['median_abs_error']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
