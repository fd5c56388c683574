"""Train the hybrid CNN (seed 2.3, slides 17-18) on generated images and report its traffic.

    python examples/hybrid_cnn.py --nproc 4 --steps 20          # table
    python examples/hybrid_cnn.py --nproc 4 --steps 20 --json   # JSON

Convolutions run data-parallel (each rank a quarter of the batch), the fully-connected layers
tensor-parallel over the same ranks; `--mode dp` runs everything data-parallel for comparison.
The report lists, per layer, the bytes one step moves under all-DP and under the hybrid, and the
bytes `par3d.comm.COUNTER` measured during the last step of this run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from par3d.distributed import launch
from par3d.hybrid_cnn import CNNConfig, format_report, train


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=4, help="ranks (local processes)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=CNNConfig.batch, help="global batch B")
    ap.add_argument("--fc-hidden", type=int, default=CNNConfig.fc_hidden)
    ap.add_argument("--lr", type=float, default=CNNConfig.lr)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", choices=["hybrid", "dp"], default="hybrid")
    ap.add_argument("--eval-batch", type=int, default=256, help="held-out images for the accuracy")
    ap.add_argument("--json", action="store_true", help="print JSON instead of text")
    a = ap.parse_args(argv)

    cfg = CNNConfig(batch=a.batch, fc_hidden=a.fc_hidden, lr=a.lr, seed=a.seed, mode=a.mode)
    if a.eval_batch % a.nproc:
        ap.error(f"--eval-batch {a.eval_batch} must be divisible by --nproc {a.nproc}")
    results = launch(train, a.nproc, (cfg, a.steps, False, a.eval_batch), timeout_s=120.0)
    r0 = results[0]
    # rank 0's report: both predicted columns, plus COUNTER's bytes of this run's last step
    rows = r0["report"]
    if a.json:
        print(json.dumps({"config": dataclasses.asdict(cfg), "nproc": a.nproc, "losses": r0["losses"],
                          "eval_accuracy": r0["eval_accuracy"], "report": rows}, indent=2, ensure_ascii=False))
        return 0
    print(f"hybrid CNN, mode={cfg.mode}, {a.nproc} ranks, global batch {cfg.batch}, {a.steps} steps")
    for step, loss in enumerate(r0["losses"]):
        print(f"step {step:3d}  loss {loss:.4f}")
    if r0["eval_accuracy"] is not None:
        print(f"held-out accuracy: {r0['eval_accuracy']:.3f}")
    print()
    print(format_report(rows, cfg, a.nproc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
