"""The planner prices an interleaved choice at two pipeline cuts and keeps the faster (cost.evaluate)."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace

from test_plan_cli import run

from par3d.plan.cost import Choice, _evaluate_at, evaluate, round_split
from par3d.plan.hardware import make_cluster
from par3d.plan.models import CATALOGUE
from par3d.plan.stage_layout import layout


def _qwen():
    return CATALOGUE["qwen3-235b-a22b"], make_cluster("gb200", 256), Choice(1, 8, 32, 1, 32, "interleaved", 3,
                                                                              ep=32, zero_stage=1)


def test_interleaved_plan_takes_the_faster_cut_and_says_which():
    model, cluster, c = _qwen()
    own = layout(model, 24).layers
    assert own[:4] == (1, 1, 1, 1)  # the chunk-optimal walk-back: the first chunks one layer each
    split = round_split(model, c)
    assert split is not None and sum(split) == model.layers and len(split) == 24 and min(split[:-1]) >= 3
    at_own = _evaluate_at(model, cluster, c)
    at_split = _evaluate_at(replace(model, pipeline_split=split), cluster, c)
    plan = evaluate(model, cluster, c)
    assert at_split.step_time < at_own.step_time * 0.95  # here the round-wise cut is well ahead
    assert plan.pipeline_layout == split and plan.step_time == at_split.step_time


def test_the_faster_cut_is_kept_whichever_it_is():
    model, cluster, c = _qwen()
    for v in (2, 3, 4):
        for m in (8, 32):
            cv = replace(c, virtual_stages=v, microbatches=m, dp=32)
            plan = evaluate(model, cluster, cv)
            own = _evaluate_at(model, cluster, cv)
            split = round_split(model, cv)
            other = _evaluate_at(replace(model, pipeline_split=split), cluster, cv) if split else own
            assert plan.step_time == min(own.step_time, other.step_time) or not other.fits
            assert plan.pipeline_layout == (split if plan.step_time < own.step_time else ())


def test_no_second_cut_where_the_cut_is_given_or_one_chunk_a_rank():
    model, cluster, c = _qwen()
    assert round_split(model, replace(c, virtual_stages=1)) is None
    assert round_split(replace(model, pipeline_split=(4,) * 23 + (2,)), c) is None  # --pipeline-layout given
    assert round_split(replace(model, partition="megatron"), c) is None  # Megatron-Core's own split
    assert evaluate(replace(model, partition="megatron"), cluster, c).pipeline_layout == ()


def test_plan_prints_and_emits_the_cut_it_priced(capsys):
    argv = ("--model", "qwen3-235b-a22b", "--gpu", "gb200", "--gpus", "256", "--global-batch", "1024", "--tp", "1",
            "--pp", "8", "--virtual-stages", "3", "--schedule", "interleaved", "--ep", "32", "--micro-batch", "1",
            "--zero-stage", "1")
    rc, out, _ = run(capsys, *argv, "--json")
    assert rc == 0
    best = json.loads(out)["plans"][0]
    model, cluster, _ = _qwen()
    c = Choice(best["tp"], best["pp"], best["dp"], best["micro_batch"], best["microbatches"], best["schedule"],
               best["virtual_stages"], best["recompute"], best["zero_stage"], best["sequence_parallel"], best["cp"],
               best["dp_replicate"], best["recompute_layers"], best["ep"], best["etp"])
    split = round_split(model, c)
    assert split is not None and best["chunk_layers"] == list(split)
    rc, out, _ = run(capsys, *argv)
    assert rc == 0
    line = next(x for x in out.splitlines() if x.startswith("layout:"))
    assert ",".join(map(str, split)) in line and "round-wise" in line and "--pipeline-layout" in line


def test_emitted_config_runs_the_cut_priced(tmp_path, capsys):
    path = tmp_path / "run.toml"
    rc, out, _ = run(capsys, "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch", "256",
                   "--tp", "1", "--pp", "4", "--virtual-stages", "2", "--schedule", "interleaved", "--micro-batch", "1",
                   "--zero-stage", "1", "--emit-config", str(path), "--json")
    assert rc == 0
    best = json.JSONDecoder().raw_decode(out)[0]["plans"][0]  # (then a line saying where the config went)
    cfg = tomllib.loads(path.read_text())
    layers = cfg["parallel"]["pipeline_layout"]
    model = CATALOGUE["llama3-8b"]
    assert len(layers) == 8 and sum(layers) == model.layers
    assert tuple(layers) != layout(model, 8).layers  # the round-wise cut, which the plan was priced at
    assert layers == best["chunk_layers"]
