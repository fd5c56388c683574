"""Checkpoints (reliability issue, points 1-3, 5, 6): save, resume under another layout, keep-last,
the NaN guard, and clear errors for damaged, foreign or mismatched checkpoints.

ONE world of 4 gloo ranks runs every multi-rank case in order; a case may resume from a folder an
earlier case wrote.  The chain of the issue: an uninterrupted (dp, pp, tp) = (1, 2, 2) run saves
after step 3; (2, 1, 2) with ZeRO-1 resumes it and saves every step; (1, 4, 1) resumes that; (4, 1, 1)
with ZeRO-1 resumes that — each must log the uninterrupted run's losses (1e-4 across layouts, 1e-5
in the same layout).  Single-process cases (pruning, NaN handling, errors) run in this process."""

from __future__ import annotations

import copy
import os
import shutil
from typing import Any

import pytest
from distributed_helper import run_world
from equiv_common import case

from par3d import checkpoint
from par3d.checkpoint import CheckpointError
from par3d.config import ConfigError, RunConfig
from par3d.faults import FaultInjector

SAME, ACROSS = 1e-5, 1e-4
STEPS = 6


def _cfg(out: str, *, steps: int = STEPS, save_every: int = 0, keep_last: int = 3, resume: str | None = None,
         **layout: Any) -> dict[str, Any]:
    c = case(layers=4, steps=steps, **layout)
    c["train"]["out"] = out
    c.update(save_every=save_every, keep_last=keep_last, resume=resume)
    return c


def _cases(tmp: str) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    d = {k: os.path.join(tmp, k) for k in ("u", "b", "c", "d", "e", "t", "tb", "tc")}
    step = checkpoint.step_dir_name
    t2 = os.path.join(d["t"], "checkpoints", step(2))
    return [
        # the chain of the issue
        ("u_122", _cfg(d["u"], save_every=3, dp=1, pp=2, tp=2), {}),
        ("b_212_zero1", _cfg(d["b"], save_every=1, resume=os.path.join(d["u"], "checkpoints", step(3)),
                             dp=2, pp=1, tp=2, zero=1), {}),
        ("c_141", _cfg(d["c"], save_every=1, resume=os.path.join(d["b"], "checkpoints", step(4)),
                       dp=1, pp=4, tp=1), {}),
        ("d_411_zero1", _cfg(d["d"], resume=os.path.join(d["c"], "checkpoints", step(5)), dp=4, zero=1), {}),
        # same layout: "latest" in the uninterrupted run's --out, after a preemption at step 3
        ("e_122_same", _cfg(d["e"], save_every=3, dp=1, pp=2, tp=2), {"stop_at_step": 3}),
        ("e_122_resumed", _cfg(d["e"], resume="latest", dp=1, pp=2, tp=2), {}),
        # tied embeddings across stages and a padded vocabulary; interleaved schedule on resume
        ("t_122_tied", _cfg(d["t"], steps=4, save_every=2, dp=1, pp=2, tp=2, tied=True, vocab=250), {}),
        ("tb_212_tied", _cfg(d["tb"], steps=4, resume=t2, dp=2, pp=1, tp=2, tied=True, vocab=250), {}),
        ("tc_121_interleaved", _cfg(d["tc"], steps=4, resume=t2, dp=1, pp=2, tp=1, tied=True, vocab=250,
                                    schedule="interleaved", v=2, m=2), {}),
    ]


def run_checkpoint_cases(tmp: str) -> dict[str, Any]:
    """Worker: every case in order on this world; rank 0's history and checkpoint list per case."""
    from par3d.train import worker

    out: dict[str, Any] = {}
    for name, cfg, options in _cases(tmp):
        RunConfig.from_dict(cfg).validate()
        r = worker(cfg, dict(options, quiet=True))
        if r.get("rank") == 0:
            out[name] = {"history": r["history"], "checkpoints": r["checkpoints"], "start": r["start_step"]}
    return out


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def world(tmp) -> dict[str, Any]:
    return run_world(run_checkpoint_cases, 4, tmp, timeout_s=120)[0]


def _losses(world: dict[str, Any], name: str) -> dict[int, float]:
    return {h["step"]: h["loss"] for h in world[name]["history"]}


def _assert_continues(world: dict[str, Any], name: str, ref: str, first: int, tol: float) -> None:
    got, want = _losses(world, name), _losses(world, ref)
    assert world[name]["start"] == first
    assert sorted(got) == list(range(first, max(want) + 1)), f"{name} ran steps {sorted(got)}"
    for s, loss in got.items():
        assert abs(loss - want[s]) <= tol, f"{name} step {s}: {loss} vs uninterrupted {want[s]}"


def test_acceptance_saved_at_122_after_step_3_resumed_at_212(world):
    # steps 4-6 (0-based 3..5) equal those of the uninterrupted (1, 2, 2) run
    _assert_continues(world, "b_212_zero1", "u_122", 3, ACROSS)


@pytest.mark.parametrize("name,first", [("c_141", 4), ("d_411_zero1", 5)])
def test_chain_of_layout_changes_with_zero1(world, name, first):
    _assert_continues(world, name, "u_122", first, ACROSS)


def test_same_layout_resume_reproduces_the_run(world):
    _assert_continues(world, "e_122_resumed", "u_122", 3, SAME)
    assert len(world["e_122_same"]["history"]) == 3  # the "preempted" run stopped after step 3


@pytest.mark.parametrize("name", ["tb_212_tied", "tc_121_interleaved"])
def test_tied_embeddings_padded_vocab_and_interleaving_survive_a_layout_change(world, name):
    _assert_continues(world, name, "t_122_tied", 2, ACROSS)


def test_checkpoint_folders_and_keep_last(world, tmp):
    root = os.path.join(tmp, "b", "checkpoints")
    assert [s for s, _ in checkpoint.list_checkpoints(root)] == [4, 5, 6]  # keep_last=3
    assert world["b_212_zero1"]["checkpoints"][-1].endswith(checkpoint.step_dir_name(6))
    man = checkpoint.read_manifest(os.path.join(root, checkpoint.step_dir_name(4)))
    assert man["step"] == 4 and man["optimizer_steps"] == 4
    assert man["layout"]["dp"] == 2 and man["layout"]["zero_stage"] == 1
    assert man["tensors"]["model/blocks.0.attn.qkv.weight"] == [96, 32]  # full, not a TP shard
    assert not [n for n in os.listdir(root) if n.startswith(".")]  # no temporary folders left


# ---- single process: pruning, the NaN guard, non-finite steps --------------------------------------

def _one(out: str, **kw: Any) -> dict[str, Any]:
    from par3d.train import worker

    options = kw.pop("options", {})
    return worker(_cfg(out, **kw), dict(options, quiet=True))


def test_keep_last_prunes_older_checkpoints(tmp_path):
    r = _one(str(tmp_path), steps=4, save_every=1, keep_last=2)
    assert len(r["checkpoints"]) == 4
    assert [s for s, _ in checkpoint.list_checkpoints(str(tmp_path / "checkpoints"))] == [3, 4]


def test_a_checkpoint_with_nan_is_never_written(tmp_path, capfd):
    r = _one(str(tmp_path), steps=2, save_every=1, options={"faults": FaultInjector(nan_master_at_step=1)})
    assert [s for s, _ in checkpoint.list_checkpoints(str(tmp_path / "checkpoints"))] == [1]
    assert len(r["checkpoints"]) == 1
    assert "not saving the checkpoint of step 2" in capfd.readouterr().err


def test_non_finite_loss_skips_the_step(tmp_path, capfd):
    ref = _one(str(tmp_path / "ref"), steps=3)["history"]
    hist = _one(str(tmp_path / "nan"), steps=3, options={"faults": FaultInjector(nan_loss_at_step=1)})["history"]
    assert [h["skipped"] for h in hist] == [False, True, False]
    assert hist[0]["loss"] == ref[0]["loss"]
    assert hist[2]["loss"] == hist[2]["loss"]  # finite again: the poisoned update never landed
    assert "update skipped" in capfd.readouterr().err


def test_non_finite_loss_stops_when_asked(tmp_path):
    from par3d.train import RunOptions, worker

    c = _cfg(str(tmp_path), steps=3)
    c["train"]["on_nonfinite"] = "stop"
    with pytest.raises(FloatingPointError, match="step 1.*on_nonfinite='stop'"):
        worker(c, RunOptions(quiet=True, faults=FaultInjector(nan_loss_at_step=1)))


# ---- bad checkpoints: one clear line each ----------------------------------------------------------

def _copy_of(world, tmp, dst) -> str:
    src = os.path.join(tmp, "u", "checkpoints", checkpoint.step_dir_name(3))
    shutil.copytree(src, dst)
    return str(dst)


def _payload(path: str) -> str:
    return next(os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(".distcp"))


def test_truncated_checkpoint_is_refused(world, tmp, tmp_path):
    path = _copy_of(world, tmp, tmp_path / "c")
    f = _payload(path)
    with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) // 2)
    with pytest.raises(CheckpointError, match="is truncated: __.*distcp has"):
        checkpoint.read_manifest(path)


def test_corrupt_checkpoint_is_refused(world, tmp, tmp_path):
    path = _copy_of(world, tmp, tmp_path / "c")
    f = _payload(path)
    with open(f, "r+b") as fh:
        fh.seek(100)
        b = fh.read(1)
        fh.seek(100)
        fh.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(CheckpointError, match="CRC-32"):
        checkpoint.read_manifest(path)


def test_foreign_and_incomplete_folders_are_refused(world, tmp, tmp_path):
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "model.pt").write_bytes(b"\0" * 10)
    with pytest.raises(CheckpointError, match="not a par3d checkpoint: it has no manifest.json"):
        checkpoint.read_manifest(str(tmp_path / "foreign"))
    path = _copy_of(world, tmp, tmp_path / "half")
    os.remove(os.path.join(path, "manifest.json"))
    with pytest.raises(CheckpointError, match="incomplete.*save did not finish"):
        checkpoint.read_manifest(path)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "manifest.json").write_text('{"format": "something-else"}')
    with pytest.raises(CheckpointError, match="format 'something-else'"):
        checkpoint.read_manifest(str(tmp_path / "other"))
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "manifest.json").write_text('{"format": "par3d-checkpoint", "ste')
    with pytest.raises(CheckpointError, match="unreadable or truncated"):
        checkpoint.read_manifest(str(tmp_path / "cut"))


def test_checkpoint_of_another_model_shape_is_refused_before_start(world, tmp):
    from par3d.train import preflight

    cfg = RunConfig.from_dict(_cfg(tmp, resume=os.path.join(tmp, "u"), hidden=64))
    with pytest.raises(ConfigError, match=r"has model.hidden=32, this run has model.hidden=64; give --hidden 32"):
        preflight(cfg)


def test_resume_latest_skips_a_damaged_newest_checkpoint(world, tmp, tmp_path, capfd):
    root = tmp_path / "checkpoints"
    root.mkdir()
    good = _copy_of(world, tmp, root / checkpoint.step_dir_name(3))
    bad = _copy_of(world, tmp, root / checkpoint.step_dir_name(9))
    os.remove(_payload(bad))
    assert checkpoint.resolve("latest", str(tmp_path)) == good
    assert "skipping a damaged checkpoint" in capfd.readouterr().err


def test_resume_without_checkpoints_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoints to resume from"):
        checkpoint.resolve("latest", str(tmp_path))
    with pytest.raises(CheckpointError, match="no such folder"):
        checkpoint.resolve(str(tmp_path / "nope"), str(tmp_path))


def test_layout_independent_load_into_one_process(world, tmp, tmp_path):
    """The (2, 1, 2) ZeRO-1 checkpoint loaded by a single process continues the run too."""
    from par3d.train import worker

    c = _cfg(str(tmp_path), resume=os.path.join(tmp, "b", "checkpoints", checkpoint.step_dir_name(5)))
    hist = worker(copy.deepcopy(c), {"quiet": True})["history"]
    assert [h["step"] for h in hist] == [5]
    assert abs(hist[0]["loss"] - _losses(world, "u_122")[5]) <= ACROSS
