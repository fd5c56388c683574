"""`par3d bench planner`: how long `par3d plan`'s full search takes on large clusters.

Each case runs the unconstrained search (every tp, cp, pp, dp, micro-batch, schedule, v, recompute,
ZeRO stage) in a fresh Python process, `--repeat` times, so no cache survives from one run to the
next; the medians of the search's wall and CPU time are reported, with the import time apart.
`--baseline REV` runs the same cases on the code of a git revision (a temporary `git worktree`),
side by side, and says whether both return the same top plans.

Cases: the 1T-parameter row of Narayanan et al. 2021 Table 1 (1008B: 128 layers, h = 25,600,
160 heads) on 3,072 A100-80GB with batch 3,072 — issue 12's target, < 2 s on two cores; GPT-3 175B
on 1,024 A100-80GB, batch 1,536 (§5.1); Llama 3 405B on 16,384 H100, batch 2,048 (Llama 3 paper); the
1T shape with untied embeddings (the V schedules searched for it, and for tied ones since issue 12's sixty-second round); DeepSeek-V3 on
1,024 H100, batch 4,096: a mixture of experts, whose search adds expert parallelism; Mixtral 8x22B on 256 H100,
batch 256: a mixture of experts whose search considers the most configurations (~4.7·10⁵, most of them
priced for memory alone).
The 1T case is also timed as `par3d plan ... --explain` end to end (its search also bounds the
configurations that do not fit, then the best plan of each of the leading layouts is simulated and
the report rendered): `explain_s_median`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from par3d.argtypes import int_at_least

# name, (layers, hidden, heads, seq, vocab) or a catalogue name, gpu, gpus, global batch
CASES: list[tuple[str, Any, str, int, int]] = [
    # megatron-1t's dimensions, spelled out so revisions older than the catalogue entry run it too
    ("1T (1008B) on 3072 A100", (128, 25600, 160, 2048, 51200), "a100-80gb", 3072, 3072),
    ("GPT-3 175B on 1024 A100", "gpt3-175b", "a100-80gb", 1024, 1536),
    ("Llama 3 405B on 16384 H100", "llama3-405b", "h100-sxm", 16384, 2048),
    # the 1T shape with untied embeddings (before issue 12's sixty-second round only untied ones searched the V)
    ("1T untied on 3072 A100", (128, 25600, 160, 2048, 51200, False), "a100-80gb", 3072, 3072),
    # a mixture of experts (expert parallelism, ZeRO-3 of experts, MLA's recompute modules searched too): the slowest
    # search of the catalogue (issue 12's twenty-ninth round)
    ("DeepSeek-V3 on 1024 H100", "deepseek-v3", "h100-sxm", 1024, 4096),
    # a mixture of experts on a small cluster: ~4.7·10⁵ configurations considered, most priced for memory alone
    ("Mixtral 8x22B on 256 H100", "mixtral-8x22b", "h100-sxm", 256, 256),
]

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from par3d.plan.hardware import make_cluster
from par3d.plan.models import CATALOGUE, ModelSpec
from par3d.plan.search import search
t1 = time.perf_counter()
spec, gpu, gpus, batch = json.loads(sys.argv[1])
model = CATALOGUE[spec] if isinstance(spec, str) else ModelSpec("m", *spec[:5], **({"tied": spec[5]} if spec[5:] else {}))
c0 = time.process_time()
w0 = time.perf_counter()
res = search(model, make_cluster(gpu, gpus), batch)
w1 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "search_s": w1 - w0, "search_cpu_s": time.process_time() - c0,
                  "considered": res.considered, "simulated": res.simulated,
                  "top": [[p.choice.label(), p.step_time] for p in res.plans]}))
"""

# `par3d plan --explain` in-process, output discarded: search + per-layout bests + the report
EXPLAIN_CHILD = r"""
import contextlib, io, json, sys, time
from par3d.cli import main
spec, gpu, gpus, batch = json.loads(sys.argv[1])
model = ["--model", spec] if isinstance(spec, str) else [
    f for k, x in zip(("--layers", "--hidden", "--heads", "--seq-len", "--vocab"), spec) for f in (k, str(x))]
argv = ["plan", *model, "--gpu", gpu, "--gpus", str(gpus), "--global-batch", str(batch), "--explain"]
w0, c0 = time.perf_counter(), time.process_time()
with contextlib.redirect_stdout(io.StringIO()):
    rc = main(argv)
print(json.dumps({"explain_s": time.perf_counter() - w0, "explain_cpu_s": time.process_time() - c0, "rc": rc}))
"""


def _child_rows(src: str, case: tuple, repeat: int, child: str) -> list[dict[str, Any]]:
    """Run `child` in `repeat` fresh processes on the code under `src`; its last stdout line each."""
    _name, spec, gpu, gpus, batch = case
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rows = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", child, json.dumps([spec, gpu, gpus, batch])], env=env,
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def _explain_runs(src: str, case: tuple, repeat: int) -> dict[str, Any]:
    rows = _child_rows(src, case, repeat, EXPLAIN_CHILD)
    return {"explain_s_median": statistics.median(r["explain_s"] for r in rows),
            "explain_cpu_s_median": statistics.median(r["explain_cpu_s"] for r in rows),
            "explain_s": [r["explain_s"] for r in rows]}


def register(bsub: Any) -> None:
    ap = bsub.add_parser("planner", help="time of par3d plan's full search on large clusters",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int_at_least(1), default=5, help="fresh-process runs per case (default 5)")
    ap.add_argument("--baseline", metavar="REV", default=None,
                    help="also run the cases on git revision REV, side by side")
    ap.add_argument("--quick", action="store_true", help="one run per case, no baseline (a smoke run)")
    ap.add_argument("--out", default="runs/bench/planner.json",
                    help="results file (JSON; default %(default)s; the committed one changes only when named: "
                         "--out benchmarks/results/planner.json)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.set_defaults(func=run)


def _runs(src: str, case: tuple, repeat: int) -> dict[str, Any]:
    rows = _child_rows(src, case, repeat, CHILD)
    return {"search_s_median": statistics.median(r["search_s"] for r in rows),
            "search_cpu_s_median": statistics.median(r["search_cpu_s"] for r in rows),
            "import_s_median": statistics.median(r["import_s"] for r in rows),
            "search_s": [r["search_s"] for r in rows], "considered": rows[0]["considered"],
            "simulated": rows[0]["simulated"], "top": rows[0]["top"]}


def run(args: argparse.Namespace) -> int:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../src
    repeat = 1 if args.quick else args.repeat
    baseline_src, tmp = None, None
    if args.baseline and not args.quick:
        tmp = tempfile.mkdtemp(prefix="par3d-baseline-")
        subprocess.run(["git", "worktree", "add", "--detach", tmp, args.baseline], check=True,
                       capture_output=True)
        baseline_src = os.path.join(tmp, "src")
    try:
        cases = []
        for case in CASES:
            row: dict[str, Any] = {"case": case[0], "gpu": case[2], "gpus": case[3], "global_batch": case[4],
                                   "now": _runs(here, case, repeat)}
            if case is CASES[0]:  # the 1T case: `--explain` end to end as well
                row["now"].update(_explain_runs(here, case, repeat))
            if baseline_src:
                base = _runs(baseline_src, case, repeat)
                row["baseline"] = base
                row["speedup"] = base["search_s_median"] / row["now"]["search_s_median"]
                row["same_top"] = [t[0] for t in base["top"]] == [t[0] for t in row["now"]["top"]]
            cases.append(row)
    finally:
        if tmp:
            subprocess.run(["git", "worktree", "remove", "--force", tmp], capture_output=True)
    result = {"repeat": repeat, "baseline": args.baseline if baseline_src else None,
              "cpus": os.cpu_count(), "cases": cases}
    if not args.quick:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for r in cases:
            line = (f"{r['case']:<28} search {r['now']['search_s_median']:.2f} s wall, "
                    f"{r['now']['search_cpu_s_median']:.2f} s CPU (median of {repeat}), "
                    f"{r['now']['considered']} configurations, {r['now']['simulated']} simulated")
            if "explain_s_median" in r["now"]:
                line += (f"; --explain {r['now']['explain_s_median']:.2f} s wall, "
                         f"{r['now']['explain_cpu_s_median']:.2f} s CPU")
            if "baseline" in r:
                line += (f"; {args.baseline}: {r['baseline']['search_s_median']:.2f} s -> {r['speedup']:.1f}x, "
                         f"same top plans: {r['same_top']}")
            print(line)
        if not args.quick:
            print(f"wrote {args.out}")
    return 0
