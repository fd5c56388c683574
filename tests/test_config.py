"""Configuration: defaults, derivation of the batch split, and errors that name field, value,
rule and fix — all before any process starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from par3d.cli import main
from par3d.config import ConfigError, RunConfig


def make(**sections) -> RunConfig:
    d = {k: v for k, v in sections.items()}
    return RunConfig.from_dict(d)


def test_defaults_validate_and_derive_the_batch_split():
    cfg = RunConfig().validate()
    t, p = cfg.train, cfg.parallel
    assert t.micro_batch * p.microbatches * p.dp == t.global_batch


def test_dp2_alone_works_with_the_defaults():
    cfg = make(parallel={"dp": 2}).validate()
    assert cfg.train.micro_batch * cfg.parallel.microbatches * 2 == cfg.train.global_batch


def test_pipeline_defaults_to_two_microbatches_per_stage():
    cfg = make(parallel={"pp": 2}).validate()
    assert cfg.parallel.microbatches == 4
    assert cfg.train.micro_batch == 4


def test_heads_not_divisible_by_tp_names_both_and_suggests_divisors():
    with pytest.raises(ConfigError) as e:
        make(model={"heads": 4}, parallel={"tp": 3}).validate()
    msg = str(e.value)
    assert "tp=3" in msg and "heads=4" in msg and "1, 2 or 4" in msg


def test_every_violation_is_listed_at_once():
    with pytest.raises(ConfigError) as e:
        make(model={"heads": 4, "hidden": 30}, parallel={"tp": 3, "schedule": "nope", "zero_stage": 4},
             train={"dtype": "fp8", "lr": -1}).validate()
    probs = e.value.problems
    assert len(probs) >= 5
    joined = "\n".join(probs)
    for needle in ("schedule='nope'", "zero_stage=4", "dtype='fp8'", "lr=-1", "heads=4"):
        assert needle in joined


def test_batch_relation_is_checked():
    with pytest.raises(ConfigError, match="global_batch=16 != micro_batch=3"):
        make(parallel={"dp": 2, "microbatches": 2}, train={"micro_batch": 3}).validate()


def test_interleaved_needs_m_multiple_of_p_and_v_at_least_2():
    with pytest.raises(ConfigError, match="multiple of pp=4"):
        make(model={"layers": 8}, parallel={"pp": 4, "schedule": "interleaved", "virtual_stages": 2,
                                            "microbatches": 6}, train={"global_batch": 12}).validate()
    with pytest.raises(ConfigError, match="virtual_stages >= 2"):
        make(parallel={"pp": 2, "schedule": "interleaved"}).validate()
    with pytest.raises(ConfigError, match="only applies to the interleaved"):
        make(parallel={"pp": 2, "virtual_stages": 2}).validate()


def test_too_many_stages_for_the_layers():
    with pytest.raises(ConfigError, match="every chunk needs at least one layer"):
        make(model={"layers": 2}, parallel={"pp": 5}).validate()
    # layers + 2 chunks: the embedding and the head alone on the first and last (Llama 3's balance)
    make(model={"layers": 2}, parallel={"pp": 4}).validate()


def test_missing_and_empty_data_paths(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        make(train={"data": str(tmp_path / "nope.txt")}).validate()
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        make(train={"data": str(empty)}).validate()
    (tmp_path / "d").mkdir()
    with pytest.raises(ConfigError, match="no non-empty files"):
        make(train={"data": str(tmp_path / "d")}).validate()


def test_unknown_fields_in_toml_are_errors(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[model]\nlayerz = 3\n[parallel]\ntp = 2\n")
    with pytest.raises(ConfigError, match="model.layerz is not a known field"):
        RunConfig.load_toml(str(f)).validate()  # reported with every other problem (issue 14, item 7)


def test_toml_round_trip(tmp_path):
    cfg = make(model={"layers": 6, "tied_embeddings": True}, parallel={"pp": 2, "tp": 2},
               train={"lr": 1e-3}).validate()
    f = tmp_path / "c.toml"
    f.write_text(cfg.to_toml())
    back = RunConfig.load_toml(str(f)).validate()
    assert back.to_dict() == cfg.to_dict()


def test_cli_rejects_bad_layout_before_spawning(capsys):
    rc = main(["train", "--heads", "4", "--tp", "3"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "tp" in err and "heads" in err


def test_cli_rejects_bad_synthetic_flag(capsys):
    assert main(["train", "--synthetic-stage-ms", "2"]) == 2
    assert "synthetic_stage_ms" in capsys.readouterr().err


def test_pure_modules_do_not_import_torch():
    code = ("import sys, par3d.config, par3d.mesh, par3d.plan.search, par3d.pipeline.schedules, "
            "par3d.pipeline.simulate, par3d.pipeline.partition, par3d.commands.plan, par3d.cli; "
            "par3d.cli.build_parser(); "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_data_shorter_than_a_sequence(tmp_path):
    f = tmp_path / "short.txt"
    f.write_text("abc")
    with pytest.raises(ConfigError, match="fewer than seq_len"):
        make(train={"data": str(f)}).validate()


def test_global_batch_not_divisible_by_dp_says_so():
    with pytest.raises(ConfigError) as e:
        make(parallel={"dp": 2}, train={"global_batch": 15}).validate()
    assert "global_batch=15 is not divisible by dp=2" in str(e.value)
    assert "--global-batch 16" in str(e.value)
    assert "micro_batch=" not in str(e.value)


def test_unknown_p2p_transport_names_the_choices():
    with pytest.raises(ConfigError) as e:
        make(parallel={"pp": 2, "p2p": "rdma"}).validate()
    assert "parallel.p2p='rdma'" in str(e.value) and "auto, shm, backend" in str(e.value)
    assert make(parallel={"pp": 2, "p2p": "backend"}).validate().parallel.p2p == "backend"


def test_cli_rejects_unknown_p2p_before_spawning(capsys):
    assert main(["train", "--pp", "2", "--p2p", "rdma"]) == 2
    err = capsys.readouterr().err
    assert "parallel.p2p='rdma'" in err and "auto, shm, backend" in err


def test_context_parallel_needs_two_chunks_per_rank_and_no_dropout():
    with pytest.raises(ConfigError) as e:
        make(model={"seq_len": 12, "dropout": 0.1}, parallel={"cp": 4}).validate()
    joined = "\n".join(e.value.problems)
    assert "cp=4: seq_len=12 is not divisible by 2 x cp = 8" in joined
    assert "dropout" in joined
    cfg = make(model={"seq_len": 16}, parallel={"cp": 2, "dp": 2, "zero_stage": 1}).validate()
    assert cfg.parallel.world_size == 4


def test_plans_spellings_of_the_norm_and_position_are_read_as_the_runtimes():
    """`par3d plan --norm layer|rms --position rotary` and `par3d train --norm layernorm|rmsnorm --position rope` name
    the same choices: the runtime reads the plan's spellings too (a model described for one command works in the
    other), and anything else stays refused."""
    for given, want in (({"norm": "rms", "position": "rotary"}, ("rmsnorm", "rope")),
                        ({"norm": "layer", "position": "learned"}, ("layernorm", "learned"))):
        cfg = RunConfig.from_dict({"model": given}).validate()
        assert (cfg.model.norm, cfg.model.position) == want
    with pytest.raises(ConfigError, match="model.norm='rmsx' is unknown"):
        RunConfig.from_dict({"model": {"norm": "rmsx"}}).validate()
