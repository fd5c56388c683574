"""Bad input never gets past the checks (reliability issue, point 6), property-based.

Over the config space (small sizes, every layout knob, invalid names and numbers, missing / empty /
too short data files): `train.preflight` — `RunConfig.validate()` plus the checks that need files —
either raises ConfigError, or the configuration trains.  Nothing else may escape.  Valid
single-process examples run one step here, in this process; valid multi-rank ones are collected and
run together in ONE world of 2 ranks at the end (spawning worlds is what costs time)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from distributed_helper import run_world
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from par3d.config import RECOMPUTE, SCHEDULES, ConfigError, RunConfig

MAX_LOCAL_RUNS = 6  # valid examples run in this process
MAX_WORLD_RUNS = 3  # valid 2-rank examples run in one spawned world


@pytest.fixture(scope="module")
def data_files(tmp_path_factory) -> dict[str, str | None]:
    d = tmp_path_factory.mktemp("data")
    (d / "empty.txt").write_text("")
    (d / "empty_dir").mkdir()
    (d / "short.txt").write_text("tiny")
    (d / "good.txt").write_text("def f(x):\n    return x * 2  # some python-like text\n" * 80)
    return {"none": None, "missing": str(d / "missing.txt"), "empty": str(d / "empty.txt"),
            "empty_dir": str(d / "empty_dir"), "short": str(d / "short.txt"), "good": str(d / "good.txt")}


@st.composite
def _plausible(draw: Any) -> dict[str, Any]:
    """A configuration valid by construction (small sizes, every layout knob)."""
    dp, pp, tp = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2]))
    heads = tp * draw(st.sampled_from([1, 2]))
    schedule = draw(st.sampled_from(SCHEDULES if pp > 1 else ("gpipe", "1f1b", "zb-h1")))
    v = 2 if schedule == "interleaved" else 1
    m = pp * draw(st.sampled_from([1, 2])) if schedule == "interleaved" else draw(st.sampled_from([1, 2, 4]))
    mb = draw(st.sampled_from([1, 2]))
    derive = draw(st.booleans())  # leave micro_batch / microbatches to be derived
    return {
        "model": {"vocab": 256, "seq_len": draw(st.sampled_from([8, 16])), "layers": draw(st.integers(pp * v, 4)),
                  "hidden": 8 * heads, "heads": heads, "ffn_hidden": None, "dropout": 0.0,
                  "tied_embeddings": draw(st.booleans())},
        "parallel": {"dp": dp, "pp": pp, "tp": tp, "schedule": schedule, "virtual_stages": v,
                     "microbatches": None if derive else m, "zero_stage": draw(st.sampled_from([0, 1])),
                     "recompute": draw(st.sampled_from(RECOMPUTE)), "sequence_parallel": draw(st.booleans())},
        "train": {"global_batch": dp * m * mb, "micro_batch": None if derive else mb, "steps": 1,
                  "dtype": draw(st.sampled_from(["fp32", "bf16"])), "data": draw(st.sampled_from(["good", "none"]))},
    }


# Mutations: one field set to a value that is invalid, or valid but unusual.
WILD: dict[tuple[str, str], list[Any]] = {
    ("model", "vocab"): [300, 250, 100, 1, 0],
    ("model", "seq_len"): [12, 1, 0, -4, 5000],
    ("model", "layers"): [0, -1, 1, 3],
    ("model", "hidden"): [12, 24, 0, -8],
    ("model", "heads"): [3, 0, 5, 16],
    ("model", "ffn_hidden"): [48, 7, 0],
    ("model", "dropout"): [0.1, 1.0, -0.5],
    ("parallel", "dp"): [0, -1, 3, 4],
    ("parallel", "pp"): [0, 3, 4, 8],
    ("parallel", "tp"): [0, 3, 4, 8],
    ("parallel", "schedule"): ["1F1B", "pipedream", "", "interleaved"],
    ("parallel", "microbatches"): [0, -1, 3, 8],
    ("parallel", "virtual_stages"): [0, 2, 3],
    ("parallel", "zero_stage"): [2, 3, -1],
    ("parallel", "recompute"): ["some", "", "FULL"],
    ("train", "global_batch"): [0, -8, 3, 1, 64],
    ("train", "micro_batch"): [0, -1, 3],
    ("train", "steps"): [0, -1],
    ("train", "lr"): [0.0, -1.0],
    ("train", "warmup"): [-1],
    ("train", "grad_clip"): [-1.0, 0.0],
    ("train", "beta2"): [1.0],
    ("train", "dtype"): ["fp16", ""],
    ("train", "on_nonfinite"): ["ignore", "stop"],
    ("train", "data"): ["missing", "empty", "empty_dir", "short"],
    ("run", "timeout_s"): [0.0, -1.0],
    ("run", "save_every"): [-1],
    ("run", "keep_last"): [0],
    ("run", "nproc"): [3, 1],
    ("run", "bogus_field"): [1],
    ("parallel", "bogus_field"): [1],
}
mutation = st.sampled_from(sorted(WILD)).flatmap(lambda k: st.sampled_from(WILD[k]).map(lambda v: (k, v)))
configs = st.tuples(_plausible(), st.lists(mutation, max_size=3))


def _build(example: tuple, data_files: dict[str, str | None], out: str) -> dict[str, Any]:
    base, mutations = example
    d: dict[str, Any] = {k: dict(v) for k, v in base.items()}
    d.update(progress=False)
    d["train"]["out"] = out
    for (section, name), value in mutations:
        (d if section == "run" else d[section])[name] = value
    d["train"]["data"] = data_files[d["train"]["data"]]
    return d


def run_collected(cases: list[dict[str, Any]]) -> list[int]:
    """Worker: every collected multi-rank configuration, one after the other; steps run per case."""
    from par3d.train import worker

    ran = []
    for cfg in cases:
        r = worker(cfg, {"quiet": True})
        ran.append(-1 if r.get("idle") else len(r["history"]))
    return ran


def test_every_config_is_refused_clearly_or_trains(data_files, tmp_path):
    from par3d.train import preflight, worker

    local: list[int] = []
    collected: list[dict[str, Any]] = []

    @settings(max_examples=400, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(example=configs)
    def check(example: tuple) -> None:
        d = _build(example, data_files, str(tmp_path / "out"))
        try:
            cfg = RunConfig.from_dict(d)
            preflight(cfg)
        except ConfigError as e:
            assert e.problems and all(isinstance(p, str) and p for p in e.problems)
            return
        size = cfg.parallel.world_size
        if size == 1 and len(local) < MAX_LOCAL_RUNS:
            hist = worker(cfg.to_dict(), {"quiet": True})["history"]
            assert len(hist) == cfg.train.steps
            local.append(size)
        elif size == 2 and len(collected) < MAX_WORLD_RUNS and cfg.train.steps == 1:
            collected.append(cfg.to_dict())

    check()
    assert local, "no valid single-process configuration was generated"
    assert collected, "no valid 2-rank configuration was generated"
    ran = run_world(run_collected, 2, collected, timeout_s=60)[0]
    assert ran == [1] * len(collected), (ran, collected)


WRONG_TYPES = st.sampled_from([("parallel", "dp", "2"), ("parallel", "tp", None), ("parallel", "microbatches", "x"),
                               ("train", "global_batch", "16"), ("model", "layers", 2.5),
                               ("train", "micro_batch", "1")])


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(wrong=WRONG_TYPES)
def test_wrongly_typed_fields_are_config_errors(wrong):
    section, name, value = wrong
    cfg = RunConfig()
    setattr(getattr(cfg, section), name, value)
    with pytest.raises(ConfigError):
        cfg.validate()


def test_the_fuzzed_files_exist(data_files):
    assert os.path.getsize(data_files["good"]) > 100
