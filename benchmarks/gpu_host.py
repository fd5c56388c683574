"""Is par3d's eager runtime host-bound on a GPU?  For a few model shapes and micro-batches: the wall time of a
training micro-step (forward + backward of the whole model), the time the host takes to *issue* it (the Python
returns before the GPU finishes), the GPU's busy time (the sum of its kernels, from PyTorch's profiler), and the
number of PyTorch operators dispatched.  Issue time close to the wall time, with the kernels' sum well below it,
is a host-bound step (benchmarks/results/gpu-fidelity-h200*.json's misses; docs/measured.md section 6).

    python benchmarks/gpu_host.py --out benchmarks/results/gpu-host-h200.json   # on a GPU; on a CPU: --smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from par3d.config import ModelConfig  # noqa: E402
from par3d.mesh import Group  # noqa: E402
from par3d.model import GPTStage, ModelContext  # noqa: E402

# (name, arch, layers, hidden, heads, kv_heads, ffn, seq, micro-batches to try): gpu_fidelity.py's shapes, 4 layers
SHAPES = (("gpt-1.4b", "gpt", 4, 2048, 16, 16, 8192, 2048, (1, 4)),
          ("gpt2-small", "gpt", 4, 768, 12, 12, 3072, 1024, (16,)),
          ("llama-16l-gqa", "llama", 4, 2048, 16, 4, 5632, 4096, (1, 2)))


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.n += 1
        return func(*args, **(kwargs or {}))


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def micro_step(model: GPTStage, tokens: torch.Tensor) -> None:
    model(tokens, tokens).float().mean().backward()


def measure(name: str, arch: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, seq: int, b: int,
            smoke: bool) -> dict[str, Any]:
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    mc = ModelConfig(arch=arch, vocab=50304 if not smoke else 256, seq_len=seq, layers=layers, hidden=hidden,
                     heads=heads, kv_heads=kv, ffn_hidden=ffn)
    model = GPTStage(mc, ModelContext(tp=Group("tp", [0], 0), dtype=dt)).to(device=dev, dtype=dt)
    tokens = torch.randint(0, mc.vocab, (b, seq), device=dev)
    for _ in range(2):
        micro_step(model, tokens)
    sync()
    n = 2 if smoke else 5
    walls, issues = [], []
    for _ in range(n):
        sync()
        t0 = time.perf_counter()
        micro_step(model, tokens)
        issues.append(time.perf_counter() - t0)
        sync()
        walls.append(time.perf_counter() - t0)
    with OpCounter() as c:
        micro_step(model, tokens)
    sync()
    busy = None
    if dev.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            micro_step(model, tokens)
            sync()
        # each kernel's own time once (self_device_time_total, µs): nested CPU ops would count their kernels again
        busy = sum(getattr(e, "self_device_time_total", 0.0) for e in prof.key_averages()) / 1e6
    return {"name": name, "micro_batch": b, "layers": layers, "wall_s": statistics.median(walls),
            "issue_s": statistics.median(issues), "gpu_busy_s": busy, "ops": c.n,
            "host_s_per_op": statistics.median(issues) / c.n}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Wall, issue and GPU-busy time of eager micro-steps; writes JSON.")
    ap.add_argument("--out", required=True, help="JSON file (rewritten after each shape)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, to prove it runs")
    args = ap.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for name, arch, layers, hidden, heads, kv, ffn, seq, bs in SHAPES:
        if args.smoke:
            layers, hidden, heads, kv, ffn, seq, bs = 2, 32, 4, min(kv, 4) if kv < heads else 4, 64, 16, (1,)
        for b in bs:
            try:
                rows.append(measure(name, arch, layers, hidden, heads, kv, ffn, seq, b, args.smoke))
            except Exception as e:  # keep the others
                rows.append({"name": name, "micro_batch": b, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            print(json.dumps(rows[-1]), flush=True)
            Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name() if torch.cuda.is_available()
                                                  else "cpu", "torch": torch.__version__, "rows": rows}, indent=1))
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
