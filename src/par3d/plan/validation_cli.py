"""`python -m par3d.plan.validation`: the validation set's command -- its report (validation_report.py), the fits
(calibration.py), evidence.json (evidence.py), the leave-one-out (leave_one_out.py) and `--refresh` (refresh.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .calibration import (
    IN_SAMPLE_PREFIX,
    calibration_rows_of,
    fit_moe_host,
    fit_step_share,
    fit_sustained,
    moe_host_by_release,
    moe_host_rows,
)
from .evidence import EVIDENCE_PATH, evidence_file, evidence_json, software_figures
from .validation import predict, predict_named, predict_undescribed, rows
from .validation_report import (
    by_gpu,
    framework_table,
    report_json,
    scale_table,
    scaling_json,
    software_by_field,
    software_table,
    summary,
    table,
)
from .validation_runs import scale_line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m par3d.plan.validation",
        description="Score the planner on the published runs of src/par3d/plan/validation.toml: each row predicted "
                    "once at its published layout on its GPU and cluster.  Without flags: the table docs/planner.md "
                    "section 9 quotes, its summary (all rows, in sample, held out, by source) and the by-GPU reading.")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--json", action="store_true",
                      help="print every row's prediction, the summary figures and the by-GPU evidence as one JSON "
                           "object instead of the tables")
    what.add_argument("--evidence", action="store_true",
                      help="rewrite src/par3d/plan/evidence.json, the per-GPU/dtype errors `par3d plan` quotes")
    what.add_argument("--fit", action="store_true",
                      help="re-derive the fitted step share and sustained GEMM ratios on their declared calibration "
                           "rows and print them beside the stored constants (nothing is written)")
    what.add_argument("--fit-moe-host", action="store_true",
                      help="re-derive the MoE host floor on Megatron-Bridge 26.04's MoE rows and print it beside the "
                           "stored one (nothing is written)")
    parser.add_argument("--leave-one-out", action="store_true",
                      help="refit each fitted constant without each of its calibration rows in turn and price that "
                           "row with the refit (a prediction of a row the constant never saw), and the H100's ratios "
                           "on each other source's rows; writes src/par3d/plan/leave_one_out.json and prints the two "
                           "tables docs/planner.md quotes (with --json: the file's JSON instead; about two minutes)")
    parser.add_argument("--software", action="store_true",
                      help="what each software fact of the rows buys: the set re-priced without one fact at a time "
                           "(par3d's default in its place), and without all of them (a markdown table; with --json "
                           "the same as JSON)")
    parser.add_argument("--scaling", action="store_true",
                        help="the scale pairs (one run published at two GPU counts 2x or more apart, its layout "
                             "alike): how well the planner predicts per-GPU throughput at scale, by source document, "
                             "beside the flat baseline (a markdown table; with --json the pairs as JSON)")
    parser.add_argument("--by-release", action="store_true",
                        help="with --fit-moe-host: also fit the floor on each release's rows alone and score it on "
                             "the other mixture-of-experts rows")
    what.add_argument("--refresh", action="store_true",
                      help="after a change to the rows or the model: price the set once and rewrite what quotes it "
                           "-- evidence.json, leave_one_out.json (refitting, about two minutes), the generated tables "
                           "of docs/planner.md and docs/planner_rounds.md, and each row's bound and note where its "
                           "error moved (needs --round and --reason; a row that newly misses also --before); the "
                           "prose figures are a person's to update (the tests name them).  Run from a checkout")
    parser.add_argument("--check", action="store_true",
                        help="with --refresh: write nothing, list what is stale, exit 1 if anything is")
    parser.add_argument("--before", metavar="FILE", default=None,
                        help="with --refresh: a --json report written before the change (each row's error before, "
                             "which a row's new note quotes)")
    parser.add_argument("--round", metavar="NAME", default=None,
                        help="with --refresh: the round the notes date a change to, as issue 12's notes spell it "
                             "(e.g. forty-eighth)")
    parser.add_argument("--reason", metavar="TEXT", default=None,
                        help="with --refresh: the change, one short phrase each rewritten note gives (the round's "
                             "entry in docs/planner_rounds.md says the rest)")
    parser.add_argument("--rows", metavar="PREFIX", default=None,
                        help="only the rows whose name starts with PREFIX (the table, its summary or --json; e.g. "
                             "mlperf-6.0-)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.by_release and not args.fit_moe_host:
        parser.error("--by-release: only with --fit-moe-host (it re-fits the MoE host floor per release)")
    if args.software and (args.evidence or args.fit or args.fit_moe_host or args.leave_one_out):
        parser.error("--software: only alone, with --json or with --rows (it re-prices the rows it reads)")
    if args.scaling and (args.evidence or args.fit or args.fit_moe_host or args.leave_one_out or args.software):
        parser.error("--scaling: only alone, with --json or with --rows (it reads the rows' predictions)")
    if args.rows is not None and (args.evidence or args.fit or args.fit_moe_host or args.leave_one_out):
        parser.error("--rows: only with the table or --json, or --software (--evidence, --fit, --fit-moe-host "
                     "and --leave-one-out use their own declared rows)")
    if args.leave_one_out and (args.evidence or args.fit or args.fit_moe_host or args.software):
        parser.error("--leave-one-out: only alone or with --json (it refits on its own declared rows)")
    if (args.check or args.before or args.round or args.reason) and not args.refresh:
        parser.error("--check, --before, --round, --reason: only with --refresh")
    if args.refresh and (args.leave_one_out or args.software or args.scaling or args.rows is not None):
        parser.error("--refresh: only with --check, --before, --round and --reason (it prices every row and "
                     "refits the leave-one-out itself)")
    if args.refresh:
        return _refresh(args)
    if args.leave_one_out:  # each in-sample row priced with its constant refitted without it (45th round)
        from . import leave_one_out as loo

        data = loo.run(lambda msg: print(f"  refitting {msg}", file=sys.stderr, flush=True))
        with open(loo.PATH, "w", encoding="utf-8") as fh:
            fh.write(loo.to_json(data))
        if args.json:
            print(loo.to_json(data), end="")
        else:
            print(f"wrote {loo.PATH}\n\n{loo.table(data)}\n\n{loo.swap_table(data)}")
        return 0
    if args.fit:  # re-derive the fitted sustained ratios (gemm_table.FITTED_SUSTAINED)
        from . import gemm_table

        print(f"step share: fitted {fit_step_share():.4f} (stored {gemm_table.STEP_SHARE:.4f}) on the ten "
              f"{IN_SAMPLE_PREFIX}* rows, straggler spread {gemm_table.STEP_SPREAD}")
        for (family, dtype), stored in sorted(gemm_table.FITTED_SUSTAINED.items()):
            shared = family in gemm_table.SHARED_SUSTAINED
            print(f"{family} {dtype}: fitted {fit_sustained(family, dtype):.4f} (stored {stored:.4f}) on "
                  + ("every dtype's rows: " if shared else "")
                  + ", ".join(str(r["name"]) for r in calibration_rows_of(family)
                              if shared or r.get("dtype", "bf16") == dtype))
        return 0
    if args.fit_moe_host:  # re-derive hardware.MOE_HOST_S (seconds: a 2-D grid)
        from .hardware import MOE_HOST_S

        a, b = fit_moe_host()
        print(f"MoE host floor: fitted ({a * 1e3:.2f} ms, {b * 1e3:.3f} ms a routed expert) (stored "
              f"({MOE_HOST_S[0] * 1e3:.2f} ms, {MOE_HOST_S[1] * 1e3:.3f} ms)) on "
              + ", ".join(str(r["name"]) for r in moe_host_rows()))
        if args.by_release:  # the same fit on each release's rows alone, scored on the other MoE rows
            for rel, n, (pa, pb), others, before, after in moe_host_by_release():
                print(f"fitted on {rel}'s {n} rows: ({pa * 1e3:.2f} ms, {pb * 1e3:.3f} ms); the other {others} MoE "
                      f"rows within ±10 %: {before} without a floor, {after} with it")
        return 0
    chosen = [r for r in rows() if args.rows is None or str(r["name"]).startswith(args.rows)]
    if not chosen:
        parser.error(f"--rows {args.rows}: no row's name starts with it (names as in src/par3d/plan/validation.toml)")
    preds = [predict(r) for r in chosen]
    if args.evidence:  # rewrite evidence.json (what `par3d plan` quotes)
        with open(EVIDENCE_PATH, "w", encoding="utf-8") as fh:
            fh.write(evidence_json(preds, [predict_undescribed(r) for r in chosen], [predict_named(r) for r in chosen]))
        evidence_file.cache_clear()
        print(f"wrote {EVIDENCE_PATH}")
        return 0
    if args.software:  # the software facts' worth (docs/planner.md section 9, forty-fourth round)
        fields = software_by_field(preds)
        plain, named_preds = [predict_undescribed(r) for r in chosen], [predict_named(r) for r in chosen]
        whole = software_figures(preds, plain, named_preds)
        if args.json:
            print(json.dumps({"by_field": fields, **whole}, indent=1))
            return 0
        print(software_table(preds, fields, whole))
        print("\n" + framework_table(preds, plain, named_preds))
        return 0
    if args.scaling:  # the scale pairs (fifty-seventh round)
        if args.json:
            print(json.dumps(scaling_json(preds), indent=1, ensure_ascii=False))
            return 0
        print(scale_table(preds) + "\n\n" + (scale_line(preds) or "no scale pairs among these rows"))
        return 0
    if args.json:
        print(report_json(preds))
        return 0
    print(table(preds))
    print("\n" + summary(preds))
    print("\n" + by_gpu(preds))
    return 0


def _refresh(args: argparse.Namespace) -> int:
    """--refresh (refresh.py): evidence.json, leave_one_out.json, the docs' generated blocks, rows' bounds and
    notes, from one pricing of the set."""
    from . import leave_one_out as loo
    from . import refresh

    root = refresh.repo_root()
    before = None
    if args.before:
        with open(args.before, encoding="utf-8") as fh:
            before = refresh.errors_of(fh.read())
    every = rows()
    preds = [predict(r) for r in every]
    plain = [predict_undescribed(r) for r in every]
    named_preds = [predict_named(r) for r in every]
    ev = evidence_json(preds, plain, named_preds)
    with open(EVIDENCE_PATH, encoding="utf-8") as fh:
        ev_stale = fh.read() != ev
    data = loo.run(lambda msg: print(f"  refitting {msg}", file=sys.stderr, flush=True))
    loo_text = loo.to_json(data)
    with open(loo.PATH, encoding="utf-8") as fh:
        loo_stale = fh.read() != loo_text
    try:  # nothing is written before every row's new bound and note is known
        stale = refresh.refresh(root, preds, data, before, args.round, args.reason, write=not args.check,
                                plain=plain, named=named_preds)
    except ValueError as exc:
        print(f"--refresh: {exc}; nothing written", file=sys.stderr)
        return 2
    for path, text, changed in ((EVIDENCE_PATH, ev, ev_stale), (loo.PATH, loo_text, loo_stale)):
        if not changed:
            continue
        stale.append(os.path.basename(path))
        if args.check:
            print(f"stale: {os.path.basename(path)}")
        else:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
            print(f"refreshed {os.path.basename(path)}")
    evidence_file.cache_clear()
    if not stale:
        print("nothing stale: every generated block, bound and note agrees with the set as priced now")
    return 1 if (args.check and stale) else 0
