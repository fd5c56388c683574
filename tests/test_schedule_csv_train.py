"""A schedule written by `par3d simulate --to-csv`, loaded back by `par3d train --schedule-csv`,
trains exactly as the builder's schedule does (issue 17), for every builder.

Both configurations come from the train command's own flag parsing (`config_from_args`), so the
CSV run is what `par3d train --schedule-csv FILE` starts: --schedule, --microbatches and
--virtual-stages are left to the file.  ONE world of 2 gloo ranks runs every pair: losses,
step-1 gradients and the parameters after the last step of the CSV run are bit-identical to
the built one's (same actions, same order), and both equal the one-process run within TOL."""

from __future__ import annotations

import pytest
from distributed_helper import run_world
from equiv_common import TOL, losses, max_diff, merged, run_cases

from par3d.cli import build_parser, main

P = 2
# (builder, micro-batches, chunks per rank); dualpipe-v needs m >= 2p
BUILDERS = [("gpipe", 4, 1), ("1f1b", 4, 1), ("interleaved", 4, 2), ("zb-h1", 4, 1), ("zb-v", 4, 2),
            ("dualpipe-v", 4, 2)]
MODEL = ["--layers", "4", "--hidden", "32", "--heads", "4", "--seq-len", "16", "--vocab", "256",
         "--global-batch", "8", "--steps", "2", "--warmup", "0", "--lr", "2e-3", "--min-lr", "2e-4"]


def _train_config(out: str, *flags: str) -> dict:
    """The validated config `par3d train <flags>` would start (as a dict: what every rank gets)."""
    from par3d.commands.train import config_from_args

    args = build_parser().parse_args(["train", "--dp", "1", "--tp", "1", "--pp", str(P), *MODEL,
                                      "--out", out, *flags])
    cfg = config_from_args(args)
    cfg.progress = False
    return cfg.validate().to_dict()


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> tuple[list[dict], dict[str, dict]]:
    d = tmp_path_factory.mktemp("csv")
    cases: list[tuple[str, dict]] = []
    cfgs: dict[str, dict] = {}
    for name, m, v in BUILDERS:
        path = d / f"{name}.csv"
        assert main(["simulate", "--schedule", name, "--stages", str(P), "--microbatches", str(m),
                     "--virtual-stages", str(v), "--to-csv", str(path)]) == 0
        built = _train_config(str(d / "run"), "--schedule", name, "--microbatches", str(m),
                              "--virtual-stages", str(v))
        loaded = _train_config(str(d / "run"), "--schedule-csv", str(path))  # absolute: every rank reads it
        cfgs[name], cfgs[name + "_csv"] = built, loaded
        cases += [(name, built), (name + "_csv", loaded)]
    # zb-v built for uneven chunk times (par3d plan's --zbv-times, forty-second round of issue 12) and a chunk's BI
    # keeping half its activations for BW (the cap's share, sixty-fifth round), the head's chunk three chunks'
    # forwards (the output layer's (x, dy), sixty-sixth round): another order of the same actions, so the same training
    timed = _train_config(str(d / "run"), "--schedule", "zb-v", "--microbatches", "4", "--zbv-times", "1,2,1,0.5,3")
    cfgs["zb-v_timed"] = timed
    cases.append(("zb-v_timed", timed))
    # a V read from a file ties the embedding on rank 0 as the built zb-v does (the head's rank from the file)
    for tag, flags in (("zb-v_tied", ("--schedule", "zb-v", "--microbatches", "4", "--virtual-stages", "2")),
                       ("zb-v_csv_tied", ("--schedule-csv", str(d / "zb-v.csv")))):
        cfgs[tag] = _train_config(str(d / "run"), *flags, "--tied-embeddings")
        cases.append((tag, cfgs[tag]))
    ref = _train_config(str(d / "run"), "--schedule", "1f1b", "--microbatches", "1")
    ref["parallel"]["pp"] = 1
    cases.append(("ref", ref))
    ref_tied = _train_config(str(d / "run"), "--schedule", "1f1b", "--microbatches", "1", "--tied-embeddings")
    ref_tied["parallel"]["pp"] = 1
    cases.append(("ref_tied", ref_tied))
    results = run_world(run_cases, P, cases, {"capture_grads": True, "capture_params": True}, timeout_s=120)
    return results, cfgs


@pytest.mark.parametrize("name", [b[0] for b in BUILDERS])
def test_csv_config_takes_m_and_v_from_the_file(world, name):
    _, cfgs = world
    built, loaded = cfgs[name]["parallel"], cfgs[name + "_csv"]["parallel"]
    assert (loaded["microbatches"], loaded["virtual_stages"]) == (built["microbatches"], built["virtual_stages"])
    assert loaded["schedule_csv"] and not built["schedule_csv"]


def test_a_v_read_from_a_file_ties_the_embedding_as_the_built_one(world):
    """`--tied-embeddings` with a V-shaped CSV: the head's rank is read off the file (rank 0, beside the
    embedding), and the run is the built zb-v's exactly and the tied one-process run's within TOL."""
    results, _ = world
    assert losses(results, "zb-v_csv_tied") == losses(results, "zb-v_tied")
    for key in ("grads", "params"):
        diff, where = max_diff(merged(results, "zb-v_csv_tied", key), merged(results, "zb-v_tied", key))
        assert diff == 0.0, f"{key} of {where} differ by {diff} between the CSV and the built zb-v"
        diff, where = max_diff(merged(results, "zb-v_csv_tied", key), merged(results, "ref_tied", key))
        assert diff <= TOL, f"{key} of {where} differ by {diff} from the tied one-process run"
    assert "head.weight" not in merged(results, "zb-v_csv_tied", "params")  # one table, as the reference holds


@pytest.mark.parametrize("name", [b[0] for b in BUILDERS])
def test_csv_schedule_trains_identically(world, name):
    results, _ = world
    got, want = losses(results, name + "_csv"), losses(results, name)
    assert len(got) == 2 and got == want, (name, got, want)
    for key in ("grads", "params"):
        diff, where = max_diff(merged(results, name + "_csv", key), merged(results, name, key))
        assert diff == 0.0, f"{name}: {key} of {where} differ by {diff} between the CSV and the built schedule"
    # the same actions ran: each rank kept the same activations alive, as its checker predicted,
    # and the memory predicted for it is the same
    for key in ("peak_inflight_predicted", "peak_activation_bytes", "memory"):
        assert _per_rank(results, name + "_csv", key) == _per_rank(results, name, key), (name, key)
    for a, b in zip(got, losses(results, "ref")):
        assert abs(a - b) <= TOL, (name, got, losses(results, "ref"))
    diff, where = max_diff(merged(results, name + "_csv", "params"), merged(results, "ref", "params"))
    assert diff <= TOL, f"{name}: params of {where} differ by {diff} from the one-process run"


def test_zbv_built_for_uneven_times_trains_as_the_reference(world):
    """`--zbv-times` reorders zb-v's actions (the order `par3d plan` priced); the run still equals the one-process
    run within TOL, and the order it ran is not the equal-time one."""
    from par3d.config import RunConfig
    from par3d.pipeline.schedules import build
    from par3d.train import pipeline_schedule

    results, cfgs = world
    rc = RunConfig.from_dict(cfgs["zb-v_timed"])
    assert rc.parallel.zbv_times == [1.0, 2.0, 1.0, 0.5, 3.0]
    assert pipeline_schedule(rc) == build("zb-v", P, 4, 2, (1.0, 2.0, 1.0, 0.5, 3.0)) != build("zb-v", P, 4, 2)
    assert pipeline_schedule(rc) != build("zb-v", P, 4, 2, (1.0, 2.0, 1.0, 0.5))  # the head's share reorders it
    got, want = losses(results, "zb-v_timed"), losses(results, "ref")
    assert len(got) == 2 and all(abs(a - b) <= TOL for a, b in zip(got, want)), (got, want)
    diff, where = max_diff(merged(results, "zb-v_timed", "params"), merged(results, "ref", "params"))
    assert diff <= TOL, f"params of {where} differ by {diff} from the one-process run"
    # the activation meter counts a BI's deferred (x, dy) from BI to BW, no more than the forward saved: each rank's
    # measured peak stays within its checker's whole chunks (past their F, before their BW) x one forward's bytes
    peaks, inflight = _per_rank(results, "zb-v_timed", "peak_activation_bytes"), _per_rank(
        results, "zb-v_timed", "peak_inflight_predicted")
    per_mb = _per_rank(results, "zb-v_timed", "activation_bytes_per_microbatch")
    assert peaks and all(0 < peaks[k] <= inflight[k] * per_mb[k] for k in peaks), (peaks, inflight, per_mb)


def _per_rank(results: list[dict], name: str, key: str) -> dict:
    out = {r[name]["rank"]: r[name][key] for r in results if name in r}
    if key == "memory":  # measured bytes are the same run's; the prediction must not depend on the source
        out = {k: v["predicted"] for k, v in out.items()}
    return out


@pytest.mark.parametrize("name,m,v", BUILDERS)
def test_a_written_csv_is_known_by_its_builder(tmp_path, name, m, v):
    """The planner prices named schedules: a CSV from --to-csv is priced as its builder's, and the
    end-of-run prediction of `train --schedule-csv` is the one of `train --schedule`."""
    from par3d.config import RunConfig
    from par3d.pipeline.schedules import build, builder_of
    from par3d.predict import choice

    assert builder_of(build(name, P, m, v), P, m, v) == name
    path = tmp_path / "s.csv"
    assert main(["simulate", "--schedule", name, "--stages", str(P), "--microbatches", str(m),
                 "--virtual-stages", str(v), "--to-csv", str(path)]) == 0
    loaded = RunConfig.from_dict(_train_config(str(tmp_path / "run"), "--schedule-csv", str(path)))
    built = RunConfig.from_dict(_train_config(str(tmp_path / "run"), "--schedule", name, "--microbatches", str(m),
                                              "--virtual-stages", str(v)))
    assert choice(loaded.resolve(), strict=True) == choice(built.resolve())


def test_a_csv_no_builder_makes_is_not_priced_but_still_checked(tmp_path):
    from par3d.config import RunConfig
    from par3d.pipeline.schedules import build, to_csv
    from par3d.predict import choice, peak_inflight

    sched = build("1f1b", P, 4)
    sched[1] = [sched[1][0], sched[1][2], sched[1][1], *sched[1][3:]]  # rank 1: F1 before B0 (still valid)
    path = tmp_path / "own.csv"
    path.write_text(to_csv(sched))
    cfg = RunConfig.from_dict(_train_config(str(tmp_path / "run"), "--schedule-csv", str(path))).resolve()
    with pytest.raises(ValueError, match="no builder's schedule"):
        choice(cfg, strict=True)
    assert peak_inflight(cfg) == (2, 2)  # the file's own peaks, not 1f1b's (2, 1)
    assert choice(cfg).schedule == "1f1b"  # memory and rank shapes: a schedule of the file's placement


def test_a_v_shaped_csv_with_tied_embeddings_is_accepted(tmp_path, capsys):
    """A file that puts the first and the last stage on one rank (a V) ties the embedding there, as zb-v does
    (tests/test_equiv_pp.py runs both on the reference); the dry run accepts it."""
    path = tmp_path / "zbv.csv"
    assert main(["simulate", "--schedule", "zb-v", "--stages", "2", "--microbatches", "4", "--to-csv",
                 str(path)]) == 0
    capsys.readouterr()
    rc = main(["train", "--dp", "1", "--tp", "1", "--pp", "2", *MODEL, "--tied-embeddings", "--schedule-csv",
               str(path), "--out", str(tmp_path / "run"), "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 0 and "Traceback" not in err, err
